//! A Mink node that restarts under running connectors: the connectors wait for it and go on
//! from where they were. A source copies a topic of the node's own Kafka listener into a
//! table of the node (both of its sides go away at once); a sink produces that table to a
//! topic of a second node (a broker that stays up). Records produced before and after the
//! restart are each in the table once and in the sink's topic once, and neither connector
//! exits. Then a fresh start of the source shows no lag for partitions it has nothing left
//! to copy of.

use std::collections::BTreeMap;
use std::time::Duration;

use arrow::array::AsArray as _;
use mink_node::{BucketRef, Node, NodeConfig};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tokio::io::AsyncBufReadExt as _;

mod common;
use common::{connect, next_change};

/// A node serving Flight and Kafka on fixed addresses, so it can restart on them.
async fn serve_at(dir: &std::path::Path, flight: &str, kafka: &str) -> mink_testkit::Served {
    let mut c = NodeConfig::new(
        1,
        &format!("sqlite://{}", dir.join("meta.db").display()),
        dir.join("objects").to_str().unwrap(),
    );
    c.engine.flush_delay = Duration::from_millis(5);
    c.leadership_interval = Duration::from_millis(20);
    c.lease_ttl = Duration::from_millis(1000);
    let config = mink_kafka::KafkaConfig {
        initial_rebalance_delay: Duration::ZERO,
        ..Default::default()
    };
    mink_testkit::serve_node_at(c, config, flight, kafka).await
}

/// A free loopback address.
fn free_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A connector's stderr, line by line, kept for the failure messages.
struct Logged {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Logged {
    fn run(config: &str) -> Logged {
        Logged::spawn(connect(&["run", "--config", config]))
    }

    fn spawn(mut command: tokio::process::Command) -> Logged {
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut r = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = r.next_line().await {
                let _ = tx.send(line);
            }
        });
        Logged {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a logged line containing `text`.
    async fn logs(&mut self, text: &str, deadline: tokio::time::Instant) {
        while !self.seen.iter().any(|l| l.contains(text)) {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => self.seen.push(line),
                Ok(None) => panic!(
                    "the connector ended its log ({:?}) before logging {text:?}:\n{}",
                    self.child.try_wait(),
                    self.seen.join("\n")
                ),
                Err(_) => panic!(
                    "waited for the connector to log {text:?}; it logged:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Panics, with its log, if the connector has exited.
    fn running(&mut self, what: &str) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "the {what} connector exited ({status}):\n{}",
                self.seen.join("\n")
            );
        }
    }
}

/// Rows of `shop.events` stored (committed offsets of its buckets).
fn stored_rows(node: &Node) -> u64 {
    let Ok(info) = node.describe_table("shop", "events") else {
        return 0;
    };
    info.buckets
        .iter()
        .map(|b| {
            let (start, end) = node
                .bucket_offsets(&BucketRef::new("shop", "events", None, b.bucket))
                .unwrap();
            end - start
        })
        .sum()
}

/// Each bucket's end of `shop.events`, and the sink's recorded positions.
async fn sink_progress(
    node: &Node,
    client: &mink_client::Client,
) -> (BTreeMap<i32, i64>, BTreeMap<i32, i64>) {
    let info = node.describe_table("shop", "events").unwrap();
    let ends = info
        .buckets
        .iter()
        .map(|b| {
            let (_, end) = node
                .bucket_offsets(&BucketRef::new("shop", "events", None, b.bucket))
                .unwrap();
            (b.bucket as i32, end as i64)
        })
        .collect();
    let mut positions = BTreeMap::new();
    let read = match client
        .scan_all(&mink_client::Scan::table("mink_connect", "snk_sink"))
        .await
    {
        Ok(read) => read,
        Err(e) if e.is_retriable() || e.code() == Some(mink_client::ErrorCode::NotFound) => {
            return (ends, positions);
        }
        Err(e) => panic!("reading the sink state: {e}"),
    };
    for r in read {
        let b = &r.batch;
        let buckets = b
            .column_by_name("bucket")
            .unwrap()
            .as_primitive::<arrow::datatypes::Int32Type>();
        let pos = b
            .column_by_name("position")
            .unwrap()
            .as_primitive::<arrow::datatypes::Int64Type>();
        for i in 0..b.num_rows() {
            positions.insert(buckets.value(i), pos.value(i));
        }
    }
    (ends, positions)
}

/// Produces `range` to topic `in` as `value-<i>`, every record acknowledged.
async fn produce(bootstrap: &str, range: std::ops::Range<usize>) {
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "2")
        .create()
        .unwrap();
    let mut deliveries = Vec::new();
    for i in range {
        let (key, value) = (format!("k{i}"), format!("value-{i}"));
        let record = FutureRecord::to("in").key(&key).payload(&value);
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
    }
    for d in deliveries {
        d.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
}

/// Every value of topic `out` at `bootstrap`, as the sink's (bucket, offset) and the row's
/// value column, once `expected` messages are there.
fn consume_out(bootstrap: &str, expected: usize) -> Vec<((u64, u64), String)> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "restart-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some("out"), timeout).unwrap();
    let mut assignment = TopicPartitionList::new();
    let mut total = 0;
    for p in metadata.topics()[0].partitions() {
        let (low, high) = consumer.fetch_watermarks("out", p.id(), timeout).unwrap();
        total += high - low;
        assignment
            .add_partition_offset("out", p.id(), Offset::Offset(low))
            .unwrap();
    }
    assert_eq!(
        usize::try_from(total).unwrap(),
        expected,
        "messages in topic out: every row once"
    );
    consumer.assign(&assignment).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.len() < expected {
        assert!(
            std::time::Instant::now() < deadline,
            "waited 60 s to read {expected} messages of topic out, read {}",
            out.len()
        );
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m.unwrap();
        let event: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
        let value = event["after"]["value"].as_str().unwrap().to_string();
        out.push((
            (
                event["source"]["bucket"].as_u64().unwrap(),
                event["source"]["offset"].as_u64().unwrap(),
            ),
            value,
        ));
    }
    out
}

