//! The workload over the Kafka protocol with librdkafka (rdkafka): any Kafka-compatible broker
//! by bootstrap address. Producers pipeline records as librdkafka batches them; latency is
//! from when a record was due to its delivery report. Consumers are assigned the partitions
//! (no group coordination in the measurement).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, ThreadedProducer,
};
use rdkafka::{Message as _, Offset, TopicPartitionList};

use super::{Args, Mode, Pacer, Shared, fill_random, now_us};

/// A producer's bytes in flight when `--in-flight-bytes` is not given.
const DEFAULT_IN_FLIGHT_BYTES: usize = 8 << 20;
/// How long metadata and admin requests may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the first metadata request may take: an unreachable broker fails the run soon.
const REACH_TIMEOUT: Duration = Duration::from_secs(10);

/// The first error librdkafka reported (a refused connection, say), to say why a broker could
/// not be reached. Reported on the client's queue: read by polling it.
#[derive(Default)]
struct Reach {
    first: Mutex<Option<String>>,
}

impl Reach {
    fn note(&self, message: &str) {
        // Without the log line's `[thrd:…]: ` prefix.
        let message = message
            .strip_prefix("[thrd:")
            .and_then(|m| m.split_once("]: "))
            .map_or(message, |(_, m)| m);
        self.first
            .lock()
            .expect("error lock")
            .get_or_insert_with(|| message.to_string());
    }
}

impl ClientContext for Reach {
    fn log(&self, level: RDKafkaLogLevel, _: &str, message: &str) {
        if (level as i32) <= (RDKafkaLogLevel::Error as i32) {
            self.note(message);
        }
    }

    fn error(&self, _: KafkaError, reason: &str) {
        self.note(reason);
    }
}

impl ConsumerContext for Reach {}

fn config(args: &Args) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set(
        "bootstrap.servers",
        args.kafka.as_deref().unwrap_or_default(),
    );
    for (k, v) in &args.kafka_config {
        c.set(k, v);
    }
    c
}

pub(super) async fn run(
    mode: Mode,
    args: &Args,
    start: Instant,
    produced: &Shared,
    consumed: &Shared,
    found: &OnceLock<usize>,
) -> anyhow::Result<usize> {
    let probe: BaseConsumer<Reach> = config(args)
        .set("group.id", "mink-bench")
        .create_with_context(Reach::default())
        .context("a Kafka consumer")?;
    // librdkafka's metadata calls block their thread: off the runtime's workers, which may be
    // serving the broker itself (the kafka suite runs a node in this process).
    tokio::task::block_in_place(|| probe.fetch_metadata(Some(&args.topic), REACH_TIMEOUT))
        .map_err(|e| {
            // librdkafka's own error (a refused connection, say) says more than the timeout.
            let until = Instant::now() + Duration::from_millis(100);
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                let _ = probe.poll(left);
            }
            let cause = probe.context().first.lock().expect("error lock").take();
            anyhow::anyhow!(
                "cannot reach a Kafka broker at {}: {}",
                args.address(),
                cause.unwrap_or_else(|| e.to_string())
            )
        })?;
    if mode != Mode::Consume {
        create_topic(args).await?;
    }
    let metadata =
        tokio::task::block_in_place(|| probe.fetch_metadata(Some(&args.topic), REQUEST_TIMEOUT))
            .context("topic metadata")?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == args.topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        bail!("topic {} has no partitions (does it exist?)", args.topic);
    }
    let _ = found.set(partitions.len());
    // Where each partition starts and ends now: a consume run reads what is between (the start
    // is above 0 once retention removed some), an e2e run from the end on. Asked here, before the
    // clock starts: a consumer catching up does not ask, and the 8 requests each consumer made
    // of a node busy serving the others' fetches held its start back by up to 0.4 s of a 3 s
    // read.
    let mut ends = Vec::with_capacity(partitions.len());
    for p in &partitions {
        let (low, high) = tokio::task::block_in_place(|| {
            probe.fetch_watermarks(&args.topic, *p, REQUEST_TIMEOUT)
        })
        .with_context(|| format!("the watermarks of partition {p}"))?;
        ends.push((*p, low, high));
    }
    let mut shares = Vec::new();
    if mode != Mode::Produce {
        for c in 0..args.consumers {
            let mine = super::share_of(&ends, args.consumers, c);
            if !mine.is_empty() {
                shares.push((connect_consumer(args)?, mine));
            }
        }
    }
    // The run's clock starts once the topic is ready and the consumers connected: setup is not
    // measured.
    let start = super::restart(start, produced, consumed);
    let deadline = start + args.duration();
    let mut consumers = Vec::new();
    for (consumer, mine) in shares {
        consumers.push(tokio::spawn(consume(
            consumer,
            args.clone(),
            mode,
            mine,
            deadline,
            Arc::clone(consumed),
        )));
    }
    let mut producers = Vec::new();
    if mode != Mode::Consume {
        for p in 0..args.producers {
            producers.push(tokio::spawn(produce(
                args.clone(),
                p,
                start,
                deadline,
                Arc::clone(produced),
            )));
        }
    }
    super::finish(mode, producers, consumers, consumed).await?;
    Ok(partitions.len())
}

