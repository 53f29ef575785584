//! Primary-key tables in the lake: rounds of upserts and deletes leave one live row per key
//! (its last image, at the offset of its last change) and none for a deleted key, through
//! position deletes; iceberg-rust, pyiceberg and DuckDB all read exactly that state, before
//! and after compaction folds the deletes into the data. A compaction that read its files
//! before a round added deletes does not commit over them.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema as ArrowSchema};
use mink_lake::maintain::Maintenance;
use mink_lake::pk::{BucketChanges, ChangeRows};
use mink_lake::tier::Tiered;
use mink_lake::{Lake, LakeError};

mod common;

fn columns() -> ArrowSchema {
    ArrowSchema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ])
}

/// A change per `(id, Some(name))` upsert or `(id, None)` delete, at offsets `from..`.
fn changes(bucket: u32, from: u64, ops: &[(i64, Option<&str>)]) -> BucketChanges {
    let ids = Int64Array::from_iter_values(ops.iter().map(|o| o.0));
    let names = StringArray::from_iter(ops.iter().map(|o| Some(o.1.unwrap_or("gone"))));
    let end = from + ops.len() as u64;
    BucketChanges {
        partition_id: 0,
        partition: BTreeMap::new(),
        bucket,
        start_offset: from,
        end_offset: end,
        changes: vec![ChangeRows {
            rows: RecordBatch::try_new(Arc::new(columns()), vec![Arc::new(ids), Arc::new(names)])
                .unwrap(),
            offsets: (from..end).collect(),
            timestamps_us: (from..end)
                .map(|o| 1_700_000_000_000_000 + o as i64)
                .collect(),
            upsert: ops.iter().map(|o| o.1.is_some()).collect(),
        }],
    }
}

/// A round of one bucket: `(bucket, first offset, changes)`.
type Round<'a> = (u32, u64, Vec<(i64, Option<&'a str>)>);

/// `(bucket, id) -> (name, offset)` of every live lake row (iceberg-rust's scan).
async fn state(l: &Lake) -> BTreeMap<(i32, i64), (String, i64)> {
    let mut rows = BTreeMap::new();
    for b in l.scan("app", "users").await.unwrap() {
        let bucket = b
            .column_by_name("__bucket")
            .unwrap()
            .as_primitive::<Int32Type>();
        let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let name = b.column_by_name("name").unwrap().as_string::<i32>();
        let offset = b
            .column_by_name("__offset")
            .unwrap()
            .as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let had = rows.insert(
                (bucket.value(i), id.value(i)),
                (name.value(i).to_string(), offset.value(i)),
            );
            assert!(had.is_none(), "key {} twice in the lake", id.value(i));
        }
    }
    rows
}

