//! Tiering through a node: a table created with `table.datalake.enabled` gets its Iceberg
//! table at once; the lease holder tiers its log rows round after round within the table's
//! freshness, records each snapshot with `CommitLakeSnapshot`, and carries on after a restart.
//! Every row is in the lake once, with the bucket and offset it has in the log.

mod common;
use common::{batch, until_view};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
use futures::TryStreamExt as _;
use mink_node::Filter;
use mink_node::{Node, NodeConfig, TableSpec, WriteTarget};

fn config(dir: &std::path::Path) -> NodeConfig {
    let mut c = NodeConfig::new(
        1,
        &format!("sqlite://{}", dir.join("meta.db").display()),
        dir.join("objects").to_str().unwrap(),
    );
    c.advertised_address = "127.0.0.1:7001".into();
    c.lease_ttl = Duration::from_millis(1000);
    c.engine.flush_delay = Duration::from_millis(5);
    c.leadership_interval = Duration::from_millis(20);
    c
}

/// The test's table `app.clicks` (`user_id`, `event`) with `options`.
fn clicks(options: &[(&str, &str)]) -> TableSpec {
    TableSpec {
        primary_key: vec![],
        database: "app".into(),
        name: "clicks".into(),
        schema: Schema::new(vec![
            Field::new("user_id", DataType::Int64, false),
            Field::new("event", DataType::Utf8, true),
        ]),
        options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        partition_keys: vec![],
        comment: String::new(),
        if_not_exists: false,
    }
}

/// The Int64 column `name` of `b`.
fn int64<'a>(b: &'a RecordBatch, name: &str) -> &'a Int64Array {
    b.column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_primitive::<Int64Type>()
}

/// A batch of rows a read returned, from `offset` in `bucket`.
struct Rows {
    bucket: mink_node::BucketRef,
    offset: u64,
    data: RecordBatch,
}

/// Everything a read of `request` returns (rows only: panics on anything else).
async fn read_rows(node: &Node, request: mink_node::ReadRequest) -> Vec<Rows> {
    read_plan(node, node.plan_read(&request).unwrap()).await
}

/// What a read of `app.<table>` from `source` returns of the rows that meet `filter` (JSON).
async fn read_where(
    node: &Node,
    table: &str,
    source: mink_node::ReadSource,
    filter: serde_json::Value,
) -> Vec<Rows> {
    read_rows(
        node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: table.into(),
            source,
            filter: serde_json::from_value(filter).unwrap(),
            ..Default::default()
        },
    )
    .await
}

/// Everything a read of `plan` returns (rows only: panics on anything else).
async fn read_plan(node: &Node, plan: mink_node::ReadPlan) -> Vec<Rows> {
    let items: Vec<_> = node
        .read_stream(plan, mink_node::ReadOptions::default())
        .try_collect()
        .await
        .unwrap();
    items
        .into_iter()
        .map(|item| match item.data {
            mink_node::ReadData::Rows(data) => Rows {
                bucket: item.bucket,
                offset: item.offset,
                data,
            },
            _ => panic!("rows expected"),
        })
        .collect()
}

/// The offsets a log-only read of one bucket of `app.clicks` returns, from the log's start.
/// Retention goes on meanwhile: a start it passes between the plan and the read is refused
/// (`OffsetOutOfRange` below the new start), and the read is planned again from there.
async fn log_offsets(node: &Node, bucket: u32) -> Vec<u64> {
    for _ in 0..10 {
        let request = mink_node::ReadRequest {
            database: "app".into(),
            table: "clicks".into(),
            bucket: Some(bucket),
            source: mink_node::ReadSource::Log,
            ..Default::default()
        };
        let plan = node.plan_read(&request).unwrap();
        let read: Result<Vec<_>, _> = node
            .read_stream(plan, mink_node::ReadOptions::default())
            .try_collect()
            .await;
        match read {
            Ok(items) => {
                return items
                    .into_iter()
                    .flat_map(|item| match item.data {
                        mink_node::ReadData::Rows(data) => {
                            item.offset..item.offset + data.num_rows() as u64
                        }
                        _ => panic!("rows expected"),
                    })
                    .collect();
            }
            Err(mink_node::NodeError::OffsetOutOfRange { offset, start, .. }) if offset < start => {
            }
            Err(e) => panic!("log read of bucket {bucket}: {e}"),
        }
    }
    panic!("retention passed the log's start between plan and read ten times in a row");
}

/// `(bucket, offset, user_id)` of a scan of `app.clicks` (one bucket or all) from `source`.
async fn read_source(
    node: &Node,
    bucket: Option<u32>,
    source: mink_node::ReadSource,
) -> Vec<(u32, u64, i64)> {
    let items = read_rows(
        node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "clicks".into(),
            bucket,
            source,
            ..Default::default()
        },
    )
    .await;
    let mut rows = Vec::new();
    for item in items {
        let b = item.data;
        let ids = int64(&b, "user_id");
        for (i, id) in ids.values().iter().enumerate() {
            rows.push((item.bucket.bucket, item.offset + i as u64, *id));
        }
    }
    rows
}

/// Rows of `app.clicks` after `score` was added.
fn scored(ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("user_id", DataType::Int64, false),
            Field::new("event", DataType::Utf8, true),
            Field::new("score", DataType::Float64, true),
        ])),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(
                ids.clone().map(|i| format!("e{i}")),
            )),
            Arc::new(arrow::array::Float64Array::from_iter_values(
                ids.map(|i| i as f64 / 2.0),
            )),
        ],
    )
    .unwrap()
}

async fn write(node: &Node, ids: std::ops::Range<i64>) {
    write_rows(node, "clicks", &batch(ids)).await;
}

/// Writes `rows` to `app.<table>`; panics unless every bucket took its part.
async fn write_rows(node: &Node, table: &str, rows: &RecordBatch) {
    write_to(node, table, rows, &WriteTarget::default()).await;
}

/// [`write_rows`] to `target`.
async fn write_to(node: &Node, table: &str, rows: &RecordBatch, target: &WriteTarget) {
    let writes = node.write("app", table, rows, target).await.unwrap();
    assert!(writes.iter().all(|w| w.result.is_ok()), "{writes:?}");
}

/// Rows of `app.clicks` to bucket 0, their batch's time `timestamp_ms`.
async fn write_at(node: &Node, ids: std::ops::Range<i64>, timestamp_ms: i64) {
    let target = WriteTarget {
        bucket: Some(0),
        timestamp_ms: Some(timestamp_ms),
        ..WriteTarget::default()
    };
    write_to(node, "clicks", &batch(ids), &target).await;
}

/// Waits until the metadata records `rows` tiered rows of `app.clicks`.
async fn until_tiered(node: &Node, rows: u64) {
    until_table_tiered(node, "clicks", rows).await;
}

/// Waits until the metadata records `rows` tiered rows of `app.<table>` (sum of the tiered
/// offsets; the buckets start at 0).
async fn until_table_tiered(node: &Node, table: &str, rows: u64) {
    until_view(node, &format!("{rows} tiered rows of {table}"), |view| {
        let t = view
            .state
            .tables
            .values()
            .find(|t| t.name == table)
            .unwrap();
        let tiered: u64 = view
            .state
            .lake_snapshots
            .get(&t.table_id)
            .map_or(0, |r| r.bucket_offsets.iter().map(|b| b.offset).sum());
        if tiered == rows { Ok(()) } else { Err(tiered) }
    })
    .await;
}

/// `duty` (a tiering round, lake maintenance) done now, on this node once it holds the
/// coordinator's lease (a node takes it a moment after it starts): retried while it answers
/// `Unavailable`, for 30 s at most.
async fn on_lease_holder<T>(
    node: &Node,
    what: &str,
    mut duty: impl AsyncFnMut() -> mink_node::NodeResult<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match duty().await {
            Err(mink_node::NodeError::Unavailable(m)) => {
                assert!(tokio::time::Instant::now() < deadline, "{what}: {m}");
                let next = node.view().applied_index + 1;
                let _ = node.wait_applied(next, Duration::from_millis(100)).await;
            }
            done => return done.unwrap(),
        }
    }
}

/// A tiering round of `app.<table>` now: whether it recorded a snapshot.
async fn tier(node: &Node, table: &str) -> bool {
    on_lease_holder(node, "tiering", async || node.tier_now("app", table).await).await
}

/// Lake maintenance of `app.<table>` now.
async fn maintain(node: &Node, table: &str) -> mink_lake::maintain::Maintained {
    on_lease_holder(node, "lake maintenance", async || {
        node.maintain_lake_now("app", table).await
    })
    .await
}

/// A node (retention every 100 ms) with `app.clicks` in two buckets, its log kept 1 s and
/// tiered every half second.
async fn short_lived_clicks(dir: &std::path::Path) -> Node {
    let mut c = config(dir);
    c.retention_interval = Duration::from_millis(100);
    let node = Node::start(c).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(clicks(&[
        ("bucket.num", "2"),
        ("bucket.key", "user_id"),
        ("table.log.ttl", "1s"),
        ("table.datalake.enabled", "true"),
        ("table.datalake.freshness", "1s"),
    ]))
    .await
    .unwrap();
    node
}

/// Waits until retention has trimmed every bucket of `app.<table>` (in whole objects older
/// than the TTL).
async fn until_trimmed(node: &Node, table: &str) {
    until_view(
        node,
        &format!("retention trimming every bucket of {table}"),
        |_| {
            let info = node.describe_table("app", table).unwrap();
            if info.buckets.iter().all(|b| b.start_offset > 0) {
                Ok(())
            } else {
                Err(info.buckets)
            }
        },
    )
    .await;
}

