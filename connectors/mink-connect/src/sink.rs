//! The Kafka sink: a table's changes produced to a Kafka topic as JSON in a Debezium-style
//! envelope (`before`, `after`, `op`, `ts_ms`, `source`).
//!
//! Every bucket of the table (of each of its partitions, new ones included) is tailed from its
//! position: a primary-key table's changelog, where an insert is a `c` event, an update's
//! before and after images one `u` event and a delete a `d` event followed (by default) by a
//! tombstone; or a log table's rows, each a `c` event. A primary-key table's records are keyed
//! by the primary key as a JSON object, so each key's changes land in one Kafka partition in
//! order (the partitioner is murmur2, as Java producers hash); a log table's records have no
//! key and go to partition `bucket % partitions`, keeping each bucket's order.
//!
//! Positions: once the brokers acknowledge every record of a bucket's changes below an offset
//! (`acks=all`, an idempotent producer, so retries neither duplicate nor reorder), that offset
//! is written to the connector's sink state table in Mink, and a restart resumes there. A
//! crash therefore replays, in order, the changes since the last recorded position: delivery
//! is at least once, and a consumer applying the topic by key still reaches the table's state.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use arrow::array::{Array, AsArray, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{
    DataType, Field, Int64Type, Schema, TimestampMicrosecondType, TimestampMillisecondType,
};
use futures::StreamExt as _;
use mink_client::{Client, ClientError, ErrorCode, Scan};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer as _};
use serde_json::Map;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::{Config, Sink, table_name};
use crate::metrics::Metrics;
use crate::retry::Backoff;

/// A bucket of a sink's table: (table, partition, bucket).
type BucketKey = (String, Option<String>, u32);

fn state_schema() -> Schema {
    Schema::new(vec![
        Field::new("table", DataType::Utf8, false),
        Field::new("partition", DataType::Utf8, false),
        Field::new("bucket", DataType::Int32, false),
        Field::new("position", DataType::Int64, false),
    ])
}

/// `bucket 0 of shop.t`, or `bucket 0 of partition "2026" of shop.t`.
fn bucket_name((table, partition, bucket): &BucketKey) -> String {
    match partition {
        Some(p) => format!("bucket {bucket} of partition {p:?} of {table}"),
        None => format!("bucket {bucket} of {table}"),
    }
}

/// The positions recorded for `keys` (missing: nothing produced yet).
pub(crate) async fn read_positions(
    client: &Client,
    config: &Config,
    keys: &[BucketKey],
) -> anyhow::Result<HashMap<BucketKey, u64>> {
    let (database, table) = config.sink_state_table();
    let lookup = keys
        .iter()
        .map(|(t, p, b)| {
            let mut key = Map::new();
            key.insert("table".into(), t.clone().into());
            key.insert("partition".into(), p.clone().unwrap_or_default().into());
            key.insert("bucket".into(), (*b).into());
            key
        })
        .collect();
    let batch = match client.lookup(&database, &table, lookup, &[]).await {
        Ok(b) => b,
        // Before the sink first ran.
        Err(e) if e.code() == Some(ErrorCode::NotFound) => return Ok(HashMap::new()),
        Err(e) => return Err(e.into()),
    };
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .with_context(|| format!("sink state row without {name}"))
    };
    let tables = column("table")?.as_string::<i32>();
    let partitions = column("partition")?.as_string::<i32>();
    let buckets = column("bucket")?.as_primitive::<arrow::datatypes::Int32Type>();
    let positions = column("position")?.as_primitive::<Int64Type>();
    let mut out = HashMap::new();
    for i in 0..batch.num_rows() {
        let partition = partitions.value(i);
        out.insert(
            (
                tables.value(i).to_string(),
                (!partition.is_empty()).then(|| partition.to_string()),
                u32::try_from(buckets.value(i))?,
            ),
            u64::try_from(positions.value(i))?,
        );
    }
    Ok(out)
}

