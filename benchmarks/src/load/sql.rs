//! `mink-bench sql`: statements over Flight SQL against any server that speaks it (`mink dev`,
//! `mink-query serve`, or another engine for comparison): statements/s, result rows and MB/s,
//! and statement latency percentiles, from when a statement was due (GetFlightInfo through
//! its last batch, so a paced run that falls behind shows it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::TryStreamExt as _;

use super::{Figures, Mode, Pacer, Recorder, Shared, progress, report};

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct SqlArgs {
    /// A Flight SQL address (`host:port`).
    #[arg(long)]
    pub(crate) flight_sql: String,
    /// A statement (repeatable: each client runs them in turn).
    #[arg(long = "query", required = true)]
    pub(crate) queries: Vec<String>,
    /// Concurrent clients, each on its own connection.
    #[arg(long, default_value_t = 4)]
    pub(crate) clients: usize,
    /// Statements per second over all clients; 0: each client starts its next statement when
    /// the last one is done.
    #[arg(long, default_value_t = 0)]
    pub(crate) rate: u64,
    /// How long clients run statements (seconds).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) duration: f64,
    /// Stop after this many statements.
    #[arg(long)]
    pub(crate) max_queries: Option<u64>,
    /// Write a report with throughput and latency plots (`.md` or `.html`).
    #[arg(long)]
    pub(crate) report: Option<std::path::PathBuf>,
    /// Print the summary as one JSON object too.
    #[arg(long)]
    pub(crate) json: bool,
}

impl SqlArgs {
    fn check(&self) -> anyhow::Result<()> {
        if self.clients == 0 {
            bail!("--clients takes at least 1");
        }
        if !(self.duration > 0.0 && self.duration.is_finite()) {
            bail!("--duration {}: a positive number of seconds", self.duration);
        }
        if self.queries.iter().any(|q| q.trim().is_empty()) {
            bail!("--query: an empty statement");
        }
        if let Some(report) = &self.report {
            report::check(report)?;
        }
        Ok(())
    }
}

/// One client: statements until the duration or its quota is over; the rows it read.
async fn client(
    args: Arc<SqlArgs>,
    index: usize,
    start: Instant,
    recorder: Shared,
) -> anyhow::Result<u64> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", args.flight_sql))?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {}", args.flight_sql))?;
    let mut sql = FlightSqlServiceClient::new(channel);
    let per_client = (args.rate > 0).then(|| args.rate as f64 / args.clients as f64);
    let quota = args.max_queries.map(|m| {
        let n = args.clients as u64;
        m / n + u64::from((index as u64) < m % n)
    });
    let stop = start + Duration::from_secs_f64(args.duration);
    let mut pacer = Pacer::new(start, per_client);
    let mut rows = 0u64;
    let mut done = 0u64;
    let mut next = index;
    while Instant::now() < stop && quota.is_none_or(|q| done < q) {
        let due = pacer.next(1).await;
        if due >= stop {
            break; // due after the run: not run
        }
        let query = &args.queries[next % args.queries.len()];
        next += 1;
        let info = match sql.execute(query.clone(), None).await {
            Ok(info) => info,
            // A Mink node's Flight service answers a statement as a table read without a
            // table's path: the user gave its Flight port.
            Err(e) if e.to_string().contains("expected a path descriptor") => bail!(
                "{} serves Arrow Flight, not Flight SQL: give --flight-sql a Flight SQL address, a node's --sql-listen (127.0.0.1:7272 under `mink dev`) or `mink-query serve`'s",
                args.flight_sql
            ),
            Err(e) => return Err(e).with_context(|| format!("running {query:?}")),
        };
        let mut bytes = 0u64;
        for endpoint in info.endpoint {
            let ticket = endpoint.ticket.context("an endpoint without a ticket")?;
            let mut batches = sql
                .do_get(ticket)
                .await
                .with_context(|| format!("reading the result of {query:?}"))?;
            while let Some(batch) = batches.try_next().await? {
                rows += batch.num_rows() as u64;
                bytes += batch.get_array_memory_size() as u64;
            }
        }
        let now = Instant::now();
        recorder
            .lock()
            .expect("recorder lock")
            .record(now, 1, bytes, Some(now - due));
        done += 1;
    }
    Ok(rows)
}

#[allow(clippy::print_stdout, clippy::print_stderr)] // the user's output
pub(crate) async fn run(args: SqlArgs) -> anyhow::Result<()> {
    args.check()?;
    let args = Arc::new(args);
    let start = Instant::now();
    let recorder: Shared = Arc::new(Mutex::new(Recorder::new(start)));
    let (bar, ticker) = progress(
        Mode::Sql,
        "flight-sql",
        vec![("statements", Arc::clone(&recorder))],
    );
    let rows = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..args.clients)
        .map(|i| {
            let (args, recorder, rows) =
                (Arc::clone(&args), Arc::clone(&recorder), Arc::clone(&rows));
            tokio::spawn(async move {
                let n = client(args, i, start, recorder).await?;
                rows.fetch_add(n, Ordering::Relaxed);
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    let mut result = Ok(());
    for c in clients {
        if let Err(e) = c.await.context("a client panicked").and_then(|r| r) {
            result = Err(e);
        }
    }
    ticker.abort();
    bar.finish_and_clear();
    result?;
    let (figures, timeline) = {
        let r = recorder.lock().expect("recorder lock");
        (Figures::of("statements", &r), r.seconds.clone())
    };
    if figures.records == 0 {
        bail!("no statement finished in {} s", args.duration);
    }
    let rows = rows.load(Ordering::Relaxed);
    let summary = summary(&args, &figures, rows);
    println!("{summary}");
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "workload": "sql",
                "transport": "flight-sql",
                "address": args.flight_sql,
                "queries": args.queries,
                "clients": args.clients,
                "rate": args.rate,
                "rows": rows,
                "figures": [figures],
            })
        );
    }
    if let Some(path) = &args.report {
        report::write(
            path,
            "mink-bench sql over flight-sql",
            &summary,
            &[("statements", timeline)],
        )
        .with_context(|| format!("writing the report {}", path.display()))?;
        eprintln!("report: {}", path.display());
    }
    Ok(())
}

fn summary(args: &SqlArgs, f: &Figures, rows: u64) -> String {
    let mut out = format!(
        "sql over flight-sql at {}: {} statement(s), {} clients, {}\n\n",
        args.flight_sql,
        args.queries.len(),
        args.clients,
        if args.rate > 0 {
            format!("rate {} statements/s", args.rate)
        } else {
            "closed loop".to_string()
        },
    );
    out.push_str(&format!(
        "(latency: due to last result batch; MB/s: results as Arrow in memory; {rows} rows, {:.0} rows/s)\n\n",
        rows as f64 / f.seconds
    ));
    out.push_str("| side | statements | seconds | statements/s | MB/s | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms |");
    if args.rate > 0 {
        out.push_str(" / rate |");
    }
    out.push_str("\n|---|---|---|---|---|---|---|---|---|---|");
    if args.rate > 0 {
        out.push_str("---|");
    }
    out.push_str(&format!(
        "\n| {} | {} | {:.2} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
        f.side,
        f.records,
        f.seconds,
        f.records_per_s,
        f.mb_per_s,
        f.p50_ms,
        f.p95_ms,
        f.p99_ms,
        f.p999_ms,
        f.max_ms,
    ));
    if args.rate > 0 {
        out.push_str(&format!(" {:.2} |", f.records_per_s / args.rate as f64));
    }
    out.push('\n');
    out
}
