//! s3stream benchmark.
//!
//! For each object store (local filesystem, moto) and injected PUT latency (none, 20 ms):
//! - appends of fixed-size records to 1, 100 and 1000 streams, with a bounded number of
//!   appends in flight: records/s, MB/s, acknowledgement p50/p99, objects written, their mean
//!   size, and the metadata commands per second the write path costs;
//! - beside it, the limit: raw object_store PUT throughput of objects of that mean size, with as
//!   many PUTs in flight as the engine allows, on the same store in the same run;
//! - fetch throughput from the log cache and, on a node with cold caches, from object storage
//!   (before and after a compaction round; one stream after another, and every stream at once
//!   as a consumer group catching up reads), beside raw GETs of the same objects.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt as _};
use hdrhistogram::Histogram;
use mink_sql::{Sink, SinkConfig, SinkStats, SqliteStore};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use s3stream::store::{self, FaultyObjectStore, ObjectFaults};
use s3stream::{CompactionConfig, EngineConfig, S3Stream};
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Measured seconds per point (after one second of warm-up).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, value_delimiter = ',', default_values_t = [1, 100, 1000])]
    streams: Vec<usize>,
    #[arg(long, default_value_t = 1024)]
    record_bytes: usize,
    /// Appends in flight across all streams (like producers' in-flight windows). Throughput
    /// is at most this many records per acknowledgement latency.
    #[arg(long, default_value_t = 32768)]
    inflight: usize,
    /// Injected PUT latencies to measure, in milliseconds.
    #[arg(long, value_delimiter = ',', default_values_t = [0, 20])]
    put_latency_ms: Vec<u64>,
    /// moto (or any S3) endpoint; without it only the local filesystem is measured.
    #[arg(long, env = "MINK_BENCH_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    #[arg(long, env = "MINK_BENCH_S3_BUCKET", default_value = "mink-test")]
    s3_bucket: String,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct AppendPoint {
    store: String,
    put_latency_ms: u64,
    streams: usize,
    records_per_s: f64,
    mb_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    objects: u64,
    mean_object_bytes: u64,
    metadata_commands_per_s: f64,
    raw_put_mb_per_s: f64,
    ratio_to_raw: f64,
}

#[derive(Debug, Serialize)]
struct FetchPoint {
    store: String,
    source: &'static str,
    mb_per_s: f64,
    raw_get_mb_per_s: f64,
    ratio_to_raw: f64,
    /// GETs the reading node made (indexes and runs of blocks).
    gets: u64,
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

struct Node {
    _dir: tempfile::TempDir,
    engine: S3Stream,
}

async fn node(
    store: Arc<dyn ObjectStore>,
    meta_url: &str,
    node_id: u64,
) -> anyhow::Result<S3Stream> {
    let meta = Arc::new(SqliteStore::connect(meta_url).await?);
    let sink = Sink::start(meta, SinkConfig::new(node_id)).await?;
    // Reads with the parallelism of the raw GETs they are held against.
    let config = EngineConfig {
        max_reads_in_flight: RAW_GETS_IN_FLIGHT,
        ..EngineConfig::default()
    };
    Ok(S3Stream::start(sink, store, config))
}

async fn fresh_node(store: Arc<dyn ObjectStore>) -> anyhow::Result<(Node, String)> {
    let dir = tempfile::tempdir()?;
    let meta_url = format!("sqlite://{}", dir.path().join("meta.db").display());
    let engine = node(store, &meta_url, 1).await?;
    Ok((Node { _dir: dir, engine }, meta_url))
}

/// Appends for `seconds` after a warm-up; returns the point without its raw baseline.
async fn appends(
    engine: &S3Stream,
    streams: usize,
    args: &Args,
) -> anyhow::Result<(AppendPoint, Vec<u64>)> {
    let first = engine.create_streams(u32::try_from(streams)?).await?;
    let ids: Vec<u64> = (first..first + streams as u64).collect();
    for &s in &ids {
        engine.open(s, 1).await?;
    }
    // At least 16 producer tasks, so that one task's overhead is not what gets measured.
    let producers = streams.max(16);
    let window = (args.inflight / producers).max(1);
    let record = Bytes::from(vec![b'r'; args.record_bytes]);
    let warmup = Duration::from_secs(1);
    let measured = Duration::from_secs_f64(args.seconds);
    let t0 = Instant::now();
    let (start, stop) = (t0 + warmup, t0 + warmup + measured);
    let mut tasks = Vec::new();
    for p in 0..producers {
        let s = ids[p % streams];
        let engine = engine.clone();
        let record = record.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let mut inflight = FuturesUnordered::new();
            let mut done = 0u64;
            loop {
                while inflight.len() < window && Instant::now() < stop {
                    let engine = engine.clone();
                    let record = record.clone();
                    inflight.push(async move {
                        let sent = Instant::now();
                        let r = engine.append(s, 1, record, None).await;
                        (sent, Instant::now(), r)
                    });
                }
                let Some((sent, acked, r)) = inflight.next().await else {
                    break;
                };
                r?;
                if sent >= start && acked <= stop {
                    h.record(
                        u64::try_from(acked.duration_since(sent).as_micros()).unwrap_or(u64::MAX),
                    )?;
                    done += 1;
                }
            }
            Ok::<_, anyhow::Error>((h, done))
        }));
    }
    tokio::time::sleep_until(start.into()).await;
    let stats = engine.stats();
    let flushes_before = stats.flushes.load(Ordering::Relaxed);
    let commands_before = SinkStats::get(&engine.sink().stats().commands_appended);
    tokio::time::sleep_until(stop.into()).await;
    let flushes = stats.flushes.load(Ordering::Relaxed) - flushes_before;
    let commands = SinkStats::get(&engine.sink().stats().commands_appended) - commands_before;
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut records = 0u64;
    for t in tasks {
        let (h, n) = t.await??;
        all.add(&h)?;
        records += n;
    }
    let secs = measured.as_secs_f64();
    let bytes = records as f64 * args.record_bytes as f64;
    Ok((
        AppendPoint {
            store: String::new(),
            put_latency_ms: 0,
            streams,
            records_per_s: records as f64 / secs,
            mb_per_s: bytes / secs / 1e6,
            p50_ms: ms(&all, 0.5),
            p99_ms: ms(&all, 0.99),
            objects: flushes,
            mean_object_bytes: (records * args.record_bytes as u64)
                .checked_div(flushes)
                .unwrap_or(0),
            metadata_commands_per_s: commands as f64 / secs,
            raw_put_mb_per_s: 0.0,
            ratio_to_raw: 0.0,
        },
        ids,
    ))
}

