//! The union read: a bucket as one table across the lake and the log, the call under every
//! frontend's scan (Flight's `DoGet` through the node, and the SQL engine next).
//!
//! - **Log tables** concatenate: offsets below the log's start come from the lake snapshot the
//!   read pinned, the rest from the log, each row once at its offset ([`lake_range`] says which
//!   offsets of a read step are the lake's; [`mink_lake::Lake::read_bucket`] reads them).
//! - **Primary-key tables** merge by key: the bucket's rows in the pinned snapshot (its state
//!   at the snapshot's tiered offset), then the changelog from that offset to the high
//!   watermark fixed when the read was planned; the log's latest change of a key wins and a
//!   delete removes it ([`merge_by_key`], [`read_primary_key_bucket`]).
//!
//! A filter on a non-key column of a primary-key table must be applied after the merge: a lake
//! row it would drop may be replaced by a later change in the log that it would keep, and the
//! other way round. [`merge_by_key`] therefore takes an unfiltered tail.

pub mod prune;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Int64Type, SchemaRef};
use arrow::row::{RowConverter, SortField};
use mink_kv::changelog::{CHANGE_TYPE, COMMIT_TIMESTAMP, LOG_OFFSET};
use mink_lake::pk::ChangeRows;
use mink_lake::{Lake, LakeError};

pub use mink_log::filter::{self, BoundFilter, Filter, FilterError, Op, Predicate};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The read asks for offsets neither side holds.
    #[error("offset {offset} is out of range: the bucket holds [{start}, {end})")]
    OffsetOutOfRange { offset: u64, start: u64, end: u64 },
    #[error(transparent)]
    Lake(#[from] LakeError),
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error("{0}")]
    Invalid(String),
}

pub type ReadResult<T> = Result<T, ReadError>;

fn invalid(e: impl std::fmt::Display) -> ReadError {
    ReadError::Invalid(e.to_string())
}

/// The sides of a lake-enabled table a read takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadSource {
    /// What the table reads by default: the union read of a log table; a primary-key
    /// table's current rows from its KV tablet.
    #[default]
    Auto,
    /// The union read: the lake's rows below the log's start, then the log (log tables); the
    /// lake snapshot merged with the changelog after it (primary-key tables).
    Union,
    /// The lake's rows only, from the recorded snapshot.
    Lake,
    /// The log's rows only, from its start (log tables).
    Log,
}

/// The offsets of a log table's read step at `offset` (reading up to `to`, exclusive) that
/// come from the lake, at most `max_rows` of them: `None` when the step is the log's. The log
/// holds `[log_start, log_end)`; the lake `[0, tiered)`.
pub fn lake_range(
    source: ReadSource,
    offset: u64,
    to: Option<u64>,
    (log_start, log_end): (u64, u64),
    tiered: Option<u64>,
    max_rows: u64,
) -> ReadResult<Option<Range<u64>>> {
    let lake_only = source == ReadSource::Lake;
    if source == ReadSource::Log || (!lake_only && offset >= log_start) {
        return Ok(None);
    }
    let out_of_range = ReadError::OffsetOutOfRange {
        offset,
        start: log_start,
        end: log_end,
    };
    let Some(tiered) = tiered else {
        return Err(out_of_range);
    };
    let upto = (if lake_only {
        tiered
    } else {
        log_start.min(tiered)
    })
    .min(offset.saturating_add(max_rows))
    .min(to.unwrap_or(u64::MAX));
    if upto <= offset {
        return Err(out_of_range);
    }
    Ok(Some(offset..upto))
}