/// `(user_id, bucket, offset)` of every lake row, sorted by user id.
async fn lake_rows(node: &Node) -> Vec<(i64, i32, i64)> {
    let batches = node
        .lake()
        .await
        .unwrap()
        .scan("app", "clicks")
        .await
        .unwrap();
    let mut rows = Vec::new();
    for b in batches {
        let id = int64(&b, "user_id");
        let bucket = b
            .column_by_name("__bucket")
            .unwrap()
            .as_primitive::<Int32Type>();
        let offset = int64(&b, "__offset");
        for i in 0..b.num_rows() {
            rows.push((id.value(i), bucket.value(i), offset.value(i)));
        }
    }
    rows.sort_unstable();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_holder_tiers_a_lake_table_round_after_round() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(clicks(&[
        ("bucket.num", "2"),
        ("bucket.key", "user_id"),
        ("table.datalake.enabled", "true"),
        ("table.datalake.freshness", "1s"),
    ]))
    .await
    .unwrap();
    // The Iceberg table exists before any row.
    assert!(lake_rows(&node).await.is_empty());

    write(&node, 0..100).await;
    until_tiered(&node, 100).await;
    let rows = lake_rows(&node).await;
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..100).collect::<Vec<_>>(),
        "every row once"
    );
    // Each row at its log position: per bucket, offsets 0.. without a gap.
    let mut per_bucket: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (_, b, o) in &rows {
        per_bucket.entry(*b).or_default().push(*o);
    }
    for offsets in per_bucket.values_mut() {
        offsets.sort_unstable();
        assert_eq!(*offsets, (0..offsets.len() as i64).collect::<Vec<_>>());
    }

    // The table's description shows how far each bucket is tiered.
    let info = node.describe_table("app", "clicks").unwrap();
    assert!(
        info.buckets
            .iter()
            .all(|b| b.tiered_offset == Some(b.end_offset)),
        "{:?}",
        info.buckets
    );

    write(&node, 100..150).await;
    until_tiered(&node, 150).await;
    assert_eq!(lake_rows(&node).await.len(), 150);

    // A column added to the table is added to the lake: older rows read it as null.
    node.alter_table(
        "app",
        "clicks",
        mink_node::TableChange {
            schema: Some(scored(0..0).schema().as_ref().clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Before any row has the column, the lake's last snapshot (written under the older schema)
    // still reads, the column null; it failed with "Column score not found" until new rows
    // were tiered.
    let lake = read_rows(
        &node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "clicks".into(),
            source: mink_node::ReadSource::Lake,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(lake.iter().map(|r| r.data.num_rows()).sum::<usize>(), 150);
    assert!(
        lake.iter()
            .all(|r| r.data.column_by_name("score").unwrap().null_count() == r.data.num_rows())
    );
    let rows = scored(150..155);
    write_rows(&node, "clicks", &rows).await;
    until_tiered(&node, 155).await;
    let batches = node
        .lake()
        .await
        .unwrap()
        .scan("app", "clicks")
        .await
        .unwrap();
    let mut scores: Vec<(i64, Option<f64>)> = Vec::new();
    for b in &batches {
        let id = int64(b, "user_id");
        let score = b
            .column_by_name("score")
            .unwrap()
            .as_primitive::<arrow::datatypes::Float64Type>();
        for i in 0..b.num_rows() {
            scores.push((id.value(i), score.is_valid(i).then(|| score.value(i))));
        }
    }
    scores.sort_by_key(|s| s.0);
    assert_eq!(scores.len(), 155);
    assert!(scores[..150].iter().all(|s| s.1.is_none()));
    assert_eq!(scores[150], (150, Some(75.0)));

    // After a restart the new lease holder carries on from the recorded offsets.
    node.shutdown().await;
    let node = Node::start(config(dir.path())).await.unwrap();
    write_rows(&node, "clicks", &scored(155..160)).await;
    until_tiered(&node, 160).await;
    assert_eq!(
        lake_rows(&node)
            .await
            .iter()
            .map(|r| r.0)
            .collect::<Vec<_>>(),
        (0..160).collect::<Vec<_>>()
    );
    node.shutdown().await;
}

/// A node with `app.clicks` tiered into the lake, its freshness an hour: no round during a
/// test but the first and those it asks for (`tier_now`).
async fn rarely_tiered_clicks(dir: &std::path::Path) -> Node {
    let node = Node::start(config(dir)).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(clicks(&[
        ("table.datalake.enabled", "true"),
        ("table.datalake.freshness", "1h"),
    ]))
    .await
    .unwrap();
    node
}

/// A round that committed to Iceberg but crashed before `CommitLakeSnapshot`: the next round
/// reads the lake's summary, stores none of those rows again, and records the offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_lost_before_the_metadata_record_rolls_forward() {
    let dir = tempfile::tempdir().unwrap();
    let node = rarely_tiered_clicks(dir.path()).await;
    write(&node, 0..40).await;
    until_tiered(&node, 40).await;
    write(&node, 40..70).await;
    // The crashed round: rows 40..70 committed to Iceberg by a worker that died before it
    // recorded them in the metadata log.
    let mut batches = Vec::new();
    let mut offset = 40;
    while offset < 70 {
        let step = node
            .read_bucket(
                &mink_node::BucketRef::new("app", "clicks", None, 0),
                offset,
                1 << 20,
                &[],
            )
            .await
            .unwrap();
        offset = step.last().unwrap().end_offset;
        batches.extend(step.into_iter().map(|rb| mink_lake::tier::LogRows {
            base_offset: rb.base_offset,
            timestamp_us: 0,
            rows: rb.batch,
        }));
    }
    let lake = node.lake().await.unwrap();
    lake.tier(
        "app",
        "clicks",
        vec![mink_lake::tier::BucketRound {
            partition_id: 0,
            bucket: 0,
            start_offset: 40,
            end_offset: 70,
            batches,
        }],
    )
    .await
    .unwrap();
    // The metadata still says 40; a round plans from there and stores nothing twice.
    write(&node, 70..75).await;
    assert!(tier(&node, "clicks").await);
    until_tiered(&node, 75).await;
    assert_eq!(
        lake_rows(&node)
            .await
            .iter()
            .map(|r| r.0)
            .collect::<Vec<_>>(),
        (0..75).collect::<Vec<_>>()
    );
    assert!(matches!(
        node.tier_now("app", "nope").await,
        Err(mink_node::NodeError::TableNotFound { .. })
    ));
    node.shutdown().await;
}

/// A lake row's `__timestamp` is its stored batch's time: the time a writer gave it (a Kafka
/// producer's record times), else the leader's clock at append; never the round's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lake_rows_keep_the_time_of_their_batch() {
    let dir = tempfile::tempdir().unwrap();
    let node = rarely_tiered_clicks(dir.path()).await;
    let given = 1_600_000_000_000i64;
    write_at(&node, 0..3, given).await;
    let before = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    write(&node, 3..5).await;
    let stored = node
        .read_bucket(
            &mink_node::BucketRef::new("app", "clicks", None, 0),
            0,
            1 << 20,
            &[],
        )
        .await
        .unwrap();
    let times: Vec<i64> = stored.iter().map(|r| r.timestamp_ms).collect();
    assert_eq!(times.len(), 2, "two stored batches");
    assert_eq!(times[0], given);
    assert!(
        times[1] >= before,
        "stamped at append: {times:?}, before {before}"
    );
    assert!(tier(&node, "clicks").await);
    until_tiered(&node, 5).await;
    let mut lake = Vec::new();
    for b in node
        .lake()
        .await
        .unwrap()
        .scan("app", "clicks")
        .await
        .unwrap()
    {
        let ids = int64(&b, "user_id");
        let at = b
            .column_by_name("__timestamp")
            .unwrap()
            .as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        for i in 0..b.num_rows() {
            lake.push((ids.value(i), at.value(i)));
        }
    }
    lake.sort_unstable();
    let expected: Vec<(i64, i64)> = (0..5)
        .map(|id| (id, if id < 3 { times[0] } else { times[1] } * 1000))
        .collect();
    assert_eq!(lake, expected);

    // A log tail past the lake: 5..8 at another given time, 8..10 stamped at append.
    let given_later = given + 100_000_000;
    write_at(&node, 5..8, given_later).await;
    write(&node, 8..10).await;
    // `__timestamp` ranges over the union read: the lake filters its rows by their column,
    // the log its stored batches by their time (from the time index for a lower bound).
    let ids_from = |source: mink_node::ReadSource, filter: serde_json::Value| {
        let node = node.clone();
        async move {
            let items = read_where(&node, "clicks", source, filter).await;
            let mut ids: Vec<i64> = items
                .iter()
                .flat_map(|r| int64(&r.data, "user_id").values().to_vec())
                .collect();
            ids.sort_unstable();
            ids
        }
    };
    let ids = |filter| ids_from(mink_node::ReadSource::Union, filter);
    let us = |ms: i64| ms * 1000;
    assert_eq!(
        ids(serde_json::json!([{"column": "__timestamp", "op": "<", "value": us(given_later)}]))
            .await,
        [0, 1, 2]
    );
    assert_eq!(
        ids(serde_json::json!([
            {"column": "__timestamp", "op": ">=", "value": us(given)},
            {"column": "__timestamp", "op": "<=", "value": us(given_later)}
        ]))
        .await,
        [0, 1, 2, 5, 6, 7]
    );
    assert_eq!(
        ids(serde_json::json!([{"column": "__timestamp", "op": ">=", "value": us(before)}])).await,
        [3, 4, 8, 9]
    );
    assert_eq!(
        ids(serde_json::json!([
            {"column": "__timestamp", "op": ">", "value": "2100-01-01T00:00:00Z"}
        ]))
        .await,
        Vec::<i64>::new()
    );
    // The lake's side alone (a union read takes the log wherever the log still has the rows).
    let lake = mink_node::ReadSource::Lake;
    assert_eq!(
        ids_from(
            lake,
            serde_json::json!([{"column": "__timestamp", "op": "<", "value": us(before)}])
        )
        .await,
        [0, 1, 2]
    );
    assert_eq!(
        ids_from(
            lake,
            serde_json::json!([{"column": "__timestamp", "op": ">=", "value": us(before)}])
        )
        .await,
        [3, 4]
    );
    // The system columns are columns a read can ask for, from the lake and the log alike.
    let mut rows = system_columns(&node, mink_node::ReadSource::Union).await;
    rows.extend(system_columns(&node, lake).await);
    rows.sort_unstable();
    let time_of = |id: i64| match id {
        0..3 => times[0],
        3..5 => times[1],
        5..8 => given_later,
        _ => -1,
    };
    assert_eq!(rows.len(), 9 + 5, "{rows:?}");
    for (id, offset, bucket, at) in rows {
        assert_eq!((offset, bucket), (id, 0), "row {id}");
        if id < 8 {
            assert_eq!(at, time_of(id) * 1000, "row {id}");
        } else {
            assert!(at >= before * 1000, "row {id}: {at}");
        }
    }
    node.shutdown().await;
}

/// `(user_id, __offset, __bucket, __timestamp)` of the rows of `app.clicks` but user 6 from
/// `source`, asked for in another order.
async fn system_columns(node: &Node, source: mink_node::ReadSource) -> Vec<(i64, i64, i32, i64)> {
    let items = read_rows(
        node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "clicks".into(),
            source,
            columns: ["__timestamp", "user_id", "__offset", "__bucket"]
                .map(String::from)
                .to_vec(),
            filter: serde_json::from_value(
                serde_json::json!([{"column": "user_id", "op": "!=", "value": 6}]),
            )
            .unwrap(),
            ..Default::default()
        },
    )
    .await;
    let mut rows = Vec::new();
    for r in &items {
        let b = &r.data;
        assert_eq!(
            b.schema()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>(),
            ["__timestamp", "user_id", "__offset", "__bucket"]
        );
        let at = b
            .column(0)
            .as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        let offsets = int64(b, "__offset");
        let buckets = b.column(3).as_primitive::<Int32Type>();
        for i in 0..b.num_rows() {
            rows.push((
                int64(b, "user_id").value(i),
                offsets.value(i),
                buckets.value(i),
                at.value(i),
            ));
        }
    }
    rows
}