/// Raw PUTs of `size`-byte objects, `parallel` at a time, for `seconds`: MB/s.
async fn raw_puts(
    store: &Arc<dyn ObjectStore>,
    size: usize,
    parallel: usize,
    seconds: f64,
) -> anyhow::Result<f64> {
    let payload = Bytes::from(vec![b'p'; size.max(1)]);
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let written = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..parallel)
        .map(|w| {
            let store = Arc::clone(store);
            let payload = payload.clone();
            let written = Arc::clone(&written);
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < stop {
                    let path = Path::from(format!("bench/raw/{w}/{i}"));
                    store
                        .put(&path, PutPayload::from_bytes(payload.clone()))
                        .await?;
                    written.fetch_add(payload.len() as u64, Ordering::Relaxed);
                    i += 1;
                }
                Ok::<_, object_store::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(written.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64() / 1e6)
}

/// Raw GETs in flight at once, the baseline's and the reading nodes' (`max_reads_in_flight`):
/// a single-process store (moto) serves more at once slower, and a reader held against the
/// baseline reads with the same parallelism.
pub(crate) const RAW_GETS_IN_FLIGHT: usize = 8;

/// Raw GETs of whole objects under `prefix`, `parallel` at a time, one pass: MB/s.
pub(crate) async fn raw_gets(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    parallel: usize,
) -> anyhow::Result<f64> {
    let objects: Vec<object_store::ObjectMeta> = store
        .list(Some(&Path::from(prefix)))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    raw_gets_of(
        store,
        objects.into_iter().map(|o| o.location).collect(),
        parallel,
    )
    .await
}

/// Whole-object GETs of `objects`, `parallel` at a time: MB/s.
pub(crate) async fn raw_gets_of(
    store: &Arc<dyn ObjectStore>,
    objects: Vec<Path>,
    parallel: usize,
) -> anyhow::Result<f64> {
    anyhow::ensure!(!objects.is_empty(), "no objects to read");
    let started = Instant::now();
    let sizes: Vec<usize> = futures::stream::iter(
        objects
            .iter()
            .map(|o| async move { store.get(o).await?.bytes().await.map(|b| b.len()) }),
    )
    .buffer_unordered(parallel)
    .collect::<Vec<_>>()
    .await
    .into_iter()
    .collect::<Result<_, _>>()?;
    let read: usize = sizes.iter().sum();
    let mb_per_s = read as f64 / started.elapsed().as_secs_f64() / 1e6;
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "raw GETs: {} objects, {:.1} MB, {mb_per_s:.1} MB/s",
            sizes.len(),
            read as f64 / 1e6
        );
    }
    Ok(mb_per_s)
}

