//! The benchmark a user points at a running cluster: `produce`, `consume` and `e2e` (produce
//! and consume at once, latency from send to receipt) over Arrow Flight (a Mink node) or the
//! Kafka protocol (Mink's Kafka listener, or any Kafka-compatible broker: the same workload
//! runs against both, so they can be compared side by side).
//!
//! Records carry their send time (microseconds since the epoch: the first 8 bytes of a Kafka
//! value, the `sent_us` column of a Flight table) and pad to `--record-size` bytes. Latency is
//! measured from when a record was due to be sent, not when the client got round to it, so a
//! rate-limited run that falls behind shows it (no coordinated omission). Live progress goes to
//! the terminal; the summary is a Markdown table on stdout, with `--json` a JSON line, and
//! `--report` writes a Markdown or HTML report with throughput and latency plots.

mod flight;
mod kafka;
mod report;
pub(crate) mod sql;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;

/// What a workload runs against and how.
#[derive(clap::Args, Debug, Clone)]
#[group(id = "load")]
#[command(group = clap::ArgGroup::new("target").args(["flight", "kafka"]).required(true))]
pub(crate) struct Args {
    /// A Mink node's Arrow Flight address (`host:port`).
    #[arg(long, group = "target")]
    pub(crate) flight: Option<String>,
    /// A Kafka-protocol bootstrap address (`host:port`): Mink's Kafka listener or any Kafka
    /// broker.
    #[arg(long, group = "target")]
    pub(crate) kafka: Option<String>,
    /// The topic (Kafka) or table (Flight, in `--database`); created with `--partitions` when
    /// it does not exist (an existing one is used as it is).
    #[arg(long, default_value = "mink-bench")]
    pub(crate) topic: String,
    /// The database of the Flight table.
    #[arg(long, default_value = "bench")]
    pub(crate) database: String,
    /// Partitions (buckets) of a topic or table the benchmark creates, default 4. An existing
    /// one keeps its own, as kafka-producer-perf-test does; the summary says so.
    #[arg(long)]
    pub(crate) partitions: Option<u32>,
    /// Bytes per record: the send time (8 bytes) and padding.
    #[arg(long, default_value_t = 1024)]
    pub(crate) record_size: usize,
    /// Concurrent producers (each its own Flight writer or Kafka producer).
    #[arg(long, default_value_t = 1)]
    pub(crate) producers: usize,
    /// Concurrent consumers (the partitions are shared among them).
    #[arg(long, default_value_t = 1)]
    pub(crate) consumers: usize,
    /// Records per Flight write (Kafka producers batch as librdkafka does: see
    /// `--kafka-config`).
    #[arg(long, default_value_t = 1000)]
    pub(crate) batch_records: usize,
    /// Bytes of records a Kafka producer has unacknowledged at most, default 8 MiB
    /// (librdkafka's own queue holds up to 1 GiB: without a bound an unthrottled run measures
    /// how long records wait in the client, not the broker); at least `--record-size`. A
    /// Flight writer has one write of `--batch-records` in flight instead.
    #[arg(long)]
    pub(crate) in_flight_bytes: Option<usize>,
    /// Records per second over all producers; 0 sends as fast as acknowledgements allow.
    #[arg(long, default_value_t = 0)]
    pub(crate) rate: u64,
    /// How long producers send (seconds); a consume run stops then too.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) duration: f64,
    /// Stop producing after this many records.
    #[arg(long)]
    pub(crate) max_records: Option<u64>,
    /// Kafka `acks`: `all`, `1` or `0`. A Flight write is acknowledged once durable on object
    /// storage, which is `all`.
    #[arg(long, default_value = "all")]
    pub(crate) acks: String,
    /// More librdkafka settings, `key=value` (repeatable).
    #[arg(long = "kafka-config", value_parser = key_value)]
    pub(crate) kafka_config: Vec<(String, String)>,
    /// Write a report with throughput and latency plots: `.md` (plots as SVG files beside it)
    /// or `.html` (plots inline), in a writable directory.
    #[arg(long)]
    pub(crate) report: Option<std::path::PathBuf>,
    /// Print the summary as one JSON object too.
    #[arg(long)]
    pub(crate) json: bool,
}

