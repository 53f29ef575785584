//! `mink produce`, `mink scan`, `mink tail`: rows in and out as CSV, JSON lines, Parquet or a
//! pretty table.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use arrow::array::{ArrayRef, AsArray as _, RecordBatch, UInt32Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use clap::{Args, ValueEnum};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use mink_client::{Client, Op, Predicate, ReadBatch, Scan};

use crate::admin::split_table;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum InFormat {
    Csv,
    Json,
    Parquet,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutFormat {
    Table,
    Csv,
    Json,
    Parquet,
}

#[derive(Args, Debug)]
pub(crate) struct ProduceArgs {
    /// `database.table`
    table: String,
    /// Input file (`-` or absent: standard input).
    input: Option<PathBuf>,
    /// Input format (default: from the file extension, else JSON lines).
    #[arg(long, short = 'f', value_enum)]
    format: Option<InFormat>,
    /// Rows per write (each write is acknowledged once durable).
    #[arg(long, default_value_t = 8192)]
    batch_rows: usize,
    /// CSV: the first line is data, not a header.
    #[arg(long)]
    no_header: bool,
    /// Primary-key tables: delete the rows' keys instead of upserting the rows.
    #[arg(long)]
    delete: bool,
}

#[derive(Args, Debug)]
pub(crate) struct LookupArgs {
    /// `database.table` (a primary-key table)
    table: String,
    /// Keys as JSON objects holding every primary-key column: '{"id": 1}' (repeatable;
    /// `-` reads one object per line from standard input).
    #[arg(required = true)]
    keys: Vec<String>,
    /// Prefix lookup: the objects hold the bucket-key columns; every row under each.
    #[arg(long)]
    prefix: bool,
    /// Columns to return, comma-separated (default: all).
    #[arg(long)]
    columns: Option<String>,
    /// Lookups print their rows (Parquet is for scans to a file).
    #[arg(long, short = 'f', value_enum, default_value = "table")]
    format: PrintFormat,
}

/// The formats a command that prints its rows takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PrintFormat {
    Table,
    Csv,
    Json,
}