/// Creates the topic with `--partitions` unless it exists.
async fn create_topic(args: &Args) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        config(args).create().context("a Kafka admin client")?;
    let topic = NewTopic::new(
        &args.topic,
        i32::try_from(args.partitions())?,
        TopicReplication::Fixed(1),
    );
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT)),
        )
        .await
        .context("CreateTopics")?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => bail!("creating topic {name}: {code}"),
        }
    }
    Ok(())
}

/// One producer: records until the deadline or its share of `max_records`, at most
/// `--in-flight-bytes` unacknowledged; returns how many were acknowledged. Delivery reports
/// are counted as librdkafka's polling thread gets them, so each latency is the report's.
async fn produce(
    args: Args,
    index: usize,
    start: Instant,
    deadline: Instant,
    produced: Shared,
) -> anyhow::Result<u64> {
    let acks = if args.acks == "all" { "-1" } else { &args.acks };
    let mut c = config(&args);
    c.set("acks", acks);
    if c.get("linger.ms").is_none() {
        c.set("linger.ms", "5");
    }
    // Records in flight: a permit each, given back by its delivery report.
    let room = Arc::new(tokio::sync::Semaphore::new(
        (args.in_flight_bytes.unwrap_or(DEFAULT_IN_FLIGHT_BYTES) / args.record_size).max(1),
    ));
    let deliveries = Deliveries {
        produced,
        record_size: args.record_size as u64,
        start,
        room: Arc::clone(&room),
        acked: AtomicU64::new(0),
        failed: OnceLock::new(),
    };
    let producer: ThreadedProducer<Deliveries> = c
        .create_with_context(deliveries)
        .context("a Kafka producer")?;
    let mut value = vec![0u8; args.record_size];
    let share = super::quota(&args, index);
    let rate = args.rate_per_producer();
    let mut pacer = Pacer::new(start, rate);
    let chunk = pacer.chunk(args.batch_records) as u64;
    let mut sent = 0u64;
    'sending: while Instant::now() < deadline && share.is_none_or(|s| sent < s) {
        let n = share.map_or(chunk, |s| chunk.min(s - sent));
        let first_due = pacer.next(n).await;
        if first_due >= deadline {
            break; // due after the run: not sent
        }
        for i in 0..n {
            // Before the record is due: an unthrottled record is sent once there is room.
            room.acquire()
                .await
                .context("the in-flight bound")?
                .forget();
            if producer.context().failed.get().is_some() {
                break 'sending;
            }
            let due = match rate {
                Some(r) => first_due + Duration::from_secs_f64(i as f64 / r),
                None => Instant::now(),
            };
            fill_random(&mut value[8..]);
            value[..8].copy_from_slice(&now_us().to_le_bytes());
            let due_us = usize::try_from(due.saturating_duration_since(start).as_micros())
                .unwrap_or(usize::MAX);
            let mut record = BaseRecord::<(), [u8], usize>::with_opaque_to(&args.topic, due_us)
                .payload(&value[..]);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        // librdkafka's queue is full: let deliveries make room.
                        record = r;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err((e, _)) => return Err(e).context("producing"),
                }
            }
            sent += 1;
            if Instant::now() >= deadline {
                break 'sending;
            }
        }
    }
    // Every record sent gets its report (delivered, or failed once its timeout passes).
    tokio::task::block_in_place(|| producer.flush(FLUSH_TIMEOUT)).context("the last deliveries")?;
    let deliveries = producer.context();
    if let Some(e) = deliveries.failed.get() {
        bail!("a record was not delivered: {e}");
    }
    Ok(deliveries.acked.load(Ordering::Relaxed))
}

/// How long a producer waits for its last delivery reports.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(120);

