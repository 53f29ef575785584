//! Tiering: a round of log rows written to Parquet and committed to the lake table exactly
//! once.
//!
//! The lake's current snapshot is the record of what is tiered: its summary holds, for every
//! bucket ever tiered, the log offset tiering reached (`mink.tiered-offset.<partition>.<bucket>`,
//! cumulative: each commit carries every bucket's offset forward). A round is planned against
//! the snapshot it read (rows below the recorded offset are dropped, a gap is refused) and
//! committed only on top of that same snapshot: if the table moved meanwhile the commit fails
//! instead of being re-applied on the new head (iceberg-rust's transactions re-apply, which
//! would store a round twice when two workers, or a worker and its own retry, tier the same
//! rows). After a failed or unanswered commit the caller reads the summary again: the rows are
//! tiered (by this round or another) or they are not, never half.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Schema as ArrowSchema, SchemaRef};
use async_trait::async_trait;
use iceberg::arrow::{RecordBatchPartitionSplitter, schema_to_arrow_schema};
use iceberg::spec::DataFileFormat;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction as _, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::partitioning::PartitioningWriter as _;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::{IcebergWriter as _, IcebergWriterBuilder as _};
use iceberg::{
    Catalog, Error, ErrorKind, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent,
};
use parquet::file::properties::WriterProperties;

use crate::table::{BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN};
use crate::{Lake, LakeError, LakeResult};

const OFFSET_KEY_PREFIX: &str = "mink.tiered-offset.";
const START_KEY_PREFIX: &str = "mink.lake-start.";

/// The snapshot summary key of the first offset the lake holds for a bucket, when that is not
/// 0 (the lake was enabled after retention had trimmed the log).
pub fn start_key(partition_id: u64, bucket: u32) -> String {
    format!("{START_KEY_PREFIX}{partition_id}.{bucket}")
}

/// `(partition_id, bucket)` → the first offset the lake holds, for buckets where that is not 0.
pub fn lake_starts(table: &Table) -> BTreeMap<(u64, u32), u64> {
    summary_offsets(table, START_KEY_PREFIX)
}

/// The snapshot summary key of a bucket's tiered offset.
pub fn offset_key(partition_id: u64, bucket: u32) -> String {
    format!("{OFFSET_KEY_PREFIX}{partition_id}.{bucket}")
}

/// `(partition_id, bucket)` → the log offset tiering reached (exclusive), as the lake table's
/// current snapshot records it. Empty before the first round.
pub fn tiered_offsets(table: &Table) -> BTreeMap<(u64, u32), u64> {
    summary_offsets(table, OFFSET_KEY_PREFIX)
}

fn summary_offsets(table: &Table, prefix: &str) -> BTreeMap<(u64, u32), u64> {
    let Some(snapshot) = table.metadata().current_snapshot() else {
        return BTreeMap::new();
    };
    snapshot
        .summary()
        .additional_properties
        .iter()
        .filter_map(|(k, v)| {
            let (partition, bucket) = k.strip_prefix(prefix)?.split_once('.')?;
            Some((
                (partition.parse().ok()?, bucket.parse().ok()?),
                v.parse().ok()?,
            ))
        })
        .collect()
}

/// Where a bucket's round `[start, end)` begins given the lake's `tiered` offset of the bucket:
/// there, or `None` when the lake holds the round already; a round that would leave a hole
/// after the tiered offset fails.
pub(crate) fn round_from(
    tiered: Option<u64>,
    bucket: u32,
    round: std::ops::Range<u64>,
) -> LakeResult<Option<u64>> {
    match tiered {
        Some(tiered) if tiered >= round.end => Ok(None),
        Some(tiered) if tiered < round.start => Err(LakeError::Gap {
            bucket,
            tiered,
            start: round.start,
        }),
        Some(tiered) => Ok(Some(tiered)),
        None => Ok(Some(round.start)),
    }
}