impl From<PrintFormat> for OutFormat {
    fn from(f: PrintFormat) -> Self {
        match f {
            PrintFormat::Table => OutFormat::Table,
            PrintFormat::Csv => OutFormat::Csv,
            PrintFormat::Json => OutFormat::Json,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct ScanArgs {
    /// `database.table`
    table: String,
    /// Only this partition (values joined by `$`).
    #[arg(long)]
    partition: Option<String>,
    /// Only this bucket.
    #[arg(long)]
    bucket: Option<u32>,
    /// With --bucket: the first offset to read.
    #[arg(long)]
    offset: Option<u64>,
    /// Columns to read, comma-separated (default: all).
    #[arg(long)]
    columns: Option<String>,
    /// Stop after this many rows (default for --format table: 100).
    #[arg(long)]
    limit: Option<u64>,
    #[arg(long, short = 'f', value_enum, default_value = "table")]
    format: OutFormat,
    /// Write here instead of standard output (required for Parquet).
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// Add `_bucket` and `_offset` columns (of a primary-key table, with --changelog: its
    /// rows have no offsets).
    #[arg(long, conflicts_with = "filter")]
    with_offsets: bool,
    /// Only rows where this holds: `column OP value` (`=`, `!=`, `<`, `<=`, `>`, `>=`),
    /// `column in (v1, v2)`, `column is null`, `column is not null`; strings in single
    /// quotes. Repeat for several (all must hold). `__bucket` and, on log tables,
    /// `__offset` select buckets and offsets.
    #[arg(long = "where", value_name = "PREDICATE", value_parser = parse_predicate)]
    filter: Vec<Predicate>,
    /// Primary-key tables: read the changelog (`_change_type`, `_log_offset`,
    /// `_commit_timestamp`, then the columns) instead of the current rows.
    #[arg(long)]
    changelog: bool,
    /// Tables tiered into the lake: read the lake's rows only (the default reads a log table's
    /// lake below the log's start, then the log; a primary-key table's current rows).
    #[arg(long, conflicts_with_all = ["log", "union"])]
    lake: bool,
    /// Log tables tiered into the lake: read the log's rows only.
    #[arg(long, conflicts_with = "union")]
    log: bool,
    /// Primary-key tables tiered into the lake: read the lake snapshot merged with the
    /// changelog after it (the union read) rather than the KV tablet.
    #[arg(long)]
    union: bool,
}

#[derive(Args, Debug)]
pub(crate) struct TailArgs {
    /// `database.table`
    table: String,
    #[arg(long)]
    partition: Option<String>,
    /// Only this bucket (default: every bucket of the table or partition).
    #[arg(long)]
    bucket: Option<u32>,
    /// Start from the oldest row rather than new ones.
    #[arg(long)]
    from_beginning: bool,
    #[arg(long)]
    columns: Option<String>,
    /// Stop after this long without new rows (default: never).
    #[arg(long, value_parser = parse_seconds)]
    idle_timeout: Option<Duration>,
    #[arg(long, short = 'f', value_enum, default_value = "json")]
    format: OutFormat,
    #[arg(long)]
    with_offsets: bool,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = n
        .parse()
        .map_err(|_| format!("expected a duration like 30s, 5m or 500ms, got {s:?}"))?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in {s:?} (ms, s, m, h)")),
    };
    Ok(Duration::from_secs_f64(seconds))
}

fn rows_bar(what: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {human_pos} rows ({per_sec}) {elapsed}")
            .expect("valid template"),
    );
    bar.set_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// The type a text reader (CSV or JSON lines) parses a table column as; [`conform`] brings it
/// to the column's type. Text holds a dictionary column as its values, a duration as an
/// integer count of the column's unit (what `scan` writes), and, in CSV (whose reader knows
/// fewer types), binary as hex, any string as `Utf8` and half floats as `Float32`.
/// The columns a CSV header names, in its order, typed as `table` (the table's columns as text
/// holds them) types them; the header line is consumed. Unknown and repeated names are refused.
fn csv_columns(
    input: &mut dyn BufRead,
    table: &SchemaRef,
    name: &str,
) -> anyhow::Result<SchemaRef> {
    let mut line = Vec::new();
    input
        .read_until(b'\n', &mut line)
        .context("CSV input: reading the header")?;
    let header = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(line.as_slice())
        .records()
        .next()
        .transpose()
        .context("CSV input: the header")?
        .context("CSV input is empty: its first line names the columns (or give --no-header)")?;
    let mut fields: Vec<Field> = Vec::with_capacity(header.len());
    for column in header.iter().map(str::trim) {
        let Ok(f) = table.field_with_name(column) else {
            bail!(
                "the CSV header names {column:?}, which is not a column of {name} (its columns: {}); give --no-header for input without a header",
                names(table)
            );
        };
        if fields.iter().any(|g| g.name() == column) {
            bail!("the CSV header names {column:?} twice");
        }
        fields.push(f.clone());
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// JSON lines (one object per line; blank lines skipped) as batches of `schema` of up to
/// `batch_rows` rows. A key that is not a column is refused, and so is a number its column
/// would not hold exactly (Arrow's reader truncates `1.9` into an integer column).
fn json_lines(
    mut input: Box<dyn BufRead + Send>,
    schema: SchemaRef,
    batch_rows: usize,
) -> anyhow::Result<impl Iterator<Item = anyhow::Result<RecordBatch>> + Send> {
    let mut decoder = arrow::json::ReaderBuilder::new(Arc::clone(&schema))
        .with_batch_size(batch_rows)
        .with_strict_mode(true)
        .build_decoder()?;
    let mut line = Vec::new();
    let mut number = 0u64;
    let mut done = false;
    Ok(std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut next = || -> anyhow::Result<Option<RecordBatch>> {
            loop {
                line.clear();
                if input.read_until(b'\n', &mut line)? == 0 {
                    done = true;
                    return Ok(decoder.flush()?);
                }
                number += 1;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if mink_log::json::may_be_inexact(&schema, &line) {
                    let object =
                        serde_json::from_slice(&line).with_context(|| format!("line {number}"))?;
                    mink_log::json::check_exact(&schema, &object)
                        .map_err(|e| anyhow::anyhow!("line {number}: {e}"))?;
                }
                decoder
                    .decode(&line)
                    .with_context(|| format!("line {number}"))?;
                if decoder.len() >= batch_rows {
                    return Ok(decoder.flush()?);
                }
            }
        };
        let batch = next();
        // Nothing is read past an error.
        done |= batch.is_err();
        batch.transpose()
    }))
}

fn text_type(t: &DataType, csv: bool) -> DataType {
    match t {
        DataType::Dictionary(_, values) => text_type(values, csv),
        DataType::Duration(_) => DataType::Int64,
        DataType::Float16 if csv => DataType::Float32,
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_)
        | DataType::LargeUtf8
        | DataType::Utf8View
            if csv =>
        {
            DataType::Utf8
        }
        other => other.clone(),
    }
}

fn is_binary(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

/// A column of hex text as bytes.
fn unhex(name: &str, c: &ArrayRef) -> anyhow::Result<ArrayRef> {
    let text = arrow::compute::cast(c, &DataType::Utf8)?;
    let text = text.as_string::<i32>();
    let bytes = text
        .iter()
        .map(|v| v.map(hex::decode).transpose())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("column {name:?}: binary values are written as hex"))?;
    Ok(Arc::new(arrow::array::BinaryArray::from_iter(bytes)))
}

/// Brings a batch read from a file to the table's schema: columns by name, cast to the
/// table's types (Parquet files often differ in width or string kind; text holds the types
/// [`text_type`] names).
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> anyhow::Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let c = batch.column_by_name(f.name()).with_context(|| {
                format!(
                    "the input has no column {:?} (the table has {})",
                    f.name(),
                    names(schema)
                )
            })?;
            if c.data_type() == f.data_type() {
                Ok(Arc::clone(c))
            } else if is_binary(f.data_type()) && !is_binary(c.data_type()) {
                Ok(arrow::compute::cast(&unhex(f.name(), c)?, f.data_type())?)
            } else {
                exact_cast(f, c)
            }
        })
        .collect::<anyhow::Result<Vec<ArrayRef>>>()?;
    let nullable = Arc::new(mink_log::codec::all_nullable(schema));
    Ok(RecordBatch::try_new(nullable, columns)?)
}