/// Reads streams until `seconds` pass, `chunk` bytes per fetch: a hot read reads each stream's
/// last `tail` records again and again (they are in the log cache); a cold one reads each
/// stream from its start once (a fresh node's caches stay cold for a single pass). MB/s.
async fn fetch_all(
    engine: &S3Stream,
    streams: &[u64],
    seconds: f64,
    tail: Option<u64>,
    chunk: usize,
) -> anyhow::Result<f64> {
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut read = 0u64;
    'outer: loop {
        for &s in streams {
            let end = engine.info(s)?.end_offset;
            let mut next = tail.map_or(0, |t| end.saturating_sub(t));
            while next < end {
                let batches = engine.fetch(s, next, chunk).await?;
                for b in &batches {
                    read += b.payload.len() as u64;
                    next = b.end_offset();
                }
                if tail.is_some() && Instant::now() >= stop {
                    break 'outer;
                }
            }
        }
        if tail.is_none() {
            break;
        }
    }
    Ok(read as f64 / started.elapsed().as_secs_f64() / 1e6)
}

/// Reads every stream from its start at once, one reader per stream (a consumer group catching
/// up on every partition), `chunk` bytes per fetch. MB/s.
async fn fetch_parallel(engine: &S3Stream, streams: &[u64], chunk: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let reads = streams.iter().map(|&s| async move {
        let end = engine.info(s)?.end_offset;
        let mut next = 0;
        let mut read = 0u64;
        while next < end {
            for b in engine.fetch(s, next, chunk).await? {
                read += b.payload.len() as u64;
                next = b.end_offset();
            }
        }
        Ok::<u64, anyhow::Error>(read)
    });
    let read: u64 = futures::future::try_join_all(reads)
        .await?
        .into_iter()
        .sum();
    Ok(read as f64 / started.elapsed().as_secs_f64() / 1e6)
}

fn stores(
    args: &Args,
    dir: &std::path::Path,
) -> anyhow::Result<Vec<(String, Arc<dyn ObjectStore>)>> {
    let mut out: Vec<(String, Arc<dyn ObjectStore>)> = vec![(
        "local".into(),
        store::open(dir.join("objects").to_str().context("path")?)?,
    )];
    if let Some(endpoint) = &args.s3_endpoint {
        let url = format!(
            "s3://{}/bench-{:08x}?endpoint={endpoint}&allow_http=true&region=us-east-1\
             &access_key_id=test&secret_access_key=test",
            args.s3_bucket,
            rand::random::<u32>()
        );
        out.push(("moto".into(), store::open(&url)?));
    }
    Ok(out)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut appends_out = Vec::new();
    let mut fetches_out = Vec::new();
    for (name, base) in stores(&args, dir.path())? {
        for &latency in &args.put_latency_ms {
            let faults = ObjectFaults::new(1);
            faults
                .put_latency_us
                .store(latency * 1000, Ordering::Relaxed);
            let store: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
                Arc::clone(&base),
                Arc::clone(&faults),
            ));
            for &n in &args.streams {
                let (node1, meta_url) = fresh_node(Arc::clone(&store)).await?;
                let (mut point, ids) = appends(&node1.engine, n, &args).await?;
                let raw = raw_puts(
                    &store,
                    usize::try_from(point.mean_object_bytes)?,
                    EngineConfig::default().max_inflight_flushes,
                    args.seconds,
                )
                .await?;
                point.store = name.clone();
                point.put_latency_ms = latency;
                point.raw_put_mb_per_s = raw;
                point.ratio_to_raw = point.mb_per_s / raw;
                eprintln_point(&point);
                // Fetches: once per store, with 100 streams and no injected latency.
                if latency == 0 && n == 100.min(*args.streams.iter().max().unwrap_or(&100)) {
                    let raw_get = raw_gets(&base, "s3stream/objects", RAW_GETS_IN_FLIGHT).await?;
                    // The last 64 MiB written is certainly still in the log cache.
                    let tail = (64 << 20) / (args.record_bytes as u64 * ids.len() as u64);
                    let gets = |e: &S3Stream| e.stats().object_reads.load(Ordering::Relaxed);
                    let before = gets(&node1.engine);
                    let hot =
                        fetch_all(&node1.engine, &ids, args.seconds, Some(tail), 1 << 20).await?;
                    let hot = (hot, gets(&node1.engine) - before);
                    let cold_engine = node(Arc::clone(&store), &meta_url, 2).await?;
                    let cold = fetch_all(&cold_engine, &ids, args.seconds, None, 8 << 20).await?;
                    let cold = (cold, gets(&cold_engine));
                    cold_engine.shutdown().await;
                    // Every stream at once, 1 MiB per fetch (a Kafka consumer's default
                    // max.partition.fetch.bytes).
                    let cold_engine = node(Arc::clone(&store), &meta_url, 4).await?;
                    let cold_all = fetch_parallel(&cold_engine, &ids, 1 << 20).await?;
                    let cold_all = (cold_all, gets(&cold_engine));
                    eprintln_gets("object storage, every stream at once", &cold_engine);
                    cold_engine.shutdown().await;
                    // After a compaction round each stream lives in few objects of its own.
                    let all_at_once = CompactionConfig {
                        split_stream_bytes: 1 << 20,
                        max_round_bytes: u64::MAX,
                        max_bytes_per_sec: 0,
                        ..CompactionConfig::default()
                    };
                    node1.engine.compact_once(1, &all_at_once).await?;
                    let compacted_engine = node(Arc::clone(&store), &meta_url, 3).await?;
                    let compacted =
                        fetch_all(&compacted_engine, &ids, args.seconds, None, 8 << 20).await?;
                    let compacted = (compacted, gets(&compacted_engine));
                    compacted_engine.shutdown().await;
                    let compacted_engine = node(Arc::clone(&store), &meta_url, 5).await?;
                    let compacted_all = fetch_parallel(&compacted_engine, &ids, 1 << 20).await?;
                    let compacted_all = (compacted_all, gets(&compacted_engine));
                    compacted_engine.shutdown().await;
                    for (source, mb) in [
                        ("log cache", hot),
                        ("object storage", cold),
                        ("object storage, every stream at once", cold_all),
                        ("after compaction", compacted),
                        ("after compaction, every stream at once", compacted_all),
                    ] {
                        let (mb, gets) = mb;
                        fetches_out.push(FetchPoint {
                            store: name.clone(),
                            source,
                            mb_per_s: mb,
                            raw_get_mb_per_s: raw_get,
                            ratio_to_raw: mb / raw_get,
                            gets,
                        });
                    }
                }
                node1.engine.shutdown().await;
                node1.engine.sink().shutdown().await;
                appends_out.push(point);
            }
        }
    }
    print(&appends_out, &fetches_out, args.json)
}

