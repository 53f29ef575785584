//! The lake's side of a scan, read straight from object storage: the data files of the lake
//! snapshot the statement's cut names, split across partitions and read in parallel by this
//! process (not through a node).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{StreamExt as _, TryStreamExt as _};
use mink_lake::LakeSplits;

use crate::exec::{as_plan_batch, empty_stream, leaf_properties, leaf_with_new_children};

pub(crate) fn lake_error(e: mink_lake::LakeError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Reads groups of a lake snapshot's data files, one group per partition, as batches of
/// `schema` (read as `read_schema`: no columns asked for reads the first, for row counts).
#[derive(Debug)]
pub struct MinkLakeExec {
    table: String,
    splits: LakeSplits,
    groups: Vec<Vec<usize>>,
    read_schema: SchemaRef,
    schema: SchemaRef,
    /// Whether the files' record counts are the rows read (see [`MinkLakeExec::exact_rows`]).
    exact: bool,
    /// Per file, per column of `schema`: what its manifest entry records (see
    /// [`MinkLakeExec::with_column_stats`]); empty when unknown.
    files: Vec<Vec<FileColumn>>,
    properties: Arc<PlanProperties>,
}

/// A column of one data file: its null count and bounds, as the plan's types.
#[derive(Clone, Debug, Default)]
struct FileColumn {
    nulls: Option<usize>,
    min: Option<ScalarValue>,
    max: Option<ScalarValue>,
}

impl MinkLakeExec {
    pub fn new(
        table: String,
        splits: LakeSplits,
        partitions: usize,
        read_schema: SchemaRef,
        schema: SchemaRef,
    ) -> Self {
        let n = partitions.clamp(1, splits.tasks.len().max(1));
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); n];
        for i in 0..splits.tasks.len() {
            groups[i % n].push(i);
        }
        let properties = leaf_properties(&schema, n);
        MinkLakeExec {
            table,
            splits,
            groups,
            read_schema,
            schema,
            exact: false,
            files: Vec::new(),
            properties,
        }
    }

    /// The files' column statistics (per task of the splits, per column of the plan's schema),
    /// from [`LakeSplits::column_stats`]: what the planner is told of each column's nulls and
    /// range.
    pub fn with_column_stats(mut self, stats: &[Vec<mink_lake::ColumnStats>]) -> Self {
        let scalar = |a: &Option<arrow::array::ArrayRef>, i: usize| {
            let field = self.schema.field(i);
            a.as_ref()
                .and_then(|a| arrow::compute::cast(a, field.data_type()).ok())
                .and_then(|a| ScalarValue::try_from_array(&a, 0).ok())
                .filter(|v| !v.is_null())
        };
        self.files = stats
            .iter()
            .map(|columns| {
                columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| FileColumn {
                        nulls: c.null_count.and_then(|n| usize::try_from(n).ok()),
                        min: scalar(&c.min, i),
                        max: scalar(&c.max, i),
                    })
                    .collect()
            })
            .collect();
        self
    }

    /// Column statistics over `files`: null counts summed and ranges joined where every file
    /// records them. Exact for an exact read (no filter, no deletes) where the bounds are the
    /// values themselves (not strings, whose bounds may be truncated; not floats, whose bounds
    /// leave NaN out); otherwise bounds.
    fn column_statistics(&self, files: &[usize]) -> Vec<ColumnStatistics> {
        let known = |f: &Vec<FileColumn>| f.len() == self.schema.fields().len();
        if files.is_empty() || !files.iter().all(|&i| self.files.get(i).is_some_and(known)) {
            return Statistics::unknown_column(&self.schema);
        }
        self.schema
            .fields()
            .iter()
            .enumerate()
            .map(|(c, field)| {
                let column = files.iter().map(|&i| &self.files[i][c]);
                let nulls: Option<usize> = column.clone().map(|f| f.nulls).sum();
                let join = |pick: fn(&FileColumn) -> &Option<ScalarValue>, keep_less: bool| {
                    column.clone().map(|f| pick(f).clone()).try_fold(
                        None::<ScalarValue>,
                        |acc, v| {
                            let v = v?;
                            Some(Some(match acc {
                                Some(a) if (a < v) == keep_less => a,
                                _ => v,
                            }))
                        },
                    )
                };
                let exact_values = self.exact
                    && (field.data_type().is_integer()
                        || field.data_type().is_temporal()
                        || matches!(
                            field.data_type(),
                            arrow::datatypes::DataType::Boolean
                                | arrow::datatypes::DataType::Decimal128(..)
                        ));
                let precision = |v: Option<ScalarValue>, exact: bool| match v {
                    Some(v) if exact => Precision::Exact(v),
                    Some(v) => Precision::Inexact(v),
                    None => Precision::Absent,
                };
                ColumnStatistics {
                    null_count: match nulls {
                        Some(n) if self.exact => Precision::Exact(n),
                        Some(n) => Precision::Inexact(n),
                        None => Precision::Absent,
                    },
                    min_value: precision(join(|f| &f.min, true).flatten(), exact_values),
                    max_value: precision(join(|f| &f.max, false).flatten(), exact_values),
                    ..ColumnStatistics::new_unknown()
                }
            })
            .collect()
    }

    /// Declares the files' record counts the rows read: an unpruned read of a log table's lake
    /// (no deletes apply). The planner may then answer `count(*)` from the manifests.
    pub fn exact_rows(mut self) -> Self {
        self.exact = true;
        self
    }
}

impl DisplayAs for MinkLakeExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "MinkLakeExec: table={}, files={}, partitions={}",
                self.table,
                self.splits.tasks.len(),
                self.groups.len()
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "table={}", self.table)?;
                write!(f, "files={}", self.splits.tasks.len())
            }
        }
    }
}

impl ExecutionPlan for MinkLakeExec {
    fn name(&self) -> &str {
        "MinkLakeExec"
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

    /// The files' record counts and column statistics (from the manifests): exact where
    /// [`MinkLakeExec::exact_rows`] says, otherwise bounds (filters read fewer, deletes remove
    /// rows).
    fn partition_statistics(&self, partition: Option<usize>) -> Result<Statistics> {
        let files: Vec<usize> = match partition {
            Some(p) => self.groups.get(p).cloned().unwrap_or_default(),
            None => (0..self.splits.tasks.len()).collect(),
        };
        let rows: Option<u64> = files
            .iter()
            .map(|&i| self.splits.tasks[i].record_count)
            .sum();
        let mut stats = crate::exec::row_statistics(&self.schema, rows, self.exact);
        stats.column_statistics = self.column_statistics(&files);
        Ok(stats)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(&self.schema);
        let tasks: Vec<_> = self
            .groups
            .get(partition)
            .map(|g| g.iter().map(|&i| self.splits.tasks[i].clone()).collect())
            .unwrap_or_default();
        if tasks.is_empty() {
            return Ok(empty_stream(schema));
        }
        let rows = self
            .splits
            .read(
                tasks,
                Arc::clone(&self.read_schema),
                context.session_config().batch_size(),
            )
            .map_err(lake_error)?;
        let out = Arc::clone(&schema);
        let batches = rows
            .map_err(lake_error)
            .map(move |b| as_plan_batch(&out, &b?));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            batches.boxed(),
        )))
    }
}
