//! The Kafka source: a consumer group over the configured topics, each source partition
//! written into its Mink table by its own idempotent writer whose sequences follow the
//! partition's offsets.
//!
//! Exactly once, across crashes: a batch of a partition's records `[first, last]` goes to each
//! bucket as one write numbered `next..=last` (the bucket's next sequence through the batch's
//! last offset), so what each bucket holds of the partition is "every record routed to it up
//! to its last sequence". After a restart the connector reads that back from Mink (the
//! writer's position per bucket), resumes the partition at the offset its state row records
//! (written only after a batch is acknowledged, so never past what is stored) and drops,
//! bucket by bucket, the replayed records a bucket already holds. Kafka's committed offsets
//! are written for monitoring only and never read.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use arrow::array::{ArrayRef, BinaryBuilder, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use mink_client::{Client, TableWriter};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers as _};
use rdkafka::{ClientContext, Message as _, Offset, TopicPartitionList};

use crate::config::{Config, Format, Source, table_name};
use crate::metrics::Metrics;
use crate::retry::{Backoff, Transient};

/// Counts rebalances, so the loop drops what it holds of partitions it may have lost; and
/// takes each partition's end from librdkafka's statistics for the metrics.
struct Context {
    generation: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

impl ClientContext for Context {
    fn stats(&self, statistics: rdkafka::Statistics) {
        for (name, topic) in &statistics.topics {
            for (id, p) in &topic.partitions {
                // librdkafka's internal unassigned partition is -1; an unknown end too.
                if *id >= 0 && p.hi_offset >= 0 {
                    self.metrics.source_end(name, *id, p.hi_offset);
                }
            }
        }
    }
}

impl ConsumerContext for Context {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        tracing::info!(?rebalance, "rebalanced");
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

pub(crate) fn consumer_config(config: &Config) -> rdkafka::ClientConfig {
    let mut c = rdkafka::ClientConfig::new();
    c.set("bootstrap.servers", &config.kafka.bootstrap)
        .set("group.id", config.group_id())
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // A restarted connector waits out its dead self's session before it gets its
        // partitions back: librdkafka's 45 s stalled every restart after a crash.
        .set("session.timeout.ms", "10000");
    for (k, v) in &config.kafka.config {
        c.set(k, v);
    }
    c
}

/// The state table's schema: per source partition, its writer and where its last
/// acknowledged batch ended.
fn state_schema() -> Schema {
    Schema::new(vec![
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("writer_id", DataType::Int64, false),
        Field::new("next_offset", DataType::Int64, false),
    ])
}

fn dead_letter_schema() -> Schema {
    Schema::new(vec![
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, false),
        Field::new("offset", DataType::Int64, false),
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new("reason", DataType::Utf8, false),
    ])
}

/// A partition's state as the state table holds it.
pub(crate) struct Stored {
    pub(crate) writer_id: u64,
    pub(crate) next_offset: Option<i64>,
}

/// The state rows of `(topic, partition)`s.
pub(crate) async fn read_state(
    client: &Client,
    config: &Config,
    keys: &[(String, i32)],
) -> anyhow::Result<HashMap<(String, i32), Stored>> {
    let (database, table) = config.state_table();
    let keys = keys
        .iter()
        .map(|(t, p)| {
            let mut key = serde_json::Map::new();
            key.insert("topic".into(), t.clone().into());
            key.insert("partition".into(), (*p).into());
            key
        })
        .collect();
    let mut out = HashMap::new();
    {
        let batch = client.lookup(&database, &table, keys, &[]).await?;
        let topics = column::<StringArray>(&batch, "topic")?;
        let partitions = column::<Int32Array>(&batch, "partition")?;
        let writers = column::<Int64Array>(&batch, "writer_id")?;
        let next = column::<Int64Array>(&batch, "next_offset")?;
        for i in 0..batch.num_rows() {
            out.insert(
                (topics.value(i).to_string(), partitions.value(i)),
                Stored {
                    writer_id: u64::try_from(writers.value(i))?,
                    next_offset: (next.value(i) >= 0).then(|| next.value(i)),
                },
            );
        }
    }
    Ok(out)
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> anyhow::Result<&'a T> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .with_context(|| format!("state row without {name}"))
}

async fn write_state(
    client: &Client,
    config: &Config,
    topic: &str,
    partition: i32,
    writer_id: u64,
    next_offset: i64,
) -> anyhow::Result<()> {
    let (database, table) = config.state_table();
    let batch = RecordBatch::try_new(
        Arc::new(state_schema()),
        vec![
            Arc::new(StringArray::from(vec![topic])),
            Arc::new(Int32Array::from(vec![partition])),
            Arc::new(Int64Array::from(vec![i64::try_from(writer_id)?])),
            Arc::new(Int64Array::from(vec![next_offset])),
        ],
    )?;
    // An upsert of the same row is idempotent: no writer id (which would cost a metadata
    // command per batch) is needed.
    client.plain_writer(&database, &table).write(&batch).await?;
    Ok(())
}

/// Creates what the connector writes to when it is missing: its state table, raw tables,
/// dead-letter tables. A json source's table must exist (its schema is the user's).
async fn prepare(client: &Client, config: &Config) -> anyhow::Result<()> {
    crate::state::create(
        client,
        config.state_table(),
        &state_schema(),
        &["topic", "partition"],
        "mink-connect: each source partition's writer and resume offset",
    )
    .await?;
    for s in &config.sources {
        let (database, table) = table_name(&s.table)?;
        match s.format {
            Format::Raw => {
                client.create_database(&database, true).await?;
                client
                    .create_table(
                        &database,
                        &table,
                        &mink_log::raw::schema(),
                        Vec::<(String, String)>::new(),
                        &[],
                        true,
                    )
                    .await?;
                same_columns(client, &s.table, &mink_log::raw::schema())
                    .await
                    .with_context(|| format!("source {}: a raw source's table", s.topic))?;
            }
            // There already: `existing_tables` checked it.
            Format::Json => {}
        }
        if let Some(d) = &s.dead_letter {
            let (database, table) = table_name(d)?;
            client.create_database(&database, true).await?;
            client
                .create_table(
                    &database,
                    &table,
                    &dead_letter_schema(),
                    Vec::<(String, String)>::new(),
                    &[],
                    true,
                )
                .await?;
            same_columns(client, d, &dead_letter_schema())
                .await
                .with_context(|| format!("source {}: its dead_letter table", s.topic))?;
        }
    }
    Ok(())
}

/// Fails unless `table` (created here, or there already) has `schema`'s columns: one made
/// for something else failed the first write, naming no table, after rows were written.
async fn same_columns(client: &Client, table: &str, schema: &Schema) -> anyhow::Result<()> {
    let (database, name) = table_name(table)?;
    let d = client.describe_table(&database, &name).await?;
    let have = d.arrow_schema().map_err(|e| anyhow::anyhow!("{e}"))?;
    let columns = |s: &Schema| -> Vec<(String, DataType)> {
        s.fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect()
    };
    anyhow::ensure!(
        columns(&have) == columns(schema),
        "{table} exists with other columns ({}) than the ones written to it ({})",
        mink_log::codec::columns_of(&have),
        mink_log::codec::columns_of(schema)
    );
    Ok(())
}

/// One source partition being copied.
struct Partition {
    source: Source,
    writer_id: u64,
    rows: TableWriter,
    dead: Option<TableWriter>,
    /// The offset the next record is expected at.
    next: i64,
    pending: Vec<Pending>,
    since: Option<Instant>,
}

/// A record waiting for its batch.
struct Pending {
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp_ms: i64,
}

fn pending(m: &BorrowedMessage<'_>) -> Pending {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    Pending {
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
        timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
    }
}