/// A primary-key table's changelog view batch (`_change_type`, `_log_offset`,
/// `_commit_timestamp`, then the table's columns) as changes: inserts and update-afters
/// upsert, deletes delete, update-befores are left out (the update-after that follows carries
/// the key).
pub fn changes_from_changelog(view: &RecordBatch) -> ReadResult<ChangeRows> {
    let column = |name: &str| {
        view.column_by_name(name)
            .ok_or_else(|| invalid(format!("a changelog batch without {name}")))
    };
    let kinds = column(CHANGE_TYPE)?.as_string::<i32>();
    let offsets = column(LOG_OFFSET)?.as_primitive::<Int64Type>();
    let times =
        arrow::compute::cast(column(COMMIT_TIMESTAMP)?, &DataType::Int64).map_err(invalid)?;
    let times = times.as_primitive::<Int64Type>();
    let keep: Vec<usize> = (0..view.num_rows())
        .filter(|&i| kinds.value(i) != "update_before")
        .collect();
    let indices = UInt32Array::from_iter_values(
        keep.iter()
            .map(|&i| u32::try_from(i).map_err(invalid))
            .collect::<ReadResult<Vec<_>>>()?,
    );
    let table_columns: Vec<usize> = (0..view.num_columns())
        .filter(|&i| {
            ![CHANGE_TYPE, LOG_OFFSET, COMMIT_TIMESTAMP]
                .contains(&view.schema().field(i).name().as_str())
        })
        .collect();
    let rows = view
        .project(&table_columns)
        .and_then(|b| arrow::compute::take_record_batch(&b, &indices))
        .map_err(invalid)?;
    Ok(ChangeRows {
        rows,
        offsets: keep
            .iter()
            .map(|&i| u64::try_from(offsets.value(i)).map_err(invalid))
            .collect::<ReadResult<_>>()?,
        timestamps_us: keep
            .iter()
            .map(|&i| times.value(i).saturating_mul(1000))
            .collect(),
        upsert: keep.iter().map(|&i| kinds.value(i) != "delete").collect(),
    })
}

/// The current rows of a primary-key bucket: `base` (its rows at some offset, one per key)
/// with `changes` after that offset applied in order, as one batch of `schema`. A key's last
/// change wins; a delete removes it. `base` rows keep their order, upserted keys follow in the
/// order of their last change.
pub fn merge_by_key(
    schema: &SchemaRef,
    key: &[String],
    base: &[RecordBatch],
    changes: &[ChangeRows],
) -> ReadResult<RecordBatch> {
    let key_columns: Vec<usize> = key
        .iter()
        .map(|k| schema.index_of(k).map_err(invalid))
        .collect::<ReadResult<_>>()?;
    let converter = RowConverter::new(
        key_columns
            .iter()
            .map(|&c| SortField::new(schema.field(c).data_type().clone()))
            .collect(),
    )
    .map_err(invalid)?;
    // Every source batch as `schema` (the changes may lack no column, and must not reorder).
    let align = |b: &RecordBatch| -> ReadResult<RecordBatch> {
        let columns = schema
            .fields()
            .iter()
            .map(|f| match b.column_by_name(f.name()) {
                Some(c) => arrow::compute::cast(c, f.data_type()).map_err(invalid),
                None => Ok(arrow::array::new_null_array(f.data_type(), b.num_rows())),
            })
            .collect::<ReadResult<Vec<ArrayRef>>>()?;
        RecordBatch::try_new_with_options(
            Arc::clone(schema),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
        )
        .map_err(invalid)
    };
    let sources: Vec<RecordBatch> = base
        .iter()
        .chain(changes.iter().map(|c| &c.rows))
        .map(align)
        .collect::<ReadResult<_>>()?;
    let keys_of = |b: &RecordBatch| -> ReadResult<Vec<Vec<u8>>> {
        let columns: Vec<ArrayRef> = key_columns
            .iter()
            .map(|&c| Arc::clone(b.column(c)))
            .collect();
        let rows = converter.convert_columns(&columns).map_err(invalid)?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    };
    // The last change of each changed key: (source batch, row), or None for a delete.
    let mut last: HashMap<Vec<u8>, Option<(usize, usize)>> = HashMap::new();
    let mut order: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (i, c) in changes.iter().enumerate() {
        let batch = base.len() + i;
        for (r, k) in keys_of(&sources[batch])?.into_iter().enumerate() {
            order.insert(c.offsets[r], k.clone());
            last.insert(k, c.upsert[r].then_some((batch, r)));
        }
    }
    let mut picked: Vec<(usize, usize)> = Vec::new();
    for (b, batch) in sources.iter().enumerate().take(base.len()) {
        for (r, k) in keys_of(batch)?.into_iter().enumerate() {
            if !last.contains_key(&k) {
                picked.push((b, r));
            }
        }
    }
    // Upserted keys in the order of their last change (a key changed twice is placed once).
    for (offset, k) in &order {
        if let Some(Some((b, r))) = last.get(k) {
            let i = b - base.len();
            if changes[i].offsets[*r] == *offset {
                picked.push((*b, *r));
            }
        }
    }
    let columns = (0..schema.fields().len())
        .map(|c| {
            let arrays: Vec<&dyn Array> = sources.iter().map(|b| b.column(c).as_ref()).collect();
            if arrays.is_empty() {
                return Ok(arrow::array::new_empty_array(schema.field(c).data_type()));
            }
            arrow::compute::interleave(&arrays, &picked).map_err(invalid)
        })
        .collect::<ReadResult<Vec<_>>>()?;
    RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(picked.len())),
    )
    .map_err(invalid)
}

