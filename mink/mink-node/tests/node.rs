//! The node service over a real metadata log (SQLite) and object store (local filesystem).
#![allow(clippy::print_stderr)]

mod common;
use common::{batch, until_view};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use mink_node::{BucketRef, Node, NodeConfig, NodeError, TableChange, TableSpec, WriteTarget};

fn config(dir: &std::path::Path, node_id: u64) -> NodeConfig {
    let mut c = NodeConfig::new(
        node_id,
        &format!("sqlite://{}", dir.join("meta.db").display()),
        dir.join("objects").to_str().unwrap(),
    );
    c.advertised_address = format!("127.0.0.1:{}", 7000 + node_id);
    c.lease_ttl = Duration::from_millis(1000);
    c.engine.flush_delay = Duration::from_millis(5);
    c.leadership_interval = Duration::from_millis(20);
    c
}

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
    ])
}

fn spec(name: &str, buckets: u32) -> TableSpec {
    TableSpec {
        primary_key: vec![],
        database: "app".into(),
        name: name.into(),
        schema: schema(),
        options: BTreeMap::from([
            ("bucket.num".to_string(), buckets.to_string()),
            ("bucket.key".to_string(), "user_id".to_string()),
        ]),
        partition_keys: vec![],
        comment: String::new(),
        if_not_exists: false,
    }
}

