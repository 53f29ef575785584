//! JSON objects as rows of a typed table: what a Kafka produce to a typed topic and a Kafka
//! source's `json` format both take. A value must be one JSON object of the table's columns
//! with values of their types (nulls and missing nullable columns allowed, unknown columns
//! refused). A number must be exactly a value of its column's type: Arrow's JSON reader would
//! truncate `1.9` into an integer column, and `12.349` into `Decimal128(10, 2)`.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use serde_json::{Map, Value};

/// Why value `index` is not a row.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("value {index}: {reason}")]
pub struct JsonError {
    pub index: usize,
    pub reason: String,
}

/// `values` as rows of `schema`, in order; the first value that is not a row fails the whole.
pub fn rows(schema: &SchemaRef, values: &[Option<&[u8]>]) -> Result<RecordBatch, JsonError> {
    let all: Vec<(usize, Option<&[u8]>)> = values.iter().copied().enumerate().collect();
    decode(schema, &all).or_else(|e| {
        // Name the value at fault: a type error shows only when the rows are built.
        for one in all.chunks(1) {
            decode(schema, one)?;
        }
        Err(e)
    })
}

fn decode(schema: &SchemaRef, values: &[(usize, Option<&[u8]>)]) -> Result<RecordBatch, JsonError> {
    let first = values.first().map_or(0, |(i, _)| *i);
    let mut decoder = arrow::json::ReaderBuilder::new(Arc::clone(schema))
        .with_strict_mode(true)
        .with_batch_size(values.len().max(1))
        .build_decoder()
        .map_err(|e| JsonError {
            index: first,
            reason: e.to_string(),
        })?;
    for (index, value) in values {
        let invalid = |reason: String| JsonError {
            index: *index,
            reason,
        };
        let value = value
            .ok_or_else(|| invalid("no value: a row of this table is a JSON object".into()))?;
        if value.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(invalid("the value is not a JSON object".into()));
        }
        if may_be_inexact(schema, value) {
            let object: Map<String, Value> =
                serde_json::from_slice(value).map_err(|e| invalid(e.to_string()))?;
            check_exact(schema, &object).map_err(invalid)?;
        }
        let mut line = value.to_vec();
        line.push(b'\n');
        let read = decoder.decode(&line).map_err(|e| invalid(e.to_string()))?;
        if read != line.len() {
            return Err(invalid("more than one JSON value".into()));
        }
    }
    let batch = decoder.flush().map_err(|e| JsonError {
        index: first,
        reason: match values {
            [(_, Some(value))] => missing_required(schema, value).unwrap_or_else(|| e.to_string()),
            _ => e.to_string(),
        },
    })?;
    Ok(batch.unwrap_or_else(|| RecordBatch::new_empty(Arc::clone(schema))))
}

/// The first column `schema` requires (not nullable) that the JSON object `value` leaves out
/// or gives as null, said so: Arrow's own error names a struct child, not the column.
fn missing_required(schema: &SchemaRef, value: &[u8]) -> Option<String> {
    let object: Map<String, Value> = serde_json::from_slice(value).ok()?;
    schema.fields().iter().find_map(|f| {
        let given = object.get(f.name()).filter(|v| !v.is_null());
        (!f.is_nullable() && given.is_none()).then(|| {
            format!(
                "column {:?} is not nullable and the object has no value for it",
                f.name()
            )
        })
    })
}

/// Whether `value` (JSON text) may hold a number that a column of `schema` would not take
/// exactly: a fraction or an exponent anywhere in it, and a column that would truncate one.
/// Most rows have neither, and skip the second parse [`check_exact`] needs.
pub fn may_be_inexact(schema: &Schema, value: &[u8]) -> bool {
    // A narrow float overflows on any large number, with or without an exponent.
    schema.fields().iter().any(|f| overflows(f.data_type()))
        || (schema.fields().iter().any(|f| truncates(f.data_type()))
            && value.iter().any(|b| matches!(b, b'.' | b'e' | b'E')))
}

/// Checks that every value `object` gives a column of `schema` is exactly a value of the
/// column's type: a whole number for an integer column, at most `scale` decimal places for a
/// decimal one (as a number or a string), inside lists, structs and maps too. The error names
/// the column (with the path to a nested value) and the value.
pub fn check_exact(schema: &Schema, object: &Map<String, Value>) -> Result<(), String> {
    for f in schema.fields() {
        if let Some(value) = object.get(f.name()) {
            check_value(f.name(), f.data_type(), value)?;
        }
    }
    Ok(())
}