const DEFAULT_PARTITIONS: u32 = 4;

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

/// Which half of the workload a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Produce,
    Consume,
    EndToEnd,
    /// Statements over Flight SQL ([`sql`]).
    Sql,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Produce => "produce",
            Mode::Consume => "consume",
            Mode::EndToEnd => "e2e",
            Mode::Sql => "sql",
        }
    }
}

impl Args {
    fn transport(&self) -> &'static str {
        if self.kafka.is_some() {
            "kafka"
        } else {
            "flight"
        }
    }

    fn address(&self) -> &str {
        self.kafka
            .as_deref()
            .or(self.flight.as_deref())
            .unwrap_or("")
    }

    /// Refuses what `mode` would ignore: options of the side it does not run.
    fn check_for(&self, mode: Mode) -> anyhow::Result<()> {
        self.check()?;
        if mode == Mode::Consume {
            for (given, option) in [
                (self.max_records.is_some(), "--max-records"),
                (self.producers != 1, "--producers"),
                (self.rate != 0, "--rate"),
                (self.batch_records != 1000, "--batch-records"),
            ] {
                if given {
                    bail!(
                        "{option} applies to producers (produce, e2e): consume reads what the topic holds"
                    );
                }
            }
        }
        if mode == Mode::Produce && self.consumers != 1 {
            bail!("--consumers applies to consume and e2e");
        }
        Ok(())
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.record_size < 8 {
            bail!(
                "--record-size {}: a record holds its 8-byte send time",
                self.record_size
            );
        }
        if self.producers == 0 || self.consumers == 0 || self.batch_records == 0 {
            bail!("--producers, --consumers and --batch-records take at least 1");
        }
        if self.partitions == Some(0) {
            bail!("--partitions takes at least 1");
        }
        if !(self.duration > 0.0 && self.duration.is_finite()) {
            bail!("--duration {}: a positive number of seconds", self.duration);
        }
        match (self.transport(), self.acks.as_str()) {
            ("kafka", "all" | "1" | "0" | "-1") | ("flight", "all") => {}
            ("flight", other) => bail!(
                "--acks {other}: a Flight write is acknowledged once durable on object storage (acks=all); use --kafka for other acks"
            ),
            (_, other) => bail!("--acks {other}: all, 1 or 0"),
        }
        if self.flight.is_some() && !self.kafka_config.is_empty() {
            bail!("--kafka-config applies to --kafka");
        }
        if self.flight.is_some() && self.in_flight_bytes.is_some() {
            bail!(
                "--in-flight-bytes applies to --kafka (a Flight writer has one write of --batch-records in flight)"
            );
        }
        if let Some(bytes) = self.in_flight_bytes
            && bytes < self.record_size
        {
            bail!(
                "--in-flight-bytes {bytes}: at least one record's bytes (--record-size {})",
                self.record_size
            );
        }
        if let Some(report) = &self.report {
            report::check(report)?;
        }
        Ok(())
    }

    /// The partitions of a topic or table the run creates.
    fn partitions(&self) -> u32 {
        self.partitions.unwrap_or(DEFAULT_PARTITIONS)
    }

    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration)
    }

    /// How many records each producer sends per second (`None`: as fast as it can).
    fn rate_per_producer(&self) -> Option<f64> {
        (self.rate > 0).then(|| self.rate as f64 / self.producers as f64)
    }
}

/// Microseconds since the epoch now.
pub(crate) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// What happened in one second of a run.
#[derive(Clone, Debug)]
pub(crate) struct Second {
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) latency: Histogram<u64>,
}

/// Counts and latencies of one side of a run (producers or consumers), per second too.
#[derive(Debug)]
pub(crate) struct Recorder {
    start: Instant,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    /// Microseconds, per record.
    pub(crate) latency: Histogram<u64>,
    pub(crate) seconds: Vec<Second>,
    /// When the last record was counted.
    pub(crate) last: Option<Instant>,
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 hour, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

impl Recorder {
    pub(crate) fn new(start: Instant) -> Self {
        Recorder {
            start,
            records: 0,
            bytes: 0,
            latency: histogram(),
            seconds: Vec::new(),
            last: None,
        }
    }

