//! `UPDATE` and `DELETE` on primary-key tables: the rows the statement's filters select are
//! read at the statement's cut, then written back through an idempotent writer — as upserts
//! with the assignments applied, or as deletes of their keys.
//!
//! Like `INSERT INTO`, a statement is not atomic across buckets: rows changed by others
//! between the read and the write are overwritten with what the statement computed from the
//! rows it read (the last write of a key wins), and a statement that fails part-way leaves
//! the batches written before the failure.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray as _, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::compute::{CastOptions, and, cast_with_options, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::{Transformed, TreeNode as _};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use mink_client::Client;

/// `DELETE FROM t AS a WHERE a.c = ...` as `DELETE FROM t WHERE c = ...`: DataFusion plans a
/// DELETE's WHERE against the table's own name and refused the alias ("No field named a.c"),
/// where PostgreSQL takes it (UPDATE's alias DataFusion plans itself).
pub(crate) fn unalias_delete(statement: &mut datafusion::sql::parser::Statement) {
    use datafusion::sql::sqlparser::ast::{
        Expr as SqlExpr, FromTable, Statement, TableFactor, visit_expressions_mut,
    };
    let s = match statement {
        datafusion::sql::parser::Statement::Statement(s) => s,
        datafusion::sql::parser::Statement::Explain(e) => return unalias_delete(&mut e.statement),
        _ => return,
    };
    let Statement::Delete(delete) = s.as_mut() else {
        return;
    };
    let (FromTable::WithFromKeyword(tables) | FromTable::WithoutKeyword(tables)) = &mut delete.from;
    let [table] = tables.as_mut_slice() else {
        return;
    };
    if !table.joins.is_empty() {
        return;
    }
    let TableFactor::Table { alias, .. } = &mut table.relation else {
        return;
    };
    let Some(a) = alias.take() else {
        return;
    };
    let Some(selection) = delete.selection.as_mut() else {
        return;
    };
    let alias = crate::ddl::normalized(&a.name);
    let _ = visit_expressions_mut(selection, |e| {
        if let SqlExpr::CompoundIdentifier(parts) = e
            && parts.len() == 2
            && crate::ddl::normalized(&parts[0]) == alias
        {
            *e = SqlExpr::Identifier(parts[1].clone());
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// The column a primary-key table's writes carry their kind in.
const ROW_KIND: &str = "_row_kind";

/// `filters` without table qualifiers (the provider's schema has none).
fn unqualified(filters: Vec<Expr>) -> Result<Vec<Expr>> {
    filters
        .into_iter()
        .map(|f| {
            f.transform_up(|e| {
                Ok(match e {
                    Expr::Column(c) if c.relation.is_some() => {
                        Transformed::yes(Expr::Column(c.name.into()))
                    }
                    other => Transformed::no(other),
                })
            })
            .map(|t| t.data)
        })
        .collect()
}

/// The rows of `rows` that every test (a filter, planned) holds for.
fn selected(tests: &[Arc<dyn PhysicalExpr>], rows: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    for batch in rows {
        let mut mask = None;
        for t in tests {
            let hit = t.evaluate(&batch)?.into_array(batch.num_rows())?;
            let hit = hit
                .as_boolean_opt()
                .cloned()
                .ok_or_else(|| DataFusionError::Plan("a filter that is not a condition".into()))?;
            mask = Some(match mask {
                None => hit,
                Some(m) => and(&m, &hit)?,
            });
        }
        let batch = match mask {
            Some(m) => filter_record_batch(&batch, &m)?,
            None => batch,
        };
        if batch.num_rows() > 0 {
            out.push(batch);
        }
    }
    Ok(out)
}

/// `filters` planned against `schema`.
fn tests(
    state: &dyn Session,
    schema: &SchemaRef,
    filters: Vec<Expr>,
) -> Result<Vec<Arc<dyn PhysicalExpr>>> {
    let df_schema = DFSchema::try_from(Arc::clone(schema))?;
    unqualified(filters)?
        .into_iter()
        .map(|f| state.create_physical_expr(f, &df_schema))
        .collect()
}

/// What a statement does to the rows it selects.
#[derive(Clone, Debug)]
enum Change {
    Delete,
    /// Each assigned column's index and its value.
    Update(Vec<(usize, Arc<dyn PhysicalExpr>)>),
}

/// An `UPDATE` or `DELETE` as a plan that makes its change when executed, answering one row
/// (`count`): planning it (`EXPLAIN`, a prepared statement) reads and writes nothing.
#[derive(Clone)]
struct WriteBack {
    client: Client,
    database: String,
    table: String,
    /// The table's rows at the statement's cut, where the filters may select.
    current: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    tests: Vec<Arc<dyn PhysicalExpr>>,
    change: Change,
    /// The auto-increment column, which writes leave out (a key keeps its value).
    generated: Option<String>,
}

impl std::fmt::Debug for WriteBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBack")
            .field("table", &format!("{}.{}", self.database, self.table))
            .field("change", &self.change)
            .finish_non_exhaustive()
    }
}

impl WriteBack {
    fn plan(self) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(StreamingTableExec::try_new(
            Arc::clone(count_schema()),
            vec![Arc::new(self) as Arc<dyn PartitionStream>],
            None,
            Vec::<LexOrdering>::new(),
            false,
            None,
        )?))
    }

    /// Reads the selected rows, changes them, writes them back; the rows written.
    async fn run(&self, context: Arc<TaskContext>) -> Result<u64> {
        let rows = datafusion::physical_plan::collect(Arc::clone(&self.current), context).await?;
        let rows = selected(&self.tests, rows)?;
        let generated = self.generated.as_deref();
        let batches = match &self.change {
            Change::Delete => without(generated, rows)?
                .iter()
                .map(|b| {
                    let kinds = StringArray::from(vec!["delete"; b.num_rows()]);
                    let field = Field::new(ROW_KIND, DataType::Utf8, false);
                    Ok(mink_log::codec::with_column(b, field, Arc::new(kinds))?)
                })
                .collect::<Result<Vec<_>>>()?,
            Change::Update(assignments) => {
                let updated = rows
                    .iter()
                    .map(|b| {
                        let mut columns = b.columns().to_vec();
                        for (index, e) in assignments {
                            let value = e.evaluate(b)?.into_array(b.num_rows())?;
                            // A value out of the column's range fails the statement; the
                            // default cast would make it null.
                            columns[*index] = cast_with_options(
                                &value,
                                self.schema.field(*index).data_type(),
                                &CastOptions {
                                    safe: false,
                                    ..CastOptions::default()
                                },
                            )?;
                        }
                        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                without(generated, updated)?
            }
        };
        write(&self.client, (&self.database, &self.table), &batches).await
    }
}

impl PartitionStream for WriteBack {
    fn schema(&self) -> &SchemaRef {
        count_schema()
    }

    fn execute(&self, context: Arc<TaskContext>) -> SendableRecordBatchStream {
        let this = self.clone();
        let counted = async move {
            let rows = this.run(context).await?;
            Ok(RecordBatch::try_new(
                Arc::clone(count_schema()),
                vec![Arc::new(UInt64Array::from(vec![rows])) as ArrayRef],
            )?)
        };
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(count_schema()),
            futures::stream::once(counted),
        ))
    }
}