/// A partitioned table's lake is partitioned the same way: each partition's buckets are
/// tiered, into that partition's files.
/// `(partition, bucket) -> [(offset, user_id)]` of a scan of `app.<table>` from `source`.
async fn read_partitions(
    node: &Node,
    table: &str,
    source: mink_node::ReadSource,
) -> BTreeMap<(String, u32), Vec<(u64, i64)>> {
    let items = read_rows(
        node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: table.into(),
            source,
            ..Default::default()
        },
    )
    .await;
    let mut rows: BTreeMap<(String, u32), Vec<(u64, i64)>> = BTreeMap::new();
    for item in items {
        let b = item.data;
        let ids = int64(&b, "user_id");
        let at = (item.bucket.partition.clone().unwrap(), item.bucket.bucket);
        for (i, id) in ids.values().iter().enumerate() {
            rows.entry(at.clone())
                .or_default()
                .push((item.offset + i as u64, *id));
        }
    }
    rows
}

/// A partitioned table (a string and an integer partition key) is tiered into its Iceberg
/// partitions; once retention trims its log, the union read takes each partition's history
/// from that partition's lake files: every row once, at its offset; the lake-only read of a
/// bucket is `[0, tiered offset)` of its partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_is_tiered_and_read_back_by_partition() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.retention_interval = Duration::from_millis(100);
    let node = Node::start(c).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let mut spec = clicks(&[
        ("bucket.num", "2"),
        ("bucket.key", "user_id"),
        ("table.log.ttl", "1s"),
        ("table.datalake.enabled", "true"),
        ("table.datalake.freshness", "1s"),
    ]);
    spec.name = "visits".into();
    spec.schema = Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("day", DataType::Utf8, false),
        Field::new("shard", DataType::Int32, false),
    ]);
    spec.partition_keys = vec!["day".into(), "shard".into()];
    node.create_table(spec).await.unwrap();
    let days = ["2026-12-01", "2026-12-02"];
    let rows = |ids: std::ops::Range<i64>| {
        RecordBatch::try_from_iter(vec![
            (
                "user_id",
                Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef,
            ),
            (
                "day",
                Arc::new(StringArray::from_iter_values(
                    ids.clone().map(|i| days[(i % 2) as usize]),
                )) as ArrayRef,
            ),
            (
                "shard",
                Arc::new(arrow::array::Int32Array::from_iter_values(
                    ids.map(|i| (i % 3) as i32),
                )) as ArrayRef,
            ),
        ])
        .unwrap()
    };
    write_rows(&node, "visits", &rows(0..60)).await;
    // Twelve buckets (two in each of six partitions) tiered to their ends.
    until_table_tiered(&node, "visits", 60).await;
    let batches = node
        .lake()
        .await
        .unwrap()
        .scan("app", "visits")
        .await
        .unwrap();
    let mut seen: Vec<(String, i64)> = Vec::new();
    for b in &batches {
        let day = b.column_by_name("day").unwrap().as_string::<i32>();
        let id = int64(b, "user_id");
        for i in 0..b.num_rows() {
            seen.push((day.value(i).to_string(), id.value(i)));
        }
    }
    seen.sort_unstable();
    let mut want: Vec<(String, i64)> = (0..60usize)
        .map(|i| (days[i % 2].to_string(), i64::try_from(i).unwrap()))
        .collect();
    want.sort_unstable();
    assert_eq!(seen, want);
    for day in days {
        let data = dir
            .path()
            .join(format!("objects/lake/app/visits/data/day={day}"));
        assert!(
            std::fs::read_dir(&data).is_ok_and(|mut d| d.next().is_some()),
            "no data files in {}",
            data.display()
        );
    }

    until_trimmed(&node, "visits").await;
    write_rows(&node, "visits", &rows(60..72)).await;
    let union = read_partitions(&node, "visits", mink_node::ReadSource::Union).await;
    let mut ids = Vec::new();
    for ((partition, bucket), rows) in &union {
        let offsets: Vec<u64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(
            offsets,
            (0..rows.len() as u64).collect::<Vec<_>>(),
            "partition {partition} bucket {bucket}"
        );
        for &(_, id) in rows {
            let (day, shard) = partition.split_once('$').unwrap();
            assert_eq!(
                (day, shard.parse::<i64>().unwrap()),
                (days[(id % 2) as usize], id % 3),
                "row {id} read from partition {partition}"
            );
            ids.push(id);
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..72).collect::<Vec<_>>(), "every row once");
    // Once the last rows are tiered too, nothing moves: the lake read and the description
    // see the same tiered offsets.
    until_table_tiered(&node, "visits", 72).await;
    let lake = read_partitions(&node, "visits", mink_node::ReadSource::Lake).await;
    let info = node.describe_table("app", "visits").unwrap();
    let mut tiered = 0;
    for b in &info.buckets {
        let at = (b.partition.clone().unwrap(), b.bucket);
        let offsets: Vec<u64> = lake
            .get(&at)
            .map_or(vec![], |r| r.iter().map(|r| r.0).collect());
        assert_eq!(
            offsets,
            (0..b.tiered_offset.unwrap()).collect::<Vec<_>>(),
            "{at:?}"
        );
        tiered += offsets.len();
    }
    assert_eq!(tiered, 72);
    // A filter on the partition keys (typed: `shard` is an integer) plans only the
    // partitions it allows, and reads their history from the lake.
    let request = mink_node::ReadRequest {
        database: "app".into(),
        table: "visits".into(),
        filter: serde_json::from_value(serde_json::json!([
            {"column": "day", "op": "=", "value": "2026-12-02"},
            {"column": "shard", "op": ">=", "value": 1},
            {"column": "__bucket", "op": "=", "value": 1},
        ]))
        .unwrap(),
        ..Default::default()
    };
    let plan = node.plan_read(&request).unwrap();
    let planned: Vec<(String, u32)> = plan
        .buckets
        .iter()
        .map(|b| (b.bucket.partition.clone().unwrap(), b.bucket.bucket))
        .collect();
    assert_eq!(
        planned,
        [
            ("2026-12-02$1".to_string(), 1),
            ("2026-12-02$2".to_string(), 1)
        ]
    );
    let mut got: Vec<i64> = read_plan(&node, plan)
        .await
        .iter()
        .flat_map(|r| int64(&r.data, "user_id").values().to_vec())
        .collect();
    got.sort_unstable();
    let mut want: Vec<i64> = union
        .iter()
        .filter(|((p, b), _)| *b == 1 && (p == "2026-12-02$1" || p == "2026-12-02$2"))
        .flat_map(|(_, rows)| rows.iter().map(|r| r.1))
        .collect();
    want.sort_unstable();
    assert!(!want.is_empty());
    assert_eq!(got, want);
    node.shutdown().await;
}

/// History older than `table.log.ttl` stays readable through the lake: once retention has
/// trimmed the log below the tiered offset, a scan of the table (and of a bucket from offset
/// 0) reads the lake's rows below the log's start and the log above, every row once, each at
/// its offset. The one-step bucket read (a Kafka fetch) still reads the log only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_past_the_log_ttl_is_read_from_the_lake() {
    let dir = tempfile::tempdir().unwrap();
    let node = short_lived_clicks(dir.path()).await;
    for chunk in 0..5 {
        write(&node, chunk * 20..chunk * 20 + 20).await;
    }
    until_tiered(&node, 100).await;
    // Retention trims every bucket's log (in whole objects older than the TTL).
    until_trimmed(&node, "clicks").await;
    // Scans (and Flight's endpoints) start at offset 0, below the log's start.
    let info = node.describe_table("app", "clicks").unwrap();
    assert!(
        info.buckets.iter().all(|b| b.readable_offset == 0),
        "{:?}",
        info.buckets
    );
    write(&node, 100..110).await;
    let read = |bucket: Option<u32>| read_source(&node, bucket, mink_node::ReadSource::Union);
    let read_source = |bucket: Option<u32>, source| read_source(&node, bucket, source);
    let all = read(None).await;
    let mut ids: Vec<i64> = all.iter().map(|r| r.2).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..110).collect::<Vec<_>>(), "every row once");
    for bucket in 0..2 {
        let rows = read(Some(bucket)).await;
        let offsets: Vec<u64> = rows.iter().map(|r| r.1).collect();
        assert_eq!(
            offsets,
            (0..rows.len() as u64).collect::<Vec<_>>(),
            "bucket {bucket}"
        );
    }
    // One side only: the lake's rows are [0, tiered offset), the log's [start, end). Tiering
    // and retention go on meanwhile, so each read is checked against the bounds around it.
    let info = node.describe_table("app", "clicks").unwrap();
    for b in &info.buckets {
        let lake: Vec<u64> = read_source(Some(b.bucket), mink_node::ReadSource::Lake)
            .await
            .iter()
            .map(|r| r.1)
            .collect();
        assert_eq!(lake, (0..lake.len() as u64).collect::<Vec<_>>());
        assert!(
            lake.len() as u64 >= b.tiered_offset.unwrap(),
            "{lake:?} {b:?}"
        );
        let log = log_offsets(&node, b.bucket).await;
        let first = log.first().copied().unwrap_or(b.end_offset);
        assert!(first >= b.start_offset, "{log:?} {b:?}");
        assert_eq!(log, (first..b.end_offset).collect::<Vec<_>>());
    }
    let lake = info.lake.unwrap();
    assert!(
        lake.snapshot_id.is_some() && lake.committed_at_ms.is_some(),
        "{lake:?}"
    );
    // A lake read of a table without a lake is refused.
    node.create_table(TableSpec {
        name: "plain".into(),
        ..clicks(&[])
    })
    .await
    .unwrap();
    let refused = node.plan_read(&mink_node::ReadRequest {
        database: "app".into(),
        table: "plain".into(),
        source: mink_node::ReadSource::Lake,
        ..Default::default()
    });
    assert!(
        matches!(&refused, Err(mink_node::NodeError::Invalid(m)) if m.contains("not tiered into the lake")),
        "{refused:?}"
    );
    // The one-step read is the log's: below its start is out of range.
    let below = node
        .read_bucket(
            &mink_node::BucketRef::new("app", "clicks", None, 0),
            0,
            1 << 20,
            &[],
        )
        .await;
    assert!(
        matches!(
            below,
            Err(mink_node::NodeError::OffsetOutOfRange { offset: 0, .. })
        ),
        "{below:?}"
    );
    node.shutdown().await;
}