/// `batch` as the table's columns (`conform`), the `optional` ones it lacks as nulls. The
/// column the table generates (`generated`, and whether the rows are deletes) is refused with
/// values in an upsert, and cleared in a delete (the node takes a delete by its key).
fn taken(
    batch: &RecordBatch,
    schema: &SchemaRef,
    optional: &[String],
    generated: Option<&(String, bool)>,
) -> anyhow::Result<RecordBatch> {
    if let Some((g, false)) = generated
        && let Some(c) = batch.column_by_name(g)
        && c.null_count() < c.len()
    {
        bail!("column {g:?} is auto-increment: its values are generated, leave it out");
    }
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for f in schema.fields() {
        let cleared = generated.is_some_and(|(g, delete)| *delete && g == f.name());
        match batch.column_by_name(f.name()) {
            Some(c) if !cleared => {
                fields.push(Field::new(f.name(), c.data_type().clone(), true));
                columns.push(Arc::clone(c));
            }
            // Left for `conform` to name as missing.
            None if !cleared && !optional.contains(f.name()) => {}
            _ => {
                fields.push(f.as_ref().clone().with_nullable(true));
                columns.push(arrow::array::new_null_array(
                    f.data_type(),
                    batch.num_rows(),
                ));
            }
        }
    }
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    let rows = RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), columns, &options)?;
    conform(&rows, schema)
}

