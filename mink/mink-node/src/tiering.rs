//! Tiering into the lake. Every table with `table.datalake.enabled` gets a round once its lake
//! is half its `table.datalake.freshness` old (so the lake stays fresher than that while a
//! round takes less than the other half), on the node leading its first bucket: tables spread
//! over the cluster as their buckets do, and move with them on failover. A round reads each
//! bucket's log from its tiered offset to the committed end (a bounded amount per round) and
//! commits it to the Iceberg table exactly once ([`mink_lake::Lake::tier`]). The lease holder
//! then records the snapshot and the offsets in the metadata log (`CommitLakeSnapshot`): each
//! tick it asks the catalog, in one query, which tables' metadata moved, and records those.
//!
//! Recovery needs nothing special: the Iceberg snapshot summary is the record of what is
//! tiered. After a crash between the Iceberg commit and `CommitLakeSnapshot`, the next round
//! starts from the older offsets in the metadata, the lake drops the rows it already holds,
//! and the summary's offsets are recorded.
//!
//! Queries move rounds forward: the SQL engine reports how many log-tail rows its scans of a
//! lake table read ([`Node::note_tail_scan`], sent to the tiering node), and once they add up
//! to `tail_rows_for_a_round` since the table's last round, the next round is due at once —
//! but no sooner than [`MIN_ROUND_INTERVAL`] (or a twentieth of the freshness, if longer)
//! after the last one. A table queried often with a long tail is tiered sooner; never later
//! than its freshness says.
//!
//! `__timestamp` is the time of the row's stored batch (its append time, or the latest record
//! time a Kafka producer gave a raw topic's batch); the round's time for a batch stored before
//! batches carried one (s3stream format version 1). A primary-key row's is its change's
//! `_commit_timestamp`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use arrow::array::RecordBatch;
use mink_lake::pk::{BucketChanges, ChangeRows};
use mink_lake::tier::{BucketRound, LogRows, Tiered, lake_starts, tiered_offsets};
use mink_log::options::TableOptions;
use mink_metadata::{BucketOffset, Command, CommitLakeSnapshot, LakeSnapshotRecord, TableRecord};

use crate::{BucketRef, Node, NodeError, NodeResult};

/// How often a node looks for tables due a round (and the lease holder for rounds to record).
const TIERING_TICK: Duration = Duration::from_millis(500);
/// Rounds that queries' tail scans bring forward come at most this often per table.
const MIN_ROUND_INTERVAL: Duration = Duration::from_secs(1);
/// Every this many ticks (a minute), a node drops the key indexes of tables gone from the lake.
const KEY_INDEX_PRUNE_TICKS: u64 = 120;
/// Log bytes read per bucket and round at most (the rest waits for the next round).
const ROUND_BYTES_PER_BUCKET: usize = 64 << 20;

/// The node that tiers `table`: the leader of its first bucket, so tables spread over the
/// cluster as their buckets do and move with them on failover. `None` while it has none.
pub(crate) fn tiering_node(view: &mink_metadata::View, table: &TableRecord) -> Option<u64> {
    view.state
        .buckets
        .range((table.table_id, 0, 0)..=(table.table_id, u64::MAX, u32::MAX))
        .next()
        .map(|(_, b)| b.leader_node_id)
        .filter(|id| *id != 0)
}

