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
use datafusion::catalog::TableProvider as _;
use datafusion::common::ScalarValue;
use datafusion::datasource::sink::DataSink;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Cast, Expr, ExprSchemable as _, LogicalPlan, TryCast, WriteOp};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use futures::StreamExt as _;
use mink_client::{Client, TableDescription};

/// The refusal of a write setting `column`, the auto-increment column of `table`.
pub(crate) fn generated(column: &str, table: &str, statement: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "column {column} of {table} is auto-increment: the nodes generate its values, so {statement} may not set it (leave it out)"
    ))
}

/// The refusal of a write giving `column` of `table` (NOT NULL) no value or NULL.
fn not_null(d: &TableDescription, column: &str, what: &str) -> DataFusionError {
    let key = if d.primary_key.iter().any(|k| k == column) {
        " (a key column)"
    } else {
        ""
    };
    DataFusionError::Plan(format!(
        "column {column} of {}.{} is NOT NULL{key}: the INSERT gives it {what}",
        d.database, d.table
    ))
}

/// Writes rows into a table.
#[derive(Debug)]
pub struct MinkSink {
    client: Client,
    description: TableDescription,
    /// The table's columns.
    table_schema: SchemaRef,
    /// What the sink takes: the table's columns, each nullable, so that a null where the table
    /// refuses one reaches [`MinkSink::write_all`], which names the column.
    schema: SchemaRef,
    /// The auto-increment column (its index): left out of what is written.
    generated: Option<usize>,
}

impl MinkSink {
    /// A sink writing rows of `schema` (the table's columns) into the table `description`
    /// describes.
    pub fn new(client: Client, description: TableDescription, schema: SchemaRef) -> Self {
        let nullable = Arc::new(mink_log::codec::all_nullable(&schema));
        let generated = description
            .auto_increment_column()
            .and_then(|c| schema.index_of(&c).ok());
        MinkSink {
            client,
            description,
            table_schema: schema,
            schema: nullable,
            generated,
        }
    }

    /// `batch` as the table's columns, checked: no null where the table refuses one, nothing
    /// in the auto-increment column (which is left out: the nodes fill it).
    fn checked(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let d = &self.description;
        for (i, f) in self.table_schema.fields().iter().enumerate() {
            let nulls = batch.column(i).null_count();
            if Some(i) == self.generated {
                if nulls < batch.num_rows() {
                    return Err(generated(
                        f.name(),
                        &format!("{}.{}", d.database, d.table),
                        "an INSERT",
                    ));
                }
            } else if !f.is_nullable() && nulls > 0 {
                return Err(not_null(d, f.name(), "NULL"));
            }
        }
        let kept: Vec<usize> = (0..self.table_schema.fields().len())
            .filter(|i| Some(*i) != self.generated)
            .collect();
        let schema = Arc::new(self.table_schema.project(&kept)?);
        // As the table's schema (the plan's may differ in nullability only).
        Ok(RecordBatch::try_new(
            schema,
            batch.project(&kept)?.columns().to_vec(),
        )?)
    }
}

impl DisplayAs for MinkSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MinkSink: table={}.{}",
            self.description.database, self.description.table
        )
    }
}

/// A write that failed part way, its client error kept (a frontend maps its code: a row the
/// writer refused is the statement's fault, a node that cannot be reached is retriable).
#[derive(Debug)]
struct Stopped {
    statement: String,
    rows: u64,
    source: mink_client::ClientError,
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} stopped after {} rows were stored: {}",
            self.statement, self.rows, self.source
        )
    }
}

impl std::error::Error for Stopped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
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
        let (database, table) = (&self.description.database, &self.description.table);
        let mut writer = self.client.writer(database, table);
        let mut rows = 0u64;
        // A statement that fails part-way (a null from its SELECT, a cast that fails in a
        // later batch) says how many rows it stored before: a retry would store them again.
        let stopped = |rows: u64, e: DataFusionError| {
            if rows == 0 {
                e
            } else {
                e.context(format!(
                    "INSERT INTO {database}.{table} stopped after {rows} rows were stored"
                ))
            }
        };
        while let Some(batch) = data.next().await {
            let batch = batch.map_err(|e| stopped(rows, e))?;
            if batch.num_rows() == 0 {
                continue;
            }
            let batch = self.checked(&batch).map_err(|e| stopped(rows, e))?;
            writer.write(&batch).await.map_err(|source| {
                DataFusionError::External(Box::new(Stopped {
                    statement: format!("INSERT INTO {database}.{table}"),
                    rows,
                    source,
                }))
            })?;
            rows += batch.num_rows() as u64;
        }
        Ok(rows)
    }
}

