//! Primary-key tables on the node: KV tablets of the buckets this node leads, writes with row
//! kinds and partial updates, lookups, snapshot scans, the changelog, and KV snapshots.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array};
use arrow::compute::{cast, interleave_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema};
use mink_kv::changelog;
use mink_kv::merge::KvWrite;
use mink_kv::{KvError, KvScan, KvTableDef, KvTablet, KvTabletConfig, SnapshotSource};
use mink_log::options::TableOptions;
use mink_log::routing::{buckets_of, partitions_of};
use mink_metadata::{Command, CommitKvSnapshot, TableRecord};
use object_store::ObjectStoreExt as _;

use crate::node::{PendingWrite, WriteTarget};
use crate::{BucketRef, Node, NodeError, NodeResult};

/// The column that marks a row of a primary-key write as an upsert or a delete.
pub const ROW_KIND: &str = "_row_kind";

impl From<arrow::error::ArrowError> for NodeError {
    fn from(e: arrow::error::ArrowError) -> Self {
        NodeError::Invalid(e.to_string())
    }
}

impl From<KvError> for NodeError {
    fn from(e: KvError) -> Self {
        match e {
            KvError::Invalid(m) => NodeError::Invalid(m),
            KvError::DeletionDisabled => NodeError::Invalid(e.to_string()),
            KvError::Log(l) => l.into(),
            KvError::Stream(s) => s.into(),
            KvError::Arrow(a) => NodeError::Invalid(a.to_string()),
            KvError::Aborted(_) => NodeError::Unavailable(e.to_string()),
            KvError::Store(_) => NodeError::Unavailable(e.to_string()),
        }
    }
}

/// A KV tablet this node has open, and the leader epoch it was opened under.
#[derive(Clone, Debug)]
pub(crate) struct OpenKv {
    pub(crate) leader_epoch: u64,
    pub(crate) tablet: KvTablet,
}

impl Node {
    /// The primary-key definition of a table.
    pub(crate) fn kv_definition(&self, record: &TableRecord) -> NodeResult<Arc<KvTableDef>> {
        self.described(record)?.1.ok_or_else(|| {
            NodeError::Invalid(format!(
                "{}.{} is a log table: it has no primary key",
                record.database, record.name
            ))
        })
    }

    /// The KV tablet of a bucket this node leads (opened, and its working copy brought up to
    /// date, on first use), or where to go instead.
    pub async fn kv_tablet(
        &self,
        record: &TableRecord,
        partition_id: u64,
        bucket: u32,
    ) -> NodeResult<KvTablet> {
        let key = (record.table_id, partition_id, bucket);
        // Leadership first: redirects, waiting for a leader, opening the stream.
        self.tablet(record, partition_id, bucket).await?;
        let Some(led) = self.inner.led.read().expect("led lock").get(&key).copied() else {
            return Err(NodeError::Unavailable(format!(
                "bucket {bucket} of {}.{} changed leader; retry",
                record.database, record.name
            )));
        };
        // A failed tablet (an append or its working copy failed) is reopened: replay brings a
        // fresh one to the stream's committed end.
        let open = |kv: &std::collections::HashMap<_, OpenKv>| {
            kv.get(&key)
                .filter(|o| o.leader_epoch == led.leader_epoch && !o.tablet.is_failed())
                .map(|o| o.tablet.clone())
        };
        if let Some(t) = open(&self.inner.kv.read().expect("kv lock")) {
            return Ok(t);
        }
        let _opening = self.inner.kv_opening.lock().await;
        if let Some(t) = open(&self.inner.kv.read().expect("kv lock")) {
            return Ok(t);
        }
        // Let go of the old one first: its working copy file can be open once only.
        self.inner.kv.write().expect("kv lock").remove(&key);
        let def = self.kv_definition(record)?;
        let options = TableOptions::parse(&record.options)?;
        let snapshot = self
            .view()
            .state
            .kv_snapshots
            .values()
            .filter(|s| (s.table_id, s.partition_id, s.bucket) == key)
            .max_by_key(|s| s.snapshot_id)
            .map(|s| SnapshotSource {
                objects: self.inner.streams.object_store(),
                location: object_store::path::Path::from(s.location.as_str()),
                log_offset: s.log_offset,
            });
        let path = self.inner.config.kv_dir.join(format!(
            "{}/{}/{}.redb",
            record.table_id, partition_id, bucket
        ));
        let started = std::time::Instant::now();
        let tablet = KvTablet::open(
            self.inner.streams.clone(),
            led.stream_id,
            def,
            &path,
            &KvTabletConfig {
                compression: options.compression,
                identity: format!(
                    "{} table {} created {}",
                    self.inner.config.metadata_url, record.table_id, record.created_at_ms
                ),
                auto_increment_sequence: format!("auto-increment/table-{}", record.table_id),
                clock: Arc::clone(&self.inner.config.clock),
                ..KvTabletConfig::default()
            },
            snapshot.as_ref(),
        )
        .await?;
        tracing::info!(
            table = %record.name,
            partition = partition_id,
            bucket,
            leader_epoch = led.leader_epoch,
            offset = tablet.applied_offset().unwrap_or_default(),
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "KV tablet open"
        );
        self.inner.kv.write().expect("kv lock").insert(
            key,
            OpenKv {
                leader_epoch: led.leader_epoch,
                tablet: tablet.clone(),
            },
        );
        Ok(tablet)
    }

