//! The physical scan of a Mink table: one partition per split (a bucket's read, as a Flight
//! ticket a node serves), each streamed from the cluster when executed.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::Statistics;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{StreamExt as _, TryStreamExt as _};
use mink_client::{Client, Scan, Ticket};

use crate::client_error;
use crate::exec::{as_plan_batch, empty_stream, leaf_properties, leaf_with_new_children};

/// Reads `splits` (one per partition) from the cluster as batches of `schema`.
#[derive(Debug)]
pub struct MinkScanExec {
    client: Client,
    table: String,
    schema: SchemaRef,
    splits: Vec<Ticket>,
    /// Per split, the address of its bucket's leader, which reads it (see
    /// [`MinkScanExec::at_leaders`]); none: the connected node.
    leaders: Vec<Option<String>>,
    /// Where to report the rows read once every split is done (a lake table's log tails).
    report: Option<Arc<TailReport>>,
    /// Rows each split holds, where the cut says (offsets count rows of log tables).
    rows: Vec<Option<u64>>,
    /// Whether `rows` are exactly the rows the splits read (see [`MinkScanExec::exact_rows`]).
    exact: bool,
    properties: Arc<PlanProperties>,
}

impl MinkScanExec {
    /// `splits` and, per split, how many rows it reads at most, when known.
    pub fn new(
        client: Client,
        table: String,
        schema: SchemaRef,
        splits: Vec<(Ticket, Option<u64>)>,
    ) -> Self {
        let (splits, rows): (Vec<Ticket>, Vec<Option<u64>>) = splits.into_iter().unzip();
        let properties = leaf_properties(&schema, splits.len().max(1));
        MinkScanExec {
            client,
            table,
            schema,
            splits,
            leaders: Vec::new(),
            report: None,
            rows,
            exact: false,
            properties,
        }
    }

    /// Declares the splits' row counts exact: unfiltered, unlimited reads of a log table's
    /// offsets at the cut, one row per offset. The planner may then answer `count(*)` from
    /// them without reading.
    pub fn exact_rows(mut self) -> Self {
        self.exact = self
            .splits
            .iter()
            .all(|t| t.filter.is_empty() && t.max_rows.is_none());
        self
    }

    /// Reads each split at its bucket's leader (`leaders[i]` for split `i`), where the log
    /// cache holds the recent appends and a primary-key bucket's rows live; a leader that
    /// cannot be reached leaves its split to the connected node.
    pub fn at_leaders(mut self, leaders: Vec<Option<String>>) -> Self {
        self.leaders = leaders;
        self
    }

    /// Reports the log-tail rows this scan read to the node at `address` (the table's tiering
    /// node) once every split has ended: the feedback that tiers a queried table sooner.
    pub fn reporting_to(mut self, address: String, database: String, table: String) -> Self {
        self.report = Some(Arc::new(TailReport {
            client: self.client.clone(),
            address,
            database,
            table,
            rows: AtomicU64::new(0),
            pending: AtomicUsize::new(self.splits.len()),
        }));
        self
    }

    pub fn splits(&self) -> &[Ticket] {
        &self.splits
    }
}

impl DisplayAs for MinkScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let filter = self
            .splits
            .first()
            .map(|s| serde_json::to_string(&s.filter).unwrap_or_default())
            .unwrap_or_default();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "MinkScanExec: table={}, splits={}, filter={filter}",
                self.table,
                self.splits.len()
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "table={}", self.table)?;
                write!(f, "splits={}", self.splits.len())
            }
        }
    }
}

impl ExecutionPlan for MinkScanExec {
    fn name(&self) -> &str {
        "MinkScanExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        leaf_with_new_children(self, &children)
    }

