//! The node service over a real metadata log (SQLite) and object store (local filesystem).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use mink_node::{Node, NodeConfig, NodeError, TableSpec};

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

fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef,
        ),
        (
            "event",
            Arc::new(StringArray::from_iter_values(ids.map(|i| format!("e{i}")))) as ArrayRef,
        ),
    ])
    .unwrap()
}

fn spec(name: &str, buckets: u32) -> TableSpec {
    TableSpec {
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
    let mut ids = Vec::new();
    for b in node
        .read("app", table, bucket, 0, 1 << 20, &[])
        .await
        .unwrap()
    {
        ids.extend(
            b.batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .copied(),
        );
    }
    ids
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
        .write("app", "events", &batch(0..100), None, None)
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
    let (start, end) = node.bucket_offsets("app", "events", 0).unwrap();
    assert_eq!(start, 0);
    let read = node
        .read("app", "events", 0, 0, 1 << 20, &["event".into()])
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
        node.write("app", "events", &bad, None, None).await,
        Err(NodeError::Invalid(_))
    ));
    assert!(matches!(
        node.write("app", "nope", &batch(0..1), None, None).await,
        Err(NodeError::NotFound(_))
    ));
    assert!(matches!(
        node.write("app", "events", &batch(0..1), Some(9), None)
            .await,
        Err(NodeError::Invalid(_))
    ));
    assert_eq!(node.bucket_offsets("app", "events", 0).unwrap().1, end);
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
        Err(NodeError::NotFound(_))
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
    tokio::time::sleep(Duration::from_millis(300)).await;
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
    let at_a = a.write("app", "spread", &rows, None, None).await.unwrap();
    match &at_a[0].result {
        Err(NodeError::NotLeader {
            leader, address, ..
        }) => {
            assert_eq!((*leader, address.as_str()), (2, "127.0.0.1:7002"));
        }
        other => panic!("expected a redirect, got {other:?}"),
    }
    let at_b = b.write("app", "spread", &rows, None, None).await.unwrap();
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
        .write("app", "events", &batch(0..10), None, None)
        .await
        .unwrap();
    assert!(writes.iter().all(|w| w.result.is_ok()), "{writes:?}");
    node.shutdown().await;

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
        .write("app", "events", &batch(10..20), None, None)
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
