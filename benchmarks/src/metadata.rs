//! Metadata command log benchmark.
//!
//! For each database (SQLite file, Postgres) it first measures the raw baseline: one
//! connection appending 256-row multi-row INSERTs to a table shaped like `meta_log`, rows/s.
//! Then it runs sinks with N concurrent proposers (each proposing `PutKv` in a loop) and reports
//! proposals/s, p50/p99 latency, the append-conflict rate and every sink's p99, with the ratio
//! to the baseline. The goal for 256 proposers on one sink is at least half the baseline.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use mink_metadata::{Command, PutKv};
use mink_sql::{LogStore, PostgresStore, Sink, SinkConfig, SinkStats, SqliteStore};
use serde::Serialize;
use sqlx::postgres::PgConnectOptions;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Postgres to measure (a throwaway server: each run creates its own schemas).
    #[arg(long, env = "MINK_BENCH_POSTGRES_URL")]
    postgres_url: Option<String>,
    /// Where the SQLite files go (default: a temporary directory).
    #[arg(long, env = "MINK_BENCH_SQLITE_DIR")]
    sqlite_dir: Option<std::path::PathBuf>,
    /// Measured seconds per point (after one second of warm-up).
    #[arg(long, default_value_t = 5.0, env = "MINK_BENCH_SECONDS")]
    seconds: f64,
    /// Concurrent proposers on one sink.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 256])]
    proposers: Vec<usize>,
    /// Sink counts on one Postgres (proposers spread over them).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 3, 10])]
    sinks: Vec<usize>,
    /// Total proposers in the multi-sink runs.
    #[arg(long, default_value_t = 256)]
    multi_sink_proposers: usize,
    /// Bytes of each proposed value.
    #[arg(long, default_value_t = 32)]
    value_bytes: usize,
    /// Which databases to measure (default: SQLite, and Postgres when a URL is given).
    #[arg(long, value_delimiter = ',', value_enum)]
    backends: Vec<Backend>,
    /// Also print the results as JSON lines.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
enum Backend {
    SqliteFile,
    Postgres,
}

/// How to open one fresh database, several times (one store per sink).
enum Target {
    Sqlite(String),
    Postgres(Box<PgConnectOptions>),
}

/// Drops what a point wrote and flushes it out, so the next point does not pay for it
/// (a raw baseline alone writes millions of rows).
async fn clean_up(target: Target, postgres_url: Option<&str>) -> anyhow::Result<()> {
    match target {
        Target::Sqlite(url) => {
            let path = url.trim_start_matches("sqlite://").to_string();
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{path}{suffix}"));
            }
        }
        Target::Postgres(options) => {
            let schema = options
                .get_options()
                .and_then(|o| o.split("search_path=").nth(1).map(str::to_string))
                .unwrap_or_default();
            if let Some(url) = postgres_url {
                let mut conn: sqlx::PgConnection = sqlx::Connection::connect(url).await?;
                if !schema.is_empty() {
                    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
                        .execute(&mut conn)
                        .await?;
                }
                // Needs a superuser, which a throwaway server has; best effort otherwise.
                let _ = sqlx::query("CHECKPOINT").execute(&mut conn).await;
            }
        }
    }
    Ok(())
}

impl Target {
    async fn open(&self) -> anyhow::Result<Arc<dyn LogStore>> {
        Ok(match self {
            Target::Sqlite(url) => Arc::new(SqliteStore::connect(url).await?),
            Target::Postgres(o) => Arc::new(PostgresStore::connect_with(o.as_ref().clone()).await?),
        })
    }
}

#[derive(Debug, Serialize)]
struct Point {
    backend: Backend,
    sinks: usize,
    proposers: usize,
    proposals_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    rows_per_s: f64,
    commands_per_row: f64,
    /// Appends that lost the race for an index, per appended row.
    conflict_rate: f64,
    per_sink_p99_ms: Vec<f64>,
    per_sink_proposals_per_s: Vec<f64>,
    raw_rows_per_s: f64,
    ratio_to_raw: f64,
}

struct Fresh {
    next: u64,
    sqlite_dir: std::path::PathBuf,
    postgres_url: Option<String>,
}

impl Fresh {
    async fn target(&mut self, backend: Backend) -> anyhow::Result<Target> {
        self.next += 1;
        match backend {
            Backend::SqliteFile => {
                let path = self.sqlite_dir.join(format!("bench-{}.db", self.next));
                Ok(Target::Sqlite(format!("sqlite://{}", path.display())))
            }
            Backend::Postgres => {
                let url = self.postgres_url.as_ref().context("no Postgres URL")?;
                let schema = format!("bench_{}_{:08x}", self.next, rand::random::<u32>());
                let mut conn: sqlx::PgConnection = sqlx::Connection::connect(url).await?;
                sqlx::query(&format!("CREATE SCHEMA {schema}"))
                    .execute(&mut conn)
                    .await?;
                Ok(Target::Postgres(Box::new(
                    PgConnectOptions::from_str(url)?.options([("search_path", schema.as_str())]),
                )))
            }
        }
    }
}

