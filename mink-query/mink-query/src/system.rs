//! The system tables, schema `system` of catalog `mink`: `nodes`, `tables` and `buckets`, read
//! from the cluster's metadata when a statement names them.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
    UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::common::Statistics;
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use mink_client::{Client, ErrorCode, TableDescription};

use crate::client_error;

/// The schema's name.
pub const SYSTEM: &str = "system";

const TABLES: [&str; 4] = ["buckets", "nodes", "queries", "tables"];

#[derive(Debug)]
pub struct SystemTables {
    client: Client,
    queries: Arc<crate::queries::Queries>,
}

impl SystemTables {
    pub fn new(client: Client, queries: Arc<crate::queries::Queries>) -> Self {
        SystemTables { client, queries }
    }

    /// The statements running on this engine.
    fn queries(&self) -> Result<RecordBatch> {
        let q = self.queries.running();
        Ok(RecordBatch::try_from_iter(vec![
            (
                "query_id",
                col(UInt64Array::from_iter_values(q.iter().map(|x| x.id))),
            ),
            (
                "sql",
                col(StringArray::from_iter_values(q.iter().map(|x| &x.sql))),
            ),
            (
                "source",
                col(StringArray::from_iter_values(q.iter().map(|x| x.source))),
            ),
            (
                "started_at",
                col(
                    TimestampMillisecondArray::from_iter_values(q.iter().map(|x| x.started_at_ms))
                        .with_timezone("UTC"),
                ),
            ),
            (
                "elapsed_ms",
                col(UInt64Array::from_iter_values(q.iter().map(|x| {
                    u64::try_from(x.started.elapsed().as_millis()).unwrap_or(u64::MAX)
                }))),
            ),
        ])?)
    }

    /// Every table's description (tables dropped meanwhile left out).
    async fn descriptions(&self) -> Result<Vec<TableDescription>> {
        let mut out = Vec::new();
        for database in self.client.list_databases().await.map_err(client_error)? {
            let Ok(tables) = self.client.list_tables(&database).await else {
                continue;
            };
            for t in tables {
                match self.client.describe_table(&database, &t).await {
                    Ok(d) => out.push(d),
                    Err(e) if e.code() == Some(ErrorCode::NotFound) => {}
                    Err(e) => return Err(client_error(e)),
                }
            }
        }
        Ok(out)
    }

    async fn nodes(&self) -> Result<RecordBatch> {
        let cluster = self.client.describe_cluster().await.map_err(client_error)?;
        let n = &cluster.nodes;
        let coordinator = cluster.coordinator_node_id;
        Ok(RecordBatch::try_from_iter(vec![
            (
                "node_id",
                col(UInt64Array::from_iter_values(n.iter().map(|x| x.node_id))),
            ),
            (
                "address",
                col(StringArray::from_iter_values(n.iter().map(|x| &x.address))),
            ),
            (
                "live",
                col(BooleanArray::from_iter(n.iter().map(|x| Some(x.live)))),
            ),
            (
                "coordinator",
                col(BooleanArray::from_iter(
                    n.iter().map(|x| Some(coordinator == Some(x.node_id))),
                )),
            ),
            (
                "drained",
                col(BooleanArray::from_iter(n.iter().map(|x| Some(x.drained)))),
            ),
            (
                "buckets",
                col(UInt64Array::from_iter_values(n.iter().map(|x| x.buckets))),
            ),
            (
                "heartbeat_age_ms",
                col(Int64Array::from_iter(n.iter().map(|x| x.heartbeat_age_ms))),
            ),
        ])?)
    }

    async fn tables(&self) -> Result<RecordBatch> {
        let d = self.descriptions().await?;
        let lake = crate::table::tiered;
        Ok(RecordBatch::try_from_iter(vec![
            (
                "database",
                col(StringArray::from_iter_values(d.iter().map(|t| &t.database))),
            ),
            (
                "table",
                col(StringArray::from_iter_values(d.iter().map(|t| &t.table))),
            ),
            (
                "kind",
                col(StringArray::from_iter_values(d.iter().map(|t| {
                    if t.primary_key.is_empty() {
                        "log"
                    } else {
                        "primary key"
                    }
                }))),
            ),
            (
                "primary_key",
                col(StringArray::from_iter_values(
                    d.iter().map(|t| t.primary_key.join(", ")),
                )),
            ),
            (
                "buckets",
                col(UInt32Array::from_iter_values(
                    d.iter().map(|t| t.bucket_count),
                )),
            ),
            (
                "partitions",
                col(UInt64Array::from_iter_values(
                    d.iter().map(|t| t.partitions.len() as u64),
                )),
            ),
            (
                "lake",
                col(BooleanArray::from_iter(d.iter().map(|t| Some(lake(t))))),
            ),
            (
                "lake_lag_ms",
                col(UInt64Array::from_iter(
                    d.iter().map(|t| t.lake.as_ref().map(|l| l.lag_ms)),
                )),
            ),
        ])?)
    }