/// Maintenance on the lease holder: ten rounds of small files are compacted into one; the
/// compacted snapshot is recorded without moving the lake's commit time (no offset advanced);
/// the union read (history past the TTL from the lake) returns every row once, in offset
/// order, before and after; tiering goes on on top of the compacted table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_keeps_the_union_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let node = short_lived_clicks(dir.path()).await;
    for chunk in 0..10 {
        write(&node, chunk * 10..chunk * 10 + 10).await;
        until_tiered(&node, (chunk as u64 + 1) * 10).await;
    }
    let union_ids = || async {
        let rows = read_source(&node, None, mink_node::ReadSource::Union).await;
        let mut per_bucket: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for r in &rows {
            per_bucket.entry(r.0).or_default().push(r.1);
        }
        for (bucket, offsets) in per_bucket {
            assert_eq!(
                offsets,
                (0..offsets.len() as u64).collect::<Vec<_>>(),
                "bucket {bucket}"
            );
        }
        let mut ids: Vec<i64> = rows.iter().map(|r| r.2).collect();
        ids.sort_unstable();
        ids
    };
    assert_eq!(union_ids().await, (0..100).collect::<Vec<_>>());
    let before = node.describe_table("app", "clicks").unwrap().lake.unwrap();

    let done = maintain(&node, "clicks").await;
    let compacted = done.compacted.expect("ten rounds of small files");
    assert!(compacted.files_removed >= 8, "{compacted:?}");
    let after = node.describe_table("app", "clicks").unwrap().lake.unwrap();
    assert_eq!(after.snapshot_id, Some(compacted.snapshot_id));
    assert_eq!(after.committed_at_ms, before.committed_at_ms);
    // The history the union read takes from the (compacted) lake: below the trimmed log.
    until_trimmed(&node, "clicks").await;
    assert_eq!(union_ids().await, (0..100).collect::<Vec<_>>());
    let mut lake: Vec<i64> = lake_rows(&node).await.iter().map(|r| r.0).collect();
    lake.sort_unstable();
    assert_eq!(lake, (0..100).collect::<Vec<_>>());

    write(&node, 100..120).await;
    until_tiered(&node, 120).await;
    assert_eq!(union_ids().await, (0..120).collect::<Vec<_>>());
    node.shutdown().await;
}

/// The lake enabled on a primary-key table whose changelog was trimmed: its first round is
/// each bucket's latest KV snapshot, later rounds the changelog after it, and the lake and
/// the union read hold the table's current rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lake_of_a_primary_key_table_can_be_enabled_later() {
    let dir = tempfile::tempdir().unwrap();
    let node = trimming_node(dir.path()).await;
    let mut spec = users();
    spec.options.clear();
    spec.options.insert("bucket.num".into(), "4".into());
    spec.options.insert("table.log.ttl".into(), "1s".into());
    node.create_table(spec).await.unwrap();
    let first: Vec<(i64, Option<&str>)> = (0..60).map(|id| (id, Some("a"))).collect();
    change_users(&node, &first).await;
    let second: Vec<(i64, Option<&str>)> = (0..60)
        .filter(|id| id % 4 != 0)
        .map(|id| (id, (id % 4 != 1).then_some("b")))
        .collect();
    change_users(&node, &second).await;
    // Every bucket's changelog trimmed: its first changes are gone from the log.
    until_trimmed(&node, "users").await;

    node.alter_table(
        "app",
        "users",
        mink_node::TableChange {
            set_options: [
                ("table.datalake.enabled".to_string(), "true".to_string()),
                ("table.datalake.freshness".to_string(), "1h".to_string()),
            ]
            .into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(tier(&node, "users").await);
    // The key is the Iceberg schema's identifier field, as upserting engines read it.
    let lake_table = node
        .lake()
        .await
        .unwrap()
        .load_table("app", "users")
        .await
        .unwrap();
    let lake_schema = lake_table.metadata().current_schema();
    assert_eq!(
        lake_schema.identifier_field_ids().collect::<Vec<_>>(),
        [lake_schema.field_by_name("id").unwrap().id]
    );
    let want = kv_state(&node).await;
    assert_eq!(want.len(), 45);
    assert_eq!(users_from(&node, mink_node::ReadSource::Lake).await, want);

    // Later changes come from the changelog after the snapshot.
    change_users(&node, &[(0, None), (1, Some("c")), (100, Some("d"))]).await;
    assert!(tier(&node, "users").await);
    let want = kv_state(&node).await;
    assert_eq!(users_from(&node, mink_node::ReadSource::Lake).await, want);
    assert_eq!(users_from(&node, mink_node::ReadSource::Union).await, want);
    node.shutdown().await;
}

/// Lake maintenance follows the table's options: compaction once a partition has the set
/// number of small files, none when switched off; snapshot expiry only when switched on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_follows_the_tables_options() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(clicks(&[
        ("table.datalake.enabled", "true"),
        ("table.datalake.freshness", "1h"),
        ("table.datalake.compaction.min-files", "3"),
        ("table.datalake.auto-expire-snapshot", "false"),
        // Every earlier snapshot would go, were expiry on.
        ("table.datalake.snapshot.retention", "1ms"),
    ]))
    .await
    .unwrap();
    let mut next = 0;
    let mut rounds = async |n: i64| {
        for _ in 0..n {
            write(&node, next..next + 10).await;
            next += 10;
            assert!(tier(&node, "clicks").await);
        }
    };
    rounds(2).await;
    let done = maintain(&node, "clicks").await;
    assert!(
        done.compacted.is_none(),
        "two small files, three wanted: {done:?}"
    );
    rounds(1).await;
    let done = maintain(&node, "clicks").await;
    assert_eq!(
        done.compacted.as_ref().map(|c| c.files_removed),
        Some(3),
        "{done:?}"
    );
    assert!(done.snapshots_expired.is_empty(), "expiry is off: {done:?}");

    let set = |options: &[(&str, &str)]| mink_node::TableChange {
        set_options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    node.alter_table(
        "app",
        "clicks",
        set(&[
            ("table.datalake.auto-compaction", "false"),
            ("table.datalake.auto-expire-snapshot", "true"),
        ]),
    )
    .await
    .unwrap();
    rounds(4).await;
    let done = maintain(&node, "clicks").await;
    assert!(done.compacted.is_none(), "compaction is off: {done:?}");
    assert!(!done.snapshots_expired.is_empty(), "expiry is on: {done:?}");
    let e = node
        .alter_table(
            "app",
            "clicks",
            set(&[("table.datalake.compaction.min-files", "1")]),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("table.datalake.compaction.min-files"), "{e}");

    let mut ids: Vec<i64> = read_source(&node, None, mink_node::ReadSource::Lake)
        .await
        .iter()
        .map(|r| r.2)
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..70).collect::<Vec<_>>());
    node.shutdown().await;
}

/// `app.users` (`id` key, `name`), four buckets, tiered every half second.
fn users() -> TableSpec {
    TableSpec {
        primary_key: vec!["id".into()],
        name: "users".into(),
        schema: Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]),
        ..clicks(&[
            ("bucket.num", "4"),
            ("table.datalake.enabled", "true"),
            ("table.datalake.freshness", "1s"),
        ])
    }
}

/// [`users`] tiered when the test says so (`tier_now`), not on a schedule.
fn users_on_demand() -> TableSpec {
    let mut spec = users();
    spec.options
        .insert("table.datalake.freshness".into(), "1h".into());
    spec
}

/// Upserts (`Some(name)`) and deletes (`None`) to `app.users`.
async fn change_users(node: &Node, rows: &[(i64, Option<&str>)]) {
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as ArrayRef,
        ),
        (
            "name",
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| Some(r.1.unwrap_or("-"))),
            )) as ArrayRef,
        ),
        (
            mink_node::ROW_KIND,
            Arc::new(StringArray::from_iter_values(
                rows.iter()
                    .map(|r| if r.1.is_some() { "upsert" } else { "delete" }),
            )) as ArrayRef,
        ),
    ])
    .unwrap();
    write_rows(node, "users", &batch).await;
}

/// `id -> name` of a table's rows in `batches`.
fn names(batches: &[RecordBatch]) -> BTreeMap<i64, String> {
    let mut rows = BTreeMap::new();
    for b in batches {
        let id = int64(b, "id");
        let name = b.column_by_name("name").unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            assert!(
                rows.insert(id.value(i), name.value(i).to_string())
                    .is_none(),
                "key {} twice",
                id.value(i)
            );
        }
    }
    rows
}

/// The current rows of `app.users` (the KV snapshot scan).
async fn kv_state(node: &Node) -> BTreeMap<i64, String> {
    users_from(node, mink_node::ReadSource::Auto).await
}

/// The rows of `app.users` read from `source`, by key.
async fn users_from(node: &Node, source: mink_node::ReadSource) -> BTreeMap<i64, String> {
    let items = read_rows(
        node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "users".into(),
            source,
            ..Default::default()
        },
    )
    .await;
    let batches: Vec<RecordBatch> = items.into_iter().map(|item| item.data).collect();
    names(&batches)
}