/// [`check_exact`] of one value of type `t`, at `path` (`tags[2]`, `address.zip`).
fn check_value(path: &str, t: &DataType, value: &Value) -> Result<(), String> {
    match (t, value) {
        (
            DataType::List(item)
            | DataType::LargeList(item)
            | DataType::ListView(item)
            | DataType::LargeListView(item)
            | DataType::FixedSizeList(item, _),
            Value::Array(values),
        ) => {
            for (i, v) in values.iter().enumerate() {
                check_value(&format!("{path}[{i}]"), item.data_type(), v)?;
            }
        }
        (DataType::Struct(fields), Value::Object(object)) => {
            for f in fields {
                if let Some(v) = object.get(f.name()) {
                    check_value(&format!("{path}.{}", f.name()), f.data_type(), v)?;
                }
            }
        }
        (DataType::Map(entries, _), Value::Object(object)) => {
            if let DataType::Struct(kv) = entries.data_type()
                && let Some(values) = kv.get(1)
            {
                for (k, v) in object {
                    check_value(&format!("{path}[{k:?}]"), values.data_type(), v)?;
                }
            }
        }
        (_, Value::Number(_) | Value::String(_)) => {
            let text = match value {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.trim().to_string(),
                _ => unreachable!("matched above"),
            };
            let exact = match t {
                t if t.is_integer() => whole(&text),
                // Arrow's reader makes a number past the type's range infinite.
                DataType::Float16 | DataType::Float32 => {
                    let max = if *t == DataType::Float16 {
                        65_504.0 // half::f16::MAX
                    } else {
                        f64::from(f32::MAX)
                    };
                    if text.parse::<f64>().is_ok_and(|f| f.abs() > max) {
                        return Err(format!(
                            "column {path:?}: {value} is out of the range of its type {t}"
                        ));
                    }
                    true
                }
                DataType::Decimal32(_, scale)
                | DataType::Decimal64(_, scale)
                | DataType::Decimal128(_, scale)
                | DataType::Decimal256(_, scale) => within_scale(&text, *scale),
                _ => true,
            };
            if !exact {
                return Err(format!(
                    "column {path:?}: {value} is not exactly a value of its type {t}"
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether a column of type `t` would make a large number infinite: a float narrower than 64
/// bits, or a list, struct or map holding one.
fn overflows(t: &DataType) -> bool {
    holds(t, &|t| matches!(t, DataType::Float16 | DataType::Float32))
}

/// Whether a column of type `t` would truncate a number: an integer or a decimal, or a list,
/// struct or map holding one.
fn truncates(t: &DataType) -> bool {
    holds(t, &|t| t.is_integer() || t.is_decimal())
}

/// Whether `t` is, or is a list, struct or map holding, a type `leaf` picks.
fn holds(t: &DataType, leaf: &dyn Fn(&DataType) -> bool) -> bool {
    match t {
        DataType::List(item)
        | DataType::LargeList(item)
        | DataType::ListView(item)
        | DataType::LargeListView(item)
        | DataType::FixedSizeList(item, _)
        | DataType::Map(item, _) => holds(item.data_type(), leaf),
        DataType::Struct(fields) => fields.iter().any(|f| holds(f.data_type(), leaf)),
        t => leaf(t),
    }
}

/// Whether a number's text is a whole number (text that is no number is left to the reader).
fn whole(text: &str) -> bool {
    if !text.contains(['.', 'e', 'E']) {
        return true;
    }
    text.parse::<f64>().map_or(true, |f| f.fract() == 0.0)
}

/// Whether a number's text has at most `scale` decimal places (trailing zeros aside).
pub(crate) fn within_scale(text: &str, scale: i8) -> bool {
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((m, e)) => match e.parse::<i64>() {
            Ok(e) => (m, e),
            Err(_) => return true,
        },
        None => (text, 0),
    };
    let places = mantissa
        .split_once('.')
        .map_or(0, |(_, f)| f.trim_end_matches('0').len() as i64);
    places - exponent <= i64::from(scale)
}
