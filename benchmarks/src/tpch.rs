//! TPC-H through Mink beside DataFusion over plain Parquet, in the same run.
//!
//! The eight tables are generated with the `tpchgen` crate (the reference generator's rows),
//! then:
//! - written as ZSTD Parquet files (what the lake writes too), one per generator part, which a
//!   plain DataFusion session reads: the baseline;
//! - loaded into lake-enabled Mink log tables through a node (Flight DoPut, several writers):
//!   the first `--lake-fraction` of every table, a tiering round, then the rest, so every
//!   query reads a lake snapshot and a log tail.
//!
//! The 22 queries (`benchmarks/tpch/qNN.sql`, the specification's validation parameters) run
//! through `mink-query`'s Flight SQL service and through the baseline session, alternating, after
//! one warm-up pass; each engine's answer must equal the other's. Reported: the median time of
//! each per query, their ratio, the geometric mean of the ratios (goal ≤ 1.2) and the load rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use arrow::array::{
    ArrayRef, Date32Builder, Decimal128Builder, Int32Builder, Int64Builder, RecordBatch,
    StringBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::sql::client::FlightSqlServiceClient;
use futures::{FutureExt as _, TryStreamExt as _};
use serde::Serialize;
use tpchgen::dates::TPCHDate;
use tpchgen::decimal::TPCHDecimal;
use tpchgen::generators as g;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// TPC-H scale factor (1 = 6 million lineitem rows).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Timed passes over the queries after the warm-up (the median is reported).
    #[arg(long, default_value_t = 3)]
    iterations: usize,
    /// The share of every table's rows tiered into the lake before the rest is written.
    #[arg(long, default_value_t = 0.9)]
    lake_fraction: f64,
    /// Buckets of every table but nation and region.
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// Concurrent writers loading the tables.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Queries to run (numbers, comma separated; all 22 by default).
    #[arg(long, value_delimiter = ',')]
    queries: Vec<usize>,
    #[arg(long)]
    json: bool,
}

const QUERIES: [&str; 22] = [
    include_str!("../tpch/q01.sql"),
    include_str!("../tpch/q02.sql"),
    include_str!("../tpch/q03.sql"),
    include_str!("../tpch/q04.sql"),
    include_str!("../tpch/q05.sql"),
    include_str!("../tpch/q06.sql"),
    include_str!("../tpch/q07.sql"),
    include_str!("../tpch/q08.sql"),
    include_str!("../tpch/q09.sql"),
    include_str!("../tpch/q10.sql"),
    include_str!("../tpch/q11.sql"),
    include_str!("../tpch/q12.sql"),
    include_str!("../tpch/q13.sql"),
    include_str!("../tpch/q14.sql"),
    include_str!("../tpch/q15.sql"),
    include_str!("../tpch/q16.sql"),
    include_str!("../tpch/q17.sql"),
    include_str!("../tpch/q18.sql"),
    include_str!("../tpch/q19.sql"),
    include_str!("../tpch/q20.sql"),
    include_str!("../tpch/q21.sql"),
    include_str!("../tpch/q22.sql"),
];

const BATCH_ROWS: usize = 32_768;

/// One value of a generated row, borrowed from the generator's.
enum V<'a> {
    I64(i64),
    I32(i32),
    Dec(TPCHDecimal),
    Date(TPCHDate),
    Str(&'a dyn std::fmt::Display),
}

enum Builder {
    I64(Int64Builder),
    I32(Int32Builder),
    Dec(Decimal128Builder),
    Date(Date32Builder),
    Str(StringBuilder),
}

impl Builder {
    fn new(t: &DataType) -> Builder {
        match t {
            DataType::Int64 => Builder::I64(Int64Builder::with_capacity(BATCH_ROWS)),
            DataType::Int32 => Builder::I32(Int32Builder::with_capacity(BATCH_ROWS)),
            DataType::Decimal128(p, s) => Builder::Dec(
                Decimal128Builder::with_capacity(BATCH_ROWS)
                    .with_precision_and_scale(*p, *s)
                    .expect("TPC-H decimal"),
            ),
            DataType::Date32 => Builder::Date(Date32Builder::with_capacity(BATCH_ROWS)),
            DataType::Utf8 => Builder::Str(StringBuilder::new()),
            other => unreachable!("no TPC-H column is {other}"),
        }
    }

