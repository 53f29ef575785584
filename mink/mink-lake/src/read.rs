//! Reading a bucket's history back from the lake: the rows of one bucket between two log
//! offsets, from a given snapshot, as the Mink table's rows (system columns dropped, types
//! cast back to the table's). The half of the union read below the log's start.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int32Type, Int64Type, SchemaRef};
use futures::TryStreamExt as _;
use iceberg::expr::Reference;
use iceberg::spec::Datum;

use crate::table::{BUCKET_COLUMN, OFFSET_COLUMN};
use crate::{Lake, LakeError, LakeResult};

/// Rows per batch a lake read yields (the Parquet reader's own default is 1 024: small
/// batches cost every operator above the scan per batch).
const BATCH_ROWS: usize = 8192;

/// A read's filter, as far as the lake can prune with it.
///
/// Contract: [`Prune::predicate`] returns a predicate over the lake table of schema `lake`
/// that every row the reader wants meets (`None`: no pruning). The lake skips the files and
/// row groups whose statistics rule it out and drops the rows it rejects; the reader still
/// applies whatever part of its filter the predicate leaves out.
pub trait Prune: Send + Sync {
    fn predicate(&self, lake: &iceberg::spec::Schema) -> Option<iceberg::expr::Predicate>;
}

impl Lake {
    /// The rows of `bucket` at `offsets` in snapshot `snapshot_id` of the lake table
    /// of `database.table`, in offset order, as batches of `schema` (the Mink table's
    /// columns, and the system columns `__bucket`, `__offset`, `__timestamp` it names; a
    /// column the lake lacks reads as null). Fails if the lake lacks any offset of
    /// the range: a reader is never handed a hole. In a partitioned table the bucket is the
    /// one of the partition whose key columns hold `partition` (column → value, as Mink names
    /// partitions); empty for an unpartitioned table. With `prune`, only rows that meet its
    /// predicate, in offset order (holes are then the filter's, so none is checked).
    #[allow(clippy::too_many_arguments)]
    pub async fn read_bucket(
        &self,
        database: &str,
        table: &str,
        snapshot_id: i64,
        partition: &BTreeMap<String, String>,
        bucket: u32,
        offsets: std::ops::Range<u64>,
        schema: &SchemaRef,
        prune: Option<&dyn Prune>,
    ) -> LakeResult<Vec<RecordBatch>> {
        let (from, to) = (offsets.start, offsets.end);
        let t = self
            .table_with_snapshot(database, table, snapshot_id)
            .await?;
        let as_i64 = |o: u64| i64::try_from(o).map_err(|e| LakeError::Iceberg(e.to_string()));
        let (lo, hi) = (as_i64(from)?, as_i64(to)?);
        let bucket_i32 = i32::try_from(bucket).map_err(|e| LakeError::Iceberg(e.to_string()))?;
        // Offset bounds the snapshot's rows meet anyway are left out: each is a row filter
        // on every row read (the whole bucket, the usual lake read, needs neither).
        let covered = t
            .metadata()
            .snapshot_by_id(snapshot_id)
            .is_some_and(|snap| {
                snap.summary()
                    .additional_properties
                    .iter()
                    .filter_map(|(k, v)| {
                        let (_, b) = k.strip_prefix("mink.tiered-offset.")?.split_once('.')?;
                        (b.parse::<u32>().ok()? == bucket).then(|| v.parse::<u64>().ok())?
                    })
                    .all(|tiered| tiered <= to)
            });
        let mut filter = Reference::new(BUCKET_COLUMN).equal_to(Datum::int(bucket_i32));
        if lo > 0 {
            filter =
                filter.and(Reference::new(OFFSET_COLUMN).greater_than_or_equal_to(Datum::long(lo)));
        }
        if !covered {
            filter = filter.and(Reference::new(OFFSET_COLUMN).less_than(Datum::long(hi)));
        }
        let lake_schema = &snapshot_schema(&t, snapshot_id);
        let filter = in_partition(filter, lake_schema, partition)?;
        let pruned = prune.and_then(|p| p.predicate(lake_schema));
        let filtered = pruned.is_some();
        let filter = match pruned {
            Some(p) => filter.and(p),
            None => filter,
        };
        // The columns of `schema` the lake has (`__timestamp` only when asked for), and what
        // the checks need.
        let mut columns: Vec<&str> = schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .filter(|n| lake_schema.field_by_name(n).is_some())
            .collect();
        for system in [BUCKET_COLUMN, OFFSET_COLUMN] {
            if !columns.contains(&system) {
                columns.push(system);
            }
        }
        let batches: Vec<RecordBatch> = t
            .scan()
            .snapshot_id(snapshot_id)
            .select(columns)
            .with_filter(filter)
            .with_batch_size(Some(BATCH_ROWS))
            .build()?
            .to_arrow()
            .await?
            .try_collect()
            .await?;
        // The usual case: the scan returns exactly offsets lo..hi, in order (files come back
        // in the order rounds wrote them). Checked without gathering anything.
        // Each batch that holds only this bucket's rows at consecutive offsets: its first.
        let run = |b: &RecordBatch| -> Option<i64> {
            let (Ok(buckets), Ok(offsets)) = (column(b, BUCKET_COLUMN), column(b, OFFSET_COLUMN))
            else {
                return None;
            };
            let (buckets, offsets) = (
                buckets.as_primitive::<Int32Type>(),
                offsets.as_primitive::<Int64Type>(),
            );
            let first = *offsets.values().first()?;
            let whole = buckets.null_count() == 0
                && offsets.null_count() == 0
                && buckets.values().iter().all(|x| *x == bucket_i32)
                && offsets
                    .values()
                    .iter()
                    .zip(first..)
                    .all(|(o, want)| *o == want);
            whole.then_some(first)
        };
        // The usual case: every batch is such a run (files are read concurrently, so the runs
        // may come in any order) and, in order, they cover lo..hi exactly. Then the batches
        // go as they are, reordered, without copying a row.
        let mut runs: Option<Vec<(i64, usize)>> = (!filtered).then_some(()).and(
            batches
                .iter()
                .enumerate()
                .filter(|(_, b)| b.num_rows() > 0)
                .map(|(i, b)| run(b).map(|first| (first, i)))
                .collect(),
        );
        if let Some(runs) = runs.as_mut() {
            runs.sort_unstable();
            let mut expect = lo;
            let covers = runs.iter().all(|&(first, i)| {
                let here = first == expect;
                expect += i64::try_from(batches[i].num_rows()).unwrap_or(i64::MAX);
                here
            }) && expect == hi;
            if covers {
                return runs
                    .iter()
                    .map(|&(_, i)| {
                        as_table_rows(schema, &[&batches[i]], None, batches[i].num_rows())
                    })
                    .collect();
            }
        }
        let indices = gather(&batches, bucket, bucket_i32, lo, hi, !filtered)?;
        let all: Vec<&RecordBatch> = batches.iter().collect();
        Ok(vec![as_table_rows(
            schema,
            &all,
            Some(&indices),
            indices.len(),
        )?])
    }
}

