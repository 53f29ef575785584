//! A read's filter prunes the lake: Iceberg plans only the files whose statistics may hold
//! matching rows, and returns only the rows that match, in offset order.

use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use futures::TryStreamExt as _;
use mink_lake::Lake;
use mink_lake::tier::{BucketRound, LogRows};
use mink_read::prune::{LakePrune, to_iceberg};
use mink_read::{BoundFilter, Filter};

fn columns() -> Schema {
    Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
    ])
}

/// Bucket 0's offsets `from..to` as one round; user ids equal offsets.
fn round(from: u64, to: u64) -> BucketRound {
    let ids: Vec<i64> = (from..to).map(|o| o as i64).collect();
    let events: Vec<String> = ids.iter().map(|i| format!("e{i}")).collect();
    BucketRound {
        partition_id: 0,
        bucket: 0,
        start_offset: from,
        end_offset: to,
        batches: vec![LogRows {
            base_offset: from,
            timestamp_us: 1_700_000_000_000_000,
            rows: RecordBatch::try_new(
                Arc::new(columns()),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(StringArray::from(events)),
                ],
            )
            .unwrap(),
        }],
    }
}

fn bound(filter: serde_json::Value) -> BoundFilter {
    serde_json::from_value::<Filter>(filter)
        .unwrap()
        .bind(
            &columns(),
            &[mink_read::filter::BUCKET, mink_read::filter::OFFSET],
        )
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_prunes_lake_files_and_rows() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects");
    let url = objects.to_str().unwrap();
    let lake = Lake::open(
        &format!("sqlite://{}", dir.path().join("metadata.db").display()),
        url,
        s3stream::store::open(url).unwrap(),
    )
    .await
    .unwrap();
    lake.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    // Four rounds, one data file each: offsets (and ids) 0..100, 100..200, ...
    for r in 0..4 {
        lake.tier("app", "events", vec![round(r * 100, (r + 1) * 100)])
            .await
            .unwrap();
    }
    let table = lake.load_table("app", "events").await.unwrap();
    let snapshot = table.metadata().current_snapshot().unwrap().snapshot_id();
    let lake_schema = table.metadata().current_schema();
    let planned = |filter: &BoundFilter| {
        let mut scan = table.scan().snapshot_id(snapshot);
        if let Some(p) = to_iceberg(filter, lake_schema) {
            scan = scan.with_filter(p);
        }
        async move {
            let files: Vec<_> = scan
                .build()
                .unwrap()
                .plan_files()
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            files.len()
        }
    };
    assert_eq!(planned(&BoundFilter::default()).await, 4);
    let ids = bound(serde_json::json!([
        {"column": "user_id", "op": ">=", "value": 250},
        {"column": "user_id", "op": "<", "value": 260},
    ]));
    assert_eq!(planned(&ids).await, 1);
    let offsets = bound(serde_json::json!([{"column": "__offset", "op": ">=", "value": 300}]));
    assert_eq!(planned(&offsets).await, 1);
    let none = bound(serde_json::json!([{"column": "__bucket", "op": "=", "value": 1}]));
    assert_eq!(planned(&none).await, 0);

    // Reading a bucket's range with the filter: only the matching rows, in offset order, and
    // the holes the filter leaves are not taken for missing history.
    let picked = bound(serde_json::json!([
        {"column": "user_id", "op": "in", "values": [305, 5, 150]},
        {"column": "event", "op": "!=", "value": "e150"},
    ]));
    let batches = lake
        .read_bucket(
            "app",
            "events",
            snapshot,
            &Default::default(),
            0,
            0..400,
            &Arc::new(columns()),
            Some(&LakePrune(&picked)),
        )
        .await
        .unwrap();
    let got: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(got, [5, 305]);
}