/// Records as rows of the raw schema.
fn raw_rows(records: &[Pending]) -> anyhow::Result<RecordBatch> {
    let headers: Vec<Vec<mink_log::raw::Header<'_>>> = records
        .iter()
        .map(|r| {
            r.headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_deref()))
                .collect()
        })
        .collect();
    Ok(mink_log::raw::rows(records.iter().zip(&headers).map(
        |(r, h)| mink_log::raw::Record {
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers: h,
            timestamp_ms: r.timestamp_ms,
        },
    ))?)
}

/// Records split: the rows (and their offsets) and the records that are not rows, with why.
struct Split {
    rows: Option<RecordBatch>,
    offsets: Vec<i64>,
    rejected: Vec<(usize, String)>,
}

/// JSON values as rows of `schema`, and the records that are not, with the reason.
fn json_rows(schema: &SchemaRef, records: &[Pending]) -> anyhow::Result<Split> {
    let mut good: Vec<usize> = (0..records.len()).collect();
    let mut bad = Vec::new();
    loop {
        if good.is_empty() {
            return Ok(Split {
                rows: None,
                offsets: Vec::new(),
                rejected: bad,
            });
        }
        let values: Vec<Option<&[u8]>> =
            good.iter().map(|&i| records[i].value.as_deref()).collect();
        match mink_log::json::rows(schema, &values) {
            Ok(rows) => {
                let offsets = good.iter().map(|&i| records[i].offset).collect();
                bad.sort_unstable_by_key(|(i, _)| *i);
                return Ok(Split {
                    rows: Some(rows),
                    offsets,
                    rejected: bad,
                });
            }
            Err(e) if e.index < good.len() => {
                bad.push((good.remove(e.index), e.reason));
            }
            Err(e) => bail!("decoding JSON rows: {}", e.reason),
        }
    }
}

