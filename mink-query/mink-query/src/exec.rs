//! What Mink's leaf plans (scans, lookups, lake files) share.

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::Statistics;
use datafusion::common::stats::Precision;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, Partitioning, PlanProperties};

/// A bounded leaf of `partitions` partitions producing `schema`.
pub(crate) fn leaf_properties(schema: &SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(Arc::clone(schema)),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

/// Statistics of a leaf that knows only how many rows it reads: `exact` when that is the
/// count, otherwise an upper bound.
pub(crate) fn row_statistics(schema: &SchemaRef, rows: Option<u64>, exact: bool) -> Statistics {
    let stats = Statistics::new_unknown(schema);
    match rows.and_then(|r| usize::try_from(r).ok()) {
        Some(r) if exact => stats.with_num_rows(Precision::Exact(r)),
        Some(r) => stats.with_num_rows(Precision::Inexact(r)),
        None => stats,
    }
}

/// `with_new_children` of a leaf: itself, or an error if given children.
pub(crate) fn leaf_with_new_children(
    leaf: Arc<dyn ExecutionPlan>,
    children: &[Arc<dyn ExecutionPlan>],
) -> Result<Arc<dyn ExecutionPlan>> {
    if children.is_empty() {
        Ok(leaf)
    } else {
        Err(DataFusionError::Internal(format!(
            "{} has no children",
            leaf.name()
        )))
    }
}

/// A stream of no batches.
pub(crate) fn empty_stream(schema: SchemaRef) -> SendableRecordBatchStream {
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::empty(),
    ))
}

/// `batch` as a batch of the plan's `schema`: its columns, or none (only its row count) when
/// the plan asks for no columns (`count(*)`, which reads one column for the counts).
pub(crate) fn as_plan_batch(schema: &SchemaRef, batch: &RecordBatch) -> Result<RecordBatch> {
    let columns = if schema.fields().is_empty() {
        vec![]
    } else {
        batch.columns().to_vec()
    };
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}
