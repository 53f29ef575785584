//! A Mink table as a DataFusion table provider: its rows as the nodes read them (a log
//! table's union read of lake and log; a primary-key table's current rows), one partition per
//! bucket, with the columns, filters and limit of the query pushed down.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Constraint, Constraints};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use mink_client::{Client, Filter, TableDescription, Ticket};

use crate::filter::to_predicates;
use crate::insert::MinkSink;
use crate::scan::{MinkLookupExec, MinkScanExec};

/// Whether the table `d` describes is tiered into the lake (its options, as the nodes read them).
pub(crate) fn tiered(d: &TableDescription) -> bool {
    mink_log::options::TableOptions::parse(&d.options).is_ok_and(|o| o.lake_freshness.is_some())
}

/// Refuses `statement` (`UPDATE`, `DELETE`) on a primary-key table that would not store what it
/// writes back: with a merge engine other than the default, an update is aggregated into the
/// row or ignored (Apache Fluss refuses both statements there too), and deletes follow
/// `table.delete.behavior`, which drops or refuses them unless it is `allow`.
fn merged_as_written(d: &TableDescription, statement: &str) -> Result<()> {
    let option = |key: &str| {
        d.options
            .get(key)
            .map(|v| v.trim().to_ascii_lowercase())
            .filter(|v| !v.is_empty())
    };
    let name = format!("{}.{}", d.database, d.table);
    let engine = option("table.merge-engine");
    let deletes = option("table.delete.behavior")
        .unwrap_or_else(|| if engine.is_some() { "ignore" } else { "allow" }.to_string());
    let update = statement == "UPDATE";
    let why = match engine.as_deref() {
        None if update || deletes == "allow" => return Ok(()),
        None if deletes == "disable" => format!(
            "{name} refuses deletes (table.delete.behavior = 'disable'): DELETE applies to a \
             table created with table.delete.behavior = 'allow'"
        ),
        None => format!(
            "{name} drops deletes (table.delete.behavior = '{deletes}'): a DELETE would change \
             nothing; DELETE applies to a table created with table.delete.behavior = 'allow'"
        ),
        Some("aggregation") if update => format!(
            "{name} merges rows with the aggregation engine (table.merge-engine = 'aggregation'): \
             an UPDATE would be aggregated into the row by each column's fields.<column>.agg \
             function (summed, for sum), not set"
        ),
        Some("first_row") if update => format!(
            "{name} keeps the first row of each key (table.merge-engine = 'first_row'): an UPDATE \
             would be ignored"
        ),
        Some("versioned") if update => format!(
            "{name} keeps the row of the greatest version of each key (table.merge-engine = \
             'versioned'): an UPDATE would be ignored unless it raised the version"
        ),
        Some(engine) => format!(
            "{name} merges rows with the {engine} engine (table.merge-engine = '{engine}'), whose \
             deletes follow table.delete.behavior = '{deletes}'{}",
            match deletes.as_str() {
                "allow" => "",
                "disable" => ": a DELETE would be refused",
                _ => ": a DELETE would be ignored",
            }
        ),
    };
    Err(DataFusionError::Plan(match engine {
        None => why,
        Some(_) if update => format!(
            "{why}. UPDATE and DELETE are refused on a table with a merge engine, as in Apache \
             Fluss: write rows with INSERT INTO (the engine merges them) instead"
        ),
        Some(_) => format!(
            "{why}. UPDATE and DELETE are refused on a table with a merge engine, as in Apache \
             Fluss"
        ),
    }))
}

/// Keys a point lookup takes at most; more are read by scanning.
const MAX_LOOKUP_KEYS: usize = 1024;

