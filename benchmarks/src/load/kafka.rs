//! The workload over the Kafka protocol with librdkafka (rdkafka): any Kafka-compatible broker
//! by bootstrap address. Producers pipeline records as librdkafka batches them; latency is
//! from when a record was due to its delivery report. Consumers are assigned the partitions
//! (no group coordination in the measurement).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::{Message as _, Offset, TopicPartitionList};

use super::{Args, Mode, Pacer, Shared, fill_random, now_us};

/// A producer's bytes in flight when `--in-flight-bytes` is not given.
const DEFAULT_IN_FLIGHT_BYTES: usize = 8 << 20;
/// How long metadata and admin requests may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
) -> anyhow::Result<()> {
    if mode != Mode::Consume {
        create_topic(args).await?;
    }
    let probe: StreamConsumer = config(args)
        .set("group.id", "mink-bench")
        .create()
        .context("a Kafka consumer")?;
    // librdkafka's metadata calls block their thread: off the runtime's workers, which may be
    // serving the broker itself (the kafka suite runs a node in this process).
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
    // Where each partition ends now: a consume run reads up to there, an e2e run from there.
    let mut ends = Vec::with_capacity(partitions.len());
    for p in &partitions {
        let (_, high) = tokio::task::block_in_place(|| {
            probe.fetch_watermarks(&args.topic, *p, REQUEST_TIMEOUT)
        })
        .with_context(|| format!("the watermarks of partition {p}"))?;
        ends.push((*p, high));
    }
    // The run's clock starts once the table or topic is ready: setup is not measured.
    let start = super::restart(start, produced, consumed);
    let deadline = start + args.duration();
    let mut consumers = Vec::new();
    if mode != Mode::Produce {
        for c in 0..args.consumers {
            let mine = super::share_of(&ends, args.consumers, c);
            if mine.is_empty() {
                continue;
            }
            consumers.push(tokio::spawn(consume(
                args.clone(),
                mode,
                mine,
                deadline,
                Arc::clone(consumed),
            )));
        }
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
    super::finish(mode, producers, consumers, consumed).await
}

/// Creates the topic with `--partitions` unless it exists.
async fn create_topic(args: &Args) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        config(args).create().context("a Kafka admin client")?;
    let topic = NewTopic::new(
        &args.topic,
        i32::try_from(args.partitions)?,
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
/// `--in-flight-bytes` unacknowledged; returns how many were acknowledged. Delivery reports are
/// collected as they arrive, by a task of their own, so each latency is the report's.
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
    let producer: FutureProducer = c.create().context("a Kafka producer")?;
    let mut value = vec![0u8; args.record_size];
    let share = super::quota(&args, index);
    let rate = args.rate_per_producer();
    let mut pacer = Pacer::new(start, rate);
    // Paced runs send in chunks of about 10 ms of records.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a positive rate
    let chunk = rate.map_or(args.batch_records as u64, |r| {
        (r / 100.0).ceil().max(1.0) as u64
    });
    // Records in flight: a permit each, returned with its delivery report.
    let room = Arc::new(tokio::sync::Semaphore::new(
        (args.in_flight_bytes.unwrap_or(DEFAULT_IN_FLIGHT_BYTES) / args.record_size).max(1),
    ));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(
        Instant,
        DeliveryFuture,
        tokio::sync::OwnedSemaphorePermit,
    )>();
    let collector = tokio::spawn({
        let args = args.clone();
        async move {
            let mut in_flight = FuturesUnordered::new();
            let mut open = true;
            let mut acked = 0u64;
            loop {
                tokio::select! {
                    next = rx.recv(), if open => match next {
                        Some((due, delivery, permit)) => in_flight.push(async move {
                            let done = delivery.await;
                            drop(permit);
                            (due, done)
                        }),
                        None => open = false,
                    },
                    Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                        acked += note(&produced, &args, done)?;
                    }
                    else => break,
                }
            }
            anyhow::Ok(acked)
        }
    });
    let mut sent = 0u64;
    'sending: while Instant::now() < deadline && share.is_none_or(|s| sent < s) {
        let n = share.map_or(chunk, |s| chunk.min(s - sent));
        let first_due = pacer.next(n).await;
        for i in 0..n {
            // Before the record is due: an unthrottled record is sent once there is room.
            let permit = Arc::clone(&room)
                .acquire_owned()
                .await
                .context("the in-flight bound")?;
            let due = match rate {
                Some(r) => first_due + Duration::from_secs_f64(i as f64 / r),
                None => Instant::now(),
            };
            fill_random(&mut value[8..]);
            value[..8].copy_from_slice(&now_us().to_le_bytes());
            let mut record = FutureRecord::<(), [u8]>::to(&args.topic).payload(&value[..]);
            let delivery = loop {
                match producer.send_result(record) {
                    Ok(d) => break d,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        // librdkafka's queue is full: let deliveries make room.
                        record = r;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err((e, _)) => return Err(e).context("producing"),
                }
            };
            if tx.send((due, delivery, permit)).is_err() {
                // The collector stopped: its error is the run's.
                break 'sending;
            }
            sent += 1;
            if Instant::now() >= deadline {
                break 'sending;
            }
        }
    }
    drop(tx);
    collector.await?
}

