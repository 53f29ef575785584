//! JSON objects as rows of a typed table: what a Kafka produce to a typed topic and a Kafka
//! source's `json` format both take. A value must be one JSON object of the table's columns
//! with values of their types (nulls and missing nullable columns allowed, unknown columns
//! refused).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

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
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(value).ok()?;
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