    fn push(&mut self, v: V<'_>) {
        use std::fmt::Write as _;
        match (self, v) {
            (Builder::I64(b), V::I64(v)) => b.append_value(v),
            (Builder::I32(b), V::I32(v)) => b.append_value(v),
            // TPC-H decimals are hundredths, as Decimal128(15, 2) stores them.
            (Builder::Dec(b), V::Dec(v)) => b.append_value(i128::from(v.into_inner())),
            (Builder::Date(b), V::Date(v)) => b.append_value(v.to_unix_epoch()),
            (Builder::Str(b), V::Str(v)) => {
                write!(b, "{v}").expect("writing to a string builder");
                b.append_value("");
            }
            _ => unreachable!("a row's values follow its schema"),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Builder::I64(b) => Arc::new(b.finish()),
            Builder::I32(b) => Arc::new(b.finish()),
            Builder::Dec(b) => Arc::new(b.finish()),
            Builder::Date(b) => Arc::new(b.finish()),
            Builder::Str(b) => Arc::new(b.finish()),
        }
    }
}

/// The rows `rows` yields, as batches of `schema` (each row mapped to its values by `values`).
fn batches<R>(
    schema: &SchemaRef,
    rows: impl Iterator<Item = R>,
    values: impl Fn(&R, &mut dyn FnMut(V<'_>)),
) -> anyhow::Result<Vec<RecordBatch>> {
    let mut builders: Vec<Builder> = schema
        .fields()
        .iter()
        .map(|f| Builder::new(f.data_type()))
        .collect();
    let mut out = Vec::new();
    let mut n = 0;
    let flush = |builders: &mut Vec<Builder>| {
        let columns = builders.iter_mut().map(Builder::finish).collect();
        RecordBatch::try_new(Arc::clone(schema), columns)
    };
    for row in rows {
        let mut column = 0;
        values(&row, &mut |v| {
            builders[column].push(v);
            column += 1;
        });
        anyhow::ensure!(column == builders.len(), "a row of {column} values");
        n += 1;
        if n == BATCH_ROWS {
            out.push(flush(&mut builders)?);
            n = 0;
        }
    }
    if n > 0 {
        out.push(flush(&mut builders)?);
    }
    Ok(out)
}

fn field(name: &str, t: &DataType) -> Field {
    Field::new(name, t.clone(), false)
}

/// The eight tables' names and schemas.
fn schemas() -> Vec<(&'static str, SchemaRef)> {
    let (i64_, i32_, date, s) = (
        DataType::Int64,
        DataType::Int32,
        DataType::Date32,
        DataType::Utf8,
    );
    let dec = DataType::Decimal128(15, 2);
    let table = |name, columns: &[(&str, &DataType)]| {
        let fields: Vec<Field> = columns.iter().map(|(c, t)| field(c, t)).collect();
        (name, Arc::new(Schema::new(fields)))
    };
    vec![
        table(
            "nation",
            &[
                ("n_nationkey", &i64_),
                ("n_name", &s),
                ("n_regionkey", &i64_),
                ("n_comment", &s),
            ],
        ),
        table(
            "region",
            &[("r_regionkey", &i64_), ("r_name", &s), ("r_comment", &s)],
        ),
        table(
            "part",
            &[
                ("p_partkey", &i64_),
                ("p_name", &s),
                ("p_mfgr", &s),
                ("p_brand", &s),
                ("p_type", &s),
                ("p_size", &i32_),
                ("p_container", &s),
                ("p_retailprice", &dec),
                ("p_comment", &s),
            ],
        ),
        table(
            "supplier",
            &[
                ("s_suppkey", &i64_),
                ("s_name", &s),
                ("s_address", &s),
                ("s_nationkey", &i64_),
                ("s_phone", &s),
                ("s_acctbal", &dec),
                ("s_comment", &s),
            ],
        ),
        table(
            "partsupp",
            &[
                ("ps_partkey", &i64_),
                ("ps_suppkey", &i64_),
                ("ps_availqty", &i32_),
                ("ps_supplycost", &dec),
                ("ps_comment", &s),
            ],
        ),
        table(
            "customer",
            &[
                ("c_custkey", &i64_),
                ("c_name", &s),
                ("c_address", &s),
                ("c_nationkey", &i64_),
                ("c_phone", &s),
                ("c_acctbal", &dec),
                ("c_mktsegment", &s),
                ("c_comment", &s),
            ],
        ),
        table(
            "orders",
            &[
                ("o_orderkey", &i64_),
                ("o_custkey", &i64_),
                ("o_orderstatus", &s),
                ("o_totalprice", &dec),
                ("o_orderdate", &date),
                ("o_orderpriority", &s),
                ("o_clerk", &s),
                ("o_shippriority", &i32_),
                ("o_comment", &s),
            ],
        ),
        table(
            "lineitem",
            &[
                ("l_orderkey", &i64_),
                ("l_partkey", &i64_),
                ("l_suppkey", &i64_),
                ("l_linenumber", &i32_),
                ("l_quantity", &dec),
                ("l_extendedprice", &dec),
                ("l_discount", &dec),
                ("l_tax", &dec),
                ("l_returnflag", &s),
                ("l_linestatus", &s),
                ("l_shipdate", &date),
                ("l_commitdate", &date),
                ("l_receiptdate", &date),
                ("l_shipinstruct", &s),
                ("l_shipmode", &s),
                ("l_comment", &s),
            ],
        ),
    ]
}

/// Part `part` of `parts` of table `name` at scale factor `sf`, as batches of `schema`.
fn generate(
    name: &str,
    schema: &SchemaRef,
    sf: f64,
    part: i32,
    parts: i32,
) -> anyhow::Result<Vec<RecordBatch>> {
    use V::*;
    match name {
        "nation" => batches(
            schema,
            g::NationGenerator::new(sf, part, parts).iter(),
            |r, v| {
                v(I64(r.n_nationkey));
                v(Str(&r.n_name));
                v(I64(r.n_regionkey));
                v(Str(&r.n_comment));
            },
        ),
        "region" => batches(
            schema,
            g::RegionGenerator::new(sf, part, parts).iter(),
            |r, v| {
                v(I64(r.r_regionkey));
                v(Str(&r.r_name));
                v(Str(&r.r_comment));
            },
        ),
        "part" => batches(
            schema,
            g::PartGenerator::new(sf, part, parts).iter(),
            |r, v| {
                v(I64(r.p_partkey));
                v(Str(&r.p_name));
                v(Str(&r.p_mfgr));
                v(Str(&r.p_brand));
                v(Str(&r.p_type));
                v(I32(r.p_size));
                v(Str(&r.p_container));
                v(Dec(r.p_retailprice));
                v(Str(&r.p_comment));
            },
        ),
        "supplier" => batches(
            schema,
            g::SupplierGenerator::new(sf, part, parts).iter(),
            |r, v| {
                v(I64(r.s_suppkey));
                v(Str(&r.s_name));
                v(Str(&r.s_address));
                v(I64(r.s_nationkey));
                v(Str(&r.s_phone));
                v(Dec(r.s_acctbal));
                v(Str(&r.s_comment));
            },
        ),
        "partsupp" => batches(
            schema,
            g::PartSuppGenerator::new(sf, part, parts).iter(),
            |r, v| {
                v(I64(r.ps_partkey));
                v(I64(r.ps_suppkey));
                v(I32(r.ps_availqty));
                v(Dec(r.ps_supplycost));
                v(Str(&r.ps_comment));
            },
        ),
        "customer" => batches(
            schema,
            g::CustomerGenerator::new(sf, part, parts).iter(),
            |r, v| {
                v(I64(r.c_custkey));
                v(Str(&r.c_name));
                v(Str(&r.c_address));
                v(I64(r.c_nationkey));
                v(Str(&r.c_phone));
                v(Dec(r.c_acctbal));
                v(Str(&r.c_mktsegment));
                v(Str(&r.c_comment));
            },
        ),
        "orders" => batches(
            schema,
            g::OrderGenerator::new(sf, part, parts).iter(),
            |r, v| {
                v(I64(r.o_orderkey));
                v(I64(r.o_custkey));
                v(Str(&r.o_orderstatus));
                v(Dec(r.o_totalprice));
                v(Date(r.o_orderdate));
                v(Str(&r.o_orderpriority));
                v(Str(&r.o_clerk));
                v(I32(r.o_shippriority));
                v(Str(&r.o_comment));
            },
        ),
        "lineitem" => batches(
            schema,
            g::LineItemGenerator::new(sf, part, parts).iter(),
            |r, v| {
                v(I64(r.l_orderkey));
                v(I64(r.l_partkey));
                v(I64(r.l_suppkey));
                v(I32(r.l_linenumber));
                // A count of items; the specification's type is a decimal.
                v(Dec(TPCHDecimal(r.l_quantity * 100)));
                v(Dec(r.l_extendedprice));
                v(Dec(r.l_discount));
                v(Dec(r.l_tax));
                v(Str(&r.l_returnflag));
                v(Str(&r.l_linestatus));
                v(Date(r.l_shipdate));
                v(Date(r.l_commitdate));
                v(Date(r.l_receiptdate));
                v(Str(&r.l_shipinstruct));
                v(Str(&r.l_shipmode));
                v(Str(&r.l_comment));
            },
        ),
        other => anyhow::bail!("no TPC-H table {other}"),
    }
}

struct Table {
    name: &'static str,
    schema: SchemaRef,
    /// Generator parts, in order: each part's batches.
    parts: Vec<Vec<RecordBatch>>,
}

impl Table {
    fn rows(&self) -> usize {
        self.parts.iter().flatten().map(RecordBatch::num_rows).sum()
    }

    fn batches(&self) -> impl Iterator<Item = &RecordBatch> {
        self.parts.iter().flatten()
    }

    /// Nation and region are fixed lists: one generator part, one bucket.
    fn small(&self) -> bool {
        matches!(self.name, "nation" | "region")
    }
}

/// Every table, generated on the blocking pool (parts in parallel).
async fn generate_all(sf: f64) -> anyhow::Result<Vec<Table>> {
    let parts = 4;
    let mut jobs = Vec::new();
    for (name, schema) in schemas() {
        let n = if matches!(name, "nation" | "region") {
            1
        } else {
            parts
        };
        for part in 1..=n {
            let schema = Arc::clone(&schema);
            jobs.push((
                name,
                tokio::task::spawn_blocking(move || generate(name, &schema, sf, part, n)),
            ));
        }
    }
    let mut tables: Vec<Table> = schemas()
        .into_iter()
        .map(|(name, schema)| Table {
            name,
            schema,
            parts: Vec::new(),
        })
        .collect();
    for (name, job) in jobs {
        let batches = job.await??;
        let table = tables
            .iter_mut()
            .find(|t| t.name == name)
            .expect("a generated table");
        table.parts.push(batches);
    }
    Ok(tables)
}

/// Writes every table as ZSTD Parquet under `dir/<table>/part-N.parquet`.
fn write_parquet(dir: &std::path::Path, tables: &[Table]) -> anyhow::Result<u64> {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;
    let mut bytes = 0;
    for t in tables {
        let table_dir = dir.join(t.name);
        std::fs::create_dir_all(&table_dir)?;
        for (i, part) in t.parts.iter().enumerate() {
            let path = table_dir.join(format!("part-{i}.parquet"));
            let file = std::fs::File::create(&path)?;
            let props = WriterProperties::builder()
                .set_compression(Compression::ZSTD(Default::default()))
                .build();
            let mut w = ArrowWriter::try_new(file, Arc::clone(&t.schema), Some(props))?;
            for b in part {
                w.write(b)?;
            }
            w.close()?;
            bytes += std::fs::metadata(&path)?.len();
        }
    }
    Ok(bytes)
}

/// A node and a Flight SQL service over it, in this process.
struct Mink {
    node: mink_node::Node,
    client: mink_client::Client,
    sql: FlightSqlServiceClient<tonic::transport::Channel>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Mink {
    async fn start(dir: &std::path::Path) -> anyhow::Result<Mink> {
        use mink_node::{Node, NodeConfig};
        std::fs::create_dir_all(dir)?;
        let objects = dir.join("objects");
        let objects = objects.to_str().context("utf-8 temp dir")?.to_string();
        let metadata = format!("sqlite://{}", dir.join("meta.db").display());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let mut c = NodeConfig::new(1, &metadata, &objects);
        c.advertised_address = address.clone();
        c.kv_dir = dir.join("kv");
        // Rounds come from this benchmark only, not from queries reading the tail.
        c.tail_rows_for_a_round = 0;
        let node = Node::start(c).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let flight = tokio::spawn(
            mink_flight::serve(
                node.clone(),
                mink_flight::ServerConfig::default(),
                listener,
                async {
                    let _ = stopped.await;
                },
            )
            .map(|_| ()),
        );
        let client = mink_client::Client::connect(&address).await?;
        let lake = mink_query::open_lake(&metadata, &objects).await?;
        let engine = mink_query::QueryEngine::with_lake(client.clone(), Some(Arc::new(lake)));
        let sql_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let sql_address = sql_listener.local_addr()?;
        let (sql_stop, sql_stopped) = tokio::sync::oneshot::channel::<()>();
        let sql_server = tokio::spawn(
            mink_query::flight_sql::MinkFlightSql::new(engine)
                .serve(sql_listener, async {
                    let _ = sql_stopped.await;
                })
                .map(|_| ()),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{sql_address}"))?
            .connect()
            .await?;
        Ok(Mink {
            node,
            client,
            sql: FlightSqlServiceClient::new(channel),
            stops: vec![stop, sql_stop],
            tasks: vec![flight, sql_server],
        })
    }

    async fn stop(mut self) {
        for s in self.stops.drain(..) {
            let _ = s.send(());
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        self.node.shutdown().await;
    }

    /// Runs `sql` through Flight SQL: every endpoint's batches.
    async fn query(&self, sql: &str) -> anyhow::Result<Vec<RecordBatch>> {
        let mut client = self.sql.clone();
        let info = client.execute(sql.to_string(), None).await?;
        let mut out = Vec::new();
        for endpoint in info.endpoint {
            let ticket = endpoint.ticket.context("an endpoint without a ticket")?;
            let batches: Vec<RecordBatch> = client.do_get(ticket).await?.try_collect().await?;
            out.extend(batches);
        }
        Ok(out)
    }
}

/// Writes `batches` of `database.table` with `writers` concurrent writers: (rows, bytes).
async fn load(
    client: &mink_client::Client,
    table: &str,
    batches: Vec<RecordBatch>,
    writers: usize,
) -> anyhow::Result<(u64, u64)> {
    let queue = Arc::new(std::sync::Mutex::new(batches.into_iter()));
    let tasks = (0..writers).map(|_| {
        let queue = Arc::clone(&queue);
        let mut w = client.writer("default", table);
        async move {
            let (mut rows, mut bytes) = (0u64, 0u64);
            loop {
                let next = queue.lock().expect("batch queue").next();
                let Some(batch) = next else { break };
                w.write(&batch)
                    .await
                    .with_context(|| format!("writing {table}"))?;
                rows += batch.num_rows() as u64;
                bytes += batch.get_array_memory_size() as u64;
            }
            Ok::<(u64, u64), anyhow::Error>((rows, bytes))
        }
    });
    let done = futures::future::try_join_all(tasks).await?;
    Ok(done
        .into_iter()
        .fold((0, 0), |(r, b), (rr, bb)| (r + rr, b + bb)))
}

/// Tiers `table` until every bucket's log is in the lake (a round reads a bounded amount).
async fn tier_all(mink: &Mink, table: &str) -> anyhow::Result<()> {
    let untiered = || async {
        let info = mink.client.describe_table("default", table).await?;
        Ok::<u64, anyhow::Error>(
            info.buckets
                .iter()
                .map(|b| b.end_offset - b.tiered_offset.unwrap_or(0))
                .sum(),
        )
    };
    let mut left = untiered().await?;
    while left > 0 {
        mink.node
            .tier_now("default", table)
            .await
            .with_context(|| format!("tiering {table}"))?;
        let now = untiered().await?;
        anyhow::ensure!(
            now < left,
            "a round of {table} left {now} rows untiered, as before"
        );
        left = now;
    }
    Ok(())
}

/// Rows as sorted text lines, to compare two engines' answers regardless of the order of ties
/// and of string encodings (Utf8 or Utf8View).
fn answer(batches: &[RecordBatch]) -> anyhow::Result<Vec<String>> {
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    let options = FormatOptions::default().with_null("NULL");
    let mut lines = Vec::new();
    for b in batches {
        let formatters = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        for row in 0..b.num_rows() {
            let cells: Vec<String> = formatters
                .iter()
                .map(|f| f.value(row).to_string())
                .collect();
            lines.push(cells.join("|"));
        }
    }
    lines.sort();
    Ok(lines)
}

#[derive(Debug, Serialize)]
struct QueryResult {
    query: usize,
    rows: usize,
    datafusion_ms: f64,
    mink_ms: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    scale: f64,
    rows: u64,
    lake_rows: u64,
    tail_rows: u64,
    load_rows_per_s: f64,
    load_mb_per_s: f64,
    tiering_s: f64,
    parquet_mb: f64,
    queries: Vec<QueryResult>,
    geomean_ratio: f64,
    goal: f64,
}

/// How many of a table's `rows` go to the lake (`fraction` is checked to be in [0, 1]).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn lake_cut(rows: usize, fraction: f64) -> usize {
    (rows as f64 * fraction).round() as usize
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.lake_fraction),
        "--lake-fraction is a share between 0 and 1"
    );
    anyhow::ensure!(args.iterations > 0, "--iterations must be at least 1");
    let queries: Vec<usize> = if args.queries.is_empty() {
        (1..=22).collect()
    } else {
        args.queries.clone()
    };
    if let Some(q) = queries.iter().find(|q| !(1..=22).contains(*q)) {
        anyhow::bail!("no TPC-H query {q}: they are 1 to 22");
    }
    let dir = tempfile::tempdir()?;

    let started = Instant::now();
    let tables = generate_all(args.scale).await?;
    let rows: u64 = tables.iter().map(|t| t.rows() as u64).sum();
    eprintln!(
        "generated {rows} rows at scale {} in {:.1} s",
        args.scale,
        started.elapsed().as_secs_f64()
    );
    let parquet_dir = dir.path().join("parquet");
    let parquet_bytes = {
        let dir = parquet_dir.clone();
        let tables = &tables;
        tokio::task::block_in_place(|| write_parquet(&dir, tables))?
    };

    // Mink: the tables, the lake part, a round, the tail.
    let mink = Mink::start(&dir.path().join("mink")).await?;
    mink.node.create_database("default", false).await?;
    for t in &tables {
        let buckets = if t.small() { 1 } else { args.buckets };
        mink.node
            .create_table(mink_node::TableSpec {
                database: "default".into(),
                name: t.name.into(),
                schema: t.schema.as_ref().clone(),
                primary_key: vec![],
                options: crate::options(&[
                    ("bucket.num", buckets.to_string()),
                    ("table.datalake.enabled", "true".to_string()),
                    ("table.datalake.freshness", "1h".to_string()),
                ]),
                partition_keys: vec![],
                comment: String::new(),
                if_not_exists: false,
            })
            .await?;
    }
    let (mut lake_rows, mut tail_rows, mut loaded_bytes) = (0u64, 0u64, 0u64);
    let mut load_time = Duration::ZERO;
    let mut lake_parts = Vec::new();
    let mut tail_parts = Vec::new();
    for t in &tables {
        let cut = lake_cut(t.rows(), args.lake_fraction);
        let (mut lake, mut tail) = (Vec::new(), Vec::new());
        let mut seen = 0;
        for b in t.batches() {
            let n = b.num_rows();
            if seen >= cut {
                tail.push(b.clone());
            } else if seen + n <= cut {
                lake.push(b.clone());
            } else {
                lake.push(b.slice(0, cut - seen));
                tail.push(b.slice(cut - seen, seen + n - cut));
            }
            seen += n;
        }
        lake_parts.push((t.name, lake));
        tail_parts.push((t.name, tail));
    }
    for (name, batches) in lake_parts {
        let started = Instant::now();
        let (rows, bytes) = load(&mink.client, name, batches, args.writers).await?;
        load_time += started.elapsed();
        lake_rows += rows;
        loaded_bytes += bytes;
    }
    let started = Instant::now();
    for t in &tables {
        tier_all(&mink, t.name).await?;
    }
    let tiering = started.elapsed();
    for (name, batches) in tail_parts {
        let started = Instant::now();
        let (rows, bytes) = load(&mink.client, name, batches, args.writers).await?;
        load_time += started.elapsed();
        tail_rows += rows;
        loaded_bytes += bytes;
    }
    for t in &tables {
        let info = mink.client.describe_table("default", t.name).await?;
        let tiered: u64 = info
            .buckets
            .iter()
            .map(|b| b.tiered_offset.unwrap_or(0))
            .sum();
        let end: u64 = info.buckets.iter().map(|b| b.end_offset).sum();
        anyhow::ensure!(
            end == t.rows() as u64,
            "{}: the log holds {end} rows, {} were written",
            t.name,
            t.rows()
        );
        let cut = lake_cut(t.rows(), args.lake_fraction) as u64;
        anyhow::ensure!(
            tiered == cut,
            "{}: {tiered} rows tiered, {cut} written before the round",
            t.name
        );
    }
    eprintln!(
        "loaded {} rows in {:.1} s (tiering {:.1} s)",
        lake_rows + tail_rows,
        load_time.as_secs_f64(),
        tiering.as_secs_f64()
    );

    // The baseline: DataFusion over the Parquet files.
    let ctx = datafusion::prelude::SessionContext::new();
    for t in &tables {
        let path = parquet_dir.join(t.name);
        ctx.register_parquet(
            t.name,
            path.to_str().context("utf-8 temp dir")?,
            datafusion::prelude::ParquetReadOptions::default(),
        )
        .await?;
    }

    let mut results = Vec::new();
    for &q in &queries {
        let sql = QUERIES[q - 1];
        let (mut df_times, mut mink_times) = (Vec::new(), Vec::new());
        let mut answer_rows = 0;
        for pass in 0..=args.iterations {
            let started = Instant::now();
            let expected = ctx.sql(sql).await?.collect().await?;
            let df_time = started.elapsed();
            let started = Instant::now();
            let got = mink
                .query(sql)
                .await
                .with_context(|| format!("Q{q} through Mink"))?;
            let mink_time = started.elapsed();
            if pass == 0 {
                // The warm-up pass checks the answers.
                let (expected, got) = (answer(&expected)?, answer(&got)?);
                if expected != got {
                    let first = expected.iter().zip(&got).find(|(e, g)| e != g);
                    anyhow::bail!(
                        "Q{q}: Mink answered {} rows, DataFusion {}; first difference: {first:?}",
                        got.len(),
                        expected.len()
                    );
                }
                answer_rows = got.len();
                continue;
            }
            df_times.push(df_time.as_secs_f64() * 1000.0);
            mink_times.push(mink_time.as_secs_f64() * 1000.0);
        }
        let (df, mk) = (median(df_times), median(mink_times));
        eprintln!("Q{q}: DataFusion {df:.0} ms, Mink {mk:.0} ms");
        results.push(QueryResult {
            query: q,
            rows: answer_rows,
            datafusion_ms: df,
            mink_ms: mk,
            ratio: mk / df,
        });
    }
    mink.stop().await;

    let geomean = (results.iter().map(|r| r.ratio.ln()).sum::<f64>() / results.len() as f64).exp();
    let load_s = load_time.as_secs_f64();
    let report = Report {
        scale: args.scale,
        rows,
        lake_rows,
        tail_rows,
        load_rows_per_s: rows as f64 / load_s,
        load_mb_per_s: loaded_bytes as f64 / 1e6 / load_s,
        tiering_s: tiering.as_secs_f64(),
        parquet_mb: parquet_bytes as f64 / 1e6,
        queries: results,
        geomean_ratio: geomean,
        goal: 1.2,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "TPC-H scale {}: {} rows ({} in the lake, {} in the log tail); median of {} passes",
        report.scale, report.rows, report.lake_rows, report.tail_rows, args.iterations
    );
    println!(
        "load through Flight DoPut ({} writers): {:.0} rows/s, {:.1} MB/s of Arrow data; tiering round {:.1} s; Parquet baseline {:.0} MB",
        args.writers,
        report.load_rows_per_s,
        report.load_mb_per_s,
        report.tiering_s,
        report.parquet_mb
    );
    println!("| query | rows | DataFusion over Parquet ms | Mink over Flight SQL ms | ratio |");
    println!("|---|---|---|---|---|");
    for r in &report.queries {
        println!(
            "| Q{} | {} | {:.1} | {:.1} | {:.2} |",
            r.query, r.rows, r.datafusion_ms, r.mink_ms, r.ratio
        );
    }
    println!(
        "geometric mean of the ratios: {:.2} (goal ≤ {:.1})",
        report.geomean_ratio, report.goal
    );
    Ok(())
}
