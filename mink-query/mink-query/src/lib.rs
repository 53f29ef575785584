//! Mink's SQL engine: DataFusion over Mink tables.
//!
//! - [`catalog`]: databases as schemas of the `mink` catalog, tables as [`table::MinkTable`]
//!   providers, from the cluster's metadata (through any node).
//! - [`table`] and [`scan`]: a table's read as a DataFusion plan, one partition per bucket,
//!   with projection, filter and limit pushed down to the nodes; the cut (each bucket's high
//!   watermark) is fixed when the statement is planned.
//! - [`flight_sql`]: the Flight SQL service over a [`QueryEngine`].

pub mod catalog;
pub mod ddl;
mod dml;
mod exec;
pub mod filter;
pub mod flight_sql;
pub mod insert;
pub mod lake;
mod literals;
pub mod queries;
pub mod scan;
pub mod settings;
pub mod system;
pub mod table;

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SQLOptions;
use datafusion::prelude::{DataFrame, SessionConfig, SessionContext};
use mink_client::Client;

/// The name of Mink's catalog (the default one of every session).
pub const CATALOG: &str = "mink";

/// A client error as a DataFusion error (its message kept, the structure behind it).
pub(crate) fn client_error(e: mink_client::ClientError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Plans and runs SQL over a Mink cluster, reached through one node (`client`).
#[derive(Clone, Debug)]
pub struct QueryEngine {
    client: Client,
    lake: Option<Arc<mink_lake::Lake>>,
    queries: Arc<queries::Queries>,
    /// `SET mink.freshness`: this engine's (a fork starts from its parent's).
    freshness: Arc<std::sync::Mutex<settings::Freshness>>,
    catalog: Arc<catalog::MinkCatalog>,
}

impl QueryEngine {
    /// An engine reading everything through the nodes.
    pub fn new(client: Client) -> Self {
        Self::with_lake(client, None)
    }

    /// An engine reading lake snapshots straight from object storage through `lake` (the
    /// cluster's catalog and object store), the log tails through the nodes.
    pub fn with_lake(client: Client, lake: Option<Arc<mink_lake::Lake>>) -> Self {
        Self::build(client, lake, Arc::default(), settings::Freshness::default())
    }

    fn build(
        client: Client,
        lake: Option<Arc<mink_lake::Lake>>,
        queries: Arc<queries::Queries>,
        freshness: settings::Freshness,
    ) -> Self {
        let freshness = Arc::new(std::sync::Mutex::new(freshness));
        let catalog = Arc::new(catalog::MinkCatalog::new(
            client.clone(),
            lake.clone(),
            Arc::clone(&queries),
            Arc::clone(&freshness),
        ));
        QueryEngine {
            client,
            lake,
            queries,
            freshness,
            catalog,
        }
    }

    /// Whether scans report the log-tail rows they read of lake tables to the nodes tiering
    /// them, which tier a table sooner once queries have read enough of its tail (on by
    /// default; off to measure without the feedback).
    pub fn report_tail_scans(&self, report: bool) {
        self.catalog
            .report_tails
            .store(report, std::sync::atomic::Ordering::Relaxed);
    }

    /// The freshness this engine's statements read lake tables at.
    pub fn freshness(&self) -> settings::Freshness {
        *self.freshness.lock().expect("freshness")
    }

    /// Sets the freshness this engine's statements read lake tables at.
    pub fn set_freshness(&self, freshness: settings::Freshness) {
        *self.freshness.lock().expect("freshness") = freshness;
    }

    /// The statements running on this engine (and its forks).
    pub fn queries(&self) -> &Arc<queries::Queries> {
        &self.queries
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// An engine for one request: its reads wait for the nodes to have applied
    /// `min_applied_index` (read-your-writes for a client that wrote elsewhere), without
    /// holding other requests to it.
    pub fn fork(&self, min_applied_index: Option<u64>) -> QueryEngine {
        let client = self.client.fork();
        if let Some(index) = min_applied_index {
            client.observe_index(index);
        }
        let fork = QueryEngine::build(
            client,
            self.lake.clone(),
            Arc::clone(&self.queries),
            self.freshness(),
        );
        fork.report_tail_scans(
            self.catalog
                .report_tails
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        fork
    }

    /// A session over the catalog as the cluster's metadata has it now: unqualified names
    /// resolve in database `default`.
    pub async fn session(&self) -> Result<SessionContext> {
        self.catalog.refresh().await?;
        let mut config = SessionConfig::new()
            .with_create_default_catalog_and_schema(false)
            .with_default_catalog_and_schema(CATALOG, "default")
            .with_information_schema(true);
        // Mink's string columns are Utf8: `VARCHAR` in DDL and casts means that.
        config.options_mut().sql_parser.map_string_types_to_utf8view = false;
        // `99999999.99` is that decimal, not the nearest f64: read as a float, a literal into a
        // DECIMAL column stored another value and an equality filter on one missed its row.
        config.options_mut().sql_parser.parse_float_as_decimal = true;
        // `now()`, `TIMESTAMPTZ '...'` and casts to TIMESTAMPTZ carry their instant, as in
        // PostgreSQL with its session in UTC: without a session time zone DataFusion gives them
        // none, and one stored into a column of another zone (Europe/Berlin) moved by its offset.
        config.options_mut().execution.time_zone = Some("UTC".into());
        let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
        rules.push(Arc::new(exec::Yielding));
        // Ahead of type coercion, which would cast a float column to a literal's decimal type.
        let mut analyzer = datafusion::optimizer::Analyzer::new().rules;
        analyzer.insert(0, Arc::new(literals::FloatOperands));
        analyzer.insert(0, Arc::new(literals::TextOperands));
        analyzer.push(Arc::new(literals::NaiveAsUtc));
        let state = datafusion::execution::SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_analyzer_rules(analyzer)
            .with_physical_optimizer_rules(rules)
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_catalog(CATALOG, Arc::clone(&self.catalog) as _);
        Ok(ctx)
    }

    /// Plans one statement in a fresh session: queries, `INSERT INTO`, `UPDATE` and `DELETE`
    /// (primary-key tables), and `CREATE`/`DROP` `TABLE`/`SCHEMA` (carried out now, answering no
    /// rows). Other DDL and `SET` are refused with DataFusion's error naming what is not
    /// supported.
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        let ctx = self.session().await?;
        let dialect = ctx.state().config().options().sql_parser.dialect;
        let sql = numbered_placeholders(sql);
        // A syntax error as the parser says it (DataFusion shows its debug form, then again
        // as its source).
        let mut statement = ctx
            .state()
            .sql_to_statement(&sql, &dialect)
            .map_err(|e| match e {
                DataFusionError::SQL(p, _) => DataFusionError::Plan(format!(
                    "syntax error: {}",
                    p.to_string().trim_start_matches("sql parser error: ")
                )),
                e => e,
            })?;
        literals::scientific_as_double(&mut statement);
        dml::unalias_delete(&mut statement);
        // DDL and SET answer no rows (DataFusion's `read_empty` is one row of no columns).
        let no_rows = || {
            let plan = datafusion::logical_expr::LogicalPlanBuilder::empty(false).build()?;
            Ok(DataFrame::new(ctx.state(), plan))
        };
        if ddl::run(&ctx, &self.client, &statement).await? {
            return no_rows();
        }
        if let Some(freshness) = settings::set_statement(&statement)? {
            self.set_freshness(freshness);
            return no_rows();
        }
        let options = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(true)
            .with_allow_statements(false);
        let plan = ctx.state().statement_to_plan(statement).await?;
        options.verify_plan(&plan)?;
        insert::refuse_lossy_values(&plan)?;
        let planned = ctx.execute_logical_plan(plan).await?;
        // With parameters, the check waits until they are bound (`bound_dml`).
        if planned.logical_plan().get_parameter_types()?.is_empty() {
            bound_dml(planned)
        } else {
            Ok(planned)
        }
    }
}

impl QueryEngine {
    /// Plans appending `batches` to table `database.table` as `INSERT INTO database.table
    /// (columns) SELECT columns FROM the batches` would: the same checks, casts to the table's
    /// types and writer; columns are matched to the table's by name, and the table's others get
    /// no value. The batches are read as the write takes them (a bulk ingest is not held in
    /// memory whole); the plan runs once. Answers the rows written (`count`).
    pub async fn append_batches(
        &self,
        database: &str,
        table: &str,
        batches: datafusion::execution::SendableRecordBatchStream,
    ) -> Result<DataFrame> {
        use datafusion::catalog::{
            CatalogProvider as _, MemoryCatalogProvider, MemorySchemaProvider, SchemaProvider as _,
        };
        const INGEST: &str = "mink_ingest";
        let ctx = self.session().await?;
        let schema = batches.schema();
        let rows = datafusion::catalog::streaming::StreamingTable::try_new(
            Arc::clone(&schema),
            vec![Arc::new(OnceStream {
                schema: Arc::clone(&schema),
                batches: std::sync::Mutex::new(Some(batches)),
            })],
        )?;
        let ingest = MemorySchemaProvider::new();
        ingest.register_table("rows".into(), Arc::new(rows))?;
        let catalog = MemoryCatalogProvider::new();
        catalog.register_schema(INGEST, Arc::new(ingest))?;
        ctx.register_catalog(INGEST, Arc::new(catalog));
        let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
        let columns = schema
            .fields()
            .iter()
            .map(|f| quote(f.name()))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO {CATALOG}.{}.{} ({columns}) SELECT {columns} FROM {INGEST}.{INGEST}.rows",
            quote(database),
            quote(table)
        );
        let plan = ctx.state().create_logical_plan(&sql).await?;
        // A float column into an integer one would be truncated: refused, as INSERT's is.
        insert::refuse_lossy_values(&plan)?;
        bound_dml(ctx.execute_logical_plan(plan).await?)
    }
}

/// A stream of batches a plan reads once (a bulk ingest's rows, as they arrive).
struct OnceStream {
    schema: arrow::datatypes::SchemaRef,
    batches: std::sync::Mutex<Option<datafusion::execution::SendableRecordBatchStream>>,
}

impl std::fmt::Debug for OnceStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnceStream")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl datafusion::physical_plan::streaming::PartitionStream for OnceStream {
    fn schema(&self) -> &arrow::datatypes::SchemaRef {
        &self.schema
    }

    fn execute(
        &self,
        _: Arc<datafusion::execution::TaskContext>,
    ) -> datafusion::execution::SendableRecordBatchStream {
        let taken = self.batches.lock().expect("once stream").take();
        taken.unwrap_or_else(|| {
            Box::pin(
                datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                    Arc::clone(&self.schema),
                    futures::stream::once(async {
                        Err(DataFusionError::Execution(
                            "the ingested rows were read already".into(),
                        ))
                    }),
                ),
            )
        })
    }
}

