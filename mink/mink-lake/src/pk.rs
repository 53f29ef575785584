//! Tiering a primary-key table: the lake holds the current row of every live key, written as
//! merge-on-read with position deletes (docs/design/0002-primary-key-tables-in-the-lake.md).
//!
//! A round keeps each key's last change in each bucket's changelog range. Keys upserted go to
//! a new data file (their last image, at the offset of that change); every changed key the
//! lake already held (upserted again or deleted) gets a position delete for its previous row.
//! The previous rows are found by reading the key columns of the bucket's live lake rows, with
//! their positions, from the snapshot the round is planned on. Data and delete files commit as
//! one `overwrite` snapshot on that same snapshot only, with the tiered offsets in its summary,
//! so the exactly-once rules of [`Lake::tier`] hold unchanged.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Int32Type, Int64Type, SchemaRef};
use arrow::row::{RowConverter, SortField};
use futures::TryStreamExt as _;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::expr::Reference;
use iceberg::metadata_columns::{delete_file_path_field, delete_file_pos_field};
use iceberg::scan::FileScanTask;
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, Datum, Operation, PartitionKey, Schema, Struct,
};
use iceberg::table::Table;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;

use crate::commit::NewSnapshot;
use crate::table::BUCKET_COLUMN;
use crate::tier::{Tiered, offset_key, tiered_offsets};
use crate::{Lake, LakeError, LakeResult};

/// Changes of a primary-key bucket, in offset order: each row is an upsert (its new image) or
/// a delete (the key columns are what counts).
#[derive(Clone, Debug)]
pub struct ChangeRows {
    /// The table's columns.
    pub rows: RecordBatch,
    /// Each row's log offset.
    pub offsets: Vec<u64>,
    /// Each row's commit time, microseconds since the epoch.
    pub timestamps_us: Vec<i64>,
    /// Whether each row upserts (`true`) or deletes (`false`) its key.
    pub upsert: Vec<bool>,
}

/// One primary-key bucket's part of a round: its changes from `start_offset` (the tiered
/// offset, or the log's start) to `end_offset` (exclusive, a committed offset).
#[derive(Clone, Debug)]
pub struct BucketChanges {
    pub partition_id: u64,
    /// The partition's key values (column → value as Mink names partitions); empty for an
    /// unpartitioned table.
    pub partition: BTreeMap<String, String>,
    pub bucket: u32,
    pub start_offset: u64,
    pub end_offset: u64,
    pub changes: Vec<ChangeRows>,
}

fn err(e: impl std::fmt::Display) -> LakeError {
    LakeError::Iceberg(e.to_string())
}

/// Position deletes ((data file, position) pairs) of one partition.
type PartitionDeletes = (Option<Struct>, Vec<(String, i64)>);

/// Where a key's live row is: its data file, the row's position, and the file's partition.
struct Location {
    file: usize,
    pos: i64,
}

/// The live rows of one bucket in a snapshot, by encoded key.
struct BucketRows {
    files: Vec<(String, Option<Struct>)>,
    keys: HashMap<Vec<u8>, Location>,
}

fn delete_schema() -> LakeResult<Schema> {
    Schema::builder()
        .with_fields(vec![
            Arc::clone(delete_file_path_field()),
            Arc::clone(delete_file_pos_field()),
        ])
        .build()
        .map_err(err)
}

async fn parquet_bytes(table: &Table, path: &str) -> LakeResult<bytes::Bytes> {
    Ok(table.file_io().new_input(path)?.read().await?)
}

/// The columns `names` of the Parquet file in `bytes`, whole.
fn read_columns(bytes: bytes::Bytes, names: &[&str]) -> LakeResult<Vec<RecordBatch>> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(err)?;
    let schema = builder.parquet_schema();
    let leaves: Vec<usize> = names
        .iter()
        .map(|n| {
            (0..schema.num_columns())
                .find(|&i| schema.column(i).path().string() == *n)
                .ok_or_else(|| err(format!("a lake file without column {n}")))
        })
        .collect::<LakeResult<_>>()?;
    let mask = ProjectionMask::leaves(schema, leaves);
    builder
        .with_projection(mask)
        .build()
        .map_err(err)?
        .map(|b| b.map_err(err))
        .collect()
}

/// The key columns of `batch` (lake-typed) encoded as comparable bytes, one per row.
fn encode_keys(
    converter: &RowConverter,
    batch: &RecordBatch,
    key: &[String],
    key_types: &[DataType],
) -> LakeResult<Vec<Vec<u8>>> {
    let columns: Vec<ArrayRef> = key
        .iter()
        .zip(key_types)
        .map(|(k, t)| {
            let c = batch
                .column_by_name(k)
                .ok_or_else(|| err(format!("rows without key column {k}")))?;
            arrow::compute::cast(c, t).map_err(err)
        })
        .collect::<LakeResult<_>>()?;
    let rows = converter.convert_columns(&columns).map_err(err)?;
    Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
}

