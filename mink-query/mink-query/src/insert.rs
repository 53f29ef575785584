//! `INSERT INTO` a Mink table: the statement's rows written through an idempotent writer of
//! the Rust client (routed to each bucket's leader; a retried batch is stored once).
//!
//! A statement is not atomic across buckets (Mink has no transactions): each batch is
//! acknowledged per bucket as it is written, so a statement that fails part-way leaves the
//! batches written before the failure stored, and says how many rows that was.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::datasource::sink::DataSink;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Cast, Expr, ExprSchemable as _, LogicalPlan, TryCast, WriteOp};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use futures::StreamExt as _;
use mink_client::Client;

/// Writes rows into `database.table`.
#[derive(Debug)]
pub struct MinkSink {
    client: Client,
    database: String,
    table: String,
    schema: SchemaRef,
}

impl MinkSink {
    pub fn new(client: Client, database: String, table: String, schema: SchemaRef) -> Self {
        MinkSink {
            client,
            database,
            table,
            schema,
        }
    }
}

impl DisplayAs for MinkSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MinkSink: table={}.{}", self.database, self.table)
    }
}

#[async_trait]
impl DataSink for MinkSink {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> Result<u64> {
        let mut writer = self.client.writer(&self.database, &self.table);
        let mut rows = 0u64;
        while let Some(batch) = data.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            // As the table's schema (the plan's may differ in nullability only).
            let batch = RecordBatch::try_new(Arc::clone(&self.schema), batch.columns().to_vec())?;
            writer.write(&batch).await.map_err(|e| {
                DataFusionError::Execution(format!(
                    "INSERT INTO {}.{} stopped after {rows} rows were stored: {e}",
                    self.database, self.table
                ))
            })?;
            rows += batch.num_rows() as u64;
        }
        Ok(rows)
    }
}

/// Refuses an `INSERT` whose value would lose its fraction going into an integer column
/// (`1.5` into a `BIGINT`): DataFusion casts each value to its column's type, and a float's
/// cast truncates. The casts it adds are at the top of the insert's input (in the `VALUES`
/// cells for a `VALUES` list); a cast written inside the `SELECT` is the user's and stands.
pub fn refuse_lossy_values(plan: &LogicalPlan) -> Result<()> {
    let LogicalPlan::Dml(dml) = plan else {
        return Ok(());
    };
    let (WriteOp::Insert(_), LogicalPlan::Projection(top)) = (&dml.op, dml.input.as_ref()) else {
        return Ok(());
    };
    let input = top.input.schema();
    for e in &top.expr {
        let (column, e) = match e {
            Expr::Alias(a) => (a.name.as_str(), a.expr.as_ref()),
            _ => continue,
        };
        match e {
            Expr::Cast(Cast { expr, data_type }) | Expr::TryCast(TryCast { expr, data_type }) => {
                check(column, expr, &expr.get_type(input)?, data_type)?;
            }
            Expr::Column(c) => {
                if let LogicalPlan::Values(values) = top.input.as_ref() {
                    let i = input.index_of_column(c)?;
                    for row in &values.values {
                        if let Some(Expr::Cast(Cast { expr, data_type })) = row.get(i) {
                            check(column, expr, &expr.get_type(&values.schema)?, data_type)?;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn check(column: &str, value: &Expr, from: &DataType, to: &DataType) -> Result<()> {
    let fractional = from.is_floating()
        || matches!(
            from,
            DataType::Decimal32(_, s) | DataType::Decimal64(_, s) if *s > 0
        )
        || matches!(
            from,
            DataType::Decimal128(_, s) | DataType::Decimal256(_, s) if *s > 0
        );
    if fractional && to.is_integer() {
        return Err(DataFusionError::Plan(format!(
            "column {column} is {to} and {value} is {from}: a value of another type is refused, not truncated (CAST it to {to} to truncate)"
        )));
    }
    Ok(())
}