async fn write_position(
    client: &Client,
    config: &Config,
    key: &BucketKey,
    position: u64,
) -> anyhow::Result<()> {
    let (database, table) = config.sink_state_table();
    let batch = RecordBatch::try_new(
        Arc::new(state_schema()),
        vec![
            Arc::new(StringArray::from(vec![key.0.as_str()])),
            Arc::new(StringArray::from(vec![
                key.1.as_deref().unwrap_or_default(),
            ])),
            Arc::new(Int32Array::from(vec![i32::try_from(key.2)?])),
            Arc::new(Int64Array::from(vec![i64::try_from(position)?])),
        ],
    )?;
    // An upsert of the same row is idempotent.
    client.plain_writer(&database, &table).write(&batch).await?;
    Ok(())
}

/// The sink state table, created when missing.
pub(crate) async fn prepare(client: &Client, config: &Config) -> anyhow::Result<()> {
    crate::state::create(
        client,
        config.sink_state_table(),
        &state_schema(),
        &["table", "partition", "bucket"],
        "mink-connect: each sink bucket's position in its changelog",
    )
    .await
}

/// A sink's table, as the bucket tails need it.
struct Target {
    sink: Sink,
    database: String,
    table: String,
    primary_key: Vec<String>,
    /// The table's columns (a log table's read asks for them and the system columns).
    columns: Vec<String>,
    /// Partitions of the topic.
    topic_partitions: i32,
}

impl Target {
    fn keyed(&self) -> bool {
        !self.primary_key.is_empty()
    }
}

fn producer_config(config: &Config) -> rdkafka::ClientConfig {
    let mut c = rdkafka::ClientConfig::new();
    c.set("bootstrap.servers", &config.kafka.bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5");
    for (k, v) in &config.kafka.config {
        c.set(k, v);
    }
    c
}

/// The topic's partition count, creating the topic (with `partitions`) when it is missing.
async fn topic_partitions(
    config: &Config,
    producer: &FutureProducer,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<i32> {
    let count = || -> anyhow::Result<Option<i32>> {
        let metadata = tokio::task::block_in_place(|| {
            producer
                .client()
                .fetch_metadata(Some(topic), Duration::from_secs(10))
        })?;
        Ok(metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| i32::try_from(t.partitions().len()).unwrap_or(i32::MAX))
            .filter(|n| *n > 0))
    };
    if let Some(n) = count()? {
        return Ok(n);
    }
    let mut admin = rdkafka::ClientConfig::new();
    admin.set("bootstrap.servers", &config.kafka.bootstrap);
    for (k, v) in &config.kafka.config {
        admin.set(k, v);
    }
    let admin: AdminClient<DefaultClientContext> =
        admin.create().context("a Kafka admin client")?;
    // The broker's default replication (KIP-464).
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    for r in admin.create_topics([&new], &AdminOptions::new()).await? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => bail!("creating topic {t}: {e}"),
        }
    }
    tracing::info!(topic, partitions, "created the sink's topic");
    count()?.with_context(|| format!("topic {topic} has no partitions after its creation"))
}

/// Runs the sinks until an error.
pub(crate) async fn run(config: Arc<Config>, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    let client = Client::connect(&config.mink).await?;
    prepare(&client, &config).await?;
    let producer: FutureProducer = producer_config(&config)
        .create()
        .context("a Kafka producer")?;
    let mut targets = Vec::new();
    for sink in &config.sinks {
        let (database, table) = table_name(&sink.table)?;
        let d = client
            .describe_table(&database, &table)
            .await
            .with_context(|| format!("sink table {}", sink.table))?;
        let partitions = sink.partitions.unwrap_or(i32::try_from(d.bucket_count)?);
        let topic_partitions =
            topic_partitions(&config, &producer, &sink.topic, partitions).await?;
        targets.push(Arc::new(Target {
            sink: sink.clone(),
            database,
            table,
            primary_key: d.primary_key.clone(),
            columns: d.columns.iter().map(|c| c.name.clone()).collect(),
            topic_partitions,
        }));
    }
    let mut tails: JoinSet<anyhow::Result<BucketKey>> = JoinSet::new();
    let mut running: HashSet<BucketKey> = HashSet::new();
    let mut backoff = Backoff::new("sink: the tables' buckets");
    loop {
        // Buckets of partitions created since the last look get their tails.
        match start_tails(
            &client,
            &producer,
            &config,
            &metrics,
            &targets,
            &mut tails,
            &mut running,
        )
        .await
        {
            Ok(()) => backoff.succeeded(),
            Err(e) => {
                backoff.failed(e).await?;
                continue;
            }
        }
        let next_look = Instant::now() + Duration::from_secs(1);
        tokio::select! {
            Some(ended) = tails.join_next() => {
                // A tail ends only when its partition is gone.
                let key = ended.context("a sink tail panicked")??;
                running.remove(&key);
            }
            _ = client.wait_for_change(Duration::from_secs(30)) => {
                tokio::time::sleep_until(next_look).await;
            }
        }
    }
}

