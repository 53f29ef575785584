//! `mink-query`: SQL over a Mink cluster.
//!
//! - `mink-query` opens a prompt (line editing, history, multi-line statements ending in `;`,
//!   `\d`, `\dt`, `\d table`, `\timing`, `\q`);
//! - `mink-query -c "SQL"` and `mink-query -f file.sql` run statements and print their rows
//!   (as a table, CSV, JSON lines or Parquet; to standard output or `--output FILE`);
//! - `mink-query serve` serves Flight SQL (stateless: run any number beside the nodes).

mod repl;

use std::io::{IsTerminal as _, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use arrow::array::RecordBatch;
use clap::{Parser, Subcommand, ValueEnum};
use datafusion::prelude::DataFrame;
use futures::StreamExt as _;
use indicatif::{ProgressBar, ProgressFinish, ProgressStyle};
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
    /// How rows are printed (`parquet`: one statement's rows, with --output or into a pipe).
    #[arg(long, value_enum, default_value = "table", env = "MINK_QUERY_FORMAT")]
    format: Format,
    /// Write the rows of -c and -f statements to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Rows a statement shows in the table format (0: all of them); the rest are counted.
    /// CSV, JSON and Parquet write every row as it arrives.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 40,
        env = "MINK_QUERY_MAX_ROWS"
    )]
    max_rows: usize,
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
    Parquet,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    // As `mink` takes them: `MINK_SERVER=` is the default, and a host without a port is a
    // usage error, not a connection to port 80.
    if cli.server.trim().is_empty() {
        cli.server = mink_client::DEFAULT_SERVER.to_string();
    }
    if let Err(e) = mink_client::check_address(&cli.server) {
        <Cli as clap::CommandFactory>::command()
            .error(
                clap::error::ErrorKind::ValueValidation,
                format!(
                    "invalid value '{}' for '--server <SERVER>': {e}",
                    cli.server
                ),
            )
            .exit();
    }
    let server = cli.server.clone();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `mink-query -c ... | head`: the reader has what it wanted, as with `ls | head`.
        Err(_) if STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed) => {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            let text = error_text(&e);
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {text}");
                if let Some(hint) = other_port(&text, &server) {
                    eprintln!("{hint}");
                }
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = Client::connect(&cli.server).await.with_context(|| {
        format!(
            "is a node running at {}? {}",
            cli.server,
            mink_client::unreached_hint(&cli.server)
        )
    })?;
    let lake = match (&cli.metadata, &cli.object_store) {
        (Some(m), Some(o)) => Some(std::sync::Arc::new(
            mink_query::open_lake(m, o).await.with_context(|| {
                format!(
                    "cannot open the lake's catalog in {} and files in {}",
                    mink_sql::redact_url(m),
                    mink_sql::redact_url(o)
                )
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
        anyhow::ensure!(
            cli.format != Format::Parquet && cli.output.is_none(),
            "--format parquet and --output apply to statements given with -c or -f, not to the prompt"
        );
        let done = repl::run(&engine, cli.format, cli.max_rows).await;
        mink_query::scan::tail_reports_sent(Duration::from_secs(2)).await;
        return done;
    }
    let mut statements: Vec<String> = cli.commands.clone();
    for f in &cli.files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        statements.extend(repl::split_script(&text));
    }
    if cli.format == Format::Parquet {
        anyhow::ensure!(
            statements.len() == 1,
            "--format parquet writes one statement's rows as one file; {} statements were given",
            statements.len()
        );
        anyhow::ensure!(
            cli.output.is_some() || !std::io::stdout().is_terminal(),
            "Parquet is binary: write it to a file with --output FILE, or redirect standard output"
        );
    }
    let mut out: Box<dyn Write + Send> = match &cli.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(Stdout),
    };
    for sql in statements {
        // `-c '\d app.events'`, as psql takes it: the catalog commands of the prompt.
        if let Some(command) = sql.trim().strip_prefix('\\') {
            let mut words = command.split_whitespace();
            let name = format!("\\{}", words.next().unwrap_or(""));
            match repl::catalog_command(&engine, &name, words.next(), cli.format, &mut out).await {
                Some(done) => done?,
                None => anyhow::bail!(
                    "{name} works at the prompt only; -c takes \\d, \\dt [PATTERN], \\d TABLE and \\?"
                ),
            }
            continue;
        }
        run_statement(&engine, &sql, cli.format, cli.max_rows, &mut out).await?;
    }
    out.flush()?;
    // Advisory, so bounded: a node that does not answer does not hold up the exit.
    mink_query::scan::tail_reports_sent(Duration::from_secs(2)).await;
    Ok(())
}

/// Set when a write to standard output found its reader gone (the statement's rows stop
/// there; the writers that failed wrap the I/O error each in their own way).
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Standard output, noting in [`STDOUT_CLOSED`] a write that found its reader gone.
struct Stdout;

impl Stdout {
    fn noted<T>(result: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &result
            && e.kind() == std::io::ErrorKind::BrokenPipe
        {
            STDOUT_CLOSED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        result
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Self::noted(std::io::stdout().write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Self::noted(std::io::stdout().flush())
    }
}

/// When `--server` points at another of a node's ports (its Flight SQL or metrics port, which
/// answer in their own ways), which it looks like and what to give instead.
fn other_port(error: &str, server: &str) -> Option<String> {
    let instead = "mink-query talks to a node's Flight address (its --listen, 7171 by default; --server or MINK_SERVER)";
    if error.contains("unknown action") {
        Some(format!(
            "{server} serves Arrow Flight but is not a Mink node (a Flight SQL port, for BI tools and ADBC?): {instead}."
        ))
    } else if error.contains("mapped from HTTP status code") {
        Some(format!(
            "{server} is an HTTP server, not a Mink node (its metrics port?): {instead}."
        ))
    } else {
        None
    }
}

/// `e` with its causes, each said once: a DataFusion error's message already holds its
/// source's, which `{e:#}` would repeat.
pub(crate) fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let message = cause.to_string();
        if text.contains(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

/// Prints a line on standard output.
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}

/// Plans and runs one statement, writing its rows to `out` as they arrive: a result larger
/// than memory goes to a file or a pipe in CSV, JSON or Parquet, and the table format keeps
/// only the `max_rows` it shows (0: all).
pub(crate) async fn run_statement(
    engine: &QueryEngine,
    sql: &str,
    format: Format,
    max_rows: usize,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let _running = engine.queries().track(sql, "cli", None, None);
    let df = engine.sql(sql).await?;
    let schema = std::sync::Arc::new(df.schema().as_arrow().clone());
    let mut rows = Rows::new(schema, format, max_rows, out)?;
    let count = stream_with_progress(df, |batch| rows.write(&batch)).await?;
    rows.finish(count)
}

/// How long a statement runs before a spinner shows its progress on standard error (when that
/// is a terminal): `MINK_QUERY_PROGRESS_AFTER_MS`, 500 ms by default.
fn progress_after() -> Duration {
    std::env::var("MINK_QUERY_PROGRESS_AFTER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_millis(500), Duration::from_millis)
}

/// Runs `df`, handing each batch to `each` as it arrives, and answers how many rows it had;
/// once it has run [`progress_after`], a spinner on standard error counts the rows so far
/// (drawn only on a terminal, cleared at the end).
async fn stream_with_progress(
    df: DataFrame,
    mut each: impl FnMut(RecordBatch) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut stream = df.execute_stream().await?;
    let show_at = tokio::time::Instant::now() + progress_after();
    let mut bar: Option<ProgressBar> = None;
    let mut rows = 0u64;
    loop {
        let next = if bar.is_some() {
            stream.next().await
        } else {
            tokio::select! {
                // The deadline first: a statement past it shows the spinner even if its
                // next batch is ready too.
                biased;
                () = tokio::time::sleep_until(show_at) => {
                    bar = Some(spinner());
                    continue;
                }
                next = stream.next() => next,
            }
        };
        let Some(batch) = next else { break };
        let batch = batch?;
        rows += batch.num_rows() as u64;
        if let Some(bar) = &bar {
            bar.set_position(rows);
        }
        each(batch)?;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(rows)
}

fn spinner() -> ProgressBar {
    let bar = ProgressBar::new_spinner()
        .with_style(
            ProgressStyle::with_template("{spinner} running {elapsed}: {human_pos} rows")
                .expect("valid template"),
        )
        // A statement that fails drops its spinner: clear it then too.
        .with_finish(ProgressFinish::AndClear);
    bar.enable_steady_tick(Duration::from_millis(100));
    bar.tick();
    bar
}

/// Prints `batches` (of `schema`) in `format` to `out`, all of them.
pub(crate) fn print_batches(
    schema: &arrow::datatypes::Schema,
    batches: &[RecordBatch],
    format: Format,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    let mut rows = Rows::new(std::sync::Arc::new(schema.clone()), format, 0, out)?;
    let mut count = 0;
    for b in batches {
        count += b.num_rows() as u64;
        rows.write(b)?;
    }
    rows.finish(count)
}

/// A statement's rows on their way out, in one format.
enum Rows<'a> {
    /// DDL and SET answer no columns: nothing is printed (no empty table, no `{}` line).
    Nothing,
    /// Kept until the end (column widths depend on every row shown): at most `max` rows.
    Table {
        schema: arrow::datatypes::SchemaRef,
        kept: Vec<RecordBatch>,
        kept_rows: usize,
        max: usize,
        out: &'a mut (dyn Write + Send),
    },
    /// With the statement's schema: a result of no rows still writes its header line.
    Csv(
        arrow::csv::Writer<&'a mut (dyn Write + Send)>,
        arrow::datatypes::SchemaRef,
    ),
    /// As `mink scan -f json` writes rows: every null, durations as counts.
    Json(arrow::json::Writer<&'a mut (dyn Write + Send), arrow::json::writer::LineDelimited>),
    /// Columns of types Parquet cannot name are cast to ones it can
    /// ([`mink_log::export::parquet_type`]): the schema written.
    Parquet(
        parquet::arrow::ArrowWriter<&'a mut (dyn Write + Send)>,
        arrow::datatypes::SchemaRef,
    ),
}

impl<'a> Rows<'a> {
    fn new(
        schema: arrow::datatypes::SchemaRef,
        format: Format,
        max: usize,
        out: &'a mut (dyn Write + Send),
    ) -> anyhow::Result<Self> {
        if schema.fields().is_empty() && format != Format::Parquet {
            return Ok(Rows::Nothing);
        }
        // Said before the header is written, as `mink scan` says it.
        if format == Format::Csv
            && let Some(f) = schema.fields().iter().find(|f| f.data_type().is_nested())
        {
            anyhow::bail!(
                "CSV holds flat columns only, and column {:?} is {}: use --format json or parquet, or leave it out of the SELECT",
                f.name(),
                f.data_type()
            );
        }
        Ok(match format {
            Format::Table => Rows::Table {
                schema,
                kept: Vec::new(),
                kept_rows: 0,
                max,
                out,
            },
            Format::Csv => Rows::Csv(
                arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(out),
                schema,
            ),
            Format::Json => Rows::Json(mink_log::export::json_writer(out)),
            Format::Parquet => {
                let written = mink_log::export::parquet_schema(&schema);
                Rows::Parquet(
                    parquet::arrow::ArrowWriter::try_new(
                        out,
                        std::sync::Arc::clone(&written),
                        None,
                    )?,
                    written,
                )
            }
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> anyhow::Result<()> {
        match self {
            Rows::Nothing => {}
            Rows::Table {
                kept,
                kept_rows,
                max,
                ..
            } => {
                let room = if *max == 0 {
                    batch.num_rows()
                } else {
                    (*max - *kept_rows).min(batch.num_rows())
                };
                if room > 0 {
                    *kept_rows += room;
                    kept.push(batch.slice(0, room));
                }
            }
            Rows::Csv(w, _) => w.write(&mink_log::export::text_batch(batch)?)?,
            Rows::Json(w) => w.write(&mink_log::export::text_batch(batch)?)?,
            Rows::Parquet(w, schema) => w.write(&mink_log::export::cast_batch(batch, schema)?)?,
        }
        Ok(())
    }

    /// Ends the output of a statement that answered `count` rows.
    fn finish(self, count: u64) -> anyhow::Result<()> {
        match self {
            Rows::Nothing => {}
            // The header line, as psql and DuckDB write it for no rows.
            Rows::Csv(mut w, schema) if count == 0 => {
                w.write(&mink_log::export::text_batch(&RecordBatch::new_empty(
                    schema,
                ))?)?;
            }
            Rows::Csv(..) => {}
            Rows::Table {
                schema,
                mut kept,
                kept_rows,
                out,
                ..
            } => {
                if kept.is_empty() {
                    kept.push(RecordBatch::new_empty(schema));
                }
                writeln!(
                    out,
                    "{}",
                    arrow::util::pretty::pretty_format_batches(&kept)?
                )?;
                if count > kept_rows as u64 {
                    writeln!(
                        out,
                        "({kept_rows} of {count} rows shown: --max-rows N shows more, 0 all; --format csv writes every row as it arrives)"
                    )?;
                }
            }
            Rows::Json(mut w) => w.finish()?,
            Rows::Parquet(w, _) => {
                w.close()?;
            }
        }
        Ok(())
    }
}