type Delivered = (
    Instant,
    Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
);

/// Counts a delivery report (1 if the record was stored); a failed one fails the run.
fn note(produced: &Shared, args: &Args, (due, result): Delivered) -> anyhow::Result<u64> {
    match result {
        Ok(Ok(_)) => {
            let at = Instant::now();
            produced.lock().expect("recorder lock").record(
                at,
                1,
                args.record_size as u64,
                Some(at.saturating_duration_since(due)),
            );
            Ok(1)
        }
        Ok(Err((e, _))) => Err(e).context("a record was not delivered"),
        Err(_) => bail!("the producer went away"),
    }
}

/// One consumer: its partitions from their start up to where they ended (`consume`), or from
/// there on (`e2e`, latency from each record's send time).
async fn consume(
    args: Args,
    mode: Mode,
    partitions: Vec<(i32, i64)>,
    deadline: Instant,
    consumed: Shared,
) -> anyhow::Result<()> {
    let consumer: StreamConsumer = config(&args)
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
    let mut assignment = TopicPartitionList::new();
    let mut remaining = 0i64;
    for (p, end) in &partitions {
        let from = if mode == Mode::EndToEnd {
            Offset::Offset(*end)
        } else {
            remaining += *end;
            Offset::Beginning
        };
        assignment.add_partition_offset(&args.topic, *p, from)?;
    }
    consumer.assign(&assignment)?;
    if mode == Mode::Consume {
        // What is stored below the ends, less what retention removed.
        for (p, _) in &partitions {
            let (low, _) = tokio::task::block_in_place(|| {
                consumer.fetch_watermarks(&args.topic, *p, REQUEST_TIMEOUT)
            })?;
            remaining -= low;
        }
    }
    let mut stream = consumer.stream();
    loop {
        if mode == Mode::Consume && remaining <= 0 {
            return Ok(());
        }
        let next = if mode == Mode::Consume {
            match tokio::time::timeout_at(deadline.into(), stream.next()).await {
                Ok(next) => next,
                Err(_) => return Ok(()),
            }
        } else {
            stream.next().await
        };
        let Some(message) = next else {
            return Ok(());
        };
        let message = message.context("consuming")?;
        let at = Instant::now();
        let value = message.payload().unwrap_or_default();
        let latency = (mode == Mode::EndToEnd && value.len() >= 8).then(|| {
            let sent = i64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
            Duration::from_micros(u64::try_from(now_us() - sent).unwrap_or(0))
        });
        remaining -= 1;
        consumed
            .lock()
            .expect("recorder lock")
            .record(at, 1, value.len() as u64, latency);
    }
}