/// Starts a tail for each bucket of the targets that has none (new partitions' buckets).
async fn start_tails(
    client: &Client,
    producer: &FutureProducer,
    config: &Arc<Config>,
    metrics: &Arc<Metrics>,
    targets: &[Arc<Target>],
    tails: &mut JoinSet<anyhow::Result<BucketKey>>,
    running: &mut HashSet<BucketKey>,
) -> anyhow::Result<()> {
    for target in targets {
        let d = client
            .describe_table(&target.database, &target.table)
            .await?;
        let mut new = Vec::new();
        for b in &d.buckets {
            let key = (target.sink.table.clone(), b.partition.clone(), b.bucket);
            metrics.sink_end(
                &key.0,
                key.1.as_deref(),
                key.2,
                i64::try_from(b.end_offset)?,
            );
            if !running.contains(&key) {
                new.push((key, b.start_offset));
            }
        }
        if new.is_empty() {
            continue;
        }
        let keys: Vec<BucketKey> = new.iter().map(|(k, _)| k.clone()).collect();
        let positions = read_positions(client, config, &keys).await?;
        for (key, start) in new {
            let recorded = positions.get(&key).copied();
            if recorded.is_none() && start > 0 {
                // A new sink starts where the log does: what retention moved out of the log
                // (into the lake, or away) is not produced.
                tracing::warn!(
                    table = %key.0,
                    partition = ?key.1,
                    bucket = key.2,
                    start,
                    "a new sink starts at the bucket's log start: its changes before that \
                     offset (only in the lake, or removed by retention) are not produced"
                );
            }
            let position = recorded.unwrap_or(start);
            if position < start {
                let (database, table) = config.sink_state_table();
                let row = serde_json::json!({
                    "table": key.0,
                    "partition": key.1.clone().unwrap_or_default(),
                    "bucket": key.2,
                    "position": start,
                });
                bail!(
                    "sink: {} starts at offset {start}, past the position {position} the sink \
                     reached: retention removed the changes between before they were produced. \
                     To go on from offset {start} without them, record that position and run \
                     the connector again: echo '{row}' | mink produce {database}.{table}",
                    bucket_name(&key)
                );
            }
            running.insert(key.clone());
            tails.spawn(tail(
                client.clone(),
                producer.clone(),
                Arc::clone(config),
                Arc::clone(metrics),
                Arc::clone(target),
                key,
                position,
            ));
        }
    }
    Ok(())
}

/// An event's record: its key, its value (none: a tombstone), its partition when the sink
/// chooses it.
struct Event {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    partition: Option<i32>,
}

/// A row as a JSON object whose values stay as the writer wrote them: a decimal's digits are
/// not read into an f64 (which turned 1234567890123456789012345678.0123456789 into 1.2e27).
type Row = std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>;

/// Rows of `batch` (the table's columns only) as JSON objects, as `mink scan -f json` writes
/// them: nulls included, durations as counts of their unit.
fn objects(batch: &RecordBatch) -> anyhow::Result<Vec<Row>> {
    let mut out = Vec::new();
    mink_log::export::json_lines(batch, &mut out)?;
    out.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice::<Row>(l).context("a row as JSON is not an object"))
        .collect()
}