impl Lake {
    /// Tiers a round of primary-key table `database.table` (key columns `key`) exactly once:
    /// see the module doc. `Err` when the commit failed or its answer was lost: read
    /// [`tiered_offsets`] again and plan anew, as for [`Lake::tier`].
    pub async fn tier_changes(
        &self,
        database: &str,
        table: &str,
        key: &[String],
        rounds: Vec<BucketChanges>,
    ) -> LakeResult<Tiered> {
        let base = self.load_table(database, table).await?;
        let before = tiered_offsets(&base);
        let mut offsets = before.clone();
        let arrow_schema: SchemaRef =
            Arc::new(schema_to_arrow_schema(base.metadata().current_schema()).map_err(err)?);
        let key_types: Vec<DataType> = key
            .iter()
            .map(|k| {
                arrow_schema
                    .field_with_name(k)
                    .map(|f| f.data_type().clone())
                    .map_err(|_| LakeError::Incompatible {
                        column: k.clone(),
                        reason: "the lake table lacks this primary-key column".into(),
                    })
            })
            .collect::<LakeResult<_>>()?;
        let converter = RowConverter::new(
            key_types
                .iter()
                .map(|t| SortField::new(t.clone()))
                .collect(),
        )
        .map_err(err)?;
        let mut upserts = Vec::new();
        let mut deletes: Vec<PartitionDeletes> = Vec::new();
        for round in &rounds {
            let at = (round.partition_id, round.bucket);
            let Some(from) = crate::tier::round_from(
                offsets.get(&at).copied(),
                round.bucket,
                round.start_offset..round.end_offset,
            )?
            else {
                continue;
            };
            // Each key's last change in the round: (batch, row, upsert).
            let mut last: HashMap<Vec<u8>, (usize, usize, bool)> = HashMap::new();
            let mut lake_rows: Vec<RecordBatch> = Vec::new();
            for (i, c) in round.changes.iter().enumerate() {
                let rows = crate::tier::lake_rows(
                    &arrow_schema,
                    round.bucket,
                    &c.rows,
                    &c.offsets,
                    &c.timestamps_us,
                )?;
                for (r, k) in encode_keys(&converter, &rows, key, &key_types)?
                    .into_iter()
                    .enumerate()
                {
                    if c.offsets[r] >= from && c.offsets[r] < round.end_offset {
                        last.insert(k, (i, r, c.upsert[r]));
                    }
                }
                lake_rows.push(rows);
            }
            offsets.insert(at, round.end_offset);
            if last.is_empty() {
                continue;
            }
            let held = self
                .bucket_rows(
                    &base,
                    &round.partition,
                    round.bucket,
                    key,
                    &key_types,
                    &converter,
                )
                .await?;
            let mut replaced: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
            let mut kept: Vec<(usize, usize)> = Vec::new();
            for (k, (i, r, upsert)) in &last {
                if let Some(l) = held.keys.get(k) {
                    replaced.entry(l.file).or_default().push(l.pos);
                }
                if *upsert {
                    kept.push((*i, *r));
                }
            }
            kept.sort_unstable_by_key(|&(i, r)| round.changes[i].offsets[r]);
            if !kept.is_empty() {
                let sources: Vec<&RecordBatch> = lake_rows.iter().collect();
                let columns = (0..arrow_schema.fields().len())
                    .map(|c| {
                        let arrays: Vec<&dyn Array> =
                            sources.iter().map(|b| b.column(c).as_ref()).collect();
                        arrow::compute::interleave(&arrays, &kept).map_err(err)
                    })
                    .collect::<LakeResult<Vec<_>>>()?;
                upserts
                    .push(RecordBatch::try_new(Arc::clone(&arrow_schema), columns).map_err(err)?);
            }
            for (file, mut positions) in replaced {
                positions.sort_unstable();
                let (path, partition) = &held.files[file];
                match deletes.iter_mut().find(|(p, _)| p == partition) {
                    Some((_, rows)) => {
                        rows.extend(positions.into_iter().map(|p| (path.clone(), p)))
                    }
                    None => deletes.push((
                        partition.clone(),
                        positions.into_iter().map(|p| (path.clone(), p)).collect(),
                    )),
                }
            }
        }
        if offsets == before {
            return Ok(Tiered::AlreadyTiered { offsets });
        }
        let mut added = if upserts.is_empty() {
            Vec::new()
        } else {
            self.write_data_files(&base, upserts).await?
        };
        for (partition, mut rows) in deletes {
            rows.sort_unstable();
            added.extend(self.write_position_deletes(&base, partition, rows).await?);
        }
        let properties = offsets
            .iter()
            .map(|((p, b), o)| (offset_key(*p, *b), o.to_string()))
            .collect();
        let new = NewSnapshot {
            added,
            removed: HashSet::new(),
            properties,
            unset: HashSet::new(),
        };
        let operation = if new.added.is_empty() {
            Operation::Append
        } else {
            Operation::Overwrite
        };
        let committed = self.commit_snapshot(&base, operation, new).await?;
        let snapshot_id = committed
            .metadata()
            .current_snapshot_id()
            .ok_or_else(|| err("a commit without a snapshot"))?;
        Ok(Tiered::Committed {
            snapshot_id,
            offsets,
        })
    }

