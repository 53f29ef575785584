//! The Kafka source under crashes: records are produced to a Kafka-protocol broker (a Mink
//! node's Kafka listener; the connector only speaks Kafka to it) while `mink-connect run` is
//! SIGKILLed at random points and restarted. Afterwards every record is in its Mink table
//! exactly once, and every record that is not a row is in the dead-letter table once.

use std::collections::BTreeMap;

use mink_node::{BucketRef, Node};
use std::time::Duration;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use rand::Rng as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Every row of `database.table` (none before the connector creates it).
async fn rows(client: &mink_client::Client, database: &str, table: &str) -> Vec<RecordBatch> {
    match client
        .scan_all(&mink_client::Scan::table(database, table))
        .await
    {
        Ok(read) => read.into_iter().map(|r| r.batch).collect(),
        Err(e) if e.code() == Some(mink_client::ErrorCode::NotFound) => Vec::new(),
        Err(e) => panic!("reading {database}.{table}: {e}"),
    }
}

/// Rows stored in `shop.<table>`: its buckets' committed offsets (log tables, no retention
/// here); none before the connector creates it.
fn stored_rows(node: &Node, table: &str) -> u64 {
    let Ok(info) = node.describe_table("shop", table) else {
        return 0;
    };
    info.buckets
        .iter()
        .map(|b| {
            let (start, end) = node
                .bucket_offsets(&BucketRef::new("shop", table, None, b.bucket))
                .unwrap();
            end - start
        })
        .sum()
}

mod common;
use common::{connect, next_change, next_change_while};

const ORDERS: usize = 6000;
const PAYMENTS: usize = 3000;