impl Lake {
    /// Every live row of `bucket` (in the partition with key values `partition`) in snapshot
    /// `snapshot_id` of `database.table`, deletes applied, as a stream of batches of `schema`
    /// (the Mink table's columns): a primary-key bucket's state as of its tiered offset, read
    /// as it streams, not held. With `prune`, only the rows that meet its predicate.
    #[allow(clippy::too_many_arguments)]
    pub async fn read_bucket_state(
        &self,
        database: &str,
        table: &str,
        snapshot_id: i64,
        partition: &BTreeMap<String, String>,
        bucket: u32,
        schema: &SchemaRef,
        prune: Option<&dyn Prune>,
    ) -> LakeResult<futures::stream::BoxStream<'static, LakeResult<RecordBatch>>> {
        use futures::StreamExt as _;
        let t = self
            .table_with_snapshot(database, table, snapshot_id)
            .await?;
        let bucket_i32 = i32::try_from(bucket).map_err(|e| LakeError::Iceberg(e.to_string()))?;
        let lake_schema = &snapshot_schema(&t, snapshot_id);
        let filter = in_partition(
            Reference::new(BUCKET_COLUMN).equal_to(Datum::int(bucket_i32)),
            lake_schema,
            partition,
        )?;
        let filter = match prune.and_then(|p| p.predicate(lake_schema)) {
            Some(p) => filter.and(p),
            None => filter,
        };
        let batches = t
            .scan()
            .snapshot_id(snapshot_id)
            .with_filter(filter)
            .with_batch_size(Some(BATCH_ROWS))
            .build()?
            .to_arrow()
            .await?;
        let schema = Arc::clone(schema);
        Ok(batches
            .map(move |b| {
                let b = b?;
                as_table_rows(&schema, &[&b], None, b.num_rows())
            })
            .boxed())
    }
}