fn dead_rows(
    topic: &str,
    partition: i32,
    records: &[Pending],
    bad: &[(usize, String)],
) -> anyhow::Result<RecordBatch> {
    let pick = |f: &dyn Fn(&Pending) -> Option<Vec<u8>>| -> ArrayRef {
        let mut b = BinaryBuilder::new();
        for (i, _) in bad {
            b.append_option(f(&records[*i]));
        }
        Arc::new(b.finish())
    };
    Ok(RecordBatch::try_new(
        Arc::new(dead_letter_schema()),
        vec![
            Arc::new(StringArray::from(vec![topic; bad.len()])),
            Arc::new(Int32Array::from(vec![partition; bad.len()])),
            Arc::new(Int64Array::from_iter_values(
                bad.iter().map(|(i, _)| records[*i].offset),
            )),
            pick(&|r| r.key.clone()),
            pick(&|r| r.value.clone()),
            Arc::new(StringArray::from_iter_values(
                bad.iter().map(|(_, why)| why.as_str()),
            )),
        ],
    )?)
}

/// The rows of a json source's records written so far need its table's schema.
async fn table_schema(client: &Client, table: &str) -> anyhow::Result<SchemaRef> {
    let (database, table) = table_name(table)?;
    Ok(Arc::new(client.schema(&database, &table).await?))
}

/// A writer following `writer_id`'s sequences in `table`, at the positions Mink holds.
async fn following(client: &Client, table: &str, writer_id: u64) -> anyhow::Result<TableWriter> {
    let (database, name) = table_name(table)?;
    let positions = client.writer_positions(&database, &name, writer_id).await?;
    Ok(TableWriter::following(
        client.clone(),
        &database,
        &name,
        mink_flight::protocol::Writer {
            writer_id,
            // The cluster allocates writers at epoch 0, and they keep it.
            writer_epoch: 0,
        },
        &positions,
    ))
}