pub(crate) async fn run(node: Node) {
    let mut shutdown = node.inner.shutdown.subscribe();
    // table id -> when this node last ran a round of it (its record may lag the commit).
    let mut ran: HashMap<u64, u64> = HashMap::new();
    let mut ticks: u64 = 0;
    loop {
        let view = node.view();
        let now_ms = node.inner.config.clock.now_ms();
        // The key indexes of tables dropped (or no longer in the lake) go, now and then.
        if ticks.is_multiple_of(KEY_INDEX_PRUNE_TICKS)
            && let Some(lake) = node.inner.lake.get()
        {
            let keep = lake_tables(&view)
                .map(|(t, _, _)| (t.database.clone(), t.name.clone()))
                .collect();
            lake.retain_key_indexes(&keep);
        }
        ticks += 1;
        for (table, freshness, _) in lake_tables(&view) {
            if tiering_node(&view, table) != Some(node.node_id()) {
                continue;
            }
            let record = view.state.lake_snapshots.get(&table.table_id);
            let last_ms = record
                .map_or(table.created_at_ms, |r| r.committed_at_ms)
                .max(ran.get(&table.table_id).copied().unwrap_or(0));
            let due_ms = u64::try_from((freshness / 2).as_millis()).unwrap_or(u64::MAX);
            let soonest_ms = u64::try_from(MIN_ROUND_INTERVAL.max(freshness / 20).as_millis())
                .unwrap_or(u64::MAX);
            let demand = node
                .inner
                .tail_demand
                .lock()
                .expect("tail demand")
                .get(&table.table_id)
                .copied()
                .unwrap_or(0);
            let elapsed = now_ms.saturating_sub(last_ms);
            // 0 turns the feedback off.
            let threshold = node.inner.config.tail_rows_for_a_round;
            let wanted = threshold > 0 && demand >= threshold && elapsed >= soonest_ms;
            if elapsed < due_ms && record.is_some() && !wanted {
                continue;
            }
            ran.insert(table.table_id, now_ms);
            node.inner
                .tail_demand
                .lock()
                .expect("tail demand")
                .remove(&table.table_id);
            if let Err(e) = tier_round(&node, table, record).await {
                tracing::warn!(error = %e, table = %table.name, "tiering round failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TIERING_TICK) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// The lease holder records every lake table whose Iceberg table moved (a round here or
/// elsewhere, a compaction): a [`mink_coordinator::Duty`] the coordinator runs.
pub(crate) struct LakeSnapshotsDuty {
    node: Node,
    /// table id -> the catalog's metadata location last checked against the record.
    checked: Mutex<HashMap<u64, String>>,
}

impl LakeSnapshotsDuty {
    pub(crate) fn new(node: Node) -> Self {
        LakeSnapshotsDuty {
            node,
            checked: Mutex::new(HashMap::new()),
        }
    }

    async fn record(&self, epoch: u64) {
        let view = self.node.view();
        if lake_tables(&view).next().is_none() {
            return;
        }
        // Out of the lock across the awaits (one round at a time: nothing else takes it).
        let mut checked = std::mem::take(&mut *self.checked.lock().expect("checked"));
        if let Err(e) = record_moved(&self.node, epoch, &view, &mut checked).await {
            tracing::warn!(error = %e, "recording lake snapshots failed");
        }
        *self.checked.lock().expect("checked") = checked;
    }
}

impl mink_coordinator::Duty for LakeSnapshotsDuty {
    fn name(&self) -> &'static str {
        "lake snapshot records"
    }

    fn period(&self) -> Duration {
        TIERING_TICK
    }

    fn round(&self, epoch: u64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.record(epoch))
    }

    fn lease_lost(&self) {
        self.checked.lock().expect("checked").clear();
    }
}

/// Records the lake snapshot of every lake table whose catalog entry points at other metadata
/// than the one recorded: one catalog query for all of them, a table load only for those.
async fn record_moved(
    node: &Node,
    epoch: u64,
    view: &mink_metadata::View,
    checked: &mut HashMap<u64, String>,
) -> NodeResult<()> {
    let lake = node.lake().await?;
    let heads = lake.metadata_locations().await?;
    for (table, _, _) in lake_tables(view) {
        let record = view.state.lake_snapshots.get(&table.table_id);
        let Some(head) = heads.get(&(table.database.clone(), table.name.clone())) else {
            continue;
        };
        // Moved metadata without a new snapshot (an expiry) is checked once.
        if Some(head) == record.map(|r| &r.metadata_location)
            || checked.get(&table.table_id) == Some(head)
        {
            continue;
        }
        record_lake_snapshot(node, epoch, table, record).await?;
        checked.insert(table.table_id, head.clone());
    }
    Ok(())
}

/// Every table tiered into the lake, with its `table.datalake.freshness`.
pub(crate) fn lake_tables(
    view: &mink_metadata::View,
) -> impl Iterator<Item = (&TableRecord, Duration, TableOptions)> {
    view.state.tables.values().filter_map(|t| {
        let options = TableOptions::parse(&t.options).ok()?;
        Some((t, options.lake_freshness?, options))
    })
}

impl Node {
    /// How many tiering rounds this node has run (committed or found tiered already).
    pub fn lake_rounds(&self) -> u64 {
        self.inner
            .lake_rounds
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records that a query's scan of `database.table` read `rows` rows of its log tail (past
    /// the lake snapshot): enough of them since its last round bring the next one forward on
    /// this node, if it tiers the table. Advisory: a report that reaches another node changes
    /// nothing, and the freshness bound holds regardless.
    pub fn note_tail_scan(&self, database: &str, table: &str, rows: u64) -> NodeResult<()> {
        let record = self.table_record(database, table)?;
        self.inner
            .tail_demand
            .lock()
            .expect("tail demand")
            .entry(record.table_id)
            .and_modify(|r| *r = r.saturating_add(rows))
            .or_insert(rows);
        Ok(())
    }

    /// Tiers a round of `database.table` now rather than when its freshness says, on the node
    /// holding the lease (elsewhere: `Unavailable`). Returns whether a new lake snapshot was
    /// recorded.
    pub async fn tier_now(&self, database: &str, table: &str) -> NodeResult<bool> {
        let (record, epoch) = self.lake_duty(database, table, "tiering")?;
        let view = self.view();
        let snapshot = view.state.lake_snapshots.get(&record.table_id);
        tier_table(self, epoch, &record, snapshot).await
    }
}

impl Node {
    /// The record of lake table `database.table` and the lease's coordinator epoch, for
    /// `duty` (tiering, maintenance) done now on this node: `Invalid` if the table has no
    /// lake, `Unavailable` unless this node holds the lease.
    pub(crate) fn lake_duty(
        &self,
        database: &str,
        table: &str,
        duty: &str,
    ) -> NodeResult<(TableRecord, u64)> {
        let record = self.table_record(database, table)?;
        if TableOptions::parse(&record.options)?
            .lake_freshness
            .is_none()
        {
            return Err(NodeError::Invalid(format!(
                "{database}.{table} is not tiered into the lake (table.datalake.enabled)"
            )));
        }
        let epoch = self.inner.sink.lease().borrow().coordinator_epoch();
        let epoch = epoch.ok_or_else(|| {
            NodeError::Unavailable(format!(
                "{duty} runs on the node holding the lease; this one does not"
            ))
        })?;
        Ok((record, epoch))
    }
}

/// One round of `table` here, then its record (on the lease holder): returns whether a
/// snapshot was recorded.
pub(crate) async fn tier_table(
    node: &Node,
    coordinator_epoch: u64,
    table: &TableRecord,
    record: Option<&LakeSnapshotRecord>,
) -> NodeResult<bool> {
    tier_round(node, table, record).await?;
    // Record the lake's current snapshot (this round's, or one a crashed round left behind).
    record_lake_snapshot(node, coordinator_epoch, table, record).await
}

/// One round of `table`, from the offsets `record` holds, committed to its Iceberg table on
/// any node (the lake's own summary keeps it exactly once); the lease holder records it.
pub(crate) async fn tier_round(
    node: &Node,
    table: &TableRecord,
    record: Option<&LakeSnapshotRecord>,
) -> NodeResult<()> {
    let _round = node.inner.tiering.lock().await;
    let view = node.view();
    let now_us = i64::try_from(node.inner.config.clock.now_ms())
        .unwrap_or(i64::MAX)
        .saturating_mul(1000);
    let (mut rounds, mut changes) = (Vec::new(), Vec::new());
    // No record: a new lake, or one disabled and enabled again, whose own summary says how far
    // it got (the metadata forgot it when it was disabled).
    let resumed = match record {
        Some(_) => Default::default(),
        None => {
            let lake = node.lake().await?;
            tiered_offsets(&lake.load_table(&table.database, &table.name).await?)
        }
    };
    let buckets = view
        .state
        .buckets
        .range((table.table_id, 0, 0)..=(table.table_id, u64::MAX, u32::MAX));
    for (&(_, partition_id, bucket), b) in buckets {
        let Some(stream) = view.state.streams.get(&b.stream_id) else {
            continue;
        };
        let recorded = match record {
            Some(r) => r.tiered_offset(partition_id, bucket),
            None => resumed.get(&(partition_id, bucket)).copied(),
        };
        let partition = view
            .state
            .partitions
            .get(&(table.table_id, partition_id))
            .map(|p| p.name.clone());
        if table.is_partitioned() && partition.is_none() {
            continue;
        }
        let partition_values = || match &partition {
            Some(name) => mink_log::routing::partition_values(&table.partition_keys, name),
            None => Ok(Default::default()),
        };
        if table.is_primary_key_table() && recorded.is_none() && stream.start_offset > 0 {
            // The lake enabled on a table whose changelog no longer begins at 0: the first
            // round is the bucket's latest KV snapshot, its whole state at one offset (none
            // yet: a later round); the changelog after it follows.
            let key = (table.table_id, partition_id, bucket);
            let Some(snapshot) = view.state.latest_kv_snapshot(key) else {
                continue;
            };
            let batches = mink_kv::snapshot::read_snapshot(
                &node.inner.streams.object_store(),
                &object_store::path::Path::from(snapshot.location.as_str()),
                snapshot.log_offset,
            )
            .await?;
            changes.push(BucketChanges {
                partition_id,
                partition: partition_values()?,
                bucket,
                start_offset: 0,
                end_offset: snapshot.log_offset,
                changes: batches
                    .into_iter()
                    .map(|rows| state_as_changes(rows, snapshot.log_offset, now_us))
                    .collect(),
            });
            continue;
        }
        let tiered = recorded.unwrap_or(stream.start_offset);
        if stream.end_offset <= tiered {
            continue;
        }
        let at = BucketRef::new(&table.database, &table.name, partition.as_deref(), bucket);
        let (mut offset, mut bytes, mut batches) = (tiered, 0usize, Vec::new());
        while offset < stream.end_offset && bytes < ROUND_BYTES_PER_BUCKET {
            let step = node.read_bucket(&at, offset, 8 << 20, &[]).await?;
            let Some(last) = step.last() else { break };
            offset = last.end_offset;
            for rb in step {
                bytes += rb.batch.get_array_memory_size();
                batches.push(rb);
            }
        }
        if offset <= tiered {
            continue;
        }
        if table.is_primary_key_table() {
            changes.push(BucketChanges {
                partition_id,
                partition: partition_values()?,
                bucket,
                start_offset: tiered,
                end_offset: offset,
                changes: batches
                    .iter()
                    .map(|rb| mink_read::changes_from_changelog(&rb.batch))
                    .collect::<Result<_, _>>()?,
            });
        } else {
            rounds.push(BucketRound {
                partition_id,
                bucket,
                start_offset: tiered,
                end_offset: offset,
                batches: batches
                    .into_iter()
                    .map(|rb| LogRows {
                        base_offset: rb.base_offset,
                        timestamp_us: if rb.timestamp_ms >= 0 {
                            rb.timestamp_ms.saturating_mul(1000)
                        } else {
                            now_us
                        },
                        rows: rb.batch,
                    })
                    .collect(),
            });
        }
    }
    if rounds.is_empty() && changes.is_empty() {
        // Nothing past the recorded offsets, so nothing past the lake's either.
        return Ok(());
    }
    let lake = node.lake().await?;
    let tiered = if table.is_primary_key_table() {
        lake.tier_changes(&table.database, &table.name, &table.primary_key, changes)
            .await?
    } else {
        lake.tier(&table.database, &table.name, rounds).await?
    };
    node.inner
        .lake_rounds
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match tiered {
        Tiered::Committed { snapshot_id, .. } => {
            tracing::debug!(table = %table.name, snapshot_id, "tiered a round");
        }
        Tiered::AlreadyTiered { .. } => {}
    }
    Ok(())
}

/// A primary-key bucket's rows in a KV snapshot covering the changes below `log_offset`, as
/// upserts: each row takes the snapshot's last offset (its last change is at or below it) and
/// the round's time as its `__offset` and `__timestamp`.
fn state_as_changes(rows: RecordBatch, log_offset: u64, now_us: i64) -> ChangeRows {
    let n = rows.num_rows();
    ChangeRows {
        rows,
        offsets: vec![log_offset.saturating_sub(1); n],
        timestamps_us: vec![now_us; n],
        upsert: vec![true; n],
    }
}

/// Records the lake table's current snapshot of `table` and the tiered offsets its summary
/// holds (`CommitLakeSnapshot`), unless `record` names it already. Returns whether it did.
pub(crate) async fn record_lake_snapshot(
    node: &Node,
    coordinator_epoch: u64,
    table: &TableRecord,
    record: Option<&LakeSnapshotRecord>,
) -> NodeResult<bool> {
    let lake = node.lake().await?;
    let lake_table = lake.load_table(&table.database, &table.name).await?;
    let Some(snapshot_id) = lake_table.metadata().current_snapshot_id() else {
        return Ok(false);
    };
    if record.is_some_and(|r| r.snapshot_id == snapshot_id) {
        return Ok(false);
    }
    // Offsets of buckets the table has (a dropped partition's may linger in the lake until
    // maintenance removes them; the metadata refuses them).
    let view = node.view();
    let starts = lake_starts(&lake_table);
    let bucket_offsets = tiered_offsets(&lake_table)
        .into_iter()
        .filter(|((partition_id, bucket), _)| {
            view.state
                .buckets
                .contains_key(&(table.table_id, *partition_id, *bucket))
        })
        .map(|((partition_id, bucket), offset)| BucketOffset {
            partition_id,
            bucket,
            offset,
            lake_start: starts.get(&(partition_id, bucket)).copied().unwrap_or(0),
        })
        .collect();
    let proposed = node
        .inner
        .sink
        .propose(Command::CommitLakeSnapshot(CommitLakeSnapshot {
            coordinator_epoch,
            table_id: table.table_id,
            snapshot_id,
            metadata_location: lake_table
                .metadata_location()
                .unwrap_or_default()
                .to_string(),
            bucket_offsets,
        }))
        .await?;
    proposed
        .result
        .map(|_| true)
        .map_err(|r| NodeError::Failed(format!("recording lake snapshot {snapshot_id}: {r}")))
}