    /// `records` records of `bytes` bytes counted at `at`, each `latency` after it was due
    /// (when measured).
    pub(crate) fn record(
        &mut self,
        at: Instant,
        records: u64,
        bytes: u64,
        latency: Option<Duration>,
    ) {
        self.records += records;
        self.bytes += bytes;
        self.last = Some(at);
        let second = usize::try_from(at.saturating_duration_since(self.start).as_secs())
            .unwrap_or(usize::MAX);
        while self.seconds.len() <= second {
            self.seconds.push(Second {
                records: 0,
                bytes: 0,
                latency: histogram(),
            });
        }
        let s = &mut self.seconds[second];
        s.records += records;
        s.bytes += bytes;
        if let Some(l) = latency {
            let us = u64::try_from(l.as_micros()).unwrap_or(u64::MAX).max(1);
            let _ = self.latency.record_n(us, records);
            let _ = s.latency.record_n(us, records);
        }
    }

    /// Seconds from the start to the last record counted.
    pub(crate) fn elapsed(&self) -> f64 {
        self.last.map_or(0.0, |l| {
            l.saturating_duration_since(self.start).as_secs_f64()
        })
    }
}

pub(crate) type Shared = Arc<Mutex<Recorder>>;

/// Starts the run's clock now (after its setup, which began at `setup`), for both sides'
/// recorders; returns the new start.
pub(crate) fn restart(setup: Instant, produced: &Shared, consumed: &Shared) -> Instant {
    let now = Instant::now().max(setup);
    for side in [produced, consumed] {
        side.lock().expect("recorder lock").start = now;
    }
    now
}

/// A run's figures for one side.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Figures {
    pub side: &'static str,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    pub records_per_s: f64,
    pub mb_per_s: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Figures {
    fn of(side: &'static str, r: &Recorder) -> Figures {
        let seconds = r.elapsed().max(1e-9);
        Figures {
            side,
            records: r.records,
            bytes: r.bytes,
            seconds,
            records_per_s: r.records as f64 / seconds,
            mb_per_s: r.bytes as f64 / seconds / 1e6,
            p50_ms: f64::NAN,
            p95_ms: f64::NAN,
            p99_ms: f64::NAN,
            p999_ms: f64::NAN,
            max_ms: f64::NAN,
        }
        .with_latency(&r.latency)
    }

    /// These figures with the quantiles of `latency` (µs); NaN when it is empty.
    fn with_latency(self, latency: &Histogram<u64>) -> Figures {
        if latency.is_empty() {
            return self;
        }
        let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
        Figures {
            p50_ms: ms(0.5),
            p95_ms: ms(0.95),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: latency.max() as f64 / 1000.0,
            ..self
        }
    }

    /// The first side of several runs as one: their records in their summed time, latency
    /// quantiles over all their records. None for no runs.
    pub(crate) fn over_runs<'a>(runs: impl Iterator<Item = &'a Measured>) -> Option<Figures> {
        let mut latency = histogram();
        let mut figures = Vec::new();
        for m in runs {
            figures.extend(m.figures.first().cloned());
            for second in m.timelines.iter().take(1).flat_map(|(_, s)| s) {
                latency
                    .add(&second.latency)
                    .expect("histograms of the same bounds");
            }
        }
        Figures::over(figures.iter()).map(|f| f.with_latency(&latency))
    }

    /// Throughput over several runs of one side, as one run of their records in their summed
    /// time; latencies are not combined (NaN). None for no runs.
    pub(crate) fn over<'a>(runs: impl Iterator<Item = &'a Figures>) -> Option<Figures> {
        let mut sum: Option<Figures> = None;
        for f in runs {
            let s = sum.get_or_insert_with(|| Figures {
                records: 0,
                bytes: 0,
                seconds: 0.0,
                ..f.clone()
            });
            s.records += f.records;
            s.bytes += f.bytes;
            s.seconds += f.seconds;
        }
        sum.map(|s| Figures {
            records_per_s: s.records as f64 / s.seconds,
            mb_per_s: s.bytes as f64 / s.seconds / 1e6,
            p50_ms: f64::NAN,
            p95_ms: f64::NAN,
            p99_ms: f64::NAN,
            p999_ms: f64::NAN,
            max_ms: f64::NAN,
            ..s
        })
    }
}

