//! `mink`: the node, the client and the admin CLI in one binary.

mod admin;
mod data;
mod serve;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mink_client::{Client, ClientError};

use crate::serve::NodeArgs;

#[derive(Parser, Debug)]
#[command(
    name = "mink",
    version,
    args_override_self = true,
    about = "Mink: streaming tables on object storage. The node, the client and the admin CLI.",
    after_help = "Start here:  mink dev      (one node on local defaults)\nThen:        mink table create app.events --column 'id Int64 not null' --column 'msg Utf8'\n             echo '{\"id\": 1, \"msg\": \"hi\"}' | mink produce app.events\n             mink scan app.events"
)]
struct Cli {
    /// The node client commands talk to (`host:port`).
    #[arg(
        long,
        global = true,
        env = "MINK_SERVER",
        default_value = mink_client::DEFAULT_SERVER
    )]
    server: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one node on embedded defaults: SQLite metadata and objects under a data directory.
    Dev {
        /// Where metadata and objects live.
        #[arg(long, env = "MINK_DATA_DIR", default_value = "mink-data")]
        data_dir: PathBuf,
        /// A TOML file with node settings (keys are the flag names).
        #[arg(long, env = "MINK_CONFIG")]
        config: Option<PathBuf>,
        #[command(flatten)]
        node: NodeArgs,
    },
    /// Run a node of a cluster (Postgres metadata, S3 objects); `mink node drain <id>` and
    /// `undrain <id>` steer a running cluster, `mink node ready` probes one node.
    #[command(args_conflicts_with_subcommands = true)]
    Node {
        #[command(subcommand)]
        action: Option<admin::NodeCommand>,
        /// A TOML file with node settings (keys are the flag names).
        #[arg(long, env = "MINK_CONFIG")]
        config: Option<PathBuf>,
        /// Check the settings (flags, variables, file) and print them; start nothing.
        #[arg(long)]
        check_config: bool,
        #[command(flatten)]
        node: NodeArgs,
    },
    /// Create, drop and list databases.
    #[command(subcommand)]
    Database(admin::DatabaseCommand),
    /// Create, describe, alter, drop and list tables.
    #[command(subcommand)]
    Table(admin::TableCommand),
    /// Create and drop partitions of a partitioned table.
    #[command(subcommand)]
    Partition(admin::PartitionCommand),
    /// The cluster: `status` (the default) and `rebalance [--dry-run]`.
    Cluster {
        #[command(subcommand)]
        action: Option<admin::ClusterCommand>,
    },
    /// Write rows from CSV, JSON lines or Parquet into a table.
    Produce(data::ProduceArgs),
    /// Read a table, a partition or a bucket.
    Scan(data::ScanArgs),
    /// Follow new rows of a table as they are written.
    Tail(data::TailArgs),
    /// Look up rows of a primary-key table by key (or by bucket-key prefix).
    Lookup(data::LookupArgs),
}

/// Prints a node's output to stdout; a node keeps serving once nobody reads it.
pub(crate) fn say(text: &str) {
    let _ = out(text);
}

/// Prints a client command's output to stdout. A closed stdout (`mink scan | head`) is an
/// error that ends the command, quietly and successfully (see [`closed_stdout`]).
pub(crate) fn out(text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    std::io::stdout().lock().write_all(text.as_bytes())
}

/// Whether `e` is a write to a stdout whose reader has gone: the end of the output, as for
/// `ls | head`, not a failure.
fn closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            // Arrow's writers keep the I/O error only in their message.
            || c.downcast_ref::<arrow::error::ArrowError>()
                .is_some_and(|a| a.to_string().contains("Broken pipe"))
    })
}