/// `c` cast to `f`'s type, refusing what the cast would not keep: a value that does not fit
/// or parse (Arrow's default cast makes it null), and, from a typed column (Parquet), a value
/// the column's type cannot hold exactly (1.9 into an integer, 12.345 into `Decimal(10, 2)`,
/// a fraction of a second into a seconds timestamp), as JSON lines are refused. Floats
/// narrow as they do in JSON.
fn exact_cast(f: &Field, c: &ArrayRef) -> anyhow::Result<ArrayRef> {
    let strict = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let why = || {
        format!(
            "column {:?}: cannot cast {} to {}",
            f.name(),
            c.data_type(),
            f.data_type()
        )
    };
    let cast = arrow::compute::cast_with_options(c, f.data_type(), &strict).with_context(why)?;
    let target = f.data_type();
    let checked = target.is_integer() || target.is_decimal() || target.is_temporal();
    let text = matches!(
        c.data_type(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    if checked && !text {
        let back =
            arrow::compute::cast_with_options(&cast, c.data_type(), &strict).with_context(why)?;
        let changed = arrow::compute::kernels::cmp::distinct(c, &back)?;
        if let Some(row) = changed.iter().position(|d| d == Some(true)) {
            let shown = arrow::util::display::ArrayFormatter::try_new(
                c.as_ref(),
                &arrow::util::display::FormatOptions::default(),
            )?
            .value(row)
            .to_string();
            bail!(
                "column {:?}: {shown} (row {row} of the batch) is not exactly a value of its type {}",
                f.name(),
                f.data_type()
            );
        }
    }
    Ok(cast)
}

/// `n` `thing`s, in words: "1 row", "2 rows".
pub(crate) fn count(n: u64, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

fn names(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) async fn produce(client: &Client, a: ProduceArgs) -> anyhow::Result<()> {
    let (database, table) = split_table(&a.table)?;
    let description = client.describe_table(&database, &table).await?;
    if a.delete && description.primary_key.is_empty() {
        bail!(
            "{database}.{table} is a log table: --delete removes rows by key from a primary-key table"
        );
    }
    let schema: SchemaRef = Arc::new(
        description
            .arrow_schema()
            .map_err(|e| anyhow::anyhow!(e.0))?,
    );
    // Columns the input may leave out, written as nulls: a delete's non-key columns (a
    // delete needs the key; CSV may name it alone), and the column the table generates (the
    // node fills it; a value given for it is refused, but not in a delete: rows read back
    // from a scan hold it).
    let generated = description.auto_increment_column();
    let optional: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| {
            (a.delete && !description.primary_key.contains(n)) || generated.as_ref() == Some(n)
        })
        .collect();
    let generated = generated.map(|g| (g, a.delete));
    // Readers parse into the table's columns, all nullable (the node names any null in a
    // non-null column precisely), in the types text holds them as.
    let loose = |csv: bool| -> SchemaRef {
        Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .map(|f| {
                    f.as_ref()
                        .clone()
                        .with_data_type(text_type(f.data_type(), csv))
                        .with_nullable(true)
                })
                .collect::<Vec<_>>(),
        ))
    };
    let path = a.input.filter(|p| p.as_os_str() != "-");
    let format = a.format.unwrap_or_else(|| {
        match path
            .as_ref()
            .and_then(|p| p.extension())
            .and_then(|e| e.to_str())
        {
            Some("csv") => InFormat::Csv,
            Some("parquet" | "pq") => InFormat::Parquet,
            _ => InFormat::Json,
        }
    });
    let batch_rows = a.batch_rows.max(1);
    let batches: Box<dyn Iterator<Item = anyhow::Result<RecordBatch>> + Send> = match format {
        InFormat::Parquet => {
            let Some(p) = &path else {
                bail!(
                    "Parquet input must be a file (it is read from its footer): mink produce {} data.parquet",
                    a.table
                )
            };
            let file =
                std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .with_context(|| format!("{} is not a Parquet file", p.display()))?
                    .with_batch_size(batch_rows)
                    .build()?;
            let (schema, optional, generated) =
                (Arc::clone(&schema), optional.clone(), generated.clone());
            Box::new(reader.map(move |b| taken(&b?, &schema, &optional, generated.as_ref())))
        }
        InFormat::Csv | InFormat::Json => {
            let input: Box<dyn Read + Send> = match &path {
                Some(p) => Box::new(
                    std::fs::File::open(p)
                        .with_context(|| format!("cannot open {}", p.display()))?,
                ),
                None => Box::new(std::io::stdin()),
            };
            let mut input: Box<dyn BufRead + Send> =
                Box::new(BufReader::with_capacity(1 << 20, input));
            let (table, optional, generated) =
                (Arc::clone(&schema), optional.clone(), generated.clone());
            if format == InFormat::Csv {
                if let Some(f) = schema.fields().iter().find(|f| f.data_type().is_nested()) {
                    bail!(
                        "CSV holds flat columns only, and {} has the nested column {:?} ({}): write JSON lines or Parquet",
                        a.table,
                        f.name(),
                        f.data_type()
                    );
                }
                // A header names the columns: they are taken by name, in its order.
                let columns = if a.no_header {
                    loose(true)
                } else {
                    csv_columns(&mut input, &loose(true), &a.table)?
                };
                let reader = arrow::csv::ReaderBuilder::new(columns)
                    .with_batch_size(batch_rows)
                    .build(input)?;
                Box::new(reader.map(move |b| {
                    taken(
                        &b.context("CSV input")?,
                        &table,
                        &optional,
                        generated.as_ref(),
                    )
                }))
            } else {
                Box::new(json_lines(input, loose(false), batch_rows)?.map(move |b| {
                    let b = b.context("JSON input (one object per line, keys are column names)")?;
                    taken(&b, &table, &optional, generated.as_ref())
                }))
            }
        }
    };
    // Parse on a blocking thread, write from here: a bounded channel keeps them in step.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<anyhow::Result<RecordBatch>>(4);
    let reader = tokio::task::spawn_blocking(move || {
        for b in batches {
            // Nothing is read past an error: Arrow's readers are not made to go on after one
            // (arrow-csv's then broke a precondition of its own and aborted the process).
            let failed = b.is_err();
            if tx.blocking_send(b).is_err() || failed {
                break;
            }
        }
    });
    let mut writer = client.writer(&database, &table);
    let bar = rows_bar(&format!("writing to {database}.{table}"));
    let mut rows = 0u64;
    while let Some(batch) = rx.recv().await {
        let batch = batch?;
        let mut batch = RecordBatch::try_new(Arc::clone(&schema), batch.columns().to_vec())
            .or_else(|_| conform(&batch, &schema))?;
        if a.delete {
            let kinds = arrow::array::StringArray::from(vec!["delete"; batch.num_rows()]);
            batch = mink_log::codec::with_column(
                &batch,
                Field::new("_row_kind", DataType::Utf8, false),
                Arc::new(kinds),
            )?;
        }
        let written = writer
            .write(&batch)
            .await
            .with_context(|| format!("after {} were written", count(rows, "row")))?;
        rows += written.rows;
        bar.set_position(rows);
    }
    let _ = reader.await;
    bar.finish_and_clear();
    let what = if a.delete {
        format!("deleted {} from", count(rows, "key"))
    } else {
        format!("wrote {} to", count(rows, "row"))
    };
    crate::out(&format!("{what} {database}.{table}\n"))?;
    Ok(())
}

/// Adds `_bucket` and `_offset` columns.
fn with_offsets(r: &ReadBatch) -> anyhow::Result<RecordBatch> {
    let n = r.batch.num_rows();
    let mut fields: Vec<Field> = vec![
        Field::new("_bucket", DataType::UInt32, false),
        Field::new("_offset", DataType::UInt64, false),
    ];
    fields.extend(r.batch.schema().fields().iter().map(|f| f.as_ref().clone()));
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from(vec![r.bucket; n])),
        Arc::new(UInt64Array::from_iter_values(r.offset..r.offset + n as u64)),
    ];
    columns.extend(r.batch.columns().iter().cloned());
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Writes batches in a format, to a file or standard output.
enum Sink {
    /// Pretty tables are drawn once, over every batch (scans are limited for this format).
    Table(Box<dyn Write + Send>, Vec<RecordBatch>),
    Csv(arrow::csv::Writer<Box<dyn Write + Send>>),
    Json(arrow::json::LineDelimitedWriter<Box<dyn Write + Send>>),
    /// Columns of types Parquet cannot name are cast to ones it can
    /// ([`mink_log::export::parquet_type`]): the schema written.
    Parquet(
        Option<parquet::arrow::ArrowWriter<std::fs::File>>,
        SchemaRef,
    ),
}

