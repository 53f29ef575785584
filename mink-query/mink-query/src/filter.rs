//! DataFusion filters as Mink read filters: the conjunctions a node can test (`column op
//! literal`, `in` lists, null tests) are pushed down; anything else stays with DataFusion.
//!
//! Pushed filters are `Inexact`: DataFusion tests them again above the scan, so a difference
//! in coercion between the two (an integer column against a float literal, say) can never
//! change a result, only how much the nodes prune.

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use mink_client::{Op, Predicate};

/// The Mink predicates equivalent to `expr` (a conjunction), or `None` if any part of it is
/// not one a node can test.
pub fn to_predicates(expr: &Expr) -> Option<Vec<Predicate>> {
    match expr {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::And,
            right,
        }) => {
            let mut all = to_predicates(left)?;
            all.extend(to_predicates(right)?);
            Some(all)
        }
        // `a = 1 OR a = 2` (what DataFusion makes of a short `in` list).
        Expr::BinaryExpr(BinaryExpr {
            op: Operator::Or, ..
        }) => {
            let (column, values) = one_of(expr)?;
            Some(vec![Predicate::new(column, Op::In { values })])
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (column, value, op) = match (left.as_ref(), right.as_ref()) {
                (Expr::Column(c), Expr::Literal(v, _)) => (c, v, *op),
                (Expr::Literal(v, _), Expr::Column(c)) => (c, v, op.swap()?),
                _ => return None,
            };
            let value = literal(value)?;
            let op = match op {
                Operator::Eq => Op::Eq { value },
                Operator::NotEq => Op::NotEq { value },
                Operator::Lt => Op::Lt { value },
                Operator::LtEq => Op::LtEq { value },
                Operator::Gt => Op::Gt { value },
                Operator::GtEq => Op::GtEq { value },
                _ => return None,
            };
            Some(vec![Predicate::new(column.name.clone(), op)])
        }
        Expr::InList(list) if !list.negated => {
            let Expr::Column(c) = list.expr.as_ref() else {
                return None;
            };
            let values = list
                .list
                .iter()
                .map(|e| match e {
                    Expr::Literal(v, _) => literal(v),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some(vec![Predicate::new(c.name.clone(), Op::In { values })])
        }
        Expr::IsNull(e) => match e.as_ref() {
            Expr::Column(c) => Some(vec![Predicate::new(c.name.clone(), Op::IsNull)]),
            _ => None,
        },
        Expr::IsNotNull(e) => match e.as_ref() {
            Expr::Column(c) => Some(vec![Predicate::new(c.name.clone(), Op::IsNotNull)]),
            _ => None,
        },
        _ => None,
    }
}

/// `expr` as "column is one of these values": equalities and `in` lists of one column joined
/// by `OR`.
fn one_of(expr: &Expr) -> Option<(String, Vec<serde_json::Value>)> {
    match expr {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => {
            let (column, mut values) = one_of(left)?;
            let (other, more) = one_of(right)?;
            (column == other).then(|| {
                values.extend(more);
                (column, values)
            })
        }
        _ => match to_predicates(expr)?.as_slice() {
            [
                Predicate {
                    column,
                    op: Op::Eq { value },
                },
            ] => Some((column.clone(), vec![value.clone()])),
            [
                Predicate {
                    column,
                    op: Op::In { values },
                },
            ] => Some((column.clone(), values.clone())),
            _ => None,
        },
    }
}

/// A literal as the JSON a Mink filter takes; `None` for null and for types the node's cast
/// from JSON would not read back exactly.
fn literal(v: &ScalarValue) -> Option<serde_json::Value> {
    use serde_json::Value as J;
    let number = |n: Option<serde_json::Number>| n.map(J::Number);
    match v {
        ScalarValue::Boolean(Some(b)) => Some(J::Bool(*b)),
        ScalarValue::Int8(Some(i)) => Some(J::from(*i)),
        ScalarValue::Int16(Some(i)) => Some(J::from(*i)),
        ScalarValue::Int32(Some(i)) => Some(J::from(*i)),
        ScalarValue::Int64(Some(i)) => Some(J::from(*i)),
        ScalarValue::UInt8(Some(i)) => Some(J::from(*i)),
        ScalarValue::UInt16(Some(i)) => Some(J::from(*i)),
        ScalarValue::UInt32(Some(i)) => Some(J::from(*i)),
        ScalarValue::UInt64(Some(i)) => Some(J::from(*i)),
        ScalarValue::Float32(Some(f)) => number(serde_json::Number::from_f64(f64::from(*f))),
        ScalarValue::Float64(Some(f)) => number(serde_json::Number::from_f64(*f)),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Some(J::String(s.clone())),
        // Its text (`2024-05-01`) casts back to the same value.
        ScalarValue::Date32(Some(_)) => Some(J::String(v.to_string())),
        // As RFC 3339 text (`Z` when the literal has a time zone: its value is UTC), which
        // casts to a column of any precision; only whole microseconds, which every column
        // the node compares at (the lake's `__timestamp` included) holds exactly.
        ScalarValue::TimestampSecond(Some(t), tz) => timestamp(i128::from(*t) * 1_000_000, tz),
        ScalarValue::TimestampMillisecond(Some(t), tz) => timestamp(i128::from(*t) * 1000, tz),
        ScalarValue::TimestampMicrosecond(Some(t), tz) => timestamp(i128::from(*t), tz),
        ScalarValue::TimestampNanosecond(Some(t), tz) if t % 1000 == 0 => {
            timestamp(i128::from(*t / 1000), tz)
        }
        _ => None,
    }
}