    /// Writes to a primary-key table. The batch holds the table's columns, or in a partial
    /// update the key and the columns to set (`columns` names them; by default the batch's
    /// own columns when they are not all of the table's; `target.columns` names them otherwise), and optionally a last column
    /// [`ROW_KIND`] (`upsert` or `delete`, Utf8). Routed and answered per bucket like a log
    /// write; each bucket's rows are merged in order by its leader.
    pub async fn submit_kv_write(
        &self,
        database: &str,
        table: &str,
        batch: &RecordBatch,
        target: &WriteTarget,
    ) -> NodeResult<PendingWrite> {
        let record = self.table_record(database, table)?;
        let def = self.kv_definition(&record)?;
        let schema = Arc::clone(&def.schema);
        let (batch, deletes) = split_row_kind(batch)?;
        // Refused as a whole, before any bucket stores anything.
        if deletes.true_count() > 0 && def.delete_behavior == mink_kv::DeleteBehavior::Disable {
            return Err(KvError::DeletionDisabled.into());
        }
        // Checked with the auto-increment column nullable: writers leave it out.
        let write_schema = def.write_schema();
        let (full, targets) = widen(&def, &batch, target.columns.as_deref())?;
        if let Some(t) = &targets {
            def.check_partial_update(t)?;
        }
        let full = mink_log::codec::check_batch(&write_schema, &full)?;
        if let Some(c) = def.auto_increment
            && full.column(c).null_count() < full.num_rows()
        {
            return Err(NodeError::Invalid(format!(
                "column {:?} is auto-increment: its values are generated, leave it out",
                schema.field(c).name()
            )));
        }
        if full.num_rows() == 0 {
            return Ok(PendingWrite::ready(Vec::new()));
        }
        // The row kinds travel with the rows through routing as a last column.
        let mut columns_with_kind = full.columns().to_vec();
        columns_with_kind.push(Arc::new(deletes));
        let mut fields: Vec<Field> = write_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(ROW_KIND, DataType::Boolean, false));
        let with_kind = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns_with_kind)?;
        let parts = self.route(&record, &schema, with_kind, target).await?;
        // Rows a frontend may forward to another leader: a routed write of whole rows.
        let routed_full = target.is_routed() && targets.is_none();
        let mut submitted = Vec::with_capacity(parts.len());
        for (partition, partition_id, b, part) in parts {
            let rows = part.num_rows();
            let n = part.num_columns();
            let deletes = part.column(n - 1).as_boolean().clone();
            let write = KvWrite {
                batch: RecordBatch::try_new(
                    Arc::clone(&write_schema),
                    part.columns()[..n - 1].to_vec(),
                )?,
                deletes: (deletes.true_count() > 0).then_some(deletes),
                targets: targets.clone(),
            };
            let (pending, unsent) = match self.kv_tablet(&record, partition_id, b).await {
                Ok(tablet) => (
                    tablet
                        .submit(write, target.writer)
                        .await
                        .map_err(NodeError::from),
                    None,
                ),
                Err(e @ NodeError::NotLeader { .. }) if routed_full => {
                    (Err(e), Some(with_row_kind(&write)?))
                }
                Err(e) => (Err(e), None),
            };
            submitted.push((partition, partition_id, b, rows, pending, unsent));
        }
        Ok(PendingWrite::of(
            submitted,
            |pending: mink_kv::PendingKv| async move {
                let ack = pending.await?;
                let (base_offset, end_offset) = ack.offsets.unwrap_or((0, 0));
                Ok(s3stream::AppendAck {
                    base_offset,
                    end_offset,
                    duplicate: ack.duplicate,
                })
            },
        ))
    }

    /// Point lookup: `keys` holds the primary-key columns (by name; other columns are
    /// ignored). Returns the rows found, in the order of the keys; missing keys are left out.
    /// Every bucket involved must be led by this node (else [`NodeError::NotLeader`]).
    pub async fn lookup(
        &self,
        database: &str,
        table: &str,
        keys: &RecordBatch,
    ) -> NodeResult<RecordBatch> {
        let record = self.table_record(database, table)?;
        let def = self.kv_definition(&record)?;
        let (keys, names) = key_columns(&def, keys, &def.primary_key, "primary key")?;
        let physical = positions(&def, &names, &def.physical_key);
        self.gather(&record, &def, &keys, &names, |tablet, part| {
            let columns: Vec<ArrayRef> = physical.iter().map(|&i| part.column(i).clone()).collect();
            tablet.lookup_positions(&columns)
        })
        .await
    }

    /// Prefix lookup: `keys` holds the bucket-key columns (and the partition columns of a
    /// partitioned table). Returns every row under each prefix, in key order per prefix.
    pub async fn prefix_lookup(
        &self,
        database: &str,
        table: &str,
        keys: &RecordBatch,
    ) -> NodeResult<RecordBatch> {
        let record = self.table_record(database, table)?;
        let def = self.kv_definition(&record)?;
        let mut wanted = def.partition_keys.clone();
        wanted.extend(def.bucket_key.iter().copied());
        let (keys, names) = key_columns(&def, keys, &wanted, "bucket key")?;
        let bucket = positions(&def, &names, &def.bucket_key);
        self.gather(&record, &def, &keys, &names, |tablet, part| {
            let columns: Vec<ArrayRef> = bucket.iter().map(|&i| part.column(i).clone()).collect();
            let mut batches = Vec::new();
            let mut positions = Vec::new();
            for row in 0..part.num_rows() {
                let one: Vec<ArrayRef> = columns.iter().map(|c| c.slice(row, 1)).collect();
                let found = tablet.prefix_lookup(&one)?;
                positions.extend(std::iter::repeat_n(row, found.num_rows()));
                batches.push(found);
            }
            let schema = Arc::clone(&tablet.definition().schema);
            Ok((
                arrow::compute::concat_batches(&schema, &batches)?,
                positions,
            ))
        })
        .await
    }

    /// Routes key rows to their partitions and buckets, runs `find` on each bucket's tablet,
    /// and puts the rows found back in the order of the keys.
    async fn gather(
        &self,
        record: &TableRecord,
        def: &KvTableDef,
        keys: &RecordBatch,
        names: &[String],
        find: impl Fn(&KvTablet, &RecordBatch) -> Result<(RecordBatch, Vec<usize>), KvError>,
    ) -> NodeResult<RecordBatch> {
        let partition_columns = positions(def, names, &def.partition_keys);
        let bucket_columns = positions(def, names, &def.bucket_key);
        let partitions = if partition_columns.is_empty() {
            vec![String::new(); keys.num_rows()]
        } else {
            partitions_of(keys, &partition_columns)?
        };
        let buckets = buckets_of(keys, &bucket_columns, record.bucket_count)?;
        let mut groups: BTreeMap<(u64, u32), Vec<usize>> = BTreeMap::new();
        let view = self.view();
        for (row, (p, b)) in partitions.iter().zip(&buckets).enumerate() {
            let partition_id = if partition_columns.is_empty() {
                0
            } else {
                match view
                    .state
                    .partition_names
                    .get(&(record.table_id, p.clone()))
                {
                    Some(id) => *id,
                    // No such partition: nothing to find.
                    None => continue,
                }
            };
            groups.entry((partition_id, *b)).or_default().push(row);
        }
        let mut found: Vec<RecordBatch> = Vec::new();
        // (key position, batch, row)
        let mut order: Vec<(usize, usize, usize)> = Vec::new();
        for ((partition_id, bucket), rows) in groups {
            let tablet = self.kv_tablet(record, partition_id, bucket).await?;
            let indices = UInt32Array::from_iter_values(
                rows.iter().map(|&r| u32::try_from(r).unwrap_or(u32::MAX)),
            );
            let part = take_record_batch(keys, &indices)?;
            let (batch, positions) = find(&tablet, &part)?;
            let b = found.len();
            order.extend(positions.iter().enumerate().map(|(j, &p)| (rows[p], b, j)));
            found.push(batch);
        }
        if order.is_empty() {
            return Ok(RecordBatch::new_empty(Arc::clone(&def.schema)));
        }
        order.sort_by_key(|&(p, b, j)| (p, b, j));
        let refs: Vec<&RecordBatch> = found.iter().collect();
        let indices: Vec<(usize, usize)> = order.iter().map(|&(_, b, j)| (b, j)).collect();
        Ok(interleave_record_batch(&refs, &indices)?)
    }

    /// A scan of one bucket's current rows, consistent at one offset (on its leader).
    pub async fn kv_scan(&self, b: &BucketRef) -> NodeResult<KvScan> {
        let record = self.table_record(&b.database, &b.table)?;
        let r = self.bucket_record(&self.view(), &record, b.partition.as_deref(), b.bucket)?;
        let tablet = self.kv_tablet(&record, r.partition_id, b.bucket).await?;
        Ok(tablet.snapshot()?)
    }

    /// Reads a primary-key bucket's changelog from `offset` as changelog view batches
    /// (`_change_type`, `_log_offset`, `_commit_timestamp`, then the table's columns; `columns`
    /// picks among them). Any node can serve it. A batch may hold no rows (a writer's marker)
    /// while spanning offsets: continue from its `end_offset`.
    pub(crate) async fn read_changelog(
        &self,
        b: &BucketRef,
        offset: u64,
        max_bytes: usize,
        columns: &[String],
    ) -> NodeResult<Vec<mink_log::ReadBatch>> {
        let record = self.table_record(&b.database, &b.table)?;
        let def = self.kv_definition(&record)?;
        let log = self.bucket_log(b, changelog::storage_schema(&def.schema))?;
        let view = changelog::view_schema(&def.schema);
        let mut out = Vec::new();
        for read in log.read(offset, max_bytes, &[]).await? {
            let batch = changelog::to_view(&view, &read.batch, read.base_offset)?;
            out.push(mink_log::ReadBatch {
                base_offset: read.base_offset,
                end_offset: read.end_offset,
                timestamp_ms: read.timestamp_ms,
                batch: mink_log::codec::project(&batch, columns)?,
            });
        }
        Ok(out)
    }

    /// One round of KV snapshots: every primary-key bucket led here whose working copy has
    /// moved since its latest snapshot writes a new one and records it (`CommitKvSnapshot`).
    /// Returns how many were taken.
    pub async fn snapshot_kv(&self) -> NodeResult<usize> {
        let open: Vec<_> = self
            .inner
            .kv
            .read()
            .expect("kv lock")
            .iter()
            .map(|(k, o)| (*k, o.clone()))
            .collect();
        let mut taken = 0;
        for (key, open) in open {
            taken += usize::from(self.snapshot_kv_bucket(key, &open).await?);
        }
        Ok(taken)
    }

    /// Snapshots one open KV tablet if its working copy moved since the bucket's latest
    /// snapshot. Returns whether a snapshot was recorded.
    pub(crate) async fn snapshot_kv_bucket(
        &self,
        (table_id, partition_id, bucket): mink_metadata::BucketKey,
        open: &OpenKv,
    ) -> NodeResult<bool> {
        let me = self.inner.sink.node();
        let view = self.view();
        let latest = view
            .state
            .kv_snapshots
            .values()
            .filter(|s| (s.table_id, s.partition_id, s.bucket) == (table_id, partition_id, bucket))
            .max_by_key(|s| s.snapshot_id)
            .cloned();
        let applied = open.tablet.applied_offset()?;
        if open.tablet.is_failed()
            || latest.as_ref().is_some_and(|s| s.log_offset >= applied)
            || applied == 0
        {
            return Ok(false);
        }
        let snapshot_id = latest.map_or(1, |s| s.snapshot_id + 1);
        let location = format!(
            "kv-snapshots/{table_id}/{partition_id}/{bucket}/{snapshot_id:020}-{}.arrows",
            open.leader_epoch
        );
        let info = open
            .tablet
            .write_snapshot(
                self.inner.streams.object_store(),
                &object_store::path::Path::from(location.as_str()),
            )
            .await?;
        let proposed = self
            .inner
            .sink
            .propose(Command::CommitKvSnapshot(CommitKvSnapshot {
                node_id: me.node_id,
                node_epoch: me.node_epoch,
                table_id,
                partition_id,
                bucket,
                leader_epoch: open.leader_epoch,
                snapshot_id,
                log_offset: info.log_offset,
                location: location.clone(),
                size_bytes: info.size_bytes,
            }))
            .await?;
        match proposed.result {
            Ok(_) => {
                tracing::info!(
                    table_id,
                    partition_id,
                    bucket,
                    snapshot_id,
                    rows = info.rows,
                    offset = info.log_offset,
                    "KV snapshot"
                );
                Ok(true)
            }
            Err(r) => {
                tracing::info!(%r, table_id, bucket, "KV snapshot refused");
                let _ = self
                    .inner
                    .streams
                    .object_store()
                    .delete(&object_store::path::Path::from(location.as_str()))
                    .await;
                Ok(false)
            }
        }
    }
}