/// The keys `filter` pins the whole primary key `key` to (an equality or an `in` list on each
/// key column), as lookup keys; `None` if it does not, or pins too many.
fn point_keys(
    key: &[String],
    filter: &Filter,
) -> Option<Vec<serde_json::Map<String, serde_json::Value>>> {
    if key.is_empty() {
        return None;
    }
    let mut keys = vec![serde_json::Map::new()];
    for column in key {
        let values = filter.0.iter().find_map(|p| match &p.op {
            _ if &p.column != column => None,
            mink_client::Op::Eq { value } => Some(vec![value.clone()]),
            mink_client::Op::In { values } => Some(values.clone()),
            _ => None,
        })?;
        if keys.len() * values.len() > MAX_LOOKUP_KEYS {
            return None;
        }
        keys = keys
            .iter()
            .flat_map(|k| {
                values.iter().filter(|v| !v.is_null()).map(move |v| {
                    let mut k = k.clone();
                    k.insert(column.clone(), v.clone());
                    k
                })
            })
            .collect();
    }
    // A key asked for twice (`id IN (1, 1)`) is one row.
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(serde_json::Value::Object(k.clone()).to_string()));
    Some(keys)
}

/// Which rows of a table a provider reads: the table's, or one of its virtual tables
/// (named as in Fluss: `t$changelog`, `t$log`, `t$lake`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableView {
    /// A log table's rows (its union read), a primary-key table's current rows.
    Rows,
    /// A primary-key table's changes: `_change_type`, `_log_offset`, `_commit_timestamp`,
    /// then the columns.
    Changelog,
    /// A log table's rows in its log only (no lake history).
    Log,
    /// A lake table's rows in its lake snapshot only.
    Lake,
}

impl TableView {
    /// The view a suffix names (`changelog`, `log`, `lake`).
    pub fn from_suffix(suffix: &str) -> Option<TableView> {
        match suffix {
            "changelog" => Some(TableView::Changelog),
            "log" => Some(TableView::Log),
            "lake" => Some(TableView::Lake),
            _ => None,
        }
    }
}

/// A table as described when the statement was planned: that description fixes the cut
/// (each bucket's high watermark) every scan of the statement reads.
#[derive(Debug)]
pub struct MinkTable {
    client: Client,
    /// Where lake snapshots are read straight from object storage (through the nodes when
    /// `None`).
    lake: Option<Arc<mink_lake::Lake>>,
    /// How fresh a lake table's rows must be (`SET mink.freshness`).
    freshness: crate::settings::Freshness,
    /// Report the log-tail rows scans read to the tiering node.
    report_tails: bool,
    description: TableDescription,
    view: TableView,
    schema: SchemaRef,
    constraints: Option<Constraints>,
}

impl MinkTable {
    pub fn new(client: Client, description: TableDescription) -> Result<Self> {
        Self::view(client, description, TableView::Rows)
    }

    /// `view` of the table `description` describes; a view the table does not have is
    /// refused, saying which tables have it.
    pub fn view(client: Client, description: TableDescription, view: TableView) -> Result<Self> {
        let name = format!("{}.{}", description.database, description.table);
        let primary = !description.primary_key.is_empty();
        let lake = tiered(&description);
        let refuse = |why: &str| Err(DataFusionError::Plan(format!("{name}: {why}")));
        match view {
            TableView::Changelog if !primary => {
                return refuse(
                    "$changelog is a primary-key table's changes; a log table's rows are its log",
                );
            }
            TableView::Log if primary => {
                return refuse(
                    "$log reads a log table; a primary-key table's changes are its $changelog",
                );
            }
            TableView::Lake if !lake => {
                return refuse("$lake reads a table tiered into the lake (table.datalake.enabled)");
            }
            _ => {}
        }
        let table_schema = description
            .arrow_schema()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let schema = match view {
            TableView::Changelog => mink_log::changelog::view_schema(&table_schema),
            // A log table's log and lake carry each row's bucket, offset and batch time, as
            // the Iceberg table stores them.
            TableView::Log | TableView::Lake if !primary => {
                let mut fields: Vec<_> = table_schema.fields().to_vec();
                fields.extend(
                    [
                        mink_log::filter::BUCKET,
                        mink_log::filter::OFFSET,
                        mink_log::filter::TIMESTAMP,
                    ]
                    .into_iter()
                    .filter_map(mink_log::filter::system_field)
                    .map(Arc::new),
                );
                Arc::new(arrow::datatypes::Schema::new(fields))
            }
            _ => Arc::new(table_schema),
        };
        let key: Vec<usize> = description
            .primary_key
            .iter()
            .filter_map(|k| schema.index_of(k).ok())
            .collect();
        // A changelog holds each key many times.
        let constraints = (!key.is_empty() && view != TableView::Changelog)
            .then(|| Constraints::new_unverified(vec![Constraint::PrimaryKey(key)]));
        Ok(MinkTable {
            client,
            lake: None,
            freshness: crate::settings::Freshness::default(),
            report_tails: true,
            description,
            view,
            schema,
            constraints,
        })
    }

