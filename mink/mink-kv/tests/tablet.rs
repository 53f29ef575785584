//! The KV tablet over a real s3stream engine (SQLite metadata, local object store): writes,
//! lookups, scans and the changelog; restart, a lost working copy and a leader change give the
//! same answers for every merge engine; a failed append in a pipeline leaves no trace.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use mink_kv::merge::KvWrite;
use mink_kv::tablet::KvTabletConfig;
use mink_kv::{KvError, KvTableDef, KvTablet};
use s3stream::{EngineConfig, S3Stream, WriterBatchId};

struct World {
    dir: tempfile::TempDir,
    meta_url: String,
    objects: String,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        World {
            meta_url: format!("sqlite://{}", dir.path().join("meta.db").display()),
            objects: dir.path().join("objects").display().to_string(),
            dir,
        }
    }

    async fn node(&self, node_id: u64, flush_delay: Duration) -> S3Stream {
        let meta = Arc::new(
            mink_sql::SqliteStore::connect(&self.meta_url)
                .await
                .unwrap(),
        );
        let mut c = mink_sql::SinkConfig::new(node_id);
        c.tail_poll_interval = Duration::from_millis(5);
        let sink = mink_sql::Sink::start(meta, c).await.unwrap();
        S3Stream::start(
            sink,
            s3stream::store::open(&self.objects).unwrap(),
            EngineConfig {
                flush_delay,
                ..EngineConfig::default()
            },
        )
    }

    /// A node with one new stream, open at epoch 1.
    async fn node_with_stream(&self, node_id: u64, flush_delay: Duration) -> (S3Stream, u64) {
        let engine = self.node(node_id, flush_delay).await;
        let stream = engine.create_streams(1).await.unwrap();
        engine.open(stream, 1).await.unwrap();
        (engine, stream)
    }

    fn copy(&self, name: &str) -> PathBuf {
        self.dir.path().join("kv").join(format!("{name}.redb"))
    }
}

/// `grp`, `id` (the key; rows hash by `grp`), `v`, `s`.
fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("grp", DataType::Int64, false),
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

fn def(options: &[(&str, &str)]) -> Arc<KvTableDef> {
    let options: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Arc::new(
        KvTableDef::new(
            schema(),
            &["grp".into(), "id".into()],
            &["grp".into()],
            &[],
            &options,
        )
        .unwrap(),
    )
}

