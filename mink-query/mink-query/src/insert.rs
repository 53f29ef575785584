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
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::sink::DataSink;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
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