    async fn buckets(&self) -> Result<RecordBatch> {
        let d = self.descriptions().await?;
        let rows: Vec<(&TableDescription, &mink_client::BucketDescription)> = d
            .iter()
            .flat_map(|t| t.buckets.iter().map(move |b| (t, b)))
            .collect();
        Ok(RecordBatch::try_from_iter(vec![
            (
                "database",
                col(StringArray::from_iter_values(
                    rows.iter().map(|(t, _)| &t.database),
                )),
            ),
            (
                "table",
                col(StringArray::from_iter_values(
                    rows.iter().map(|(t, _)| &t.table),
                )),
            ),
            (
                "partition",
                col(StringArray::from_iter(
                    rows.iter().map(|(_, b)| b.partition.as_deref()),
                )),
            ),
            (
                "bucket",
                col(UInt32Array::from_iter_values(
                    rows.iter().map(|(_, b)| b.bucket),
                )),
            ),
            (
                "leader",
                col(UInt64Array::from_iter(rows.iter().map(|(_, b)| {
                    (b.leader_node_id != 0).then_some(b.leader_node_id)
                }))),
            ),
            (
                "leader_epoch",
                col(UInt64Array::from_iter_values(
                    rows.iter().map(|(_, b)| b.leader_epoch),
                )),
            ),
            (
                "start_offset",
                col(UInt64Array::from_iter_values(
                    rows.iter().map(|(_, b)| b.start_offset),
                )),
            ),
            (
                "high_watermark",
                col(UInt64Array::from_iter_values(
                    rows.iter().map(|(_, b)| b.end_offset),
                )),
            ),
            (
                "tiered_offset",
                col(UInt64Array::from_iter(
                    rows.iter().map(|(_, b)| b.tiered_offset),
                )),
            ),
            (
                "lake_lag_ms",
                col(UInt64Array::from_iter(
                    rows.iter().map(|(t, _)| t.lake.as_ref().map(|l| l.lag_ms)),
                )),
            ),
        ])?)
    }
}

fn col(a: impl arrow::array::Array + 'static) -> ArrayRef {
    Arc::new(a)
}

#[async_trait]
impl SchemaProvider for SystemTables {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        TABLES.iter().map(ToString::to_string).collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let batch = match name {
            "nodes" => self.nodes().await?,
            "tables" => self.tables().await?,
            "buckets" => self.buckets().await?,
            "queries" => self.queries()?,
            _ => return Ok(None),
        };
        let schema = batch.schema();
        Ok(Some(Arc::new(ReadOnly {
            name: format!("{SYSTEM}.{name}"),
            rows: MemTable::try_new(schema, vec![vec![batch]])?,
        })))
    }

    fn table_exist(&self, name: &str) -> bool {
        TABLES.contains(&name)
    }
}

/// A system table: its rows as read when the statement was planned, refusing writes (a
/// `MemTable` would take them and forget them).
#[derive(Debug)]
struct ReadOnly {
    name: String,
    rows: MemTable,
}

impl ReadOnly {
    fn refuse(&self) -> DataFusionError {
        DataFusionError::Plan(format!(
            "{}: system tables are read-only (the cluster's metadata, as it is)",
            self.name
        ))
    }
}

#[async_trait]
impl TableProvider for ReadOnly {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.rows.schema()
    }

    fn table_type(&self) -> TableType {
        self.rows.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.rows.scan(state, projection, filters, limit).await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        self.rows.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.rows.statistics()
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        _input: Arc<dyn ExecutionPlan>,
        _insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(self.refuse())
    }

    async fn delete_from(
        &self,
        _state: &dyn Session,
        _filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(self.refuse())
    }

    async fn update(
        &self,
        _state: &dyn Session,
        _assignments: Vec<(String, Expr)>,
        _filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(self.refuse())
    }

    async fn truncate(&self, _state: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        Err(self.refuse())
    }
}