fn rows(rows: &[(i64, i64, Option<i64>, Option<&str>)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Int64Array::from(
                rows.iter().map(|r| r.2).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                rows.iter().map(|r| r.3).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

type Row = (i64, i64, Option<i64>, Option<String>);

fn read(batch: &RecordBatch) -> Vec<Row> {
    let c = |i: usize| batch.column(i).as_primitive::<Int64Type>();
    let s = batch.column(3).as_string::<i32>();
    (0..batch.num_rows())
        .map(|i| {
            (
                c(0).value(i),
                c(1).value(i),
                c(2).is_valid(i).then(|| c(2).value(i)),
                s.is_valid(i).then(|| s.value(i).to_string()),
            )
        })
        .collect()
}

fn keys(keys: &[(i64, i64)]) -> Vec<ArrayRef> {
    vec![
        Arc::new(Int64Array::from_iter_values(keys.iter().map(|k| k.0))),
        Arc::new(Int64Array::from_iter_values(keys.iter().map(|k| k.1))),
    ]
}

async fn scan_all(tablet: &KvTablet) -> Vec<Row> {
    let mut scan = tablet.snapshot().unwrap();
    let mut out = Vec::new();
    while let Some(b) = scan.next_batch(3).unwrap() {
        out.extend(read(&b));
    }
    out
}

async fn open(engine: &S3Stream, stream: u64, def: &Arc<KvTableDef>, copy: &Path) -> KvTablet {
    KvTablet::open(
        engine.clone(),
        stream,
        Arc::clone(def),
        copy,
        &KvTabletConfig::default(),
        None,
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_lookups_scans_and_the_changelog() {
    let world = World::new();
    let (engine, stream) = world.node_with_stream(1, Duration::from_millis(5)).await;
    let def = def(&[]);
    let tablet = open(&engine, stream, &def, &world.copy("a")).await;

    let ack = tablet
        .write(
            KvWrite::upsert(rows(&[
                (1, 1, Some(10), Some("a")),
                (1, 2, Some(20), None),
                (2, 1, Some(30), Some("c")),
                (1, 1, Some(11), Some("a2")),
            ])),
            None,
        )
        .await
        .unwrap();
    // +I, +I, +I, then -U/+U for the repeated key.
    assert_eq!((ack.offsets, ack.changes), (Some((0, 5)), 5));

    // A pipeline of writes: each sees the ones before it.
    let writes: Vec<_> = (0..20)
        .map(|i| {
            let t = tablet.clone();
            tokio::spawn(async move {
                t.write(KvWrite::upsert(rows(&[(3, i, Some(i), None)])), None)
                    .await
                    .unwrap()
            })
        })
        .collect();
    for w in writes {
        w.await.unwrap();
    }
    let deleted = tablet
        .write(
            KvWrite::delete(rows(&[(1, 2, None, None), (9, 9, None, None)])),
            None,
        )
        .await
        .unwrap();
    assert_eq!(deleted.changes, 1, "deleting a missing key changes nothing");
    let mut partial = KvWrite::upsert(rows(&[(2, 1, None, Some("only s"))]));
    partial.targets = Some(vec![0, 1, 3]);
    tablet.write(partial, None).await.unwrap();

    let found = tablet.lookup(&keys(&[(2, 1), (1, 2), (1, 1)])).unwrap();
    assert_eq!(
        read(&found),
        [
            (2, 1, Some(30), Some("only s".into())),
            (1, 1, Some(11), Some("a2".into()))
        ],
        "in the order asked, missing keys left out"
    );
    let group = tablet
        .prefix_lookup(&[Arc::new(Int64Array::from(vec![3])) as ArrayRef])
        .unwrap();
    assert_eq!(
        read(&group).iter().map(|r| r.1).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    let all = scan_all(&tablet).await;
    assert_eq!(all.len(), 22);
    assert!(
        all.windows(2).all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1)),
        "key order"
    );

    // The changelog view: offsets contiguous, change types by name.
    let log = tablet.read_changelog(0, 1 << 20).await.unwrap();
    let mut next = 0i64;
    let mut types = Vec::new();
    for b in log.iter().map(|r| &r.batch) {
        let offsets = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert_eq!(offsets.value(i), next);
            next += 1;
            types.push(b.column(0).as_string::<i32>().value(i).to_string());
        }
    }
    assert_eq!(
        &types[..5],
        [
            "insert",
            "insert",
            "insert",
            "update_before",
            "update_after"
        ]
    );
    assert_eq!(types[25], "delete");
    assert_eq!(&types[26..], ["update_before", "update_after"]);
    assert_eq!(tablet.applied_offset().unwrap(), next as u64);
    assert_eq!(tablet.snapshot().unwrap().offset(), next as u64);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_is_recognised_before_the_merge() {
    let world = World::new();
    let (engine, stream) = world.node_with_stream(1, Duration::from_millis(5)).await;
    let def = def(&[
        ("table.merge-engine", "aggregation"),
        ("fields.v.agg", "sum"),
    ]);
    let tablet = open(&engine, stream, &def, &world.copy("a")).await;
    let writer = |seq: u64| {
        Some(WriterBatchId {
            writer_id: 7,
            writer_epoch: 0,
            first_sequence: seq,
            last_sequence: seq,
            any_first_sequence: false,
        })
    };
    let add = || KvWrite::upsert(rows(&[(1, 1, Some(5), None)]));
    let first = tablet.write(add(), writer(0)).await.unwrap();
    let retry = tablet.write(add(), writer(0)).await.unwrap();
    assert!(retry.duplicate);
    assert_eq!(retry.offsets, first.offsets);
    // A batch that changes nothing still takes its sequence number.
    let noop = tablet
        .write(KvWrite::delete(rows(&[(1, 1, None, None)])), writer(1))
        .await
        .unwrap();
    assert_eq!(noop.changes, 0);
    tablet.write(add(), writer(2)).await.unwrap();
    let gap = tablet.write(add(), writer(9)).await.unwrap_err();
    assert!(gap.to_string().contains("sequence"), "{gap}");
    assert_eq!(
        read(&tablet.lookup(&keys(&[(1, 1)])).unwrap()),
        [(1, 1, Some(10), None)],
        "counted once per sequence number"
    );
    let log = tablet.read_changelog(0, 1 << 20).await.unwrap();
    let shown: usize = log.iter().map(|r| r.batch.num_rows()).sum();
    assert_eq!(shown, 3, "+I, -U, +U; the marker is not shown");
    engine.shutdown().await;
}

/// The same writes for each engine; then restart, a lost copy, and a new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_lost_copy_and_leader_change_give_the_same_answers() {
    let engines: [&[(&str, &str)]; 5] = [
        &[],
        &[("table.merge-engine", "first_row")],
        &[
            ("table.merge-engine", "versioned"),
            ("table.merge-engine.versioned.ver-column", "v"),
        ],
        &[
            ("table.merge-engine", "aggregation"),
            ("fields.v.agg", "sum"),
            ("fields.s.agg", "listagg"),
        ],
        &[("table.changelog.image", "WAL")],
    ];
    for options in engines {
        let world = World::new();
        let (one, stream) = world.node_with_stream(1, Duration::from_millis(5)).await;
        let def = def(options);
        let tablet = open(&one, stream, &def, &world.copy("one")).await;
        for round in 0..6i64 {
            let batch = rows(
                &(0..8)
                    .map(|i| {
                        (
                            i % 2,
                            (i * 3 + round) % 5,
                            Some(round * 10 + i),
                            Some(["x", "y", "z"][(i % 3) as usize]),
                        )
                    })
                    .collect::<Vec<_>>(),
            );
            tablet.write(KvWrite::upsert(batch), None).await.unwrap();
        }
        // Deleted where the engine allows it.
        tablet
            .write(KvWrite::delete(rows(&[(1, 3, None, None)])), None)
            .await
            .unwrap();
        let want = scan_all(&tablet).await;
        let probe = keys(&[(0, 0), (1, 1), (0, 4), (1, 3)]);
        let want_lookup = read(&tablet.lookup(&probe).unwrap());
        let end = tablet.applied_offset().unwrap();
        drop(tablet);

        // Restart on the same copy.
        let tablet = open(&one, stream, &def, &world.copy("one")).await;
        assert_eq!(scan_all(&tablet).await, want, "{options:?}: restart");
        drop(tablet);
        // The copy lost: rebuilt from the changelog.
        std::fs::remove_file(world.copy("one")).unwrap();
        let tablet = open(&one, stream, &def, &world.copy("one")).await;
        assert_eq!(scan_all(&tablet).await, want, "{options:?}: rebuilt");
        assert_eq!(tablet.applied_offset().unwrap(), end);
        drop(tablet);

        // A new leader on another node.
        let two = world.node(2, Duration::from_millis(5)).await;
        two.open(stream, 2).await.unwrap();
        let tablet = open(&two, stream, &def, &world.copy("two")).await;
        assert_eq!(scan_all(&tablet).await, want, "{options:?}: new leader");
        assert_eq!(read(&tablet.lookup(&probe).unwrap()), want_lookup);
        // It merges on from the same state: an aggregate counts each write once.
        tablet
            .write(
                KvWrite::upsert(rows(&[(0, 0, Some(1000), Some("w"))])),
                None,
            )
            .await
            .unwrap();
        let before = want.iter().find(|r| (r.0, r.1) == (0, 0)).unwrap();
        let after = read(&tablet.lookup(&keys(&[(0, 0)])).unwrap())[0].clone();
        let expected = match options.first().map(|o| o.1) {
            Some("first_row") => before.clone(),
            Some("aggregation") => (
                0,
                0,
                Some(before.2.unwrap() + 1000),
                Some(format!("{},w", before.3.as_deref().unwrap())),
            ),
            _ => (0, 0, Some(1000), Some("w".into())),
        };
        assert_eq!(after, expected, "{options:?}");
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_in_a_pipeline_leaves_no_trace() {
    let world = World::new();
    // Slow flushes: the pipeline is still buffered when the stream is taken away.
    let (one, stream) = world.node_with_stream(1, Duration::from_millis(400)).await;
    let def = def(&[
        ("table.merge-engine", "aggregation"),
        ("fields.v.agg", "sum"),
    ]);
    let tablet = open(&one, stream, &def, &world.copy("one")).await;
    tablet
        .write(KvWrite::upsert(rows(&[(1, 1, Some(1), None)])), None)
        .await
        .unwrap();
    let appended = || {
        one.stats()
            .appends
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = appended();
    let pipeline: Vec<_> = (0..5)
        .map(|_| {
            let t = tablet.clone();
            tokio::spawn(async move {
                t.write(KvWrite::upsert(rows(&[(1, 1, Some(10), None)])), None)
                    .await
            })
        })
        .collect();
    // Each write appended (buffered for the slow flush), then the stream taken away.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while appended() < before + 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the five writes were not appended within 30 s"
        );
        tokio::task::yield_now().await;
    }
    // Another node takes the bucket: the buffered appends are fenced.
    let two = world.node(2, Duration::from_millis(5)).await;
    two.open(stream, 2).await.unwrap();
    for w in pipeline {
        let e = w.await.unwrap().unwrap_err();
        assert!(matches!(e, KvError::Stream(_) | KvError::Aborted(_)), "{e}");
    }
    let only_first = [(1, 1, Some(1), None)];
    assert_eq!(read(&tablet.lookup(&keys(&[(1, 1)])).unwrap()), only_first);
    // A write after the failure is refused; nothing of the pipeline shows up anywhere.
    assert!(
        tablet
            .write(KvWrite::upsert(rows(&[(1, 1, Some(100), None)])), None)
            .await
            .is_err()
    );
    let new_leader = open(&two, stream, &def, &world.copy("two")).await;
    assert_eq!(
        read(&new_leader.lookup(&keys(&[(1, 1)])).unwrap()),
        only_first
    );
    new_leader
        .write(KvWrite::upsert(rows(&[(1, 1, Some(2), None)])), None)
        .await
        .unwrap();
    assert_eq!(
        read(&new_leader.lookup(&keys(&[(1, 1)])).unwrap()),
        [(1, 1, Some(3), None)]
    );
    one.shutdown().await;
    two.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_and_the_changelog_after_it_rebuild_a_trimmed_bucket() {
    let world = World::new();
    let (engine, stream) = world.node_with_stream(1, Duration::from_millis(5)).await;
    let def = def(&[
        ("table.merge-engine", "aggregation"),
        ("fields.v.agg", "sum"),
    ]);
    let tablet = open(&engine, stream, &def, &world.copy("a")).await;
    let write = |round: i64| {
        let t = tablet.clone();
        async move {
            let batch = rows(
                &(0..20)
                    .map(|i| (i % 3, i, Some(round), Some("s")))
                    .collect::<Vec<_>>(),
            );
            t.write(KvWrite::upsert(batch), None).await.unwrap();
        }
    };
    for round in 1..=3 {
        write(round).await;
    }
    let objects = s3stream::store::open(&world.objects).unwrap();
    let location = object_store::path::Path::from("kv/1/0/0/1.arrows");
    let info = tablet
        .write_snapshot(Arc::clone(&objects), &location)
        .await
        .unwrap();
    assert_eq!(info.rows, 20);
    assert_eq!(info.log_offset, tablet.applied_offset().unwrap());
    for round in 4..=5 {
        write(round).await;
    }
    let want = scan_all(&tablet).await;
    assert!(want.iter().all(|r| r.2 == Some(15)), "{want:?}");
    drop(tablet);
    engine.trim(stream, info.log_offset).await.unwrap();

    // Without the snapshot the bucket cannot be rebuilt; with it, snapshot + changelog.
    std::fs::remove_file(world.copy("a")).unwrap();
    let e = KvTablet::open(
        engine.clone(),
        stream,
        Arc::clone(&def),
        &world.copy("a"),
        &KvTabletConfig::default(),
        None,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("no KV snapshot"), "{e}");
    let source = mink_kv::SnapshotSource {
        objects,
        location,
        log_offset: info.log_offset,
    };
    let tablet = KvTablet::open(
        engine.clone(),
        stream,
        Arc::clone(&def),
        &world.copy("b"),
        &KvTabletConfig::default(),
        Some(&source),
    )
    .await
    .unwrap();
    assert_eq!(scan_all(&tablet).await, want, "no aggregate counted twice");
    // A snapshot that does not say what the metadata says is refused.
    let wrong = mink_kv::SnapshotSource {
        log_offset: info.log_offset + 1,
        ..source
    };
    let e = KvTablet::open(
        engine.clone(),
        stream,
        Arc::clone(&def),
        &world.copy("c"),
        &KvTabletConfig::default(),
        Some(&wrong),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("the metadata says"), "{e}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_increment_values_are_unique_kept_on_update_and_never_written() {
    let world = World::new();
    let (engine, stream) = world.node_with_stream(1, Duration::from_millis(5)).await;
    let options: BTreeMap<String, String> = [
        ("auto-increment.fields".to_string(), "v".to_string()),
        (
            "table.auto-increment.cache-size".to_string(),
            "3".to_string(),
        ),
    ]
    .into();
    let pk = ["grp".to_string(), "id".to_string()];
    let schema = Arc::new(KvTableDef::normalize_schema(&schema(), &pk, &options));
    assert!(
        !schema.field(2).is_nullable(),
        "the generated column is NOT NULL"
    );
    let def = Arc::new(KvTableDef::new(schema, &pk, &[], &[], &options).unwrap());
    let config = KvTabletConfig {
        auto_increment_sequence: "auto-increment/test".into(),
        ..KvTabletConfig::default()
    };
    let tablet = KvTablet::open(
        engine.clone(),
        stream,
        Arc::clone(&def),
        &world.copy("a"),
        &config,
        None,
    )
    .await
    .unwrap();
    let write = |rows: &[(i64, i64, Option<&str>)]| {
        let batch = RecordBatch::try_new(
            def.write_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from(vec![None::<i64>; rows.len()])),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
            ],
        )
        .unwrap();
        KvWrite::upsert(batch)
    };
    // Five new keys: more than one cached range (3) is taken.
    tablet
        .write(
            write(&[
                (1, 1, Some("a")),
                (1, 2, None),
                (2, 1, None),
                (2, 2, None),
                (3, 1, None),
            ]),
            None,
        )
        .await
        .unwrap();
    // An update keeps its value; a new key gets the next one.
    tablet
        .write(write(&[(1, 1, Some("b")), (4, 1, None)]), None)
        .await
        .unwrap();
    let all = scan_all(&tablet).await;
    let ids: Vec<i64> = all.iter().map(|r| r.2.unwrap()).collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 6, "{all:?}");
    let first = all.iter().find(|r| (r.0, r.1) == (1, 1)).unwrap();
    assert_eq!(
        (first.2, first.3.as_deref()),
        (Some(1), Some("b")),
        "{all:?}"
    );
    // Writers never set it.
    let mut set = write(&[(9, 9, None)]);
    let mut columns = set.batch.columns().to_vec();
    columns[2] = Arc::new(Int64Array::from(vec![42]));
    set.batch = RecordBatch::try_new(def.write_schema(), columns).unwrap();
    let e = tablet.write(set, None).await.unwrap_err();
    assert!(e.to_string().contains("auto-increment"), "{e}");
    // A restart keeps the values (they are in the changelog's after-images) and never reuses
    // one: the next range starts after every range taken.
    drop(tablet);
    let tablet = KvTablet::open(
        engine.clone(),
        stream,
        Arc::clone(&def),
        &world.copy("b"),
        &config,
        None,
    )
    .await
    .unwrap();
    assert_eq!(scan_all(&tablet).await, all);
    tablet.write(write(&[(5, 1, None)]), None).await.unwrap();
    let new = read(&tablet.lookup(&keys(&[(5, 1)])).unwrap())[0]
        .2
        .unwrap();
    assert!(ids.iter().all(|&i| i < new), "{new} after {ids:?}");
    engine.shutdown().await;
}
