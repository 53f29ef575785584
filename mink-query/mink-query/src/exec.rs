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

/// A physical optimizer rule, run after DataFusion's: each join and unnest gives way to other
/// tasks as it emits batches. DataFusion yields to the runtime only as leaves produce batches
/// (`EnsureCooperative`), but a join (a cross join above all) emits many batches, each ready
/// at once, for one batch of its input: an aggregate over it computed for seconds without
/// yielding, holding a runtime thread that other statements were waiting for. Wrapped in a
/// `CooperativeExec`, each batch it emits spends the task's budget, so the task yields every
/// so many batches however few its leaves read.
#[derive(Debug, Default)]
pub(crate) struct Yielding;

impl datafusion::physical_optimizer::PhysicalOptimizerRule for Yielding {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &datafusion::config::ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        use datafusion::common::tree_node::{Transformed, TreeNode as _};
        use datafusion::physical_plan::coop::CooperativeExec;
        use datafusion::physical_plan::execution_plan::SchedulingType;
        plan.transform_up(|p| {
            let emits_many = p.children().len() > 1 || p.name() == "UnnestExec";
            if emits_many && p.properties().scheduling_type != SchedulingType::Cooperative {
                Ok(Transformed::yes(
                    Arc::new(CooperativeExec::new(p)) as Arc<dyn ExecutionPlan>
                ))
            } else {
                Ok(Transformed::no(p))
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "Yielding"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
