//! Row filters a read pushes down: a conjunction of column predicates (`column op literal`),
//! what a ticket carries and what the SQL engine hands over from its plans.
//!
//! A filter is bound to the schema of what is read ([`Filter::bind`]): each literal is cast
//! to its column's type once, so a bad column or literal fails before anything is read, with
//! the column named. Bound, it
//! - prunes buckets (`__bucket`) and partitions (predicates on partition columns),
//! - narrows a bucket's offsets (`__offset` on log reads: a range, not a row test),
//! - selects a log's stored batches by their time (`__timestamp` on log reads: every row of a
//!   batch has the batch's time; a lower bound starts the read at the bucket's time index),
//! - prunes the lake's files and row groups (`mink_read::prune`, the lake's own columns
//!   `__bucket` and `__offset` included),
//! - and selects rows ([`BoundFilter::apply`]).
//!
//! Comparisons follow SQL: a null on either side matches nothing.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Datum, RecordBatch, Scalar, StringArray,
};
use arrow::compute::kernels::cmp;
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Schema};
use serde::{Deserialize, Serialize};

/// A filter that does not fit what is read: the column, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("filter on {column:?}: {reason}")]
pub struct FilterError {
    pub column: String,
    pub reason: String,
}

pub type FilterResult<T> = Result<T, FilterError>;

/// The bucket a row belongs to: a filter column of every read (not a column of the rows).
pub const BUCKET: &str = "__bucket";
/// A log row's offset in its bucket: a filter column of log-table reads (an offset range).
pub const OFFSET: &str = "__offset";
/// A log row's time: its stored batch's (the append time, or the latest record time a Kafka
/// producer gave), as the lake's `__timestamp` column holds it. A filter column of log-table
/// reads; literals are timestamps (RFC 3339 text, or microseconds since the epoch).
pub const TIMESTAMP: &str = "__timestamp";

/// The type [`TIMESTAMP`] literals are bound to (the lake column's).
pub fn timestamp_type() -> DataType {
    DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into()))
}

/// A system column a log read can return besides the table's columns, typed as the lake
/// stores it: [`BUCKET`] (Int32), [`OFFSET`] (Int64), [`TIMESTAMP`] (µs, UTC; null when the
/// batch's time is unknown). `None` for any other name.
pub fn system_field(name: &str) -> Option<arrow::datatypes::Field> {
    use arrow::datatypes::Field;
    match name {
        BUCKET => Some(Field::new(BUCKET, DataType::Int32, false)),
        OFFSET => Some(Field::new(OFFSET, DataType::Int64, false)),
        TIMESTAMP => Some(Field::new(TIMESTAMP, timestamp_type(), true)),
        _ => None,
    }
}

/// `batch` (rows of one stored batch of `bucket`, the first at `base_offset`, all of time
/// `timestamp_ms`) with the system columns among `names` appended, in that order.
pub fn with_system_columns(
    batch: &RecordBatch,
    names: &[String],
    bucket: u32,
    base_offset: u64,
    timestamp_ms: i64,
) -> Result<RecordBatch, arrow::error::ArrowError> {
    let n = batch.num_rows();
    let mut fields: Vec<arrow::datatypes::FieldRef> = batch.schema().fields().to_vec();
    let mut columns = batch.columns().to_vec();
    for name in names {
        let Some(field) = system_field(name) else {
            continue;
        };
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let column: ArrayRef = match name.as_str() {
            BUCKET => Arc::new(arrow::array::Int32Array::from(vec![
                i32::try_from(bucket)
                    .unwrap_or(i32::MAX);
                n
            ])),
            OFFSET => Arc::new(arrow::array::Int64Array::from_iter_values(
                (0..n as u64).map(|i| as_i64(base_offset + i)),
            )),
            _ => Arc::new(
                arrow::array::TimestampMicrosecondArray::from(vec![
                    (timestamp_ms >= 0).then(|| {
                        timestamp_ms.saturating_mul(1000)
                    });
                    n
                ])
                .with_timezone("UTC"),
            ),
        };
        fields.push(Arc::new(field));
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// Rows that meet every predicate (all rows when empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Filter(pub Vec<Predicate>);

/// `column op literal`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Predicate {
    pub column: String,
    #[serde(flatten)]
    pub op: Op,
}

/// A comparison with literals (JSON values: numbers, strings, booleans, null; dates and
/// timestamps as their text, cast to the column's type).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum Op {
    #[serde(rename = "=")]
    Eq { value: serde_json::Value },
    #[serde(rename = "!=")]
    NotEq { value: serde_json::Value },
    #[serde(rename = "<")]
    Lt { value: serde_json::Value },
    #[serde(rename = "<=")]
    LtEq { value: serde_json::Value },
    #[serde(rename = ">")]
    Gt { value: serde_json::Value },
    #[serde(rename = ">=")]
    GtEq { value: serde_json::Value },
    #[serde(rename = "in")]
    In { values: Vec<serde_json::Value> },
    #[serde(rename = "is_null")]
    IsNull,
    #[serde(rename = "is_not_null")]
    IsNotNull,
}

