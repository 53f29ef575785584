//! Reads, as every frontend asks for them: a plan per bucket (`plan_read`), then the batches
//! of the plan as a stream (`read_stream`) — log and changelog reads from any node, with
//! offsets, limits and tails; snapshot scans of primary-key buckets at their leaders
//! (forwarded there when needed). A Kafka fetch or a DataFusion scan calls the same functions
//! as a Flight `DoGet`; `read_bucket` and `wait_for_data` are the single steps.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use futures::StreamExt as _;
use futures::TryStreamExt as _;
use futures::stream::BoxStream;
use mink_kv::changelog;
use mink_log::LogTablet;
use mink_log::options::TableOptions;
use mink_metadata::{BucketRecord, TableRecord, View};

use crate::{BucketRef, Node, NodeError, NodeResult};

/// Where a bucket read starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadStart {
    /// The bucket's first readable offset.
    #[default]
    Earliest,
    Offset(u64),
    /// The high watermark: only rows written from now on.
    Latest,
}

/// Where a bucket read stops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadStop {
    /// The high watermark when the read was planned.
    #[default]
    HighWatermark,
    /// Before this offset (or the high watermark, if lower).
    Before(u64),
    /// Never: rows are sent as they are written; `idle` ends the read after that long
    /// without rows.
    Tail { idle: Option<Duration> },
}

/// A read of a table, one partition, or one bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadRequest {
    pub database: String,
    pub table: String,
    pub partition: Option<String>,
    /// One bucket; `start` and `stop` other than the defaults need it.
    pub bucket: Option<u32>,
    pub start: ReadStart,
    pub stop: ReadStop,
    /// Columns to return, in this order (all when empty).
    pub columns: Vec<String>,
    /// Stop after about this many rows (whole batches).
    pub max_rows: Option<u64>,
    /// Primary-key tables: the changelog (`_change_type`, `_log_offset`, `_commit_timestamp`,
    /// then the columns) instead of the current rows.
    pub changelog: bool,
    /// Tables tiered into the lake: which side to read ([`ReadSource::Auto`] by default).
    pub source: ReadSource,
    /// Only rows that meet it. It prunes buckets (`__bucket`), partitions and lake files and
    /// row groups, and narrows log reads to an offset range (`__offset`); a primary-key
    /// table's union read tests it after the merge (the changelog tail is never filtered).
    pub filter: Filter,
}

use mink_read::BoundFilter;
pub use mink_read::{Filter, ReadSource};

/// What a plan reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// A log table's rows.
    Log,
    /// A primary-key table's changelog.
    Changelog,
    /// A primary-key table's current rows, per bucket at one offset, at the bucket's leader.
    Snapshot,
    /// A primary-key table's rows as the union read: each bucket's rows in the pinned lake
    /// snapshot merged with its changelog after it up to the planned end (or the lake's rows
    /// only), read from any node.
    Merge,
}

/// One bucket of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketRead {
    pub bucket: BucketRef,
    /// First offset (log and changelog reads).
    pub from: u64,
    /// Exclusive; `None` while tailing (and for snapshots).
    pub to: Option<u64>,
    /// The bucket's leader, for snapshots of buckets led elsewhere.
    pub(crate) leader: Option<String>,
}

/// A read resolved against one metadata view: what to read, per bucket.
#[derive(Clone, Debug)]
pub struct ReadPlan {
    pub kind: ReadKind,
    /// The schema of every batch the read returns (projected).
    pub schema: SchemaRef,
    pub buckets: Vec<BucketRead>,
    pub(crate) columns: Vec<String>,
    pub(crate) max_rows: Option<u64>,
    pub(crate) idle: Option<Duration>,
    /// The table's schema (log batches are read and evolved to it).
    pub(crate) table_schema: SchemaRef,
    pub(crate) source: ReadSource,
    /// The lake snapshot the metadata recorded when the read was planned: every lake read of
    /// the plan reads it, so the read is one cut.
    pub(crate) lake: Option<mink_metadata::LakeSnapshotRecord>,
    /// The request's filter, bound to what is read, and as it came (forwarded reads carry it).
    pub(crate) filter: Arc<BoundFilter>,
    pub(crate) filter_spec: Filter,
    /// The columns decoded: `columns` and those the filter tests (all when empty), system
    /// columns left out.
    pub(crate) read_columns: Vec<String>,
    /// Whether `columns` names system columns (`__bucket`, `__offset`, `__timestamp`: log
    /// reads only), which a read adds to what it decodes.
    pub(crate) system: bool,
}

/// Where decoded rows come from: what their system columns hold.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    bucket: u32,
    base_offset: u64,
    timestamp_ms: i64,
}

/// The first offset a scan of bucket `b` of log table `record` returns: the log's `start`, or
/// the lake's start when the bucket's history below the log's start is in the lake (0 for a
/// table tiered from its creation, which holds `[0, tiered offset)` there; retention never
/// trims the log above the tiered offset).
pub(crate) fn readable_from(
    state: &mink_metadata::State,
    record: &TableRecord,
    b: &BucketRecord,
    start: u64,
) -> u64 {
    let lake = state.lake_snapshots.get(&record.table_id);
    let in_lake = !record.is_primary_key_table()
        && lake
            .and_then(|l| l.tiered_offset(b.partition_id, b.bucket))
            .is_some_and(|t| t >= start);
    match lake {
        Some(l) if in_lake => l.lake_start(b.partition_id, b.bucket).min(start),
        _ => start,
    }
}