/// Live progress on the terminal (nothing when stderr is not one) until `done`.
fn progress(
    mode: Mode,
    transport: &'static str,
    sides: Vec<(&'static str, Shared)>,
) -> (indicatif::ProgressBar, tokio::task::JoinHandle<()>) {
    let bar = indicatif::ProgressBar::new_spinner().with_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
            .expect("a valid template"),
    );
    let task = tokio::spawn({
        let bar = bar.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let mut parts = Vec::new();
                for (side, shared) in &sides {
                    let r = shared.lock().expect("recorder lock");
                    let last = r.seconds.iter().rev().nth(1).or(r.seconds.last());
                    let p99 = if r.latency.is_empty() {
                        String::new()
                    } else {
                        format!(
                            ", p99 {:.1} ms",
                            r.latency.value_at_quantile(0.99) as f64 / 1000.0
                        )
                    };
                    parts.push(format!(
                        "{side}: {} records, {:.1} MB/s now{p99}",
                        r.records,
                        last.map_or(0.0, |s| s.bytes as f64 / 1e6),
                    ));
                }
                bar.set_message(format!(
                    "{} over {transport}: {}",
                    mode.name(),
                    parts.join("; ")
                ));
                bar.tick();
            }
        }
    });
    (bar, task)
}

/// What a run measured: each side's figures and its timeline.
pub(crate) struct Measured {
    pub(crate) figures: Vec<Figures>,
    pub(crate) timelines: Vec<(&'static str, Vec<Second>)>,
    /// When the timelines' first second began.
    pub(crate) start: Instant,
    /// The partitions (buckets) of the topic or table, as the run found them.
    pub(crate) partitions: usize,
    /// Whether Ctrl-C ended the run: the figures are what was acknowledged until then.
    pub(crate) interrupted: bool,
}

/// Runs `mode` as `args` say, with live progress: each side's figures.
pub(crate) async fn measure(mode: Mode, args: &Args) -> anyhow::Result<Measured> {
    measure_until(mode, args, std::future::pending()).await
}

/// [`measure`], ended early by `interrupt` (the user's Ctrl-C) with what was measured so far.
async fn measure_until(
    mode: Mode,
    args: &Args,
    interrupt: impl Future<Output = ()>,
) -> anyhow::Result<Measured> {
    args.check()?;
    let start = Instant::now();
    let produced: Shared = Arc::new(Mutex::new(Recorder::new(start)));
    let consumed: Shared = Arc::new(Mutex::new(Recorder::new(start)));
    let sides: Vec<(&'static str, Shared)> = match mode {
        Mode::Produce => vec![("produced", Arc::clone(&produced))],
        Mode::Consume => vec![("consumed", Arc::clone(&consumed))],
        Mode::EndToEnd => vec![
            ("produced", Arc::clone(&produced)),
            ("consumed", Arc::clone(&consumed)),
        ],
        Mode::Sql => bail!("sql runs are measured by load::sql"),
    };
    let (bar, ticker) = progress(mode, args.transport(), sides.clone());
    let found = std::sync::OnceLock::new();
    let measured = async {
        if args.kafka.is_some() {
            kafka::run(mode, args, start, &produced, &consumed, &found).await
        } else {
            flight::run(mode, args, start, &produced, &consumed, &found).await
        }
    };
    // Ctrl-C ends the run with what was measured: it printed nothing, for minutes of load.
    let (partitions, interrupted) = tokio::select! {
        p = measured => (p, false),
        () = interrupt => (
            found.get().copied().context("interrupted before the run started"),
            true,
        ),
    };
    ticker.abort();
    bar.finish_and_clear();
    let partitions = partitions?;
    let figures: Vec<Figures> = sides
        .iter()
        .map(|(side, r)| Figures::of(side, &r.lock().expect("recorder lock")))
        .collect();
    if figures.iter().all(|f| f.records == 0) {
        bail!(
            "no record was {}",
            if mode == Mode::Consume {
                "consumed"
            } else {
                "produced"
            }
        );
    }
    let timelines = sides
        .iter()
        .map(|(side, r)| (*side, r.lock().expect("recorder lock").seconds.clone()))
        .collect();
    Ok(Measured {
        figures,
        timelines,
        start,
        partitions,
        interrupted,
    })
}

#[allow(clippy::print_stdout, clippy::print_stderr)] // the user's output
pub(crate) async fn run(mode: Mode, args: Args) -> anyhow::Result<()> {
    // The user's options (the suites reuse one workload for both sides).
    args.check_for(mode)?;
    let Measured {
        figures,
        timelines,
        partitions,
        interrupted,
        ..
    } = measure_until(mode, &args, async {
        // A Ctrl-C not taken (no handler) ends nothing: the run goes on to its end.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    })
    .await?;
    if interrupted {
        eprintln!("interrupted: the figures are what was acknowledged until Ctrl-C");
    }
    let record_size = record_size(mode, &args, &figures);
    let summary = summary(mode, &args, partitions, record_size, &figures);
    println!("{summary}");
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "workload": mode.name(),
                "transport": args.transport(),
                "address": args.address(),
                "topic": args.topic,
                "record_size": record_size,
                "partitions": partitions,
                "producers": (mode != Mode::Consume).then_some(args.producers),
                "consumers": (mode != Mode::Produce).then_some(args.consumers),
                "acks": (mode != Mode::Consume).then_some(&args.acks),
                "rate": (mode != Mode::Consume).then_some(args.rate),
                "figures": figures,
            })
        );
    }
    if let Some(path) = &args.report {
        let title = format!("mink-bench {} over {}", mode.name(), args.transport());
        report::write(path, &title, &summary, &timelines)
            .with_context(|| format!("writing the report {}", path.display()))?;
        eprintln!("report: {}", path.display());
    }
    if interrupted {
        // Its load tasks are still running: not waited for.
        std::process::exit(130);
    }
    Ok(())
}

