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
use crate::scan::MinkScanExec;

/// A table as described when the statement was planned: that description fixes the cut
/// (each bucket's high watermark) every scan of the statement reads.
#[derive(Debug)]
pub struct MinkTable {
    client: Client,
    description: TableDescription,
    schema: SchemaRef,
    constraints: Option<Constraints>,
}

impl MinkTable {
    pub fn new(client: Client, description: TableDescription) -> Result<Self> {
        let schema = Arc::new(
            description
                .arrow_schema()
                .map_err(|e| DataFusionError::External(Box::new(e)))?,
        );
        let key: Vec<usize> = description
            .primary_key
            .iter()
            .filter_map(|k| schema.index_of(k).ok())
            .collect();
        let constraints = (!key.is_empty())
            .then(|| Constraints::new_unverified(vec![Constraint::PrimaryKey(key)]));
        Ok(MinkTable {
            client,
            description,
            schema,
            constraints,
        })
    }

    pub fn description(&self) -> &TableDescription {
        &self.description
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
        if insert_op != InsertOp::Append {
            return Err(DataFusionError::NotImplemented(format!(
                "{insert_op} is not supported: Mink tables take INSERT INTO (appends to a log table, upserts into a primary-key table)"
            )));
        }
        let d = &self.description;
        let sink = MinkSink::new(
            self.client.clone(),
            d.database.clone(),
            d.table.clone(),
            Arc::clone(&self.schema),
        );
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }

    async fn scan(
        &self,
        _state: &dyn Session,
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
        let splits: Vec<Ticket> = d
            .buckets
            .iter()
            // A log table's bucket nothing was written to has nothing to read.
            .filter(|b| self.is_primary_key_table() || b.end_offset > 0)
            .map(|b| Ticket {
                database: d.database.clone(),
                table: d.table.clone(),
                partition: b.partition.clone(),
                bucket: Some(b.bucket),
                // Log tables: up to the high watermark the statement was planned at.
                end_offset: (!self.is_primary_key_table()).then_some(b.end_offset),
                columns: columns.clone(),
                filter: filter.clone(),
                max_rows: limit.map(|l| l as u64),
                ..Default::default()
            })
            .collect();
        Ok(Arc::new(MinkScanExec::new(
            self.client.clone(),
            format!("{}.{}", d.database, d.table),
            projected,
            splits,
        )))
    }
}