impl Sink {
    fn open(
        format: OutFormat,
        output: Option<&PathBuf>,
        schema: &SchemaRef,
    ) -> anyhow::Result<Sink> {
        let out = || -> anyhow::Result<Box<dyn Write + Send>> {
            Ok(match output {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("cannot create {}", p.display()))?,
                )),
                None => Box::new(std::io::BufWriter::new(std::io::stdout())),
            })
        };
        if format == OutFormat::Csv
            && let Some(f) = schema.fields().iter().find(|f| f.data_type().is_nested())
        {
            bail!(
                "CSV holds flat columns only, and column {:?} is {}: use --format json or parquet, or leave it out with --columns",
                f.name(),
                f.data_type()
            );
        }
        Ok(match format {
            OutFormat::Table => Sink::Table(out()?, Vec::new()),
            OutFormat::Csv => Sink::Csv(
                arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(out()?),
            ),
            // Explicit nulls: a map entry whose value is null is kept, not dropped.
            OutFormat::Json => Sink::Json(mink_log::export::json_writer(out()?)),
            OutFormat::Parquet => {
                let p = output.context("Parquet output needs a file: --output data.parquet")?;
                let file = std::fs::File::create(p)
                    .with_context(|| format!("cannot create {}", p.display()))?;
                let written = mink_log::export::parquet_schema(schema);
                Sink::Parquet(
                    Some(parquet::arrow::ArrowWriter::try_new(
                        file,
                        Arc::clone(&written),
                        None,
                    )?),
                    written,
                )
            }
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> anyhow::Result<()> {
        match self {
            Sink::Table(_, batches) => batches.push(batch.clone()),
            Sink::Csv(w) => w.write(&mink_log::export::text_batch(batch)?)?,
            Sink::Json(w) => w.write(&mink_log::export::text_batch(batch)?)?,
            Sink::Parquet(w, schema) => w
                .as_mut()
                .expect("open")
                .write(&mink_log::export::cast_batch(batch, schema)?)?,
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        match self {
            Sink::Table(w, batches) => {
                if !batches.is_empty() {
                    writeln!(
                        w,
                        "{}",
                        arrow::util::pretty::pretty_format_batches(batches)?
                    )?;
                    batches.clear();
                }
                w.flush()?;
            }
            Sink::Csv(_) => {}
            Sink::Json(w) => w.get_mut().flush()?,
            Sink::Parquet(w, _) => {
                if let Some(w) = w.take() {
                    w.close()?;
                }
            }
        }
        Ok(())
    }
}

fn column_list(columns: Option<&String>) -> Vec<String> {
    columns
        .map(|c| {
            c.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// A name in double quotes at the start of `text` (`""` for a quote in it), as SQL quotes
/// identifiers, and what follows it (trimmed); `None` when `text` starts with no quote.
pub(crate) fn quoted_name(text: &str) -> Option<Result<(String, &str), String>> {
    let quoted = text.strip_prefix('"')?;
    let mut name = String::new();
    let mut chars = quoted.char_indices().peekable();
    loop {
        match chars.next() {
            Some((i, '"')) if chars.peek().map(|(_, c)| *c) != Some('"') => {
                return Some(Ok((name, quoted[i + 1..].trim_start())));
            }
            Some((_, '"')) => {
                chars.next();
                name.push('"');
            }
            Some((_, c)) => name.push(c),
            None => {
                return Some(Err(format!(
                    "{text:?}: the name's closing quote is missing"
                )));
            }
        }
    }
}

/// A `--where` predicate: `column OP value`, `column in (v, ...)`, `column is [not] null`; a
/// column name with spaces or operator characters in double quotes (`"My Col" = 1`, `""` for
/// a quote), as in SQL.
fn parse_predicate(text: &str) -> Result<Predicate, String> {
    let text = text.trim();
    let (column, rest) = if let Some(quoted) = quoted_name(text) {
        quoted?
    } else {
        let split = text
            .find(|c: char| c.is_whitespace() || "=!<>".contains(c))
            .ok_or_else(|| format!("{text:?}: expected `column OP value`"))?;
        (text[..split].to_string(), text[split..].trim_start())
    };
    let lower = rest.to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    match words.as_slice() {
        ["is", "null"] => return Ok(Predicate::new(column, Op::IsNull)),
        ["is", "not", "null"] => return Ok(Predicate::new(column, Op::IsNotNull)),
        _ => {}
    }
    if let Some(list) = lower
        .strip_prefix("in")
        .map(str::trim_start)
        .filter(|l| l.starts_with('('))
    {
        let inner = list
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| format!("{text:?}: expected `column in (v1, v2, ...)`"))?;
        // The values from the original text (case kept).
        let start = rest.len() - inner.len() - 1;
        let values = rest[start..start + inner.len()]
            .split(',')
            .map(literal)
            .collect::<Result<_, _>>()?;
        return Ok(Predicate::new(column, Op::In { values }));
    }
    let op_len = rest
        .find(|c: char| !"=!<>".contains(c))
        .unwrap_or(rest.len());
    let value = literal(&rest[op_len..])?;
    let op = match &rest[..op_len] {
        "=" | "==" => Op::Eq { value },
        "!=" | "<>" => Op::NotEq { value },
        "<" => Op::Lt { value },
        "<=" => Op::LtEq { value },
        ">" => Op::Gt { value },
        ">=" => Op::GtEq { value },
        other => {
            return Err(format!(
                "{text:?}: {other:?} is not an operator (=, !=, <, <=, >, >=, in, is null)"
            ));
        }
    };
    Ok(Predicate::new(column, op))
}

/// A literal of a `--where` predicate: a number, `true`/`false`, `null`, or a string (in
/// single quotes, or bare).
fn literal(text: &str) -> Result<serde_json::Value, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("a predicate needs a value".into());
    }
    if let Some(s) = t.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        return Ok(serde_json::Value::String(s.replace("''", "'")));
    }
    if t.len() >= 2 && t.starts_with('"') && t.ends_with('"') {
        // SQL's quotes: "a" would name a column; taken as text it matches nothing.
        return Err(format!(
            "{t}: strings go in single quotes ('{}')",
            &t[1..t.len() - 1]
        ));
    }
    match t {
        "null" | "NULL" => return Ok(serde_json::Value::Null),
        "true" | "TRUE" => return Ok(serde_json::Value::Bool(true)),
        "false" | "FALSE" => return Ok(serde_json::Value::Bool(false)),
        _ => {}
    }
    if let Ok(n) = t.parse::<serde_json::Number>() {
        // A whole number goes as one; a fraction or an exponent as its text, which the node
        // reads as the column's type (as an f64 it lost digits, so a decimal's equality matched
        // nothing, and 0.1 was no Float32 value).
        if n.is_i64() || n.is_u64() {
            return Ok(serde_json::Value::Number(n));
        }
        return Ok(serde_json::Value::String(t.to_string()));
    }
    Ok(serde_json::Value::String(t.to_string()))
}

pub(crate) async fn scan(client: &Client, a: ScanArgs) -> anyhow::Result<()> {
    let (database, table) = split_table(&a.table)?;
    if a.with_offsets
        && !a.changelog
        && !client
            .describe_table(&database, &table)
            .await?
            .primary_key
            .is_empty()
    {
        bail!(
            "--with-offsets: a primary-key table's rows have no offsets (offsets number its changelog): add --changelog"
        );
    }
    let mut scan = Scan::table(&database, &table).columns(column_list(a.columns.as_ref()));
    if a.changelog {
        scan = scan.changelog();
    }
    if a.lake {
        scan = scan.source("lake");
    } else if a.log {
        scan = scan.source("log");
    } else if a.union {
        scan = scan.source("union");
    }
    if let Some(p) = &a.partition {
        scan = scan.partition(p);
    }
    for p in &a.filter {
        scan = scan.filter(p.clone());
    }
    if let Some(b) = a.bucket {
        scan = scan.bucket(b);
    }
    if let Some(o) = a.offset {
        if a.bucket.is_none() {
            bail!("--offset needs --bucket: offsets are per bucket");
        }
        scan = scan.offset(o);
    }
    let limit = a.limit.or((a.format == OutFormat::Table).then_some(100));
    if let Some(l) = limit {
        scan = scan.max_rows(l);
    }
    let mut stream = client.scan(&scan).await?;
    let to_file = a.output.is_some();
    let bar = to_file.then(|| rows_bar(&format!("reading {database}.{table}")));
    let mut sink: Option<Sink> = None;
    let mut rows = 0u64;
    let mut more = false;
    let result: anyhow::Result<()> = async {
        while let Some(r) = stream.next().await {
            let r = r?;
            let mut batch = if a.with_offsets {
                with_offsets(&r)?
            } else {
                r.batch.clone()
            };
            if let Some(l) = limit {
                if rows >= l {
                    more = true;
                    break;
                }
                let keep = usize::try_from(l - rows).unwrap_or(usize::MAX);
                if batch.num_rows() > keep {
                    batch = batch.slice(0, keep);
                    more = true;
                }
            }
            if sink.is_none() {
                sink = Some(Sink::open(a.format, a.output.as_ref(), &batch.schema())?);
            }
            sink.as_mut().expect("opened").write(&batch)?;
            rows += batch.num_rows() as u64;
            if let Some(b) = &bar {
                b.set_position(rows);
            }
        }
        if let Some(s) = &mut sink {
            s.flush()?;
        }
        Ok(())
    }
    .await;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    result?;
    if a.format == OutFormat::Table || to_file {
        let note = if more && a.limit.is_none() {
            " (more rows: raise --limit or use --format csv)"
        } else {
            ""
        };
        let written = a
            .output
            .as_ref()
            .map(|p| format!(" to {}", p.display()))
            .unwrap_or_default();
        crate::out(&format!("{}{written}{note}\n", count(rows, "row")))?;
    }
    Ok(())
}

pub(crate) async fn tail(client: &Client, a: TailArgs) -> anyhow::Result<()> {
    let (database, table) = split_table(&a.table)?;
    if a.format == OutFormat::Parquet {
        bail!("tail writes as rows arrive: use --format json, csv or table");
    }
    let description = client.describe_table(&database, &table).await?;
    // New rows of a primary-key table are its changelog.
    let changelog = !description.primary_key.is_empty();
    // Each bucket's high watermark now: where a tail of new rows starts, and so where it
    // resumes if the node stops before it gets any.
    let buckets: Vec<(Option<String>, u32, Option<u64>)> = description
        .buckets
        .iter()
        .filter(|b| a.partition.is_none() || b.partition == a.partition)
        .filter(|b| a.bucket.is_none_or(|only| b.bucket == only))
        .map(|b| (b.partition.clone(), b.bucket, Some(b.end_offset)))
        .collect();
    let buckets = match (a.bucket, buckets.is_empty()) {
        (Some(b), true) => vec![(a.partition.clone(), b, None)],
        _ => buckets,
    };
    if buckets.is_empty() {
        bail!(
            "{database}.{table} has no buckets to tail yet (a partitioned table gets them with its first rows)"
        );
    }
    // The cluster's other nodes: any node serves a log read, so a tail whose node stops goes
    // on at another.
    let others: Arc<Vec<String>> = Arc::new(match client.describe_cluster().await {
        Ok(c) => c
            .nodes
            .into_iter()
            .filter(|n| n.node_id != c.node_id)
            .map(|n| n.address)
            .collect(),
        Err(_) => Vec::new(),
    });
    let mut streams = Vec::new();
    for (partition, bucket, end) in buckets {
        let mut s = Scan::table(&database, &table)
            .bucket(bucket)
            .columns(column_list(a.columns.as_ref()))
            .tail(a.idle_timeout);
        if changelog {
            s = s.changelog();
        }
        if let Some(p) = &partition {
            s = s.partition(p);
        }
        let next = match (a.from_beginning, end) {
            (true, _) => None,
            (false, Some(end)) => Some(end),
            (false, None) => {
                s = s.latest();
                None
            }
        };
        if let Some(n) = next {
            s = s.offset(n);
        }
        let first = client.scan(&s).await?;
        streams.push(resuming(
            client.clone(),
            Arc::clone(&others),
            s,
            next,
            first,
        ));
    }
    let mut merged = futures::stream::select_all(streams);
    let mut sink: Option<Sink> = None;
    let result: anyhow::Result<()> = async {
        while let Some(r) = merged.next().await {
            let r = r?;
            let batch = if a.with_offsets {
                with_offsets(&r)?
            } else {
                r.batch.clone()
            };
            if sink.is_none() {
                sink = Some(Sink::open(a.format, None, &batch.schema())?);
            }
            let s = sink.as_mut().expect("opened");
            s.write(&batch)?;
            s.flush()?;
        }
        Ok(())
    }
    .await;
    result
}

/// How long a tail keeps trying to read on after its node stopped or its connection dropped.
const RESUME_LIMIT: Duration = Duration::from_secs(60);

/// A bucket's tail (`scan`, its first read `first`) that outlives its node stopping (a
/// rolling restart) or a dropped connection: on an error worth retrying it reads again from
/// the offset after the last row it gave (`next` before any), at its node or else at one of
/// `others` (the cluster's other nodes, in turn), waiting 100 ms doubling to 5 s between
/// rounds, for up to [`RESUME_LIMIT`].
fn resuming(
    client: Client,
    others: Arc<Vec<String>>,
    scan: Scan,
    next: Option<u64>,
    first: futures::stream::BoxStream<'static, mink_client::ClientResult<ReadBatch>>,
) -> futures::stream::BoxStream<'static, anyhow::Result<ReadBatch>> {
    struct Tail {
        client: Client,
        others: Arc<Vec<String>>,
        scan: Scan,
        next: Option<u64>,
        stream: futures::stream::BoxStream<'static, mink_client::ClientResult<ReadBatch>>,
    }
    let tail = Tail {
        client,
        others,
        scan,
        next,
        stream: first,
    };
    futures::stream::unfold(Some(tail), |tail| async move {
        let mut t = tail?;
        loop {
            let e = match t.stream.next().await {
                None => return None,
                Some(Ok(r)) => {
                    t.next = Some(r.offset + r.batch.num_rows() as u64);
                    return Some((Ok(r), Some(t)));
                }
                Some(Err(e)) if e.is_retriable() => e,
                Some(Err(e)) => return Some((Err(e.into()), None)),
            };
            let bucket = t.scan.0.bucket.unwrap_or(0);
            let mut scan = t.scan.clone();
            if let Some(n) = t.next {
                scan.0.latest = false;
                scan = scan.offset(n);
            }
            let from = t
                .next
                .map_or_else(|| "its high watermark".to_string(), |n| format!("offset {n}"));
            tracing::warn!(error = %e, bucket, "the tail broke off; reading again from {from}");
            let started = tokio::time::Instant::now();
            let mut wait = Duration::from_millis(100);
            t.stream = 'rounds: loop {
                tokio::time::sleep(wait).await;
                let mut last = None;
                for other in std::iter::once(None).chain(t.others.iter().map(Some)) {
                    let read = match other {
                        None => t.client.scan(&scan).await,
                        Some(address) => {
                            match Client::connect_with(address, t.client.config().clone()).await {
                                Ok(c) => c.scan(&scan).await,
                                Err(e) => Err(e),
                            }
                        }
                    };
                    match read {
                        Ok(stream) => {
                            if let Some(address) = other {
                                tracing::warn!(bucket, "the tail reads on at {address}");
                            }
                            break 'rounds stream;
                        }
                        Err(e) if e.is_retriable() => last = Some(e),
                        Err(e) => {
                            last = Some(e);
                            break;
                        }
                    }
                }
                let e = last.expect("at least one attempt");
                match e {
                    e if e.is_retriable() && started.elapsed() < RESUME_LIMIT => {
                        wait = (wait * 2).min(Duration::from_secs(5));
                    }
                    e => {
                        let e = anyhow::Error::from(e).context(format!(
                            "the tail of bucket {bucket} broke off and could not read again from {from} within {} s",
                            RESUME_LIMIT.as_secs()
                        ));
                        return Some((Err(e), None));
                    }
                }
            };
        }
    })
    .boxed()
}