/// What to do about a failure, in words.
fn explain(e: &anyhow::Error, server: &str) -> String {
    let mut message = format!("error: {e:#}");
    // Another of a node's ports answers, each in its own way: the hint names them.
    let other_port =
        "give the node's Flight address (its --listen, 7171 by default; --server or MINK_SERVER)";
    let hint = match e.downcast_ref::<ClientError>() {
        Some(ClientError::Transport { message, .. })
            if ["dns", "resolve", "lookup"]
                .iter()
                .any(|s| message.to_lowercase().contains(s)) =>
        {
            let host = mink_client::host(server);
            Some(format!(
                "The host name {host:?} does not resolve: check --server (MINK_SERVER)."
            ))
        }
        Some(ClientError::Transport { message, .. })
            if ["refused", "connect"].iter().any(|s| message.contains(s)) =>
        {
            Some(format!(
                "Is a node running at {server}? {}.",
                mink_client::unreached_hint(server)
            ))
        }
        Some(ClientError::Transport { .. }) => Some(format!(
            "Something at {server} broke off the connection. Is a node running there? If it is another port (a node's Kafka port), {other_port}."
        )),
        Some(ClientError::Server { message, .. }) if message.starts_with("unknown action") => {
            Some(format!(
                "{server} serves Arrow Flight but is not a Mink node (Flight SQL's port?): {other_port}."
            ))
        }
        Some(ClientError::Server { message, .. })
            if message.contains("mapped from HTTP status code") =>
        {
            Some(format!(
                "{server} is an HTTP server, not a Mink node (its metrics port?): {other_port}."
            ))
        }
        _ => None,
    };
    if let Some(hint) = hint {
        message.push('\n');
        message.push_str(&hint);
    }
    message
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let connect = || async {
        telemetry::init_client_logging();
        Client::connect(&cli.server)
            .await
            .map_err(anyhow::Error::from)
    };
    match cli.command {
        Command::Dev {
            data_dir,
            config,
            node,
        } => {
            let args = serve::load(node, config.as_deref())?;
            serve::run(serve::dev_defaults(args, &data_dir)?, true).await
        }
        Command::Node {
            action: Some(action),
            ..
        } => admin::node(&connect().await?, action).await,
        Command::Node {
            action: None,
            config,
            check_config: true,
            node,
        } => serve::check_config(&serve::load(node, config.as_deref())?),
        Command::Node {
            action: None,
            config,
            check_config: false,
            node,
        } => serve::run(serve::load(node, config.as_deref())?, false).await,
        Command::Database(c) => admin::database(&connect().await?, c).await,
        Command::Table(c) => admin::table(&connect().await?, c).await,
        Command::Partition(c) => admin::partition(&connect().await?, c).await,
        Command::Cluster { action } => admin::cluster(&connect().await?, action).await,
        Command::Produce(a) => data::produce(&connect().await?, a).await,
        Command::Scan(a) => data::scan(&connect().await?, a).await,
        Command::Tail(a) => data::tail(&connect().await?, a).await,
        Command::Lookup(a) => data::lookup(&connect().await?, a).await,
    }
}

fn main() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let mut cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // `MINK_SERVER=` (set, empty) reads as unset, as shells and env files leave it; an empty
    // `--server` (a variable that expanded to nothing) is checked below, and refused.
    if cli.server.trim().is_empty()
        && matches.value_source("server") != Some(clap::parser::ValueSource::CommandLine)
    {
        cli.server = mink_client::DEFAULT_SERVER.to_string();
    }
    let server = cli.server.clone();
    let serves = matches!(
        cli.command,
        Command::Dev { .. } | Command::Node { action: None, .. }
    );
    // Checked only for the commands that reach a node: `mink dev` and `mink node` run with
    // any `MINK_SERVER` set.
    if !serves && let Err(e) = mink_client::check_address(&server) {
        <Cli as clap::CommandFactory>::command()
            .error(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value '{server}' for '--server <SERVER>': {e}"),
            )
            .exit();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprint_line(&format!("error: cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprint_line(&explain(&e, &server));
            ExitCode::FAILURE
        }
    }
}

/// Prints a line to stderr: an error, or a note beside a command's output.
#[allow(clippy::print_stderr)]
pub(crate) fn eprint_line(text: &str) {
    eprintln!("{text}");
}