async fn read_bucket(node: &Node, table: &str, bucket: u32) -> Vec<i64> {
    read_bucket_from(node, table, bucket, 0).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_creates_writes_and_reads_a_log_table() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    assert!(matches!(
        node.create_database("app", false).await,
        Err(NodeError::AlreadyExists(_))
    ));
    node.create_database("app", true).await.unwrap();
    let info = node.create_table(spec("events", 4)).await.unwrap();
    assert_eq!(info.buckets.len(), 4);
    assert!(
        info.buckets
            .iter()
            .all(|b| b.leader_node_id == 1 && b.leader_epoch >= 1)
    );
    // Routed by user_id: every row exactly once, each in its bucket.
    let writes = node
        .write("app", "events", &batch(0..100), &WriteTarget::default())
        .await
        .unwrap();
    assert!(writes.iter().all(|w| w.result.is_ok()), "{writes:?}");
    assert_eq!(writes.iter().map(|w| w.rows).sum::<usize>(), 100);
    let mut all = Vec::new();
    for b in 0..4 {
        let ids = read_bucket(&node, "events", b).await;
        for id in &ids {
            let expected = mink_log::routing::buckets_of(&batch(*id..*id + 1), &[0], 4).unwrap()[0];
            assert_eq!(expected, b);
        }
        all.extend(ids);
    }
    all.sort_unstable();
    assert_eq!(all, (0..100).collect::<Vec<_>>());
    // Projection and offsets.
    let (start, end) = node
        .bucket_offsets(&BucketRef::new("app", "events", None, 0))
        .unwrap();
    assert_eq!(start, 0);
    let read = node
        .read_bucket(
            &BucketRef::new("app", "events", None, 0),
            0,
            1 << 20,
            &["event".into()],
        )
        .await
        .unwrap();
    assert_eq!(read[0].batch.num_columns(), 1);
    assert_eq!(
        read.iter().map(|b| b.batch.num_rows() as u64).sum::<u64>(),
        end
    );
    // Bad input: precise errors, nothing stored.
    let bad = RecordBatch::try_from_iter(vec![(
        "user_id",
        Arc::new(Int64Array::from(vec![Some(1)])) as ArrayRef,
    )])
    .unwrap();
    assert!(matches!(
        node.write("app", "events", &bad, &WriteTarget::default())
            .await,
        Err(NodeError::Invalid(_))
    ));
    assert!(matches!(
        node.write("app", "nope", &batch(0..1), &WriteTarget::default())
            .await,
        Err(NodeError::TableNotFound { .. })
    ));
    assert!(matches!(
        node.write(
            "app",
            "events",
            &batch(0..1),
            &WriteTarget {
                bucket: Some(9),
                ..Default::default()
            }
        )
        .await,
        Err(NodeError::Invalid(_))
    ));
    assert_eq!(
        node.bucket_offsets(&BucketRef::new("app", "events", None, 0))
            .unwrap()
            .1,
        end
    );
    let mut bad_options = spec("bad", 1);
    bad_options
        .options
        .insert("table.log.ttl".into(), "soon".into());
    let e = node
        .create_table(bad_options)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("table.log.ttl"), "{e}");
    node.drop_table("app", "events", false).await.unwrap();
    assert!(matches!(
        node.describe_table("app", "events"),
        Err(NodeError::TableNotFound { .. })
    ));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buckets_spread_over_nodes_and_writes_are_told_where_to_go() {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(config(dir.path(), 1)).await.unwrap();
    let b = Node::start(config(dir.path(), 2)).await.unwrap();
    a.create_database("app", false).await.unwrap();
    // Both nodes are live before the table exists, so the coordinator spreads its buckets.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.live_nodes().await.unwrap().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "two live nodes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.create_table(spec("spread", 4)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let info = loop {
        let info = b.describe_table("app", "spread").unwrap();
        if info.buckets.iter().all(|x| x.leader_node_id != 0) {
            break info;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let leaders: std::collections::BTreeSet<u64> =
        info.buckets.iter().map(|x| x.leader_node_id).collect();
    assert_eq!(
        leaders.len(),
        2,
        "buckets on both nodes: {:?}",
        info.buckets
    );
    let remote = info.buckets.iter().find(|x| x.leader_node_id == 2).unwrap();
    let ids: Vec<i64> = (0..200)
        .filter(|i| {
            mink_log::routing::buckets_of(&batch(*i..*i + 1), &[0], 4).unwrap()[0] == remote.bucket
        })
        .take(3)
        .collect();
    let rows = RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
        ),
        (
            "event",
            Arc::new(StringArray::from(vec!["x"; ids.len()])) as ArrayRef,
        ),
    ])
    .unwrap();
    let at_a = a
        .write("app", "spread", &rows, &WriteTarget::default())
        .await
        .unwrap();
    match &at_a[0].result {
        Err(NodeError::NotLeader {
            leader, address, ..
        }) => {
            assert_eq!((*leader, address.as_str()), (2, "127.0.0.1:7002"));
        }
        other => panic!("expected a redirect, got {other:?}"),
    }
    let at_b = b
        .write("app", "spread", &rows, &WriteTarget::default())
        .await
        .unwrap();
    assert!(at_b[0].result.is_ok(), "{at_b:?}");
    // Any node reads any bucket.
    b.wait_applied(a.view().applied_index, Duration::from_secs(5))
        .await
        .unwrap();
    a.wait_applied(b.view().applied_index, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(read_bucket(&a, "spread", remote.bucket).await, ids);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_node_takes_its_buckets_back_at_a_new_leader_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let before = node.create_table(spec("events", 2)).await.unwrap();
    let writes = node
        .write("app", "events", &batch(0..10), &WriteTarget::default())
        .await
        .unwrap();
    assert!(writes.iter().all(|w| w.result.is_ok()), "{writes:?}");
    node.shutdown().await;
    // A request to a node that has shut down is UNAVAILABLE (retry, here or elsewhere), not a
    // failure of the request.
    let e = node.create_database("later", false).await.unwrap_err();
    assert!(matches!(e, NodeError::Unavailable(_)), "{e:?}");

    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        let view = node.view();
        let me = view.state.nodes[&1].node_epoch;
        let info = node.describe_table("app", "events").unwrap();
        if view
            .state
            .buckets
            .values()
            .all(|b| b.leader_node_epoch == me)
        {
            break info;
        }
        assert!(tokio::time::Instant::now() < deadline, "{info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for (b, a) in before.buckets.iter().zip(&after.buckets) {
        assert!(a.leader_epoch > b.leader_epoch, "{before:?} {after:?}");
    }
    let writes = node
        .write("app", "events", &batch(10..20), &WriteTarget::default())
        .await
        .unwrap();
    assert!(writes.iter().all(|w| w.result.is_ok()), "{writes:?}");
    let mut all = [
        read_bucket(&node, "events", 0).await,
        read_bucket(&node, "events", 1).await,
    ]
    .concat();
    all.sort_unstable();
    assert_eq!(all, (0..20).collect::<Vec<_>>());
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_tables_create_partitions_on_write_and_read_per_partition() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let mut s = spec("daily", 2);
    s.schema = Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
        Field::new("day", DataType::Utf8, false),
    ]);
    s.partition_keys = vec!["day".into()];
    let info = node.create_table(s).await.unwrap();
    assert!(info.buckets.is_empty() && info.partitions.is_empty());
    let rows = |ids: Vec<i64>, days: Vec<&str>| {
        RecordBatch::try_from_iter(vec![
            ("user_id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            (
                "event",
                Arc::new(StringArray::from(vec!["x"; days.len()])) as ArrayRef,
            ),
            ("day", Arc::new(StringArray::from(days)) as ArrayRef),
        ])
        .unwrap()
    };
    let writes = node
        .write(
            "app",
            "daily",
            &rows(vec![1, 2, 3, 4], vec!["d1", "d2", "d1", "d2"]),
            &WriteTarget::default(),
        )
        .await
        .unwrap();
    assert!(writes.iter().all(|w| w.result.is_ok()), "{writes:?}");
    assert_eq!(writes.iter().map(|w| w.rows).sum::<usize>(), 4);
    let info = node.describe_table("app", "daily").unwrap();
    let names: Vec<&str> = info.partitions.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["d1", "d2"]);
    assert_eq!(info.buckets.len(), 4);
    let mut d1 = Vec::new();
    for b in 0..2 {
        for r in node
            .read_bucket(
                &BucketRef::new("app", "daily", Some("d1"), b),
                0,
                1 << 20,
                &[],
            )
            .await
            .unwrap()
        {
            d1.extend(
                r.batch
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter()
                    .copied(),
            );
        }
    }
    d1.sort_unstable();
    assert_eq!(d1, [1, 3]);
    // Precise errors: no partition named, unknown partition, rows of another partition.
    assert!(matches!(
        node.read_bucket(&BucketRef::new("app", "daily", None, 0), 0, 1 << 20, &[])
            .await,
        Err(NodeError::Invalid(_))
    ));
    assert!(matches!(
        node.read_bucket(
            &BucketRef::new("app", "daily", Some("d9"), 0),
            0,
            1 << 20,
            &[]
        )
        .await,
        Err(NodeError::NotFound(_))
    ));
    let target = WriteTarget {
        partition: Some("d1".into()),
        bucket: Some(0),
        ..Default::default()
    };
    assert!(matches!(
        node.write("app", "daily", &rows(vec![5], vec!["d2"]), &target)
            .await,
        Err(NodeError::Invalid(_))
    ));
    let bad = rows(vec![1], vec!["a$b"]);
    assert!(matches!(
        node.write("app", "daily", &bad, &WriteTarget::default())
            .await,
        Err(NodeError::Invalid(_))
    ));
    // Ahead-of-time creation and drop.
    node.create_partition("app", "daily", "d3", false)
        .await
        .unwrap();
    assert!(matches!(
        node.create_partition("app", "daily", "d3", false).await,
        Err(NodeError::AlreadyExists(_))
    ));
    node.drop_partition("app", "daily", "d1", false)
        .await
        .unwrap();
    assert!(matches!(
        node.read_bucket(
            &BucketRef::new("app", "daily", Some("d1"), 0),
            0,
            1 << 20,
            &[]
        )
        .await,
        Err(NodeError::NotFound(_))
    ));
    let names: Vec<String> = node
        .describe_table("app", "daily")
        .unwrap()
        .partitions
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, ["d2", "d3"]);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_is_created_only_under_the_name_its_rows_give_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let mut s = spec("by_k", 1);
    s.schema = Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("k", DataType::Int32, false),
        Field::new("day", DataType::Date32, false),
    ]);
    s.partition_keys = vec!["k".into(), "day".into()];
    node.create_table(s).await.unwrap();
    // `007` or ` 7` for the integer 7 would be partitions no row of k = 7 reaches and no
    // filter on k can read.
    for bad in [
        "007$2026-11-29",
        " 7$2026-11-29",
        "99999999999$2026-11-29",
        "7$not-a-date",
        "7$2026-1-5",
        "7",
    ] {
        match node.create_partition("app", "by_k", bad, false).await {
            Err(NodeError::Invalid(e)) => assert!(e.contains("partition"), "{bad}: {e}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    let p = node
        .create_partition("app", "by_k", "7$2026-11-29", false)
        .await
        .unwrap();
    assert_eq!(p.name, "7$2026-11-29");
    assert_eq!(
        node.describe_table("app", "by_k").unwrap().partitions.len(),
        1
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn altering_a_table_grows_its_schema_and_old_rows_read_with_nulls() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(spec("events", 1)).await.unwrap();
    node.write("app", "events", &batch(0..3), &WriteTarget::default())
        .await
        .unwrap();
    let mut fields = schema().fields().to_vec();
    fields.push(Arc::new(Field::new("score", DataType::Float64, true)));
    let grown = Schema::new(fields);
    let info = node
        .alter_table(
            "app",
            "events",
            TableChange {
                set_options: BTreeMap::from([("table.log.ttl".into(), "1d".into())]),
                schema: Some(grown.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(info.schema_version, 2);
    assert_eq!(info.options["table.log.ttl"], "1d");
    // The old shape is now refused; the new one is stored.
    assert!(matches!(
        node.write("app", "events", &batch(3..4), &WriteTarget::default())
            .await,
        Err(NodeError::Invalid(_))
    ));
    let mut columns = batch(3..5).columns().to_vec();
    columns.push(Arc::new(arrow::array::Float64Array::from(vec![0.5, 1.5])));
    let new_rows = RecordBatch::try_new(Arc::new(grown.clone()), columns).unwrap();
    let w = node
        .write("app", "events", &new_rows, &WriteTarget::default())
        .await
        .unwrap();
    assert!(w[0].result.is_ok(), "{w:?}");
    let read = node
        .read_bucket(&BucketRef::new("app", "events", None, 0), 0, 1 << 20, &[])
        .await
        .unwrap();
    let scores: Vec<Option<f64>> = read
        .iter()
        .flat_map(|r| {
            r.batch
                .column(2)
                .as_primitive::<arrow::datatypes::Float64Type>()
                .iter()
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(scores, [None, None, None, Some(0.5), Some(1.5)]);
    // Immutable options, dropped columns, bad values, options of primary-key tables, and new
    // columns named twice or as a system column (a lake's tiering replaced their values) are
    // refused.
    let grown_by = |names: &[&str]| {
        let mut fields = grown.fields().to_vec();
        for n in names {
            fields.push(Arc::new(Field::new(*n, DataType::Int64, true)));
        }
        Schema::new(fields)
    };
    for change in [
        TableChange {
            set_options: BTreeMap::from([("table.delete.behavior".into(), "disable".into())]),
            ..Default::default()
        },
        TableChange {
            schema: Some(grown_by(&["__offset"])),
            ..Default::default()
        },
        TableChange {
            schema: Some(grown_by(&["q", "q"])),
            ..Default::default()
        },
        TableChange {
            schema: Some(grown_by(&["user_id"])),
            ..Default::default()
        },
        TableChange {
            set_options: BTreeMap::from([("bucket.num".into(), "8".into())]),
            ..Default::default()
        },
        TableChange {
            set_options: BTreeMap::from([("table.log.ttl".into(), "later".into())]),
            ..Default::default()
        },
        TableChange {
            schema: Some(Schema::new(vec![Field::new(
                "user_id",
                DataType::Int64,
                false,
            )])),
            ..Default::default()
        },
    ] {
        assert!(matches!(
            node.alter_table("app", "events", change).await,
            Err(NodeError::Invalid(_))
        ));
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_trims_data_older_than_the_table_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 1);
    c.retention_interval = Duration::from_millis(50);
    // Time moves when the test says: an hour passes in no time, and nothing early.
    let clock = mink_metadata::ManualClock::new(1_800_000_000_000);
    c.clock = clock.clone();
    let node = Node::start(c).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let mut s = spec("short", 1);
    s.options.insert("table.log.ttl".into(), "1h".into());
    node.create_table(s).await.unwrap();
    node.write("app", "short", &batch(0..5), &WriteTarget::default())
        .await
        .unwrap();
    let (_, end) = node
        .bucket_offsets(&BucketRef::new("app", "short", None, 0))
        .unwrap();
    assert_eq!(end, 5);
    clock.advance(Duration::from_secs(3600 + 60));
    until_view(&node, "retention trimming app.short", |_| {
        match node.bucket_offsets(&BucketRef::new("app", "short", None, 0)) {
            Ok((5, _)) => Ok(()),
            other => Err(other),
        }
    })
    .await;
    // Reads below the start are refused precisely; new rows are kept.
    assert!(
        node.read_bucket(&BucketRef::new("app", "short", None, 0), 0, 1 << 20, &[])
            .await
            .is_err()
    );
    node.write("app", "short", &batch(5..6), &WriteTarget::default())
        .await
        .unwrap();
    assert_eq!(read_bucket_from(&node, "short", 0, 5).await, [5]);
    node.shutdown().await;
}

/// Compaction moves a quiet table's rows into the objects it writes for a busy one; retention
/// still ages them by when they were written. (Aged by their object's commit time, rows with a
/// 30 s TTL were kept 12 minutes on a busy node: every compaction restamped them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_ages_rows_by_their_write_not_by_their_last_compaction() {
    use mink_metadata::Clock as _;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 1);
    c.retention_interval = Duration::from_millis(50);
    // Compaction runs when the test says.
    c.compaction.interval = Duration::from_secs(3600);
    let clock = mink_metadata::ManualClock::new(1_800_000_000_000);
    c.clock = clock.clone();
    let compaction = c.compaction.clone();
    let node = Node::start(c).await.unwrap();
    until_view(&node, "metadata_version 6", |v| {
        if v.state.metadata_version >= mink_metadata::DATA_TIME_VERSION {
            Ok(())
        } else {
            Err(v.state.metadata_version)
        }
    })
    .await;
    node.create_database("app", false).await.unwrap();
    let mut quiet = spec("quiet", 1);
    quiet.options.insert("table.log.ttl".into(), "1h".into());
    node.create_table(quiet).await.unwrap();
    node.create_table(spec("busy", 1)).await.unwrap();
    node.write("app", "quiet", &batch(0..5), &WriteTarget::default())
        .await
        .unwrap();
    clock.advance(Duration::from_secs(40 * 60));
    node.write("app", "busy", &batch(0..5), &WriteTarget::default())
        .await
        .unwrap();
    let report = node.streams().compact_once(1, &compaction).await.unwrap();
    assert!(report.sources >= 2, "{report:?}");
    let view = node.view();
    let table = view.state.table_by_name("app", "quiet").unwrap();
    let stream_id = view.state.buckets[&(table.table_id, 0, 0)].stream_id;
    let (_, range) = view
        .state
        .ranges
        .range((stream_id, 0)..=(stream_id, u64::MAX))
        .next()
        .unwrap();
    assert_eq!(
        view.state.objects[&range.object_id].committed_at_ms,
        clock.now_ms(),
        "the quiet table's rows were compacted into a new object"
    );
    // 61 minutes after the write, 21 after the compaction.
    clock.advance(Duration::from_secs(21 * 60));
    until_view(&node, "retention trimming app.quiet", |_| {
        match node.bucket_offsets(&BucketRef::new("app", "quiet", None, 0)) {
            Ok((5, _)) => Ok(()),
            other => Err(other),
        }
    })
    .await;
    node.shutdown().await;
}

/// Every row of a bucket from `offset` to its end, read step by step (a step may stop early,
/// e.g. where this node's cache of its own appends ends).
async fn read_bucket_from(node: &Node, table: &str, bucket: u32, mut offset: u64) -> Vec<i64> {
    let mut ids = Vec::new();
    loop {
        let step = node
            .read_bucket(
                &BucketRef::new("app", table, None, bucket),
                offset,
                1 << 20,
                &[],
            )
            .await
            .unwrap();
        let Some(last) = step.last() else {
            return ids;
        };
        offset = last.end_offset;
        for b in &step {
            ids.extend(
                b.batch
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .iter()
                    .copied(),
            );
        }
    }
}

fn pk_spec(name: &str, options: &[(&str, &str)]) -> TableSpec {
    let mut options: BTreeMap<String, String> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    options.insert("bucket.num".into(), "2".into());
    TableSpec {
        primary_key: vec!["user_id".into()],
        database: "app".into(),
        name: name.into(),
        schema: Schema::new(vec![
            Field::new("user_id", DataType::Int64, true),
            Field::new("visits", DataType::Int64, true),
        ]),
        options,
        partition_keys: vec![],
        comment: String::new(),
        if_not_exists: false,
    }
}

fn visits(rows: &[(i64, i64)]) -> RecordBatch {
    RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
        ),
        (
            "visits",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))) as ArrayRef,
        ),
    ])
    .unwrap()
}

