//! Tiering rounds into a lake table on a SQLite catalog and the local object store: rows land
//! once with their bucket, offset and timestamp; a round the lake already holds, or holds in
//! part, adds only what is missing; a gap is refused; rounds racing on the same rows commit
//! them once.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema as ArrowSchema};
use mink_lake::tier::{BucketRound, LogRows, Tiered, tiered_offsets};
use mink_lake::{Lake, LakeError};

fn columns() -> ArrowSchema {
    ArrowSchema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
    ])
}

/// Log batches of `bucket` covering offsets `from..to`, 10 rows each; user ids are
/// `bucket * 1000 + offset`.
fn log(bucket: u32, from: u64, to: u64) -> Vec<LogRows> {
    (from..to)
        .step_by(10)
        .map(|base| {
            let ids: Vec<i64> = (base..(base + 10).min(to))
                .map(|o| i64::from(bucket) * 1000 + o as i64)
                .collect();
            let events: Vec<String> = ids.iter().map(|i| format!("e{i}")).collect();
            LogRows {
                base_offset: base,
                timestamp_us: 1_700_000_000_000_000 + base as i64,
                rows: RecordBatch::try_new(
                    Arc::new(columns()),
                    vec![
                        Arc::new(Int64Array::from(ids)),
                        Arc::new(StringArray::from(events)),
                    ],
                )
                .unwrap(),
            }
        })
        .collect()
}

fn round(bucket: u32, from: u64, to: u64) -> BucketRound {
    BucketRound {
        partition_id: 0,
        bucket,
        start_offset: from,
        end_offset: to,
        batches: log(bucket, from, to),
    }
}

/// `(bucket, offset, user_id)` of every lake row, sorted.
async fn lake_rows(lake: &Lake) -> Vec<(i32, i64, i64)> {
    let batches = lake.scan("app", "events").await.unwrap();
    let mut rows = Vec::new();
    for b in batches {
        let bucket = b
            .column_by_name("__bucket")
            .unwrap()
            .as_primitive::<Int32Type>();
        let offset = b
            .column_by_name("__offset")
            .unwrap()
            .as_primitive::<Int64Type>();
        let id = b
            .column_by_name("user_id")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert_eq!(b.column_by_name("__timestamp").unwrap().null_count(), 0);
        for i in 0..b.num_rows() {
            rows.push((bucket.value(i), offset.value(i), id.value(i)));
        }
    }
    rows.sort_unstable();
    rows
}

fn expected(ranges: &[(u32, u64, u64)]) -> Vec<(i32, i64, i64)> {
    let mut rows: Vec<_> = ranges
        .iter()
        .flat_map(|&(b, from, to)| {
            (from..to).map(move |o| (b as i32, o as i64, i64::from(b) * 1000 + o as i64))
        })
        .collect();
    rows.sort_unstable();
    rows
}

