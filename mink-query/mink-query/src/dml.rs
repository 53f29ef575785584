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
use datafusion::arrow::compute::{and, cast, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::common::tree_node::{Transformed, TreeNode as _};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use mink_client::Client;

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

/// The rows of `rows` (batches of `schema`) that every filter holds for.
fn selected(
    state: &dyn Session,
    schema: &SchemaRef,
    filters: &[Expr],
    rows: Vec<RecordBatch>,
) -> Result<Vec<RecordBatch>> {
    let df_schema = DFSchema::try_from(Arc::clone(schema))?;
    let tests = filters
        .iter()
        .map(|f| state.create_physical_expr(f.clone(), &df_schema))
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::new();
    for batch in rows {
        let mut mask = None;
        for t in &tests {
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

/// A plan answering one row: `count` = `rows`.
fn count(rows: u64) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![Arc::new(UInt64Array::from(vec![rows])) as ArrayRef],
    )?;
    Ok(MemorySourceConfig::try_new_exec(&[vec![batch]], schema, None)? as _)
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

/// `DELETE FROM t WHERE filters`: the selected rows' keys deleted.
pub(crate) async fn delete(
    state: &dyn Session,
    client: &Client,
    name: (&str, &str),
    current: (Arc<dyn ExecutionPlan>, SchemaRef),
    generated: Option<&str>,
    filters: Vec<Expr>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let (plan, schema) = current;
    let rows = datafusion::physical_plan::collect(plan, state.task_ctx()).await?;
    let rows = without(
        generated,
        selected(state, &schema, &unqualified(filters)?, rows)?,
    )?;
    let deletes = rows
        .iter()
        .map(|b| {
            let mut columns = b.columns().to_vec();
            columns.push(Arc::new(StringArray::from(vec!["delete"; b.num_rows()])));
            let mut fields: Vec<Field> = b
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(Field::new(ROW_KIND, DataType::Utf8, false));
            Ok(RecordBatch::try_new(
                Arc::new(Schema::new(fields)),
                columns,
            )?)
        })
        .collect::<Result<Vec<_>>>()?;
    count(write(client, name, &deletes).await?)
}

/// `UPDATE t SET assignments WHERE filters`: the selected rows, assignments applied, upserted.
/// The key cannot change (that is a delete and an insert), nor can the auto-increment column
/// `generated` (which the rows are written without: a key keeps its value).
pub(crate) async fn update(
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
    let rows = datafusion::physical_plan::collect(plan, state.task_ctx()).await?;
    let rows = selected(state, &schema, &unqualified(filters)?, rows)?;
    let updated = rows
        .iter()
        .map(|b| {
            let mut columns = b.columns().to_vec();
            for (index, e) in &assignments {
                let value = e.evaluate(b)?.into_array(b.num_rows())?;
                columns[*index] = cast(&value, schema.field(*index).data_type())?;
            }
            Ok(RecordBatch::try_new(Arc::clone(&schema), columns)?)
        })
        .collect::<Result<Vec<_>>>()?;
    count(write(client, name, &without(generated, updated)?).await?)
}