async fn lookup_all(node: &Node, table: &str, ids: std::ops::Range<i64>) -> Vec<(i64, i64)> {
    let keys = RecordBatch::try_from_iter(vec![(
        "user_id",
        Arc::new(Int64Array::from_iter_values(ids)) as ArrayRef,
    )])
    .unwrap();
    let found = node.lookup("app", table, &keys).await.unwrap();
    let id = found.column(0).as_primitive::<Int64Type>();
    let v = found.column(1).as_primitive::<Int64Type>();
    (0..found.num_rows())
        .map(|i| (id.value(i), v.value(i)))
        .collect()
}

/// Adds `n` visits to users 0..10.
async fn add_visits(node: &Node, n: i64) {
    let rows: Vec<(i64, i64)> = (0..10).map(|id| (id, n)).collect();
    let w = node
        .write("app", "visits", &visits(&rows), &WriteTarget::default())
        .await
        .unwrap();
    assert!(w.iter().all(|b| b.result.is_ok()), "add({n}): {w:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_table_is_rebuilt_from_its_snapshot_after_retention_and_a_lost_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 1);
    c.kv_dir = dir.path().join("kv");
    c.retention_interval = Duration::from_millis(30);
    c.kv_snapshot_interval = Duration::from_secs(3600);
    let node = Node::start(c.clone()).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let info = node
        .create_table(pk_spec(
            "visits",
            &[
                ("table.merge-engine", "aggregation"),
                ("fields.visits.agg", "sum"),
                ("table.log.ttl", "1ms"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(info.primary_key, ["user_id"]);
    assert_eq!(
        info.bucket_key,
        ["user_id"],
        "the key is the default bucket key"
    );
    assert!(!info.schema.field(0).is_nullable(), "keys are NOT NULL");
    add_visits(&node, 1).await;
    add_visits(&node, 2).await;
    // No snapshot yet: retention may not trim the changelog at all, however often it looks.
    let passes = node.retention_passes();
    tokio::time::timeout(
        Duration::from_secs(30),
        node.retention_passes_reach(passes + 3),
    )
    .await
    .expect("retention did not run three passes within 30 s");
    let starts = |node: &Node| {
        (0..2)
            .map(|b| {
                node.bucket_offsets(&BucketRef::new("app", "visits", None, b))
                    .unwrap()
                    .0
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(starts(&node), [0, 0]);
    assert_eq!(node.snapshot_kv().await.unwrap(), 2, "one per bucket");
    let floors: Vec<u64> = {
        let view = node.view();
        let mut s: Vec<_> = view.state.kv_snapshots.values().cloned().collect();
        s.sort_by_key(|s| s.bucket);
        s.iter().map(|s| s.log_offset).collect()
    };
    add_visits(&node, 4).await;
    // Retention trims up to the snapshot, never past it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while starts(&node) != floors {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?} {floors:?}",
            starts(&node)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let want: Vec<(i64, i64)> = (0..10).map(|id| (id, 7)).collect();
    assert_eq!(lookup_all(&node, "visits", 0..10).await, want);
    // A second snapshot; the coordinator keeps only the newest.
    add_visits(&node, 1).await;
    assert_eq!(node.snapshot_kv().await.unwrap(), 2);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while node.view().state.kv_snapshots.len() > 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the coordinator did not prune"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(node.view().state.kv_snapshots.len(), 2);
    node.shutdown().await;

    // Restart with the working copies lost: snapshot + the changelog after it.
    std::fs::remove_dir_all(dir.path().join("kv")).unwrap();
    let node = Node::start(c).await.unwrap();
    let want: Vec<(i64, i64)> = (0..10).map(|id| (id, 8)).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let got = loop {
        let keys = RecordBatch::try_from_iter(vec![(
            "user_id",
            Arc::new(Int64Array::from_iter_values(0..10)) as ArrayRef,
        )])
        .unwrap();
        match node.lookup("app", "visits", &keys).await {
            Ok(_) => break lookup_all(&node, "visits", 0..10).await,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(got, want, "no aggregate lost or counted twice");
    add_visits(&node, 1).await;
    assert_eq!(
        lookup_all(&node, "visits", 0..3).await,
        [(0, 9), (1, 9), (2, 9)]
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_key_tables_refuse_bad_definitions_and_writes_precisely() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 1);
    c.kv_dir = dir.path().join("kv");
    let node = Node::start(c).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let e = node
        .create_table(pk_spec(
            "t",
            &[
                ("table.merge-engine", "first_row"),
                ("table.delete.behavior", "allow"),
            ],
        ))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("does not support deletes"), "{e}");
    let mut log = spec("log", 1);
    log.options
        .insert("table.merge-engine".into(), "first_row".into());
    let e = node.create_table(log).await.unwrap_err();
    assert!(e.to_string().contains("primary-key tables only"), "{e}");
    node.create_table(pk_spec("t", &[])).await.unwrap();
    let e = node
        .alter_table(
            "app",
            "t",
            TableChange {
                set_options: [("table.merge-engine".to_string(), "first_row".to_string())].into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("cannot change"), "{e}");
    // A partial update naming a column that does not exist; a null key.
    let e = node
        .write(
            "app",
            "t",
            &visits(&[(1, 1)]),
            &WriteTarget {
                columns: Some(vec!["user_id".into(), "nope".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("unknown column \"nope\""), "{e}");
    let null_key = RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from(vec![None, Some(2)])) as ArrayRef,
        ),
        ("visits", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
    ])
    .unwrap();
    let e = node
        .write("app", "t", &null_key, &WriteTarget::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("\"user_id\" is not nullable"), "{e}");
    // A descriptor naming other columns than the batch's: the batch's `visits` would be
    // dropped, or a named column the batch lacks nulled.
    for named in [vec!["user_id"], vec!["user_id", "visits", "user_id"]] {
        let e = node
            .write(
                "app",
                "t",
                &visits(&[(3, 3)]),
                &WriteTarget {
                    columns: Some(named.iter().map(|c| c.to_string()).collect()),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("are not the batch's columns"),
            "{named:?}: {e}"
        );
    }
    assert!(
        lookup_all(&node, "t", 0..5).await.is_empty(),
        "nothing stored"
    );
    // Whole rows in another order than the table's are taken by name; a wrong type is named.
    let reordered = RecordBatch::try_from_iter(vec![
        ("visits", Arc::new(Int64Array::from(vec![40])) as ArrayRef),
        ("user_id", Arc::new(Int64Array::from(vec![4])) as ArrayRef),
    ])
    .unwrap();
    node.write("app", "t", &reordered, &WriteTarget::default())
        .await
        .unwrap();
    assert_eq!(lookup_all(&node, "t", 0..5).await, [(4, 40)]);
    let wrong_type = RecordBatch::try_from_iter(vec![
        ("visits", Arc::new(StringArray::from(vec!["x"])) as ArrayRef),
        ("user_id", Arc::new(Int64Array::from(vec![4])) as ArrayRef),
    ])
    .unwrap();
    let e = node
        .write("app", "t", &wrong_type, &WriteTarget::default())
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("column \"visits\" of type Utf8 does not match the table's type Int64"),
        "{e}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_primary_key_table_keys_rows_per_partition() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 1);
    c.kv_dir = dir.path().join("kv");
    let node = Node::start(c).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let schema = Schema::new(vec![
        Field::new("day", DataType::Utf8, true),
        Field::new("user_id", DataType::Int64, true),
        Field::new("visits", DataType::Int64, true),
    ]);
    let spec = |pk: Vec<&str>| TableSpec {
        primary_key: pk.into_iter().map(String::from).collect(),
        database: "app".into(),
        name: "daily".into(),
        schema: schema.clone(),
        options: [
            ("bucket.num".to_string(), "2".to_string()),
            ("table.merge-engine".to_string(), "aggregation".to_string()),
            ("fields.visits.agg".to_string(), "sum".to_string()),
        ]
        .into(),
        partition_keys: vec!["day".into()],
        comment: String::new(),
        if_not_exists: false,
    };
    let e = node.create_table(spec(vec!["user_id"])).await.unwrap_err();
    assert!(
        e.to_string().contains("must be part of the primary key"),
        "{e}"
    );
    let info = node
        .create_table(spec(vec!["day", "user_id"]))
        .await
        .unwrap();
    assert_eq!(
        info.bucket_key,
        ["user_id"],
        "the key without the partition column"
    );
    let rows = |r: &[(&str, i64, i64)]| {
        RecordBatch::try_from_iter(vec![
            (
                "day",
                Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.0))) as ArrayRef,
            ),
            (
                "user_id",
                Arc::new(Int64Array::from_iter_values(r.iter().map(|x| x.1))) as ArrayRef,
            ),
            (
                "visits",
                Arc::new(Int64Array::from_iter_values(r.iter().map(|x| x.2))) as ArrayRef,
            ),
        ])
        .unwrap()
    };
    for batch in [
        rows(&[("mon", 1, 1), ("tue", 1, 10), ("mon", 2, 5)]),
        rows(&[("mon", 1, 2), ("tue", 1, 20)]),
    ] {
        let w = node
            .write("app", "daily", &batch, &WriteTarget::default())
            .await
            .unwrap();
        assert!(w.iter().all(|b| b.result.is_ok()), "{w:?}");
    }
    assert_eq!(
        node.describe_table("app", "daily")
            .unwrap()
            .partitions
            .len(),
        2
    );
    let keys = RecordBatch::try_from_iter(vec![
        (
            "day",
            Arc::new(StringArray::from(vec!["tue", "mon", "wed", "mon"])) as ArrayRef,
        ),
        (
            "user_id",
            Arc::new(Int64Array::from(vec![1, 1, 1, 2])) as ArrayRef,
        ),
    ])
    .unwrap();
    let found = node.lookup("app", "daily", &keys).await.unwrap();
    let visits: Vec<i64> = found
        .column(2)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(
        visits,
        [30, 3, 5],
        "per partition, in key order, the unknown partition left out"
    );
    node.shutdown().await;
}

/// An option is acted on or refused, never accepted and ignored: Fluss options whose feature
/// is not built (automatic partitions, the lake for primary-key or partitioned tables,
/// enabling the lake later), values out of range and unknown `table.`/`bucket.` options are
/// refused, naming the option; the user's own properties are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_whose_feature_does_not_exist_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    for (key, value, needle) in [
        ("table.datalake.enabled", "yes", "expected true or false"),
        ("table.datalake.format", "paimon", "expected iceberg"),
        ("table.datalake.freshness", "-1", "a duration such as 3min"),
        (
            "table.auto-partition.enabled",
            "true",
            "automatic partition creation",
        ),
        (
            "table.replication.factor",
            "3",
            "unknown option table.replication.factor",
        ),
        ("bucket.nmu", "3", "unknown option bucket.nmu"),
    ] {
        let mut s = spec("refused", 1);
        s.options.insert(key.into(), value.into());
        match node.create_table(s).await {
            Err(NodeError::Invalid(m)) => {
                assert!(
                    m.starts_with(&format!("option {key}")) || m.contains(key),
                    "{m}"
                );
                assert!(m.contains(needle), "{m}");
            }
            other => panic!("{key} = {value}: {other:?}"),
        }
    }
    assert!(node.describe_table("app", "refused").is_err());
    let mut s = spec("events", 1);
    s.options
        .insert("table.datalake.enabled".into(), "false".into());
    s.options.insert("owner".into(), "team-a".into());
    let info = node.create_table(s).await.unwrap();
    assert_eq!(
        info.options.get("owner").map(String::as_str),
        Some("team-a")
    );
    // A reset names an option as a set does: a misspelt one is refused.
    let reset = node
        .alter_table(
            "app",
            "events",
            TableChange {
                reset_options: vec!["table.no-such-option".into()],
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(&reset, Err(NodeError::Invalid(m)) if m.contains("unknown option table.no-such-option")),
        "{reset:?}"
    );
    // The lake can be enabled later, and disabled (the lake tests test both).
    node.alter_table(
        "app",
        "events",
        TableChange {
            set_options: BTreeMap::from([("table.datalake.enabled".into(), "true".into())]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    node.shutdown().await;
}

/// Writes `batch` through `nodes[0]`, sending the rows of buckets led elsewhere to their
/// leaders; panics if any bucket refuses.
async fn write_at_leaders(nodes: &[&Node], table: &str, batch: &RecordBatch) {
    for w in nodes[0]
        .write("app", table, batch, &WriteTarget::default())
        .await
        .unwrap()
    {
        match (&w.result, &w.unsent) {
            (Ok(_), _) => {}
            (Err(NodeError::NotLeader { leader, .. }), Some(rows)) => {
                let at = nodes.iter().find(|n| n.node_id() == *leader).unwrap();
                let again = at
                    .write("app", table, rows, &WriteTarget::default())
                    .await
                    .unwrap();
                assert!(again.iter().all(|b| b.result.is_ok()), "{again:?}");
            }
            other => panic!("bucket {}: {other:?}", w.bucket),
        }
    }
}

/// `(user_id, visits)` of `ids` in the `visits` table, each asked of the node leading it.
async fn lookup_at_leaders(nodes: &[&Node], ids: std::ops::Range<i64>) -> Vec<(i64, i64)> {
    let mut found = Vec::new();
    for id in ids {
        let key = RecordBatch::try_from_iter(vec![(
            "user_id",
            Arc::new(Int64Array::from(vec![id])) as ArrayRef,
        )])
        .unwrap();
        for n in nodes {
            match n.lookup("app", "visits", &key).await {
                Ok(b) => {
                    let v = b.column(1).as_primitive::<Int64Type>();
                    found.extend((0..b.num_rows()).map(|i| (id, v.value(i))));
                    break;
                }
                Err(NodeError::NotLeader { .. }) => {}
                Err(e) => panic!("lookup of {id}: {e}"),
            }
        }
    }
    found
}

/// Waits until every bucket of `tables` is led by one of `live` and writes to each succeed;
/// returns how long that took.
async fn until_served(live: &[&Node], tables: &[&str], limit: Duration) -> Duration {
    let started = tokio::time::Instant::now();
    let ids: Vec<u64> = live.iter().map(|n| n.node_id()).collect();
    loop {
        let led = tables.iter().all(|t| {
            live[0]
                .describe_table("app", t)
                .unwrap()
                .buckets
                .iter()
                .all(|b| ids.contains(&b.leader_node_id))
        });
        if led {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "buckets still led by a dead node after {limit:?}: {:?}",
            tables
                .iter()
                .map(|t| live[0].describe_table("app", t).unwrap().buckets)
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Three nodes; the buckets of one that dies (a crash: no lease release, no heartbeat
/// expiry) move to the live ones within two lease TTLs, primary-key buckets with their
/// state; then the lease holder dies and the last node takes the lease and every bucket.
/// Everything acknowledged before reads back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_nodes_buckets_fail_over_to_live_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(1000);
    let nodes = [
        Node::start(config(dir.path(), 1)).await.unwrap(),
        Node::start(config(dir.path(), 2)).await.unwrap(),
        Node::start(config(dir.path(), 3)).await.unwrap(),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while nodes[0].live_nodes().await.unwrap().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "three live nodes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let all: Vec<&Node> = nodes.iter().collect();
    nodes[0].create_database("app", false).await.unwrap();
    nodes[0].create_table(spec("events", 6)).await.unwrap();
    let mut pk = pk_spec("visits", &[]);
    pk.options.insert("bucket.num".into(), "6".into());
    nodes[0].create_table(pk).await.unwrap();
    until_served(&all, &["events", "visits"], Duration::from_secs(10)).await;
    write_at_leaders(&all, "events", &batch(0..60)).await;
    let rows: Vec<(i64, i64)> = (0..30).map(|id| (id, id * 10)).collect();
    write_at_leaders(&all, "visits", &visits(&rows)).await;

    // Kill a node that is not the coordinator.
    let holder = nodes[0].view().state.coordinator.clone().unwrap().node_id;
    let victim = nodes.iter().position(|n| n.node_id() != holder).unwrap();
    let led_by_victim = nodes[0]
        .describe_table("app", "visits")
        .unwrap()
        .buckets
        .iter()
        .filter(|b| b.leader_node_id == nodes[victim].node_id())
        .count();
    assert!(led_by_victim > 0, "the victim leads primary-key buckets");
    nodes[victim].abort().await;
    let live: Vec<&Node> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, n)| n)
        .collect();
    let took = until_served(
        &live,
        &["events", "visits"],
        2 * ttl + Duration::from_secs(1),
    )
    .await;
    eprintln!(
        "failover of node {} with a {ttl:?} lease TTL took {took:?}",
        victim + 1
    );
    assert!(took <= 2 * ttl, "took {took:?}, more than two TTLs");
    // The moved buckets serve reads and writes, the primary-key ones with their state.
    write_at_leaders(&live, "events", &batch(60..90)).await;
    // Read where every node's writes are applied.
    let newest = live.iter().map(|n| n.view().applied_index).max().unwrap();
    live[0]
        .wait_applied(newest, Duration::from_secs(5))
        .await
        .unwrap();
    let all_ids: Vec<i64> = {
        let mut ids = Vec::new();
        for b in 0..6 {
            ids.extend(read_bucket(live[0], "events", b).await);
        }
        ids.sort_unstable();
        ids
    };
    assert_eq!(all_ids, (0..90).collect::<Vec<_>>(), "every row once");
    assert_eq!(lookup_at_leaders(&live, 0..30).await, rows);
    let holder_node = live.iter().find(|n| n.node_id() == holder).unwrap();

    // Kill the coordinator too: the last node takes the lease and every bucket.
    let last = live.iter().find(|n| n.node_id() != holder).unwrap();
    holder_node.abort().await;
    let took = until_served(&[last], &["events", "visits"], 4 * ttl).await;
    eprintln!("failover of the lease holder took {took:?}");
    assert_eq!(
        last.view().state.coordinator.as_ref().map(|c| c.node_id),
        Some(last.node_id())
    );
    assert_eq!(lookup_all(last, "visits", 0..30).await, rows);
    last.shutdown().await;
}

/// Buckets follow the operator: a rebalance spreads the buckets of a table created on one
/// node over a node that joined later; a drain moves them all off a node; the cluster status
/// shows heartbeats, leaders and drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rebalance_and_drain_move_buckets_between_live_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(config(dir.path(), 1)).await.unwrap();
    a.create_database("app", false).await.unwrap();
    a.create_table(spec("events", 4)).await.unwrap();
    until_served(&[&a], &["events"], Duration::from_secs(10)).await;
    let b = Node::start(config(dir.path(), 2)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.live_nodes().await.unwrap().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "two live nodes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let led = |n: &Node, id: u64| {
        n.describe_table("app", "events")
            .unwrap()
            .buckets
            .iter()
            .filter(|b| b.leader_node_id == id)
            .count()
    };
    assert_eq!((led(&a, 1), led(&a, 2)), (4, 0), "live leaders stay put");
    let planned = b.rebalance(true).await.unwrap();
    assert_eq!(planned.len(), 2, "{planned:?}");
    assert!(
        planned
            .iter()
            .all(|m| m.starts_with("move app.events bucket ")
                && m.ends_with(" from node 1 to node 2 (to even out the buckets per node)")),
        "{planned:?}"
    );
    assert_eq!(led(&a, 2), 0, "a dry run moves nothing");
    // Writes keep arriving at node 1 while it hands buckets over: each is either acknowledged
    // (and durable) or redirected to node 2 with NOT_LEADER, never failed by a fenced stream.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn({
        let (a, stop) = (a.clone(), Arc::clone(&stop));
        async move {
            let (mut acked, mut redirected, mut failed) = (Vec::new(), 0, Vec::new());
            let mut next = 1000;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let rows = batch(next..next + 8);
                let ids = rows.column(0).as_primitive::<Int64Type>().clone();
                let buckets = mink_log::routing::buckets_of(&rows, &[0], 4).unwrap();
                next += 8;
                for w in a
                    .write("app", "events", &rows, &WriteTarget::default())
                    .await
                    .unwrap()
                {
                    match (&w.result, &w.unsent) {
                        (Ok(_), _) => {
                            let part = ids.values().iter().zip(&buckets);
                            acked.extend(part.filter(|(_, b)| **b == w.bucket).map(|(id, _)| *id));
                        }
                        (
                            Err(NodeError::NotLeader {
                                leader: 2, address, ..
                            }),
                            Some(_),
                        ) if address == "127.0.0.1:7002" => {
                            redirected += 1;
                        }
                        (Err(e), _) => failed.push(format!("bucket {}: {e}", w.bucket)),
                    }
                }
            }
            (acked, redirected, failed)
        }
    });
    // The request goes from node 2 through the log to the coordinator (node 1).
    let moved = b.rebalance(false).await.unwrap();
    assert_eq!(moved, planned);
    until_view(&b, "the rebalance completing", |_| {
        let now = (led(&b, 1), led(&b, 2));
        if now == (2, 2) { Ok(()) } else { Err(now) }
    })
    .await;
    // Handed over, not forced: each moved stream was closed by node 1 at its leader epoch
    // and the transfer completed on node 2.
    until_view(&b, "the transfers completing", |view| {
        let transfers: Vec<_> = view
            .state
            .buckets
            .values()
            .filter(|r| r.leader_node_id == 2)
            .map(|r| {
                let s = &view.state.streams[&r.stream_id];
                (s.placement_node_id, s.transfer_to_node_id)
            })
            .collect();
        if transfers.iter().all(|t| *t == (2, 0)) {
            Ok(())
        } else {
            Err(transfers)
        }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acked, redirected, failed) = load.await.unwrap();
    assert!(
        failed.is_empty(),
        "writes failed during the moves: {failed:?}"
    );
    assert!(redirected > 0, "no write was redirected");
    eprintln!(
        "rebalance under load: {} rows acknowledged, {redirected} bucket writes redirected",
        acked.len()
    );
    until_served(&[&a, &b], &["events"], Duration::from_secs(5)).await;
    write_at_leaders(&[&a, &b], "events", &batch(0..40)).await;

    b.drain(2, true).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while led(&a, 2) > 0 {
        assert!(tokio::time::Instant::now() < deadline, "node 2 drained");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = a.cluster_status().await.unwrap();
    let two = status.nodes.iter().find(|n| n.node_id == 2).unwrap();
    assert!(two.live && two.drained && two.buckets == 0, "{status:?}");
    // Node 1 is the last live node taking buckets: draining it too is refused.
    let refused = b.drain(1, true).await;
    assert!(
        matches!(&refused, Err(NodeError::Invalid(m)) if m.starts_with("node 1 is the last live node that takes buckets")),
        "{refused:?}"
    );
    let status = b.cluster_status().await.unwrap();
    assert!(
        status.nodes.iter().all(|n| n.drained == (n.node_id == 2)),
        "{status:?}"
    );
    // Registered before the cluster reached metadata_version 3, the nodes state their
    // listeners once it has.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = a.cluster_status().await.unwrap();
        if s.nodes
            .iter()
            .all(|n| n.listeners.get("flight") == Some(&format!("127.0.0.1:{}", 7000 + n.node_id)))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "listeners never recorded (metadata_version {}): {s:?}",
            a.view().state.metadata_version
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status.coordinator.map(|c| c.0), Some(1));
    assert_eq!(status.buckets_without_live_leader, 0);
    assert!(two.heartbeat_age_ms.is_some_and(|a| a < 1000), "{two:?}");
    // Drained, it gets no new table's buckets either; undrained, a rebalance gives it some.
    a.create_table(spec("more", 2)).await.unwrap();
    until_served(&[&a], &["more"], Duration::from_secs(5)).await;
    b.drain(2, false).await.unwrap();
    assert!(!b.rebalance(false).await.unwrap().is_empty());
    assert!(matches!(
        a.drain(9, true).await,
        Err(NodeError::NotFound(_))
    ));
    // Every row written before the moves reads back once.
    let newest = a.view().applied_index.max(b.view().applied_index);
    a.wait_applied(newest, Duration::from_secs(5))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for bucket in 0..4 {
        ids.extend(read_bucket(&a, "events", bucket).await);
    }
    ids.sort_unstable();
    let mut want: Vec<i64> = (0..40).chain(acked).collect();
    want.sort_unstable();
    assert_eq!(ids, want, "every acknowledged row once");
    a.shutdown().await;
    b.shutdown().await;
}

/// Tiering runs on the node leading each table's first bucket, not only on the lease holder:
/// three one-bucket lake tables over two nodes are tiered by their leaders, and the lease
/// holder records every round, including those committed elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_are_tiered_by_the_leaders_of_their_first_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = [
        Node::start(config(dir.path(), 1)).await.unwrap(),
        Node::start(config(dir.path(), 2)).await.unwrap(),
    ];
    until_view(&nodes[0], "two registered nodes", |view| {
        if view.state.nodes.len() == 2 {
            Ok(())
        } else {
            Err(view.state.nodes.len())
        }
    })
    .await;
    let all: Vec<&Node> = nodes.iter().collect();
    nodes[0].create_database("app", false).await.unwrap();
    let tables = ["t1", "t2", "t3"];
    for t in tables {
        let mut s = spec(t, 1);
        s.options
            .insert("table.datalake.enabled".into(), "true".into());
        s.options
            .insert("table.datalake.freshness".into(), "1s".into());
        nodes[0].create_table(s).await.unwrap();
    }
    until_served(&all, &tables, Duration::from_secs(10)).await;
    for t in tables {
        write_at_leaders(&all, t, &batch(0..20)).await;
    }
    until_view(&nodes[0], "every table tiered and recorded", |view| {
        let tiered: Vec<u64> = tables
            .iter()
            .map(|t| {
                let id = view
                    .state
                    .tables
                    .values()
                    .find(|r| r.name == *t)
                    .unwrap()
                    .table_id;
                view.state
                    .lake_snapshots
                    .get(&id)
                    .and_then(|r| r.tiered_offset(0, 0))
                    .unwrap_or(0)
            })
            .collect();
        if tiered.iter().all(|t| *t == 20) {
            Ok(())
        } else {
            Err(tiered)
        }
    })
    .await;
    let holder = nodes[0].view().state.coordinator.clone().unwrap().node_id;
    let leaders: Vec<u64> = tables
        .iter()
        .map(|t| nodes[0].describe_table("app", t).unwrap().buckets[0].leader_node_id)
        .collect();
    assert!(
        leaders.iter().any(|l| *l != holder),
        "a table led by the node without the lease: {leaders:?}, holder {holder}"
    );
    for n in &nodes {
        let leads_one = leaders.contains(&n.node_id());
        assert_eq!(
            n.lake_rounds() > 0,
            leads_one,
            "node {} ran {} rounds; first-bucket leaders {leaders:?}",
            n.node_id(),
            n.lake_rounds()
        );
    }
    for n in nodes {
        n.shutdown().await;
    }
}

/// A tail that reaches rows written after its table grew ends there, naming the offset (it
/// used to drop the new columns silently); read again from that offset, the rows come with
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_ends_where_its_table_gained_columns() {
    use futures::StreamExt as _;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(spec("grows", 1)).await.unwrap();
    node.write("app", "grows", &batch(0..3), &WriteTarget::default())
        .await
        .unwrap();
    let tail_from = |from: u64| mink_node::ReadRequest {
        database: "app".into(),
        table: "grows".into(),
        bucket: Some(0),
        start: mink_node::ReadStart::Offset(from),
        stop: mink_node::ReadStop::Tail {
            idle: Some(Duration::from_secs(60)),
        },
        ..Default::default()
    };
    let mut tail = node.read_stream(
        node.plan_read(&tail_from(0)).unwrap(),
        mink_node::ReadOptions::default(),
    );
    let mut rows = 0;
    while rows < 3 {
        rows += tail.next().await.unwrap().unwrap().data.rows();
    }
    let mut fields = schema().fields().to_vec();
    fields.push(Arc::new(Field::new("score", DataType::Float64, true)));
    let grown = Arc::new(Schema::new(fields));
    node.alter_table(
        "app",
        "grows",
        TableChange {
            schema: Some(grown.as_ref().clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut columns = batch(3..5).columns().to_vec();
    columns.push(Arc::new(arrow::array::Float64Array::from(vec![0.5, 1.5])));
    let new_rows = RecordBatch::try_new(Arc::clone(&grown), columns).unwrap();
    node.write("app", "grows", &new_rows, &WriteTarget::default())
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), tail.next())
        .await
        .expect("the tail neither ended nor gave a row within 30 s")
        .expect("the tail ended without an error");
    match ended {
        Err(NodeError::Unavailable(m)) => assert!(m.contains("at offset 3"), "{m}"),
        other => panic!("the tail went on past the new columns: {other:?}"),
    }
    let plan = node.plan_read(&tail_from(3)).unwrap();
    assert_eq!(plan.schema.fields().len(), 3);
    let mut again = node.read_stream(plan, mink_node::ReadOptions::default());
    let item = again.next().await.unwrap().unwrap();
    assert_eq!((item.offset, item.data.rows()), (3, 2));
    node.shutdown().await;
}

/// A tailing read and a long-polling wait end, with an error, when the node shuts down under
/// them: they used to spin on the halted metadata log forever, holding a core and keeping the
/// runtime from shutting down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tails_end_when_the_node_shuts_down() {
    use futures::StreamExt as _;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(spec("tailed", 1)).await.unwrap();
    let plan = node
        .plan_read(&mink_node::ReadRequest {
            database: "app".into(),
            table: "tailed".into(),
            bucket: Some(0),
            stop: mink_node::ReadStop::Tail { idle: None },
            ..Default::default()
        })
        .unwrap();
    let mut tail = node.read_stream(plan, mink_node::ReadOptions::default());
    let waiting = tokio::spawn({
        let node = node.clone();
        async move {
            node.wait_for_data(
                &BucketRef::new("app", "tailed", None, 0),
                0,
                Duration::from_secs(3600),
            )
            .await
        }
    });
    node.shutdown().await;
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(item) = tail.next().await {
            if item.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the tail still runs 30 s after the shutdown");
    let waited = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the long poll still waits 30 s after the shutdown")
        .unwrap();
    assert!(waited.is_err(), "{waited:?}");
}

/// An object store belongs to one cluster: object ids come from the metadata, so a second
/// cluster under the same prefix overwrote the first one's objects (and swept them as
/// orphans). A start on another cluster's store, or on a store the cluster did not mark (a
/// wrong object-store URL), is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_serves_one_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let first = Node::start(config(dir.path(), 1)).await.unwrap();
    first.create_database("app", false).await.unwrap();
    let other = tempfile::tempdir().unwrap();
    let mut second = config(other.path(), 1);
    second.object_store_url = config(dir.path(), 1).object_store_url;
    let Err(refused) = Node::start(second).await else {
        panic!("a second cluster is refused")
    };
    assert!(
        refused
            .to_string()
            .contains("belongs to another Mink cluster"),
        "{refused}"
    );
    first.shutdown().await;
    let mut moved = config(dir.path(), 1);
    moved.object_store_url = other.path().join("objects").to_str().unwrap().to_string();
    let Err(refused) = Node::start(moved).await else {
        panic!("a wrong store is refused")
    };
    assert!(
        refused.to_string().contains("is not this cluster's"),
        "{refused}"
    );
    // A new node refused so never joins: it was listed, down, for good.
    let mut stray = config(dir.path(), 2);
    stray.object_store_url = other.path().join("objects").to_str().unwrap().to_string();
    let Err(refused) = Node::start(stray).await else {
        panic!("a wrong store is refused")
    };
    assert!(
        refused.to_string().contains("is not this cluster's"),
        "{refused}"
    );
    let again = Node::start(config(dir.path(), 1)).await.unwrap();
    assert_eq!(again.list_databases(), ["app"]);
    let nodes: Vec<u64> = again.view().state.nodes.keys().copied().collect();
    assert_eq!(nodes, [1], "the refused node joined the cluster");
    again.shutdown().await;
}

/// Metadata restored from a backup while the cluster went on writing is older than its store:
/// it would write new objects over the ids the newer copy used. It is refused, unless told to
/// claim the store, which deletes those objects (the newer copy is gone for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_older_than_its_store_is_refused_unless_it_claims_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(spec("events", 1)).await.unwrap();
    node.write("app", "events", &batch(0..10), &WriteTarget::default())
        .await
        .unwrap();
    node.shutdown().await;
    drop(node);
    // The backup: the database file with its log.
    let backup = dir.path().join("backup.db");
    for suffix in ["", "-wal"] {
        let from = dir.path().join(format!("meta.db{suffix}"));
        if from.exists() {
            std::fs::copy(from, dir.path().join(format!("backup.db{suffix}"))).unwrap();
        }
    }
    let restored = |claim: bool| {
        let mut c = config(dir.path(), 1);
        c.metadata_url = format!("sqlite://{}", backup.display());
        c.claim_object_store = claim;
        c
    };
    // The cluster goes on writing after the backup.
    let node = Node::start(config(dir.path(), 1)).await.unwrap();
    node.write("app", "events", &batch(10..20), &WriteTarget::default())
        .await
        .unwrap();
    node.shutdown().await;
    drop(node);
    let Err(refused) = Node::start(restored(false)).await else {
        panic!("metadata older than its store is refused")
    };
    assert!(
        refused
            .to_string()
            .contains("past every id this metadata has allocated"),
        "{refused}"
    );
    let node = Node::start(restored(true)).await.unwrap();
    assert_eq!(
        read_bucket(&node, "events", 0).await,
        (0..10).collect::<Vec<_>>()
    );
    node.write("app", "events", &batch(20..30), &WriteTarget::default())
        .await
        .unwrap();
    node.shutdown().await;
    drop(node);
    // Claimed: later starts go on as usual.
    let node = Node::start(restored(false)).await.unwrap();
    let mut rows = read_bucket(&node, "events", 0).await;
    rows.sort_unstable();
    assert_eq!(rows, (0..10).chain(20..30).collect::<Vec<_>>());
    node.shutdown().await;
}