/// Payment `i` as JSON, or (every 50th) a record that is not a row.
fn payment(i: usize) -> String {
    if i % 50 == 7 {
        format!("{{\"id\": \"not a number {i}\"}}")
    } else {
        format!("{{\"id\": {i}, \"amount\": {}}}", i * 10)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_lands_once_through_sigkills() {
    let dir = tempfile::tempdir().unwrap();
    // Each restart of the connector joins its group anew: no wait for more members.
    let kafka = mink_kafka::KafkaConfig {
        initial_rebalance_delay: Duration::ZERO,
        ..Default::default()
    };
    let s = mink_testkit::serve(dir.path(), kafka).await;
    let client = mink_client::Client::connect(&s.flight).await.unwrap();
    // The typed table of the json source; the raw one the connector creates.
    client.create_database("shop", false).await.unwrap();
    client
        .create_table(
            "shop",
            "payments",
            &Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("amount", DataType::Int64, true),
            ]),
            [("bucket.num", "3"), ("bucket.key", "id")],
            &[],
            false,
        )
        .await
        .unwrap();
    let mut kafka = rdkafka::ClientConfig::new();
    kafka.set("bootstrap.servers", &s.kafka);
    let admin: AdminClient<DefaultClientContext> = kafka.create().unwrap();
    let topics = [
        NewTopic::new("orders", 3, TopicReplication::Fixed(1)),
        NewTopic::new("payments", 2, TopicReplication::Fixed(1)),
    ];
    for r in admin
        .create_topics(&topics, &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
    let config = dir.path().join("connect.toml");
    std::fs::write(
        &config,
        format!(
            r#"
name = "test-in"
mink = "{}"
batch_records = 400
batch_ms = 20

[kafka]
bootstrap = "{}"
# A killed member leaves the group soon.
config = {{ "session.timeout.ms" = "2000", "heartbeat.interval.ms" = "200" }}

[[source]]
topic = "orders"
table = "shop.orders"
format = "raw"

[[source]]
topic = "payments"
table = "shop.payments"
format = "json"
dead_letter = "shop.payments_rejected"
"#,
            s.flight, s.kafka
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();

    // Load: records produced throughout the connector's crashes.
    let producer: FutureProducer = kafka.set("linger.ms", "2").create().unwrap();
    let load = tokio::spawn(async move {
        let mut deliveries = Vec::new();
        for i in 0..ORDERS.max(PAYMENTS) {
            if i < ORDERS {
                let (key, value) = (format!("order-{i}"), format!("value-{i}"));
                let record = FutureRecord::to("orders").key(&key).payload(&value);
                deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
            }
            if i < PAYMENTS {
                let (key, value) = (format!("p{i}"), payment(i));
                let record = FutureRecord::to("payments").key(&key).payload(&value);
                deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
            }
            if deliveries.len() >= 500 {
                for d in deliveries.drain(..) {
                    d.await.unwrap().map_err(|(e, _)| e).unwrap();
                }
            }
        }
        for d in deliveries {
            d.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
    });

    // Crashes at random points while rows arrive (after a random number of new rows), then a
    // run to the end.
    let bad = (0..PAYMENTS).filter(|i| i % 50 == 7).count() as u64;
    let rows_expected = (ORDERS + PAYMENTS) as u64 - bad;
    let rows_now = || stored_rows(&s.node, "orders") + stored_rows(&s.node, "payments");
    let mut rng = rand::rng();
    for round in 0..5 {
        let mut child = connect(&["run", "--config", &config]).spawn().unwrap();
        let target = (rows_now() + rng.random_range(1..=600)).min(rows_expected);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while rows_now() < target {
            assert!(
                next_change_while(&s.node, &mut child, deadline).await,
                "round {round}: waited 60 s for {target} rows, have {}",
                rows_now()
            );
        }
        child.kill().await.unwrap();
    }
    load.await.unwrap();
    let mut child = connect(&["run", "--config", &config]).spawn().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let expected = (ORDERS as u64, PAYMENTS as u64 - bad, bad);
    loop {
        let got = (
            stored_rows(&s.node, "orders"),
            stored_rows(&s.node, "payments"),
            stored_rows(&s.node, "payments_rejected"),
        );
        if got == expected {
            break;
        }
        assert!(
            got.0 <= expected.0 && got.1 <= expected.1 && got.2 <= expected.2,
            "more rows than records (orders, payments, rejected): {got:?}"
        );
        if !next_change(&s.node, deadline).await {
            child.kill().await.unwrap();
            let out = child.wait_with_output().await.unwrap();
            panic!(
                "waited 120 s for (orders, payments, rejected) = {expected:?}, have {got:?}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // Each partition's state row follows its last batch: status reaches no lag.
    loop {
        let status = connect(&["status", "--config", &config])
            .output()
            .await
            .unwrap();
        let status = String::from_utf8_lossy(&status.stdout).to_string();
        if status.contains("total lag: 0 records") {
            break;
        }
        assert!(
            next_change(&s.node, deadline).await,
            "waited 120 s for no lag:\n{status}"
        );
    }
    child.kill().await.unwrap();

    // Exactly once, record for record.
    let mut orders: BTreeMap<String, usize> = BTreeMap::new();
    for b in rows(&client, "shop", "orders").await {
        let values = b.column_by_name("value").unwrap().as_binary::<i32>();
        for v in values.iter() {
            *orders
                .entry(String::from_utf8(v.unwrap().to_vec()).unwrap())
                .or_default() += 1;
        }
    }
    assert_eq!(orders.len(), ORDERS);
    assert!(orders.values().all(|n| *n == 1), "a record stored twice");
    let mut ids: Vec<i64> = Vec::new();
    for b in rows(&client, "shop", "payments").await {
        ids.extend(b.column(0).as_primitive::<Int64Type>().values().iter());
    }
    ids.sort_unstable();
    let expected: Vec<i64> = (0..PAYMENTS)
        .filter(|i| i % 50 != 7)
        .map(|i| i64::try_from(i).unwrap())
        .collect();
    assert_eq!(ids, expected);
    let mut rejected = Vec::new();
    for b in rows(&client, "shop", "payments_rejected").await {
        let reasons = b.column_by_name("reason").unwrap().as_string::<i32>();
        let values = b.column_by_name("value").unwrap().as_binary::<i32>();
        for i in 0..b.num_rows() {
            assert!(!reasons.value(i).is_empty());
            rejected.push(String::from_utf8(values.value(i).to_vec()).unwrap());
        }
    }
    rejected.sort_unstable();
    let mut expected: Vec<String> = (0..PAYMENTS).filter(|i| i % 50 == 7).map(payment).collect();
    expected.sort_unstable();
    assert_eq!(rejected, expected);
    s.stop().await;
}

/// A partition starts from what Mink holds even when the group would start it past that and
/// no record comes to seek back on: with `auto.offset.reset = latest` (or a group whose
/// offsets are at the end) a first run copied none of a topic's backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_copies_the_backlog_whatever_the_group_starts_at() {
    let dir = tempfile::tempdir().unwrap();
    let kafka = mink_kafka::KafkaConfig {
        initial_rebalance_delay: Duration::ZERO,
        ..Default::default()
    };
    let s = mink_testkit::serve(dir.path(), kafka).await;
    let mut kafka = rdkafka::ClientConfig::new();
    kafka.set("bootstrap.servers", &s.kafka);
    let admin: AdminClient<DefaultClientContext> = kafka.create().unwrap();
    let topics = [NewTopic::new("backlog", 2, TopicReplication::Fixed(1))];
    for r in admin
        .create_topics(&topics, &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
    let producer: FutureProducer = kafka.create().unwrap();
    for i in 0..40 {
        let value = format!("v{i}");
        let record = FutureRecord::to("backlog")
            .key(&value)
            .payload(&value)
            .partition(i % 2);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let config = dir.path().join("connect.toml");
    std::fs::write(
        &config,
        format!(
            r#"
name = "late"
mink = "{}"
batch_ms = 20

[kafka]
bootstrap = "{}"
config = {{ "auto.offset.reset" = "latest" }}

[[source]]
topic = "backlog"
table = "shop.backlog"
format = "raw"
"#,
            s.flight, s.kafka
        ),
    )
    .unwrap();
    let mut child = connect(&["run", "--config", config.to_str().unwrap()])
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while stored_rows(&s.node, "backlog") < 40 {
        assert!(
            next_change_while(&s.node, &mut child, deadline).await,
            "waited 60 s for the 40 records of the backlog, have {}",
            stored_rows(&s.node, "backlog")
        );
    }
    child.kill().await.unwrap();
    assert_eq!(stored_rows(&s.node, "backlog"), 40);
}
