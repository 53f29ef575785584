//! The workload over Arrow Flight: a log table of `sent_us` (Int64) and `payload` (Binary),
//! written by idempotent `mink-client` writers (DoPut, acknowledged once durable) and read per
//! bucket (DoGet; tailing for e2e).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use futures::StreamExt as _;
use mink_client::{Client, Scan};

use super::{Args, Mode, Pacer, Shared, fill_random, now_us};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("sent_us", DataType::Int64, false),
        Field::new("payload", DataType::Binary, false),
    ]))
}

pub(super) async fn run(
    mode: Mode,
    args: &Args,
    start: Instant,
    produced: &Shared,
    consumed: &Shared,
    found: &std::sync::OnceLock<usize>,
) -> anyhow::Result<usize> {
    let address = args.flight.clone().unwrap_or_default();
    let client = Client::connect(&address).await?;
    if mode != Mode::Consume {
        client.create_database(&args.database, true).await?;
        client
            .create_table(
                &args.database,
                &args.topic,
                &schema(),
                [("bucket.num", args.partitions().to_string())],
                &[],
                true,
            )
            .await?;
    }
    let table = client.describe_table(&args.database, &args.topic).await?;
    let partitions = usize::try_from(table.bucket_count)?;
    let _ = found.set(partitions);
    let buckets: Vec<(u32, u64)> = table
        .buckets
        .iter()
        .map(|b| (b.bucket, b.end_offset))
        .collect();
    // The run's clock starts once the table or topic is ready: setup is not measured.
    let start = super::restart(start, produced, consumed);
    let deadline = start + args.duration();
    let mut consumers = Vec::new();
    if mode != Mode::Produce {
        for c in 0..args.consumers {
            let mine = super::share_of(&buckets, args.consumers, c);
            consumers.push(tokio::spawn(consume(
                client.clone(),
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
                client.clone(),
                args.clone(),
                p,
                start,
                deadline,
                Arc::clone(produced),
            )));
        }
    }
    super::finish(mode, producers, consumers, consumed).await?;
    Ok(partitions)
}

/// One producer: batches of `batch_records` records until the deadline or its share of
/// `max_records`; returns how many it sent.
async fn produce(
    client: Client,
    args: Args,
    index: usize,
    start: Instant,
    deadline: Instant,
    produced: Shared,
) -> anyhow::Result<u64> {
    let schema = schema();
    let share = super::quota(&args, index);
    let mut writer = client.writer(&args.database, &args.topic);
    let mut pacer = Pacer::new(start, args.rate_per_producer());
    // A whole --batch-records batch went out when its first record was due, up to
    // batch/rate seconds early.
    let batch = pacer.chunk(args.batch_records).min(args.batch_records);
    let mut sent = 0u64;
    while Instant::now() < deadline && share.is_none_or(|s| sent < s) {
        let n = share.map_or(batch, |s| {
            batch.min(usize::try_from(s - sent).unwrap_or(usize::MAX))
        });
        let due = pacer.next(n as u64).await;
        if due >= deadline {
            break; // due after the run: not sent
        }
        let sent_us: ArrayRef = Arc::new(Int64Array::from(vec![now_us(); n]));
        // Fresh random padding per record (see `fill_random`).
        let pad = args.record_size - 8;
        let mut bytes = vec![0u8; n * pad];
        fill_random(&mut bytes);
        let payloads: ArrayRef = Arc::new(BinaryArray::new(
            arrow::buffer::OffsetBuffer::from_lengths(std::iter::repeat_n(pad, n)),
            arrow::buffer::Buffer::from(bytes),
            None,
        ));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![sent_us, payloads])?;
        writer.write(&batch).await?;
        let acked = Instant::now();
        produced.lock().expect("recorder lock").record(
            acked,
            n as u64,
            (n * args.record_size) as u64,
            Some(acked.saturating_duration_since(due)),
        );
        sent += n as u64;
    }
    Ok(sent)
}

/// One consumer: its buckets from their start to the high watermark at the start (`consume`),
/// or from there on, tailing (`e2e`).
async fn consume(
    client: Client,
    args: Args,
    mode: Mode,
    buckets: Vec<(u32, u64)>,
    deadline: Instant,
    consumed: Shared,
) -> anyhow::Result<()> {
    let mut reads = Vec::new();
    for (bucket, end) in buckets {
        let scan = Scan::table(&args.database, &args.topic).bucket(bucket);
        let scan = match mode {
            Mode::EndToEnd => scan.offset(end).tail(None),
            _ => scan.end_offset(end),
        };
        reads.push(client.scan(&scan).await?);
    }
    let mut all = futures::stream::select_all(reads);
    loop {
        let next = if mode == Mode::Consume {
            match tokio::time::timeout_at(deadline.into(), all.next()).await {
                Ok(next) => next,
                Err(_) => return Ok(()),
            }
        } else {
            all.next().await
        };
        let Some(read) = next else {
            return Ok(());
        };
        let batch = read?.batch;
        let received = Instant::now();
        let now = now_us();
        // The bench's tables carry `payload` and an 8-byte `sent_us`; a topic written over
        // Kafka carries `value`, counted as a Kafka consumer counts it.
        let (payloads, per_row) = match batch.column_by_name("payload") {
            Some(c) => (Some(c.as_binary::<i32>()), 8),
            None => (
                batch.column_by_name("value").map(|c| c.as_binary::<i32>()),
                0,
            ),
        };
        // The bytes of these rows' values (a sliced array's buffer holds more).
        let bytes = payloads.map_or(0, |p| {
            let o = p.value_offsets();
            u64::try_from(o[o.len() - 1] - o[0]).unwrap_or(0) + per_row * p.len() as u64
        });
        let mut r = consumed.lock().expect("recorder lock");
        if mode == Mode::EndToEnd {
            let sent = batch
                .column_by_name("sent_us")
                .map(|c| c.as_primitive::<Int64Type>().clone());
            let per_record = bytes / batch.num_rows().max(1) as u64;
            for s in sent.iter().flat_map(|a| a.values().iter()) {
                let latency = Duration::from_micros(u64::try_from(now - s).unwrap_or(0));
                r.record(received, 1, per_record, Some(latency));
            }
        } else {
            r.record(received, batch.num_rows() as u64, bytes, None);
        }
    }
}
