//! How the statement's number literals are typed. `parse_float_as_decimal` makes `99999999.99`
//! that exact decimal (a DECIMAL column stores and matches it); these keep the places where
//! PostgreSQL reads a number as a DOUBLE reading it so.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode as _};
use datafusion::common::{DFSchema, DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::expr::{Between, BinaryExpr, InList};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::{Expr, ExprSchemable as _, LogicalPlan, Operator};
use datafusion::optimizer::AnalyzerRule;

/// Makes each literal in scientific notation (`1e3`, `2.5E-7`) a DOUBLE, as PostgreSQL and
/// DataFusion's default read it: with `parse_float_as_decimal` (kept for exact decimal
/// literals) `1e3` was `Decimal128(1, -3)`, whose negative scale Polars and pyarrow cannot
/// read, and `1e300` no decimal at all. The number's text is cast, so no digit is lost first.
pub(crate) fn scientific_as_double(statement: &mut datafusion::sql::parser::Statement) {
    use datafusion::sql::sqlparser::ast::{
        CastKind, DataType as SqlType, ExactNumberInfo, Expr, Value, visit_expressions_mut,
    };
    let datafusion::sql::parser::Statement::Statement(s) = statement else {
        return;
    };
    let _ = visit_expressions_mut(s.as_mut(), |e| {
        if let Expr::Value(v) = e
            && let Value::Number(n, _) = &v.value
            && n.contains(['e', 'E'])
        {
            let text = Value::SingleQuotedString(n.clone()).with_span(v.span);
            *e = Expr::Cast {
                kind: CastKind::Cast,
                expr: Box::new(Expr::Value(text)),
                data_type: SqlType::Double(ExactNumberInfo::None),
                array: false,
                format: None,
            };
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// A decimal literal beside a FLOAT or DOUBLE operand (`f > 0.5`, `f BETWEEN 0.1 AND 0.2`,
/// `f IN (0.5, 1.5)`, `f * 0.5`) becomes the nearest DOUBLE, as PostgreSQL's `float8 > numeric`
/// compares in float8. DataFusion would cast the float column to `Decimal128(30, 15)`
/// instead: `f > 0.0` missed 1e-20, `f = 0.3` matched 0.30000000000000004, and a NaN,
/// an infinity or a value from 1e15 up failed the whole query. Runs before type coercion.
#[derive(Debug, Default)]
pub(crate) struct FloatOperands;

impl AnalyzerRule for FloatOperands {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_expressions(plan, |e, schema| Ok(doubles(e, schema)))
    }

    fn name(&self) -> &str {
        "mink_float_operands"
    }
}

/// `plan` with `rewrite` applied to every expression, bottom up, in every node and subquery
/// (typed against the node's inputs), names kept; the schemas recomputed where it changed one.
fn rewrite_expressions(
    plan: LogicalPlan,
    rewrite: impl Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|plan| {
        let schema = merge_schema(&plan.inputs());
        let names = NamePreserver::new(&plan);
        let rewritten = plan.map_expressions(|e| {
            let name = names.save(&e);
            Ok(e.transform_up(|e| rewrite(e, &schema))?
                .update_data(|e| name.restore(e)))
        })?;
        if rewritten.transformed {
            rewritten.map_data(LogicalPlan::recompute_schema)
        } else {
            Ok(rewritten)
        }
    })
    .map(|t| t.data)
}

/// `e` with the decimal literals beside its float operand as DOUBLEs.
fn doubles(e: Expr, schema: &DFSchema) -> Transformed<Expr> {
    // An expression whose type is unknown here (an outer column) is left alone.
    let float = |e: &Expr| e.get_type(schema).is_ok_and(|t| t.is_floating());
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) if float(&left) || float(&right) => {
            let (left, l) = as_double(*left);
            let (right, r) = as_double(*right);
            let e = Expr::BinaryExpr(BinaryExpr::new(Box::new(left), op, Box::new(right)));
            Transformed::new_transformed(e, l || r)
        }
        Expr::Between(b) if float(&b.expr) => {
            let (low, l) = as_double(*b.low);
            let (high, h) = as_double(*b.high);
            let e = Expr::Between(Between::new(
                b.expr,
                b.negated,
                Box::new(low),
                Box::new(high),
            ));
            Transformed::new_transformed(e, l || h)
        }
        Expr::InList(l) if float(&l.expr) => {
            let mut any = false;
            let list = l
                .list
                .into_iter()
                .map(|item| {
                    let (item, changed) = as_double(item);
                    any |= changed;
                    item
                })
                .collect();
            let e = Expr::InList(InList::new(l.expr, list, l.negated));
            Transformed::new_transformed(e, any)
        }
        e => Transformed::no(e),
    }
}

/// A decimal literal (or its negation) as the DOUBLE nearest its text; anything else as is.
fn as_double(e: Expr) -> (Expr, bool) {
    match e {
        Expr::Literal(v, meta) => match double(&v) {
            Some(x) => (Expr::Literal(ScalarValue::Float64(Some(x)), meta), true),
            None => (Expr::Literal(v, meta), false),
        },
        Expr::Negative(inner) => match *inner {
            Expr::Literal(v, meta) => match double(&v) {
                Some(x) => (Expr::Literal(ScalarValue::Float64(Some(-x)), meta), true),
                None => (Expr::Negative(Box::new(Expr::Literal(v, meta))), false),
            },
            other => (Expr::Negative(Box::new(other)), false),
        },
        e => (e, false),
    }
}

fn double(v: &ScalarValue) -> Option<f64> {
    if !v.data_type().is_decimal() || v.is_null() {
        return None;
    }
    crate::insert::show(v).parse().ok()
}

/// A quoted literal compared with a number (`n < '20'`, `x = '5'`, `n BETWEEN '2' AND '50'`,
/// `n IN ('1', '2')`) becomes a value of the number's type, as PostgreSQL reads an untyped
/// literal as its operand's type; one that is no such value (`n = 'abc'`) fails the statement.
/// DataFusion would compare them as text instead: `n < '20'` held for 100 and not for 5.
/// Runs before type coercion.
#[derive(Debug, Default)]
pub(crate) struct TextOperands;

impl AnalyzerRule for TextOperands {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_expressions(plan, typed)
    }

    fn name(&self) -> &str {
        "mink_text_operands"
    }
}