/// The schema snapshot `snapshot_id` was written under: a scan of it resolves column names
/// and filters against this one, so a column added since (which reads as null) is left out.
fn snapshot_schema(t: &iceberg::table::Table, snapshot_id: i64) -> iceberg::spec::SchemaRef {
    let metadata = t.metadata();
    metadata
        .snapshot_by_id(snapshot_id)
        .and_then(|s| s.schema(metadata).ok())
        .unwrap_or_else(|| metadata.current_schema().clone())
}

/// `rows` rows of `batches` (all of them in order, or the `indices`) as a batch of `schema`:
/// its columns cast back to the table's types, a column the lake lacks null.
fn as_table_rows(
    schema: &SchemaRef,
    batches: &[&RecordBatch],
    indices: Option<&[(usize, usize)]>,
    rows: usize,
) -> LakeResult<RecordBatch> {
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let arrays: Option<Vec<&dyn Array>> = batches
            .iter()
            .map(|b| b.column_by_name(field.name()).map(AsRef::as_ref))
            .collect();
        let column = match arrays {
            Some(arrays) if !arrays.is_empty() => {
                let taken = match (indices, arrays.as_slice()) {
                    (None, [one]) => arrow::array::make_array(one.to_data()),
                    (None, _) => arrow::compute::concat(&arrays)
                        .map_err(|e| LakeError::Iceberg(e.to_string()))?,
                    (Some(indices), _) => arrow::compute::interleave(&arrays, indices)
                        .map_err(|e| LakeError::Iceberg(e.to_string()))?,
                };
                arrow::compute::cast(&taken, field.data_type()).map_err(|e| {
                    LakeError::Incompatible {
                        column: field.name().clone(),
                        reason: e.to_string(),
                    }
                })?
            }
            _ => arrow::array::new_null_array(field.data_type(), rows),
        };
        columns.push(column);
    }
    RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
    )
    .map_err(|e| LakeError::Iceberg(e.to_string()))
}

/// `filter` narrowed to the partition whose key columns hold `partition` (none: as is).
pub(crate) fn in_partition(
    mut filter: iceberg::expr::Predicate,
    schema: &iceberg::spec::Schema,
    partition: &BTreeMap<String, String>,
) -> LakeResult<iceberg::expr::Predicate> {
    for (column, value) in partition {
        filter =
            filter.and(Reference::new(column).equal_to(partition_datum(schema, column, value)?));
    }
    Ok(filter)
}

