//! Primary-key tables: upserts and point lookups through a KV tablet on a real stream engine
//! (SQLite metadata, the durable local object store), each beside the embedded store's own
//! rate on the same keys and encoded rows in the same run (the limit):
//!
//! - upsert: `writers` tasks write batches of `rows_per_batch` random keys (out of `keys`) and
//!   wait for each acknowledgement (merged against the working copy and the writes in flight,
//!   appended, durable, applied). The limit: redb write transactions of the same batches'
//!   encoded keys and rows, not fsynced, on one thread.
//! - lookup: `readers` threads look up batches of random keys in the working copy. The limit:
//!   the same threads reading the same keys from redb directly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use hdrhistogram::Histogram;
use mink_kv::merge::KvWrite;
use mink_kv::rows::RowCodec;
use mink_kv::{KvTableDef, KvTablet, KvTabletConfig};
use rand::Rng as _;
use redb::{ReadableDatabase as _, TableDefinition};
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Measured seconds per point.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Size of the key space.
    #[arg(long, default_value_t = 200_000)]
    keys: i64,
    #[arg(long, default_value_t = 1000)]
    rows_per_batch: usize,
    /// Concurrent upsert writers (their writes pipeline in the tablet; each waits about one
    /// flush delay for its acknowledgement, so throughput grows with them until CPU-bound).
    #[arg(long, value_delimiter = ',', default_values_t = [32, 128])]
    writers: Vec<usize>,
    /// Lookup threads.
    #[arg(long, default_value_t = 2)]
    readers: usize,
    /// Keys per lookup call to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 100])]
    lookup_batch: Vec<usize>,
    /// `table.merge-engine` of the table (unset: last row wins; `aggregation` sums `n`).
    #[arg(long)]
    merge_engine: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Point {
    what: String,
    mink_per_s: f64,
    mink_p50_us: u64,
    mink_p99_us: u64,
    raw_per_s: f64,
    raw_p50_us: u64,
    raw_p99_us: u64,
    ratio: f64,
}

/// One lookup call of a measured reader.
type LookupCall = Arc<dyn Fn(&[i64]) -> anyhow::Result<()> + Send + Sync>;

const RAW: TableDefinition<'static, &[u8], &[u8]> = TableDefinition::new("rows");

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("n", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
    ]))
}