/// `e` with the text literals compared with its numeric operand as values of that type.
fn typed(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    // An expression whose type is unknown here (an outer column) is left alone.
    let numeric = |e: &Expr| e.get_type(schema).ok().filter(DataType::is_numeric);
    let compares = |op: &Operator| {
        matches!(
            op,
            Operator::Eq
                | Operator::NotEq
                | Operator::Lt
                | Operator::LtEq
                | Operator::Gt
                | Operator::GtEq
                | Operator::IsDistinctFrom
                | Operator::IsNotDistinctFrom
        )
    };
    Ok(match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) if compares(&op) => {
            let (left, right, changed) = match (numeric(&left), numeric(&right)) {
                (Some(t), None) => {
                    let (r, changed) = as_value(*right, &t, &left)?;
                    (*left, r, changed)
                }
                (None, Some(t)) => {
                    let (l, changed) = as_value(*left, &t, &right)?;
                    (l, *right, changed)
                }
                _ => (*left, *right, false),
            };
            let e = Expr::BinaryExpr(BinaryExpr::new(Box::new(left), op, Box::new(right)));
            Transformed::new_transformed(e, changed)
        }
        Expr::Between(b) => match numeric(&b.expr) {
            Some(t) => {
                let (low, l) = as_value(*b.low, &t, &b.expr)?;
                let (high, h) = as_value(*b.high, &t, &b.expr)?;
                let e = Expr::Between(Between::new(
                    b.expr,
                    b.negated,
                    Box::new(low),
                    Box::new(high),
                ));
                Transformed::new_transformed(e, l || h)
            }
            None => Transformed::no(Expr::Between(b)),
        },
        Expr::InList(l) => match numeric(&l.expr) {
            Some(t) => {
                let mut any = false;
                let list = l
                    .list
                    .into_iter()
                    .map(|item| {
                        let (item, changed) = as_value(item, &t, &l.expr)?;
                        any |= changed;
                        Ok(item)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let e = Expr::InList(InList::new(l.expr, list, l.negated));
                Transformed::new_transformed(e, any)
            }
            None => Transformed::no(Expr::InList(l)),
        },
        e => Transformed::no(e),
    })
}