/// Rows of one log batch: the Mink table's columns, stored at `base_offset` onwards and
/// appended at `timestamp_us` (microseconds since the epoch).
#[derive(Clone, Debug)]
pub struct LogRows {
    pub base_offset: u64,
    pub timestamp_us: i64,
    pub rows: RecordBatch,
}

/// One bucket's part of a round: its log rows in offset order, from `start_offset` (where the
/// previous round ended, or the log's start) to `end_offset` (exclusive, a committed offset).
#[derive(Clone, Debug)]
pub struct BucketRound {
    pub partition_id: u64,
    pub bucket: u32,
    pub start_offset: u64,
    pub end_offset: u64,
    pub batches: Vec<LogRows>,
}

/// What a round did.
#[derive(Debug)]
pub enum Tiered {
    /// Committed as a new snapshot; every bucket's tiered offset after it.
    Committed {
        snapshot_id: i64,
        offsets: BTreeMap<(u64, u32), u64>,
    },
    /// The lake already held every row of the round; its tiered offsets.
    AlreadyTiered { offsets: BTreeMap<(u64, u32), u64> },
}

/// The catalog a round commits through: it loads the table as the round planned it (so
/// iceberg-rust's transaction never moves onto a newer head) and makes a failed commit final
/// (so it is not retried blindly): the snapshot requirement then fails the commit if the table
/// moved.
#[derive(Debug)]
struct Pinned<'a> {
    inner: &'a dyn Catalog,
    table: Table,
}

fn unsupported() -> Error {
    Error::new(
        ErrorKind::FeatureUnsupported,
        "a tiering commit only loads and updates its table",
    )
}

#[async_trait]
impl Catalog for Pinned<'_> {
    async fn list_namespaces(
        &self,
        _: Option<&NamespaceIdent>,
    ) -> iceberg::Result<Vec<NamespaceIdent>> {
        Err(unsupported())
    }
    async fn create_namespace(
        &self,
        _: &NamespaceIdent,
        _: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        Err(unsupported())
    }
    async fn get_namespace(&self, _: &NamespaceIdent) -> iceberg::Result<Namespace> {
        Err(unsupported())
    }
    async fn namespace_exists(&self, _: &NamespaceIdent) -> iceberg::Result<bool> {
        Err(unsupported())
    }
    async fn update_namespace(
        &self,
        _: &NamespaceIdent,
        _: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        Err(unsupported())
    }
    async fn drop_namespace(&self, _: &NamespaceIdent) -> iceberg::Result<()> {
        Err(unsupported())
    }
    async fn list_tables(&self, _: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        Err(unsupported())
    }
    async fn create_table(&self, _: &NamespaceIdent, _: TableCreation) -> iceberg::Result<Table> {
        Err(unsupported())
    }
    async fn load_table(&self, ident: &TableIdent) -> iceberg::Result<Table> {
        if ident != self.table.identifier() {
            return Err(unsupported());
        }
        Ok(self.table.clone())
    }
    async fn drop_table(&self, _: &TableIdent) -> iceberg::Result<()> {
        Err(unsupported())
    }
    async fn purge_table(&self, _: &TableIdent) -> iceberg::Result<()> {
        Err(unsupported())
    }
    async fn table_exists(&self, _: &TableIdent) -> iceberg::Result<bool> {
        Err(unsupported())
    }
    async fn rename_table(&self, _: &TableIdent, _: &TableIdent) -> iceberg::Result<()> {
        Err(unsupported())
    }
    async fn register_table(&self, _: &TableIdent, _: String) -> iceberg::Result<Table> {
        Err(unsupported())
    }
    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        self.inner
            .update_table(commit)
            .await
            .map_err(|e| e.with_retryable(false))
    }
}

/// A log batch as lake rows: the table's columns (from row `skip` on) cast to the lake's
/// Arrow types, then the bucket, each row's offset and the append timestamp.
fn lake_batch(
    schema: &SchemaRef,
    bucket: u32,
    rows: &LogRows,
    skip: usize,
) -> LakeResult<RecordBatch> {
    let n = rows.rows.num_rows() - skip;
    let first = i64::try_from(rows.base_offset + skip as u64).map_err(err)?;
    let count = i64::try_from(n).map_err(err)?;
    lake_columns(
        schema,
        bucket,
        &rows.rows.slice(skip, n),
        Int64Array::from_iter_values(first..first + count),
        TimestampMicrosecondArray::from(vec![rows.timestamp_us; n]),
    )
}