impl Predicate {
    pub fn new(column: impl Into<String>, op: Op) -> Self {
        Predicate {
            column: column.into(),
            op,
        }
    }
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Binds the filter to `schema` (the columns rows are read with) and the system columns
    /// `system` the read allows ([`BUCKET`], [`OFFSET`], [`TIMESTAMP`]): every column must exist and every
    /// literal fit its column's type.
    pub fn bind(&self, schema: &Schema, system: &[&str]) -> FilterResult<BoundFilter> {
        let mut predicates = Vec::with_capacity(self.0.len());
        for p in &self.0 {
            let bad = |reason: String| FilterError {
                column: p.column.clone(),
                reason,
            };
            let data_type = match p.column.as_str() {
                BUCKET if system.contains(&BUCKET) => DataType::UInt32,
                OFFSET if system.contains(&OFFSET) => DataType::UInt64,
                TIMESTAMP if system.contains(&TIMESTAMP) => timestamp_type(),
                name => schema
                    .field_with_name(name)
                    .map_err(|_| bad("no such column".into()))?
                    .data_type()
                    .clone(),
            };
            // Whether a value is null is known for any column; comparisons need a scalar one.
            if data_type.is_nested() && !matches!(p.op, Op::IsNull | Op::IsNotNull) {
                return Err(bad(format!("a {data_type} column cannot be filtered")));
            }
            let literal = |v: &serde_json::Value| literal(v, &data_type).map_err(&bad);
            let op = match &p.op {
                Op::Eq { value } => Bound::Cmp(CmpOp::Eq, literal(value)?),
                Op::NotEq { value } => Bound::Cmp(CmpOp::NotEq, literal(value)?),
                Op::Lt { value } => Bound::Cmp(CmpOp::Lt, literal(value)?),
                Op::LtEq { value } => Bound::Cmp(CmpOp::LtEq, literal(value)?),
                Op::Gt { value } => Bound::Cmp(CmpOp::Gt, literal(value)?),
                Op::GtEq { value } => Bound::Cmp(CmpOp::GtEq, literal(value)?),
                Op::In { values } => {
                    if values.is_empty() {
                        return Err(bad("`in` takes at least one value".into()));
                    }
                    Bound::In(values.iter().map(literal).collect::<FilterResult<_>>()?)
                }
                Op::IsNull => Bound::IsNull(true),
                Op::IsNotNull => Bound::IsNull(false),
            };
            if p.column == OFFSET && !matches!(op, Bound::Cmp(c, _) if c != CmpOp::NotEq) {
                return Err(bad(
                    "an offset filter is a range: =, <, <=, > or >= an offset".into(),
                ));
            }
            predicates.push(BoundPredicate {
                column: p.column.clone(),
                op,
            });
        }
        Ok(BoundFilter { predicates })
    }
}