/// An event's value, Debezium's envelope (keys in the order `json!` gave them).
#[derive(serde::Serialize)]
struct Envelope<'a> {
    after: Option<&'a Row>,
    before: Option<&'a Row>,
    op: &'a str,
    source: Source<'a>,
    ts_ms: Option<i64>,
}

#[derive(serde::Serialize)]
struct Source<'a> {
    bucket: u32,
    connector: &'static str,
    db: &'a str,
    offset: u64,
    partition: Option<&'a str>,
    table: &'a str,
}

/// Turns a bucket's changes into events; an update's before image waits in `held` for its
/// after image.
struct Encoder {
    target: Arc<Target>,
    partition: Option<String>,
    bucket: u32,
    /// An `update_before` row and its offset.
    held: Option<(Row, u64)>,
}

impl Encoder {
    fn envelope(
        &self,
        op: &str,
        before: Option<&Row>,
        after: Option<&Row>,
        ts_ms: Option<i64>,
        offset: u64,
    ) -> anyhow::Result<Vec<u8>> {
        Ok(serde_json::to_vec(&Envelope {
            after,
            before,
            op,
            source: Source {
                bucket: self.bucket,
                connector: "mink",
                db: &self.target.database,
                offset,
                partition: self.partition.as_deref(),
                table: &self.target.table,
            },
            ts_ms,
        })?)
    }

    fn key(&self, row: &Row) -> anyhow::Result<Vec<u8>> {
        let mut key = std::collections::BTreeMap::new();
        for c in &self.target.primary_key {
            key.insert(
                c.as_str(),
                row.get(c)
                    .with_context(|| format!("a change without its key column {c}"))?,
            );
        }
        Ok(serde_json::to_vec(&key)?)
    }

    /// Events of a changelog batch (`_change_type`, `_log_offset`, `_commit_timestamp`, the
    /// columns), and the offset below which every change is an event.
    fn changes(&mut self, batch: &RecordBatch) -> anyhow::Result<(Vec<Event>, Option<u64>)> {
        let types = batch.column(0).as_string::<i32>();
        let offsets = batch.column(1).as_primitive::<Int64Type>();
        let times = batch.column(2).as_primitive::<TimestampMillisecondType>();
        let rows = objects(&batch.project(&(3..batch.num_columns()).collect::<Vec<_>>())?)?;
        let mut events = Vec::new();
        let mut last = None;
        for (i, row) in rows.into_iter().enumerate() {
            let offset = u64::try_from(offsets.value(i))?;
            let ts = times.is_valid(i).then(|| times.value(i));
            last = Some(offset);
            let change = types.value(i);
            if let Some((_, held_at)) = &self.held
                && change != "update_after"
            {
                bail!(
                    "bucket {}: the update_before at offset {held_at} is followed by {change}, \
                     not its update_after",
                    self.bucket
                );
            }
            let (op, before, after) = match change {
                "insert" => ("c", None, Some(row)),
                "update_before" => {
                    self.held = Some((row, offset));
                    continue;
                }
                "update_after" => ("u", self.held.take().map(|(r, _)| r), Some(row)),
                "delete" => ("d", Some(row), None),
                other => bail!("bucket {}: unknown change type {other:?}", self.bucket),
            };
            let image = after.as_ref().or(before.as_ref()).expect("an image");
            let key = self.key(image)?;
            let value = self.envelope(op, before.as_ref(), after.as_ref(), ts, offset)?;
            events.push(Event {
                key: Some(key.clone()),
                value: Some(value),
                partition: None,
            });
            if op == "d" && self.target.sink.tombstones {
                events.push(Event {
                    key: Some(key),
                    value: None,
                    partition: None,
                });
            }
        }
        // A held before image is produced with its after image: the position stays at it.
        let done = match &self.held {
            Some((_, at)) => Some(*at),
            None => last.map(|o| o + 1),
        };
        Ok((events, done))
    }