/// `INSERT`, `DELETE` and `UPDATE` checked before they run, their parameters bound: an
/// `INSERT` that leaves a NOT NULL column without a value is refused naming it
/// ([`insert::refuse_missing_values`]). DataFusion hands a
/// table the filters of their `WHERE` as optimized: a `WHERE` that folds to false or null
/// (`id = NULL`, `1 = 0`, a parameter bound to null) leaves none, which a table cannot tell
/// from no `WHERE` at all, and a subquery becomes a join the table never sees. So a statement
/// whose rows the optimizer proves empty changes nothing (count 0) here, and one with a
/// subquery in its `WHERE` is refused.
pub fn bound_dml(df: DataFrame) -> Result<DataFrame> {
    use datafusion::common::tree_node::{TreeNode as _, TreeNodeRecursion};
    use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder, WriteOp};
    let LogicalPlan::Dml(dml) = df.logical_plan() else {
        return Ok(df);
    };
    insert::refuse_missing_values(df.logical_plan())?;
    if !matches!(dml.op, WriteOp::Delete | WriteOp::Update) {
        return Ok(df);
    }
    let optimized = df.clone().into_optimized_plan()?;
    let (mut empty, mut joined) = (false, false);
    optimized.apply(|p| {
        match p {
            LogicalPlan::EmptyRelation(e) if !e.produce_one_row => empty = true,
            // A subquery becomes a join as the plan is optimized; an alias of the table
            // (`UPDATE t AS o`) is no subquery.
            LogicalPlan::Join(_) | LogicalPlan::Subquery(_) => {
                joined = true;
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if joined {
        return Err(DataFusionError::NotImplemented(
            "UPDATE and DELETE with a subquery in WHERE are not supported: select the keys first, then name them".into(),
        ));
    }
    if !empty {
        return Ok(df);
    }
    let (state, _) = df.into_parts();
    let nothing = LogicalPlanBuilder::values(vec![vec![datafusion::prelude::lit(
        datafusion::common::ScalarValue::UInt64(Some(0)),
    )]])?
    .project(vec![datafusion::prelude::col("column1").alias("count")])?
    .build()?;
    Ok(DataFrame::new(state, nothing))
}

/// The cluster's lake (its Iceberg catalog in the metadata database `metadata`, its files in
/// the object store `objects`: the nodes' own settings), for an engine that reads lake
/// snapshots straight from object storage.
pub async fn open_lake(metadata: &str, objects: &str) -> Result<mink_lake::Lake> {
    let store =
        s3stream::store::open(objects).map_err(|e| DataFusionError::External(Box::new(e)))?;
    mink_lake::Lake::open(metadata, objects, store)
        .await
        .map_err(lake::lake_error)
}

/// `sql` with its `?` placeholders (JDBC's and ADBC's) numbered as DataFusion's `$1`, `$2`, ...;
/// a `?` inside quotes or comments (`-- ...`, `/* ... */`) is left alone.
pub fn numbered_placeholders(sql: &str) -> String {
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Code,
        Quote(char),
        LineComment,
        BlockComment,
    }
    let mut out = String::with_capacity(sql.len());
    let mut state = In::Code;
    let mut n = 0;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match (state, c) {
            (In::Code, '\'' | '"') => state = In::Quote(c),
            (In::Quote(q), c) if c == q => state = In::Code,
            (In::Code, '-') if chars.peek() == Some(&'-') => state = In::LineComment,
            (In::Code, '/') if chars.peek() == Some(&'*') => state = In::BlockComment,
            (In::LineComment, '\n') => state = In::Code,
            (In::BlockComment, '*') if chars.peek() == Some(&'/') => {
                out.push(c);
                out.extend(chars.next());
                state = In::Code;
                continue;
            }
            (In::Code, '?') => {
                n += 1;
                out.push_str(&format!("${n}"));
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn question_marks_become_numbered_placeholders() {
        assert_eq!(
            super::numbered_placeholders("SELECT '?' AS q, a FROM t WHERE a = ? AND b IN (?, ?)"),
            "SELECT '?' AS q, a FROM t WHERE a = $1 AND b IN ($2, $3)"
        );
        assert_eq!(
            super::numbered_placeholders("-- don't ask?\nSELECT ? /* why? */ + ?"),
            "-- don't ask?\nSELECT $1 /* why? */ + $2"
        );
    }
}