/// The lake snapshot a union read takes a bucket's rows at `offset` from: the plan's, unless
/// it stops at or below `offset`; then the newest, when it holds `offset`. Retention trims the
/// log up to the newest snapshot's tiered offset, so a read planned before a tiering round may
/// find the log's start past what its snapshot holds. A log table's rows at an offset are the
/// same in every snapshot that holds them, so its read stays the planned cut; a primary-key
/// bucket is then read at the newer snapshot's state.
fn union_snapshot<'a>(
    planned: Option<&'a mink_metadata::LakeSnapshotRecord>,
    newest: Option<&'a mink_metadata::LakeSnapshotRecord>,
    (partition_id, bucket): (u64, u32),
    offset: u64,
) -> Option<&'a mink_metadata::LakeSnapshotRecord> {
    let holds = |l: &&mink_metadata::LakeSnapshotRecord| {
        l.tiered_offset(partition_id, bucket)
            .is_some_and(|t| t > offset)
    };
    planned.filter(holds).or(newest.filter(holds)).or(planned)
}

/// Rows read from the lake per read step at most.
const LAKE_STEP_ROWS: u64 = 65_536;

/// How a read is carried out.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Stored bytes fetched per read step.
    pub step_bytes: usize,
    /// Send stored batches of a log table as they are stored (their Arrow IPC record batch
    /// message, compressed as stored) when a whole batch is read unprojected under the
    /// current schema: no decode, no encode. Others are decoded.
    pub stored: bool,
    /// Never forward (a request that was itself forwarded): serve from what this node leads.
    pub local_only: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            step_bytes: 4 << 20,
            stored: false,
            local_only: false,
        }
    }
}

/// One batch of a read.
#[derive(Clone, Debug)]
pub struct ReadItem {
    pub bucket: BucketRef,
    /// Offset of the batch's first row (for a snapshot: the offset it is consistent at).
    pub offset: u64,
    pub data: ReadData,
}

#[derive(Clone, Debug)]
pub enum ReadData {
    Rows(RecordBatch),
    /// A stored batch as it is stored: the flatbuffer of its Arrow IPC record batch message
    /// and its body. Its schema message is [`ReadPlan::stored_schema_header`].
    Stored {
        header: Bytes,
        body: Bytes,
        rows: u64,
    },
}

impl ReadData {
    pub fn rows(&self) -> u64 {
        match self {
            ReadData::Rows(b) => b.num_rows() as u64,
            ReadData::Stored { rows, .. } => *rows,
        }
    }
}

impl ReadPlan {
    /// Decoded rows (of `read_columns`) as the read returns them: with the system columns
    /// asked for (from `stamp`), those that meet the filter, in the plan's columns.
    fn finish(&self, batch: RecordBatch, stamp: Stamp) -> NodeResult<RecordBatch> {
        let batch = if self.system {
            mink_log::filter::with_system_columns(
                &batch,
                &self.columns,
                stamp.bucket,
                stamp.base_offset,
                stamp.timestamp_ms,
            )
            .map_err(|e| NodeError::Failed(e.to_string()))?
        } else {
            batch
        };
        let batch = self.filter.apply(batch)?;
        if self.read_columns.len() == self.columns.len() {
            return Ok(batch);
        }
        Ok(mink_log::codec::project(&batch, &self.columns)?)
    }

    /// The Arrow IPC schema message stored batches passed through as [`ReadData::Stored`]
    /// carry: the message a reader must have seen before them.
    pub fn stored_schema_header(&self) -> Bytes {
        mink_log::codec::schema_header(&self.schema)
    }
}

/// `schema` narrowed to `columns`, in their order.
pub(crate) fn project_schema(
    schema: &SchemaRef,
    columns: &[String],
    table: &str,
) -> NodeResult<SchemaRef> {
    if columns.is_empty() {
        return Ok(Arc::clone(schema));
    }
    let indices = columns
        .iter()
        .map(|c| {
            schema
                .index_of(c)
                .map_err(|_| NodeError::Invalid(format!("no column {c:?} in {table}")))
        })
        .collect::<NodeResult<Vec<_>>>()?;
    Ok(Arc::new(
        schema
            .project(&indices)
            .map_err(|e| NodeError::Invalid(e.to_string()))?,
    ))
}

impl Node {
    /// A bucket's record by its name in `view`.
    pub(crate) fn bucket_record(
        &self,
        view: &View,
        record: &TableRecord,
        partition: Option<&str>,
        bucket: u32,
    ) -> NodeResult<BucketRecord> {
        let name = format!("{}.{}", record.database, record.name);
        let partition_id = match (partition, record.is_partitioned()) {
            (None, false) => 0,
            (Some(p), true) => *view
                .state
                .partition_names
                .get(&(record.table_id, p.to_string()))
                .ok_or_else(|| {
                    NodeError::NotFound(format!("partition {p:?} of {name} does not exist"))
                })?,
            (None, true) => {
                return Err(NodeError::Invalid(format!(
                    "{name} is partitioned: name the partition to read"
                )));
            }
            (Some(p), false) => {
                return Err(NodeError::Invalid(format!(
                    "{name} is not partitioned, yet the request names partition {p:?}"
                )));
            }
        };
        view.state
            .buckets
            .get(&(record.table_id, partition_id, bucket))
            .cloned()
            .ok_or_else(|| {
                NodeError::NotFound(format!(
                    "bucket {bucket} of {name} does not exist (it has {} buckets)",
                    record.bucket_count
                ))
            })
    }