/// The union read of a primary-key bucket: its rows in lake snapshot `snapshot_id` (none if
/// the bucket has not been tiered) merged with `tail`, its changes from the snapshot's tiered
/// offset to the read's end, as one batch of `schema`; then the rows that meet `filter`.
///
/// The filter prunes the lake's rows too: a key the tail changes takes its row from the tail
/// whether or not its lake row was read, and a key it leaves alone keeps a lake row only if
/// the row meets the filter. The tail itself is never filtered before the merge: a change
/// that fails the filter still replaces (or deletes) the key's earlier row.
#[allow(clippy::too_many_arguments)]
pub async fn read_primary_key_bucket(
    lake: &Lake,
    database: &str,
    table: &str,
    snapshot_id: Option<i64>,
    partition: &BTreeMap<String, String>,
    bucket: u32,
    schema: &SchemaRef,
    key: &[String],
    tail: &[ChangeRows],
    filter: &BoundFilter,
) -> ReadResult<RecordBatch> {
    let prune = prune::LakePrune(filter);
    let prune = (!filter.is_empty()).then_some(&prune as &dyn mink_lake::Prune);
    let base = match snapshot_id {
        Some(s) => {
            lake.read_bucket_state(database, table, s, partition, bucket, schema, prune)
                .await?
        }
        None => Vec::new(),
    };
    Ok(filter.apply(merge_by_key(schema, key, &base, tail)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]))
    }

    fn rows(ids: &[i64], names: &[&str]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(names.to_vec())),
            ],
        )
        .unwrap()
    }

    fn pairs(b: &RecordBatch) -> Vec<(i64, String)> {
        let id = b.column(0).as_primitive::<Int64Type>();
        let name = b.column(1).as_string::<i32>();
        (0..b.num_rows())
            .map(|i| (id.value(i), name.value(i).to_string()))
            .collect()
    }

    #[test]
    fn the_logs_last_change_wins_and_deletes_remove() {
        let base = rows(&[1, 2, 3, 4], &["a", "b", "c", "d"]);
        let changes = ChangeRows {
            rows: rows(&[2, 5, 3, 2, 6, 6], &["b2", "e", "-", "b3", "f", "-"]),
            offsets: vec![10, 11, 12, 13, 14, 15],
            timestamps_us: vec![0; 6],
            upsert: vec![true, true, false, true, true, false],
        };
        let merged = merge_by_key(&schema(), &["id".into()], &[base], &[changes]).unwrap();
        assert_eq!(
            pairs(&merged),
            vec![
                (1, "a".into()),
                (4, "d".into()),
                (5, "e".into()),
                (2, "b3".into())
            ]
        );
    }

    #[test]
    fn an_empty_lake_or_tail_is_the_other_side() {
        let only_base =
            merge_by_key(&schema(), &["id".into()], &[rows(&[1], &["a"])], &[]).unwrap();
        assert_eq!(pairs(&only_base), vec![(1, "a".into())]);
        let none = merge_by_key(&schema(), &["id".into()], &[], &[]).unwrap();
        assert_eq!(none.num_rows(), 0);
    }

    #[test]
    fn lake_ranges() {
        use ReadSource::*;
        // Below the log's start: the lake, up to the start (union) or the tiered offset (lake).
        assert_eq!(
            lake_range(Union, 0, None, (50, 90), Some(70), 1000).unwrap(),
            Some(0..50)
        );
        assert_eq!(
            lake_range(Lake, 0, None, (50, 90), Some(70), 1000).unwrap(),
            Some(0..70)
        );
        assert_eq!(
            lake_range(Union, 0, Some(20), (50, 90), Some(70), 10).unwrap(),
            Some(0..10)
        );
        // At or past the start, or a log read: the log's.
        assert_eq!(
            lake_range(Union, 50, None, (50, 90), Some(70), 1000).unwrap(),
            None
        );
        assert_eq!(
            lake_range(Log, 0, None, (50, 90), Some(70), 1000).unwrap(),
            None
        );
        // History nobody holds.
        assert!(matches!(
            lake_range(Union, 0, None, (50, 90), None, 1000),
            Err(ReadError::OffsetOutOfRange {
                offset: 0,
                start: 50,
                end: 90
            })
        ));
        assert!(lake_range(Lake, 70, None, (50, 90), Some(70), 1000).is_err());
    }
}
