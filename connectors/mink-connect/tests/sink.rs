//! The Kafka sink under crashes: a primary-key table takes upserts, updates and deletes and a
//! log table takes appends while `mink-connect run` with a sink for each is SIGKILLed at random
//! points and restarted. Afterwards the primary-key table's topic, applied by key from its
//! start, is the table's state; every log row is in its topic; `status` and `/metrics` show no
//! lag.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use mink_node::{BucketRef, Node};
use rand::Rng as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use serde_json::Value;

mod common;
use common::{connect, next_change, next_change_while};

/// The high watermark of each bucket of `shop.<table>`.
fn ends(node: &Node, table: &str) -> BTreeMap<u32, u64> {
    let info = node.describe_table("shop", table).unwrap();
    info.buckets
        .iter()
        .map(|b| {
            let (_, end) = node
                .bucket_offsets(&BucketRef::new("shop", table, None, b.bucket))
                .unwrap();
            (b.bucket, end)
        })
        .collect()
}

/// The sink positions recorded in Mink, by (table, bucket); none before the connector made
/// its state table.
async fn positions(client: &mink_client::Client) -> BTreeMap<(String, u32), u64> {
    let read = match client
        .scan_all(&mink_client::Scan::table("mink_connect", "test_out_sink"))
        .await
    {
        Ok(read) => read,
        Err(e) if e.code() == Some(mink_client::ErrorCode::NotFound) => return BTreeMap::new(),
        Err(e) => panic!("reading the sink state: {e}"),
    };
    let mut out = BTreeMap::new();
    for r in read {
        let b = &r.batch;
        let col = |n: &str| b.column_by_name(n).unwrap().clone();
        let tables = col("table");
        let tables = tables.as_any().downcast_ref::<StringArray>().unwrap();
        let buckets = col("bucket");
        let buckets = buckets
            .as_any()
            .downcast_ref::<arrow::array::Int32Array>()
            .unwrap();
        let pos = col("position");
        let pos = pos.as_any().downcast_ref::<Int64Array>().unwrap();
        for i in 0..b.num_rows() {
            out.insert(
                (tables.value(i).to_string(), buckets.value(i) as u32),
                pos.value(i) as u64,
            );
        }
    }
    out
}

/// The changes the load makes: batches of upserts (new keys and updates) and deletes of keys
/// that exist (so every write changes something and shows in the changelog).
fn customers_batch(
    rng: &mut impl rand::Rng,
    live: &mut BTreeSet<i64>,
    round: usize,
) -> RecordBatch {
    let (mut ids, mut names, mut balances, mut kinds) = (vec![], vec![], vec![], vec![]);
    for j in 0..20 {
        let id = rng.random_range(0..300i64);
        let delete = live.contains(&id) && rng.random_bool(0.25);
        ids.push(id);
        names.push(format!("name-{round}-{j}"));
        balances.push((round * 100 + j) as i64);
        kinds.push(if delete { "delete" } else { "upsert" });
        if delete {
            live.remove(&id);
        } else {
            live.insert(id);
        }
    }
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("balance", DataType::Int64, true),
            Field::new("_row_kind", DataType::Utf8, false),
        ])),
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(names)),
            Arc::new(Int64Array::from(balances)),
            Arc::new(StringArray::from(kinds)),
        ],
    )
    .unwrap()
}

fn clicks_batch(round: usize) -> RecordBatch {
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("user_id", DataType::Int64, false),
            Field::new("page", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from_iter_values(
                (0..10).map(|j| (round * 10 + j) as i64),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..10).map(|j| format!("/page/{round}/{j}")),
            )),
        ],
    )
    .unwrap()
}

/// A consumed message: its partition, key and value.
type Consumed = (i32, Option<Vec<u8>>, Option<Vec<u8>>);

/// Every message of `topic` from its start to its end now.
fn consume_all(bootstrap: &str, topic: &str) -> Vec<Consumed> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "sink-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout).unwrap();
    let partitions: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.id())
        .collect();
    let mut assignment = TopicPartitionList::new();
    let mut left = BTreeMap::new();
    for p in &partitions {
        let (low, high) = consumer.fetch_watermarks(topic, *p, timeout).unwrap();
        if high > low {
            assignment
                .add_partition_offset(topic, *p, Offset::Offset(low))
                .unwrap();
            left.insert(*p, high);
        }
    }
    consumer.assign(&assignment).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while !left.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited 60 s to read {topic} to its end; partitions left (with their ends): {left:?}"
        );
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m.unwrap();
        out.push((
            m.partition(),
            m.key().map(<[u8]>::to_vec),
            m.payload().map(<[u8]>::to_vec),
        ));
        if left
            .get(&m.partition())
            .is_some_and(|end| m.offset() + 1 >= *end)
        {
            left.remove(&m.partition());
        }
    }
    out
}

