//! The lake: tiering and reading back, each beside its baseline in the same run, on the same
//! local object store (SQLite catalog).
//!
//! - **Tiering**: rounds of log rows (4 buckets, 8 192-row batches) through `Lake::tier`
//!   (lake batches built, Parquet written, one Iceberg commit per round with the summary),
//!   beside writing the same lake rows straight to Parquet files on the same store (ZSTD, as
//!   the lake does): what tiering would reach if planning and committing cost nothing.
//! - **Reading back**: every bucket's rows through `Lake::read_bucket` (the union read's lake
//!   side: filtered scan, checked for holes, ordered by offset, cast back to the table's
//!   types), beside a plain iceberg-rust scan of the same rows with the same filter; each
//!   twice, alternating, the best of each.
//! - **Primary-key rounds**: a table of `--pk-keys` keys over 4 buckets, then rounds of
//!   `--pk-changes` changes to random keys (one in ten a delete) through `Lake::tier_changes`:
//!   each round on a lake whose key-location index is warm (it reads only the files added
//!   since its snapshot), beside the same round on a fresh lake (the index rebuilt from every
//!   live file first: what every round cost before the index was kept). Median round time.
//! - **Lake lag**: a node tiering a table with `table.datalake.freshness` under a sustained
//!   write load; its lag (how long the oldest untiered row has waited, as `describe_table`
//!   reports it) sampled every 100 ms after the first round, p99 beside the freshness (the
//!   limit: the lake must never be older than that).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use arrow::array::TimestampMicrosecondArray;
use arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::TryStreamExt as _;
use mink_lake::Lake;
use mink_lake::tier::{BucketRound, LogRows};
use object_store::ObjectStoreExt as _;
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Tiering rounds.
    #[arg(long, default_value_t = 8)]
    rounds: usize,
    /// Rows per round (over 4 buckets).
    #[arg(long, default_value_t = 262_144)]
    rows_per_round: usize,
    /// The lag measurement's `table.datalake.freshness`, in seconds.
    #[arg(long, default_value_t = 4)]
    freshness: u64,
    /// How long the lag measurement writes, in seconds (0 skips it).
    #[arg(long, default_value_t = 20)]
    lag_seconds: u64,
    /// Rows per second written during the lag measurement.
    #[arg(long, default_value_t = 50_000)]
    lag_rows_per_s: u64,
    /// Keys of the primary-key table (0 skips the primary-key rounds).
    #[arg(long, default_value_t = 1_000_000)]
    pk_keys: usize,
    /// Changes per primary-key round.
    #[arg(long, default_value_t = 10_000)]
    pk_changes: usize,
    /// Primary-key rounds of each kind.
    #[arg(long, default_value_t = 4)]
    pk_rounds: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Point {
    what: &'static str,
    rows_per_s: f64,
    mb_per_s: f64,
    baseline: &'static str,
    baseline_rows_per_s: f64,
    ratio: f64,
}

const BUCKETS: u32 = 4;
const BATCH: usize = 8192;

fn columns() -> Schema {
    Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("seq", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
        Field::new("score", DataType::Float64, true),
    ])
}

fn rows(schema: &SchemaRef, from: i64, n: usize) -> anyhow::Result<RecordBatch> {
    let ids = from..from + n as i64;
    Ok(RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(
                ids.clone().map(|i| (i * 7919) % 1_000_003),
            )),
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(
                ids.clone()
                    .map(|i| format!("page_view/{i:08}/campaign-{}", i % 97)),
            )),
            Arc::new(Float64Array::from_iter_values(ids.map(|i| i as f64 * 0.5))),
        ],
    )?)
}

