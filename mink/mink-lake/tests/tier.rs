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
