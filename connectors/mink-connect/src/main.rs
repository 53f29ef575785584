//! `mink-connect`: Kafka in and out of Mink. `run` consumes the configured topics of any Kafka
//! cluster into Mink tables exactly once (see [`source`]) and produces the configured tables'
//! changes to Kafka topics (see [`sink`]); `status` shows each source partition's position in
//! Mink beside the partition's end in Kafka, and each sink bucket's position beside the
//! bucket's end (the lags).

mod config;
mod metrics;
mod retry;
mod sink;
mod source;
mod state;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use rdkafka::consumer::{BaseConsumer, Consumer as _};

#[derive(Parser, Debug)]
#[command(name = "mink-connect", about = "Kafka in and out of Mink")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Consume the configured topics into their Mink tables and produce the configured tables'
    /// changes to their topics, until stopped.
    Run {
        /// The connector's TOML file.
        #[arg(long, env = "MINK_CONNECT_CONFIG")]
        config: PathBuf,
    },
    /// Each source partition and sink bucket: its position, where its log ends, the lag.
    Status {
        #[arg(long, env = "MINK_CONNECT_CONFIG")]
        config: PathBuf,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    // Colours only for a person at a terminal (as `mink` does): a log file or a collector
    // gets plain text.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    let ended = match Cli::parse().command {
        Command::Run { config } => match config::Config::load(&config) {
            Ok(c) => run(c).await,
            Err(e) => Err(e),
        },
        Command::Status { config } => match config::Config::load(&config) {
            Ok(c) => status(&c).await,
            Err(e) => Err(e),
        },
    };
    match ended {
        Ok(()) => ExitCode::SUCCESS,
        // `status | head`: the reader has what it wanted.
        Err(e) if closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // The error and its causes on one line; a backtrace (RUST_BACKTRACE=1) is for
            // panics, not for a wrong config or a node that refuses.
            #[allow(clippy::print_stderr)]
            {
                eprintln!("Error: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Whether `e` is a write to a stdout whose reader has gone.
fn closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Fails unless a Kafka broker of the config answers: before anything is created in Mink for
/// a connector that could not run.
async fn check_kafka(config: &config::Config) -> anyhow::Result<()> {
    let mut c = rdkafka::ClientConfig::new();
    c.set("bootstrap.servers", &config.kafka.bootstrap);
    for (k, v) in &config.kafka.config {
        c.set(k, v);
    }
    let consumer: BaseConsumer = c.create().context("a Kafka client")?;
    let metadata =
        tokio::task::block_in_place(|| consumer.fetch_metadata(None, Duration::from_secs(10)))
            .with_context(|| format!("cannot reach Kafka at {}", config.kafka.bootstrap))?;
    // A source topic that is not there would fail the first fetch, after its tables exist.
    for s in &config.sources {
        let found = metadata
            .topics()
            .iter()
            .any(|t| t.name() == s.topic && t.error().is_none() && !t.partitions().is_empty());
        anyhow::ensure!(
            found,
            "source {}: Kafka at {} has no topic {:?}",
            s.topic,
            config.kafka.bootstrap,
            s.topic
        );
    }
    Ok(())
}

/// Fails unless the tables the config names and the connector does not create exist (a json
/// source's, a sink's): before either side creates anything (its state table, a raw
/// source's table) for a connector that could not run.
async fn existing_tables(config: &config::Config) -> anyhow::Result<()> {
    let client = mink_client::Client::connect(&config.mink).await?;
    for s in &config.sources {
        if matches!(s.format, config::Format::Json) {
            let (database, table) = config::table_name(&s.table)?;
            client
                .describe_table(&database, &table)
                .await
                .with_context(|| format!("source {}: table {}", s.topic, s.table))?;
        }
    }
    for sink in &config.sinks {
        let (database, table) = config::table_name(&sink.table)?;
        client
            .describe_table(&database, &table)
            .await
            .with_context(|| format!("sink table {}", sink.table))?;
    }
    Ok(())
}

/// The sources and the sinks side by side (and `/metrics`), until one of them fails.
async fn run(config: config::Config) -> anyhow::Result<()> {
    check_kafka(&config).await?;
    existing_tables(&config).await?;
    let config = Arc::new(config);
    let metrics = Arc::new(metrics::Metrics::default());
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(address) = &config.metrics {
        tasks.spawn(metrics::serve(address.clone(), Arc::clone(&metrics)));
    }
    if !config.sources.is_empty() {
        tasks.spawn(source::run(Arc::clone(&config), Arc::clone(&metrics)));
    }
    if !config.sinks.is_empty() {
        tasks.spawn(sink::run(Arc::clone(&config), Arc::clone(&metrics)));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        ended = tasks.join_next() => match ended {
            Some(ended) => ended.context("a connector task panicked")?,
            None => Ok(()),
        },
        // What is recorded is all a restart needs (a SIGKILL is as safe): no flush to wait on.
        _ = tokio::signal::ctrl_c() => stopped(),
        _ = term.recv() => stopped(),
    }
}

fn stopped() -> anyhow::Result<()> {
    tracing::info!("stopped; a restart goes on from the positions recorded in Mink");
    Ok(())
}

/// Whether the state table `(database, table)` exists (a run has stored state).
async fn has_state(
    client: &mink_client::Client,
    (database, table): &(String, String),
) -> anyhow::Result<bool> {
    match client.describe_table(database, table).await {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some(mink_client::ErrorCode::NotFound) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Prints the status table; the output is written once it is complete (an error prints no
/// half table).
async fn status(config: &config::Config) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    use std::io::Write as _;
    let client = mink_client::Client::connect(&config.mink).await?;
    // As `run` says it (librdkafka logged every failed try, hundreds of lines).
    check_kafka(config).await?;
    let mut total = 0i64;
    let mut out = String::new();
    for (side, used, table) in [
        ("source", !config.sources.is_empty(), config.state_table()),
        ("sink", !config.sinks.is_empty(), config.sink_state_table()),
    ] {
        if used && !has_state(&client, &table).await? {
            writeln!(
                out,
                "no run of connector {} has stored {side} state yet ({}.{} does not exist): \
                 positions shown are where a first run would start",
                config.name, table.0, table.1
            )?;
        }
    }
    if !out.is_empty() {
        writeln!(out)?;
    }
    if !config.sources.is_empty() {
        let consumer: BaseConsumer = source::consumer_config(config)
            .create()
            .context("a Kafka consumer")?;
        let timeout = Duration::from_secs(10);
        writeln!(
            out,
            "| topic | partition | table | next offset in Mink | end in Kafka | lag |"
        )?;
        writeln!(out, "|---|---|---|---|---|---|")?;
        for s in &config.sources {
            let metadata = consumer.fetch_metadata(Some(&s.topic), timeout)?;
            let partitions: Vec<i32> = metadata
                .topics()
                .iter()
                .filter(|t| t.name() == s.topic && t.error().is_none())
                .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                .collect();
            // No lag to report for a topic that is not there: say so, and fail.
            anyhow::ensure!(
                !partitions.is_empty(),
                "source {}: Kafka at {} has no topic {:?}",
                s.topic,
                config.kafka.bootstrap,
                s.topic
            );
            let keys: Vec<(String, i32)> =
                partitions.iter().map(|p| (s.topic.clone(), *p)).collect();
            let stored = if has_state(&client, &config.state_table()).await? {
                source::read_state(&client, config, &keys).await?
            } else {
                Default::default()
            };
            for p in partitions {
                let (low, high) = consumer.fetch_watermarks(&s.topic, p, timeout)?;
                let next = stored
                    .get(&(s.topic.clone(), p))
                    .and_then(|st| st.next_offset)
                    .unwrap_or(low);
                let lag = (high - next).max(0);
                total += lag;
                writeln!(
                    out,
                    "| {} | {p} | {} | {next} | {high} | {lag} |",
                    s.topic, s.table
                )?;
            }
        }
        writeln!(out)?;
    }
    if !config.sinks.is_empty() {
        writeln!(
            out,
            "| table | partition | bucket | topic | position | end in Mink | lag |"
        )?;
        writeln!(out, "|---|---|---|---|---|---|---|")?;
        for s in &config.sinks {
            let (database, table) = config::table_name(&s.table)?;
            let d = client.describe_table(&database, &table).await?;
            let keys: Vec<_> = d
                .buckets
                .iter()
                .map(|b| (s.table.clone(), b.partition.clone(), b.bucket))
                .collect();
            let positions = sink::read_positions(&client, config, &keys).await?;
            for (b, key) in d.buckets.iter().zip(&keys) {
                let position = positions.get(key).copied().unwrap_or(b.start_offset);
                let lag = i64::try_from(b.end_offset.saturating_sub(position))?;
                total += lag;
                writeln!(
                    out,
                    "| {} | {} | {} | {} | {position} | {} | {lag} |",
                    s.table,
                    b.partition.as_deref().unwrap_or("-"),
                    b.bucket,
                    s.topic,
                    b.end_offset
                )?;
            }
        }
        writeln!(out)?;
    }
    writeln!(out, "total lag: {total} records")?;
    std::io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .context("writing the status")?;
    Ok(())
}
