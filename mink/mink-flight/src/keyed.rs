//! Keys of primary-key lookups as the protocol carries them (JSON objects) and as the node
//! takes them (typed Arrow columns).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema};
use serde_json::{Map, Value};

/// A key or a prefix as a JSON object: column name to value.
pub type Key = Map<String, Value>;

/// The columns that identify a lookup key (the primary key) or a prefix (the partition keys
/// and the bucket key).
pub fn key_columns(
    primary_key: &[String],
    partition_keys: &[String],
    bucket_key: &[String],
    prefix: bool,
) -> Vec<String> {
    if prefix {
        partition_keys.iter().chain(bucket_key).cloned().collect()
    } else {
        primary_key.to_vec()
    }
}

/// The keys as a batch of the identifying columns `ids`, typed by the table's schema.
pub fn typed_keys(schema: &Schema, ids: &[String], keys: &[Key]) -> Result<RecordBatch, String> {
    let fields: Vec<Field> = ids
        .iter()
        .map(|c| {
            schema
                .field_with_name(c)
                .map(|f| f.as_ref().clone().with_nullable(true))
                .map_err(|_| format!("key column {c:?} is not in the table"))
        })
        .collect::<Result<_, _>>()?;
    let key_schema = Arc::new(Schema::new(fields));
    for (i, k) in keys.iter().enumerate() {
        // A column the key does not hold would be left out of what is matched. Named first: a
        // misspelt column is the likelier mistake than a missing one.
        if let Some(extra) = k.keys().find(|c| !ids.contains(c)) {
            return Err(format!(
                "key {i}: {extra:?} is not one of the key's columns {ids:?}"
            ));
        }
        for c in ids {
            match k.get(c) {
                None => return Err(format!("key {i} has no value for {c:?}")),
                Some(Value::Null) => return Err(format!("key {i}: {c:?} is null")),
                Some(_) => {}
            }
        }
        mink_log::json::check_exact(&key_schema, k).map_err(|e| format!("key {i}: {e}"))?;
    }
    let mut decoder = arrow::json::ReaderBuilder::new(Arc::clone(&key_schema))
        .build_decoder()
        .map_err(|e| e.to_string())?;
    decoder.serialize(keys).map_err(|e| format!("keys: {e}"))?;
    Ok(decoder
        .flush()
        .map_err(|e| format!("keys: {e}"))?
        .unwrap_or_else(|| RecordBatch::new_empty(key_schema)))
}

/// A batch of key columns as JSON objects (what a lookup ticket carries).
pub fn keys_as_json(keys: &RecordBatch) -> Result<Vec<Key>, String> {
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    writer.write(keys).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    let bytes = writer.into_inner();
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}
