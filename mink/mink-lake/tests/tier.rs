//! Tiering rounds into a lake table on a SQLite catalog and the local object store: rows land
//! once with their bucket, offset and timestamp; a round the lake already holds, or holds in
//! part, adds only what is missing; a gap is refused; rounds racing on the same rows commit
//! them once.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use mink_lake::tier::{Tiered, tiered_offsets};
use mink_lake::{Lake, LakeError};

mod common;
use common::{columns, expected, lake_rows, round};

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
        .read_bucket(
            "app",
            "events",
            snapshot,
            &Default::default(),
            0,
            5..35,
            &schema,
            None,
        )
        .await
        .unwrap();
    assert!(back.iter().all(|b| b.schema() == schema));
    let ids: Vec<i64> = back
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(ids, (5..35).collect::<Vec<i64>>());
    assert!(matches!(
        l.read_bucket(
            "app",
            "events",
            snapshot,
            &Default::default(),
            0,
            30..45,
            &schema,
            None
        )
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
    let Some((bucket, url)) = common::s3_url() else {
        return;
    };
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

/// Types Iceberg holds only in other units (second and millisecond timestamps and times,
/// `Date64`, durations), nested ones too, are tiered as their lake types and read back exactly
/// as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_of_other_units_are_tiered_and_read_back_exactly() {
    use arrow::array::{
        ArrayRef, Date64Array, DurationMillisecondArray, ListArray, RecordBatch,
        Time32MillisecondArray, TimestampMillisecondArray, TimestampSecondArray,
    };
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use mink_lake::tier::{BucketRound, LogRows};
    let seconds = Field::new("item", DataType::Timestamp(TimeUnit::Second, None), true);
    let columns = Schema::new(vec![
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("time", DataType::Time32(TimeUnit::Millisecond), true),
        Field::new("day", DataType::Date64, true),
        Field::new("took", DataType::Duration(TimeUnit::Millisecond), true),
        Field::new("seen", DataType::List(Arc::new(seconds.clone())), true),
    ]);
    let rows = RecordBatch::try_new(
        Arc::new(columns.clone()),
        vec![
            Arc::new(
                TimestampMillisecondArray::from(vec![1_764_505_296_789, -1]).with_timezone("UTC"),
            ) as ArrayRef,
            Arc::new(Time32MillisecondArray::from(vec![Some(45_296_789), None])),
            Arc::new(Date64Array::from(vec![Some(1_764_460_800_000), None])),
            Arc::new(DurationMillisecondArray::from(vec![Some(1_500), Some(-3)])),
            Arc::new(ListArray::new(
                Arc::new(seconds),
                arrow::buffer::OffsetBuffer::from_lengths([2, 0]),
                Arc::new(TimestampSecondArray::from(vec![1_764_505_296, 0])),
                None,
            )),
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let l = lake(dir.path()).await;
    l.create_table("app", "times", &columns, &[]).await.unwrap();
    let round = BucketRound {
        partition_id: 0,
        bucket: 0,
        start_offset: 0,
        end_offset: 2,
        batches: vec![LogRows {
            base_offset: 0,
            timestamp_us: 1_700_000_000_000_000,
            rows: rows.clone(),
        }],
    };
    l.tier("app", "times", vec![round]).await.unwrap();
    let table = l.load_table("app", "times").await.unwrap();
    let snapshot = table.metadata().current_snapshot_id().unwrap();
    let back = l
        .read_bucket(
            "app",
            "times",
            snapshot,
            &Default::default(),
            0,
            0..2,
            &rows.schema(),
            None,
        )
        .await
        .unwrap();
    let back = arrow::compute::concat_batches(&rows.schema(), &back).unwrap();
    assert_eq!(back, rows);
}