/// A write's rows as the leader takes them: the table's columns and `_row_kind`.
fn with_row_kind(write: &KvWrite) -> NodeResult<RecordBatch> {
    let n = write.batch.num_rows();
    let kinds: arrow::array::StringArray = (0..n)
        .map(|i| {
            Some(if write.deletes.as_ref().is_some_and(|d| d.value(i)) {
                "delete"
            } else {
                "upsert"
            })
        })
        .collect();
    let field = Field::new(ROW_KIND, DataType::Utf8, false);
    Ok(mink_log::codec::with_column(
        &write.batch,
        field,
        Arc::new(kinds),
    )?)
}

/// Where each of the table's `columns` sits among the key batch's column `names`.
fn positions(def: &KvTableDef, names: &[String], columns: &[usize]) -> Vec<usize> {
    columns
        .iter()
        .map(|&i| {
            names
                .iter()
                .position(|n| n == def.schema.field(i).name())
                .unwrap_or(0)
        })
        .collect()
}

/// Splits off the [`ROW_KIND`] column: the batch without it, and `true` for each delete.
fn split_row_kind(batch: &RecordBatch) -> NodeResult<(RecordBatch, BooleanArray)> {
    let n = batch.num_rows();
    let Ok(i) = batch.schema().index_of(ROW_KIND) else {
        return Ok((batch.clone(), BooleanArray::from(vec![false; n])));
    };
    let kinds = cast(batch.column(i), &DataType::Utf8).map_err(|_| {
        NodeError::Invalid(format!(
            "{ROW_KIND} must be a string column: upsert or delete"
        ))
    })?;
    let kinds = kinds.as_string::<i32>();
    let mut deletes = Vec::with_capacity(n);
    for row in 0..n {
        let kind = kinds
            .is_valid(row)
            .then(|| kinds.value(row).to_ascii_lowercase());
        deletes.push(match kind.as_deref() {
            None | Some("upsert" | "+i" | "+u") => false,
            Some("delete" | "-d") => true,
            Some(other) => {
                return Err(NodeError::Invalid(format!(
                    "{ROW_KIND} of row {row} is {other:?}: upsert or delete"
                )));
            }
        });
    }
    let mut rest = batch.clone();
    rest.remove_column(i);
    Ok((rest, BooleanArray::from(deletes)))
}