/// Refuses, when it is planned, an `INSERT` into a Mink table that gives a NOT NULL column no
/// value (it is not named) or a `NULL` in its `VALUES`, or gives the auto-increment column a
/// value: DataFusion would fail it later without naming the column. What only running the
/// statement shows (nulls from a `SELECT`, parameters) is checked as its rows are written.
pub fn refuse_missing_values(plan: &LogicalPlan) -> Result<()> {
    let LogicalPlan::Dml(dml) = plan else {
        return Ok(());
    };
    let (WriteOp::Insert(_), LogicalPlan::Projection(top)) = (&dml.op, dml.input.as_ref()) else {
        return Ok(());
    };
    let provider = datafusion::datasource::source_as_provider(&dml.target)?;
    let Some(table) = provider.as_any().downcast_ref::<crate::table::MinkTable>() else {
        return Ok(());
    };
    let d = table.description();
    let schema = table.schema();
    let generated_column = d.auto_increment_column();
    let values = match top.input.as_ref() {
        LogicalPlan::Values(v) => Some(v),
        _ => None,
    };
    for e in &top.expr {
        let Expr::Alias(alias) = e else {
            continue;
        };
        let column = alias.name.as_str();
        let Ok(field) = schema.field_with_name(column) else {
            continue;
        };
        // The cells of the `VALUES` column it comes from; none for a column left out.
        let cells: Option<Vec<&Expr>> = match uncast(&alias.expr) {
            Expr::Literal(v, _) if v.is_null() => Some(vec![]),
            Expr::Column(c) => values.and_then(|v| {
                let i = top.input.schema().index_of_column(c).ok()?;
                v.values.iter().map(|row| row.get(i)).collect()
            }),
            _ => None,
        };
        let null = |e: &&Expr| matches!(uncast(e), Expr::Literal(v, _) if v.is_null());
        if generated_column.as_deref() == Some(column) {
            if !cells.is_some_and(|c| c.iter().all(null)) {
                return Err(generated(
                    column,
                    &format!("{}.{}", d.database, d.table),
                    "an INSERT",
                ));
            }
        } else if !field.is_nullable() {
            match cells {
                Some(c) if c.is_empty() => return Err(not_null(d, column, "no value")),
                Some(c) if c.iter().any(null) => return Err(not_null(d, column, "NULL")),
                _ => {}
            }
        }
    }
    Ok(())
}

/// `e` without the casts around it.
fn uncast(mut e: &Expr) -> &Expr {
    while let Expr::Cast(Cast { expr, .. }) | Expr::TryCast(TryCast { expr, .. }) = e {
        e = expr;
    }
    e
}