/// One connection, 256-row multi-row INSERTs into a `meta_log`-shaped table, for `seconds`.
async fn raw_baseline(target: &Target, seconds: f64, value_bytes: usize) -> anyhow::Result<f64> {
    const ROWS: usize = 256;
    let payload = vec![7u8; value_bytes + 16];
    let deadline = Duration::from_secs_f64(seconds);
    let mut next: i64 = 1;
    let mut inserted = 0usize;
    match target {
        Target::Sqlite(url) => {
            // The same settings the sink uses: WAL, synchronous=FULL, BEGIN IMMEDIATE.
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sqlx::sqlite::SqliteSynchronous::Full);
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await?;
            sqlx::query(
                "CREATE TABLE raw_log (idx INTEGER PRIMARY KEY NOT NULL, payload BLOB NOT NULL)",
            )
            .execute(&pool)
            .await?;
            let sql = insert_sql(ROWS, |i| format!("(?{}, ?{})", 2 * i + 1, 2 * i + 2));
            let started = Instant::now();
            while started.elapsed() < deadline {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                let mut q = sqlx::query(&sql);
                for _ in 0..ROWS {
                    q = q.bind(next).bind(&payload);
                    next += 1;
                }
                q.execute(&mut *tx).await?;
                tx.commit().await?;
                inserted += ROWS;
            }
            Ok(inserted as f64 / started.elapsed().as_secs_f64())
        }
        Target::Postgres(options) => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_with(options.as_ref().clone())
                .await?;
            sqlx::query("CREATE TABLE raw_log (idx BIGINT PRIMARY KEY, payload BYTEA NOT NULL)")
                .execute(&pool)
                .await?;
            let sql = insert_sql(ROWS, |i| format!("(${}, ${})", 2 * i + 1, 2 * i + 2));
            let started = Instant::now();
            while started.elapsed() < deadline {
                let mut q = sqlx::query(&sql);
                for _ in 0..ROWS {
                    q = q.bind(next).bind(&payload);
                    next += 1;
                }
                q.execute(&pool).await?;
                inserted += ROWS;
            }
            Ok(inserted as f64 / started.elapsed().as_secs_f64())
        }
    }
}

fn insert_sql(rows: usize, value: impl Fn(usize) -> String) -> String {
    let values: Vec<String> = (0..rows).map(value).collect();
    format!(
        "INSERT INTO raw_log (idx, payload) VALUES {}",
        values.join(", ")
    )
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// `sinks` sinks on fresh connections to `target`, `proposers` tasks spread over them.
async fn measure(
    backend: Backend,
    target: &Target,
    sinks: usize,
    proposers: usize,
    args: &Args,
    raw: f64,
) -> anyhow::Result<Point> {
    let mut started_sinks = Vec::new();
    for n in 0..sinks {
        let mut config = SinkConfig::new(n as u64 + 1);
        config.address = format!("bench-{n}");
        started_sinks.push(Sink::start(target.open().await?, config).await?);
    }
    let value = vec![b'v'; args.value_bytes];
    let warmup = Duration::from_secs(1);
    let measured = Duration::from_secs_f64(args.seconds);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..proposers {
        let sink_index = p % sinks;
        let sink = started_sinks[sink_index].clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            let mut i = 0u64;
            let mut in_window = 0u64;
            loop {
                let now = Instant::now();
                if now >= t0 + warmup + measured {
                    break;
                }
                let command = Command::PutKv(PutKv {
                    key: format!("bench/{p}/{}", i % 64),
                    value: value.clone(),
                });
                i += 1;
                let proposed = sink.propose(command).await?;
                if proposed.result.is_err() {
                    bail!("proposal rejected: {:?}", proposed.result);
                }
                let done = Instant::now();
                if now >= t0 + warmup && done <= t0 + warmup + measured {
                    h.record(
                        u64::try_from(done.duration_since(now).as_micros()).unwrap_or(u64::MAX),
                    )?;
                    in_window += 1;
                }
            }
            Ok::<_, anyhow::Error>((sink_index, h, in_window))
        }));
    }
    // Appends and conflicts counted over the measured window only.
    tokio::time::sleep_until((t0 + warmup).into()).await;
    let stats_at = |f: fn(&SinkStats) -> &std::sync::atomic::AtomicU64| {
        started_sinks
            .iter()
            .map(|s| SinkStats::get(f(s.stats())))
            .sum::<u64>()
    };
    let rows_before = stats_at(|s| &s.rows_appended);
    let commands_before = stats_at(|s| &s.commands_appended);
    let conflicts_before = stats_at(|s| &s.append_conflicts);
    tokio::time::sleep_until((t0 + warmup + measured).into()).await;
    let rows = stats_at(|s| &s.rows_appended) - rows_before;
    let commands = stats_at(|s| &s.commands_appended) - commands_before;
    let conflicts = stats_at(|s| &s.append_conflicts) - conflicts_before;

    let mut all = histogram();
    let mut per_sink = vec![histogram(); sinks];
    let mut per_sink_count = vec![0u64; sinks];
    let mut completed = 0u64;
    for t in tasks {
        let (sink_index, h, n) = t.await??;
        all.add(&h)?;
        per_sink[sink_index].add(&h)?;
        per_sink_count[sink_index] += n;
        completed += n;
    }
    for sink in &started_sinks {
        sink.shutdown().await;
    }
    let secs = measured.as_secs_f64();
    let proposals_per_s = completed as f64 / secs;
    Ok(Point {
        backend,
        sinks,
        proposers,
        proposals_per_s,
        p50_ms: ms(&all, 0.5),
        p99_ms: ms(&all, 0.99),
        rows_per_s: rows as f64 / secs,
        commands_per_row: if rows == 0 {
            0.0
        } else {
            commands as f64 / rows as f64
        },
        conflict_rate: if rows == 0 {
            0.0
        } else {
            conflicts as f64 / rows as f64
        },
        per_sink_p99_ms: per_sink.iter().map(|h| ms(h, 0.99)).collect(),
        per_sink_proposals_per_s: per_sink_count.iter().map(|&n| n as f64 / secs).collect(),
        raw_rows_per_s: raw,
        ratio_to_raw: proposals_per_s / raw,
    })
}