/// A batch of the table's schema from a batch of some of its columns (the others null), and
/// the columns set when that is a partial update.
fn widen(
    def: &KvTableDef,
    batch: &RecordBatch,
    columns: Option<&[String]>,
) -> NodeResult<(RecordBatch, Option<Vec<usize>>)> {
    let schema = &def.schema;
    let given = batch.schema();
    // The auto-increment column is never written: leaving it out is not a partial update.
    let settable = schema.fields().len() - usize::from(def.auto_increment.is_some());
    let auto_given = def
        .auto_increment
        .is_some_and(|c| given.index_of(schema.field(c).name()).is_ok());
    for f in given.fields() {
        let Ok(want) = schema.field_with_name(f.name()) else {
            return Err(NodeError::Invalid(format!(
                "column {:?} is not in the table",
                f.name()
            )));
        };
        if want.data_type() != f.data_type() {
            return Err(NodeError::Invalid(format!(
                "column {:?} of type {} does not match the table's type {}",
                f.name(),
                f.data_type(),
                want.data_type()
            )));
        }
    }
    let targets: Option<Vec<usize>> = match columns {
        Some(names) => Some(
            names
                .iter()
                .map(|c| {
                    schema.index_of(c).map_err(|_| {
                        NodeError::Invalid(format!("partial update names unknown column {c:?}"))
                    })
                })
                .collect::<NodeResult<_>>()?,
        ),
        None if given.fields().len() - usize::from(auto_given) < settable => Some(
            given
                .fields()
                .iter()
                .filter_map(|f| schema.index_of(f.name()).ok())
                .collect(),
        ),
        None => None,
    };
    if let Some(names) = columns {
        // The descriptor names the batch's columns: a batch that differs would update columns
        // the writer did not mean to (nulled) and drop the ones it sent.
        let sent: Vec<&str> = given.fields().iter().map(|f| f.name().as_str()).collect();
        let same = names.len() == sent.len()
            && names.iter().all(|n| sent.contains(&n.as_str()))
            && sent.iter().all(|c| names.iter().any(|n| n == c));
        if !same {
            return Err(NodeError::Invalid(format!(
                "the descriptor's columns {names:?} are not the batch's columns {sent:?}"
            )));
        }
    }
    let in_order = given
        .fields()
        .iter()
        .map(|f| f.name())
        .eq(schema.fields().iter().map(|f| f.name()));
    if targets.is_none() && in_order {
        return Ok((batch.clone(), None));
    }
    // Otherwise taken by name, as a partial update's are: the table's order is not the writer's
    // to know.
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| {
            batch
                .column_by_name(f.name())
                .cloned()
                .unwrap_or_else(|| arrow::array::new_null_array(f.data_type(), batch.num_rows()))
        })
        .collect();
    // Nullability is checked by the caller (check_batch) with precise messages.
    let relaxed = mink_log::codec::all_nullable(schema);
    Ok((RecordBatch::try_new(Arc::new(relaxed), columns)?, targets))
}