/// Runs the source until an error that is not transient (a record Mink refuses for a reason
/// other than its content, a record that is not a row without a dead-letter table). A node
/// or brokers that cannot be reached for a while are waited for (see [`crate::retry`]).
pub(crate) async fn run(config: Arc<Config>, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    let client = Client::connect(&config.mink).await?;
    prepare(&client, &config).await?;
    let generation = Arc::new(AtomicU64::new(0));
    let mut kafka = consumer_config(&config);
    if config.metrics.is_some() {
        kafka.set("statistics.interval.ms", "1000");
    }
    let consumer: StreamConsumer<Context> = kafka
        .create_with_context(Context {
            generation: Arc::clone(&generation),
            metrics: Arc::clone(&metrics),
        })
        .context("a Kafka consumer")?;
    let topics: Vec<&str> = config.sources.iter().map(|s| s.topic.as_str()).collect();
    consumer.subscribe(&topics)?;
    let mut copier = Copier {
        client,
        config: &config,
        metrics: &metrics,
        consumer: &consumer,
        schemas: HashMap::new(),
        partitions: HashMap::new(),
        reopen: BTreeSet::new(),
        opened: HashMap::new(),
        positions_read: None,
    };
    let mut seen_generation = generation.load(Ordering::SeqCst);
    let batch_age = Duration::from_millis(config.batch_ms);
    let mut backoff = Backoff::new("source: copying into Mink");
    loop {
        let message = tokio::time::timeout(batch_age, consumer.recv()).await;
        let now_generation = generation.load(Ordering::SeqCst);
        if now_generation != seen_generation {
            // Partitions may have moved: what is buffered is dropped (nothing of it was
            // acknowledged), and each partition starts again from what Mink holds.
            seen_generation = now_generation;
            copier.partitions.clear();
            copier.reopen.clear();
            copier.opened.clear();
            // Sought at once, not on their first record: a partition whose group offset (or
            // `auto.offset.reset`) starts past Mink's copy would deliver none to seek on.
            copier.reopen.extend(assigned(&consumer, &config));
        }
        let message = match message {
            Ok(Ok(m)) => Some(m),
            // librdkafka reconnects by itself: said, and waited for.
            Ok(Err(e)) if crate::retry::kafka_transient(&e) => {
                // One broker down of several is not an outage of them all: said as it is.
                let what = match e.rdkafka_error_code() {
                    Some(rdkafka::error::RDKafkaErrorCode::AllBrokersDown) => {
                        "no broker can be reached"
                    }
                    _ => "a broker or partition leader cannot be reached",
                };
                tracing::warn!(error = %e, "consuming: {what}; librdkafka retries");
                None
            }
            Ok(Err(e)) => return Err(e).context("consuming"),
            Err(_idle) => None,
        };
        let ours = message
            .as_ref()
            .map(|m| (m.topic().to_string(), m.partition()))
            .filter(|k| config.source(&k.0).is_some());
        let mut result = Ok(());
        match copier.reopen().await {
            Err(e) => result = Err(e),
            // A message consumed before its partition was sought back is not taken: the seek
            // delivers it again, after the records below it that were lost with the failed
            // batch. Taken now, it would move the partition past them, and they would be
            // dropped as stored already when they came again (a record was lost so).
            Ok(reopened) => {
                if let Some(m) = &message
                    && let key = (m.topic().to_string(), m.partition())
                    && !reopened.contains(&key)
                    && !copier.reopen.contains(&key)
                {
                    result = copier.take(m).await;
                }
            }
        }
        if result.is_ok() {
            result = copier.flush_due(batch_age).await;
        }
        match result {
            Ok(()) => backoff.succeeded(),
            Err(e) => {
                backoff.failed(e).await?;
                // Nothing buffered was acknowledged, and a batch may be stored in some buckets
                // and not others: as after a crash, each partition (the message's too) starts
                // again from what Mink holds.
                copier.failed(ours);
            }
        }
    }
}

/// The source's partitions being copied.
struct Copier<'a> {
    client: Client,
    config: &'a Config,
    metrics: &'a Metrics,
    consumer: &'a StreamConsumer<Context>,
    schemas: HashMap<String, SchemaRef>,
    partitions: HashMap<(String, i32), Partition>,
    /// Partitions whose copying failed, or just assigned: each is opened again from Mink,
    /// and the consumer sought back to where Mink's copy ends, before anything else is copied.
    reopen: BTreeSet<(String, i32)>,
    /// Partitions of `reopen` opened whose seek librdkafka could not take yet.
    opened: HashMap<(String, i32), Partition>,
    /// When the metrics last took the positions of partitions not copied since the start.
    positions_read: Option<Instant>,
}