    /// Reads lake snapshots through `lake` (straight from object storage).
    pub fn reading_lake(mut self, lake: Option<Arc<mink_lake::Lake>>) -> Self {
        self.lake = lake;
        self
    }

    /// Reads a lake table at `freshness`: its lake snapshot alone when that is fresh enough.
    pub fn at_freshness(mut self, freshness: crate::settings::Freshness) -> Self {
        self.freshness = freshness;
        self
    }

    /// Whether scans report the log-tail rows they read, so the table is tiered sooner.
    pub fn reporting_tails(mut self, report: bool) -> Self {
        self.report_tails = report;
        self
    }

    /// The rows this scan reads: a lake table's snapshot alone when the statement's freshness
    /// allows it (no log tail to read).
    fn effective_view(&self) -> TableView {
        let d = &self.description;
        let lake = tiered(d);
        let snapshot = d.lake.as_ref().and_then(|l| l.snapshot_id).is_some();
        if self.view == TableView::Rows
            && lake
            && snapshot
            && self.freshness.lake_only(d.lake.as_ref().map(|l| l.lag_ms))
        {
            TableView::Lake
        } else {
            self.view
        }
    }

    pub fn description(&self) -> &TableDescription {
        &self.description
    }

    /// The table as its current rows, whatever the statement's freshness: what `UPDATE` and
    /// `DELETE` read.
    fn now(&self) -> MinkTable {
        MinkTable {
            client: self.client.clone(),
            lake: self.lake.clone(),
            freshness: crate::settings::Freshness::Latest,
            report_tails: self.report_tails,
            description: self.description.clone(),
            view: TableView::Rows,
            schema: Arc::clone(&self.schema),
            constraints: self.constraints.clone(),
        }
    }

    /// Refuses `statement` (`UPDATE`, `DELETE`) on what it cannot change.
    fn writable(&self, statement: &str) -> Result<()> {
        let d = &self.description;
        if self.view != TableView::Rows {
            return Err(DataFusionError::Plan(format!(
                "{}.{}: a virtual table is read-only",
                d.database, d.table
            )));
        }
        if !self.is_primary_key_table() {
            return Err(DataFusionError::Plan(format!(
                "{statement} changes rows by key: {}.{} is a log table (append-only)",
                d.database, d.table
            )));
        }
        merged_as_written(d, statement)
    }

