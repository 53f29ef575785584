//! The changelog a primary-key table writes into its bucket's stream, and the changelog view
//! readers see.
//!
//! Stored batches are the table's columns plus `_change_type` (Int8, [`ChangeType`]) and
//! `_commit_timestamp` (ms, the leader's clock at append). Every row that adds or changes a key
//! carries the whole merged after-image, so replay overwrites and never re-runs a merge.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, AsArray, Int8Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Field, Int8Type, Schema, SchemaRef};

use crate::rows::RowCodec;
use crate::{KeyChange, KvError, KvResult};

pub use mink_log::changelog::{CHANGE_TYPE, COMMIT_TIMESTAMP, LOG_OFFSET, view_schema};

/// What a changelog row says about its key (the values of Fluss and Flink's row kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i8)]
pub enum ChangeType {
    Insert = 0,
    UpdateBefore = 1,
    UpdateAfter = 2,
    Delete = 3,
    /// Stored only: marks an idempotent writer's batch that changed nothing, so its sequence
    /// is recorded; never shown and never replayed.
    Noop = 4,
}

impl ChangeType {
    pub fn from_i8(v: i8) -> Option<Self> {
        Some(match v {
            0 => ChangeType::Insert,
            1 => ChangeType::UpdateBefore,
            2 => ChangeType::UpdateAfter,
            3 => ChangeType::Delete,
            4 => ChangeType::Noop,
            _ => return None,
        })
    }

    /// The name in the changelog view.
    pub fn name(self) -> &'static str {
        match self {
            ChangeType::Insert => "insert",
            ChangeType::UpdateBefore => "update_before",
            ChangeType::UpdateAfter => "update_after",
            ChangeType::Delete => "delete",
            ChangeType::Noop => "noop",
        }
    }
}

fn timestamp_type() -> DataType {
    mink_log::changelog::commit_timestamp_type()
}

/// The schema of stored changelog batches.
pub fn storage_schema(table: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = table.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(CHANGE_TYPE, DataType::Int8, false));
    fields.push(Field::new(COMMIT_TIMESTAMP, timestamp_type(), false));
    Arc::new(Schema::new_with_metadata(fields, table.metadata().clone()))
}

/// A stored batch from table columns, change types and the commit time.
pub fn stored_batch(
    storage: &SchemaRef,
    mut columns: Vec<ArrayRef>,
    changes: Vec<i8>,
    commit_ms: i64,
) -> KvResult<RecordBatch> {
    let n = changes.len();
    columns.push(Arc::new(Int8Array::from(changes)));
    columns.push(Arc::new(
        TimestampMillisecondArray::from(vec![commit_ms; n]).with_timezone("UTC"),
    ));
    Ok(RecordBatch::try_new(storage.clone(), columns)?)
}

/// The change types of a stored batch.
pub fn change_types(stored: &RecordBatch) -> &Int8Array {
    stored
        .column(stored.num_columns() - 2)
        .as_primitive::<Int8Type>()
}

/// A stored batch read from `base_offset` as changelog view rows (markers left out).
pub fn to_view(view: &SchemaRef, stored: &RecordBatch, base_offset: u64) -> KvResult<RecordBatch> {
    let n = stored.num_rows();
    let types = change_types(stored);
    let offsets = Int64Array::from_iter_values(
        (0..n).map(|i| i64::try_from(base_offset + i as u64).unwrap_or(i64::MAX)),
    );
    let names = StringArray::from_iter_values(
        types
            .values()
            .iter()
            .map(|&t| ChangeType::from_i8(t).map_or("unknown", ChangeType::name)),
    );
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(names),
        Arc::new(offsets),
        stored.column(stored.num_columns() - 1).clone(),
    ];
    columns.extend(table_columns(stored));
    let batch = RecordBatch::try_new(view.clone(), columns)?;
    let shown: arrow::array::BooleanArray = types
        .values()
        .iter()
        .map(|&t| Some(t != ChangeType::Noop as i8))
        .collect();
    if shown.true_count() == n {
        return Ok(batch);
    }
    Ok(filter_record_batch(&batch, &shown)?)
}

/// The table columns of a stored batch.
pub fn table_columns(stored: &RecordBatch) -> Vec<ArrayRef> {
    stored.columns()[..stored.num_columns() - 2].to_vec()
}

/// The key changes a stored changelog batch makes, in order: after-images overwrite, deletes
/// remove; `update_before` rows and markers change nothing. This is replay: no merge re-runs.
pub fn key_changes(codec: &RowCodec, stored: &RecordBatch) -> KvResult<Vec<KeyChange>> {
    let types = change_types(stored);
    let columns = table_columns(stored);
    let table = RecordBatch::try_new(
        Arc::new(Schema::new(
            stored.schema().fields()[..columns.len()].to_vec(),
        )),
        columns.clone(),
    )?;
    let keys = codec.keys(&table)?;
    let values = codec.values(&columns)?;
    let mut out = Vec::new();
    for (i, t) in types.values().iter().enumerate() {
        match ChangeType::from_i8(*t) {
            Some(ChangeType::Insert | ChangeType::UpdateAfter) => {
                out.push((
                    keys.row(i).data().to_vec(),
                    Some(values.row(i).data().to_vec()),
                ));
            }
            Some(ChangeType::Delete) => out.push((keys.row(i).data().to_vec(), None)),
            Some(ChangeType::UpdateBefore | ChangeType::Noop) => {}
            None => {
                return Err(KvError::Store(format!(
                    "unknown change type {t} in the changelog"
                )));
            }
        }
    }
    Ok(out)
}