/// The same rows with the lake's system columns, as the baseline writes them.
fn lake_rows(r: &RecordBatch, bucket: u32, base: u64) -> anyhow::Result<RecordBatch> {
    let n = r.num_rows();
    let mut fields: Vec<Field> = r
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("__bucket", DataType::Int32, false));
    fields.push(Field::new("__offset", DataType::Int64, false));
    fields.push(Field::new(
        "__timestamp",
        DataType::Timestamp(
            arrow::datatypes::TimeUnit::Microsecond,
            Some("+00:00".into()),
        ),
        false,
    ));
    let mut cols: Vec<ArrayRef> = r.columns().to_vec();
    cols.push(Arc::new(Int32Array::from(vec![i32::try_from(bucket)?; n])));
    let base = i64::try_from(base)?;
    cols.push(Arc::new(Int64Array::from_iter_values(
        base..base + n as i64,
    )));
    cols.push(Arc::new(
        TimestampMicrosecondArray::from(vec![1_700_000_000_000_000; n]).with_timezone("+00:00"),
    ));
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let objects = dir.path().join("objects");
    let url = objects.to_str().context("utf-8 temp dir")?;
    let store = s3stream::store::open(url)?;
    let lake = Lake::open(
        &format!("sqlite://{}", dir.path().join("metadata.db").display()),
        url,
        Arc::clone(&store),
    )
    .await?;
    let schema: SchemaRef = Arc::new(columns());
    lake.create_table("bench", "events", &schema, &[]).await?;

    // Each round: per bucket, its share of the rows in 8 192-row log batches.
    let per_bucket = args.rows_per_round / BUCKETS as usize;
    let mut rounds = Vec::new();
    let mut next_id = 0i64;
    for r in 0..args.rounds {
        let mut round = Vec::new();
        for b in 0..BUCKETS {
            let start = (r * per_bucket) as u64;
            let mut batches = Vec::new();
            let mut offset = start;
            while offset < start + per_bucket as u64 {
                let n = BATCH.min(usize::try_from(start + per_bucket as u64 - offset)?);
                batches.push(LogRows {
                    base_offset: offset,
                    timestamp_us: 1_700_000_000_000_000,
                    rows: rows(&schema, next_id, n)?,
                });
                next_id += n as i64;
                offset += n as u64;
            }
            round.push(BucketRound {
                partition_id: 0,
                bucket: b,
                start_offset: start,
                end_offset: offset,
                batches,
            });
        }
        rounds.push(round);
    }
    let total_rows = (args.rounds * per_bucket * BUCKETS as usize) as f64;
    let bytes: usize = rounds
        .iter()
        .flatten()
        .flat_map(|r| &r.batches)
        .map(|b| b.rows.get_array_memory_size())
        .sum();
    let mb = bytes as f64 / 1e6;

    // The baseline: the same lake rows straight to Parquet on the same store.
    let baseline_batches: Vec<Vec<RecordBatch>> = rounds
        .iter()
        .map(|round| {
            round
                .iter()
                .flat_map(|r| {
                    r.batches
                        .iter()
                        .map(move |b| lake_rows(&b.rows, r.bucket, b.base_offset))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    for (i, round) in baseline_batches.iter().enumerate() {
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
            .build();
        let mut out = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut out, round[0].schema(), Some(props))?;
        for b in round {
            writer.write(b)?;
        }
        writer.close()?;
        store
            .put(
                &object_store::path::Path::from(format!("baseline/round-{i}.parquet")),
                out.into(),
            )
            .await?;
    }
    let parquet_d = started.elapsed();

    let started = Instant::now();
    for round in rounds {
        lake.tier("bench", "events", round).await?;
    }
    let tier_d = started.elapsed();

    // Reading back: each bucket through Lake::read_bucket, and the same filtered scan plain.
    let table = lake.load_table("bench", "events").await?;
    let snapshot = table
        .metadata()
        .current_snapshot_id()
        .context("a tiered table has a snapshot")?;
    let end = (args.rounds * per_bucket) as u64;
    // Both reads twice, alternating, the best of each: neither gains from the other's cache.
    let (mut read_d, mut scan_d) = (Duration::MAX, Duration::MAX);
    for _ in 0..2 {
        let started = Instant::now();
        let mut read_rows = 0usize;
        for b in 0..BUCKETS {
            read_rows += lake
                .read_bucket(
                    "bench",
                    "events",
                    snapshot,
                    &Default::default(),
                    b,
                    0..end,
                    &schema,
                    None,
                )
                .await?
                .iter()
                .map(RecordBatch::num_rows)
                .sum::<usize>();
        }
        read_d = read_d.min(started.elapsed());
        anyhow::ensure!(read_rows as f64 == total_rows, "read {read_rows} rows");
        let started = Instant::now();
        let mut scan_rows = 0usize;
        for b in 0..BUCKETS {
            let filter = iceberg::expr::Reference::new("__bucket")
                .equal_to(iceberg::spec::Datum::int(i32::try_from(b)?));
            let batches: Vec<RecordBatch> = table
                .scan()
                .snapshot_id(snapshot)
                .with_filter(filter)
                .build()?
                .to_arrow()
                .await?
                .try_collect()
                .await?;
            scan_rows += batches.iter().map(RecordBatch::num_rows).sum::<usize>();
        }
        scan_d = scan_d.min(started.elapsed());
        anyhow::ensure!(
            scan_rows == read_rows,
            "the plain scan read {scan_rows} rows"
        );
    }

    let per_s = |d: Duration| total_rows / d.as_secs_f64();
    let points = [
        Point {
            what: "tiering (Lake::tier)",
            rows_per_s: per_s(tier_d),
            mb_per_s: mb / tier_d.as_secs_f64(),
            baseline: "Parquet straight to the store",
            baseline_rows_per_s: per_s(parquet_d),
            ratio: parquet_d.as_secs_f64() / tier_d.as_secs_f64(),
        },
        Point {
            what: "lake read (Lake::read_bucket)",
            rows_per_s: per_s(read_d),
            mb_per_s: mb / read_d.as_secs_f64(),
            baseline: "iceberg-rust scan",
            baseline_rows_per_s: per_s(scan_d),
            ratio: scan_d.as_secs_f64() / read_d.as_secs_f64(),
        },
    ];
    print(&points, args.json, total_rows, args.rounds)?;
    if args.pk_keys > 0 {
        let pk = pk_rounds(&args, dir.path(), url, &store).await?;
        print_pk(&pk, args.json)?;
    }
    if args.lag_seconds > 0 {
        let lag = lake_lag(&args).await?;
        print_lag(&lag, args.json)?;
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct PkRounds {
    keys: usize,
    changes: usize,
    rounds: usize,
    /// Median round time with the key index warm.
    indexed_ms: f64,
    /// Key-column file reads per round with the index warm.
    indexed_files_per_round: f64,
    /// Median round time on a fresh lake (the index rebuilt from every live file first).
    rebuilt_ms: f64,
    rebuilt_files_per_round: f64,
    /// Rebuilt over indexed: how many times cheaper a round is with the index kept.
    ratio: f64,
}

/// Bucket `bucket`'s changes `ops` ((key, upsert)) at offsets from `next[bucket]` on, which
/// moves past them; each row's `event` is `label`.
fn bucket_changes(
    schema: &SchemaRef,
    bucket: u32,
    ops: &[(i64, bool)],
    next: &mut [u64],
    label: &str,
) -> anyhow::Result<mink_lake::pk::BucketChanges> {
    let at = usize::try_from(bucket)?;
    let from = next[at];
    let end = from + ops.len() as u64;
    next[at] = end;
    let rows = RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(ops.iter().map(|o| o.0))),
            Arc::new(Int64Array::from_iter_values((from..end).map(|o| o as i64))),
            Arc::new(StringArray::from_iter_values(ops.iter().map(|_| label))),
            Arc::new(Float64Array::from_iter_values(
                ops.iter().map(|o| o.0 as f64),
            )),
        ],
    )?;
    Ok(mink_lake::pk::BucketChanges {
        partition_id: 0,
        partition: Default::default(),
        bucket,
        start_offset: from,
        end_offset: end,
        changes: vec![mink_lake::pk::ChangeRows {
            rows,
            offsets: (from..end).collect(),
            timestamps_us: vec![1_700_000_000_000_000; ops.len()],
            upsert: ops.iter().map(|o| o.1).collect(),
        }],
    })
}

/// `n` changes to keys below `keys`, spread over the buckets by key (`key % 4`), at offsets
/// continuing each bucket's `next`; one in ten a delete.
fn pk_changes(
    schema: &SchemaRef,
    rng: &mut impl rand::Rng,
    keys: usize,
    n: usize,
    next: &mut [u64],
    label: &str,
) -> anyhow::Result<Vec<mink_lake::pk::BucketChanges>> {
    let mut per_bucket: Vec<Vec<(i64, bool)>> = vec![Vec::new(); BUCKETS as usize];
    for _ in 0..n {
        let k = rng.random_range(0..keys as i64);
        per_bucket[usize::try_from(k % i64::from(BUCKETS))?]
            .push((k, rng.random_range(0..10) != 0));
    }
    (0..BUCKETS)
        .zip(per_bucket)
        .filter(|(_, ops)| !ops.is_empty())
        .map(|(b, ops)| bucket_changes(schema, b, &ops, next, label))
        .collect()
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort_unstable();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The primary-key rounds (see the module doc), on the benchmark's store and catalog.
async fn pk_rounds(
    args: &Args,
    dir: &std::path::Path,
    url: &str,
    store: &Arc<dyn object_store::ObjectStore>,
) -> anyhow::Result<PkRounds> {
    use rand::SeedableRng as _;
    let metadata = format!("sqlite://{}", dir.join("metadata.db").display());
    let open = || Lake::open(&metadata, url, Arc::clone(store));
    let schema: SchemaRef = Arc::new(columns());
    let key = vec!["user_id".to_string()];
    let warm = open().await?;
    warm.create_table("bench", "users", &schema, &[]).await?;
    let mut next = vec![0u64; BUCKETS as usize];
    // Every key once, in 4 rounds (files of a quarter of the table each).
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for part in 0..4 {
        let keys: Vec<i64> = (0..args.pk_keys as i64)
            .filter(|k| (k / 1000) % 4 == part)
            .collect();
        let rounds = (0..BUCKETS)
            .map(|b| {
                let mine: Vec<(i64, bool)> = keys
                    .iter()
                    .filter(|k| *k % i64::from(BUCKETS) == i64::from(b))
                    .map(|k| (*k, true))
                    .collect();
                bucket_changes(&schema, b, &mine, &mut next, "first")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        warm.tier_changes("bench", "users", &key, rounds).await?;
    }
    let (mut indexed, mut rebuilt) = (Vec::new(), Vec::new());
    let (mut indexed_files, mut rebuilt_files) = (0u64, 0u64);
    for _ in 0..args.pk_rounds {
        let changes = pk_changes(
            &schema,
            &mut rng,
            args.pk_keys,
            args.pk_changes,
            &mut next,
            "warm",
        )?;
        let read = warm.key_files_read();
        let started = Instant::now();
        warm.tier_changes("bench", "users", &key, changes).await?;
        indexed.push(started.elapsed());
        indexed_files += warm.key_files_read() - read;

        let cold = open().await?;
        let changes = pk_changes(
            &schema,
            &mut rng,
            args.pk_keys,
            args.pk_changes,
            &mut next,
            "cold",
        )?;
        let started = Instant::now();
        cold.tier_changes("bench", "users", &key, changes).await?;
        rebuilt.push(started.elapsed());
        rebuilt_files += cold.key_files_read();
    }
    let live = warm.scan("bench", "users").await?;
    anyhow::ensure!(
        live.iter().map(RecordBatch::num_rows).sum::<usize>() <= args.pk_keys,
        "more live rows than keys"
    );
    let rounds = args.pk_rounds as f64;
    let (indexed_ms, rebuilt_ms) = (median(indexed), median(rebuilt));
    Ok(PkRounds {
        keys: args.pk_keys,
        changes: args.pk_changes,
        rounds: args.pk_rounds,
        indexed_ms,
        indexed_files_per_round: indexed_files as f64 / rounds,
        rebuilt_ms,
        rebuilt_files_per_round: rebuilt_files as f64 / rounds,
        ratio: rebuilt_ms / indexed_ms,
    })
}

#[allow(clippy::print_stdout)]
fn print_pk(pk: &PkRounds, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(pk)?);
        return Ok(());
    }
    println!(
        "Primary-key rounds of {} changes on {} keys, {} each: key index kept {:.0} ms ({:.1} files read), rebuilt first {:.0} ms ({:.1} files read); rebuilt/kept {:.1}",
        pk.changes,
        pk.keys,
        pk.rounds,
        pk.indexed_ms,
        pk.indexed_files_per_round,
        pk.rebuilt_ms,
        pk.rebuilt_files_per_round,
        pk.ratio
    );
    Ok(())
}

#[derive(Debug, Serialize)]
struct Lag {
    what: &'static str,
    freshness_ms: u64,
    rows_per_s: u64,
    samples: usize,
    p50_ms: u64,
    p99_ms: u64,
    max_ms: u64,
    /// p99 over the freshness: at most 1 meets the goal.
    ratio: f64,
}

/// A node with one lake table under a steady write load; its lake lag sampled every 100 ms
/// once the first round is recorded.
async fn lake_lag(args: &Args) -> anyhow::Result<Lag> {
    use mink_node::{Node, NodeConfig, TableSpec, WriteTarget};
    let dir = tempfile::tempdir()?;
    let mut c = NodeConfig::new(
        1,
        &format!("sqlite://{}", dir.path().join("meta.db").display()),
        dir.path()
            .join("objects")
            .to_str()
            .context("utf-8 temp dir")?,
    );
    c.advertised_address = "127.0.0.1:7001".into();
    c.kv_dir = dir.path().join("kv");
    c.engine.flush_delay = Duration::from_millis(5);
    let node = Node::start(c).await?;
    node.create_database("bench", false).await?;
    let schema: SchemaRef = Arc::new(columns());
    node.create_table(TableSpec {
        database: "bench".into(),
        name: "lag".into(),
        schema: schema.as_ref().clone(),
        primary_key: vec![],
        options: crate::options(&[
            ("bucket.num", BUCKETS.to_string()),
            ("bucket.key", "user_id".to_string()),
            ("table.datalake.enabled", "true".to_string()),
            ("table.datalake.freshness", format!("{}s", args.freshness)),
        ]),
        partition_keys: vec![],
        comment: String::new(),
        if_not_exists: false,
    })
    .await?;
    // Writes every 100 ms, a tenth of the rate each time.
    let writer = {
        let node = node.clone();
        let schema = Arc::clone(&schema);
        let per_tick = usize::try_from((args.lag_rows_per_s / 10).max(1))?;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut next = 0i64;
            loop {
                tick.tick().await;
                let batch = rows(&schema, next, per_tick)?;
                next += per_tick as i64;
                for w in node
                    .write("bench", "lag", &batch, &WriteTarget::default())
                    .await?
                {
                    w.result.map_err(|e| anyhow::anyhow!("write: {e}"))?;
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), anyhow::Error>(())
        })
    };
    let until = Instant::now() + Duration::from_secs(args.lag_seconds);
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while Instant::now() < until {
        tick.tick().await;
        anyhow::ensure!(!writer.is_finished(), "the writer stopped");
        let info = node.describe_table("bench", "lag")?;
        let lake = info.lake.context("a lake table without lake info")?;
        if lake.snapshot_id.is_some() {
            samples.push(lake.lag_ms);
        }
    }
    writer.abort();
    node.shutdown().await;
    anyhow::ensure!(
        !samples.is_empty(),
        "no round was tiered in {}s",
        args.lag_seconds
    );
    samples.sort_unstable();
    let at = |percent: usize| samples[(samples.len() - 1) * percent / 100];
    let freshness_ms = args.freshness * 1000;
    Ok(Lag {
        what: "lake lag (describe_table)",
        freshness_ms,
        rows_per_s: args.lag_rows_per_s,
        samples: samples.len(),
        p50_ms: at(50),
        p99_ms: at(99),
        max_ms: at(100),
        ratio: at(99) as f64 / freshness_ms as f64,
    })
}

#[allow(clippy::print_stdout)]
fn print_lag(lag: &Lag, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(lag)?);
        return Ok(());
    }
    println!(
        "Lake lag under {} rows/s, {} samples: p50 {} ms, p99 {} ms, max {} ms; freshness {} ms; p99/freshness {:.2} (goal <= 1)",
        lag.rows_per_s,
        lag.samples,
        lag.p50_ms,
        lag.p99_ms,
        lag.max_ms,
        lag.freshness_ms,
        lag.ratio
    );
    Ok(())
}

#[allow(clippy::print_stdout)]
fn print(points: &[Point], json: bool, rows: f64, rounds: usize) -> anyhow::Result<()> {
    if json {
        for p in points {
            println!("{}", serde_json::to_string(p)?);
        }
        return Ok(());
    }
    println!(
        "The lake on the local object store (SQLite catalog): {rows} rows x 4 columns over 4 buckets in {rounds} rounds"
    );
    println!(
        "{:<32} {:>12} {:>9} {:<32} {:>12} {:>7}",
        "what", "rows/s", "MB/s", "baseline", "rows/s", "ratio"
    );
    for p in points {
        println!(
            "{:<32} {:>12.0} {:>9.1} {:<32} {:>12.0} {:>7.2}",
            p.what, p.rows_per_s, p.mb_per_s, p.baseline, p.baseline_rows_per_s, p.ratio
        );
    }
    Ok(())
}