/// Rows of the table's columns as lake rows of `bucket`, at `offsets`, committed at
/// `timestamps_us`.
pub(crate) fn lake_rows(
    schema: &SchemaRef,
    bucket: u32,
    rows: &RecordBatch,
    offsets: &[u64],
    timestamps_us: &[i64],
) -> LakeResult<RecordBatch> {
    let offsets = offsets
        .iter()
        .map(|o| i64::try_from(*o).map_err(err))
        .collect::<LakeResult<Vec<_>>>()?;
    lake_columns(
        schema,
        bucket,
        rows,
        Int64Array::from(offsets),
        TimestampMicrosecondArray::from(timestamps_us.to_vec()),
    )
}

fn err(e: impl std::fmt::Display) -> LakeError {
    LakeError::Iceberg(e.to_string())
}

fn lake_columns(
    schema: &SchemaRef,
    bucket: u32,
    rows: &RecordBatch,
    offsets: Int64Array,
    timestamps: TimestampMicrosecondArray,
) -> LakeResult<RecordBatch> {
    let n = rows.num_rows();
    let offsets: ArrayRef = Arc::new(offsets);
    let timezone = match schema
        .field_with_name(TIMESTAMP_COLUMN)
        .map(|f| f.data_type())
    {
        Ok(DataType::Timestamp(_, tz)) => tz.clone(),
        _ => None,
    };
    let timestamps: ArrayRef = Arc::new(timestamps.with_timezone_opt(timezone));
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let name = field.name().as_str();
        let column: ArrayRef = match name {
            BUCKET_COLUMN => Arc::new(Int32Array::from(vec![
                i32::try_from(bucket).map_err(err)?;
                n
            ])),
            OFFSET_COLUMN => Arc::clone(&offsets),
            TIMESTAMP_COLUMN => Arc::clone(&timestamps),
            _ => match rows.column_by_name(name) {
                Some(c) => arrow::compute::cast(c, field.data_type()).map_err(|e| {
                    LakeError::Incompatible {
                        column: name.to_string(),
                        reason: e.to_string(),
                    }
                })?,
                // A lake column the Mink table lacks (an attached table): null.
                None => arrow::array::new_null_array(field.data_type(), n),
            },
        };
        columns.push(column);
    }
    RecordBatch::try_new(Arc::clone(schema), columns).map_err(err)
}