    /// Plans a read against the current view: which buckets, from which offset to which.
    /// Every error (unknown table, partition, bucket or column, an offset retention removed)
    /// comes here, before anything is read.
    pub fn plan_read(&self, r: &ReadRequest) -> NodeResult<ReadPlan> {
        let view = self.view();
        let record = self.table_record(&r.database, &r.table)?;
        let (table_schema, _) = self.described(&record)?;
        let name = format!("{}.{}", r.database, r.table);
        let primary = record.is_primary_key_table();
        if !primary && r.changelog {
            return Err(NodeError::Invalid(format!(
                "{name} is a log table: changelog reads primary-key tables"
            )));
        }
        let kind = match (primary, r.changelog, r.source) {
            (false, _, _) => ReadKind::Log,
            (true, true, _) => ReadKind::Changelog,
            (true, false, ReadSource::Auto) => ReadKind::Snapshot,
            (true, false, _) => ReadKind::Merge,
        };
        let positioned = r.start != ReadStart::Earliest || r.stop != ReadStop::HighWatermark;
        if matches!(kind, ReadKind::Snapshot | ReadKind::Merge) && positioned {
            return Err(NodeError::Invalid(
                "offset, latest, end_offset and tail read the changelog of a primary-key table: set changelog: true (mink scan --changelog)".into(),
            ));
        }
        if r.bucket.is_none() && positioned {
            return Err(NodeError::Invalid(
                "offset, end_offset, latest and tail apply to one bucket: name it".into(),
            ));
        }
        if let Some(p) = &r.partition
            && !view
                .state
                .partition_names
                .contains_key(&(record.table_id, p.clone()))
        {
            return Err(NodeError::NotFound(format!(
                "partition {p:?} of {name} does not exist"
            )));
        }
        let full = if kind == ReadKind::Changelog {
            changelog::view_schema(&table_schema)
        } else {
            Arc::clone(&table_schema)
        };
        // A log read may name system columns too (the lake's `__bucket`, `__offset`,
        // `__timestamp`); an unprojected read returns the table's columns.
        let is_system = |c: &String| mink_log::filter::system_field(c).is_some();
        let system_asked = kind == ReadKind::Log && r.columns.iter().any(is_system);
        let selectable = if system_asked {
            let mut fields: Vec<arrow::datatypes::FieldRef> = full.fields().to_vec();
            for c in r.columns.iter().filter(|c| is_system(c)) {
                if full.field_with_name(c).is_err() && !fields.iter().any(|f| f.name() == c) {
                    fields.extend(mink_log::filter::system_field(c).map(Arc::new));
                }
            }
            Arc::new(arrow::datatypes::Schema::new(fields))
        } else {
            Arc::clone(&full)
        };
        let schema = project_schema(&selectable, &r.columns, &name)?;
        let system: &[&str] = match kind {
            ReadKind::Log => &[
                mink_log::filter::BUCKET,
                mink_log::filter::OFFSET,
                mink_log::filter::TIMESTAMP,
            ],
            _ => &[mink_log::filter::BUCKET],
        };
        let filter = r.filter.bind(&full, system)?;
        let mut read_columns: Vec<String> = r
            .columns
            .iter()
            .filter(|c| !system_asked || !is_system(c))
            .cloned()
            .collect();
        if !read_columns.is_empty() {
            for c in filter.columns() {
                if !read_columns.contains(&c) {
                    read_columns.push(c);
                }
            }
        }
        let partition_name = |partition_id: u64| {
            view.state
                .partitions
                .get(&(record.table_id, partition_id))
                .map(|p| p.name.clone())
        };
        let me = self.node_id();
        let lake = view.state.lake_snapshots.get(&record.table_id);
        if r.source != ReadSource::Auto {
            let enabled = TableOptions::parse(&record.options)?
                .lake_freshness
                .is_some();
            if !enabled {
                return Err(NodeError::Invalid(format!(
                    "{name} is not tiered into the lake: a union, lake or log read applies to tables with table.datalake.enabled"
                )));
            }
            if kind == ReadKind::Changelog || (primary && r.source == ReadSource::Log) {
                return Err(NodeError::Invalid(format!(
                    "{name} is a primary-key table: its rows are read from the lake, merged with the changelog (union), or as they are now (the default); its changelog from the log"
                )));
            }
            if r.source == ReadSource::Lake && matches!(r.stop, ReadStop::Tail { .. }) {
                return Err(NodeError::Invalid(
                    "a lake read has an end: tail the log instead".into(),
                ));
            }
        }
        let stream_bounds = |b: &BucketRecord| {
            let (start, end) = view
                .state
                .streams
                .get(&b.stream_id)
                .map_or((0, 0), |s| (s.start_offset, s.end_offset));
            match r.source {
                _ if kind == ReadKind::Merge && r.source == ReadSource::Union => (0, end),
                ReadSource::Auto | ReadSource::Union => {
                    (readable_from(&view.state, &record, b, start), end)
                }
                ReadSource::Log => (start, end),
                // The lake's side: [0, tiered offset) (empty before the first round).
                ReadSource::Lake => {
                    let tiered = lake
                        .and_then(|l| l.tiered_offset(b.partition_id, b.bucket))
                        .unwrap_or(0);
                    let from = lake.map_or(0, |l| l.lake_start(b.partition_id, b.bucket));
                    (from.min(tiered), tiered)
                }
            }
        };
        let leader_of = |b: &BucketRecord| {
            (b.leader_node_id != 0 && b.leader_node_id != me)
                .then(|| view.state.nodes.get(&b.leader_node_id))
                .flatten()
                .map(|n| n.address.clone())
                .filter(|a| !a.is_empty())
        };
        let mut buckets = Vec::new();
        if let Some(bucket) = r.bucket {
            let b = self.bucket_record(&view, &record, r.partition.as_deref(), bucket)?;
            let (start, end) = stream_bounds(&b);
            let from = match r.start {
                ReadStart::Earliest => start,
                ReadStart::Offset(o) => o,
                ReadStart::Latest => end,
            };
            if from < start || (kind != ReadKind::Snapshot && from > end) {
                return Err(NodeError::OffsetOutOfRange {
                    offset: from,
                    start,
                    end,
                });
            }
            let to = match r.stop {
                ReadStop::HighWatermark => Some(end),
                ReadStop::Before(e) => Some(e.min(end)),
                ReadStop::Tail { .. } => None,
            };
            buckets.push(BucketRead {
                bucket: BucketRef {
                    database: r.database.clone(),
                    table: r.table.clone(),
                    partition: partition_name(b.partition_id),
                    bucket,
                },
                from,
                to,
                leader: leader_of(&b),
            });
        } else {
            let partition_id = r.partition.as_ref().and_then(|p| {
                view.state
                    .partition_names
                    .get(&(record.table_id, p.clone()))
            });
            for b in view
                .state
                .buckets
                .range((record.table_id, 0, 0)..=(record.table_id, u64::MAX, u32::MAX))
                .map(|(_, b)| b)
                .filter(|b| partition_id.is_none_or(|p| *p == b.partition_id))
            {
                let (start, end) = stream_bounds(b);
                buckets.push(BucketRead {
                    bucket: BucketRef {
                        database: r.database.clone(),
                        table: r.table.clone(),
                        partition: partition_name(b.partition_id),
                        bucket: b.bucket,
                    },
                    from: start,
                    to: Some(end),
                    leader: leader_of(b),
                });
            }
        }
        if !filter.is_empty() {
            let offsets = filter.offsets();
            let mut kept = Vec::with_capacity(buckets.len());
            for mut b in buckets {
                let partition = match &b.bucket.partition {
                    Some(p) => mink_log::routing::partition_values(&record.partition_keys, p)?,
                    None => Default::default(),
                };
                if !filter.bucket_may_match(b.bucket.bucket)?
                    || !filter.partition_may_match(&table_schema, &partition)?
                {
                    continue;
                }
                if kind == ReadKind::Log {
                    // A tail (no end) keeps none unless `__offset` bounds it.
                    if offsets.end != u64::MAX {
                        b.to = Some(b.to.map_or(offsets.end, |to| to.min(offsets.end)));
                    }
                    b.from = b.from.max(offsets.start).min(b.to.unwrap_or(u64::MAX));
                }
                kept.push(b);
            }
            buckets = kept;
        }
        let idle = match r.stop {
            ReadStop::Tail { idle } => idle,
            _ => None,
        };
        Ok(ReadPlan {
            kind,
            schema,
            buckets,
            columns: r.columns.clone(),
            max_rows: r.max_rows,
            idle,
            table_schema,
            source: r.source,
            lake: lake.cloned(),
            filter: Arc::new(filter),
            filter_spec: r.filter.clone(),
            read_columns,
            system: system_asked,
        })
    }