/// A literal as a one-row array of `data_type`: cast exactly (a fraction does not fit an
/// integer column, a string must parse).
fn literal(value: &serde_json::Value, data_type: &DataType) -> Result<ArrayRef, String> {
    use serde_json::Value as J;
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    // A decimal column takes a number by its text, not through f64 (which has 15 to 17
    // significant digits: 9999999999999999999999999999.9999999999 matched nothing).
    if let DataType::Decimal32(_, scale)
    | DataType::Decimal64(_, scale)
    | DataType::Decimal128(_, scale)
    | DataType::Decimal256(_, scale) = data_type
    {
        let text = match value {
            J::Number(n) => Some(n.to_string()),
            J::String(s) => Some(s.trim().to_string()),
            _ => None,
        };
        if let Some(text) = text {
            if !crate::json::within_scale(&text, *scale) {
                return Err(format!(
                    "{value} is not exactly a value of the column's type {data_type}"
                ));
            }
            let raw: ArrayRef = Arc::new(StringArray::from(vec![without_exponent(&text)]));
            return cast_with_options(&raw, data_type, &options)
                .map_err(|e| format!("{value} does not fit the column's type {data_type}: {e}"));
        }
    }
    let raw: ArrayRef = match value {
        J::Null => arrow::array::new_null_array(data_type, 1),
        J::Bool(b) => Arc::new(BooleanArray::from(vec![*b])),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Arc::new(arrow::array::Int64Array::from(vec![i])),
            (None, Some(u), _) => Arc::new(arrow::array::UInt64Array::from(vec![u])),
            (None, None, Some(f)) => {
                if f.fract() != 0.0 && data_type.is_integer() {
                    return Err(format!(
                        "{f} is not a whole number, and the column is {data_type}"
                    ));
                }
                Arc::new(arrow::array::Float64Array::from(vec![f]))
            }
            _ => return Err(format!("{n} is not a number the filter takes")),
        },
        J::String(s) => Arc::new(StringArray::from(vec![s.as_str()])),
        J::Array(_) | J::Object(_) => {
            return Err(format!(
                "{value} is not a literal (a number, string, boolean or null)"
            ));
        }
    };
    let cast = cast_with_options(&raw, data_type, &options)
        .map_err(|e| format!("{value} does not fit the column's type {data_type}: {e}"))?;
    // A number the column's type would round (0.125 as Float32 is exact, as Decimal(10, 2) it
    // is not) changes what the comparison selects: refused.
    if matches!(value, J::Number(_)) && raw.data_type() != data_type {
        let back = cast_with_options(&cast, raw.data_type(), &options).ok();
        if back.as_ref().is_none_or(|b| b.to_data() != raw.to_data()) {
            return Err(format!(
                "{value} is not exactly a value of the column's type {data_type}"
            ));
        }
    }
    Ok(cast)
}