    /// Events of a log read batch (the columns, then `__offset` and `__timestamp`).
    fn rows(&self, batch: &RecordBatch) -> anyhow::Result<(Vec<Event>, Option<u64>)> {
        let n = batch.num_columns();
        let offsets = batch.column(n - 2).as_primitive::<Int64Type>();
        let times = batch
            .column(n - 1)
            .as_primitive::<TimestampMicrosecondType>();
        let rows = objects(&batch.project(&(0..n - 2).collect::<Vec<_>>())?)?;
        let partition = i32::try_from(self.bucket)? % self.target.topic_partitions;
        let mut events = Vec::with_capacity(rows.len());
        let mut last = None;
        for (i, row) in rows.iter().enumerate() {
            let offset = u64::try_from(offsets.value(i))?;
            let ts = times.is_valid(i).then(|| times.value(i) / 1000);
            last = Some(offset);
            events.push(Event {
                key: None,
                value: Some(self.envelope("c", None, Some(row), ts, offset)?),
                partition: Some(partition),
            });
        }
        Ok((events, last.map(|o| o + 1)))
    }
}

/// Tails one bucket from `position`, producing its changes, until its partition is dropped.
async fn tail(
    client: Client,
    producer: FutureProducer,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
    target: Arc<Target>,
    key: BucketKey,
    mut position: u64,
) -> anyhow::Result<BucketKey> {
    let mut encoder = Encoder {
        target: Arc::clone(&target),
        partition: key.1.clone(),
        bucket: key.2,
        held: None,
    };
    let mut deliveries: VecDeque<DeliveryFuture> = VecDeque::new();
    let mut produced = 0u64;
    // Every change below `done` has been sent to the producer; below `position`, acknowledged.
    let mut done = position;
    let flush_every = Duration::from_millis(config.batch_ms);
    let mut last_flush = Instant::now();
    let mut backoff = Backoff::new(format!("sink: {}", bucket_name(&key)));
    loop {
        let mut scan = Scan::table(&target.database, &target.table)
            .bucket(key.2)
            .offset(done)
            .tail(None);
        if let Some(p) = &key.1 {
            scan = scan.partition(p);
        }
        scan = if target.keyed() {
            scan.changelog()
        } else {
            scan.columns(
                target
                    .columns
                    .iter()
                    .map(String::as_str)
                    .chain(["__offset", "__timestamp"]),
            )
        };
        encoder.held = None;
        let mut stream = match client.scan(&scan).await {
            Ok(s) => s,
            Err(e) => {
                if gone(&e, &key) {
                    return Ok(key);
                }
                backoff.failed(tailing(e, &key)).await?;
                continue;
            }
        };
        loop {
            let next = tokio::time::timeout(flush_every, stream.next()).await;
            match next {
                Ok(Some(Ok(read))) => {
                    backoff.succeeded();
                    if read.batch.num_rows() == 0 {
                        continue;
                    }
                    let (events, upto) = if target.keyed() {
                        encoder.changes(&read.batch)?
                    } else {
                        encoder.rows(&read.batch)?
                    };
                    produced += events.len() as u64;
                    for e in events {
                        send(&producer, &target.sink.topic, e, &mut deliveries).await?;
                    }
                    if let Some(upto) = upto {
                        done = upto;
                    }
                }
                Ok(Some(Err(e))) => {
                    if gone(&e, &key) {
                        return Ok(key);
                    }
                    backoff.failed(tailing(e, &key)).await?;
                    break;
                }
                Ok(None) => {
                    // The node ended the tail (it is stopping): read again shortly.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    break;
                }
                Err(_idle) => {}
            }
            if done > position && last_flush.elapsed() >= flush_every {
                // Every record sent so far acknowledged, then the position recorded.
                while let Some(d) = deliveries.pop_front() {
                    delivered(d).await?;
                }
                // A node that cannot be reached for a while: the tail waits for it, and reads
                // on from where it was.
                while let Err(e) = write_position(&client, &config, &key, done).await {
                    backoff.failed(e).await?;
                }
                metrics.sink_produced(
                    &key.0,
                    key.1.as_deref(),
                    key.2,
                    produced,
                    i64::try_from(done)?,
                );
                produced = 0;
                position = done;
                last_flush = Instant::now();
            }
        }
        // The stream ended or broke: read again from what has been sent (a held before image
        // is read again with its after image).
        if let Some((_, at)) = &encoder.held {
            done = *at;
        }
    }
}

