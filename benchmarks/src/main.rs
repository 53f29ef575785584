//! `mink-bench`: Mink's benchmarks. Each suite prints its figures beside the limit or baseline
//! it is judged against, measured in the same run, as a table and (with `--json`) as JSON.
//! `produce`, `consume` and `e2e` are the user's: pointed at a running cluster (or any Kafka
//! broker), they show live progress and print throughput and latency percentiles.

mod cluster;
mod flight;
mod kafka;
mod kv;
mod lake;
mod load;
mod metadata;
mod s3stream;
mod sql_tail;
mod tpch;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "mink-bench",
    about = "Mink's throughput and latency benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Subcommand, Debug)]
enum Suite {
    /// Produce records to a running cluster (`--flight`) or any Kafka broker (`--kafka`):
    /// MB/s, records/s, acknowledgement latency percentiles.
    Produce(load::Args),
    /// Consume a topic or table from its start to where it ended when the run began.
    Consume(load::Args),
    /// Produce and consume at once: latency from send to receipt.
    E2e(load::Args),
    /// Statements over Flight SQL (`mink dev`, `mink-query serve`, any Flight SQL server):
    /// statements/s, result MB/s, latency percentiles.
    Sql(load::sql::SqlArgs),
    /// The metadata command log: proposals/s and latency against raw multi-row INSERTs.
    Metadata(metadata::Args),
    /// The stream engine: appends and fetches against raw object_store PUTs and GETs.
    S3stream(s3stream::Args),
    /// Arrow Flight DoPut and DoGet through a node against a Flight echo server.
    Flight(flight::Args),
    /// The Kafka frontend beside Flight on one node: produce, acknowledgement latency, and
    /// consume from a restarted node.
    Kafka(kafka::Args),
    /// Primary-key tables: upserts and lookups through a KV tablet against redb itself.
    Kv(kv::Args),
    /// The cluster: failover time as a ratio of the lease TTL; node start as metadata grows.
    Cluster(cluster::Args),
    /// The lake: tiering beside plain Parquet writes, reading back beside an iceberg-rust scan.
    Lake(lake::Args),
    /// Tiering driven by queries: the log tail SQL scans read, and their time, with and
    /// without the engine reporting it.
    SqlTail(sql_tail::Args),
    /// TPC-H's 22 queries through Mink's Flight SQL (lake snapshot and log tail) beside
    /// DataFusion over the same rows as plain Parquet files; the load rate.
    Tpch(tpch::Args),
}

/// Table options from `(name, value)` pairs.
pub(crate) fn options(pairs: &[(&str, String)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().suite {
        Suite::Produce(args) => load::run(load::Mode::Produce, args).await,
        Suite::Consume(args) => load::run(load::Mode::Consume, args).await,
        Suite::E2e(args) => load::run(load::Mode::EndToEnd, args).await,
        Suite::Sql(args) => load::sql::run(args).await,
        Suite::Metadata(args) => metadata::run(args).await,
        Suite::S3stream(args) => s3stream::run(args).await,
        Suite::Flight(args) => flight::run(args).await,
        Suite::Kafka(args) => kafka::run(args).await,
        Suite::Kv(args) => kv::run(args).await,
        Suite::Cluster(args) => cluster::run(args).await,
        Suite::Lake(args) => lake::run(args).await,
        Suite::SqlTail(args) => sql_tail::run(args).await,
        Suite::Tpch(args) => tpch::run(args).await,
    }
}