/// The typed value a partition name gives `column` (Mink names partitions by the values'
/// text: strings as they are, integers, dates as `YYYY-MM-DD`, booleans).
pub(crate) fn partition_datum(
    schema: &iceberg::spec::Schema,
    column: &str,
    value: &str,
) -> LakeResult<Datum> {
    use iceberg::spec::{PrimitiveType as P, Type};
    let field = schema
        .field_by_name(column)
        .ok_or_else(|| LakeError::Incompatible {
            column: column.to_string(),
            reason: "the lake table has no such partition column".into(),
        })?;
    let bad = |e: &dyn std::fmt::Display| LakeError::Incompatible {
        column: column.to_string(),
        reason: format!("partition value {value:?}: {e}"),
    };
    match field.field_type.as_ref() {
        Type::Primitive(P::String) => Ok(Datum::string(value)),
        Type::Primitive(P::Int) => Ok(Datum::int(value.parse::<i32>().map_err(|e| bad(&e))?)),
        Type::Primitive(P::Long) => Ok(Datum::long(value.parse::<i64>().map_err(|e| bad(&e))?)),
        Type::Primitive(P::Boolean) => Ok(Datum::bool(value.parse::<bool>().map_err(|e| bad(&e))?)),
        Type::Primitive(P::Date) => Datum::date_from_str(value).map_err(|e| bad(&e)),
        other => Err(bad(&format!(
            "a partition column of type {other} is not supported"
        ))),
    }
}

fn column<'a>(b: &'a RecordBatch, name: &str) -> LakeResult<&'a arrow::array::ArrayRef> {
    b.column_by_name(name)
        .ok_or_else(|| LakeError::Iceberg(format!("the lake's rows lack {name}")))
}

/// `(batch, row)` of every row of `bucket` at offsets `[lo, hi)` in `batches`, in offset order;
/// with `whole`, a hole fails.
fn gather(
    batches: &[RecordBatch],
    bucket: u32,
    bucket_i32: i32,
    lo: i64,
    hi: i64,
    whole: bool,
) -> LakeResult<Vec<(usize, usize)>> {
    let mut rows: Vec<(i64, usize, usize)> = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        let buckets = column(b, BUCKET_COLUMN)?
            .as_primitive::<Int32Type>()
            .clone();
        let offsets = column(b, OFFSET_COLUMN)?
            .as_primitive::<Int64Type>()
            .clone();
        for r in 0..b.num_rows() {
            let o = offsets.value(r);
            if buckets.value(r) == bucket_i32 && (lo..hi).contains(&o) {
                rows.push((o, i, r));
            }
        }
    }
    rows.sort_unstable();
    if !whole {
        return Ok(rows.into_iter().map(|(_, b, r)| (b, r)).collect());
    }
    let as_u64 = |o: i64| u64::try_from(o).unwrap_or(0);
    for (k, (o, _, _)) in rows.iter().enumerate() {
        let want = lo + i64::try_from(k).unwrap_or(i64::MAX);
        if *o != want {
            return Err(LakeError::Gap {
                bucket,
                tiered: as_u64(want),
                start: as_u64(*o),
            });
        }
    }
    let covered = lo + i64::try_from(rows.len()).unwrap_or(i64::MAX);
    if covered != hi {
        return Err(LakeError::Gap {
            bucket,
            tiered: as_u64(covered),
            start: as_u64(hi),
        });
    }
    Ok(rows.into_iter().map(|(_, b, r)| (b, r)).collect())
}

/// A read of one lake snapshot split into its data files: what an engine reading the lake
/// straight from object storage runs, a group of files per task, in parallel.
#[derive(Clone, Debug)]
pub struct LakeSplits {
    table: iceberg::table::Table,
    snapshot_id: i64,
    /// One task per data file the filter may match (deletes attached).
    pub tasks: Vec<iceberg::scan::FileScanTask>,
}