/// A primary-key table in the lake: after rounds of upserts and deletes, and after the
/// maintenance that folds the deletes into the data, the lake holds exactly the table's
/// current rows (its KV snapshot scan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_table_is_tiered_as_its_current_rows() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(users()).await.unwrap();
    let first: Vec<(i64, Option<&str>)> = (0..40).map(|i| (i, Some("a"))).collect();
    change_users(&node, &first).await;
    until_lake_holds_users(&node).await;
    let mut second: Vec<(i64, Option<&str>)> = (0..10).map(|i| (i, Some("b"))).collect();
    second.extend((10..20).map(|i| (i, None)));
    second.extend((40..45).map(|i| (i, Some("new"))));
    change_users(&node, &second).await;
    until_lake_holds_users(&node).await;
    change_users(&node, &[(10, Some("back")), (0, None), (1, Some("c"))]).await;
    until_lake_holds_users(&node).await;
    let want = kv_state(&node).await;
    assert_eq!(want.len(), 45 - 10 + 1 - 1);

    let done = maintain(&node, "users").await;
    assert!(done.compacted.is_some(), "{done:?}");
    assert_eq!(lake_users(&node).await, want);
    change_users(&node, &[(2, Some("after")), (3, None)]).await;
    until_lake_holds_users(&node).await;

    // The rounds' key index is kept on disk: after a restart a round reads the key columns of
    // its own data file only, not the table's (no compaction in between).
    node.alter_table(
        "app",
        "users",
        mink_node::TableChange {
            set_options: [(
                "table.datalake.auto-compaction".to_string(),
                "false".to_string(),
            )]
            .into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let kv_dir = config(dir.path()).kv_dir;
    let indexes = std::fs::read_dir(kv_dir.join("lake-keys")).unwrap().count();
    assert_eq!(indexes, 1, "one key index, for app.users");
    node.shutdown().await;
    drop(node);
    let node = Node::start(config(dir.path())).await.unwrap();
    change_users(&node, &[(4, Some("restarted")), (5, Some("restarted"))]).await;
    until_lake_holds_users(&node).await;
    assert_eq!(node.lake().await.unwrap().key_files_read(), 1);
    node.shutdown().await;
}

/// The rows of `app.users`'s lake table, by name.
async fn lake_users(node: &Node) -> BTreeMap<i64, String> {
    names(
        &node
            .lake()
            .await
            .unwrap()
            .scan("app", "users")
            .await
            .unwrap(),
    )
}

/// Waits until `app.users` is tiered to its log's end, then checks the lake holds exactly
/// the table's current rows.
async fn until_lake_holds_users(node: &Node) {
    let want = kv_state(node).await;
    until_view(node, "the lake to hold the table's current rows", |view| {
        let t = view
            .state
            .tables
            .values()
            .find(|t| t.name == "users")
            .unwrap();
        let tiered: u64 = view
            .state
            .lake_snapshots
            .get(&t.table_id)
            .map_or(0, |r| r.bucket_offsets.iter().map(|b| b.offset).sum());
        let end: u64 = view
            .state
            .buckets
            .values()
            .filter(|b| b.table_id == t.table_id)
            .filter_map(|b| view.state.streams.get(&b.stream_id))
            .map(|s| s.end_offset)
            .sum();
        if tiered == end {
            Ok(())
        } else {
            Err((tiered, end))
        }
    })
    .await;
    assert_eq!(lake_users(node).await, want);
}

/// A small deterministic generator (the tests' writes are reproducible).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Waits until the metadata records a lake snapshot of `app.<table>` other than `seen`;
/// returns it.
async fn next_lake_snapshot(node: &Node, table: &str, seen: Option<i64>) -> i64 {
    let mut got = None;
    until_view(node, &format!("a new lake snapshot of {table}"), |view| {
        let t = view
            .state
            .tables
            .values()
            .find(|t| t.name == table)
            .unwrap();
        match view
            .state
            .lake_snapshots
            .get(&t.table_id)
            .map(|r| r.snapshot_id)
        {
            Some(s) if Some(s) != seen => {
                got = Some(s);
                Ok(())
            }
            other => Err(other),
        }
    })
    .await;
    got.unwrap()
}

/// Under concurrent writes and tiering, each time a round is recorded: the union read of a log
/// table equals, bucket by bucket, the log read from offset 0 up to the same planned end
/// (nothing is trimmed), and the lake-only read is a prefix of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_union_read_of_a_log_table_is_its_log_under_concurrent_tiering() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(clicks(&[
        ("bucket.num", "3"),
        ("bucket.key", "user_id"),
        ("table.datalake.enabled", "true"),
        ("table.datalake.freshness", "1s"),
    ]))
    .await
    .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (node, stop) = (node.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut next = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                write(&node, next..next + 37).await;
                next += 37;
                tokio::task::yield_now().await;
            }
        })
    };
    let mut seen = None;
    for _ in 0..4 {
        seen = Some(next_lake_snapshot(&node, "clicks", seen).await);
        let plan = node
            .plan_read(&mink_node::ReadRequest {
                database: "app".into(),
                table: "clicks".into(),
                ..Default::default()
            })
            .unwrap();
        let ends: BTreeMap<u32, u64> = plan
            .buckets
            .iter()
            .map(|b| (b.bucket.bucket, b.to.unwrap()))
            .collect();
        let items = read_plan(&node, plan).await;
        let mut union: BTreeMap<u32, Vec<(u64, i64)>> = BTreeMap::new();
        for item in items {
            let b = item.data;
            let ids = int64(&b, "user_id");
            for (i, id) in ids.values().iter().enumerate() {
                union
                    .entry(item.bucket.bucket)
                    .or_default()
                    .push((item.offset + i as u64, *id));
            }
        }
        for (&bucket, &end) in &ends {
            let log = read_bucket_range(&node, bucket, end, mink_node::ReadSource::Log).await;
            let got = union.get(&bucket).cloned().unwrap_or_default();
            assert_eq!(got, log, "bucket {bucket} up to {end}");
            let lake = read_bucket_range(&node, bucket, end, mink_node::ReadSource::Lake).await;
            assert_eq!(
                lake[..],
                log[..lake.len()],
                "bucket {bucket}: the lake is a prefix"
            );
            // Filtered and projected to a column the filter does not test: the same rows.
            let (lo, hi) = (40 * i64::from(bucket), 2000);
            let filter: Filter = serde_json::from_value(serde_json::json!([
                {"column": "user_id", "op": ">=", "value": lo},
                {"column": "user_id", "op": "<", "value": hi},
                {"column": "event", "op": "!=", "value": format!("e{}", lo + 3)},
                {"column": "__offset", "op": ">", "value": 2},
            ]))
            .unwrap();
            let want = |rows: &[(u64, i64)]| -> Vec<String> {
                rows.iter()
                    .filter(|(o, id)| *o > 2 && (lo..hi).contains(id) && *id != lo + 3)
                    .map(|(_, id)| format!("e{id}"))
                    .collect()
            };
            let events =
                read_filtered(&node, bucket, end, mink_node::ReadSource::Union, &filter).await;
            assert_eq!(events, want(&log), "bucket {bucket} up to {end}, union");
            // Planned anew: tiering may have gone on since the lake was read above.
            let events =
                read_filtered(&node, bucket, end, mink_node::ReadSource::Lake, &filter).await;
            let all = want(&log);
            assert!(
                events.len() >= want(&lake).len() && events[..] == all[..events.len()],
                "bucket {bucket} up to {end}, lake: {events:?} is not a prefix of {all:?} as long as {:?}",
                want(&lake)
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    node.shutdown().await;
}

/// `event` of the rows of bucket `bucket` of `app.clicks` below `end` from `source` that
/// meet `filter`.
async fn read_filtered(
    node: &Node,
    bucket: u32,
    end: u64,
    source: mink_node::ReadSource,
    filter: &Filter,
) -> Vec<String> {
    let items = read_rows(
        node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "clicks".into(),
            bucket: Some(bucket),
            stop: mink_node::ReadStop::Before(end),
            columns: vec!["event".into()],
            source,
            filter: filter.clone(),
            ..Default::default()
        },
    )
    .await;
    let mut events = Vec::new();
    for item in items {
        assert_eq!(item.data.num_columns(), 1);
        let e = item.data.column(0).as_string::<i32>();
        events.extend(e.iter().map(|v| v.unwrap().to_string()));
    }
    events
}

/// `(offset, user_id)` of bucket `bucket` of `app.clicks` below `end`, from `source`.
async fn read_bucket_range(
    node: &Node,
    bucket: u32,
    end: u64,
    source: mink_node::ReadSource,
) -> Vec<(u64, i64)> {
    let items = read_rows(
        node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "clicks".into(),
            bucket: Some(bucket),
            stop: mink_node::ReadStop::Before(end),
            source,
            ..Default::default()
        },
    )
    .await;
    let mut rows = Vec::new();
    for item in items {
        let b = item.data;
        let ids = int64(&b, "user_id");
        for (i, id) in ids.values().iter().enumerate() {
            rows.push((item.offset + i as u64, *id));
        }
    }
    rows
}