/// Refuses an `INSERT` or `UPDATE` whose value would lose its fraction going into an integer column
/// (`1.5` into a `BIGINT`) or decimal places going into a decimal one (`1.23456` into a
/// `DECIMAL(12, 3)`): DataFusion casts each value to its column's type, and the cast truncates
/// or rounds. The casts it adds are at the top of the statement's input (in the `VALUES`
/// cells for a `VALUES` list); a cast written inside the `SELECT` is the user's and stands.
pub fn refuse_lossy_values(plan: &LogicalPlan) -> Result<()> {
    let LogicalPlan::Dml(dml) = plan else {
        return Ok(());
    };
    let (WriteOp::Insert(_) | WriteOp::Update, LogicalPlan::Projection(top)) =
        (&dml.op, dml.input.as_ref())
    else {
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
                let value = behind(expr, top.input.as_ref());
                check(column, value, &expr.get_type(input)?, data_type)?;
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

/// What a column of `input` is, when `input` projects it from one expression (the literals of
/// `INSERT ... SELECT 1, 2`); else `e`.
fn behind<'a>(e: &'a Expr, input: &'a LogicalPlan) -> &'a Expr {
    if let (Expr::Column(c), LogicalPlan::Projection(p)) = (uncast(e), input)
        && let Ok(i) = p.schema.index_of_column(c)
        && let Some(projected) = p.expr.get(i)
    {
        return match projected {
            Expr::Alias(a) => a.expr.as_ref(),
            e => e,
        };
    }
    e
}

/// Refuses `value` (of type `from`) going into `column` (of type `to`) where the conversion
/// would change it: a fraction into an integer, more decimal places than the column keeps,
/// a number into a boolean, a literal out of range or not a value of the type.
fn check(column: &str, value: &Expr, from: &DataType, to: &DataType) -> Result<()> {
    let fractional = from.is_floating() || scale(from).is_some_and(|s| s > 0);
    let literal = match uncast(value) {
        Expr::Literal(v, _) if !v.is_null() => Some(v),
        _ => None,
    };
    // A column by its name (an ingest's rows are an internal table whose name means nothing
    // to the user).
    let shown = match (literal, uncast(value)) {
        (Some(v), _) => show(v),
        (None, Expr::Column(c)) => format!("column {}", c.name),
        (None, e) => e.to_string(),
    };
    if fractional && to.is_integer() {
        return Err(DataFusionError::Plan(format!(
            "column {column} is {to} and {shown} is {from}: a value of another type is refused, not truncated (CAST(value AS {to}) truncates)"
        )));
    }
    if from.is_numeric() && *to == DataType::Boolean {
        return Err(DataFusionError::Plan(format!(
            "column {column} is Boolean and {shown} is {from}: a number is not a boolean (write true or false, or a condition)"
        )));
    }
    // A literal the planner casts itself (`1e3` is Utf8 '1e3' cast to Float64): its value as
    // the type it is used at, or the string went into the column's cast ('1e3' is no
    // decimal string) and was reported out of range.
    let typed = literal
        .filter(|v| v.data_type() != *from)
        .and_then(|v| v.cast_to(from).ok());
    let Some(v) = typed.as_ref().or(literal) else {
        // A column or expression of floating-point numbers into a decimal (a DOUBLE column,
        // an ingest's float64 column): each value would be rounded to the column's places.
        if from.is_floating() && to.is_decimal() {
            return Err(DataFusionError::Plan(format!(
                "column {column} is {to} and {shown} is {from}: floating-point values are refused, not rounded to its decimal places (CAST(value AS {to}) rounds)"
            )));
        }
        // A column of more decimal places (DECIMAL(12, 3) into DECIMAL(10, 2)): each value
        // would be rounded.
        if let (Some(places), Some(kept)) = (scale(from), scale(to))
            && places > kept
        {
            return Err(DataFusionError::Plan(format!(
                "column {column} is {to} and {shown} is {from}: values with more decimal places are refused, not rounded (CAST(value AS {to}) rounds)"
            )));
        }
        return Ok(());
    };
    // A value its column cannot hold (a number too large, 'x' for a number, 'notadate' for a
    // timestamp): DataFusion's cast error, raised as the optimizer folds the cast, names
    // neither the column nor its type.
    match v.cast_to(to) {
        Err(e) => Err(DataFusionError::Plan(
            if from.is_numeric() && to.is_numeric() {
                format!("column {column} is {to}, and {shown} is out of its range")
            } else {
                format!("column {column} is {to}, and {shown} is not a value of it ({e})")
            },
        )),
        // More decimal places than the column keeps (1.23456 into a DECIMAL(12, 3)): refused,
        // as `mink produce` and a bound parameter refuse it, not rounded.
        Ok(cast) if !exactly(v, &cast) => Err(DataFusionError::Plan(format!(
            "column {column} is {to}, and {shown} is not exactly a value of it: it is refused, not rounded (CAST(value AS {to}) rounds)"
        ))),
        Ok(_) => Ok(()),
    }
}

/// The decimal places of a decimal type.
fn scale(t: &DataType) -> Option<i8> {
    match t {
        DataType::Decimal32(_, s)
        | DataType::Decimal64(_, s)
        | DataType::Decimal128(_, s)
        | DataType::Decimal256(_, s) => Some(*s),
        _ => None,
    }
}

/// Whether `cast`, a number `v` cast to an integer or decimal type, is `v` exactly (a cast
/// rounds or truncates what its type cannot hold).
pub(crate) fn exactly(v: &ScalarValue, cast: &ScalarValue) -> bool {
    let (from, to) = (v.data_type(), cast.data_type());
    let rounds = (to.is_integer() || to.is_decimal()) && (from.is_floating() || from.is_decimal());
    !rounds || cast.cast_to(&from).ok().as_ref() == Some(v)
}

/// A value as a statement writes it (`1.5`, `'x'`, `2026-01-01T00:00:00`), for messages:
/// DataFusion shows a decimal as `Some(15),2,1`.
pub(crate) fn show(v: &ScalarValue) -> String {
    match v {
        ScalarValue::Utf8(Some(t))
        | ScalarValue::LargeUtf8(Some(t))
        | ScalarValue::Utf8View(Some(t)) => format!("'{t}'"),
        v => v
            .to_array()
            .ok()
            .and_then(|a| arrow::util::display::array_value_to_string(&a, 0).ok())
            .unwrap_or_else(|| v.to_string()),
    }
}