pub(crate) async fn lookup(client: &Client, a: LookupArgs) -> anyhow::Result<()> {
    let (database, table) = split_table(&a.table)?;
    let mut texts = Vec::new();
    for k in &a.keys {
        if k == "-" {
            for line in std::io::stdin().lock().lines() {
                let line = line?;
                if !line.trim().is_empty() {
                    texts.push(line);
                }
            }
        } else {
            texts.push(k.clone());
        }
    }
    let keys = texts
        .iter()
        .map(|t| match serde_json::from_str::<serde_json::Value>(t) {
            Ok(serde_json::Value::Object(o)) => Ok(o),
            _ => Err(anyhow::anyhow!(
                "key {t:?} is not a JSON object: write it as '{{\"id\": 1}}'"
            )),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let columns = column_list(a.columns.as_ref());
    let asked = keys.len();
    let found = if a.prefix {
        client
            .prefix_lookup(&database, &table, keys, &columns)
            .await?
    } else {
        client.lookup(&database, &table, keys, &columns).await?
    };
    let mut sink = Sink::open(a.format.into(), None, &found.schema())?;
    sink.write(&found)?;
    sink.flush()?;
    // A key without a row is left out of the answer: said on stderr, so that a header alone
    // is not taken for a failed read, and the rows on stdout stay as they are.
    let rows = found.num_rows();
    let note = match (a.prefix, texts.as_slice()) {
        (false, [key]) if rows == 0 => Some(format!("no row has the key {key}")),
        (false, _) if rows < asked => {
            let missing = asked - rows;
            let verb = if missing == 1 { "has" } else { "have" };
            Some(format!(
                "{missing} of {} {verb} no row",
                count(asked as u64, "key")
            ))
        }
        (true, [prefix]) if rows == 0 => Some(format!("no row has the prefix {prefix}")),
        (true, _) if rows == 0 => Some("no row has any of these prefixes".to_string()),
        _ => None,
    };
    if let Some(note) = note {
        crate::eprint_line(&note);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(text: &str) -> serde_json::Value {
        serde_json::to_value(parse_predicate(text).unwrap()).unwrap()
    }

    #[test]
    fn where_predicates_parse() {
        assert_eq!(
            parsed("user_id >= 5"),
            json!({"column": "user_id", "op": ">=", "value": 5})
        );
        assert_eq!(
            parsed("event='it''s'"),
            json!({"column": "event", "op": "=", "value": "it's"})
        );
        assert_eq!(
            parsed("day < 2024-01-02"),
            json!({"column": "day", "op": "<", "value": "2024-01-02"})
        );
        assert_eq!(
            parsed("score <> 1.5"),
            json!({"column": "score", "op": "!=", "value": "1.5"})
        );
        assert_eq!(
            parsed("name IN ('A', 'b', 3)"),
            json!({"column": "name", "op": "in", "values": ["A", "b", 3]})
        );
        assert_eq!(
            parsed("name is not null"),
            json!({"column": "name", "op": "is_not_null"})
        );
        // Names with spaces or operator characters, in double quotes.
        assert_eq!(
            parsed("\"My Col\" = 'x'"),
            json!({"column": "My Col", "op": "=", "value": "x"})
        );
        assert_eq!(
            parsed("\"a<\"\"b\"\"\" is null"),
            json!({"column": "a<\"b\"", "op": "is_null"})
        );
        assert!(parse_predicate("\"open = 1").is_err());
        assert!(parse_predicate("name").is_err());
        assert!(parse_predicate("name ~ 3").is_err());
        assert!(parse_predicate("name =").is_err());
        assert!(parse_predicate("name in 3").is_err());
        let e = parse_predicate("name = \"a\"").unwrap_err();
        assert!(e.contains("strings go in single quotes ('a')"), "{e}");
    }
}