/// The columns `wanted` (table indices) of `keys`, by name and cast to the table's types, and
/// their names.
pub(crate) fn key_columns(
    def: &KvTableDef,
    keys: &RecordBatch,
    wanted: &[usize],
    what: &str,
) -> NodeResult<(RecordBatch, Vec<String>)> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    let mut names = Vec::new();
    for &i in wanted {
        let f = def.schema.field(i);
        let c = keys.column_by_name(f.name()).ok_or_else(|| {
            NodeError::Invalid(format!(
                "the {what} column {:?} is missing from the keys",
                f.name()
            ))
        })?;
        let c = if c.data_type() == f.data_type() {
            c.clone()
        } else {
            cast(c, f.data_type())
                .map_err(|e| NodeError::Invalid(format!("key column {:?}: {e}", f.name())))?
        };
        if c.null_count() > 0 {
            return Err(NodeError::Invalid(format!(
                "key column {:?} holds a null",
                f.name()
            )));
        }
        fields.push(Field::new(f.name(), f.data_type().clone(), false));
        columns.push(c);
        names.push(f.name().clone());
    }
    Ok((
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?,
        names,
    ))
}

/// Takes KV snapshots every `kv_snapshot_interval` (the coordinator prunes old ones).
pub(crate) async fn run_snapshots(node: Node) {
    let mut shutdown = node.inner.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(node.inner.config.kv_snapshot_interval) => {}
            _ = shutdown.changed() => return,
        }
        if let Err(e) = node.snapshot_kv().await {
            tracing::warn!(error = %e, "KV snapshot round failed");
        }
    }
}