impl Copier<'_> {
    /// Every partition, and `also`, to be opened again from Mink.
    fn failed(&mut self, also: Option<(String, i32)>) {
        self.reopen.extend(self.partitions.drain().map(|(k, _)| k));
        self.reopen.extend(also);
        self.opened.clear();
    }

    /// Opens again the partitions of `reopen`; answers which. One whose fetcher librdkafka
    /// has not started yet (just assigned, the group's offsets for it on their way) takes no
    /// seek: it stays for a later call, and a record it delivers meanwhile is not taken.
    async fn reopen(&mut self) -> anyhow::Result<BTreeSet<(String, i32)>> {
        let mut reopened = BTreeSet::new();
        for key in self.reopen.clone() {
            let p = match self.opened.remove(&key) {
                Some(p) => p,
                None => {
                    let source = self
                        .config
                        .source(&key.0)
                        .cloned()
                        .with_context(|| format!("no source copies topic {}", key.0))?;
                    open(&self.client, self.config, &source, key.1).await?
                }
            };
            match seek(self.consumer, &key, p.next) {
                Ok(()) => {}
                Err(e) if not_fetching(&e) => {
                    self.opened.insert(key, p);
                    continue;
                }
                Err(e) => return Err(e),
            }
            self.metrics.source_position(&key.0, key.1, p.next);
            tracing::info!(topic = %key.0, partition = key.1, resume = p.next, "copying again");
            self.partitions.insert(key.clone(), p);
            self.reopen.remove(&key);
            reopened.insert(key);
        }
        Ok(reopened)
    }

    /// A consumed record into its partition's batch.
    async fn take(&mut self, m: &BorrowedMessage<'_>) -> anyhow::Result<()> {
        let key = (m.topic().to_string(), m.partition());
        if !self.partitions.contains_key(&key) {
            let Some(source) = self.config.source(&key.0).cloned() else {
                return Ok(());
            };
            let state = open(&self.client, self.config, &source, key.1).await?;
            // Resume where Mink says, whatever Kafka's committed offset is.
            let resume = state.next;
            self.metrics.source_position(&key.0, key.1, resume);
            self.partitions.insert(key.clone(), state);
            if m.offset() != resume {
                tracing::info!(topic = %key.0, partition = key.1, from = m.offset(), resume, "seeking to the resume offset");
                return seek(self.consumer, &key, resume);
            }
        }
        let p = self.partitions.get_mut(&key).expect("opened above");
        if m.offset() < p.next {
            // Below where the partition resumed (a seek not yet in effect): stored already.
            return Ok(());
        }
        p.next = m.offset() + 1;
        p.pending.push(pending(m));
        p.since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Writes the batches that are full or old enough.
    async fn flush_due(&mut self, batch_age: Duration) -> anyhow::Result<()> {
        for ((topic, partition), p) in &mut self.partitions {
            let full = p.pending.len() >= self.config.batch_records;
            let old = p.since.is_some_and(|s| s.elapsed() >= batch_age);
            if p.pending.is_empty() || !(full || old) {
                continue;
            }
            let records = p.pending.len() as u64;
            flush(
                &self.client,
                self.config,
                &mut self.schemas,
                topic,
                *partition,
                p,
            )
            .await?;
            self.metrics
                .source_written(topic, *partition, records, p.next);
            let mut offsets = TopicPartitionList::new();
            offsets.add_partition_offset(topic, *partition, Offset::Offset(p.next))?;
            // For lag monitoring only: a resume reads Mink.
            let _ = self.consumer.commit(&offsets, CommitMode::Async);
        }
        self.read_positions().await
    }

    /// The positions of partitions whose end the metrics know but which have not been copied
    /// since the start (all copied already, say), from the state table: so their lag is shown,
    /// and shown right.
    async fn read_positions(&mut self) -> anyhow::Result<()> {
        if self
            .positions_read
            .is_some_and(|at| at.elapsed() < Duration::from_secs(5))
        {
            return Ok(());
        }
        let keys = self.metrics.sources_without_position();
        if !keys.is_empty() {
            for ((topic, partition), stored) in read_state(&self.client, self.config, &keys).await?
            {
                if let Some(next) = stored.next_offset {
                    self.metrics.source_position(&topic, partition, next);
                }
            }
            self.positions_read = Some(Instant::now());
        }
        Ok(())
    }
}

/// The partitions of the sources' topics the consumer is assigned now.
fn assigned(consumer: &StreamConsumer<Context>, config: &Config) -> Vec<(String, i32)> {
    match consumer.assignment() {
        Ok(list) => list
            .elements()
            .iter()
            .filter(|e| config.source(e.topic()).is_some())
            .map(|e| (e.topic().to_string(), e.partition()))
            .collect(),
        Err(e) => {
            // Each partition then starts on its first record, as before a rebalance.
            tracing::warn!(error = %e, "reading the consumer's assignment");
            Vec::new()
        }
    }
}