/// Bytes per record: as sent, or for a consume run the mean of what was read (the topic's
/// records, whatever size they were written at).
fn record_size(mode: Mode, args: &Args, figures: &[Figures]) -> f64 {
    match (mode, figures.first()) {
        (Mode::Consume, Some(f)) if f.records > 0 => f.bytes as f64 / f.records as f64,
        _ => args.record_size as f64,
    }
}

/// The run's parameters and figures as Markdown: the topic as the run found it.
fn summary(
    mode: Mode,
    args: &Args,
    partitions: usize,
    record_size: f64,
    figures: &[Figures],
) -> String {
    let (kind, name) = if args.kafka.is_some() {
        ("topic", args.topic.clone())
    } else {
        ("table", format!("{}.{}", args.database, args.topic))
    };
    let ignored = match args.partitions {
        Some(asked) if asked as usize != partitions => {
            format!(" (the {kind} exists: --partitions {asked} not applied)")
        }
        _ => String::new(),
    };
    let records = if mode == Mode::Consume {
        format!("{record_size:.0} B records (mean read)")
    } else {
        format!("{} B records", args.record_size)
    };
    // Only what applies: a consume run has no producers, acks or rate.
    let mut facts = vec![
        format!("{kind} {name}"),
        format!("{partitions} partitions{ignored}"),
        records,
    ];
    if mode != Mode::Consume {
        facts.push(format!("{} producers", args.producers));
    }
    if mode != Mode::Produce {
        facts.push(format!("{} consumers", args.consumers));
    }
    if mode != Mode::Consume {
        facts.push(format!("acks={}", args.acks));
        facts.push(if args.rate > 0 {
            format!("rate {} records/s", args.rate)
        } else {
            "unthrottled".to_string()
        });
    }
    let mut out = format!(
        "{} over {} at {}: {}\n\n",
        mode.name(),
        args.transport(),
        args.address(),
        facts.join(", ")
    );
    let latency = match mode {
        Mode::Produce => "latency: due to acknowledged",
        Mode::Consume => "latency: none (reading what is stored)",
        Mode::EndToEnd => "latency: due to acknowledged (produced), sent to received (consumed)",
        Mode::Sql => "latency: due to last result batch",
    };
    out.push_str(&format!("({latency})\n\n"));
    out.push_str("| side | records | seconds | records/s | MB/s | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms |");
    if args.rate > 0 && mode != Mode::Consume {
        out.push_str(" / rate |");
    }
    out.push_str("\n|---|---|---|---|---|---|---|---|---|---|");
    if args.rate > 0 && mode != Mode::Consume {
        out.push_str("---|");
    }
    out.push('\n');
    let ms = |v: f64| {
        if v.is_nan() {
            "-".to_string()
        } else {
            format!("{v:.2}")
        }
    };
    for f in figures {
        out.push_str(&format!(
            "| {} | {} | {:.2} | {:.0} | {:.1} | {} | {} | {} | {} | {} |",
            f.side,
            f.records,
            f.seconds,
            f.records_per_s,
            f.mb_per_s,
            ms(f.p50_ms),
            ms(f.p95_ms),
            ms(f.p99_ms),
            ms(f.p999_ms),
            ms(f.max_ms),
        ));
        if args.rate > 0 && mode != Mode::Consume {
            out.push_str(&format!(" {:.2} |", f.records_per_s / args.rate as f64));
        }
        out.push('\n');
    }
    out
}