async fn lake(dir: &std::path::Path) -> Lake {
    let objects = dir.join("objects");
    let url = objects.to_str().unwrap();
    let lake = Lake::open(
        &format!("sqlite://{}", dir.join("metadata.db").display()),
        url,
        s3stream::store::open(url).unwrap(),
    )
    .await
    .unwrap();
    if lake.load_table("app", "events").await.is_err() {
        lake.create_table("app", "events", &columns(), &[])
            .await
            .unwrap();
    }
    lake
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_land_once_and_roll_forward_from_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let l = lake(dir.path()).await;
    let first = l
        .tier("app", "events", vec![round(0, 0, 25), round(1, 0, 12)])
        .await
        .unwrap();
    let Tiered::Committed { offsets, .. } = first else {
        panic!("{first:?}")
    };
    assert_eq!(offsets, BTreeMap::from([((0, 0), 25), ((0, 1), 12)]));
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 25), (1, 0, 12)]));

    // The same round again (a retry after a lost answer): nothing changes.
    let again = l
        .tier("app", "events", vec![round(0, 0, 25), round(1, 0, 12)])
        .await
        .unwrap();
    assert!(matches!(again, Tiered::AlreadyTiered { .. }), "{again:?}");
    // A round overlapping what is tiered adds the rest only; other buckets carry forward.
    let next = l
        .tier("app", "events", vec![round(0, 20, 40)])
        .await
        .unwrap();
    let Tiered::Committed { offsets, .. } = next else {
        panic!("{next:?}")
    };
    assert_eq!(offsets, BTreeMap::from([((0, 0), 40), ((0, 1), 12)]));
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 40), (1, 0, 12)]));
    // Another node's catalog reads the same record.
    let other = lake(dir.path()).await;
    let table = other.load_table("app", "events").await.unwrap();
    assert_eq!(tiered_offsets(&table), offsets);
    // A round that starts past the tiered offset would leave a hole: refused.
    assert!(matches!(
        l.tier("app", "events", vec![round(1, 20, 30)]).await,
        Err(LakeError::Gap {
            bucket: 1,
            tiered: 12,
            start: 20
        })
    ));
    // Reading back: a bucket's range in offset order, as the table's rows; a range the lake
    // does not hold whole fails instead of returning part of it.
    let table = l.load_table("app", "events").await.unwrap();
    let snapshot = table.metadata().current_snapshot_id().unwrap();
    let schema = Arc::new(columns());
    let back = l
        .read_bucket("app", "events", snapshot, 0, 5..35, &schema)
        .await
        .unwrap();
    assert!(back.iter().all(|b| b.schema() == schema));
    let ids: Vec<i64> = back
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(ids, (5..35).collect::<Vec<i64>>());
    assert!(matches!(
        l.read_bucket("app", "events", snapshot, 0, 30..45, &schema)
            .await,
        Err(LakeError::Gap { bucket: 0, .. })
    ));
    // Batches with a hole between them are refused too.
    let mut holed = round(1, 12, 40);
    holed.batches.remove(1);
    assert!(matches!(
        l.tier("app", "events", vec![holed]).await,
        Err(LakeError::Gap { bucket: 1, .. })
    ));
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 40), (1, 0, 12)]));
}

/// Four workers tier the same rows at once: the commit made on a stale snapshot fails rather
/// than being applied again on the new head, so every row is in the lake once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_rounds_commit_the_rows_once() {
    let dir = tempfile::tempdir().unwrap();
    lake(dir.path()).await;
    let workers = futures::future::join_all((0..4).map(|_| {
        let path = dir.path().to_path_buf();
        async move {
            let l = lake(&path).await;
            l.tier("app", "events", vec![round(0, 0, 50), round(1, 0, 30)])
                .await
        }
    }))
    .await;
    let committed = workers
        .iter()
        .filter(|r| matches!(r, Ok(Tiered::Committed { .. })))
        .count();
    assert!(committed >= 1, "{workers:?}");
    let l = lake(dir.path()).await;
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 50), (1, 0, 30)]));
    // Whoever failed finds the rows tiered when it reads the summary again.
    for r in workers {
        if r.is_err() {
            let again = l
                .tier("app", "events", vec![round(0, 0, 50), round(1, 0, 30)])
                .await
                .unwrap();
            assert!(matches!(again, Tiered::AlreadyTiered { .. }), "{again:?}");
        }
    }
}

/// The same on S3 (moto from `scripts/test.sh`): Iceberg metadata and Parquet files go through
/// the node's object_store client, and the table is read back through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiering_works_on_s3() {
    let (endpoint, bucket) = match (
        std::env::var("MINK_TEST_S3_ENDPOINT"),
        std::env::var("MINK_TEST_S3_BUCKET"),
    ) {
        (Ok(e), Ok(b)) if !e.is_empty() => (e, b),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but MINK_TEST_S3_ENDPOINT is not set: run scripts/test.sh")
        }
        _ => return,
    };
    let url = format!(
        "s3://{bucket}/lake-{:016x}?endpoint={endpoint}&allow_http=true&region=us-east-1\
         &access_key_id=test&secret_access_key=test&virtual_hosted_style_request=false",
        rand::random::<u64>()
    );
    let dir = tempfile::tempdir().unwrap();
    let l = Lake::open(
        &format!("sqlite://{}", dir.path().join("metadata.db").display()),
        &url,
        s3stream::store::open(&url).unwrap(),
    )
    .await
    .unwrap();
    assert!(
        l.warehouse().starts_with(&format!("s3://{bucket}/lake-")),
        "{}",
        l.warehouse()
    );
    l.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    l.tier("app", "events", vec![round(0, 0, 25), round(1, 0, 12)])
        .await
        .unwrap();
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 25), (1, 0, 12)]));
}