impl Lake {
    /// The data files of snapshot `snapshot_id` of `database.table` that may hold rows meeting
    /// `prune` (all of them without), reading the lake columns of `schema` (the Mink table's
    /// columns the reader wants). For a partitioned table, only the files of `partitions` (each
    /// partition's key values, as Mink names them): the partitions that exist at the reader's
    /// cut, so a dropped one's files, until its removal from the lake is recorded, are not read.
    pub async fn plan_splits(
        &self,
        database: &str,
        table: &str,
        snapshot_id: i64,
        schema: &SchemaRef,
        prune: Option<&dyn Prune>,
        partitions: Option<&[BTreeMap<String, String>]>,
    ) -> LakeResult<LakeSplits> {
        let t = self
            .table_with_snapshot(database, table, snapshot_id)
            .await?;
        let lake_schema = &snapshot_schema(&t, snapshot_id);
        let columns: Vec<&str> = schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .filter(|n| lake_schema.field_by_name(n).is_some())
            .collect();
        let mut scan = t.scan().snapshot_id(snapshot_id).select(columns);
        if let Some(p) = prune.and_then(|p| p.predicate(lake_schema)) {
            scan = scan.with_filter(p);
        }
        let mut tasks: Vec<iceberg::scan::FileScanTask> =
            scan.build()?.plan_files().await?.try_collect().await?;
        if let Some(partitions) = partitions {
            // Each live partition as the lake's partition tuple (identity on the keys, in
            // the spec's order).
            let spec = t.metadata().default_partition_spec();
            let mut live = Vec::with_capacity(partitions.len());
            for values in partitions {
                let tuple = spec
                    .fields()
                    .iter()
                    .map(|f| {
                        let column = lake_schema
                            .field_by_id(f.source_id)
                            .map(|c| c.name.clone())
                            .unwrap_or_default();
                        let text = values.get(&column).ok_or_else(|| LakeError::Incompatible {
                            column: column.clone(),
                            reason: "a partition without a value for this key".into(),
                        })?;
                        Ok(partition_datum(lake_schema, &column, text)?
                            .literal()
                            .clone())
                    })
                    .collect::<LakeResult<Vec<_>>>()?;
                live.push(tuple);
            }
            tasks.retain(|task| {
                let Some(p) = &task.partition else {
                    return true;
                };
                let tuple: Vec<Option<iceberg::spec::PrimitiveLiteral>> = p
                    .iter()
                    .map(|l| l.and_then(iceberg::spec::Literal::as_primitive_literal))
                    .collect();
                live.iter().any(|l| {
                    l.len() == tuple.len()
                        && l.iter().zip(&tuple).all(|(a, b)| b.as_ref() == Some(a))
                })
            });
        }
        Ok(LakeSplits {
            table: t,
            snapshot_id,
            tasks,
        })
    }
}

/// What a data file's manifest entry records of one column: its null count and bounds (each a
/// one-row array of the lake's type; a string's may be truncated, so they bound the values
/// rather than equal the extremes), when written.
#[derive(Clone, Debug, Default)]
pub struct ColumnStats {
    pub null_count: Option<u64>,
    pub min: Option<arrow::array::ArrayRef>,
    pub max: Option<arrow::array::ArrayRef>,
}

impl LakeSplits {
    /// Per task, per column of `schema` (by name; a column the lake lacks: nothing known), the
    /// statistics its data file's manifest entry records. Reads the snapshot's data manifests.
    pub async fn column_stats(&self, schema: &SchemaRef) -> LakeResult<Vec<Vec<ColumnStats>>> {
        let metadata = self.table.metadata();
        let lake_schema = metadata.current_schema();
        let ids: Vec<Option<i32>> = schema
            .fields()
            .iter()
            .map(|f| lake_schema.field_by_name(f.name()).map(|l| l.id))
            .collect();
        let paths: std::collections::HashSet<&str> = self
            .tasks
            .iter()
            .map(|t| t.data_file_path.as_str())
            .collect();
        let mut by_path: std::collections::HashMap<String, Vec<ColumnStats>> =
            std::collections::HashMap::new();
        let Some(snapshot) = metadata.snapshot_by_id(self.snapshot_id) else {
            return Ok(vec![
                vec![ColumnStats::default(); ids.len()];
                self.tasks.len()
            ]);
        };
        let list = self.table.manifest_list_reader(snapshot).load().await?;
        for manifest_file in list.entries() {
            if manifest_file.content != iceberg::spec::ManifestContentType::Data {
                continue;
            }
            let manifest = manifest_file.load_manifest(self.table.file_io()).await?;
            for entry in manifest.entries() {
                if !entry.is_alive() || !paths.contains(entry.file_path()) {
                    continue;
                }
                let file = entry.data_file();
                let bound = |d: Option<&Datum>| d.and_then(datum_array);
                let columns = ids
                    .iter()
                    .map(|id| match id {
                        Some(id) => ColumnStats {
                            null_count: file.null_value_counts().get(id).copied(),
                            min: bound(file.lower_bounds().get(id)),
                            max: bound(file.upper_bounds().get(id)),
                        },
                        None => ColumnStats::default(),
                    })
                    .collect();
                by_path.insert(entry.file_path().to_string(), columns);
            }
        }
        Ok(self
            .tasks
            .iter()
            .map(|t| {
                by_path
                    .get(&t.data_file_path)
                    .cloned()
                    .unwrap_or_else(|| vec![ColumnStats::default(); ids.len()])
            })
            .collect())
    }