/// Whether a [`seek`] failed because the partition is not being fetched yet (librdkafka's
/// `__STATE`, "Erroneous state").
fn not_fetching(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Transient>()
        .is_some_and(|t| t.0.contains("Erroneous state"))
}

/// Seeks the consumer's `key` partition to `offset`; a failure is retried (see
/// [`crate::retry`]).
fn seek(
    consumer: &StreamConsumer<Context>,
    key: &(String, i32),
    offset: i64,
) -> anyhow::Result<()> {
    // A seek waits on librdkafka: off the runtime's workers.
    tokio::task::block_in_place(|| {
        consumer.seek(
            &key.0,
            key.1,
            Offset::Offset(offset),
            Duration::from_secs(10),
        )
    })
    .map_err(|e| {
        anyhow::Error::new(Transient(format!(
            "seeking {}/{} to {offset}: {e}",
            key.0, key.1
        )))
    })
}

/// A partition opened from Mink: its writer (allocated and recorded on first use) and the
/// offset to resume at.
async fn open(
    client: &Client,
    config: &Config,
    source: &Source,
    partition: i32,
) -> anyhow::Result<Partition> {
    let key = (source.topic.clone(), partition);
    let stored = read_state(client, config, std::slice::from_ref(&key)).await?;
    let (writer_id, next) = match stored.get(&key) {
        Some(s) => (s.writer_id, s.next_offset),
        None => {
            let w = client.allocate_writer().await?;
            // Recorded before any row is written with it.
            write_state(client, config, &source.topic, partition, w.writer_id, -1).await?;
            (w.writer_id, None)
        }
    };
    let rows = following(client, &source.table, writer_id).await?;
    let dead = match &source.dead_letter {
        Some(d) => Some(following(client, d, writer_id).await?),
        None => None,
    };
    // No batch acknowledged yet: from the partition's start.
    let next = next.unwrap_or_default();
    Ok(Partition {
        source: source.clone(),
        writer_id,
        rows,
        dead,
        next,
        pending: Vec::new(),
        since: None,
    })
}

/// Writes a partition's pending records (and its rejected ones to the dead-letter table),
/// then records where the batch ended.
async fn flush(
    client: &Client,
    config: &Config,
    schemas: &mut HashMap<String, SchemaRef>,
    topic: &str,
    partition: i32,
    p: &mut Partition,
) -> anyhow::Result<()> {
    let records = std::mem::take(&mut p.pending);
    p.since = None;
    let last = records.last().map_or(p.next - 1, |r| r.offset);
    let last_u = u64::try_from(last)?;
    match p.source.format {
        Format::Raw => {
            let rows = raw_rows(&records)?;
            let offsets: Vec<u64> = records.iter().map(|r| r.offset as u64).collect();
            p.rows.write_following(&rows, &offsets, last_u).await?;
        }
        Format::Json => {
            let schema = match schemas.get(&p.source.table) {
                Some(s) => Arc::clone(s),
                None => {
                    let s = table_schema(client, &p.source.table).await?;
                    schemas.insert(p.source.table.clone(), Arc::clone(&s));
                    s
                }
            };
            let Split {
                rows: good,
                offsets,
                rejected: bad,
            } = json_rows(&schema, &records)?;
            if let Some(rows) = good {
                let offsets: Vec<u64> = offsets.iter().map(|o| *o as u64).collect();
                p.rows.write_following(&rows, &offsets, last_u).await?;
            }
            if !bad.is_empty() {
                let Some(dead) = p.dead.as_mut() else {
                    let (i, why) = &bad[0];
                    bail!(
                        "{topic}/{partition} offset {}: {why}; and the source has no dead_letter table",
                        records[*i].offset
                    );
                };
                let rows = dead_rows(topic, partition, &records, &bad)?;
                let offsets: Vec<u64> =
                    bad.iter().map(|(i, _)| records[*i].offset as u64).collect();
                dead.write_following(&rows, &offsets, last_u).await?;
            }
        }
    }
    write_state(client, config, topic, partition, p.writer_id, last + 1).await
}
