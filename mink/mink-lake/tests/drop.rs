//! Dropping from the lake what the Mink table dropped: a partition's files and offsets (in one
//! snapshot, idempotently, other partitions untouched), and a whole table; an Iceberg table
//! still holding an earlier table's offsets is not attached.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema as ArrowSchema};
use mink_lake::tier::{BucketRound, LogRows, tiered_offsets};
use mink_lake::{Lake, LakeError};

mod common;

fn columns() -> ArrowSchema {
    ArrowSchema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("day", DataType::Utf8, false),
    ])
}

/// Ten rows of partition `day` (id `partition_id`) in bucket 0, ids from `first`.
fn round(partition_id: u64, day: &str, first: i64) -> BucketRound {
    BucketRound {
        partition_id,
        bucket: 0,
        start_offset: 0,
        end_offset: 10,
        batches: vec![LogRows {
            base_offset: 0,
            timestamp_us: 1_700_000_000_000_000,
            rows: RecordBatch::try_new(
                Arc::new(columns()),
                vec![
                    Arc::new(Int64Array::from_iter_values(first..first + 10)),
                    Arc::new(StringArray::from_iter_values((0..10).map(|_| day))),
                ],
            )
            .unwrap(),
        }],
    }
}

async fn ids(l: &Lake) -> Vec<i64> {
    let mut ids: Vec<i64> = l
        .scan("app", "visits")
        .await
        .unwrap()
        .iter()
        .flat_map(|b| {
            b.column_by_name("id")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    ids.sort_unstable();
    ids
}

fn live(days: &[(u64, &str)]) -> BTreeMap<u64, BTreeMap<String, String>> {
    days.iter()
        .map(|(id, day)| (*id, BTreeMap::from([("day".to_string(), day.to_string())])))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_partition_leaves_the_lake_and_a_dropped_table_its_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects");
    let url = objects.to_str().unwrap();
    let l = Lake::open(
        &format!("sqlite://{}", dir.path().join("metadata.db").display()),
        url,
        s3stream::store::open(url).unwrap(),
    )
    .await
    .unwrap();
    l.create_table("app", "visits", &columns(), &["day".to_string()])
        .await
        .unwrap();
    l.tier(
        "app",
        "visits",
        vec![round(1, "2026-12-01", 0), round(2, "2026-12-02", 100)],
    )
    .await
    .unwrap();
    assert_eq!(ids(&l).await.len(), 20);
    // pyiceberg and DuckDB read both partitions' rows (offset = id % 100).
    let db = dir.path().join("metadata.db");
    let offsets = |ids: Vec<i64>| {
        let mut o: Vec<i64> = ids.iter().map(|id| id % 100).collect();
        o.sort_unstable();
        o
    };
    common::outside_readers_see(&l, &db, "visits", &offsets(ids(&l).await)).await;

    // Partition 2 is dropped: its rows and its offsets go; partition 1 keeps both.
    assert!(
        l.drop_partitions("app", "visits", &live(&[(1, "2026-12-01")]))
            .await
            .unwrap()
    );
    assert_eq!(ids(&l).await, (0..10).collect::<Vec<_>>());
    common::outside_readers_see(&l, &db, "visits", &offsets(ids(&l).await)).await;
    let t = l.load_table("app", "visits").await.unwrap();
    assert_eq!(
        tiered_offsets(&t).into_iter().collect::<Vec<_>>(),
        vec![((1, 0), 10)]
    );
    // Done already: nothing more to commit.
    assert!(
        !l.drop_partitions("app", "visits", &live(&[(1, "2026-12-01")]))
            .await
            .unwrap()
    );

    // An Iceberg table with an earlier table's offsets is not attached to a new table...
    let refused = l
        .ensure_table("app", "visits", &columns(), &["day".into()], &[], None)
        .await;
    assert!(matches!(refused, Err(LakeError::Stale(_))), "{refused:?}");
    // ...until it is dropped.
    assert!(l.drop_table("app", "visits").await.unwrap());
    assert!(matches!(
        l.load_table("app", "visits").await,
        Err(LakeError::NotFound(_))
    ));
    assert!(!l.drop_table("app", "visits").await.unwrap());
    l.ensure_table("app", "visits", &columns(), &["day".into()], &[], None)
        .await
        .unwrap();
    assert!(ids(&l).await.is_empty());
}