/// What the lake must hold after `rounds` of `(bucket, from, ops)`, applied in order.
fn expected(rounds: &[Round<'_>]) -> BTreeMap<(i32, i64), (String, i64)> {
    let mut rows = BTreeMap::new();
    for (bucket, from, ops) in rounds {
        for (i, (id, name)) in ops.iter().enumerate() {
            let key = (*bucket as i32, *id);
            match name {
                Some(n) => {
                    rows.insert(key, (n.to_string(), (*from + i as u64) as i64));
                }
                None => {
                    rows.remove(&key);
                }
            }
        }
    }
    rows
}

fn key_pk() -> Vec<String> {
    vec!["id".to_string()]
}

async fn tier(l: &Lake, round: &Round<'_>) -> Tiered {
    l.tier_changes(
        "app",
        "users",
        &key_pk(),
        vec![changes(round.0, round.1, &round.2)],
    )
    .await
    .unwrap()
}

fn offsets(rows: &BTreeMap<(i32, i64), (String, i64)>) -> Vec<i64> {
    let mut o: Vec<i64> = rows.values().map(|v| v.1).collect();
    o.sort_unstable();
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_and_deletes_leave_one_row_per_live_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metadata.db");
    let objects = dir.path().join("objects");
    let url = objects.to_str().unwrap();
    let l = Lake::open(
        &format!("sqlite://{}", db.display()),
        url,
        s3stream::store::open(url).unwrap(),
    )
    .await
    .unwrap();
    l.create_table("app", "users", &columns(), &[])
        .await
        .unwrap();

    let first: Vec<(i64, Option<&str>)> = (0..20).map(|i| (i, Some("a"))).collect();
    let mut second: Vec<(i64, Option<&str>)> = vec![(0, Some("b")), (0, Some("c"))];
    second.extend((1..5).map(|i| (i, Some("b"))));
    second.extend((5..10).map(|i| (i, None)));
    second.extend((20..25).map(|i| (i, Some("b"))));
    // A key inserted and deleted within one round never reaches the lake.
    second.extend([(30, Some("x")), (30, None)]);
    let third: Vec<(i64, Option<&str>)> = vec![(5, Some("again")), (20, None), (1, Some("d"))];
    let mut rounds = vec![
        (0, 0, first),
        (1, 0, vec![(100, Some("other")), (101, Some("other"))]),
        (0, 20, second),
    ];
    rounds.push((0, 20 + rounds[2].2.len() as u64, third));
    for r in &rounds {
        let before = l.metadata_locations().await.unwrap();
        assert!(matches!(tier(&l, r).await, Tiered::Committed { .. }));
        // Each commit is a new metadata file (never the old one rewritten), which the
        // catalog's compare-and-set swaps in.
        let after = l.metadata_locations().await.unwrap();
        assert_ne!(before, after);
    }
    let want = expected(&rounds);
    assert_eq!(state(&l).await, want);
    // The catalog's one-query view of the heads agrees with a table load.
    let heads = l.metadata_locations().await.unwrap();
    assert_eq!(
        heads
            .get(&("app".to_string(), "users".to_string()))
            .map(String::as_str),
        l.load_table("app", "users")
            .await
            .unwrap()
            .metadata_location()
    );
    // A round the lake holds already adds nothing.
    assert!(matches!(
        tier(&l, &rounds[3]).await,
        Tiered::AlreadyTiered { .. }
    ));
    let t = l.load_table("app", "users").await.unwrap();
    let summary = &t
        .metadata()
        .current_snapshot()
        .unwrap()
        .summary()
        .additional_properties;
    assert_ne!(summary["total-delete-files"], "0", "{summary:?}");

    // Outside readers see the same live rows (by their offsets).
    common::outside_readers_see(&l, &db, "users", &offsets(&want)).await;

    // Compaction folds the deletes into the data; later rounds find keys in the new files.
    let compacted = l
        .compact("app", "users", &Maintenance::default())
        .await
        .unwrap()
        .expect("a table with deletes is compacted");
    assert_eq!(compacted.rows, want.len() as u64);
    let t = l.load_table("app", "users").await.unwrap();
    let summary = &t
        .metadata()
        .current_snapshot()
        .unwrap()
        .summary()
        .additional_properties;
    assert_eq!(summary["total-delete-files"], "0", "{summary:?}");
    assert_eq!(summary["total-data-files"], "1", "{summary:?}");
    assert_eq!(state(&l).await, want);
    let next = 20 + rounds[2].2.len() as u64 + rounds[3].2.len() as u64;
    rounds.push((0, next, vec![(1, Some("e")), (2, None)]));
    tier(&l, &rounds[4]).await;
    let want = expected(&rounds);
    assert_eq!(state(&l).await, want);
    common::outside_readers_see(&l, &db, "users", &offsets(&want)).await;

    // A compaction that read its files before a round added deletes does not commit.
    let rewrite = l
        .rewrite_small_files("app", "users", &Maintenance::default())
        .await
        .unwrap()
        .expect("deletes to fold");
    rounds.push((0, next + 2, vec![(3, None)]));
    tier(&l, &rounds[5]).await;
    let refused = l.commit_rewrite("app", "users", &rewrite).await;
    assert!(
        matches!(refused, Err(LakeError::Conflict(_))),
        "{refused:?}"
    );
    assert_eq!(state(&l).await, expected(&rounds));
}

/// Asserts the lake holds exactly the state `rounds` leave, naming the keys that differ.
async fn same_state(l: &Lake, rounds: &[Round<'_>]) {
    let (got, want) = (state(l).await, expected(rounds));
    let wrong: Vec<_> = got
        .iter()
        .filter(|(k, v)| want.get(k) != Some(v))
        .map(|(k, v)| (k, Some(v), want.get(k)))
        .chain(
            want.iter()
                .filter(|(k, _)| !got.contains_key(k))
                .map(|(k, v)| (k, None, Some(v))),
        )
        .collect();
    assert!(wrong.is_empty(), "(key, lake, expected): {wrong:?}");
}

async fn open_lake(db: &std::path::Path, objects: &std::path::Path) -> Lake {
    let url = objects.to_str().unwrap();
    Lake::open(
        &format!("sqlite://{}", db.display()),
        url,
        s3stream::store::open(url).unwrap(),
    )
    .await
    .unwrap()
}

/// The rounds' key locations come from the key index, which reads only the data files added
/// since the snapshot it reflects: one file per round here, whatever the table's size. Another
/// node's rounds and a compaction are caught up from their files; an index kept on disk
/// outlives its process; an index dropped, or of another table of the name, is rebuilt from
/// the live files once. The lake's rows stay exactly the expected state throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_index_reads_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (db, objects) = (dir.path().join("metadata.db"), dir.path().join("objects"));
    let keys_dir = dir.path().join("keys");
    let l = open_lake(&db, &objects)
        .await
        .with_key_index_dir(keys_dir.clone());
    l.create_table("app", "users", &columns(), &[])
        .await
        .unwrap();

    let mut rounds: Vec<Round<'static>> = vec![(0, 0, (0..1000).map(|i| (i, Some("a"))).collect())];
    let mut next = 1000u64;
    // Round k: 10 upserts and 2 deletes, then `extra`.
    let mut round = |rounds: &mut Vec<Round<'static>>,
                     k: i64,
                     extra: &[(i64, Option<&'static str>)]| {
        let mut ops: Vec<(i64, Option<&str>)> = (0..10).map(|i| (k * 37 + i, Some("b"))).collect();
        ops.extend([(k * 11 + 500, None), (k * 13 + 700, None)]);
        ops.extend_from_slice(extra);
        let from = next;
        next += ops.len() as u64;
        rounds.push((0, from, ops));
    };
    tier(&l, &rounds[0]).await;
    // The first round's own file, read once the commit landed.
    assert_eq!(l.key_files_read(), 1);
    for k in 1..=4 {
        round(&mut rounds, k, &[]);
        tier(&l, rounds.last().unwrap()).await;
        assert_eq!(l.key_files_read(), 1 + k as u64, "round {k}");
    }
    same_state(&l, &rounds).await;

    // Another node (an index in memory) tiers a round: it indexes every live file once.
    let other = open_lake(&db, &objects).await;
    round(&mut rounds, 5, &[]);
    tier(&other, rounds.last().unwrap()).await;
    assert_eq!(other.key_files_read(), 6, "a rebuild reads every live file");
    // This one catches up from that round's file, then reads its own.
    round(&mut rounds, 6, &[]);
    tier(&l, rounds.last().unwrap()).await;
    assert_eq!(l.key_files_read(), 5 + 2);
    same_state(&l, &rounds).await;

    // A compaction elsewhere: its output is read once, and the next round finds keys in it.
    other
        .compact("app", "users", &Maintenance::default())
        .await
        .unwrap()
        .expect("deletes to fold");
    round(&mut rounds, 7, &[(3, Some("after compaction"))]);
    tier(&l, rounds.last().unwrap()).await;
    assert_eq!(l.key_files_read(), 7 + 2);
    same_state(&l, &rounds).await;

    // Restarted with the same directory: the index is still at the last snapshot.
    drop(l);
    let l = open_lake(&db, &objects)
        .await
        .with_key_index_dir(keys_dir.clone());
    round(&mut rounds, 8, &[]);
    tier(&l, rounds.last().unwrap()).await;
    assert_eq!(
        l.key_files_read(),
        1,
        "a restart reads only the round's own file"
    );
    same_state(&l, &rounds).await;

    // Dropped (the table is no longer tiered here): the next round rebuilds.
    l.retain_key_indexes(&Default::default());
    assert_eq!(std::fs::read_dir(&keys_dir).unwrap().count(), 0);
    round(&mut rounds, 9, &[]);
    tier(&l, rounds.last().unwrap()).await;
    let live = l
        .load_table("app", "users")
        .await
        .unwrap()
        .metadata()
        .current_snapshot()
        .unwrap()
        .summary()
        .additional_properties["total-data-files"]
        .parse::<u64>()
        .unwrap();
    // Every file live before the round, then the round's own.
    assert_eq!(l.key_files_read(), 1 + (live - 1) + 1);
    same_state(&l, &rounds).await;

    // A table of the same name, created again: its index starts empty.
    assert!(l.drop_table("app", "users").await.unwrap());
    l.create_table("app", "users", &columns(), &[])
        .await
        .unwrap();
    let again: Vec<Round<'_>> = vec![(0, 0, vec![(1, Some("new")), (2, Some("new"))])];
    tier(&l, &again[0]).await;
    same_state(&l, &again).await;
}

/// A partitioned primary-key table: each partition's changes replace rows in that
/// partition's files, and its position deletes go with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_keeps_one_row_per_live_key() {
    let dir = tempfile::tempdir().unwrap();
    let l = open_lake(&dir.path().join("metadata.db"), &dir.path().join("objects")).await;
    let schema = ArrowSchema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("day", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    l.create_table("app", "users", &schema, &["day".to_string()])
        .await
        .unwrap();
    let key = vec!["id".to_string(), "day".to_string()];
    // (day, first offset, changes) of bucket 0 of each day's partition.
    let round = |day: &str, partition_id: u64, from: u64, ops: &[(i64, Option<&str>)]| {
        let end = from + ops.len() as u64;
        let rows = RecordBatch::try_new(
            Arc::new(schema.clone()),
            vec![
                Arc::new(Int64Array::from_iter_values(ops.iter().map(|o| o.0))),
                Arc::new(StringArray::from_iter_values(ops.iter().map(|_| day))),
                Arc::new(StringArray::from_iter(
                    ops.iter().map(|o| Some(o.1.unwrap_or("gone"))),
                )),
            ],
        )
        .unwrap();
        BucketChanges {
            partition_id,
            partition: [("day".to_string(), day.to_string())].into(),
            bucket: 0,
            start_offset: from,
            end_offset: end,
            changes: vec![ChangeRows {
                rows,
                offsets: (from..end).collect(),
                timestamps_us: vec![1_700_000_000_000_000; ops.len()],
                upsert: ops.iter().map(|o| o.1.is_some()).collect(),
            }],
        }
    };
    let a = [(1, Some("a")), (2, Some("a")), (3, Some("a"))];
    l.tier_changes(
        "app",
        "users",
        &key,
        vec![round("2026-12-01", 1, 0, &a), round("2026-12-02", 2, 0, &a)],
    )
    .await
    .unwrap();
    let b = [(1, Some("b")), (2, None)];
    l.tier_changes(
        "app",
        "users",
        &key,
        vec![
            round("2026-12-01", 1, 3, &b),
            round("2026-12-02", 2, 3, &[(3, None)]),
        ],
    )
    .await
    .unwrap();
    let mut rows = Vec::new();
    for batch in l.scan("app", "users").await.unwrap() {
        let id = batch
            .column_by_name("id")
            .unwrap()
            .as_primitive::<Int64Type>();
        let day = batch.column_by_name("day").unwrap().as_string::<i32>();
        let name = batch.column_by_name("name").unwrap().as_string::<i32>();
        for i in 0..batch.num_rows() {
            rows.push((
                day.value(i).to_string(),
                id.value(i),
                name.value(i).to_string(),
            ));
        }
    }
    rows.sort();
    let row = |d: &str, i: i64, n: &str| (d.to_string(), i, n.to_string());
    assert_eq!(
        rows,
        vec![
            row("2026-12-01", 1, "b"),
            row("2026-12-01", 3, "a"),
            row("2026-12-02", 1, "a"),
            row("2026-12-02", 2, "a"),
        ]
    );
}
