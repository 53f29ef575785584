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

use std::path::PathBuf;
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
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run { config } => run(config::Config::load(&config)?).await,
        Command::Status { config } => status(&config::Config::load(&config)?).await,
    }
}

/// The sources and the sinks side by side (and `/metrics`), until one of them fails.
async fn run(config: config::Config) -> anyhow::Result<()> {
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
    match tasks.join_next().await {
        Some(ended) => ended.context("a connector task panicked")?,
        None => Ok(()),
    }
}

#[allow(clippy::print_stdout)] // the command's output
async fn status(config: &config::Config) -> anyhow::Result<()> {
    let client = mink_client::Client::connect(&config.mink).await?;
    let mut total = 0i64;
    if !config.sources.is_empty() {
        let consumer: BaseConsumer = source::consumer_config(config)
            .create()
            .context("a Kafka consumer")?;
        let timeout = Duration::from_secs(10);
        println!("| topic | partition | table | next offset in Mink | end in Kafka | lag |");
        println!("|---|---|---|---|---|---|");
        for s in &config.sources {
            let metadata = consumer.fetch_metadata(Some(&s.topic), timeout)?;
            let partitions: Vec<i32> = metadata
                .topics()
                .iter()
                .filter(|t| t.name() == s.topic)
                .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                .collect();
            let keys: Vec<(String, i32)> =
                partitions.iter().map(|p| (s.topic.clone(), *p)).collect();
            let stored = source::read_state(&client, config, &keys).await?;
            for p in partitions {
                let (low, high) = consumer.fetch_watermarks(&s.topic, p, timeout)?;
                let next = stored
                    .get(&(s.topic.clone(), p))
                    .and_then(|st| st.next_offset)
                    .unwrap_or(low);
                let lag = (high - next).max(0);
                total += lag;
                println!(
                    "| {} | {p} | {} | {next} | {high} | {lag} |",
                    s.topic, s.table
                );
            }
        }
        println!();
    }
    if !config.sinks.is_empty() {
        println!("| table | partition | bucket | topic | position | end in Mink | lag |");
        println!("|---|---|---|---|---|---|---|");
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
                println!(
                    "| {} | {} | {} | {} | {position} | {} | {lag} |",
                    s.table,
                    b.partition.as_deref().unwrap_or("-"),
                    b.bucket,
                    s.topic,
                    b.end_offset
                );
            }
        }
        println!();
    }
    println!("total lag: {total} records");
    Ok(())
}