fn random_batch(schema: &SchemaRef, keys: i64, rows: usize) -> RecordBatch {
    let mut rng = rand::rng();
    let ids: Vec<i64> = (0..rows).map(|_| rng.random_range(0..keys)).collect();
    let names = StringArray::from_iter_values(ids.iter().map(|i| format!("customer-{i:012}")));
    RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
            Arc::new(Int64Array::from_iter_values(ids.iter().map(|i| i % 97))),
            Arc::new(names),
        ],
    )
    .expect("bench batch")
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let meta = Arc::new(
        mink_sql::SqliteStore::connect(&format!(
            "sqlite://{}",
            dir.path().join("meta.db").display()
        ))
        .await?,
    );
    let sink = mink_sql::Sink::start(meta, mink_sql::SinkConfig::new(1)).await?;
    let engine = s3stream::S3Stream::start(
        sink,
        s3stream::store::open(dir.path().join("objects").to_str().unwrap_or("objects"))?,
        s3stream::EngineConfig::default(),
    );
    let stream = engine.create_streams(1).await?;
    engine.open(stream, 1).await?;
    let schema = schema();
    let mut options = BTreeMap::new();
    if let Some(e) = &args.merge_engine {
        options.insert("table.merge-engine".to_string(), e.clone());
        if e == "aggregation" {
            options.insert("fields.n.agg".to_string(), "sum".to_string());
        }
    }
    let def = Arc::new(KvTableDef::new(
        Arc::clone(&schema),
        &["id".to_string()],
        &[],
        &[],
        &options,
    )?);
    let tablet = KvTablet::open(
        engine.clone(),
        stream,
        Arc::clone(&def),
        &dir.path().join("kv.redb"),
        &KvTabletConfig::default(),
        None,
    )
    .await?;
    let seconds = Duration::from_secs_f64(args.seconds);
    let mut points = Vec::new();

    // Upserts through the tablet, at each number of writers.
    let mut upserts = Vec::new();
    for &writers in &args.writers {
        let rows = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for _ in 0..writers.max(1) {
            let (tablet, schema, rows, stop) = (
                tablet.clone(),
                Arc::clone(&schema),
                Arc::clone(&rows),
                Arc::clone(&stop),
            );
            let (keys, per_batch) = (args.keys, args.rows_per_batch);
            tasks.push(tokio::spawn(async move {
                let mut h = histogram();
                while !stop.load(Ordering::Relaxed) {
                    let batch = random_batch(&schema, keys, per_batch);
                    let started = Instant::now();
                    tablet.write(KvWrite::upsert(batch), None).await?;
                    h.record(us(started.elapsed()))?;
                    rows.fetch_add(per_batch as u64, Ordering::Relaxed);
                }
                anyhow::Ok(h)
            }));
        }
        let started = Instant::now();
        tokio::time::sleep(seconds).await;
        stop.store(true, Ordering::Relaxed);
        let written = rows.load(Ordering::Relaxed);
        let elapsed = started.elapsed();
        let mut h = histogram();
        for t in tasks {
            h.add(t.await??)?;
        }
        upserts.push((writers, written as f64 / elapsed.as_secs_f64(), h));
    }

    // The limit: the same kind of batches straight into redb.
    let raw_path = dir.path().join("raw.redb");
    let (raw_rate, raw_h) = {
        let (schema, codec_def) = (Arc::clone(&schema), Arc::clone(&def));
        let (keys, per_batch, path) = (args.keys, args.rows_per_batch, raw_path.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<(f64, Histogram<u64>)> {
            let codec = RowCodec::new(&codec_def)?;
            let db = redb::Database::create(&path)?;
            let mut h = histogram();
            let mut n = 0u64;
            let started = Instant::now();
            while started.elapsed() < seconds {
                let batch = random_batch(&schema, keys, per_batch);
                let t = Instant::now();
                let k = codec.keys(&batch)?;
                let v = codec.values(batch.columns())?;
                let mut txn = db.begin_write()?;
                txn.set_durability(redb::Durability::None)?;
                {
                    let mut table = txn.open_table(RAW)?;
                    for i in 0..batch.num_rows() {
                        table.insert(k.row(i).data(), v.row(i).data())?;
                    }
                }
                txn.commit()?;
                h.record(us(t.elapsed()))?;
                n += per_batch as u64;
            }
            Ok((n as f64 / started.elapsed().as_secs_f64(), h))
        })
        .await??
    };
    for (writers, rate, h) in &upserts {
        points.push(Point {
            what: format!(
                "upsert rows ({} per batch, {writers} writers)",
                args.rows_per_batch
            ),
            mink_per_s: *rate,
            mink_p50_us: h.value_at_quantile(0.5),
            mink_p99_us: h.value_at_quantile(0.99),
            raw_per_s: raw_rate,
            raw_p50_us: raw_h.value_at_quantile(0.5),
            raw_p99_us: raw_h.value_at_quantile(0.99),
            ratio: rate / raw_rate,
        });
    }

    // Lookups: the tablet's working copy against redb directly, same threads, same keys.
    let raw = Arc::new(redb::Database::open(&raw_path)?);
    for &per_call in &args.lookup_batch {
        let per_call = per_call.max(1);
        let run_threads = |f: LookupCall| {
            let stop = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..args.readers.max(1))
                .map(|_| {
                    let (f, stop, keys) = (Arc::clone(&f), Arc::clone(&stop), args.keys);
                    std::thread::spawn(move || -> anyhow::Result<(u64, Histogram<u64>)> {
                        let mut rng = rand::rng();
                        let mut h = histogram();
                        let mut calls = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            let ids: Vec<i64> =
                                (0..per_call).map(|_| rng.random_range(0..keys)).collect();
                            let t = Instant::now();
                            f(&ids)?;
                            h.record(us(t.elapsed()))?;
                            calls += 1;
                        }
                        Ok((calls, h))
                    })
                })
                .collect();
            let started = Instant::now();
            std::thread::sleep(seconds);
            stop.store(true, Ordering::Relaxed);
            let mut calls = 0;
            let mut h = histogram();
            for t in threads {
                let (c, th) = t.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
                calls += c;
                h.add(th)?;
            }
            anyhow::Ok((calls as f64 / started.elapsed().as_secs_f64(), h))
        };
        let t = tablet.clone();
        let (mink_rate, mink_h) = run_threads(Arc::new(move |ids: &[i64]| {
            let key: ArrayRef = Arc::new(Int64Array::from(ids.to_vec()));
            t.lookup(&[key])?;
            Ok(())
        }))?;
        let (db, c) = (Arc::clone(&raw), RowCodec::new(&def)?);
        let (raw_rate, raw_h) = run_threads(Arc::new(move |ids: &[i64]| {
            let key: ArrayRef = Arc::new(Int64Array::from(ids.to_vec()));
            let keys = c.keys_of(&[key])?;
            let txn = db.begin_read()?;
            let table = txn.open_table(RAW)?;
            for i in 0..keys.num_rows() {
                std::hint::black_box(table.get(keys.row(i).data())?.map(|v| v.value().len()));
            }
            Ok(())
        }))?;
        points.push(Point {
            what: format!("lookup calls ({per_call} keys each)"),
            mink_per_s: mink_rate,
            mink_p50_us: mink_h.value_at_quantile(0.5),
            mink_p99_us: mink_h.value_at_quantile(0.99),
            raw_per_s: raw_rate,
            raw_p50_us: raw_h.value_at_quantile(0.5),
            raw_p99_us: raw_h.value_at_quantile(0.99),
            ratio: mink_rate / raw_rate,
        });
    }
    engine.shutdown().await;

    print(&points, &args)
}

#[allow(clippy::print_stdout)]
fn print(points: &[Point], args: &Args) -> anyhow::Result<()> {
    if args.json {
        for p in points {
            println!("{}", serde_json::to_string(p)?);
        }
        return Ok(());
    }
    println!(
        "KV tablet on a stream engine (SQLite metadata, durable local object store) beside redb on the same keys, same run; {} keys, {} readers, merge engine {}",
        args.keys,
        args.readers,
        args.merge_engine.as_deref().unwrap_or("last row")
    );
    println!(
        "{:<46} {:>12} {:>9} {:>9} {:>12} {:>9} {:>9} {:>7}",
        "what", "mink /s", "p50 us", "p99 us", "redb /s", "p50 us", "p99 us", "ratio"
    );
    for p in points {
        println!(
            "{:<46} {:>12.0} {:>9} {:>9} {:>12.0} {:>9} {:>9} {:>7.2}",
            p.what,
            p.mink_per_s,
            p.mink_p50_us,
            p.mink_p99_us,
            p.raw_per_s,
            p.raw_p50_us,
            p.raw_p99_us,
            p.ratio
        );
    }
    Ok(())
}