    /// The live rows of `bucket` (in the partition with key values `partition`) in `table`'s
    /// current snapshot: each key's data file and row position, deletes applied.
    async fn bucket_rows(
        &self,
        table: &Table,
        partition: &BTreeMap<String, String>,
        bucket: u32,
        key: &[String],
        key_types: &[DataType],
        converter: &RowConverter,
    ) -> LakeResult<BucketRows> {
        let mut rows = BucketRows {
            files: Vec::new(),
            keys: HashMap::new(),
        };
        if table.metadata().current_snapshot().is_none() {
            return Ok(rows);
        }
        let bucket_i32 = i32::try_from(bucket).map_err(err)?;
        let filter = crate::read::in_partition(
            Reference::new(BUCKET_COLUMN).equal_to(Datum::int(bucket_i32)),
            table.metadata().current_schema(),
            partition,
        )?;
        let tasks: Vec<FileScanTask> = table
            .scan()
            .with_filter(filter)
            .build()?
            .plan_files()
            .await?
            .try_collect()
            .await?;
        let mut delete_files: HashMap<String, Vec<(String, i64)>> = HashMap::new();
        let mut names: Vec<&str> = key.iter().map(String::as_str).collect();
        names.push(BUCKET_COLUMN);
        for task in tasks {
            let mut deleted: HashSet<i64> = HashSet::new();
            for d in &task.deletes {
                if d.file_type != DataContentType::PositionDeletes {
                    return Err(err(format!(
                        "{} has equality deletes: Mink writes and reads position deletes only",
                        task.data_file_path
                    )));
                }
                if !delete_files.contains_key(&d.file_path) {
                    let mut entries = Vec::new();
                    let bytes = parquet_bytes(table, &d.file_path).await?;
                    for b in read_columns(bytes, &["file_path", "pos"])? {
                        let paths = b.column(0).as_string::<i32>();
                        let pos = b.column(1).as_primitive::<Int64Type>();
                        for r in 0..b.num_rows() {
                            entries.push((paths.value(r).to_string(), pos.value(r)));
                        }
                    }
                    delete_files.insert(d.file_path.clone(), entries);
                }
                deleted.extend(
                    delete_files[&d.file_path]
                        .iter()
                        .filter(|(p, _)| *p == task.data_file_path)
                        .map(|(_, pos)| *pos),
                );
            }
            let file = rows.files.len();
            rows.files
                .push((task.data_file_path.clone(), task.partition.clone()));
            let bytes = parquet_bytes(table, &task.data_file_path).await?;
            let mut pos = 0i64;
            for b in read_columns(bytes, &names)? {
                let buckets = b
                    .column_by_name(BUCKET_COLUMN)
                    .ok_or_else(|| err("a lake file without __bucket"))?
                    .as_primitive::<Int32Type>()
                    .clone();
                for (r, k) in encode_keys(converter, &b, key, key_types)?
                    .into_iter()
                    .enumerate()
                {
                    let here = pos + i64::try_from(r).map_err(err)?;
                    if buckets.value(r) == bucket_i32 && !deleted.contains(&here) {
                        rows.keys.insert(k, Location { file, pos: here });
                    }
                }
                pos += i64::try_from(b.num_rows()).map_err(err)?;
            }
        }
        Ok(rows)
    }

    /// A position-delete file of `rows` ((data file, position), sorted) in `partition`.
    async fn write_position_deletes(
        &self,
        table: &Table,
        partition: Option<Struct>,
        rows: Vec<(String, i64)>,
    ) -> LakeResult<Vec<DataFile>> {
        let schema = Arc::new(delete_schema()?);
        let arrow_schema = Arc::new(schema_to_arrow_schema(&schema).map_err(err)?);
        let batch = RecordBatch::try_new(
            arrow_schema,
            vec![
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.0.as_str()),
                )),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .map_err(err)?;
        let metadata = table.metadata();
        let spec = metadata.default_partition_spec();
        let key = match (&partition, spec.is_unpartitioned()) {
            (Some(p), false) => Some(PartitionKey::new(
                spec.as_ref().clone(),
                metadata.current_schema().clone(),
                p.clone(),
            )),
            _ => None,
        };
        let mut writer = RollingFileWriterBuilder::new_with_default_file_size(
            ParquetWriterBuilder::new(
                WriterProperties::builder()
                    .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                    .build(),
                schema,
            ),
            table.file_io().clone(),
            DefaultLocationGenerator::new(metadata)?,
            DefaultFileNameGenerator::new(
                format!("{}-deletes", uuid::Uuid::now_v7()),
                None,
                DataFileFormat::Parquet,
            ),
        )
        .build();
        writer.write(&key, &batch).await?;
        writer
            .close()
            .await?
            .into_iter()
            .map(|mut b| {
                b.content(DataContentType::PositionDeletes);
                if let Some(k) = &key {
                    b.partition(k.data().clone());
                    b.partition_spec_id(k.spec().spec_id());
                }
                b.build().map_err(err)
            })
            .collect()
    }
}