/// A number's text with its exponent written out (`1e-10` → `0.0000000001`), as Arrow's
/// string-to-decimal cast takes it; text it cannot read is left as it is (the cast says why).
fn without_exponent(text: &str) -> String {
    let Some((mantissa, exponent)) = text.split_once(['e', 'E']) else {
        return text.to_string();
    };
    let Some(exponent) = exponent.parse::<i32>().ok().filter(|e| e.abs() <= 100) else {
        return text.to_string();
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa.strip_prefix('+').unwrap_or(mantissa)),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    if !digits.bytes().all(|b| b.is_ascii_digit()) || digits.is_empty() {
        return text.to_string();
    }
    let Some(point) = i32::try_from(int.len()).ok().map(|n| n + exponent) else {
        return text.to_string();
    };
    if point <= 0 {
        format!(
            "{sign}0.{}{digits}",
            "0".repeat(point.unsigned_abs() as usize)
        )
    } else if point as usize >= digits.len() {
        format!(
            "{sign}{digits}{}",
            "0".repeat(point as usize - digits.len())
        )
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{sign}{whole}.{fraction}")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

/// A predicate's test, its literals typed as the column.
#[derive(Clone, Debug)]
pub enum Bound {
    Cmp(CmpOp, ArrayRef),
    In(Vec<ArrayRef>),
    /// `true`: is null; `false`: is not null.
    IsNull(bool),
}

#[derive(Clone, Debug)]
pub struct BoundPredicate {
    pub column: String,
    pub op: Bound,
}

/// A [`Filter`] bound to a schema: literals typed, ready to test rows.
#[derive(Clone, Debug, Default)]
pub struct BoundFilter {
    predicates: Vec<BoundPredicate>,
}

impl BoundPredicate {
    fn evaluate(&self, column: &dyn Datum) -> FilterResult<BooleanArray> {
        let err = |e: arrow::error::ArrowError| FilterError {
            column: self.column.clone(),
            reason: e.to_string(),
        };
        let compare = |op: CmpOp, value: &ArrayRef| {
            let value = Scalar::new(Arc::clone(value));
            match op {
                CmpOp::Eq => cmp::eq(column, &value),
                CmpOp::NotEq => cmp::neq(column, &value),
                CmpOp::Lt => cmp::lt(column, &value),
                CmpOp::LtEq => cmp::lt_eq(column, &value),
                CmpOp::Gt => cmp::gt(column, &value),
                CmpOp::GtEq => cmp::gt_eq(column, &value),
            }
            .map_err(err)
        };
        match &self.op {
            Bound::Cmp(op, value) => compare(*op, value),
            Bound::In(values) => {
                let mut any: Option<BooleanArray> = None;
                for v in values {
                    let eq = compare(CmpOp::Eq, v)?;
                    any = Some(match any {
                        None => eq,
                        Some(a) => arrow::compute::or_kleene(&a, &eq).map_err(err)?,
                    });
                }
                Ok(any.expect("`in` has values"))
            }
            Bound::IsNull(null) => {
                let (array, _) = column.get();
                Ok(if *null {
                    arrow::compute::is_null(array).map_err(err)?
                } else {
                    arrow::compute::is_not_null(array).map_err(err)?
                })
            }
        }
    }

    /// Whether the single value `value` (a one-row array of the column's type) meets it.
    fn holds_for(&self, value: &ArrayRef) -> FilterResult<bool> {
        let hit = self.evaluate(value)?;
        Ok(hit.is_valid(0) && hit.value(0))
    }
}

impl BoundFilter {
    pub fn is_empty(&self) -> bool {
        self.predicates.is_empty()
    }

    pub fn predicates(&self) -> &[BoundPredicate] {
        &self.predicates
    }

    fn rows(&self) -> impl Iterator<Item = &BoundPredicate> {
        self.predicates
            .iter()
            .filter(|p| p.column != BUCKET && p.column != OFFSET && p.column != TIMESTAMP)
    }

    fn times(&self) -> impl Iterator<Item = &BoundPredicate> {
        self.predicates.iter().filter(|p| p.column == TIMESTAMP)
    }

    /// Whether the filter selects by time ([`TIMESTAMP`]).
    pub fn tests_time(&self) -> bool {
        self.times().next().is_some()
    }

    /// Whether the rows of a stored batch of time `timestamp_ms` (milliseconds; negative when
    /// unknown, which no time predicate matches, as SQL's null) meet the time predicates.
    pub fn time_may_match(&self, timestamp_ms: i64) -> FilterResult<bool> {
        if !self.tests_time() {
            return Ok(true);
        }
        let value: ArrayRef = Arc::new(
            arrow::array::TimestampMicrosecondArray::from(vec![
                (timestamp_ms >= 0).then(|| timestamp_ms.saturating_mul(1000)),
            ])
            .with_timezone("UTC"),
        );
        for p in self.times() {
            if !p.holds_for(&value)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The earliest batch time (milliseconds) the time predicates allow, if they bound it
    /// from below: where a read may start by the time index. Rounded down, so no batch that
    /// meets them is earlier.
    pub fn earliest_time_ms(&self) -> Option<i64> {
        let mut earliest: Option<i64> = None;
        for p in self.times() {
            let Bound::Cmp(CmpOp::Eq | CmpOp::Gt | CmpOp::GtEq, value) = &p.op else {
                continue;
            };
            let Some(us) = value
                .as_primitive_opt::<arrow::datatypes::TimestampMicrosecondType>()
                .filter(|a| a.is_valid(0))
                .map(|a| a.value(0))
            else {
                continue;
            };
            let ms = us.div_euclid(1000);
            earliest = Some(earliest.map_or(ms, |e| e.max(ms)));
        }
        earliest
    }

    /// Whether the filter tests rows (and not only buckets and offsets).
    pub fn tests_rows(&self) -> bool {
        self.rows().next().is_some()
    }

    /// The columns of the rows the filter tests, each once.
    pub fn columns(&self) -> Vec<String> {
        let mut columns: Vec<String> = Vec::new();
        for p in self.rows() {
            if !columns.contains(&p.column) {
                columns.push(p.column.clone());
            }
        }
        columns
    }

    /// Whether rows of bucket `bucket` may meet the filter.
    pub fn bucket_may_match(&self, bucket: u32) -> FilterResult<bool> {
        let value: ArrayRef = Arc::new(arrow::array::UInt32Array::from(vec![bucket]));
        for p in self.predicates.iter().filter(|p| p.column == BUCKET) {
            if !p.holds_for(&value)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether rows of the partition whose key columns hold `values` (as Mink names
    /// partitions: the values' text) may meet the filter; `schema` has the columns' types.
    pub fn partition_may_match(
        &self,
        schema: &Schema,
        values: &BTreeMap<String, String>,
    ) -> FilterResult<bool> {
        for p in self.rows() {
            let Some(text) = values.get(&p.column) else {
                continue;
            };
            let Ok(field) = schema.field_with_name(&p.column) else {
                continue;
            };
            let value = literal(&serde_json::Value::String(text.clone()), field.data_type())
                .map_err(|reason| FilterError {
                    column: p.column.clone(),
                    reason,
                })?;
            if !p.holds_for(&value)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The offsets the `__offset` predicates allow (all when there are none).
    pub fn offsets(&self) -> Range<u64> {
        let mut range = 0..u64::MAX;
        for p in self.predicates.iter().filter(|p| p.column == OFFSET) {
            let Bound::Cmp(op, value) = &p.op else {
                continue;
            };
            let Some(v) = value
                .as_primitive_opt::<arrow::datatypes::UInt64Type>()
                .filter(|a| a.is_valid(0))
                .map(|a| a.value(0))
            else {
                // `__offset = null` and the like: nothing.
                return 0..0;
            };
            let (lo, hi) = match op {
                CmpOp::Eq => (v, v.saturating_add(1)),
                CmpOp::Lt => (0, v),
                CmpOp::LtEq => (0, v.saturating_add(1)),
                CmpOp::Gt => (v.saturating_add(1), u64::MAX),
                CmpOp::GtEq => (v, u64::MAX),
                CmpOp::NotEq => (0, u64::MAX),
            };
            range = range.start.max(lo)..range.end.min(hi);
        }
        if range.start > range.end {
            range.start..range.start
        } else {
            range
        }
    }

    /// Which rows of `batch` meet the filter's row predicates; `None` when it has none.
    /// `batch` must hold every column of [`BoundFilter::columns`].
    pub fn selection(&self, batch: &RecordBatch) -> FilterResult<Option<BooleanArray>> {
        let mut all: Option<BooleanArray> = None;
        for p in self.rows() {
            let column = batch.column_by_name(&p.column).ok_or_else(|| FilterError {
                column: p.column.clone(),
                reason: "the rows read lack the column".into(),
            })?;
            let hit = p.evaluate(column)?;
            all = Some(match all {
                None => hit,
                Some(a) => arrow::compute::and_kleene(&a, &hit).map_err(|e| FilterError {
                    column: p.column.clone(),
                    reason: e.to_string(),
                })?,
            });
        }
        Ok(all)
    }

    /// The rows of `batch` that meet the filter (`batch` itself when it has no row
    /// predicates or every row meets them).
    pub fn apply(&self, batch: RecordBatch) -> FilterResult<RecordBatch> {
        let Some(selection) = self.selection(&batch)? else {
            return Ok(batch);
        };
        if selection.null_count() == 0 && selection.true_count() == batch.num_rows() {
            return Ok(batch);
        }
        arrow::compute::filter_record_batch(&batch, &selection).map_err(|e| FilterError {
            column: self.columns().join(", "),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::{Field, Int64Type};
    use serde_json::json;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("day", DataType::Date32, true),
        ])
    }

    fn batch() -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(schema()),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    None,
                    Some("c"),
                    Some("a"),
                ])),
                Arc::new(arrow::array::Date32Array::from(vec![
                    Some(19000),
                    Some(19001),
                    None,
                    Some(19003),
                ])),
            ],
        )
        .unwrap()
    }

    fn parse(v: serde_json::Value) -> Filter {
        serde_json::from_value(v).unwrap()
    }

    fn ids(f: serde_json::Value) -> Vec<i64> {
        let bound = parse(f).bind(&schema(), &[BUCKET]).unwrap();
        let out = bound.apply(batch()).unwrap();
        out.column(0).as_primitive::<Int64Type>().values().to_vec()
    }

    #[test]
    fn predicates_select_rows_as_sql_does() {
        assert_eq!(
            ids(json!([{"column": "id", "op": ">=", "value": 2}])),
            [2, 3, 4]
        );
        assert_eq!(
            ids(json!([
                {"column": "id", "op": "<", "value": 4},
                {"column": "name", "op": "=", "value": "a"}
            ])),
            [1]
        );
        // A null never compares equal or unequal.
        assert_eq!(
            ids(json!([{"column": "name", "op": "!=", "value": "a"}])),
            [3]
        );
        assert_eq!(ids(json!([{"column": "name", "op": "is_null"}])), [2]);
        assert_eq!(
            ids(json!([{"column": "name", "op": "in", "values": ["c", null]}])),
            [3]
        );
        // Dates from their text.
        assert_eq!(
            ids(json!([{"column": "day", "op": ">", "value": "2022-01-08"}])),
            [2, 4]
        );
        assert_eq!(
            ids(json!([{"column": "id", "op": "=", "value": null}])),
            Vec::<i64>::new()
        );
        // No predicate: every row, the batch as it is.
        assert_eq!(ids(json!([])), [1, 2, 3, 4]);
    }

    #[test]
    fn a_bad_filter_names_its_column() {
        let err = |f: serde_json::Value, system: &[&str]| {
            let FilterError { column, reason } = parse(f).bind(&schema(), system).unwrap_err();
            (column, reason)
        };
        let (column, reason) = err(json!([{"column": "nope", "op": "is_null"}]), &[]);
        assert_eq!(
            (column.as_str(), reason.as_str()),
            ("nope", "no such column")
        );
        let (column, reason) = err(json!([{"column": "id", "op": ">", "value": 1.5}]), &[]);
        assert_eq!(column, "id");
        assert!(reason.contains("not a whole number"), "{reason}");
        let (_, reason) = err(json!([{"column": "day", "op": ">", "value": "soon"}]), &[]);
        assert!(reason.contains("does not fit"), "{reason}");
        let price = Schema::new(vec![Field::new("p", DataType::Decimal128(10, 2), true)]);
        let rounded = parse(json!([{"column": "p", "op": ">", "value": 0.125}]))
            .bind(&price, &[])
            .unwrap_err();
        assert!(rounded.reason.contains("not exactly"), "{}", rounded.reason);
        assert!(
            parse(json!([{"column": "p", "op": ">", "value": 0.5}]))
                .bind(&price, &[])
                .is_ok()
        );
        let (_, reason) = err(json!([{"column": "day", "op": ">", "value": "soon"}]), &[]);
        assert!(reason.contains("does not fit"), "{reason}");
        let (_, reason) = err(json!([{"column": "id", "op": "in", "values": []}]), &[]);
        assert!(reason.contains("at least one"), "{reason}");
        // System columns only where the read has them.
        let (column, _) = err(
            json!([{"column": "__offset", "op": ">", "value": 1}]),
            &[BUCKET],
        );
        assert_eq!(column, "__offset");
        let (_, reason) = err(
            json!([{"column": "__offset", "op": "in", "values": [1]}]),
            &[OFFSET],
        );
        assert!(reason.contains("range"), "{reason}");
        assert!(serde_json::from_value::<Filter>(json!([{"column": "id", "op": "~"}])).is_err());
    }

    /// A decimal literal is read from its text, exactly, whatever its digits (through f64 a
    /// 38-digit one matched nothing); a decimal string with more places than the scale is
    /// refused, as a number is; `'0.1'` reads as the nearest Float32.
    #[test]
    fn decimal_and_float_literals_are_read_as_the_columns_type() {
        let big: i128 = 99_999_999_999_999_999_999_999_999_999_999_999_999;
        let d = arrow::array::Decimal128Array::from(vec![big, 1])
            .with_precision_and_scale(38, 10)
            .unwrap();
        let f = arrow::array::Float32Array::from(vec![0.1f32, 0.5]);
        let schema = Schema::new(vec![
            Field::new("d", d.data_type().clone(), true),
            Field::new("f", DataType::Float32, true),
        ]);
        let batch =
            RecordBatch::try_new(Arc::new(schema.clone()), vec![Arc::new(d), Arc::new(f)]).unwrap();
        let rows = |f: serde_json::Value| {
            parse(f)
                .bind(&schema, &[])
                .unwrap()
                .apply(batch.clone())
                .unwrap()
                .num_rows()
        };
        assert_eq!(
            rows(
                json!([{"column": "d", "op": "=", "value": "9999999999999999999999999999.9999999999"}])
            ),
            1
        );
        assert_eq!(rows(json!([{"column": "d", "op": "=", "value": 1e-10}])), 1);
        assert_eq!(rows(json!([{"column": "f", "op": ">", "value": "0.1"}])), 1);
        let refused = parse(json!([{"column": "d", "op": "=", "value": "0.00000000001"}]))
            .bind(&schema, &[])
            .unwrap_err();
        assert!(refused.reason.contains("not exactly"), "{}", refused.reason);
    }

    /// `IS [NOT] NULL` holds for any column, a list, struct or map too (SQL's `WHERE tags IS
    /// NOT NULL` failed the whole query); comparisons of them are refused.
    #[test]
    fn a_nested_column_is_tested_for_null_only() {
        let values =
            arrow::array::ListArray::from_iter_primitive::<arrow::datatypes::Int32Type, _, _>(
                vec![Some(vec![Some(1)]), None, Some(vec![])],
            );
        let schema = Schema::new(vec![Field::new("tags", values.data_type().clone(), true)]);
        let batch = RecordBatch::try_new(Arc::new(schema.clone()), vec![Arc::new(values)]).unwrap();
        let rows = |op: &str| {
            parse(json!([{"column": "tags", "op": op}]))
                .bind(&schema, &[])
                .unwrap()
                .apply(batch.clone())
                .unwrap()
                .num_rows()
        };
        assert_eq!((rows("is_null"), rows("is_not_null")), (1, 2));
        let refused = parse(json!([{"column": "tags", "op": "=", "value": 1}]))
            .bind(&schema, &[])
            .unwrap_err();
        assert!(
            refused.reason.contains("cannot be filtered"),
            "{}",
            refused.reason
        );
    }

    #[test]
    fn buckets_partitions_and_offsets_are_pruned() {
        let f = parse(json!([
            {"column": "__bucket", "op": "in", "values": [1, 3]},
            {"column": "__offset", "op": ">=", "value": 10},
            {"column": "__offset", "op": "<", "value": 20},
            {"column": "day", "op": "=", "value": "2022-01-08"}
        ]))
        .bind(&schema(), &[BUCKET, OFFSET])
        .unwrap();
        assert!(!f.bucket_may_match(0).unwrap());
        assert!(f.bucket_may_match(3).unwrap());
        assert_eq!(f.offsets(), 10..20);
        assert_eq!(f.columns(), ["day"]);
        let part = |day: &str| BTreeMap::from([("day".to_string(), day.to_string())]);
        assert!(
            f.partition_may_match(&schema(), &part("2022-01-08"))
                .unwrap()
        );
        assert!(
            !f.partition_may_match(&schema(), &part("2022-01-09"))
                .unwrap()
        );
        let none = parse(json!([
            {"column": "__offset", "op": ">", "value": 5},
            {"column": "__offset", "op": "<=", "value": 2}
        ]))
        .bind(&schema(), &[OFFSET])
        .unwrap();
        assert!(none.offsets().is_empty());
        assert_eq!(BoundFilter::default().offsets(), 0..u64::MAX);
    }

    #[test]
    fn stored_batches_are_selected_by_their_time() {
        let f = parse(json!([
            {"column": "__timestamp", "op": ">=", "value": "2026-12-01T00:00:00.0015Z"},
            {"column": "__timestamp", "op": "<", "value": 1_796_083_200_010_000i64},
            {"column": "id", "op": ">", "value": 1}
        ]))
        .bind(&schema(), &[TIMESTAMP])
        .unwrap();
        let day = 1_796_083_200_000i64; // 2026-12-01T00:00:00Z in milliseconds
        assert!(f.tests_time() && f.tests_rows());
        assert_eq!(f.columns(), ["id"], "time is not a row column");
        // Rounded down to a millisecond: the index never starts past a batch that matches.
        assert_eq!(f.earliest_time_ms(), Some(day + 1));
        assert!(!f.time_may_match(day + 1).unwrap(), "1.000 ms < 1.5 ms");
        assert!(f.time_may_match(day + 2).unwrap());
        assert!(f.time_may_match(day + 9).unwrap());
        assert!(!f.time_may_match(day + 10).unwrap());
        assert!(
            !f.time_may_match(-1).unwrap(),
            "an unknown time matches nothing"
        );
        assert!(BoundFilter::default().time_may_match(-1).unwrap());
        assert_eq!(BoundFilter::default().earliest_time_ms(), None);
        let FilterError { column, reason } =
            parse(json!([{"column": "__timestamp", "op": ">", "value": "yesterday"}]))
                .bind(&schema(), &[TIMESTAMP])
                .unwrap_err();
        assert_eq!(column, "__timestamp");
        assert!(reason.contains("Timestamp"), "{reason}");
    }
}