/// The one column a statement's answer has.
fn count_schema() -> &'static SchemaRef {
    static SCHEMA: std::sync::OnceLock<SchemaRef> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        Arc::new(Schema::new(vec![Field::new(
            "count",
            DataType::UInt64,
            false,
        )]))
    })
}

/// `batches` without the column `generated` (the auto-increment column, which writes leave
/// out: a key keeps its value).
fn without(generated: Option<&str>, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    let Some(column) = generated else {
        return Ok(batches);
    };
    batches
        .into_iter()
        .map(|b| {
            let kept: Vec<usize> = (0..b.num_columns())
                .filter(|&i| b.schema().field(i).name() != column)
                .collect();
            Ok(b.project(&kept)?)
        })
        .collect()
}

/// Writes `batches` to `database.table`; returns the rows written.
async fn write(
    client: &Client,
    (database, table): (&str, &str),
    batches: &[RecordBatch],
) -> Result<u64> {
    let mut writer = client.writer(database, table);
    let mut rows = 0u64;
    for b in batches {
        writer.write(b).await.map_err(|e| {
            DataFusionError::Execution(format!(
                "{database}.{table}: stopped after {rows} rows were written: {e}"
            ))
        })?;
        rows += b.num_rows() as u64;
    }
    Ok(rows)
}

/// `DELETE FROM t WHERE filters`: the selected rows' keys deleted, when the plan runs.
pub(crate) fn delete(
    state: &dyn Session,
    client: &Client,
    name: (&str, &str),
    current: (Arc<dyn ExecutionPlan>, SchemaRef),
    generated: Option<&str>,
    filters: Vec<Expr>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let (current, schema) = current;
    WriteBack {
        client: client.clone(),
        database: name.0.to_string(),
        table: name.1.to_string(),
        tests: tests(state, &schema, filters)?,
        current,
        schema,
        change: Change::Delete,
        generated: generated.map(str::to_string),
    }
    .plan()
}

/// `UPDATE t SET assignments WHERE filters`: the selected rows, assignments applied, upserted
/// when the plan runs.
/// The key cannot change (that is a delete and an insert), nor can the auto-increment column
/// `generated` (which the rows are written without: a key keeps its value).
pub(crate) fn update(
    state: &dyn Session,
    client: &Client,
    name: (&str, &str),
    current: (Arc<dyn ExecutionPlan>, SchemaRef),
    (key, generated): (&[String], Option<&str>),
    assignments: Vec<(String, Expr)>,
    filters: Vec<Expr>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let (plan, schema) = current;
    if let Some((column, _)) = assignments.iter().find(|(c, _)| key.contains(c)) {
        return Err(DataFusionError::Plan(format!(
            "{}.{}: {column} is part of the primary key, which UPDATE cannot change: delete the row and insert it",
            name.0, name.1
        )));
    }
    if let Some((column, _)) = assignments
        .iter()
        .find(|(c, _)| Some(c.as_str()) == generated)
    {
        return Err(crate::insert::generated(
            column,
            &format!("{}.{}", name.0, name.1),
            "an UPDATE",
        ));
    }
    let df_schema = DFSchema::try_from(Arc::clone(&schema))?;
    let assignments = assignments
        .into_iter()
        .map(|(column, e)| {
            let index = schema.index_of(&column)?;
            let e = unqualified(vec![e])?.pop().expect("one expression");
            Ok((index, state.create_physical_expr(e, &df_schema)?))
        })
        .collect::<Result<Vec<_>>>()?;
    WriteBack {
        client: client.clone(),
        database: name.0.to_string(),
        table: name.1.to_string(),
        tests: tests(state, &schema, filters)?,
        current: plan,
        schema,
        change: Change::Update(assignments),
        generated: generated.map(str::to_string),
    }
    .plan()
}
