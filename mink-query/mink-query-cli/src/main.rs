//! `mink-query`: SQL over a Mink cluster.
//!
//! - `mink-query` opens a prompt (line editing, history, multi-line statements ending in `;`,
//!   `\d`, `\dt`, `\d table`, `\timing`, `\q`);
//! - `mink-query -c "SQL"` and `mink-query -f file.sql` run statements and print their rows;
//! - `mink-query serve` serves Flight SQL (stateless: run any number beside the nodes).

mod repl;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use arrow::array::RecordBatch;
use clap::{Parser, Subcommand, ValueEnum};
use mink_client::Client;
use mink_query::QueryEngine;
use mink_query::flight_sql::MinkFlightSql;

#[derive(Parser, Debug)]
#[command(name = "mink-query", version, about = "SQL over Mink")]
struct Cli {
    /// A node of the cluster (`host:port` of its Flight listener).
    #[arg(
        long,
        global = true,
        env = "MINK_SERVER",
        default_value = "127.0.0.1:7171"
    )]
    server: String,
    /// Run this statement (repeat for several) and exit.
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    commands: Vec<String>,
    /// Run the statements of this file and exit.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// The cluster's metadata database (`postgres://...`, `sqlite://...`), with
    /// --object-store: read lake snapshots straight from object storage (through the nodes
    /// without).
    #[arg(long, global = true, env = "MINK_METADATA", requires = "object_store")]
    metadata: Option<String>,
    /// The cluster's object store (`s3://bucket/prefix?...`, `file:///path`).
    #[arg(long, global = true, env = "MINK_OBJECT_STORE", requires = "metadata")]
    object_store: Option<String>,
    /// How rows are printed.
    #[arg(long, value_enum, default_value = "table", env = "MINK_QUERY_FORMAT")]
    format: Format,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve Flight SQL on `--listen`.
    Serve {
        #[arg(long, env = "MINK_QUERY_LISTEN", default_value = "127.0.0.1:7272")]
        listen: SocketAddr,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Table,
    Csv,
    Json,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {e:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = Client::connect(&cli.server).await.with_context(|| {
        format!(
            "Is a node running at {}? Start one with `mink dev`, or point at one with --server (MINK_SERVER).",
            cli.server
        )
    })?;
    let lake = match (&cli.metadata, &cli.object_store) {
        (Some(m), Some(o)) => Some(std::sync::Arc::new(
            mink_query::open_lake(m, o).await.with_context(|| {
                format!("cannot open the lake's catalog in {m} and files in {o}")
            })?,
        )),
        _ => None,
    };
    let engine = QueryEngine::with_lake(client, lake);
    if let Some(Command::Serve { listen }) = cli.command {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_writer(std::io::stderr)
            .init();
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        say(&format!(
            "mink-query serves Flight SQL on grpc://{addr} (cluster: {})",
            cli.server
        ));
        MinkFlightSql::new(engine)
            .serve(listener, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        return Ok(());
    }
    if cli.commands.is_empty() && cli.files.is_empty() {
        return repl::run(&engine, cli.format).await;
    }
    let mut statements: Vec<String> = cli.commands.clone();
    for f in &cli.files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        statements.extend(repl::split_statements(&text));
    }
    for sql in statements {
        run_statement(&engine, &sql, cli.format, false).await?;
    }
    Ok(())
}

/// Prints a line on standard output.
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}

/// Plans and runs one statement, printing its rows (and the time it took, with `timing`).
pub(crate) async fn run_statement(
    engine: &QueryEngine,
    sql: &str,
    format: Format,
    timing: bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let _running = engine.queries().track(sql, "cli", None, None);
    let df = engine.sql(sql).await?;
    let schema = df.schema().as_arrow().clone();
    let batches = df.collect().await?;
    print_batches(&schema, &batches, format)?;
    if timing {
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        say(&format!(
            "{rows} row{} in {:.3}s",
            if rows == 1 { "" } else { "s" },
            started.elapsed().as_secs_f64()
        ));
    }
    Ok(())
}

pub(crate) fn print_batches(
    schema: &arrow::datatypes::Schema,
    batches: &[RecordBatch],
    format: Format,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match format {
        Format::Table => {
            let shown = if batches.is_empty() {
                arrow::util::pretty::pretty_format_batches(&[RecordBatch::new_empty(
                    std::sync::Arc::new(schema.clone()),
                )])?
            } else {
                arrow::util::pretty::pretty_format_batches(batches)?
            };
            writeln!(out, "{shown}")?;
        }
        Format::Csv => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = arrow::json::LineDelimitedWriter::new(&mut out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
    }
    Ok(())
}