    /// Row counts from the cut: exact where [`MinkScanExec::exact_rows`] says, otherwise an
    /// upper bound (filters and limits read fewer).
    fn partition_statistics(&self, partition: Option<usize>) -> Result<Statistics> {
        let rows: Option<u64> = match partition {
            Some(p) => self.rows.get(p).copied().flatten(),
            None => self.rows.iter().copied().sum(),
        };
        let limit = self.splits.first().and_then(|t| t.max_rows);
        let rows = rows.map(|r| match (partition, limit) {
            (Some(_), Some(l)) => r.min(l),
            (None, Some(l)) => r.min(l.saturating_mul(self.splits.len() as u64)),
            _ => r,
        });
        Ok(crate::exec::row_statistics(&self.schema, rows, self.exact))
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.schema);
        let Some(ticket) = self.splits.get(partition).cloned() else {
            return Ok(empty_stream(schema));
        };
        let client = self.client.clone();
        let leader = self.leaders.get(partition).cloned().flatten();
        let out = Arc::clone(&schema);
        let report = self.report.clone().map(SplitDone);
        let batches = futures::stream::once(async move {
            client
                .scan_at_leader(&Scan(ticket), leader.as_deref())
                .await
                .map_err(client_error)
        })
        .map_ok(|s| s.map_err(client_error))
        .try_flatten()
        .map(move |r| {
            let r = r?;
            if let Some(SplitDone(report)) = &report {
                report
                    .rows
                    .fetch_add(r.batch.num_rows() as u64, Ordering::Relaxed);
            }
            as_plan_batch(&out, &r.batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}

/// The rows a scan's splits read, reported once the last split is done.
#[derive(Debug)]
struct TailReport {
    client: Client,
    address: String,
    database: String,
    table: String,
    rows: AtomicU64,
    pending: AtomicUsize,
}

/// Held by a split's stream: when the last one is dropped, the rows go to the tiering node
/// (fire and forget: the report is advisory).
#[derive(Debug)]
struct SplitDone(Arc<TailReport>);

impl Drop for SplitDone {
    fn drop(&mut self) {
        let r = &self.0;
        if r.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let rows = r.rows.load(Ordering::Relaxed);
        if rows == 0 {
            return;
        }
        let r = Arc::clone(r);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            REPORTS_IN_FLIGHT.send_modify(|n| *n += 1);
            runtime.spawn(async move {
                if let Err(e) = r
                    .client
                    .report_tail_scan_at(&r.address, &r.database, &r.table, rows)
                    .await
                {
                    tracing::debug!(error = %e, table = %r.table, "tail scan report not delivered");
                }
                REPORTS_IN_FLIGHT.send_modify(|n| *n -= 1);
            });
        }
    }
}

/// Tail reports of this process on their way to their nodes.
static REPORTS_IN_FLIGHT: std::sync::LazyLock<tokio::sync::watch::Sender<usize>> =
    std::sync::LazyLock::new(|| tokio::sync::watch::channel(0).0);

/// Waits (at most `limit`) until the tail reports of this process's scans so far are answered:
/// a process that exits right after its queries (`mink-query -c`) would otherwise drop them,
/// and its queries would never bring a table's tiering forward. Returns whether they were.
pub async fn tail_reports_sent(limit: std::time::Duration) -> bool {
    let mut in_flight = REPORTS_IN_FLIGHT.subscribe();
    tokio::time::timeout(limit, in_flight.wait_for(|n| *n == 0))
        .await
        .is_ok()
}

/// Reads the rows of `keys` of a primary-key table with one lookup (the connected node asks
/// each key's bucket leader): what an equality on the whole primary key plans to.
#[derive(Debug)]
pub struct MinkLookupExec {
    client: Client,
    database: String,
    table: String,
    keys: Vec<serde_json::Map<String, serde_json::Value>>,
    columns: Vec<String>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl MinkLookupExec {
    pub fn new(
        client: Client,
        (database, table): (String, String),
        keys: Vec<serde_json::Map<String, serde_json::Value>>,
        columns: Vec<String>,
        schema: SchemaRef,
    ) -> Self {
        let properties = leaf_properties(&schema, 1);
        MinkLookupExec {
            client,
            database,
            table,
            keys,
            columns,
            schema,
            properties,
        }
    }

    pub fn keys(&self) -> usize {
        self.keys.len()
    }
}

impl DisplayAs for MinkLookupExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "MinkLookupExec: table={}.{}, keys={}",
                self.database,
                self.table,
                self.keys.len()
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "table={}.{}", self.database, self.table)?;
                write!(f, "keys={}", self.keys.len())
            }
        }
    }
}

impl ExecutionPlan for MinkLookupExec {
    fn name(&self) -> &str {
        "MinkLookupExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        leaf_with_new_children(self, &children)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.schema);
        if partition > 0 || self.keys.is_empty() {
            return Ok(empty_stream(schema));
        }
        let (client, keys, columns) =
            (self.client.clone(), self.keys.clone(), self.columns.clone());
        let (database, table) = (self.database.clone(), self.table.clone());
        let out = Arc::clone(&schema);
        let batch = futures::stream::once(async move {
            let found = client
                .lookup(&database, &table, keys, &columns)
                .await
                .map_err(client_error)?;
            as_plan_batch(&out, &found)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batch)))
    }
}