    /// The rows of `tasks` (some of [`LakeSplits::tasks`]) as batches of `schema` (a column the
    /// lake lacks reads as null) of up to `batch_rows` rows, files read concurrently.
    pub fn read(
        &self,
        tasks: Vec<iceberg::scan::FileScanTask>,
        schema: SchemaRef,
        batch_rows: usize,
    ) -> LakeResult<futures::stream::BoxStream<'static, LakeResult<RecordBatch>>> {
        use futures::StreamExt as _;
        let tasks: iceberg::scan::FileScanTaskStream =
            futures::stream::iter(tasks.into_iter().map(Ok)).boxed();
        let batches = self
            .table
            .reader_builder()
            .with_batch_size(batch_rows)
            .build()
            .read(tasks)?
            .stream();
        Ok(batches
            .map(move |b| {
                let b = b?;
                as_table_rows(&schema, &[&b], None, b.num_rows())
            })
            .boxed())
    }
}

/// An Iceberg bound as a one-row Arrow array of the lake's type (`None` for types without a
/// plain Arrow equivalent here).
fn datum_array(d: &Datum) -> Option<arrow::array::ArrayRef> {
    use arrow::array::{
        BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array,
        Int32Array, Int64Array, StringArray, TimestampMicrosecondArray,
    };
    use iceberg::spec::{PrimitiveLiteral as L, PrimitiveType as T};
    let array: arrow::array::ArrayRef = match (d.data_type(), d.literal()) {
        (T::Boolean, L::Boolean(v)) => Arc::new(BooleanArray::from(vec![*v])),
        (T::Int, L::Int(v)) => Arc::new(Int32Array::from(vec![*v])),
        (T::Long, L::Long(v)) => Arc::new(Int64Array::from(vec![*v])),
        (T::Float, L::Float(v)) => Arc::new(Float32Array::from(vec![v.into_inner()])),
        (T::Double, L::Double(v)) => Arc::new(Float64Array::from(vec![v.into_inner()])),
        (T::String, L::String(v)) => Arc::new(StringArray::from(vec![v.as_str()])),
        (T::Binary, L::Binary(v)) => Arc::new(BinaryArray::from(vec![v.as_slice()])),
        (T::Date, L::Int(v)) => Arc::new(Date32Array::from(vec![*v])),
        (T::Timestamp, L::Long(v)) => Arc::new(TimestampMicrosecondArray::from(vec![*v])),
        (T::Timestamptz, L::Long(v)) => {
            Arc::new(TimestampMicrosecondArray::from(vec![*v]).with_timezone("+00:00"))
        }
        (T::Decimal { precision, scale }, L::Int128(v)) => Arc::new(
            Decimal128Array::from(vec![*v])
                .with_precision_and_scale(
                    u8::try_from(*precision).ok()?,
                    i8::try_from(*scale).ok()?,
                )
                .ok()?,
        ),
        _ => return None,
    };
    Some(array)
}