/// The GETs of a fetch lane, by kind (diagnostics on stderr).
#[allow(clippy::print_stderr)]
pub(crate) fn eprintln_gets(lane: &str, engine: &S3Stream) {
    let stats = engine.stats();
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "{lane}: {} GETs: {} of indexes ({} whole objects, {} waited for room, {} refused), {} read-ahead, {} queued; {} blocks evicted unread",
        n(&stats.object_reads),
        n(&stats.index_reads),
        n(&stats.whole_object_reads),
        n(&stats.whole_reads_waited),
        n(&stats.whole_reads_refused),
        n(&stats.read_ahead_reads),
        n(&stats.reads_queued),
        engine
            .cache_stats()
            .iter()
            .find(|(cache, _)| *cache == "block")
            .map_or(0, |(_, s)| n(&s.evicted_unread)),
    );
}

#[allow(clippy::print_stderr)]
fn eprintln_point(p: &AppendPoint) {
    eprintln!(
        "{} +{} ms, {} streams: {:.1} MB/s (raw PUT {:.1} MB/s)",
        p.store, p.put_latency_ms, p.streams, p.mb_per_s, p.raw_put_mb_per_s
    );
}

#[allow(clippy::print_stdout)]
fn print(appends: &[AppendPoint], fetches: &[FetchPoint], json: bool) -> anyhow::Result<()> {
    println!(
        "\n{:<6} {:>6} {:>7} {:>10} {:>8} {:>8} {:>8} {:>8} {:>11} {:>9} {:>11} {:>6}",
        "store",
        "+PUT ms",
        "streams",
        "records/s",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "objects",
        "mean object",
        "meta cmd/s",
        "raw PUT MB/s",
        "ratio"
    );
    for p in appends {
        println!(
            "{:<6} {:>6} {:>7} {:>10.0} {:>8.1} {:>8.1} {:>8.1} {:>8} {:>10.0}K {:>9.1} {:>11.1} {:>6.2}",
            p.store,
            p.put_latency_ms,
            p.streams,
            p.records_per_s,
            p.mb_per_s,
            p.p50_ms,
            p.p99_ms,
            p.objects,
            p.mean_object_bytes as f64 / 1024.0,
            p.metadata_commands_per_s,
            p.raw_put_mb_per_s,
            p.ratio_to_raw
        );
    }
    println!(
        "\n{:<6} {:<40} {:>8} {:>12} {:>6} {:>8}",
        "store", "fetch from", "MB/s", "raw GET MB/s", "ratio", "GETs"
    );
    for f in fetches {
        println!(
            "{:<6} {:<40} {:>8.1} {:>12.1} {:>6.2} {:>8}",
            f.store, f.source, f.mb_per_s, f.raw_get_mb_per_s, f.ratio_to_raw, f.gets
        );
    }
    if json {
        for p in appends {
            println!("{}", serde_json::to_string(p)?);
        }
        for f in fetches {
            println!("{}", serde_json::to_string(f)?);
        }
    }
    Ok(())
}