/// `GET /metrics` of the connector.
async fn metrics(address: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(address).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_replays_to_the_table_through_sigkills() {
    let dir = tempfile::tempdir().unwrap();
    let s = mink_testkit::serve(dir.path(), mink_kafka::KafkaConfig::default()).await;
    let client = mink_client::Client::connect(&s.flight).await.unwrap();
    client.create_database("shop", false).await.unwrap();
    let customers = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("balance", DataType::Int64, true),
    ]);
    client
        .create_table_with(&mink_flight::protocol::CreateTable {
            database: "shop".into(),
            table: "customers".into(),
            schema: mink_flight::protocol::encode_schema(&customers).unwrap(),
            options: [("bucket.num".to_string(), "3".to_string())].into(),
            partition_keys: vec![],
            primary_key: vec!["id".into()],
            comment: String::new(),
            if_not_exists: false,
        })
        .await
        .unwrap();
    client
        .create_table(
            "shop",
            "clicks",
            &clicks_batch(0).schema(),
            [("bucket.num", "2")],
            &[],
            false,
        )
        .await
        .unwrap();
    let metrics_address = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let config = dir.path().join("connect.toml");
    std::fs::write(
        &config,
        format!(
            r#"
name = "test-out"
mink = "{}"
batch_ms = 20
metrics = "{metrics_address}"

[kafka]
bootstrap = "{}"

[[sink]]
table = "shop.customers"
topic = "customers_cdc"

[[sink]]
table = "shop.clicks"
topic = "clicks_out"
"#,
            s.flight, s.kafka
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();

    // Load: changes written throughout the connector's crashes.
    const ROUNDS: usize = 150;
    let load = tokio::spawn({
        let client = client.clone();
        async move {
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
            let mut live = BTreeSet::new();
            let mut customers = client.writer("shop", "customers");
            let mut clicks = client.writer("shop", "clicks");
            for round in 0..ROUNDS {
                let batch = customers_batch(&mut rng, &mut live, round);
                customers.write(&batch).await.unwrap();
                clicks.write(&clicks_batch(round)).await.unwrap();
            }
        }
    });

    let total_end = |node: &Node| -> u64 {
        ends(node, "customers").values().sum::<u64>() + ends(node, "clicks").values().sum::<u64>()
    };
    let mut rng = rand::rng();
    for round in 0..5 {
        let mut child = connect(&["run", "--config", &config]).spawn().unwrap();
        let now: u64 = positions(&client).await.values().sum();
        let target = now + rng.random_range(1..=400);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let reached: u64 = positions(&client).await.values().sum();
            // Enough progress, or all there is (the load may be done).
            if reached >= target.min(total_end(&s.node)) && reached > now {
                break;
            }
            assert!(
                next_change_while(&s.node, &mut child, deadline).await,
                "round {round}: waited 60 s for the sinks to reach {target}, at {reached}"
            );
        }
        child.kill().await.unwrap();
    }
    load.await.unwrap();

    // A last run to the end: every bucket's position at its high watermark.
    let mut child = connect(&["run", "--config", &config]).spawn().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut expected = BTreeMap::new();
    for table in ["customers", "clicks"] {
        for (b, end) in ends(&s.node, table) {
            expected.insert((format!("shop.{table}"), b), end);
        }
    }
    loop {
        let got = positions(&client).await;
        if got == expected {
            break;
        }
        if !next_change(&s.node, deadline).await {
            child.kill().await.unwrap();
            let out = child.wait_with_output().await.unwrap();
            panic!(
                "waited 120 s for the positions {expected:?}, have {got:?}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let status = connect(&["status", "--config", &config])
        .output()
        .await
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(status.contains("total lag: 0 records"), "{status}");
    assert!(
        status.contains("| shop.customers | - | 2 | customers_cdc |"),
        "{status}"
    );
    let scraped = metrics(&metrics_address).await;
    for b in 0..3 {
        assert!(
            scraped.contains(&format!(
                "mink_connect_sink_lag{{table=\"shop.customers\",partition=\"\",bucket=\"{b}\"}} 0\n"
            )),
            "{scraped}"
        );
    }
    child.kill().await.unwrap();

    // The topic replayed by key is the table.
    let mut replayed: BTreeMap<i64, Value> = BTreeMap::new();
    let mut ops = BTreeMap::<String, usize>::new();
    // Per key, the changelog offset of a delete whose tombstone has not come yet. Delivery is
    // at least once: a kill between a delete and its tombstone replays both from the last
    // recorded position, so the next event of the key is then a replay (at that offset or
    // before it), never a later change.
    let mut awaiting_tombstone: BTreeMap<i64, u64> = BTreeMap::new();
    for (_, key, value) in consume_all(&s.kafka, "customers_cdc") {
        let key: Value = serde_json::from_slice(&key.expect("a keyed record")).unwrap();
        let id = key["id"].as_i64().unwrap();
        let Some(value) = value else {
            replayed.remove(&id);
            *ops.entry("tombstone".into()).or_default() += 1;
            assert!(
                awaiting_tombstone.remove(&id).is_some(),
                "a tombstone of key {id} without a delete before it"
            );
            continue;
        };
        let event: Value = serde_json::from_slice(&value).unwrap();
        let offset = event["source"]["offset"].as_u64().unwrap();
        if let Some(deleted_at) = awaiting_tombstone.remove(&id) {
            assert!(
                offset <= deleted_at,
                "key {id}: the delete at offset {deleted_at} has no tombstone before {event}"
            );
        }
        let op = event["op"].as_str().unwrap().to_string();
        if op == "d" {
            awaiting_tombstone.insert(id, offset);
        }
        match op.as_str() {
            "c" | "u" => {
                assert_eq!(event["after"]["id"], key["id"], "{event}");
                replayed.insert(id, event["after"].clone());
            }
            "d" => {
                assert_eq!(event["before"]["id"], key["id"], "{event}");
                assert!(event["after"].is_null(), "{event}");
                replayed.remove(&id);
            }
            other => panic!("op {other:?} in {event}"),
        }
        if op == "u" {
            assert_eq!(
                event["before"]["id"], key["id"],
                "an update's before image: {event}"
            );
        }
        assert!(event["ts_ms"].as_i64().unwrap() > 0, "{event}");
        *ops.entry(op).or_default() += 1;
    }
    assert!(
        ["c", "u", "d"].iter().all(|op| ops.contains_key(*op)),
        "every kind of change: {ops:?}"
    );
    assert!(
        awaiting_tombstone.is_empty(),
        "deletes without their tombstone: {awaiting_tombstone:?}"
    );
    assert!(ops.get("tombstone") >= Some(&1), "{ops:?}");
    let mut table: BTreeMap<i64, Value> = BTreeMap::new();
    for r in client
        .scan_all(&mink_client::Scan::table("shop", "customers"))
        .await
        .unwrap()
    {
        let mut out = Vec::new();
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::LineDelimited>(&mut out);
        w.write(&r.batch).unwrap();
        w.finish().unwrap();
        drop(w);
        for line in out.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let row: Value = serde_json::from_slice(line).unwrap();
            table.insert(row["id"].as_i64().unwrap(), row);
        }
    }
    assert!(!table.is_empty());
    assert_eq!(
        replayed, table,
        "the topic replayed by key against the table"
    );

    // Every log row, each bucket's in its own partition, in order.
    let mut seen: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for (partition, key, value) in consume_all(&s.kafka, "clicks_out") {
        assert!(key.is_none());
        let event: Value = serde_json::from_slice(&value.unwrap()).unwrap();
        assert_eq!(event["op"], "c");
        let bucket = event["source"]["bucket"].as_u64().unwrap();
        let offset = event["source"]["offset"].as_u64().unwrap();
        assert_eq!(
            partition as u64, bucket,
            "bucket {bucket} in partition {partition}"
        );
        let user = event["after"]["user_id"].as_i64().unwrap();
        assert_eq!(
            event["after"]["page"],
            format!("/page/{}/{}", user / 10, user % 10)
        );
        seen.entry(bucket).or_default().insert(offset);
    }
    for (b, end) in ends(&s.node, "clicks") {
        let got = seen.remove(&u64::from(b)).unwrap_or_default();
        assert_eq!(
            got,
            (0..end).collect::<BTreeSet<u64>>(),
            "clicks bucket {b}: every offset in the topic"
        );
    }
    s.stop().await;
}