/// Under concurrent upserts, deletes and tiering, each time a round is recorded: the union
/// read of a primary-key table (lake snapshot merged with the changelog after it, projected
/// and reordered) equals, bucket by bucket, the state replayed from the whole changelog up to
/// the same planned end; and once writes stop, the union read equals the KV snapshot scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_union_read_of_a_primary_key_table_is_its_state_under_concurrent_tiering() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(users()).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (node, stop) = (node.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut rng = Lcg(7);
            let names = ["a", "b", "c", "d"];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let ops: Vec<(i64, Option<&str>)> = (0..20)
                    .map(|_| {
                        let id = rng.next(200) as i64;
                        let op = rng.next(5);
                        (
                            id,
                            (op > 0).then(|| names[usize::try_from(op % 4).unwrap()]),
                        )
                    })
                    .collect();
                change_users(&node, &ops).await;
                tokio::task::yield_now().await;
            }
        })
    };
    let union_read = |source, filter| {
        let node = node.clone();
        async move {
            let plan = node
                .plan_read(&mink_node::ReadRequest {
                    database: "app".into(),
                    table: "users".into(),
                    columns: vec!["name".into(), "id".into()],
                    source,
                    filter,
                    ..Default::default()
                })
                .unwrap();
            let ends: BTreeMap<u32, u64> = plan
                .buckets
                .iter()
                .map(|b| (b.bucket.bucket, b.to.unwrap()))
                .collect();
            let items = read_plan(&node, plan).await;
            let mut batches: BTreeMap<u32, Vec<RecordBatch>> = BTreeMap::new();
            for item in items {
                let b = item.data;
                assert_eq!(b.schema().field(0).name(), "name");
                batches.entry(item.bucket.bucket).or_default().push(b);
            }
            let per_bucket: BTreeMap<u32, BTreeMap<i64, String>> = batches
                .into_iter()
                .map(|(bucket, b)| (bucket, names(&b)))
                .collect();
            (ends, per_bucket)
        }
    };
    let mut seen = None;
    for _ in 0..4 {
        seen = Some(next_lake_snapshot(&node, "users", seen).await);
        let (ends, union) = union_read(mink_node::ReadSource::Union, Filter::default()).await;
        for (&bucket, &end) in &ends {
            let replayed = replay_changelog(&node, bucket, end).await;
            assert_eq!(
                union.get(&bucket).cloned().unwrap_or_default(),
                replayed,
                "bucket {bucket} up to {end}"
            );
        }
        // A filter on the key and on a column the log's changes decide.
        let filter: Filter = serde_json::from_value(serde_json::json!([
            {"column": "id", "op": "<", "value": 120},
            {"column": "name", "op": "in", "values": ["a", "c"]},
        ]))
        .unwrap();
        let (ends, union) = union_read(mink_node::ReadSource::Union, filter).await;
        for (&bucket, &end) in &ends {
            let mut replayed = replay_changelog(&node, bucket, end).await;
            replayed.retain(|id, name| *id < 120 && (name == "a" || name == "c"));
            assert_eq!(
                union.get(&bucket).cloned().unwrap_or_default(),
                replayed,
                "filtered: bucket {bucket} up to {end}"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let (_, union) = union_read(mink_node::ReadSource::Union, Filter::default()).await;
    let all: BTreeMap<i64, String> = union.into_values().flatten().collect();
    assert_eq!(all, kv_state(&node).await);
    node.shutdown().await;
}

/// A filter on a column the log's changes decide is applied after the merge: a lake row
/// that fails it may be replaced by a change that meets it, and the other way round (Fluss
/// had bugs of this kind). The lake-only read filters the lake's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_filter_on_other_columns_applies_after_the_merge() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(users_on_demand()).await.unwrap();
    change_users(&node, &[(1, Some("a")), (2, Some("b")), (3, Some("a"))]).await;
    until_view(&node, "the coordinator's lease", |view| {
        match &view.state.coordinator {
            Some(c) if c.node_id == 1 => Ok(()),
            other => Err(other.clone()),
        }
    })
    .await;
    assert!(tier(&node, "users").await);
    // After the round: 1 becomes b, 2 becomes a, 3 is deleted, 4 is new.
    change_users(
        &node,
        &[(1, Some("b")), (2, Some("a")), (3, None), (4, Some("a"))],
    )
    .await;
    let read = |source, filter: serde_json::Value| {
        let node = node.clone();
        async move {
            let items = read_where(&node, "users", source, filter).await;
            names(&items.into_iter().map(|i| i.data).collect::<Vec<_>>())
        }
    };
    let named_a = serde_json::json!([{"column": "name", "op": "=", "value": "a"}]);
    let want = |rows: &[(i64, &str)]| -> BTreeMap<i64, String> {
        rows.iter().map(|(i, n)| (*i, n.to_string())).collect()
    };
    assert_eq!(
        read(mink_node::ReadSource::Union, named_a.clone()).await,
        want(&[(2, "a"), (4, "a")])
    );
    assert_eq!(
        read(mink_node::ReadSource::Lake, named_a.clone()).await,
        want(&[(1, "a"), (3, "a")])
    );
    // The KV snapshot scan filters the same way; a filter on the key.
    assert_eq!(
        read(mink_node::ReadSource::Auto, named_a).await,
        want(&[(2, "a"), (4, "a")])
    );
    assert_eq!(
        read(
            mink_node::ReadSource::Union,
            serde_json::json!([{"column": "id", "op": "in", "values": [1, 3]}])
        )
        .await,
        want(&[(1, "b")])
    );
    // A bad filter is refused when the read is planned, naming the column.
    let refused = node.plan_read(&mink_node::ReadRequest {
        database: "app".into(),
        table: "users".into(),
        source: mink_node::ReadSource::Union,
        filter: serde_json::from_value(
            serde_json::json!([{"column": "__offset", "op": ">", "value": 1}]),
        )
        .unwrap(),
        ..Default::default()
    });
    assert!(
        matches!(&refused, Err(mink_node::NodeError::Invalid(m)) if m.contains("\"__offset\"") && m.contains("no such column")),
        "{refused:?}"
    );
    node.shutdown().await;
}

/// The rows of bucket `bucket` of `app.users` replayed from its whole changelog below `end`.
async fn replay_changelog(node: &Node, bucket: u32, end: u64) -> BTreeMap<i64, String> {
    let items = read_rows(
        node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "users".into(),
            bucket: Some(bucket),
            changelog: true,
            stop: mink_node::ReadStop::Before(end),
            ..Default::default()
        },
    )
    .await;
    let mut state = BTreeMap::new();
    for item in items {
        let b = item.data;
        let kind = b.column_by_name("_change_type").unwrap().as_string::<i32>();
        let id = int64(&b, "id");
        let name = b.column_by_name("name").unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            match kind.value(i) {
                "insert" | "update_after" => {
                    state.insert(id.value(i), name.value(i).to_string());
                }
                "delete" => {
                    state.remove(&id.value(i));
                }
                _ => {}
            }
        }
    }
    state
}

/// Dropping a partition of a lake table drops its rows from the lake, and tiering of the
/// other partitions goes on; dropping the table drops its Iceberg table, so a table created
/// again under the name starts with an empty lake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_partition_or_the_table_drops_its_lake_rows() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    node.create_database("app", false).await.unwrap();
    let spec = || {
        let mut spec = clicks(&[
            ("bucket.num", "2"),
            ("bucket.key", "user_id"),
            ("table.datalake.enabled", "true"),
            ("table.datalake.freshness", "1s"),
        ]);
        spec.name = "visits".into();
        spec.schema = Schema::new(vec![
            Field::new("user_id", DataType::Int64, false),
            Field::new("day", DataType::Utf8, false),
        ]);
        spec.partition_keys = vec!["day".into()];
        spec
    };
    node.create_table(spec()).await.unwrap();
    let rows = |ids: std::ops::Range<i64>, day: &str| {
        RecordBatch::try_from_iter(vec![
            (
                "user_id",
                Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef,
            ),
            (
                "day",
                Arc::new(StringArray::from_iter_values(ids.map(|_| day))) as ArrayRef,
            ),
        ])
        .unwrap()
    };
    write_rows(&node, "visits", &rows(0..30, "2026-12-01")).await;
    write_rows(&node, "visits", &rows(100..130, "2026-12-02")).await;
    until_table_tiered(&node, "visits", 60).await;
    let lake_ids = || async {
        let mut ids: Vec<i64> = node
            .lake()
            .await
            .unwrap()
            .scan("app", "visits")
            .await
            .unwrap()
            .iter()
            .flat_map(|b| int64(b, "user_id").values().to_vec())
            .collect();
        ids.sort_unstable();
        ids
    };
    node.drop_partition("app", "visits", "2026-12-02", false)
        .await
        .unwrap();
    assert_eq!(lake_ids().await, (0..30).collect::<Vec<_>>());
    // Tiering goes on, and records only the buckets the table still has.
    write_rows(&node, "visits", &rows(30..40, "2026-12-01")).await;
    until_table_tiered(&node, "visits", 40).await;
    assert_eq!(lake_ids().await, (0..40).collect::<Vec<_>>());

    node.drop_table("app", "visits", false).await.unwrap();
    assert!(
        node.lake()
            .await
            .unwrap()
            .load_table("app", "visits")
            .await
            .is_err()
    );
    node.create_table(spec()).await.unwrap();
    assert!(lake_ids().await.is_empty());
    write_rows(&node, "visits", &rows(0..5, "2026-12-03")).await;
    until_table_tiered(&node, "visits", 5).await;
    assert_eq!(lake_ids().await, (0..5).collect::<Vec<_>>());
    node.shutdown().await;
}

