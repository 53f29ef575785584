//! Routing of primary-key lookups by key: which bucket each key (or prefix) belongs to, and
//! putting rows answered by several nodes back in the order of the keys (a node forwarding
//! lookups to bucket leaders; any Flight client that wants to ask the leaders itself).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use mink_log::routing::{buckets_of, partitions_of};
use serde_json::{Map, Value};

use crate::protocol::TableDescription;

/// A key or a prefix as a JSON object: column name to value.
pub type Key = Map<String, Value>;

/// The columns that identify a lookup key (the primary key) or a prefix (the partition keys
/// and the bucket key).
pub fn key_columns(d: &TableDescription, prefix: bool) -> Vec<String> {
    if prefix {
        d.partition_keys
            .iter()
            .chain(&d.bucket_key)
            .cloned()
            .collect()
    } else {
        d.primary_key.clone()
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
    for (i, k) in keys.iter().enumerate() {
        if let Some(c) = ids.iter().find(|c| k.get(*c).is_none_or(Value::is_null)) {
            return Err(format!("key {i} has no value for {c:?}"));
        }
    }
    let key_schema = Arc::new(Schema::new(fields));
    let mut decoder = arrow::json::ReaderBuilder::new(Arc::clone(&key_schema))
        .build_decoder()
        .map_err(|e| e.to_string())?;
    decoder.serialize(keys).map_err(|e| format!("keys: {e}"))?;
    Ok(decoder
        .flush()
        .map_err(|e| format!("keys: {e}"))?
        .unwrap_or_else(|| RecordBatch::new_empty(key_schema)))
}

/// The bucket of each key: its partition's name (partitioned tables) and bucket number.
pub fn key_buckets(
    d: &TableDescription,
    keys: &RecordBatch,
    ids: &[String],
) -> Result<Vec<(Option<String>, u32)>, String> {
    let at = |names: &[String]| -> Vec<usize> {
        names
            .iter()
            .filter_map(|n| ids.iter().position(|c| c == n))
            .collect()
    };
    let partitions = if d.partition_keys.is_empty() {
        vec![None; keys.num_rows()]
    } else {
        partitions_of(keys, &at(&d.partition_keys))
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(Some)
            .collect()
    };
    let buckets =
        buckets_of(keys, &at(&d.bucket_key), d.bucket_count.max(1)).map_err(|e| e.to_string())?;
    Ok(partitions.into_iter().zip(buckets).collect())
}

/// Matches rows to keys by their identifying columns.
#[derive(Debug)]
pub struct KeyMatcher {
    converter: RowConverter,
    ids: Vec<String>,
    wanted: Rows,
}

impl KeyMatcher {
    pub fn new(schema: &Schema, ids: &[String], keys: &RecordBatch) -> Result<Self, String> {
        let converter = RowConverter::new(
            ids.iter()
                .map(|c| {
                    schema
                        .field_with_name(c)
                        .map(|f| SortField::new(f.data_type().clone()))
                        .map_err(|e| e.to_string())
                })
                .collect::<Result<_, _>>()?,
        )
        .map_err(|e| e.to_string())?;
        let wanted = converter
            .convert_columns(keys.columns())
            .map_err(|e| e.to_string())?;
        Ok(KeyMatcher {
            converter,
            ids: ids.to_vec(),
            wanted,
        })
    }

    /// Whether key `i` is the first of its value (ask each distinct key once).
    pub fn first_occurrences(&self) -> Vec<bool> {
        let mut seen = HashSet::new();
        (0..self.wanted.num_rows())
            .map(|i| seen.insert(self.wanted.row(i).as_ref().to_vec()))
            .collect()
    }

    /// Rows answered for the keys (whole rows, in any grouping), in the order of the keys:
    /// each occurrence of a key gets its rows.
    pub fn in_key_order(
        &self,
        schema: SchemaRef,
        answers: &[RecordBatch],
    ) -> Result<RecordBatch, String> {
        let mut by_id: HashMap<Vec<u8>, Vec<(usize, usize)>> = HashMap::new();
        for (a, batch) in answers.iter().enumerate() {
            let id_columns: Vec<ArrayRef> = self
                .ids
                .iter()
                .map(|c| {
                    batch
                        .column_by_name(c)
                        .cloned()
                        .ok_or_else(|| format!("no column {c:?} in the answer"))
                })
                .collect::<Result<_, _>>()?;
            let found = self
                .converter
                .convert_columns(&id_columns)
                .map_err(|e| e.to_string())?;
            for r in 0..batch.num_rows() {
                by_id
                    .entry(found.row(r).as_ref().to_vec())
                    .or_default()
                    .push((a, r));
            }
        }
        let mut order = Vec::new();
        for i in 0..self.wanted.num_rows() {
            if let Some(rows) = by_id.get(self.wanted.row(i).as_ref()) {
                order.extend(rows.iter().copied());
            }
        }
        if order.is_empty() {
            return Ok(RecordBatch::new_empty(schema));
        }
        let refs: Vec<&RecordBatch> = answers.iter().collect();
        arrow::compute::interleave_record_batch(&refs, &order).map_err(|e| e.to_string())
    }
}