/// A text literal as a value of `t` (the type of `operand`); anything else as is.
fn as_value(e: Expr, t: &DataType, operand: &Expr) -> Result<(Expr, bool)> {
    let Expr::Literal(v, meta) = e else {
        return Ok((e, false));
    };
    let Some(Some(text)) = v.try_as_str() else {
        return Ok((Expr::Literal(v, meta), false));
    };
    // A decimal column's literal keeps its own places (the column's type would round
    // '1.2345' to 1.235, or fail on a number above its precision): coercion widens both.
    let text = text.trim();
    let places = text
        .split_once('.')
        .map_or(0, |(_, f)| f.len())
        .try_into()
        .unwrap_or(i8::MAX);
    let wide;
    let t = match t {
        DataType::Decimal32(_, s) | DataType::Decimal64(_, s) | DataType::Decimal128(_, s)
            if !text.contains(['e', 'E']) && places <= 38 =>
        {
            wide = DataType::Decimal128(38, (*s).max(places));
            &wide
        }
        t => t,
    };
    let value = v.cast_to(t).map_err(|_| {
        DataFusionError::Plan(format!(
            "{} is not a value of {t}, the type of {operand}",
            crate::insert::show(&v)
        ))
    })?;
    Ok((Expr::Literal(value, meta), true))
}

/// A timestamp without a zone (or text) becoming one with a zone other than UTC is read as UTC, the
/// session's zone, as PostgreSQL reads a `timestamp` becoming a `timestamptz`: Arrow's cast
/// reads it as a wall time in the target zone, so `TIMESTAMP '2024-01-01 00:00:00'` into a
/// Europe/Berlin column was 2023-12-31T23:00Z, while `CAST(... AS TIMESTAMPTZ)` gave
/// 2024-01-01T00:00Z. Runs after type coercion, which adds the casts.
#[derive(Debug, Default)]
pub(crate) struct NaiveAsUtc;

impl AnalyzerRule for NaiveAsUtc {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_expressions(plan, |e, schema| Ok(via_utc(e, schema)))
    }

    fn name(&self) -> &str {
        "mink_naive_as_utc"
    }
}

/// `e`, a cast of a zoneless timestamp to a zone other than UTC, through UTC.
fn via_utc(e: Expr, schema: &DFSchema) -> Transformed<Expr> {
    use datafusion::logical_expr::{Cast, TryCast};
    let (expr, data_type, tried) = match e {
        Expr::Cast(Cast { expr, data_type }) => (expr, data_type, false),
        Expr::TryCast(TryCast { expr, data_type }) => (expr, data_type, true),
        e => return Transformed::no(e),
    };
    let cast = |expr, data_type| {
        if tried {
            Expr::TryCast(TryCast::new(expr, data_type))
        } else {
            Expr::Cast(Cast::new(expr, data_type))
        }
    };
    if !matches!(&data_type, DataType::Timestamp(_, Some(z)) if !is_utc(z)) {
        return Transformed::no(cast(expr, data_type));
    }
    match expr.get_type(schema) {
        Ok(DataType::Timestamp(unit, None)) => {
            let utc = cast(expr, DataType::Timestamp(unit, Some("UTC".into())));
            Transformed::yes(cast(Box::new(utc), data_type))
        }
        // Text ('2024-01-01 10:00:00' into or against a zoned column): Arrow reads a time
        // without an offset as a wall time in the target zone too; one with an offset keeps it.
        Ok(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
            let DataType::Timestamp(unit, _) = &data_type else {
                return Transformed::no(cast(expr, data_type));
            };
            let utc = cast(expr, DataType::Timestamp(*unit, Some("UTC".into())));
            Transformed::yes(cast(Box::new(utc), data_type))
        }
        _ => Transformed::no(cast(expr, data_type)),
    }
}

/// `v` cast to `to`, a zoneless timestamp or text read in UTC when `to` is in another zone, as
/// [`NaiveAsUtc`] reads them in a plan: for values bound to a prepared statement's parameters.
pub(crate) fn cast_value(
    v: &ScalarValue,
    to: &DataType,
    options: &arrow::compute::CastOptions<'static>,
) -> Result<ScalarValue> {
    if let DataType::Timestamp(unit, Some(zone)) = to
        && !is_utc(zone)
        && matches!(
            v.data_type(),
            DataType::Timestamp(_, None)
                | DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
        )
    {
        let utc = DataType::Timestamp(*unit, Some("UTC".into()));
        return v
            .cast_to_with_options(&utc, options)?
            .cast_to_with_options(to, options);
    }
    v.cast_to_with_options(to, options)
}

fn is_utc(zone: &str) -> bool {
    matches!(zone, "UTC" | "utc" | "+00:00" | "Z" | "Etc/UTC")
}
