//! `mink-connect`: Kafka into Mink. `run` consumes the configured topics of any Kafka cluster
//! into Mink tables exactly once (see [`source`]); `status` shows each source partition's
//! position in Mink beside the partition's end in Kafka (the lag).

mod config;
mod source;

use std::path::PathBuf;
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
    /// Consume the configured topics into their Mink tables until stopped.
    Run {
        /// The connector's TOML file.
        #[arg(long, env = "MINK_CONNECT_CONFIG")]
        config: PathBuf,
    },
    /// Each source partition: the next offset Mink holds, the partition's end, the lag.
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
        Command::Run { config } => source::run(config::Config::load(&config)?).await,
        Command::Status { config } => status(&config::Config::load(&config)?).await,
    }
}

#[allow(clippy::print_stdout)] // the command's output
async fn status(config: &config::Config) -> anyhow::Result<()> {
    let client = mink_client::Client::connect(&config.mink).await?;
    let consumer: BaseConsumer = source::consumer_config(config)
        .create()
        .context("a Kafka consumer")?;
    let timeout = Duration::from_secs(10);
    let mut rows = Vec::new();
    for s in &config.sources {
        let metadata = consumer.fetch_metadata(Some(&s.topic), timeout)?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == s.topic)
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        let keys: Vec<(String, i32)> = partitions.iter().map(|p| (s.topic.clone(), *p)).collect();
        let stored = source::read_state(&client, config, &keys).await?;
        for p in partitions {
            let (low, high) = consumer.fetch_watermarks(&s.topic, p, timeout)?;
            let next = stored
                .get(&(s.topic.clone(), p))
                .and_then(|st| st.next_offset)
                .unwrap_or(low);
            rows.push((
                s.topic.clone(),
                p,
                s.table.clone(),
                next,
                high,
                (high - next).max(0),
            ));
        }
    }
    println!("| topic | partition | table | next offset in Mink | end in Kafka | lag |");
    println!("|---|---|---|---|---|---|");
    for (topic, p, table, next, high, lag) in &rows {
        println!("| {topic} | {p} | {table} | {next} | {high} | {lag} |");
    }
    let total: i64 = rows.iter().map(|r| r.5).sum();
    println!("\ntotal lag: {total} records");
    Ok(())
}