impl Lake {
    /// Tiers a round of `database.table` ([`BucketRound`] per bucket) exactly once: rows the
    /// lake holds already are dropped, the rest written to Parquet and committed with every
    /// bucket's new tiered offset in the snapshot summary, on top of the snapshot the round
    /// was planned against. `Err` when the commit failed or its answer was lost: read
    /// [`tiered_offsets`] again (another round, or this one, may have committed) and plan anew.
    pub async fn tier(
        &self,
        database: &str,
        table: &str,
        rounds: Vec<BucketRound>,
    ) -> LakeResult<Tiered> {
        let base = self.load_table(database, table).await?;
        let mut offsets = tiered_offsets(&base);
        let mut starts = lake_starts(&base);
        let arrow_schema: SchemaRef = Arc::new(
            schema_to_arrow_schema(base.metadata().current_schema())
                .map_err(|e| LakeError::Iceberg(e.to_string()))?,
        );
        let mut batches = Vec::new();
        for round in &rounds {
            let key = (round.partition_id, round.bucket);
            let Some(from) = round_from(
                offsets.get(&key).copied(),
                round.bucket,
                round.start_offset..round.end_offset,
            )?
            else {
                continue;
            };
            if !offsets.contains_key(&key) && from > 0 {
                starts.insert(key, from);
            }
            // The rows must cover [from, end) without a hole: the summary will say they do.
            let mut next = from;
            for rows in &round.batches {
                let end = rows.base_offset + rows.rows.num_rows() as u64;
                if end <= from || rows.base_offset >= round.end_offset {
                    continue;
                }
                if rows.base_offset > next {
                    break;
                }
                next = end.min(round.end_offset);
                let skip = usize::try_from(from.saturating_sub(rows.base_offset)).unwrap_or(0);
                let mut b = lake_batch(&arrow_schema, round.bucket, rows, skip)?;
                let over = usize::try_from(end.saturating_sub(round.end_offset))
                    .map_err(|e| LakeError::Iceberg(e.to_string()))?;
                if over > 0 {
                    b = b.slice(0, b.num_rows() - over);
                }
                batches.push(b);
            }
            if next != round.end_offset {
                return Err(LakeError::Gap {
                    bucket: round.bucket,
                    tiered: next,
                    start: round.end_offset,
                });
            }
            offsets.insert(key, round.end_offset);
        }
        if batches.is_empty() && offsets == tiered_offsets(&base) {
            return Ok(Tiered::AlreadyTiered { offsets });
        }
        let files = self.write_data_files(&base, batches).await?;
        let summary: HashMap<String, String> = offsets
            .iter()
            .map(|((p, b), o)| (offset_key(*p, *b), o.to_string()))
            .chain(
                starts
                    .iter()
                    .map(|((p, b), o)| (start_key(*p, *b), o.to_string())),
            )
            .collect();
        let tx = Transaction::new(&base);
        let tx = tx
            .fast_append()
            .add_data_files(files)
            .set_snapshot_properties(summary)
            .apply(tx)?;
        let pinned = Pinned {
            inner: self.catalog.as_ref(),
            table: base,
        };
        let committed = tx.commit(&pinned).await?;
        let snapshot_id = committed
            .metadata()
            .current_snapshot_id()
            .ok_or_else(|| LakeError::Iceberg("a commit without a snapshot".into()))?;
        Ok(Tiered::Committed {
            snapshot_id,
            offsets,
        })
    }

    pub(crate) async fn write_data_files(
        &self,
        table: &Table,
        batches: Vec<RecordBatch>,
    ) -> LakeResult<Vec<iceberg::spec::DataFile>> {
        let schema = table.metadata().current_schema().clone();
        let locations = DefaultLocationGenerator::new(table.metadata())?;
        // A name no other round uses (the generator numbers files from 0 every time).
        let names = DefaultFileNameGenerator::new(
            uuid::Uuid::now_v7().to_string(),
            None,
            DataFileFormat::Parquet,
        );
        let parquet = ParquetWriterBuilder::new(
            WriterProperties::builder()
                .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                .build(),
            schema,
        );
        let rolling = RollingFileWriterBuilder::new_with_default_file_size(
            parquet,
            table.file_io().clone(),
            locations,
            names,
        );
        let files = DataFileWriterBuilder::new(rolling);
        let spec = table.metadata().default_partition_spec();
        if spec.is_unpartitioned() {
            let mut writer = files.build(None).await?;
            for b in batches {
                writer.write(b).await?;
            }
            return Ok(writer.close().await?);
        }
        // A file per partition (identity on the Mink table's partition keys).
        let splitter = RecordBatchPartitionSplitter::try_new_with_computed_values(
            table.metadata().current_schema().clone(),
            spec.clone(),
        )?;
        let mut writer = FanoutWriter::new(files);
        for b in batches {
            for (key, part) in splitter.split(&b)? {
                writer.write(key, part).await?;
            }
        }
        Ok(writer.close().await?)
    }
}

/// The Arrow schema of a lake table's rows (with Iceberg field ids), for readers.
pub fn lake_arrow_schema(table: &Table) -> LakeResult<ArrowSchema> {
    schema_to_arrow_schema(table.metadata().current_schema())
        .map_err(|e| LakeError::Iceberg(e.to_string()))
}