    /// The batches of a plan, bucket after bucket, in offset order. A snapshot of a bucket led
    /// elsewhere is read at its leader (unless `options.local_only`). The stream ends after
    /// `max_rows`, at the planned ends, or (tailing) when idle or dropped.
    pub fn read_stream(
        &self,
        plan: ReadPlan,
        options: ReadOptions,
    ) -> BoxStream<'static, NodeResult<ReadItem>> {
        self.inner
            .reads_served
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let node = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            let result = match plan.kind {
                ReadKind::Snapshot => node.send_snapshots(&plan, &options, &tx).await,
                ReadKind::Merge => node.send_merged(&plan, &tx).await,
                ReadKind::Log | ReadKind::Changelog => node.send_log(&plan, &options, &tx).await,
            };
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
    }

    /// How many reads (`read_stream` calls, whatever the frontend) this node has served.
    pub fn reads_served(&self) -> u64 {
        self.inner
            .reads_served
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Log or changelog batches of every bucket of the plan into `tx`; `Ok` when done or
    /// when the reader went away.
    async fn send_log(
        &self,
        plan: &ReadPlan,
        options: &ReadOptions,
        tx: &tokio::sync::mpsc::Sender<NodeResult<ReadItem>>,
    ) -> NodeResult<()> {
        let stored_header = (options.stored
            && plan.kind == ReadKind::Log
            && plan.columns.is_empty()
            && !plan.filter.tests_rows())
        .then(|| plan.stored_schema_header());
        let mut rows_sent = 0u64;
        let full = |rows: u64| plan.max_rows.is_some_and(|m| rows >= m);
        let earliest = plan.filter.earliest_time_ms();
        for b in &plan.buckets {
            let mut offset = b.from;
            let mut idle_since = tokio::time::Instant::now();
            // A lower bound on `__timestamp` starts the log's part at the time index.
            let mut indexed = earliest.is_none() || plan.kind != ReadKind::Log;
            loop {
                if b.to.is_some_and(|to| offset >= to) || full(rows_sent) {
                    break;
                }
                if !indexed && let Some(t) = earliest {
                    let (start, end) = self.bucket_offsets(&b.bucket)?;
                    // Below the log's start a union read takes the lake's rows, which the
                    // lake filters itself.
                    if plan.source != ReadSource::Lake && offset >= start {
                        indexed = true;
                        // Nothing in [offset, end) is that late: no batch below `end` is.
                        let found = self.first_batch_at_time(&b.bucket, offset, t).await?;
                        let to = found.map_or(end, |f| f.base_offset);
                        offset = offset.max(b.to.map_or(to, |planned| to.min(planned)));
                        continue;
                    }
                }
                let mut grew = None;
                let (items, next) = self
                    .read_step(
                        plan,
                        b,
                        offset,
                        options.step_bytes,
                        stored_header.as_ref(),
                        &mut grew,
                    )
                    .await?;
                // A tail that reached rows written after the table grew ends there: its
                // stream's schema has no place for the new columns, and dropping them would
                // be silent. Its client reads again from there, with the new schema.
                let grown = |at: u64| {
                    NodeError::Unavailable(format!(
                        "{}.{} gained columns at offset {at} of {}: read again from offset {at} for the new schema",
                        b.bucket.database, b.bucket.table, b.bucket
                    ))
                };
                if let (Some(at), true) = (grew, items.is_empty()) {
                    return Err(grown(at));
                }
                if next == offset {
                    if let Some(to) = b.to {
                        // The plan's end was committed when it was planned: a step that reads
                        // nothing below it would drop rows, so it fails instead.
                        return Err(NodeError::Failed(format!(
                            "{}: offsets {offset}..{to} were committed when the read was planned, but reading them returned nothing",
                            b.bucket
                        )));
                    }
                    // Tailing: wait for rows, a second at a time so a gone reader is noticed.
                    if plan.idle.is_some_and(|i| idle_since.elapsed() >= i) || tx.is_closed() {
                        break;
                    }
                    let step = plan.idle.map_or(Duration::from_secs(1), |i| {
                        i.saturating_sub(idle_since.elapsed())
                            .min(Duration::from_secs(1))
                    });
                    // A stopping node ends the wait (`next_applied`): the tail is told where
                    // to resume.
                    if let Err(e) = self.wait_for_data(&b.bucket, offset, step).await {
                        return Err(if self.is_stopping() {
                            NodeError::Unavailable(format!(
                                "node {} is shutting down; tail {} again from offset {offset} to reach its next leader",
                                self.node_id(),
                                b.bucket
                            ))
                        } else {
                            e
                        });
                    }
                    continue;
                }
                idle_since = tokio::time::Instant::now();
                offset = next;
                for item in items {
                    rows_sent += item.data.rows();
                    if tx.send(Ok(item)).await.is_err() {
                        return Ok(());
                    }
                    if full(rows_sent) {
                        break;
                    }
                }
                if let (Some(at), false) = (grew, full(rows_sent)) {
                    return Err(grown(at));
                }
            }
            if full(rows_sent) {
                break;
            }
        }
        Ok(())
    }

    /// One read step of a bucket from `offset`: its batches with rows (as stored when they
    /// can go as they are; rows past the plan's end cut), and the offset after the step.
    async fn read_step(
        &self,
        plan: &ReadPlan,
        b: &BucketRead,
        offset: u64,
        step_bytes: usize,
        stored_header: Option<&Bytes>,
        grew: &mut Option<u64>,
    ) -> NodeResult<(Vec<ReadItem>, u64)> {
        let mut items = Vec::new();
        let mut next = offset;
        // Decoded rows `[base, end)`, cut at the plan's end; a batch may hold no rows (a
        // writer's marker in a changelog) while spanning offsets.
        let rows =
            |r: mink_log::ReadBatch, items: &mut Vec<ReadItem>, next: &mut u64| -> NodeResult<()> {
                let (batch, after) = cut(r.batch, r.base_offset, r.end_offset, b.to);
                *next = after;
                let stamp = Stamp {
                    bucket: b.bucket.bucket,
                    base_offset: r.base_offset,
                    timestamp_ms: r.timestamp_ms,
                };
                let batch = plan.finish(batch, stamp)?;
                if batch.num_rows() > 0 {
                    items.push(ReadItem {
                        bucket: b.bucket.clone(),
                        offset: r.base_offset,
                        data: ReadData::Rows(batch),
                    });
                }
                Ok(())
            };
        if plan.kind == ReadKind::Changelog {
            for r in self
                .read_changelog(&b.bucket, offset, step_bytes, &plan.read_columns)
                .await?
            {
                rows(r, &mut items, &mut next)?;
            }
            return Ok((items, next));
        }
        if plan.kind == ReadKind::Log
            && let Some(step) = self.lake_step(plan, b, offset).await?
        {
            return Ok(step);
        }
        let tablet = self.bucket_log(&b.bucket, Arc::clone(&plan.table_schema))?;
        let stored = match tablet
            .read_stored(offset, step_bytes)
            .await
            .map_err(NodeError::from)
        {
            // Retention trimmed the log past `offset` after the lake step looked: it trims
            // only what the lake holds, so a read that takes the lake below the log's start
            // finds the rows there now.
            Err(e @ NodeError::OffsetOutOfRange { start, .. })
                if offset < start
                    && plan.kind == ReadKind::Log
                    && plan.source != ReadSource::Log =>
            {
                return self.lake_step(plan, b, offset).await?.ok_or(e);
            }
            read => read?,
        };
        for s in stored {
            // The batch's messages, when it was stored under the read's schema.
            let current = stored_header.and_then(|h| {
                mink_log::codec::wire_batch(&s.payload)
                    .filter(|w| mink_log::codec::same_schema_header(&w.schema_header, h))
            });
            // Tailing (no end): a batch written after the table grew ends the step before it.
            if b.to.is_none()
                && current.is_none()
                && mink_log::codec::stored_columns(&s.payload)? > plan.table_schema.fields().len()
            {
                *grew = Some(s.base_offset.max(offset));
                break;
            }
            if !plan.filter.time_may_match(s.timestamp_ms)? {
                // Every row of a stored batch has its time.
                next = next.max(b.to.map_or(s.end_offset, |to| s.end_offset.min(to)));
                continue;
            }
            let whole = s.base_offset >= offset && b.to.is_none_or(|to| s.end_offset <= to);
            if let Some(w) = current.filter(|_| whole) {
                next = s.end_offset;
                items.push(ReadItem {
                    bucket: b.bucket.clone(),
                    offset: s.base_offset,
                    data: ReadData::Stored {
                        header: w.header,
                        body: w.body,
                        rows: s.end_offset - s.base_offset,
                    },
                });
            } else if let Some(r) = tablet.decode_stored(&s, offset, &plan.read_columns)? {
                rows(r, &mut items, &mut next)?;
            } else {
                next = next.max(s.end_offset);
            }
        }
        Ok((items, next))
    }

    /// A read step from the lake: below the log's start of a bucket whose history is in the
    /// lake (a union read), or anywhere below the tiered offset (a lake read). Up to
    /// [`LAKE_STEP_ROWS`] rows from the lake snapshot the metadata records. `None` when the
    /// step is the log's.
    async fn lake_step(
        &self,
        plan: &ReadPlan,
        b: &BucketRead,
        offset: u64,
    ) -> NodeResult<Option<(Vec<ReadItem>, u64)>> {
        let (start, end) = self.bucket_offsets(&b.bucket)?;
        if plan.source == ReadSource::Log || (plan.source != ReadSource::Lake && offset >= start) {
            return Ok(None);
        }
        let record = self.table_record(&b.bucket.database, &b.bucket.table)?;
        let view = self.view();
        let bucket = self.bucket_record(
            &view,
            &record,
            b.bucket.partition.as_deref(),
            b.bucket.bucket,
        )?;
        let partition = match &b.bucket.partition {
            Some(name) => mink_log::routing::partition_values(&record.partition_keys, name)?,
            None => Default::default(),
        };
        let lake = match plan.source {
            ReadSource::Union => union_snapshot(
                plan.lake.as_ref(),
                view.state.lake_snapshots.get(&record.table_id),
                (bucket.partition_id, b.bucket.bucket),
                offset,
            ),
            _ => plan.lake.as_ref(),
        };
        let tiered = lake.and_then(|l| l.tiered_offset(bucket.partition_id, b.bucket.bucket));
        let Some(range) = mink_read::lake_range(
            plan.source,
            offset,
            b.to,
            (start, end),
            tiered,
            LAKE_STEP_ROWS,
        )?
        else {
            return Ok(None);
        };
        let (Some(lake), upto) = (lake, range.end) else {
            return Err(NodeError::OffsetOutOfRange { offset, start, end });
        };
        // The lake stores the system columns a read may ask for.
        let read_schema = if plan.system {
            let mut fields: Vec<arrow::datatypes::FieldRef> = plan.table_schema.fields().to_vec();
            fields.extend(
                plan.schema
                    .fields()
                    .iter()
                    .filter(|f| plan.table_schema.field_with_name(f.name()).is_err())
                    .cloned(),
            );
            Arc::new(arrow::datatypes::Schema::new(fields))
        } else {
            Arc::clone(&plan.table_schema)
        };
        let rows = self
            .lake()
            .await?
            .read_bucket(
                &b.bucket.database,
                &b.bucket.table,
                lake.snapshot_id,
                &partition,
                b.bucket.bucket,
                offset..upto,
                &read_schema,
                (!plan.filter.is_empty())
                    .then_some(&mink_read::prune::LakePrune(&plan.filter) as &dyn mink_lake::Prune),
            )
            .await?;
        let columns: Vec<usize> = plan
            .schema
            .fields()
            .iter()
            .map(|f| read_schema.index_of(f.name()))
            .collect::<Result<_, _>>()
            .map_err(|e| NodeError::Invalid(e.to_string()))?;
        let mut items = Vec::with_capacity(rows.len());
        let mut at = offset;
        for batch in rows {
            let n = batch.num_rows() as u64;
            let batch = plan.filter.apply(batch)?;
            if batch.num_rows() > 0 {
                items.push(ReadItem {
                    bucket: b.bucket.clone(),
                    offset: at,
                    data: ReadData::Rows(
                        batch
                            .project(&columns)
                            .map_err(|e| NodeError::Failed(e.to_string()))?,
                    ),
                });
            }
            // Filtered rows are not contiguous: later batches start at or after this.
            at += n;
        }
        Ok(Some((items, upto)))
    }

    /// The union read of a primary-key table into `tx`: per bucket, its rows in the plan's
    /// lake snapshot merged with its changelog from the snapshot's tiered offset to the
    /// planned end (a lake read: the snapshot's rows alone), batches as the lake streams them,
    /// each at the planned end's offset.
    async fn send_merged(
        &self,
        plan: &ReadPlan,
        tx: &tokio::sync::mpsc::Sender<NodeResult<ReadItem>>,
    ) -> NodeResult<()> {
        let lake = self.lake().await?;
        let Some(first) = plan.buckets.first() else {
            return Ok(());
        };
        let record = self.table_record(&first.bucket.database, &first.bucket.table)?;
        let mut rows_sent = 0u64;
        for b in &plan.buckets {
            if plan.max_rows.is_some_and(|m| rows_sent >= m) {
                break;
            }
            let bucket = self.bucket_record(
                &self.view(),
                &record,
                b.bucket.partition.as_deref(),
                b.bucket.bucket,
            )?;
            let partition = match &b.bucket.partition {
                Some(name) => mink_log::routing::partition_values(&record.partition_keys, name)?,
                None => Default::default(),
            };
            let (start, end) = self.bucket_offsets(&b.bucket)?;
            let lake_snapshot = match plan.source {
                // The changes below the log's start must be in the snapshot.
                ReadSource::Union if start > 0 => union_snapshot(
                    plan.lake.as_ref(),
                    self.view().state.lake_snapshots.get(&record.table_id),
                    (bucket.partition_id, b.bucket.bucket),
                    start.saturating_sub(1),
                )
                .cloned(),
                _ => plan.lake.clone(),
            };
            let tiered = lake_snapshot
                .as_ref()
                .and_then(|l| l.tiered_offset(bucket.partition_id, b.bucket.bucket));
            let snapshot = tiered.and(lake_snapshot.as_ref().map(|l| l.snapshot_id));
            let to = b.to.unwrap_or(0);
            let mut tail = Vec::new();
            if plan.source == ReadSource::Union {
                let from = tiered.unwrap_or(0);
                if from < start {
                    // Neither the lake nor the log holds the changes below the log's start.
                    return Err(NodeError::OffsetOutOfRange {
                        offset: from,
                        start,
                        end,
                    });
                }
                let mut offset = from;
                while offset < to {
                    let step = self.read_changelog(&b.bucket, offset, 8 << 20, &[]).await?;
                    let Some(last) = step.last() else { break };
                    offset = last.end_offset;
                    for rb in step {
                        let mut changes = mink_read::changes_from_changelog(&rb.batch)?;
                        // The planned end cuts the last batches.
                        let keep = changes.offsets.partition_point(|o| *o < to);
                        if keep < changes.offsets.len() {
                            changes.rows = changes.rows.slice(0, keep);
                            changes.offsets.truncate(keep);
                            changes.timestamps_us.truncate(keep);
                            changes.upsert.truncate(keep);
                        }
                        tail.push(changes);
                    }
                }
            }
            let mut merged = mink_read::read_primary_key_bucket(
                lake,
                &b.bucket.database,
                &b.bucket.table,
                snapshot,
                &partition,
                b.bucket.bucket,
                &plan.table_schema,
                &record.primary_key,
                &tail,
                &plan.filter,
            )
            .await?;
            while let Some(rows) = merged.try_next().await? {
                let rows = mink_log::codec::project(&rows, &plan.columns)?;
                if rows.num_rows() == 0 {
                    continue;
                }
                rows_sent += rows.num_rows() as u64;
                let item = ReadItem {
                    bucket: b.bucket.clone(),
                    offset: to,
                    data: ReadData::Rows(rows),
                };
                if tx.send(Ok(item)).await.is_err() {
                    return Ok(());
                }
                if plan.max_rows.is_some_and(|m| rows_sent >= m) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Snapshots of the plan's buckets into `tx`: each bucket's current rows at one offset, at
    /// its leader.
    async fn send_snapshots(
        &self,
        plan: &ReadPlan,
        options: &ReadOptions,
        tx: &tokio::sync::mpsc::Sender<NodeResult<ReadItem>>,
    ) -> NodeResult<()> {
        let mut rows_sent = 0u64;
        for b in &plan.buckets {
            if plan.max_rows.is_some_and(|m| rows_sent >= m) {
                return Ok(());
            }
            let left = plan.max_rows.map(|m| m - rows_sent);
            if let (Some(leader), false) = (&b.leader, options.local_only) {
                let forwarder = self.forwarder()?;
                let mut batches = forwarder
                    .snapshot(
                        leader,
                        &b.bucket,
                        &plan.columns,
                        &plan.filter_spec,
                        left,
                        self.view().applied_index,
                    )
                    .await?;
                while let Some(batch) = batches.next().await {
                    let (batch, offset) = batch?;
                    rows_sent += batch.num_rows() as u64;
                    let item = ReadItem {
                        bucket: b.bucket.clone(),
                        offset,
                        data: ReadData::Rows(batch),
                    };
                    if tx.send(Ok(item)).await.is_err() {
                        return Ok(());
                    }
                }
                continue;
            }
            let mut scan = self.kv_scan(&b.bucket).await?;
            loop {
                if plan.max_rows.is_some_and(|m| rows_sent >= m) {
                    return Ok(());
                }
                let Some(batch) = scan.next_batch(SNAPSHOT_PAGE_ROWS)? else {
                    break;
                };
                let batch = mink_log::codec::project(&plan.filter.apply(batch)?, &plan.columns)?;
                if batch.num_rows() == 0 {
                    continue;
                }
                rows_sent += batch.num_rows() as u64;
                let item = ReadItem {
                    bucket: b.bucket.clone(),
                    offset: scan.offset(),
                    data: ReadData::Rows(batch),
                };
                if tx.send(Ok(item)).await.is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// A reader of a bucket's stream whose batches have `schema` (any node can read).
    pub(crate) fn bucket_log(&self, b: &BucketRef, schema: SchemaRef) -> NodeResult<LogTablet> {
        let record = self.table_record(&b.database, &b.table)?;
        let r = self.bucket_record(&self.view(), &record, b.partition.as_deref(), b.bucket)?;
        let options = TableOptions::parse(&record.options)?;
        Ok(LogTablet::new(
            self.inner.streams.clone(),
            r.stream_id,
            schema,
            options.compression,
        ))
    }

    /// One read step of a bucket from `offset`, at most about `max_bytes` of stored batches,
    /// decoded (a log table's rows, or a primary-key table's changelog view): what a Kafka
    /// fetch needs. Any node can read; nothing above the high watermark is returned.
    pub async fn read_bucket(
        &self,
        b: &BucketRef,
        offset: u64,
        max_bytes: usize,
        columns: &[String],
    ) -> NodeResult<Vec<mink_log::ReadBatch>> {
        let record = self.table_record(&b.database, &b.table)?;
        if record.is_primary_key_table() {
            return self.read_changelog(b, offset, max_bytes, columns).await;
        }
        let tablet = self.bucket_log(b, self.table_schema(&record)?)?;
        Ok(tablet.read(offset, max_bytes, columns).await?)
    }

    /// The start and the committed end (high watermark) of a bucket.
    pub fn bucket_offsets(&self, b: &BucketRef) -> NodeResult<(u64, u64)> {
        let record = self.table_record(&b.database, &b.table)?;
        let view = self.view();
        let r = self.bucket_record(&view, &record, b.partition.as_deref(), b.bucket)?;
        let s = view
            .state
            .streams
            .get(&r.stream_id)
            .ok_or_else(|| NodeError::NotFound(format!("the stream of {b} is gone")))?;
        Ok((s.start_offset, s.end_offset))
    }

    /// The first stored batch of a bucket at or after offset `from` whose time is at or after
    /// `timestamp_ms` (undecoded), or `None` when there is none: the time index of
    /// [`S3Stream::offset_for_time`](s3stream::S3Stream::offset_for_time), which reads the
    /// object indexes and one block. Any node can answer; nothing above the high watermark.
    pub async fn first_batch_at_time(
        &self,
        b: &BucketRef,
        from: u64,
        timestamp_ms: i64,
    ) -> NodeResult<Option<mink_log::StoredBatch>> {
        let record = self.table_record(&b.database, &b.table)?;
        let r = self.bucket_record(&self.view(), &record, b.partition.as_deref(), b.bucket)?;
        let found = self
            .inner
            .streams
            .offset_for_time(r.stream_id, from, timestamp_ms)
            .await?;
        Ok(found.map(|s| mink_log::StoredBatch {
            base_offset: s.base_offset,
            end_offset: s.end_offset(),
            timestamp_ms: s.timestamp_ms,
            payload: s.payload,
        }))
    }

    /// Waits (at most `limit`) until a bucket's committed end passes `offset`: tailing, a
    /// long-polling fetch. Returns the committed end.
    pub async fn wait_for_data(
        &self,
        b: &BucketRef,
        offset: u64,
        limit: Duration,
    ) -> NodeResult<u64> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let applied = self.view().applied_index;
            let (_, end) = self.bucket_offsets(b)?;
            if end > offset {
                return Ok(end);
            }
            if !self.next_applied(applied, deadline).await? {
                return Ok(end);
            }
        }
    }
}

/// A decoded batch `[base, end)` cut before `to`: the rows kept and the offset after them.
fn cut(batch: RecordBatch, base: u64, end: u64, to: Option<u64>) -> (RecordBatch, u64) {
    match to {
        Some(to) if to < end => {
            let keep = usize::try_from(to.saturating_sub(base)).unwrap_or(usize::MAX);
            if keep < batch.num_rows() {
                (batch.slice(0, keep), base + keep as u64)
            } else {
                (batch, end)
            }
        }
        _ => (batch, end),
    }
}

/// Rows per batch of a snapshot scan.
const SNAPSHOT_PAGE_ROWS: usize = 8192;