fn print_table(points: &[Point]) {
    #[allow(clippy::print_stdout)]
    {
        println!(
            "\n{:<12} {:>5} {:>9} {:>12} {:>8} {:>8} {:>9} {:>9} {:>9} {:>12} {:>7}  per-sink p99 ms",
            "backend",
            "sinks",
            "proposers",
            "proposals/s",
            "p50 ms",
            "p99 ms",
            "rows/s",
            "cmds/row",
            "conflicts",
            "raw rows/s",
            "ratio"
        );
        for p in points {
            let per_sink: Vec<String> = p
                .per_sink_p99_ms
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect();
            println!(
                "{:<12} {:>5} {:>9} {:>12.0} {:>8.2} {:>8.2} {:>9.0} {:>9.1} {:>9.3} {:>12.0} {:>7.2}  {}",
                format!("{:?}", p.backend),
                p.sinks,
                p.proposers,
                p.proposals_per_s,
                p.p50_ms,
                p.p99_ms,
                p.rows_per_s,
                p.commands_per_row,
                p.conflict_rate,
                p.raw_rows_per_s,
                p.ratio_to_raw,
                per_sink.join(" ")
            );
        }
        if let Some(goal) = points
            .iter()
            .filter(|p| p.sinks == 1 && p.proposers == 256)
            .map(|p| format!("{:?} {:.2}", p.backend, p.ratio_to_raw))
            .reduce(|a, b| format!("{a}, {b}"))
        {
            println!("\ngoal: 256 proposers on one sink >= 0.50 of the raw baseline: {goal}");
        }
    }
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let temp = tempfile::tempdir()?;
    let mut fresh = Fresh {
        next: 0,
        sqlite_dir: args
            .sqlite_dir
            .clone()
            .unwrap_or_else(|| temp.path().to_path_buf()),
        postgres_url: args.postgres_url.clone(),
    };
    std::fs::create_dir_all(&fresh.sqlite_dir)?;
    let mut backends = args.backends.clone();
    if backends.is_empty() {
        backends.push(Backend::SqliteFile);
        if args.postgres_url.is_some() {
            backends.push(Backend::Postgres);
        }
    }
    if backends.contains(&Backend::Postgres) && args.postgres_url.is_none() {
        bail!("--backends postgres needs --postgres-url (or MINK_BENCH_POSTGRES_URL)");
    }
    let mut points = Vec::new();
    let url = args.postgres_url.clone();
    for backend in backends {
        let target = fresh.target(backend).await?;
        let raw = raw_baseline(&target, args.seconds, args.value_bytes).await?;
        clean_up(target, url.as_deref()).await?;
        let mut runs: Vec<(usize, usize)> = args.proposers.iter().map(|&p| (1, p)).collect();
        if backend == Backend::Postgres {
            let multi = args.multi_sink_proposers;
            runs.extend(args.sinks.iter().filter(|&&s| s > 1).map(|&s| (s, multi)));
        }
        for (sinks, proposers) in runs {
            let target = fresh.target(backend).await?;
            points.push(measure(backend, &target, sinks, proposers, &args, raw).await?);
            clean_up(target, url.as_deref()).await?;
            report_progress(points.last());
        }
    }
    print_table(&points);
    if args.json {
        for p in &points {
            #[allow(clippy::print_stdout)]
            {
                println!("{}", serde_json::to_string(p)?);
            }
        }
    }
    Ok(())
}

fn report_progress(point: Option<&Point>) {
    if let Some(p) = point {
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "{:?} sinks={} proposers={}: {:.0} proposals/s (raw {:.0} rows/s)",
                p.backend, p.sinks, p.proposers, p.proposals_per_s, p.raw_rows_per_s
            );
        }
    }
}