/// The lake enabled on a log table whose log retention had already trimmed: tiering starts
/// at each bucket's log start, which the metadata records as where the lake begins; once the
/// log is trimmed again the union read starts there (not at 0, which nothing holds), reads
/// every row from it once, and the lake-only read is `[lake start, tiered offset)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lake_enabled_after_trimming_begins_at_the_logs_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.retention_interval = Duration::from_millis(100);
    let node = Node::start(c).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(clicks(&[
        ("bucket.num", "2"),
        ("bucket.key", "user_id"),
        ("table.log.ttl", "1s"),
    ]))
    .await
    .unwrap();
    for chunk in 0..5 {
        write(&node, chunk * 20..chunk * 20 + 20).await;
    }
    until_trimmed(&node, "clicks").await;
    // Retention goes on trimming until the lake is enabled: where each log starts then is at
    // or past what is observed here.
    let observed: BTreeMap<u32, u64> = node
        .describe_table("app", "clicks")
        .unwrap()
        .buckets
        .iter()
        .map(|b| (b.bucket, b.start_offset))
        .collect();
    node.alter_table(
        "app",
        "clicks",
        mink_node::TableChange {
            set_options: BTreeMap::from([
                ("table.datalake.enabled".into(), "true".into()),
                ("table.datalake.freshness".into(), "1s".into()),
            ]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    write(&node, 100..140).await;
    // Tiered to the end from where each log started when the lake was enabled.
    until_view(&node, "every bucket tiered to its end", |view| {
        let t = view
            .state
            .tables
            .values()
            .find(|t| t.name == "clicks")
            .unwrap();
        let Some(r) = view.state.lake_snapshots.get(&t.table_id) else {
            return Err("no lake snapshot".to_string());
        };
        let behind: Vec<_> = view
            .state
            .buckets
            .values()
            .filter(|b| b.table_id == t.table_id)
            .filter_map(|b| {
                let end = view.state.streams.get(&b.stream_id)?.end_offset;
                (r.tiered_offset(0, b.bucket) != Some(end)).then_some(b.bucket)
            })
            .collect();
        if behind.is_empty() {
            Ok(())
        } else {
            Err(format!("{behind:?}"))
        }
    })
    .await;
    // Where the metadata records each bucket's lake beginning: its log's start then.
    let starts: BTreeMap<u32, u64> = {
        let view = node.view();
        let t = view
            .state
            .tables
            .values()
            .find(|t| t.name == "clicks")
            .unwrap();
        let r = view.state.lake_snapshots.get(&t.table_id).unwrap();
        observed.keys().map(|&b| (b, r.lake_start(0, b))).collect()
    };
    for (b, start) in &starts {
        assert!(
            *start >= observed[b] && *start > 0,
            "bucket {b}: the lake begins at {start}, the log started at {} before",
            observed[b]
        );
    }
    until_trimmed_past(&node, "clicks", &starts).await;
    let info = node.describe_table("app", "clicks").unwrap();
    let mut ids = Vec::new();
    for b in &info.buckets {
        let lake_start = starts[&b.bucket];
        assert_eq!(b.readable_offset, lake_start, "bucket {}", b.bucket);
        let union = read_source(&node, Some(b.bucket), mink_node::ReadSource::Union).await;
        let offsets: Vec<u64> = union.iter().map(|r| r.1).collect();
        assert_eq!(offsets, (lake_start..b.end_offset).collect::<Vec<_>>());
        ids.extend(union.iter().map(|r| r.2));
        let lake: Vec<u64> = read_source(&node, Some(b.bucket), mink_node::ReadSource::Lake)
            .await
            .iter()
            .map(|r| r.1)
            .collect();
        assert_eq!(
            lake,
            (lake_start..b.tiered_offset.unwrap()).collect::<Vec<_>>()
        );
    }
    // Everything written from the first rows the logs still held when the lake began.
    ids.sort_unstable();
    ids.dedup();
    assert!(ids.contains(&139) && !ids.is_empty(), "{ids:?}");
    node.shutdown().await;
}

/// Waits until retention has trimmed every bucket of `app.clicks` past `starts`.
async fn until_trimmed_past(node: &Node, table: &str, starts: &BTreeMap<u32, u64>) {
    until_view(
        node,
        &format!("retention trimming {table} past {starts:?}"),
        |_| {
            let info = node.describe_table("app", table).unwrap();
            if info
                .buckets
                .iter()
                .all(|b| b.start_offset > starts[&b.bucket])
            {
                Ok(())
            } else {
                Err(info.buckets)
            }
        },
    )
    .await;
}

/// `app.clicks` in two buckets (with `more` options), tiered when the test says so (freshness
/// an hour), its rows 0..40 written and tiered.
async fn tiered_clicks(node: &Node, more: &[(&str, &str)]) {
    let mut options = vec![
        ("bucket.num", "2"),
        ("bucket.key", "user_id"),
        ("table.datalake.enabled", "true"),
        ("table.datalake.freshness", "1h"),
    ];
    options.extend_from_slice(more);
    node.create_table(clicks(&options)).await.unwrap();
    write(node, 0..40).await;
    assert!(tier(node, "clicks").await);
}

/// A node that runs retention and snapshots KV tablets every 100 ms, with database `app`.
async fn trimming_node(dir: &std::path::Path) -> Node {
    let mut c = config(dir);
    c.retention_interval = Duration::from_millis(100);
    c.kv_snapshot_interval = Duration::from_millis(100);
    let node = Node::start(c).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node
}

/// A union read of `app.<table>` planned now, and each bucket's tiered offset as it was.
fn plan_union(node: &Node, table: &str) -> (mink_node::ReadPlan, BTreeMap<u32, u64>) {
    let plan = node
        .plan_read(&mink_node::ReadRequest {
            database: "app".into(),
            table: table.into(),
            source: mink_node::ReadSource::Union,
            ..Default::default()
        })
        .unwrap();
    let tiered = node
        .describe_table("app", table)
        .unwrap()
        .buckets
        .iter()
        .map(|b| (b.bucket, b.tiered_offset.unwrap()))
        .collect();
    (plan, tiered)
}

/// A union read planned before a tiering round after which retention trims the log past
/// what the planned snapshot holds takes those rows from the newer snapshot: the planned cut,
/// whole (it failed with offset out of range).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_union_read_outlives_the_snapshot_it_was_planned_at() {
    let dir = tempfile::tempdir().unwrap();
    let node = trimming_node(dir.path()).await;
    // The log kept 1 s past its tiered offset.
    tiered_clicks(&node, &[("table.log.ttl", "1s")]).await;
    write(&node, 40..60).await;
    let (plan, tiered_at_plan) = plan_union(&node, "clicks");
    for b in &plan.buckets {
        assert!(
            b.to.unwrap() > tiered_at_plan[&b.bucket.bucket],
            "the plan reads bucket {} past its snapshot",
            b.bucket.bucket
        );
    }
    assert!(tier(&node, "clicks").await);
    until_trimmed_past(&node, "clicks", &tiered_at_plan).await;

    let mut per_bucket: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut ids = Vec::new();
    for item in read_plan(&node, plan).await {
        let values = int64(&item.data, "user_id");
        for (i, id) in values.values().iter().enumerate() {
            per_bucket
                .entry(item.bucket.bucket)
                .or_default()
                .push(item.offset + i as u64);
            ids.push(*id);
        }
    }
    for (bucket, offsets) in per_bucket {
        assert_eq!(
            offsets,
            (0..offsets.len() as u64).collect::<Vec<_>>(),
            "bucket {bucket}"
        );
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..60).collect::<Vec<_>>());
    node.shutdown().await;
}

/// The same for a primary-key table: a bucket whose changes after the planned snapshot were
/// trimmed is read at the newer snapshot, which holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_union_read_outlives_the_snapshot_it_was_planned_at() {
    let dir = tempfile::tempdir().unwrap();
    let node = trimming_node(dir.path()).await;
    let mut spec = users_on_demand();
    spec.options.insert("table.log.ttl".into(), "1s".into());
    node.create_table(spec).await.unwrap();
    let first: Vec<(i64, Option<&str>)> = (0..40).map(|id| (id, Some("a"))).collect();
    change_users(&node, &first).await;
    assert!(tier(&node, "users").await);
    let second: Vec<(i64, Option<&str>)> = (0..40)
        .map(|id| (id, (id % 3 != 0).then_some("b")))
        .collect();
    change_users(&node, &second).await;
    let (plan, tiered_at_plan) = plan_union(&node, "users");
    assert!(tier(&node, "users").await);
    until_trimmed_past(&node, "users", &tiered_at_plan).await;

    let batches: Vec<RecordBatch> = read_plan(&node, plan)
        .await
        .into_iter()
        .map(|item| item.data)
        .collect();
    let want: BTreeMap<i64, String> = (0..40)
        .filter(|id| id % 3 != 0)
        .map(|id| (id, "b".to_string()))
        .collect();
    assert_eq!(names(&batches), want);
    node.shutdown().await;
}

/// A primary-key bucket's union read streams the lake's rows batch by batch as they are read,
/// the log's changes merged in, rather than holding the bucket as one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_union_read_streams_the_lake() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    node.create_database("app", false).await.unwrap();
    node.create_table(users_on_demand()).await.unwrap();
    let rows: Vec<(i64, Option<&str>)> = (0..40_000).map(|id| (id, Some("a"))).collect();
    change_users(&node, &rows).await;
    assert!(tier(&node, "users").await);
    change_users(&node, &[(5, Some("z")), (6, None), (50_000, Some("new"))]).await;

    let items = read_rows(
        &node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "users".into(),
            source: mink_node::ReadSource::Union,
            ..Default::default()
        },
    )
    .await;
    let mut batches_per_bucket: BTreeMap<u32, usize> = BTreeMap::new();
    for item in &items {
        *batches_per_bucket.entry(item.bucket.bucket).or_default() += 1;
    }
    assert!(
        batches_per_bucket.len() == 4 && batches_per_bucket.values().all(|&n| n >= 2),
        "batches per bucket: {batches_per_bucket:?}"
    );
    let batches: Vec<RecordBatch> = items.into_iter().map(|item| item.data).collect();
    let union = names(&batches);
    assert_eq!(union.len(), 40_000);
    assert_eq!(union[&5], "z");
    assert!(!union.contains_key(&6));
    assert_eq!(union[&50_000], "new");
    assert_eq!(union, kv_state(&node).await);
    node.shutdown().await;
}

/// Edge cases of the union read: a bucket with no lake data (nor rows) yet, empty reads, a
/// log trimmed right up to its tiered offset, and a partition whose rows are only in the lake
/// (its log trimmed to its end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn union_read_edge_cases() {
    let dir = tempfile::tempdir().unwrap();
    let node = short_lived_clicks(dir.path()).await;
    // Rows of bucket 0 only (user ids the routing sends there): bucket 1 has nothing.
    let ids: Vec<i64> = (0..1000)
        .filter(|&i| mink_log::routing::buckets_of(&batch(i..i + 1), &[0], 2).unwrap()[0] == 0)
        .take(31)
        .collect();
    let rows_of = |ids: &[i64]| {
        RecordBatch::try_from_iter(vec![
            (
                "user_id",
                Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef,
            ),
            (
                "event",
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|i| format!("e{i}")),
                )) as ArrayRef,
            ),
        ])
        .unwrap()
    };
    for chunk in ids[..30].chunks(10) {
        write_rows(&node, "clicks", &rows_of(chunk)).await;
    }
    until_tiered(&node, 30).await;
    // Retention trims whole objects older than the TTL: every row of bucket 0 is in the lake
    // and its log is trimmed up to (at most) the tiered offset.
    until_view(&node, "bucket 0's log trimmed to its end", |_| {
        let info = node.describe_table("app", "clicks").unwrap();
        let b = &info.buckets[0];
        if b.start_offset == b.end_offset && b.end_offset == 30 {
            Ok(())
        } else {
            Err(info.buckets)
        }
    })
    .await;
    let info = node.describe_table("app", "clicks").unwrap();
    assert_eq!(info.buckets[0].tiered_offset, Some(30));
    assert_eq!(info.buckets[0].readable_offset, 0);
    assert_eq!(
        (info.buckets[1].end_offset, info.buckets[1].tiered_offset),
        (0, None)
    );
    for source in [
        mink_node::ReadSource::Union,
        mink_node::ReadSource::Auto,
        mink_node::ReadSource::Lake,
    ] {
        let b0: Vec<(u64, i64)> = read_source(&node, Some(0), source)
            .await
            .iter()
            .map(|r| (r.1, r.2))
            .collect();
        let want: Vec<(u64, i64)> = ids[..30]
            .iter()
            .enumerate()
            .map(|(o, id)| (o as u64, *id))
            .collect();
        assert_eq!(b0, want, "{source:?}");
        assert!(
            read_source(&node, Some(1), source).await.is_empty(),
            "{source:?}"
        );
    }
    assert!(
        read_source(&node, Some(0), mink_node::ReadSource::Log)
            .await
            .is_empty()
    );
    // A read that starts at the end returns nothing, from either side.
    let at_end = read_rows(
        &node,
        mink_node::ReadRequest {
            database: "app".into(),
            table: "clicks".into(),
            bucket: Some(0),
            start: mink_node::ReadStart::Offset(30),
            ..Default::default()
        },
    )
    .await;
    assert!(at_end.is_empty());
    // A row after the trim: the lake's history, then the log.
    write_rows(&node, "clicks", &rows_of(&ids[30..])).await;
    let b0: Vec<u64> = read_source(&node, Some(0), mink_node::ReadSource::Union)
        .await
        .iter()
        .map(|r| r.1)
        .collect();
    assert_eq!(b0, (0..31).collect::<Vec<_>>());
    node.shutdown().await;
}