/// A producer's delivery reports, counted on librdkafka's polling thread: no future, channel
/// or task per record (those took about a twentieth of a produce run's CPU, the node's
/// share on this machine).
struct Deliveries {
    produced: Shared,
    record_size: u64,
    /// The run's start: a record's opaque is when it was due, in µs from here.
    start: Instant,
    room: Arc<tokio::sync::Semaphore>,
    acked: AtomicU64,
    /// The first failed delivery: it stops the sending and fails the run.
    failed: OnceLock<String>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, due_us: usize) {
        self.room.add_permits(1);
        match result {
            Ok(_) => {
                let at = Instant::now();
                let due = self.start + Duration::from_micros(due_us as u64);
                self.produced.lock().expect("recorder lock").record(
                    at,
                    1,
                    self.record_size,
                    Some(at.saturating_duration_since(due)),
                );
                self.acked.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                let _ = self.failed.set(e.to_string());
            }
        }
    }
}

/// A consumer connected and knowing the topic's leaders, before the run's clock starts (as a
/// Flight consumer's client is connected before it).
fn connect_consumer(args: &Args) -> anyhow::Result<StreamConsumer> {
    let consumer: StreamConsumer = config(args)
        .set("group.id", "mink-bench")
        .set("enable.auto.commit", "false")
        .create()
        .context("a Kafka consumer")?;
    // The partitions' leaders known before they are assigned: librdkafka resolves an assigned
    // partition's logical offset (its beginning) at once when it knows the leader, and on a
    // 500 ms retry timer when it does not (measured: the first record 0.52 s after assign
    // against 0.03–0.09 s). A group member learns them before its assignment anyway.
    tokio::task::block_in_place(|| consumer.fetch_metadata(Some(&args.topic), REQUEST_TIMEOUT))
        .context("topic metadata")?;
    Ok(consumer)
}

/// One consumer: its partitions from their start up to where they ended (`consume`), or from
/// there on (`e2e`, latency from each record's send time).
async fn consume(
    consumer: StreamConsumer,
    args: Args,
    mode: Mode,
    partitions: Vec<(i32, i64, i64)>,
    deadline: Instant,
    consumed: Shared,
) -> anyhow::Result<()> {
    let mut assignment = TopicPartitionList::new();
    let mut remaining = 0i64;
    for (p, low, high) in &partitions {
        let from = if mode == Mode::EndToEnd {
            Offset::Offset(*high)
        } else {
            remaining += high - low;
            Offset::Beginning
        };
        assignment.add_partition_offset(&args.topic, *p, from)?;
    }
    consumer.assign(&assignment)?;
    let mut stream = consumer.stream();
    // One timer for the whole read, not one per record.
    let expired = tokio::time::sleep_until(deadline.into());
    tokio::pin!(expired);
    // A consume run counts records in batches, as a Flight consumer counts per record batch:
    // a lock, a clock read and a timer per 1 KiB record took 2–3 % of a read's CPU.
    let mut unrecorded = (0u64, 0u64);
    let record = |unrecorded: &mut (u64, u64)| {
        if unrecorded.0 > 0 {
            consumed.lock().expect("recorder lock").record(
                Instant::now(),
                unrecorded.0,
                unrecorded.1,
                None,
            );
            *unrecorded = (0, 0);
        }
    };
    loop {
        if mode == Mode::Consume && remaining <= 0 {
            record(&mut unrecorded);
            return Ok(());
        }
        let next = if mode == Mode::Consume {
            tokio::select! {
                next = stream.next() => next,
                () = &mut expired => None,
            }
        } else {
            stream.next().await
        };
        let Some(message) = next else {
            record(&mut unrecorded);
            return Ok(());
        };
        let message = message.context("consuming")?;
        let value = message.payload().unwrap_or_default();
        remaining -= 1;
        if mode == Mode::EndToEnd {
            let latency = (value.len() >= 8).then(|| {
                let sent = i64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
                Duration::from_micros(u64::try_from(now_us() - sent).unwrap_or(0))
            });
            consumed.lock().expect("recorder lock").record(
                Instant::now(),
                1,
                value.len() as u64,
                latency,
            );
        } else {
            unrecorded.0 += 1;
            unrecorded.1 += value.len() as u64;
            if unrecorded.0 == CONSUME_RECORD_EVERY {
                record(&mut unrecorded);
            }
        }
    }
}

/// Records a consume run counts at once.
const CONSUME_RECORD_EVERY: u64 = 256;