/// Waits for a delivery report; an error ends the connector (a restart replays from the
/// recorded position).
async fn delivered(d: DeliveryFuture) -> anyhow::Result<()> {
    match d.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => bail!("producing to Kafka: {e}"),
        Err(_) => bail!("the Kafka producer dropped a delivery"),
    }
}

/// Hands an event to the producer; a full queue waits for the oldest delivery first.
async fn send(
    producer: &FutureProducer,
    topic: &str,
    e: Event,
    deliveries: &mut VecDeque<DeliveryFuture>,
) -> anyhow::Result<()> {
    loop {
        let mut record = FutureRecord::<Vec<u8>, Vec<u8>>::to(topic);
        if let Some(k) = &e.key {
            record = record.key(k);
        }
        if let Some(v) = &e.value {
            record = record.payload(v);
        }
        if let Some(p) = e.partition {
            record = record.partition(p);
        }
        match producer.send_result(record) {
            Ok(d) => {
                deliveries.push_back(d);
                return Ok(());
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                match deliveries.pop_front() {
                    Some(d) => delivered(d).await?,
                    // Other buckets' records fill the queue: give the producer a moment.
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            Err((e, _)) => bail!("producing to {topic}: {e}"),
        }
    }
}

/// Whether a failed read of a bucket says its partition was dropped (the tail ends).
fn gone(e: &ClientError, key: &BucketKey) -> bool {
    let gone = key.1.is_some() && e.code() == Some(ErrorCode::NotFound);
    if gone {
        tracing::info!(table = %key.0, partition = ?key.1, "the partition is gone: its tail ends");
    }
    gone
}

/// A failed read of a bucket, naming it.
fn tailing(e: ClientError, key: &BucketKey) -> anyhow::Error {
    anyhow::Error::from(e).context(format!("tailing {} bucket {} ({:?})", key.0, key.2, key.1))
}

#[cfg(test)]
mod tests {
    use arrow::array::TimestampMillisecondArray;
    use serde_json::{Value, json};

    use super::*;

    fn encoder(tombstones: bool) -> Encoder {
        Encoder {
            target: Arc::new(Target {
                sink: Sink {
                    table: "shop.customers".into(),
                    topic: "customers".into(),
                    partitions: None,
                    tombstones,
                },
                database: "shop".into(),
                table: "customers".into(),
                primary_key: vec!["id".into()],
                columns: vec!["id".into(), "name".into()],
                topic_partitions: 3,
            }),
            partition: None,
            bucket: 1,
            held: None,
        }
    }

    /// A changelog view batch of `(change, offset, id, name)`.
    fn changes(rows: &[(&str, i64, i64, Option<&str>)]) -> RecordBatch {
        let table = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]);
        RecordBatch::try_new(
            mink_log::changelog::view_schema(&table),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(
                    TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| 1000 + r.1))
                        .with_timezone("UTC"),
                ),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
            ],
        )
        .unwrap()
    }

    fn json(bytes: &Option<Vec<u8>>) -> Value {
        serde_json::from_slice(bytes.as_deref().unwrap()).unwrap()
    }

    /// A log table's rows go out as `mink scan -f json` writes them: a decimal with all its
    /// digits (it was read into an f64: 1.2345678901234567e+27) and a duration as its count.
    #[test]
    fn log_rows_keep_decimal_digits_and_durations_as_counts() {
        use arrow::array::{Decimal128Array, DurationMillisecondArray, TimestampMicrosecondArray};
        let schema = Arc::new(Schema::new(vec![
            Field::new("dec", DataType::Decimal128(38, 10), true),
            Field::new(
                "dur",
                DataType::Duration(arrow::datatypes::TimeUnit::Millisecond),
                true,
            ),
            Field::new("__offset", DataType::Int64, false),
            Field::new(
                "__timestamp",
                DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(
                    Decimal128Array::from(vec![
                        12_345_678_901_234_567_890_123_456_780_123_456_789_i128,
                    ])
                    .with_precision_and_scale(38, 10)
                    .unwrap(),
                ),
                Arc::new(DurationMillisecondArray::from(vec![1500])),
                Arc::new(Int64Array::from(vec![7])),
                Arc::new(TimestampMicrosecondArray::from(vec![1_000_000]).with_timezone("UTC")),
            ],
        )
        .unwrap();
        let (events, next) = encoder(false).rows(&batch).unwrap();
        assert_eq!(next, Some(8));
        let text = String::from_utf8(events[0].value.clone().unwrap()).unwrap();
        assert!(
            text.contains(r#""after":{"dec":1234567890123456789012345678.0123456789,"dur":1500}"#),
            "{text}"
        );
        assert_eq!(json(&events[0].value)["source"]["offset"], json!(7));
    }

    #[test]
    fn an_update_is_one_event_even_across_batches() {
        let mut e = encoder(true);
        let (events, done) = e
            .changes(&changes(&[
                ("insert", 10, 7, Some("a")),
                ("update_before", 11, 7, Some("a")),
            ]))
            .unwrap();
        assert_eq!(events.len(), 1);
        let c = json(&events[0].value);
        assert_eq!(c["op"], "c");
        assert_eq!(c["before"], Value::Null);
        assert_eq!(c["after"], json!({"id": 7, "name": "a"}));
        assert_eq!(c["ts_ms"], 1010);
        assert_eq!(c["source"]["offset"], 10);
        assert_eq!(json(&events[0].key), json!({"id": 7}));
        // The before image waits for its after image: the position stays at it.
        assert_eq!(done, Some(11));

        let (events, done) = e
            .changes(&changes(&[
                ("update_after", 12, 7, None),
                ("delete", 13, 7, None),
            ]))
            .unwrap();
        let ops: Vec<Value> = events
            .iter()
            .map(|e| {
                e.value
                    .as_ref()
                    .map_or(Value::Null, |_| json(&e.value)["op"].clone())
            })
            .collect();
        assert_eq!(
            ops,
            [json!("u"), json!("d"), Value::Null],
            "the delete's tombstone last"
        );
        let u = json(&events[0].value);
        assert_eq!(u["before"], json!({"id": 7, "name": "a"}));
        // Nulls are explicit: a consumer tells a null column from a missing one.
        assert_eq!(u["after"], json!({"id": 7, "name": null}));
        assert_eq!(json(&events[1].value)["after"], Value::Null);
        assert_eq!(json(&events[2].key), json!({"id": 7}));
        assert_eq!(done, Some(14));
    }

    #[test]
    fn without_before_images_or_tombstones() {
        // A `WAL` changelog has no update_before rows.
        let mut e = encoder(false);
        let (events, done) = e
            .changes(&changes(&[
                ("update_after", 3, 1, Some("x")),
                ("delete", 4, 1, Some("x")),
            ]))
            .unwrap();
        assert_eq!(events.len(), 2, "no tombstone");
        assert_eq!(json(&events[0].value)["before"], Value::Null);
        assert_eq!(done, Some(5));
    }

    #[test]
    fn a_before_image_without_its_after_image_is_an_error() {
        let mut e = encoder(true);
        let err = e
            .changes(&changes(&[
                ("update_before", 3, 1, Some("x")),
                ("insert", 4, 2, Some("y")),
            ]))
            .err()
            .unwrap();
        assert!(err.to_string().contains("offset 3"), "{err}");
    }
}