/// `GET /metrics` of a connector.
async fn metrics(address: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut s) = tokio::net::TcpStream::connect(address).await else {
        return String::new();
    };
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connectors_wait_for_a_restarting_node_and_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (flight, kafka) = (free_address(), free_address());
    let a = serve_at(dir.path(), &flight, &kafka).await;
    let broker_dir = tempfile::tempdir().unwrap();
    let (broker_flight, broker) = (free_address(), free_address());
    let b = serve_at(broker_dir.path(), &broker_flight, &broker).await;

    let client = mink_client::Client::connect(&flight).await.unwrap();
    client.create_database("shop", false).await.unwrap();
    client
        .create_table(
            "shop",
            "events",
            &mink_log::raw::schema(),
            [("bucket.num", "2")],
            &[],
            false,
        )
        .await
        .unwrap();
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &kafka)
        .create()
        .unwrap();
    for r in admin
        .create_topics(
            &[NewTopic::new("in", 2, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        r.unwrap();
    }
    drop(admin);

    let metrics_address = free_address();
    let source_config = dir.path().join("source.toml");
    std::fs::write(
        &source_config,
        format!(
            r#"
name = "src"
mink = "{flight}"
batch_records = 300
batch_ms = 20
metrics = "{metrics_address}"

[kafka]
bootstrap = "{kafka}"
config = {{ "session.timeout.ms" = "2000", "heartbeat.interval.ms" = "200" }}

[[source]]
topic = "in"
table = "shop.events"
format = "raw"
"#
        ),
    )
    .unwrap();
    let sink_config = dir.path().join("sink.toml");
    std::fs::write(
        &sink_config,
        format!(
            r#"
name = "snk"
mink = "{flight}"
batch_ms = 20

[kafka]
bootstrap = "{broker}"

[[sink]]
table = "shop.events"
topic = "out"
"#
        ),
    )
    .unwrap();
    let source_config = source_config.to_str().unwrap().to_string();
    let sink_config = sink_config.to_str().unwrap().to_string();
    let mut source = Logged::run(&source_config);
    let mut sink = Logged::run(&sink_config);

    const BEFORE: usize = 3000;
    const AFTER: usize = 2000;
    produce(&kafka, 0..BEFORE).await;
    // Copying has begun.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while stored_rows(&a.node) < 500 {
        source.running("source");
        assert!(
            next_change(&a.node, deadline).await,
            "waited 60 s for the source to copy 500 records, have {}",
            stored_rows(&a.node)
        );
    }

    // The node goes away; both connectors notice and wait for it.
    a.stop_under_clients().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    source.logs("retrying", deadline).await;
    sink.logs("retrying", deadline).await;
    source.running("source");
    sink.running("sink");
    let a = serve_at(dir.path(), &flight, &kafka).await;
    produce(&kafka, BEFORE..BEFORE + AFTER).await;

    // Everything arrives: in the table, then in the sink's topic.
    let total = (BEFORE + AFTER) as u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        source.running("source");
        sink.running("sink");
        let rows = stored_rows(&a.node);
        assert!(rows <= total, "{rows} rows of {total} records");
        let (ends, positions) = sink_progress(&a.node, &client).await;
        // A bucket without rows has no position to record.
        if rows == total
            && ends
                .iter()
                .all(|(b, end)| positions.get(b).copied().unwrap_or(0) == *end)
        {
            break;
        }
        assert!(
            next_change(&a.node, deadline).await,
            "waited 120 s for {total} rows (have {rows}) and the sink's positions {positions:?} at \
             the ends {ends:?}"
        );
    }
    source.running("source");
    sink.running("sink");

    // Exactly once in the table.
    let mut values: BTreeMap<String, usize> = BTreeMap::new();
    for r in client
        .scan_all(&mink_client::Scan::table("shop", "events"))
        .await
        .unwrap()
    {
        for v in r.batch.column_by_name("value").unwrap().as_binary::<i32>() {
            *values
                .entry(String::from_utf8(v.unwrap().to_vec()).unwrap())
                .or_default() += 1;
        }
    }
    assert_eq!(values.len(), BEFORE + AFTER, "every record in the table");
    assert!(values.values().all(|n| *n == 1), "a record stored twice");

    // Once in the sink's topic: each change of the table once.
    let out = tokio::task::spawn_blocking({
        let broker = broker.clone();
        move || consume_out(&broker, BEFORE + AFTER)
    })
    .await
    .unwrap();
    let mut changes = BTreeMap::new();
    for (at, value) in out {
        assert!(
            changes.insert(at, value).is_none(),
            "the change at {at:?} produced twice"
        );
    }
    let produced: std::collections::BTreeSet<String> = changes.into_values().collect();
    assert_eq!(produced.len(), BEFORE + AFTER, "every row in topic out");

    // A fresh start of the source, with nothing left to copy: no lag, not the partitions'
    // ends.
    source.child.kill().await.unwrap();
    let mut fresh = connect(&["run", "--config", &source_config]);
    fresh.env("RUST_LOG", "warn,mink_connect::metrics=info");
    let mut source = Logged::spawn(fresh);
    // The metrics log when they first know each partition's end and position: the lag is
    // shown from then on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for p in 0..2 {
        for what in ["end known", "position read from Mink"] {
            source
                .logs(&format!("{what} topic=in partition={p}"), deadline)
                .await;
        }
    }
    let scraped = metrics(&metrics_address).await;
    let lags: Vec<&str> = scraped
        .lines()
        .filter(|l| l.starts_with("mink_connect_source_lag{"))
        .collect();
    assert!(
        lags.len() == 2 && lags.iter().all(|l| l.ends_with(" 0")),
        "no lag on both partitions of topic in:\n{scraped}"
    );
    source.child.kill().await.unwrap();
    sink.child.kill().await.unwrap();
    a.stop_under_clients().await;
    b.stop_under_clients().await;
}