/// Microseconds since the epoch as the text of a timestamp literal.
fn timestamp(micros: i128, tz: &Option<std::sync::Arc<str>>) -> Option<serde_json::Value> {
    let micros = i64::try_from(micros).ok()?;
    let at = arrow::temporal_conversions::timestamp_us_to_datetime(micros)?;
    let text = at.format("%Y-%m-%dT%H:%M:%S%.6f").to_string();
    Some(serde_json::Value::String(if tz.is_some() {
        text + "Z"
    } else {
        text
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::{col, lit};

    #[allow(clippy::needless_pass_by_value)]
    fn json(e: Expr) -> Option<serde_json::Value> {
        to_predicates(&e).map(|p| serde_json::to_value(p).unwrap())
    }

    #[test]
    fn conjunctions_of_simple_tests_are_pushed() {
        assert_eq!(
            json(col("a").gt_eq(lit(5i64)).and(lit("x").eq(col("b")))),
            Some(serde_json::json!([
                {"column": "a", "op": ">=", "value": 5},
                {"column": "b", "op": "=", "value": "x"},
            ]))
        );
        // `5 < a` is `a > 5`.
        assert_eq!(
            json(lit(5i32).lt(col("a"))),
            Some(serde_json::json!([{"column": "a", "op": ">", "value": 5}]))
        );
        assert_eq!(
            json(col("a").in_list(vec![lit(1i64), lit(2i64)], false)),
            Some(serde_json::json!([{"column": "a", "op": "in", "values": [1, 2]}]))
        );
        assert_eq!(
            json(col("a").is_null()),
            Some(serde_json::json!([{"column": "a", "op": "is_null"}]))
        );
    }

    #[test]
    fn timestamps_are_pushed_as_their_text() {
        assert_eq!(
            json(col("t").gt_eq(lit(ScalarValue::TimestampMicrosecond(
                Some(1_796_083_200_000_001),
                Some("UTC".into())
            )))),
            Some(serde_json::json!([
                {"column": "t", "op": ">=", "value": "2026-12-01T00:00:00.000001Z"}
            ]))
        );
        assert_eq!(
            json(col("t").lt(lit(ScalarValue::TimestampNanosecond(
                Some(1_796_083_200_000_000_000),
                None
            )))),
            Some(serde_json::json!([
                {"column": "t", "op": "<", "value": "2026-12-01T00:00:00.000000"}
            ]))
        );
    }

    #[test]
    fn equalities_of_one_column_joined_by_or_are_an_in_list() {
        assert_eq!(
            json(col("a").eq(lit("x")).or(col("a").eq(lit("y")))),
            Some(serde_json::json!([{"column": "a", "op": "in", "values": ["x", "y"]}]))
        );
        assert_eq!(
            json(col("a").eq(lit(1i64)).or(col("b").eq(lit(1i64)))),
            None
        );
    }

    #[test]
    fn anything_else_stays_with_datafusion() {
        assert_eq!(json(col("a").gt(lit(1i64)).or(col("b").is_null())), None);
        assert_eq!(json(col("a").in_list(vec![lit(1i64)], true)), None);
        assert_eq!(json((col("a") + lit(1i64)).gt(lit(2i64))), None);
        assert_eq!(json(col("a").eq(lit(ScalarValue::Int64(None)))), None);
        // A timestamp finer than a microsecond.
        assert_eq!(
            json(col("t").gt(lit(ScalarValue::TimestampNanosecond(Some(1), None)))),
            None
        );
        assert_eq!(
            json(col("a").gt(lit(1i64)).and(col("b").like(lit("x%")))),
            None
        );
    }
}
