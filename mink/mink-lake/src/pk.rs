//! Tiering a primary-key table: the lake holds the current row of every live key, written as
//! merge-on-read with position deletes (docs/design/0002-primary-key-tables-in-the-lake.md).
//!
//! A round keeps each key's last change in each bucket's changelog range. Keys upserted go to
//! a new data file (their last image, at the offset of that change); every changed key the
//! lake already held (upserted again or deleted) gets a position delete for its previous row,
//! found in the table's key-location index ([`crate::keys`]) as of the snapshot the round is
//! planned on. Data and delete files commit as
//! one `overwrite` snapshot on that same snapshot only, with the tiered offsets in its summary,
//! so the exactly-once rules of [`Lake::tier`] hold unchanged.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::SchemaRef;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::metadata_columns::{delete_file_path_field, delete_file_pos_field};
use iceberg::spec::{
    DataContentType, DataFile, DataFileFormat, Literal, Operation, PartitionKey, Schema, Struct,
};
use iceberg::table::Table;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use parquet::file::properties::WriterProperties;

use crate::commit::NewSnapshot;
use crate::keys::KeyCodec;
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

/// The partition value (identity on the table's partition columns) whose columns hold
/// `partition` (column → value, as Mink names partitions); `None` for an unpartitioned table.
fn partition_struct(
    table: &Table,
    partition: &BTreeMap<String, String>,
) -> LakeResult<Option<Struct>> {
    let metadata = table.metadata();
    let spec = metadata.default_partition_spec();
    if spec.is_unpartitioned() {
        return Ok(None);
    }
    let schema = metadata.current_schema();
    spec.fields()
        .iter()
        .map(|f| {
            let column = schema
                .field_by_id(f.source_id)
                .ok_or_else(|| err(format!("partition field {} without a column", f.name)))?
                .name
                .clone();
            let value = partition.get(&column).ok_or_else(|| {
                err(format!(
                    "a round without a value of partition column {column}"
                ))
            })?;
            let datum = crate::read::partition_datum(schema, &column, value)?;
            Ok(Some(Literal::Primitive(datum.literal().clone())))
        })
        .collect::<LakeResult<Struct>>()
        .map(Some)
}

/// Position deletes ((data file, position) pairs) of one partition.
type PartitionDeletes = (Option<Struct>, Vec<(String, i64)>);

fn delete_schema() -> LakeResult<Schema> {
    Schema::builder()
        .with_fields(vec![
            Arc::clone(delete_file_path_field()),
            Arc::clone(delete_file_pos_field()),
        ])
        .build()
        .map_err(err)
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
        let mut base = self.load_table(database, table).await?;
        let codec = KeyCodec::new(
            &schema_to_arrow_schema(base.metadata().current_schema()).map_err(err)?,
            key,
        )?;
        // Held for the round: the table's rounds on this lake take turns.
        let index = self.key_index(database, table, &mut base, &codec).await?;
        let before = tiered_offsets(&base);
        let mut offsets = before.clone();
        let arrow_schema: SchemaRef =
            Arc::new(schema_to_arrow_schema(base.metadata().current_schema()).map_err(err)?);
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
                for (r, k) in codec.encode(&rows)?.into_iter().enumerate() {
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
            let changed: Vec<&[u8]> = last.keys().map(Vec::as_slice).collect();
            let held = index.locate(&changed)?;
            let mut replaced: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            let mut kept: Vec<(usize, usize)> = Vec::new();
            for ((i, r, upsert), at) in last.values().zip(held) {
                if let Some((file, pos)) = at {
                    replaced.entry(file).or_default().push(pos);
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
            // A key never leaves its partition (the partition columns are part of the key):
            // the rows it replaces are in this round's partition.
            let partition = partition_struct(&base, &round.partition)?;
            for (path, mut positions) in replaced {
                positions.sort_unstable();
                match deletes.iter_mut().find(|(p, _)| *p == partition) {
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
        // The next round would catch up anyway; now, it starts from this snapshot.
        if let Err(e) = self.catch_up(&committed, &index, &codec).await {
            tracing::warn!(error = %e, table, "key index behind its lake");
        }
        let snapshot_id = committed
            .metadata()
            .current_snapshot_id()
            .ok_or_else(|| err("a commit without a snapshot"))?;
        Ok(Tiered::Committed {
            snapshot_id,
            offsets,
        })
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