    /// The scan with the lake's side read straight from object storage, when this engine can
    /// (it has the lake, and the cut names a lake snapshot): the snapshot's files (pruned by
    /// the filter) for `t$lake` and a primary-key table's lake state; for a log table's rows,
    /// those files and, per bucket, the log from its tiered offset to the high watermark
    /// (served by the nodes, which read from the lake anything retention removed meanwhile).
    async fn scan_lake_directly(
        &self,
        state: &dyn Session,
        projected: &SchemaRef,
        columns: &[String],
        filter: &Filter,
        limit: Option<usize>,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let d = &self.description;
        let (Some(lake), Some(snapshot)) =
            (&self.lake, d.lake.as_ref().and_then(|l| l.snapshot_id))
        else {
            return Ok(None);
        };
        let log_too = match self.effective_view() {
            TableView::Lake => false,
            TableView::Rows if !self.is_primary_key_table() => true,
            _ => return Ok(None),
        };
        let table_schema = d
            .arrow_schema()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let bound = filter
            .bind(
                &table_schema,
                &[
                    mink_log::filter::BUCKET,
                    mink_log::filter::OFFSET,
                    mink_log::filter::TIMESTAMP,
                ],
            )
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        // The view's columns: a log table's system columns come from the lake's own.
        let read_schema = Arc::new(
            self.schema.project(
                &columns
                    .iter()
                    .map(|c| self.schema.index_of(c))
                    .collect::<std::result::Result<Vec<_>, _>>()?,
            )?,
        );
        let prune = mink_read::prune::LakePrune(&bound);
        // A partitioned table reads the lake files of the partitions that exist at the cut.
        let partitions: Option<Vec<std::collections::BTreeMap<String, String>>> =
            (!d.partition_keys.is_empty())
                .then(|| d.partitions.iter().map(|p| p.values.clone()).collect());
        let splits = lake
            .plan_splits(
                &d.database,
                &d.table,
                snapshot,
                &read_schema,
                (!bound.is_empty()).then_some(&prune as &dyn mink_lake::Prune),
                partitions.as_deref(),
            )
            .await
            .map_err(crate::lake::lake_error)?;
        let column_stats = splits
            .column_stats(projected)
            .await
            .map_err(crate::lake::lake_error)?;
        let name = format!("{}.{}", d.database, d.table);
        let mut lake_side = crate::lake::MinkLakeExec::new(
            name.clone(),
            splits,
            state.config().target_partitions(),
            read_schema,
            Arc::clone(projected),
        )
        .with_column_stats(&column_stats);
        if bound.is_empty() && !self.is_primary_key_table() {
            lake_side = lake_side.exact_rows();
        }
        let lake_side: Arc<dyn ExecutionPlan> = Arc::new(lake_side);
        if !log_too {
            return Ok(Some(lake_side));
        }
        let tails: Vec<(Ticket, Option<u64>)> = d
            .buckets
            .iter()
            .filter(|b| b.end_offset > b.tiered_offset.unwrap_or(0))
            .map(|b| {
                (
                    Ticket {
                        database: d.database.clone(),
                        table: d.table.clone(),
                        partition: b.partition.clone(),
                        bucket: Some(b.bucket),
                        offset: b.tiered_offset,
                        end_offset: Some(b.end_offset),
                        columns: columns.to_vec(),
                        filter: filter.clone(),
                        max_rows: limit.map(|l| l as u64),
                        ..Default::default()
                    },
                    Some(b.end_offset - b.tiered_offset.unwrap_or(b.start_offset)),
                )
            })
            .collect();
        let leaders = leaders_of(
            d.buckets
                .iter()
                .filter(|b| b.end_offset > b.tiered_offset.unwrap_or(0)),
        );
        // The tail's offsets are its rows: the lake holds everything below them.
        let mut log_side =
            MinkScanExec::new(self.client.clone(), name, Arc::clone(projected), tails)
                .exact_rows()
                .at_leaders(leaders);
        // The tail's rows go to the node tiering the table (its first bucket's leader).
        if self.report_tails
            && let Some(first) = d.buckets.first().filter(|b| !b.leader_address.is_empty())
        {
            log_side = log_side.reporting_to(
                first.leader_address.clone(),
                d.database.clone(),
                d.table.clone(),
            );
        }
        let log_side: Arc<dyn ExecutionPlan> = Arc::new(log_side);
        Ok(Some(datafusion::physical_plan::union::UnionExec::try_new(
            vec![lake_side, log_side],
        )?))
    }

    fn is_primary_key_table(&self) -> bool {
        !self.description.primary_key.is_empty()
    }
}

#[async_trait]
impl TableProvider for MinkTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn constraints(&self) -> Option<&Constraints> {
        self.constraints.as_ref()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match to_predicates(f) {
                Some(_) => TableProviderFilterPushDown::Inexact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    /// `INSERT INTO`: appends to a log table, upserts into a primary-key table.
    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if self.view != TableView::Rows {
            return Err(DataFusionError::Plan(format!(
                "{}.{}: a virtual table is read-only; insert into the table",
                self.description.database, self.description.table
            )));
        }
        if insert_op != InsertOp::Append {
            return Err(DataFusionError::NotImplemented(format!(
                "{insert_op} is not supported: Mink tables take INSERT INTO (appends to a log table, upserts into a primary-key table)"
            )));
        }
        let sink = MinkSink::new(
            self.client.clone(),
            self.description.clone(),
            Arc::clone(&self.schema),
        );
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }

    /// `DELETE`: a primary-key table's rows the filters select, deleted by key.
    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.writable("DELETE")?;
        let current = self.now().scan(state, None, &filters, None).await?;
        let d = &self.description;
        crate::dml::delete(
            state,
            &self.client,
            (&d.database, &d.table),
            (current, Arc::clone(&self.schema)),
            d.auto_increment_column().as_deref(),
            filters,
        )
    }

    /// `UPDATE`: a primary-key table's rows the filters select, with the assignments applied.
    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.writable("UPDATE")?;
        let current = self.now().scan(state, None, &filters, None).await?;
        let d = &self.description;
        crate::dml::update(
            state,
            &self.client,
            (&d.database, &d.table),
            (current, Arc::clone(&self.schema)),
            (&d.primary_key, d.auto_increment_column().as_deref()),
            assignments,
            filters,
        )
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let projected = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => Arc::clone(&self.schema),
        };
        // No columns (`count(*)`): read the first, for the row counts.
        let columns: Vec<String> = match projection {
            Some(p) if p.is_empty() => vec![self.schema.field(0).name().clone()],
            _ => projected
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
        };
        let filter = Filter(filters.iter().filter_map(to_predicates).flatten().collect());
        let d = &self.description;
        let view = self.effective_view();
        // Equality on the whole primary key: a point lookup at the keys' leaders.
        if view == TableView::Rows
            && let Some(keys) = point_keys(&d.primary_key, &filter)
        {
            return Ok(Arc::new(MinkLookupExec::new(
                self.client.clone(),
                (d.database.clone(), d.table.clone()),
                keys,
                columns,
                projected,
            )));
        }
        let lake = tiered(d);
        if let Some(plan) = self
            .scan_lake_directly(state, &projected, &columns, &filter, limit)
            .await?
        {
            return Ok(plan);
        }
        // What each bucket's read is: positioned up to the planned high watermark for reads
        // of offsets (a log table's rows, any changelog); a snapshot for current rows.
        let (positioned, changelog, source) = match view {
            TableView::Rows => (!self.is_primary_key_table(), false, None),
            TableView::Changelog => (true, true, None),
            TableView::Log => (true, false, lake.then(|| "log".to_string())),
            TableView::Lake => (
                !self.is_primary_key_table(),
                false,
                Some("lake".to_string()),
            ),
        };
        // Rows per split where offsets count them: a log table's (from 0 when its history is
        // in the lake), a changelog's changes.
        let rows = |b: &mink_client::BucketDescription| match view {
            TableView::Rows | TableView::Lake if self.is_primary_key_table() => None,
            TableView::Lake => b.tiered_offset,
            TableView::Rows if lake => Some(b.end_offset),
            _ => Some(b.end_offset.saturating_sub(b.start_offset)),
        };
        // A bucket nothing was written to has no offsets to read.
        let read = |b: &&mink_client::BucketDescription| !positioned || b.end_offset > 0;
        let leaders = leaders_of(d.buckets.iter().filter(read));
        let splits: Vec<(Ticket, Option<u64>)> = d
            .buckets
            .iter()
            .filter(read)
            .map(|b| {
                (
                    Ticket {
                        database: d.database.clone(),
                        table: d.table.clone(),
                        partition: b.partition.clone(),
                        bucket: Some(b.bucket),
                        end_offset: positioned.then_some(b.end_offset),
                        columns: columns.clone(),
                        filter: filter.clone(),
                        max_rows: limit.map(|l| l as u64),
                        changelog,
                        source: source.clone(),
                        ..Default::default()
                    },
                    rows(b),
                )
            })
            .collect();
        let scan = MinkScanExec::new(
            self.client.clone(),
            format!("{}.{}", d.database, d.table),
            projected,
            splits,
        )
        .at_leaders(leaders);
        // A log table's offsets from its start are its rows (not a lake table's: its lake may
        // begin past offset 0; not a changelog's: writers' markers take offsets too).
        let exact = !self.is_primary_key_table()
            && !lake
            && matches!(view, TableView::Rows | TableView::Log);
        Ok(Arc::new(if exact { scan.exact_rows() } else { scan }))
    }
}

/// The leader address of each bucket (none while a bucket has no leader).
fn leaders_of<'a>(
    buckets: impl Iterator<Item = &'a mink_client::BucketDescription>,
) -> Vec<Option<String>> {
    buckets
        .map(|b| Some(b.leader_address.clone()).filter(|a| !a.is_empty()))
        .collect()
}