/// The items of consumer `c` of `n`: every `n`th, from the `c`th.
pub(crate) fn share_of<T: Clone>(items: &[T], n: usize, c: usize) -> Vec<T> {
    items.iter().skip(c).step_by(n.max(1)).cloned().collect()
}

/// Producer `index`'s part of `--max-records`, if set.
pub(crate) fn quota(args: &Args, index: usize) -> Option<u64> {
    let n = args.producers as u64;
    args.max_records
        .map(|m| m / n + u64::from((index as u64) < m % n))
}

/// Waits for the producers; then an e2e run waits until the consumers have received every
/// record produced (30 s more at most) and stops them, and other runs wait for the consumers.
pub(crate) async fn finish(
    mode: Mode,
    producers: Vec<tokio::task::JoinHandle<anyhow::Result<u64>>>,
    consumers: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    consumed: &Shared,
) -> anyhow::Result<()> {
    let mut sent = 0;
    for p in producers {
        sent += p.await??;
    }
    if mode == Mode::EndToEnd {
        let until = Instant::now() + Duration::from_secs(30);
        while consumed.lock().expect("recorder lock").records < sent && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for c in &consumers {
            c.abort();
        }
        return Ok(());
    }
    for c in consumers {
        c.await??;
    }
    Ok(())
}

/// Fresh random bytes: every record's padding differs, so that no compression (the table's
/// ZSTD, a Kafka producer's codec) flatters a run. From a small, fast generator per thread:
/// the thread-local ChaCha generator took 8.7 % of the process's CPU in a Kafka produce run
/// (the process holds the node too), CPU the node under test then did not have.
pub(crate) fn fill_random(buf: &mut [u8]) {
    use rand::{RngCore as _, SeedableRng as _};
    thread_local! {
        static RNG: std::cell::RefCell<rand::rngs::SmallRng> =
            std::cell::RefCell::new(rand::rngs::SmallRng::from_os_rng());
    }
    RNG.with_borrow_mut(|rng| rng.fill_bytes(buf));
}

/// Paces a producer at `per_second` records (none: no pacing): when the next `n` records are
/// due.
pub(crate) struct Pacer {
    start: Instant,
    per_second: Option<f64>,
    sent: u64,
}

impl Pacer {
    pub(crate) fn new(start: Instant, per_second: Option<f64>) -> Self {
        Pacer {
            start,
            per_second,
            sent: 0,
        }
    }

    /// Records sent at a time: about 10 ms of them when paced (a larger batch would go out
    /// ahead of its records' schedule), else `unpaced`.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a positive rate
    pub(crate) fn chunk(&self, unpaced: usize) -> usize {
        self.per_second
            .map_or(unpaced, |r| (r / 100.0).ceil().max(1.0) as usize)
    }

    /// Waits until the next `n` records are due; returns when they were due.
    pub(crate) async fn next(&mut self, n: u64) -> Instant {
        let due = match self.per_second {
            Some(rate) => self.start + Duration::from_secs_f64(self.sent as f64 / rate),
            None => Instant::now(),
        };
        self.sent += n;
        tokio::time::sleep_until(due.into()).await;
        due
    }
}
