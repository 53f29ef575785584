//! The union read: a bucket as one table across the lake and the log, the call under every
//! frontend's scan (Flight's `DoGet` through the node, and the SQL engine next).
//!
//! - **Log tables** concatenate: offsets below the log's start come from the lake snapshot the
//!   read pinned, the rest from the log, each row once at its offset ([`lake_range`] says which
//!   offsets of a read step are the lake's; [`mink_lake::Lake::read_bucket`] reads them).
//! - **Primary-key tables** merge by key: the bucket's rows in the pinned snapshot (its state
//!   at the snapshot's tiered offset), then the changelog from that offset to the high
//!   watermark fixed when the read was planned; the log's latest change of a key wins and a
//!   delete removes it ([`KeyedTail`], [`read_primary_key_bucket`]). The lake's rows stream
//!   through the merge; only the changelog tail is held.
//!
//! A filter on a non-key column of a primary-key table must be applied after the merge: a lake
//! row it would drop may be replaced by a later change in the log that it would keep, and the
//! other way round. [`KeyedTail`] therefore takes an unfiltered tail.

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
    let tail = KeyedTail::new(schema, key, changes)?;
    let mut parts = base
        .iter()
        .map(|b| tail.untouched(b))
        .collect::<ReadResult<Vec<_>>>()?;
    parts.push(tail.upserts()?);
    arrow::compute::concat_batches(schema, &parts).map_err(invalid)
}

/// A primary-key bucket's changes after some offset, by key: what a merge with the bucket's
/// rows at that offset needs, so those rows can stream through it batch by batch.
#[derive(Debug)]
pub struct KeyedTail {
    schema: SchemaRef,
    key_columns: Vec<usize>,
    converter: RowConverter,
    /// The changes' rows as `schema`.
    sources: Vec<RecordBatch>,
    /// The last change of each changed key: (source, row), or None for a delete.
    last: HashMap<Vec<u8>, Option<(usize, usize)>>,
    /// Upserted keys' last changes, in the order they were made.
    upserted: Vec<(usize, usize)>,
}

impl KeyedTail {
    pub fn new(schema: &SchemaRef, key: &[String], changes: &[ChangeRows]) -> ReadResult<Self> {
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
        let mut tail = KeyedTail {
            schema: Arc::clone(schema),
            key_columns,
            converter,
            sources: Vec::with_capacity(changes.len()),
            last: HashMap::new(),
            upserted: Vec::new(),
        };
        let mut order: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        for (i, c) in changes.iter().enumerate() {
            let rows = tail.align(&c.rows)?;
            for (r, k) in tail.keys_of(&rows)?.into_iter().enumerate() {
                // A key changed twice is placed once, at its last change.
                if let Some(Some(earlier)) = tail.last.get(&k) {
                    order.remove(&changes[earlier.0].offsets[earlier.1]);
                }
                if c.upsert[r] {
                    order.insert(c.offsets[r], (i, r));
                }
                tail.last.insert(k, c.upsert[r].then_some((i, r)));
            }
            tail.sources.push(rows);
        }
        tail.upserted = order.into_values().collect();
        Ok(tail)
    }

    /// The rows of `base` (a batch of the bucket's rows before the changes) whose key no change
    /// touches, as `schema`.
    pub fn untouched(&self, base: &RecordBatch) -> ReadResult<RecordBatch> {
        let base = self.align(base)?;
        if self.last.is_empty() {
            return Ok(base);
        }
        let keep: arrow::array::BooleanArray = self
            .keys_of(&base)?
            .iter()
            .map(|k| Some(!self.last.contains_key(k)))
            .collect();
        arrow::compute::filter_record_batch(&base, &keep).map_err(invalid)
    }

    /// The last image of every upserted key, in the order of their last changes.
    pub fn upserts(&self) -> ReadResult<RecordBatch> {
        let columns = (0..self.schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn Array> =
                    self.sources.iter().map(|b| b.column(c).as_ref()).collect();
                if arrays.is_empty() {
                    return Ok(arrow::array::new_empty_array(
                        self.schema.field(c).data_type(),
                    ));
                }
                arrow::compute::interleave(&arrays, &self.upserted).map_err(invalid)
            })
            .collect::<ReadResult<Vec<_>>>()?;
        RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(self.upserted.len())),
        )
        .map_err(invalid)
    }

    /// `b` as `schema`: columns cast to its types, a missing one null, none reordered.
    fn align(&self, b: &RecordBatch) -> ReadResult<RecordBatch> {
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|f| match b.column_by_name(f.name()) {
                Some(c) => arrow::compute::cast(c, f.data_type()).map_err(invalid),
                None => Ok(arrow::array::new_null_array(f.data_type(), b.num_rows())),
            })
            .collect::<ReadResult<Vec<ArrayRef>>>()?;
        RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
        )
        .map_err(invalid)
    }

    fn keys_of(&self, b: &RecordBatch) -> ReadResult<Vec<Vec<u8>>> {
        let columns: Vec<ArrayRef> = self
            .key_columns
            .iter()
            .map(|&c| Arc::clone(b.column(c)))
            .collect();
        let rows = self.converter.convert_columns(&columns).map_err(invalid)?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    }
}

/// The union read of a primary-key bucket: its rows in lake snapshot `snapshot_id` (none if
/// the bucket has not been tiered) merged with `tail`, its changes from the snapshot's tiered
/// offset to the read's end, as batches of `schema` that meet `filter`: the lake's rows whose
/// key the tail leaves alone as the lake streams them, then the tail's upserted rows. Only the
/// tail is held in memory.
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
) -> ReadResult<futures::stream::BoxStream<'static, ReadResult<RecordBatch>>> {
    use futures::StreamExt as _;
    let prune = prune::LakePrune(filter);
    let prune = (!filter.is_empty()).then_some(&prune as &dyn mink_lake::Prune);
    let base = match snapshot_id {
        Some(s) => {
            lake.read_bucket_state(database, table, s, partition, bucket, schema, prune)
                .await?
        }
        None => futures::stream::empty().boxed(),
    };
    let tail = Arc::new(KeyedTail::new(schema, key, tail)?);
    let filter = Arc::new(filter.clone());
    let upserts = {
        let tail = Arc::clone(&tail);
        futures::stream::once(async move { tail.upserts() })
    };
    Ok(base
        .map(move |b| tail.untouched(&b?))
        .chain(upserts)
        .map(move |b| -> ReadResult<RecordBatch> { Ok(filter.apply(b?)?) })
        .boxed())
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
    fn lake_batches_stream_through_the_tail() {
        let changes = ChangeRows {
            rows: rows(&[3, 3, 7, 3, 1], &["x", "-", "g", "y", "-"]),
            offsets: vec![20, 21, 22, 23, 24],
            timestamps_us: vec![0; 5],
            upsert: vec![true, false, true, true, false],
        };
        let tail = KeyedTail::new(&schema(), &["id".into()], &[changes]).unwrap();
        let first = tail.untouched(&rows(&[1, 2, 3], &["a", "b", "c"])).unwrap();
        let second = tail.untouched(&rows(&[4, 5], &["d", "e"])).unwrap();
        assert_eq!(pairs(&first), vec![(2, "b".into())]);
        assert_eq!(pairs(&second), vec![(4, "d".into()), (5, "e".into())]);
        // Key 3, upserted, deleted and upserted again, is placed once, at its last change.
        assert_eq!(
            pairs(&tail.upserts().unwrap()),
            vec![(7, "g".into()), (3, "y".into())]
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