/// `table.datalake.enabled` set to `value` on `app.<table>`, with `more` options.
async fn set_lake(
    node: &Node,
    table: &str,
    value: &str,
    more: &[(&str, &str)],
) -> mink_node::NodeResult<mink_node::TableInfo> {
    let mut set_options: BTreeMap<String, String> =
        [("table.datalake.enabled".to_string(), value.to_string())].into();
    set_options.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    node.alter_table(
        "app",
        table,
        mink_node::TableChange {
            set_options,
            ..Default::default()
        },
    )
    .await
}

/// Waits until the cluster's metadata allows disabling a lake.
async fn until_lake_can_be_disabled(node: &Node) {
    until_view(node, "metadata_version 4 (disabling a lake)", |view| {
        if view.state.metadata_version >= mink_metadata::LAKE_DISABLE_VERSION {
            Ok(())
        } else {
            Err(view.state.metadata_version)
        }
    })
    .await;
}

/// The lake disabled: tiering stops, reads are the log's, the Iceberg table stays as it was.
/// Enabled again, it resumes where it stopped: every row once. Disabled while retention trims
/// the log past what the lake holds, it cannot resume and says why; once its Iceberg table is
/// dropped, enabling starts a new lake at the log's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_can_be_disabled_and_enabled_again() {
    let dir = tempfile::tempdir().unwrap();
    let node = trimming_node(dir.path()).await;
    tiered_clicks(&node, &[]).await;
    let lake_before = lake_rows(&node).await;
    assert_eq!(lake_before.len(), 40);

    until_lake_can_be_disabled(&node).await;
    set_lake(&node, "clicks", "false", &[]).await.unwrap();
    let table_id = node.describe_table("app", "clicks").unwrap().table_id;
    assert!(
        !node.view().state.lake_snapshots.contains_key(&table_id),
        "the metadata forgets a disabled lake"
    );
    write(&node, 40..80).await;
    assert!(matches!(
        node.tier_now("app", "clicks").await,
        Err(mink_node::NodeError::Invalid(_))
    ));
    let refused = node.plan_read(&mink_node::ReadRequest {
        database: "app".into(),
        table: "clicks".into(),
        source: mink_node::ReadSource::Lake,
        ..Default::default()
    });
    assert!(
        matches!(&refused, Err(mink_node::NodeError::Invalid(m)) if m.contains("not tiered")),
        "{refused:?}"
    );
    assert_eq!(
        lake_rows(&node).await,
        lake_before,
        "the Iceberg table stays"
    );
    let log: Vec<i64> = read_source(&node, None, mink_node::ReadSource::Auto)
        .await
        .into_iter()
        .map(|r| r.2)
        .collect();
    assert_eq!(log.len(), 80);

    // Enabled again: the lake resumes at its own end, so every row is in it once.
    set_lake(
        &node,
        "clicks",
        "true",
        &[("table.datalake.freshness", "1h")],
    )
    .await
    .unwrap();
    assert!(tier(&node, "clicks").await);
    let ids: Vec<i64> = lake_rows(&node).await.into_iter().map(|r| r.0).collect();
    assert_eq!(ids, (0..80).collect::<Vec<_>>());
    let mut union = read_source(&node, None, mink_node::ReadSource::Union).await;
    let mut log = read_source(&node, None, mink_node::ReadSource::Log).await;
    union.sort_unstable();
    log.sort_unstable();
    assert_eq!(union, log);

    // Off again while the log's TTL trims past the lake's end: it cannot resume.
    let lake_ends: BTreeMap<u32, u64> = node
        .view()
        .state
        .lake_snapshots
        .get(&table_id)
        .unwrap()
        .bucket_offsets
        .iter()
        .map(|b| (b.bucket, b.offset))
        .collect();
    set_lake(&node, "clicks", "false", &[("table.log.ttl", "1s")])
        .await
        .unwrap();
    write(&node, 80..100).await;
    until_trimmed_past(&node, "clicks", &lake_ends).await;
    let refused = set_lake(&node, "clicks", "true", &[]).await;
    assert!(
        matches!(&refused, Err(mink_node::NodeError::Invalid(m)) if m.contains("cannot resume") && m.contains("bucket")),
        "{refused:?}"
    );
    assert!(
        node.describe_table("app", "clicks").unwrap().lake.is_none(),
        "a refused enable changes nothing"
    );

    // Its Iceberg table dropped, the lake starts anew at the log's start.
    assert!(
        node.lake()
            .await
            .unwrap()
            .drop_table("app", "clicks")
            .await
            .unwrap()
    );
    set_lake(&node, "clicks", "true", &[("table.log.ttl", "1h")])
        .await
        .unwrap();
    write(&node, 100..110).await;
    assert!(tier(&node, "clicks").await);
    let mut lake: Vec<i64> = lake_rows(&node).await.into_iter().map(|r| r.0).collect();
    let mut log: Vec<i64> = read_source(&node, None, mink_node::ReadSource::Log)
        .await
        .into_iter()
        .map(|r| r.2)
        .collect();
    lake.sort_unstable();
    log.sort_unstable();
    assert!(log.contains(&105) && !log.contains(&0), "{log:?}");
    assert_eq!(lake, log);
    node.shutdown().await;
}

/// A column added while the lake is off reaches the Iceberg table when the lake is enabled
/// again (enabling was refused, "missing from the Iceberg table", until the column was added
/// to Iceberg by hand), and the rows written with it tier with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_enabled_again_gains_the_columns_added_while_it_was_off() {
    let dir = tempfile::tempdir().unwrap();
    let node = trimming_node(dir.path()).await;
    tiered_clicks(&node, &[]).await;
    until_lake_can_be_disabled(&node).await;
    set_lake(&node, "clicks", "false", &[]).await.unwrap();
    let info = node.describe_table("app", "clicks").unwrap();
    let mut fields = info.schema.fields().to_vec();
    fields.push(Arc::new(Field::new("note", DataType::Utf8, true)));
    node.alter_table(
        "app",
        "clicks",
        mink_node::TableChange {
            schema: Some(Schema::new(fields)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    set_lake(
        &node,
        "clicks",
        "true",
        &[("table.datalake.freshness", "1h")],
    )
    .await
    .unwrap();
    let lake = node
        .lake()
        .await
        .unwrap()
        .load_table("app", "clicks")
        .await
        .unwrap();
    let field = lake
        .metadata()
        .current_schema()
        .field_by_name("note")
        .cloned()
        .expect("the Iceberg table gained the column");
    assert!(!field.required);
    node.shutdown().await;
}

/// A primary-key table's lake disabled while keys are upserted and deleted, then enabled
/// again after its changelog was trimmed and a KV snapshot taken: it resumes from the
/// changelog where it stopped (not from the snapshot, which cannot say which keys the lake
/// holds that were deleted meanwhile), so the deletes made while it was off reach it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_lake_resumes_with_the_changes_made_while_it_was_off() {
    let dir = tempfile::tempdir().unwrap();
    let node = trimming_node(dir.path()).await;
    let mut spec = users();
    spec.options
        .insert("table.datalake.freshness".into(), "1h".into());
    spec.options.insert("table.log.ttl".into(), "1s".into());
    node.create_table(spec).await.unwrap();
    let first: Vec<(i64, Option<&str>)> = (0..20).map(|i| (i, Some("a"))).collect();
    change_users(&node, &first).await;
    assert!(tier(&node, "users").await);
    // Trimmed up to what the lake holds (never past it while the lake is on).
    until_trimmed(&node, "users").await;
    let before = lake_users(&node).await;
    assert_eq!(before, kv_state(&node).await);

    until_lake_can_be_disabled(&node).await;
    set_lake(&node, "users", "false", &[("table.log.ttl", "1h")])
        .await
        .unwrap();
    let mut off: Vec<(i64, Option<&str>)> = (0..5).map(|i| (i, None)).collect();
    off.extend((5..10).map(|i| (i, Some("b"))));
    off.extend((30..35).map(|i| (i, Some("new"))));
    change_users(&node, &off).await;
    assert_eq!(lake_users(&node).await, before, "nothing tiered while off");
    // A KV snapshot of every bucket covering the changes made while off.
    let table_id = node.describe_table("app", "users").unwrap().table_id;
    until_view(&node, "KV snapshots up to every bucket's end", |view| {
        let behind: Vec<u32> = view
            .state
            .buckets
            .values()
            .filter(|b| b.table_id == table_id)
            .filter(|b| {
                let end = view
                    .state
                    .streams
                    .get(&b.stream_id)
                    .map_or(0, |s| s.end_offset);
                view.state
                    .latest_kv_snapshot((table_id, b.partition_id, b.bucket))
                    .is_none_or(|s| s.log_offset < end)
            })
            .map(|b| b.bucket)
            .collect();
        if behind.is_empty() {
            Ok(())
        } else {
            Err(behind)
        }
    })
    .await;

    set_lake(
        &node,
        "users",
        "true",
        &[("table.datalake.freshness", "1h")],
    )
    .await
    .unwrap();
    assert!(tier(&node, "users").await);
    let want = kv_state(&node).await;
    assert_eq!(want.len(), 20 - 5 + 5);
    assert_eq!(lake_users(&node).await, want);
    node.shutdown().await;
}
