//! Apply: the pure function from (state, row) to (state', results).
//!
//! No clocks and no node-local input: a row's time is the `proposed_at_ms` it carries, and every
//! rule reads only the state and the command. The same log therefore yields the same state and
//! the same results in every process. Each command validates against the current state and
//! either changes it (`Done`), finds the work already done (`Redundant`, nothing changes), or is
//! rejected (nothing changes).

use std::collections::{BTreeMap, BTreeSet};

use imbl::OrdMap;

use crate::codec::Row;
use crate::command::*;
use crate::outcome::*;
use crate::record::*;
use crate::state::{BucketKey, State};

/// Most buckets a table (or a partition) may have.
pub const MAX_BUCKETS: u32 = 4096;
/// Most object ids one `PrepareObject` may reserve.
pub const MAX_PREPARE: u32 = 10_000;
/// Most writer ids one `AllocateProducerIds` may hand out.
pub const MAX_PRODUCER_IDS: u32 = 1_000_000;
/// Batches remembered per idempotent writer and stream (as Kafka does).
pub const WRITER_BATCHES: usize = 5;
/// Longest database, table, partition, group or sequence name.
pub const MAX_NAME_LEN: usize = 255;

/// Options whose change would re-shape stored data; `AlterTable` refuses them.
const IMMUTABLE_OPTIONS: &[&str] = &[
    "bucket.num",
    "bucket.key",
    "table.merge-engine",
    "table.merge-engine.versioned.ver-column",
    "table.changelog.image",
];

/// The environment of one row's apply: only what is in the log itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApplyContext {
    /// Log index of the row being applied.
    pub index: u64,
    /// The row's `proposed_at_ms`.
    pub at_ms: u64,
    /// Highest `metadata_version` this binary supports.
    pub supported_version: u32,
}

/// A row this binary must not apply. The sink stops rather than diverge from newer nodes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Fatal {
    #[error(
        "the cluster moves to metadata_version {version}, this binary supports up to {supported}: upgrade this node"
    )]
    UnsupportedVersion { version: u32, supported: u32 },
}

/// What applying a row did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowOutcome {
    /// Applied now; one result per command, in order.
    Applied(Vec<CommandResult>),
    /// The row's token was already applied: this is a resend. Carries the results of the first
    /// copy when it was its process's latest row (the only one that can be resent).
    Duplicate(Option<Vec<CommandResult>>),
    /// The row comes from a superseded process (older node epoch, or another incarnation at
    /// the same epoch): nothing applied, every command rejected.
    Fenced(Vec<CommandResult>),
}

impl RowOutcome {
    pub fn results(&self) -> Option<&[CommandResult]> {
        match self {
            RowOutcome::Applied(r) | RowOutcome::Fenced(r) => Some(r),
            RowOutcome::Duplicate(r) => r.as_deref(),
        }
    }
}

fn rej(kind: RejectionKind, message: impl Into<String>) -> Rejection {
    Rejection::new(kind, message)
}

fn done(reply: Reply) -> CommandResult {
    Ok(Outcome::Done(reply))
}

fn redundant(reply: Reply) -> CommandResult {
    Ok(Outcome::Redundant(reply))
}

fn unit() -> Reply {
    Reply::Unit(Unit {})
}

fn check_name(what: &str, name: &str) -> Result<(), Rejection> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.contains(['/', '\0']) {
        return Err(rej(
            RejectionKind::InvalidArgument,
            format!("{what} name {name:?} must be 1 to {MAX_NAME_LEN} bytes without '/' or NUL"),
        ));
    }
    Ok(())
}

/// Sequence names are namespaced paths (`table/7/auto_increment/id`).
fn check_sequence(name: &str) -> Result<(), Rejection> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.contains('\0') {
        return Err(rej(
            RejectionKind::InvalidArgument,
            format!("sequence name {name:?} must be 1 to {MAX_NAME_LEN} bytes without NUL"),
        ));
    }
    Ok(())
}

fn check_count(what: &str, count: u64, max: u64) -> Result<(), Rejection> {
    if count == 0 || count > max {
        return Err(rej(
            RejectionKind::InvalidArgument,
            format!("{what} count {count} must be between 1 and {max}"),
        ));
    }
    Ok(())
}

fn remove_where<K: Ord + Clone, V: Clone>(
    map: &mut OrdMap<K, V>,
    keys: impl IntoIterator<Item = K>,
) -> usize {
    keys.into_iter().filter(|k| map.remove(k).is_some()).count()
}

/// A planned move of a stream's ranges into a new object (compaction).
struct RangeMove {
    stream_id: u64,
    /// Start key of the new range (may lie inside a partially trimmed first range).
    start: u64,
    end: u64,
    /// Keys of the range records being replaced.
    replaced: Vec<(u64, u64)>,
}

impl State {
    /// Applies one log row at `ctx.index`. Returns `Err` only for a row this binary must not
    /// apply at all; the state is then unchanged.
    pub fn apply_row(&mut self, ctx: &ApplyContext, row: &Row) -> Result<RowOutcome, Fatal> {
        let token = row.token;
        if let Some(node) = self.nodes.get(&token.node_id) {
            let superseded = token.node_epoch < node.node_epoch
                || (token.node_epoch == node.node_epoch && token.incarnation != node.incarnation);
            if superseded {
                let rejection = rej(
                    RejectionKind::NodeFenced,
                    format!(
                        "row from node {} epoch {} (incarnation {:x}) was superseded by epoch {}",
                        token.node_id, token.node_epoch, token.incarnation, node.node_epoch
                    ),
                )
                .with_current(node.node_epoch);
                return Ok(RowOutcome::Fenced(
                    row.commands
                        .iter()
                        .map(|_| Err(rejection.clone()))
                        .collect(),
                ));
            }
        }
        if let Some(last) = self.row_tokens.get(&token.node_id)
            && last.node_epoch == token.node_epoch
            && last.incarnation == token.incarnation
            && token.sequence <= last.sequence
        {
            let stored = (token.sequence == last.sequence)
                .then(|| last.results.iter().map(StoredResult::to_result).collect());
            return Ok(RowOutcome::Duplicate(stored));
        }
        // Work on a copy (cheap: the maps share structure), so that a row this binary must
        // not apply leaves the state exactly as it was.
        let mut next = self.clone();
        let mut fatal = None;
        let mut results = Vec::with_capacity(row.commands.len());
        for command in &row.commands {
            results.push(next.apply_command(ctx, row.proposed_at_ms, command, &mut fatal));
            if let Some(fatal) = fatal {
                return Err(fatal);
            }
        }
        next.row_tokens.insert(
            token.node_id,
            RowTokenRecord {
                node_id: token.node_id,
                node_epoch: token.node_epoch,
                incarnation: token.incarnation,
                sequence: token.sequence,
                results: results.iter().map(StoredResult::from).collect(),
            },
        );
        *self = next;
        Ok(RowOutcome::Applied(results))
    }

    fn apply_command(
        &mut self,
        ctx: &ApplyContext,
        at_ms: u64,
        command: &Command,
        fatal: &mut Option<Fatal>,
    ) -> CommandResult {
        if command.since() > self.metadata_version {
            return Err(rej(
                RejectionKind::NotEnabled,
                format!(
                    "{} needs metadata_version {}, the cluster is at {}",
                    command.name(),
                    command.since(),
                    self.metadata_version
                ),
            )
            .with_current(u64::from(self.metadata_version)));
        }
        if let Some(node) = command.node()
            && !matches!(command, Command::RegisterNode(_))
        {
            self.check_node(node.node_id, node.node_epoch)?;
        }
        if let Some(epoch) = command.coordinator_epoch() {
            self.check_coordinator(epoch)?;
        }
        match command {
            Command::RegisterNode(c) => self.register_node(c, at_ms),
            Command::CreateStreams(c) => self.create_streams(c, at_ms),
            Command::OpenStream(c) => self.open_stream(c),
            Command::CloseStream(c) => self.close_stream(c),
            Command::TrimStream(c) => self.trim_stream(c, at_ms),
            Command::DeleteStream(c) => self.delete_stream(c, at_ms),
            Command::PlaceStream(c) => self.place_stream(c),
            Command::TransferStream(c) => self.transfer_stream(c),
            Command::CompleteTransfer(c) => self.complete_transfer(c),
            Command::PrepareObject(c) => self.prepare_object(c),
            Command::CommitStreamSetObject(c) => self.commit_stream_set_object(c, at_ms),
            Command::CompactStreamObject(c) => self.compact_stream_object(c, at_ms),
            Command::ExpirePreparedObjects(c) => self.expire_prepared_objects(c),
            Command::CleanDestroyedObjects(c) => self.clean_destroyed_objects(c),
            Command::AllocateProducerIds(c) => self.allocate_producer_ids(c),
            Command::PutKv(c) => self.put_kv(ctx, c),
            Command::PutKvIfAbsent(c) => self.put_kv_if_absent(ctx, c),
            Command::DeleteKv(c) => self.delete_kv(c),
            Command::DeleteKvIfMatches(c) => self.delete_kv_if_matches(c),
            Command::CreateDatabase(c) => self.create_database(c, at_ms),
            Command::DropDatabase(c) => self.drop_database(c, at_ms),
            Command::CreateTable(c) => self.create_table(c, at_ms),
            Command::DropTable(c) => self.drop_table(c, at_ms),
            Command::AlterTable(c) => self.alter_table(c),
            Command::CreatePartition(c) => self.create_partition(c, at_ms),
            Command::DropPartition(c) => self.drop_partition(c, at_ms),
            Command::LeadBucket(c) => self.lead_bucket(c),
            Command::CommitKvSnapshot(c) => self.commit_kv_snapshot(c, at_ms),
            Command::DropKvSnapshot(c) => self.drop_kv_snapshot(c),
            Command::CommitLakeSnapshot(c) => self.commit_lake_snapshot(c, at_ms),
            Command::Allocate(c) => self.allocate(c),
            Command::RegisterCoordinator(c) => self.register_coordinator(c),
            Command::UpgradeMetadataVersion(c) => self.upgrade_metadata_version(ctx, c, fatal),
            Command::RegisterProducerOffsets(c) => self.register_producer_offsets(c, at_ms),
            Command::DeleteProducerOffsets(c) => self.delete_producer_offsets(c),
            Command::ExpireProducerOffsets(c) => self.expire_producer_offsets(c),
            Command::CommitGroupOffsets(c) => self.commit_group_offsets(c, at_ms),
            Command::DeleteGroupOffsets(c) => self.delete_group_offsets(c),
            Command::ExpireGroupOffsets(c) => self.expire_group_offsets(c),
        }
    }

    // ------------------------------------------------------------------ checks

    fn check_node(&self, node_id: u64, node_epoch: u64) -> Result<&NodeRecord, Rejection> {
        let node = self.nodes.get(&node_id).ok_or_else(|| {
            rej(
                RejectionKind::NotFound,
                format!("node {node_id} is not registered"),
            )
        })?;
        if node.node_epoch != node_epoch {
            let kind = if node_epoch < node.node_epoch {
                RejectionKind::NodeFenced
            } else {
                RejectionKind::InvalidArgument
            };
            return Err(rej(
                kind,
                format!(
                    "node {node_id} epoch {node_epoch} does not match its registered epoch {}",
                    node.node_epoch
                ),
            )
            .with_current(node.node_epoch));
        }
        Ok(node)
    }

    fn check_coordinator(&self, epoch: u64) -> Result<(), Rejection> {
        let Some(coordinator) = &self.coordinator else {
            return Err(rej(
                RejectionKind::CoordinatorFenced,
                "no coordinator is registered",
            ));
        };
        let holder_current = self
            .nodes
            .get(&coordinator.node_id)
            .is_some_and(|n| n.node_epoch == coordinator.node_epoch);
        if coordinator.epoch != epoch || !holder_current {
            return Err(rej(
                RejectionKind::CoordinatorFenced,
                format!(
                    "coordinator epoch {epoch} is not current (current {} held by node {})",
                    coordinator.epoch, coordinator.node_id
                ),
            )
            .with_current(coordinator.epoch));
        }
        Ok(())
    }

    fn stream(&self, stream_id: u64) -> Result<&StreamRecord, Rejection> {
        self.streams.get(&stream_id).ok_or_else(|| {
            rej(
                RejectionKind::NotFound,
                format!("stream {stream_id} does not exist"),
            )
        })
    }

    /// The caller must own the stream at exactly `stream_epoch`.
    fn check_owner(
        stream: &StreamRecord,
        node_id: u64,
        node_epoch: u64,
        stream_epoch: u64,
    ) -> Result<(), Rejection> {
        let id = stream.stream_id;
        if stream_epoch < stream.epoch {
            return Err(rej(
                RejectionKind::StreamFenced,
                format!(
                    "stream {id} is at epoch {}, not {stream_epoch}",
                    stream.epoch
                ),
            )
            .with_current(stream.epoch));
        }
        if stream_epoch > stream.epoch {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!("stream {id} was never opened at epoch {stream_epoch}"),
            )
            .with_current(stream.epoch));
        }
        if stream.owner_node_id != node_id || stream.owner_node_epoch != node_epoch {
            return Err(rej(
                RejectionKind::StreamFenced,
                format!(
                    "stream {id} epoch {stream_epoch} is owned by node {} epoch {}",
                    stream.owner_node_id, stream.owner_node_epoch
                ),
            )
            .with_current(stream.epoch));
        }
        Ok(())
    }

    fn table(&self, table_id: u64) -> Result<&TableRecord, Rejection> {
        self.tables.get(&table_id).ok_or_else(|| {
            rej(
                RejectionKind::NotFound,
                format!("table {table_id} does not exist"),
            )
        })
    }

    fn bucket(&self, key: BucketKey) -> Result<&BucketRecord, Rejection> {
        self.buckets.get(&key).ok_or_else(|| {
            rej(
                RejectionKind::NotFound,
                format!(
                    "bucket {} of table {} partition {} does not exist",
                    key.2, key.0, key.1
                ),
            )
        })
    }

    // ------------------------------------------------------------------ s3stream

    fn register_node(&mut self, c: &RegisterNode, at_ms: u64) -> CommandResult {
        if c.node_id == 0 || c.node_epoch == 0 {
            return Err(rej(
                RejectionKind::InvalidArgument,
                "node id and node epoch must be positive",
            ));
        }
        if c.supported_metadata_version < self.metadata_version {
            return Err(rej(
                RejectionKind::NotEnabled,
                format!(
                    "node {} supports metadata_version {} but the cluster is at {}: upgrade it",
                    c.node_id, c.supported_metadata_version, self.metadata_version
                ),
            )
            .with_current(u64::from(self.metadata_version)));
        }
        if let Some(node) = self.nodes.get(&c.node_id) {
            if c.node_epoch == node.node_epoch && c.incarnation == node.incarnation {
                // The same process again: from version 3 it may (re)state its listeners, as a
                // node registered before the cluster reached 3 does once it has.
                if self.metadata_version >= 3 && node.listeners != c.listeners {
                    let mut node = node.clone();
                    node.listeners = c.listeners.clone();
                    let epoch = node.node_epoch;
                    self.nodes.insert(c.node_id, node);
                    return done(Reply::Epoch(epoch));
                }
                return redundant(Reply::Epoch(node.node_epoch));
            }
            if c.node_epoch <= node.node_epoch {
                return Err(rej(
                    RejectionKind::NodeFenced,
                    format!(
                        "node {} is registered at epoch {}; register above it",
                        c.node_id, node.node_epoch
                    ),
                )
                .with_current(node.node_epoch));
            }
        }
        self.nodes.insert(
            c.node_id,
            NodeRecord {
                node_id: c.node_id,
                node_epoch: c.node_epoch,
                incarnation: c.incarnation,
                address: c.address.clone(),
                supported_metadata_version: c.supported_metadata_version,
                registered_at_ms: at_ms,
                // A rule of version 3: nodes of an older cluster must build the same state.
                listeners: if self.metadata_version >= 3 {
                    c.listeners.clone()
                } else {
                    BTreeMap::new()
                },
            },
        );
        done(Reply::Epoch(c.node_epoch))
    }

    fn new_stream(&mut self, at_ms: u64, binding: Option<BucketKey>) -> u64 {
        let stream_id = self.counters.next_stream_id;
        self.counters.next_stream_id += 1;
        let (table_id, partition_id, bucket) = binding.unwrap_or_default();
        self.streams.insert(
            stream_id,
            StreamRecord {
                stream_id,
                epoch: 0,
                state: StreamState::Closed as i32,
                table_id,
                partition_id,
                bucket,
                created_at_ms: at_ms,
                ..Default::default()
            },
        );
        stream_id
    }

    fn create_streams(&mut self, c: &CreateStreams, at_ms: u64) -> CommandResult {
        check_count("stream", u64::from(c.count), u64::from(MAX_BUCKETS))?;
        let start = self.counters.next_stream_id;
        for _ in 0..c.count {
            self.new_stream(at_ms, None);
        }
        done(Reply::Range(IdRange {
            start,
            end: self.counters.next_stream_id,
        }))
    }

    fn open_stream(&mut self, c: &OpenStream) -> CommandResult {
        let stream = self.stream(c.stream_id)?.clone();
        if stream.table_id != 0 {
            let bucket = self.bucket((stream.table_id, stream.partition_id, stream.bucket))?;
            if bucket.leader_node_id != c.node_id || bucket.leader_node_epoch != c.node_epoch {
                return Err(rej(
                    RejectionKind::NotLeader,
                    format!(
                        "stream {} belongs to a bucket led by node {}",
                        c.stream_id, bucket.leader_node_id
                    ),
                )
                .with_current(bucket.leader_node_id));
            }
            if bucket.leader_epoch != c.stream_epoch {
                return Err(rej(
                    RejectionKind::LeaderFenced,
                    format!(
                        "stream {} must be opened at the bucket's leader epoch {}",
                        c.stream_id, bucket.leader_epoch
                    ),
                )
                .with_current(bucket.leader_epoch));
            }
        }
        let position = |s: &StreamRecord| {
            Reply::Stream(StreamPosition {
                stream_epoch: s.epoch,
                start_offset: s.start_offset,
                end_offset: s.end_offset,
            })
        };
        let owned_by_caller =
            stream.owner_node_id == c.node_id && stream.owner_node_epoch == c.node_epoch;
        if c.stream_epoch == 0 {
            return Err(rej(
                RejectionKind::InvalidArgument,
                "stream epochs start at 1 (0 means never opened)",
            ));
        }
        if c.stream_epoch < stream.epoch || (c.stream_epoch == stream.epoch && !owned_by_caller) {
            return Err(rej(
                RejectionKind::StreamFenced,
                format!(
                    "stream {} is at epoch {} owned by node {}; open it at a higher epoch",
                    c.stream_id, stream.epoch, stream.owner_node_id
                ),
            )
            .with_current(stream.epoch));
        }
        if c.stream_epoch == stream.epoch && stream.state == StreamState::Open as i32 {
            return redundant(position(&stream));
        }
        let mut stream = stream;
        stream.epoch = c.stream_epoch;
        stream.owner_node_id = c.node_id;
        stream.owner_node_epoch = c.node_epoch;
        stream.state = StreamState::Open as i32;
        let reply = position(&stream);
        self.streams.insert(c.stream_id, stream);
        done(reply)
    }

    fn close_stream(&mut self, c: &CloseStream) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        Self::check_owner(stream, c.node_id, c.node_epoch, c.stream_epoch)?;
        if stream.state == StreamState::Closed as i32 {
            return redundant(unit());
        }
        let mut stream = stream.clone();
        stream.state = StreamState::Closed as i32;
        self.streams.insert(c.stream_id, stream);
        done(unit())
    }

    /// The lowest offset a stream's table allows trimming to (retention floors).
    pub fn trim_floor(&self, stream: &StreamRecord) -> Option<u64> {
        let table = self.tables.get(&stream.table_id)?;
        let key = (stream.table_id, stream.partition_id, stream.bucket);
        let mut floor: Option<u64> = None;
        if table.is_primary_key_table() {
            let kv = self.latest_kv_snapshot(key).map_or(0, |s| s.log_offset);
            floor = Some(floor.map_or(kv, |f| f.min(kv)));
        }
        if table.is_lake_enabled() {
            let tiered = self
                .lake_snapshots
                .get(&stream.table_id)
                .and_then(|l| l.tiered_offset(stream.partition_id, stream.bucket))
                .unwrap_or(0);
            floor = Some(floor.map_or(tiered, |f| f.min(tiered)));
        }
        floor
    }

    fn trim_stream(&mut self, c: &TrimStream, at_ms: u64) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        Self::check_owner(stream, c.node_id, c.node_epoch, c.stream_epoch)?;
        if c.new_start_offset > stream.end_offset {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "cannot trim stream {} to {} beyond its committed end {}",
                    c.stream_id, c.new_start_offset, stream.end_offset
                ),
            )
            .with_current(stream.end_offset));
        }
        if c.new_start_offset <= stream.start_offset {
            return redundant(Reply::Stream(StreamPosition {
                stream_epoch: stream.epoch,
                start_offset: stream.start_offset,
                end_offset: stream.end_offset,
            }));
        }
        if let Some(floor) = self.trim_floor(stream)
            && c.new_start_offset > floor
        {
            return Err(rej(
                RejectionKind::BelowFloor,
                format!(
                    "stream {} may not be trimmed past {floor} (latest KV snapshot or tiered offset of its bucket)",
                    c.stream_id
                ),
            )
            .with_current(floor));
        }
        let mut stream = stream.clone();
        stream.start_offset = c.new_start_offset;
        let dropped: Vec<(u64, u64)> = self
            .ranges
            .range((c.stream_id, 0)..(c.stream_id, c.new_start_offset))
            .filter(|(_, r)| r.end_offset <= c.new_start_offset)
            .map(|(k, _)| *k)
            .collect();
        for key in dropped {
            if let Some(range) = self.ranges.remove(&key) {
                self.release_object_range(range.object_id, at_ms);
            }
        }
        let reply = Reply::Stream(StreamPosition {
            stream_epoch: stream.epoch,
            start_offset: stream.start_offset,
            end_offset: stream.end_offset,
        });
        self.streams.insert(c.stream_id, stream);
        done(reply)
    }

    /// One range record stopped pointing at `object_id`.
    fn release_object_range(&mut self, object_id: u64, at_ms: u64) {
        if let Some(object) = self.objects.get_mut(&object_id) {
            object.live_ranges = object.live_ranges.saturating_sub(1);
            if object.live_ranges == 0 && object.state == ObjectState::Committed as i32 {
                object.state = ObjectState::Destroyed as i32;
                object.destroyed_at_ms = at_ms;
            }
        }
    }

    /// Removes a stream with its ranges and writer state.
    fn remove_stream(&mut self, stream_id: u64, at_ms: u64) {
        let ranges: Vec<(u64, u64)> = self
            .ranges
            .range((stream_id, 0)..=(stream_id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in ranges {
            if let Some(range) = self.ranges.remove(&key) {
                self.release_object_range(range.object_id, at_ms);
            }
        }
        let writers: Vec<(u64, u64)> = self
            .writers
            .range((stream_id, 0)..=(stream_id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        remove_where(&mut self.writers, writers);
        self.streams.remove(&stream_id);
    }

    fn delete_stream(&mut self, c: &DeleteStream, at_ms: u64) -> CommandResult {
        let Some(stream) = self.streams.get(&c.stream_id) else {
            return redundant(unit());
        };
        if stream.table_id != 0 {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "stream {} stores bucket {} of table {}: drop the table or partition instead",
                    c.stream_id, stream.bucket, stream.table_id
                ),
            ));
        }
        if c.stream_epoch < stream.epoch {
            return Err(rej(
                RejectionKind::StreamFenced,
                format!("stream {} is at epoch {}", c.stream_id, stream.epoch),
            )
            .with_current(stream.epoch));
        }
        if stream.state == StreamState::Open as i32 {
            Self::check_owner(stream, c.node_id, c.node_epoch, c.stream_epoch)?;
        }
        self.remove_stream(c.stream_id, at_ms);
        done(unit())
    }

    fn place_stream(&mut self, c: &PlaceStream) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        if !self.nodes.contains_key(&c.node_id) {
            return Err(rej(
                RejectionKind::NotFound,
                format!("node {} is not registered", c.node_id),
            ));
        }
        if stream.placement_node_id == c.node_id && stream.transfer_to_node_id == 0 {
            return redundant(unit());
        }
        let mut stream = stream.clone();
        stream.placement_node_id = c.node_id;
        stream.transfer_to_node_id = 0;
        self.streams.insert(c.stream_id, stream);
        done(unit())
    }

    fn transfer_stream(&mut self, c: &TransferStream) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        if !self.nodes.contains_key(&c.to_node_id) {
            return Err(rej(
                RejectionKind::NotFound,
                format!("node {} is not registered", c.to_node_id),
            ));
        }
        if stream.placement_node_id == c.from_node_id && stream.transfer_to_node_id == c.to_node_id
        {
            return redundant(unit());
        }
        if stream.placement_node_id != c.from_node_id {
            return Err(rej(
                RejectionKind::Conflict,
                format!(
                    "stream {} is placed on node {}, not {}",
                    c.stream_id, stream.placement_node_id, c.from_node_id
                ),
            )
            .with_current(stream.placement_node_id));
        }
        let mut stream = stream.clone();
        stream.transfer_to_node_id = c.to_node_id;
        self.streams.insert(c.stream_id, stream);
        done(unit())
    }

    fn complete_transfer(&mut self, c: &CompleteTransfer) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        if stream.transfer_to_node_id == 0 && stream.placement_node_id == c.node_id {
            return redundant(unit());
        }
        if stream.transfer_to_node_id != c.node_id {
            return Err(rej(
                RejectionKind::Conflict,
                format!(
                    "stream {} has no transfer pending to node {}",
                    c.stream_id, c.node_id
                ),
            ));
        }
        Self::check_owner(stream, c.node_id, c.node_epoch, c.stream_epoch)?;
        let mut stream = stream.clone();
        stream.placement_node_id = c.node_id;
        stream.transfer_to_node_id = 0;
        self.streams.insert(c.stream_id, stream);
        done(unit())
    }

    fn prepare_object(&mut self, c: &PrepareObject) -> CommandResult {
        check_count(
            "prepared object",
            u64::from(c.count),
            u64::from(MAX_PREPARE),
        )?;
        let start = self.counters.next_object_id;
        for object_id in start..start + u64::from(c.count) {
            self.objects.insert(
                object_id,
                ObjectRecord {
                    object_id,
                    state: ObjectState::Prepared as i32,
                    node_id: c.node_id,
                    expires_at_ms: c.expires_at_ms,
                    ..Default::default()
                },
            );
        }
        self.counters.next_object_id = start + u64::from(c.count);
        done(Reply::Range(IdRange {
            start,
            end: self.counters.next_object_id,
        }))
    }

    /// A prepared id of this node, ready to be committed as `kind`.
    fn prepared_object(
        &self,
        object_id: u64,
        node_id: u64,
    ) -> Result<Option<&ObjectRecord>, Rejection> {
        let object = self.objects.get(&object_id).ok_or_else(|| {
            rej(
                RejectionKind::NotFound,
                format!("object {object_id} was never prepared"),
            )
        })?;
        if object.node_id != node_id {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "object {object_id} was prepared for node {}, not {node_id}",
                    object.node_id
                ),
            ));
        }
        match ObjectState::try_from(object.state) {
            Ok(ObjectState::Prepared) => Ok(Some(object)),
            Ok(ObjectState::Committed) => Ok(None),
            _ => Err(rej(
                RejectionKind::Expired,
                format!("object {object_id} expired before its commit; prepare a new id"),
            )),
        }
    }

    /// Plans replacing a stream's `[start, end)` held by `sources` with one new range.
    /// `Ok(None)`: the data is gone (stream deleted or trimmed past `end`).
    fn plan_move(
        &self,
        stream_id: u64,
        start: u64,
        end: u64,
        sources: &BTreeSet<u64>,
    ) -> Result<Option<RangeMove>, Rejection> {
        let Some(stream) = self.streams.get(&stream_id) else {
            return Ok(None);
        };
        let from = start.max(stream.start_offset);
        if from >= end {
            return Ok(None);
        }
        let conflict = |why: String| {
            rej(
                RejectionKind::Conflict,
                format!("compaction of stream {stream_id} [{start}, {end}): {why}"),
            )
        };
        let mut replaced = Vec::new();
        let mut cursor: Option<u64> = None;
        for range in self.stream_ranges(stream_id, from, end) {
            if !sources.contains(&range.object_id) {
                return Err(conflict(format!(
                    "offset {} lives in object {}, which is not a source",
                    range.start_offset, range.object_id
                )));
            }
            match cursor {
                None if range.start_offset > from => {
                    return Err(conflict(format!("no range holds offset {from}")));
                }
                Some(c) if c != range.start_offset => {
                    return Err(conflict(format!("ranges are not contiguous at {c}")));
                }
                _ => {}
            }
            cursor = Some(range.end_offset);
            replaced.push((stream_id, range.start_offset));
        }
        if cursor != Some(end) {
            return Err(conflict(format!(
                "the sources' ranges end at {}, not {end}",
                cursor.unwrap_or(from)
            )));
        }
        let first = replaced.first().map_or(from, |k| k.1);
        if first < start && start > stream.start_offset {
            // The new object would be credited with [first, start), which it does not hold.
            return Err(conflict(format!(
                "offset {start} is inside the range starting at {first}"
            )));
        }
        Ok(Some(RangeMove {
            stream_id,
            start: first,
            end,
            replaced,
        }))
    }

    fn execute_move(&mut self, m: &RangeMove, object_id: u64, at_ms: u64) {
        for key in &m.replaced {
            if let Some(range) = self.ranges.remove(key) {
                self.release_object_range(range.object_id, at_ms);
            }
        }
        self.ranges.insert(
            (m.stream_id, m.start),
            RangeRecord {
                stream_id: m.stream_id,
                start_offset: m.start,
                end_offset: m.end,
                object_id,
            },
        );
        if let Some(object) = self.objects.get_mut(&object_id) {
            object.live_ranges += 1;
        }
    }

    fn finish_object(&mut self, object_id: u64, kind: ObjectKind, size: u64, at_ms: u64) {
        if let Some(object) = self.objects.get_mut(&object_id) {
            object.kind = kind as i32;
            object.size = size;
            object.committed_at_ms = at_ms;
            if object.live_ranges > 0 {
                object.state = ObjectState::Committed as i32;
            } else {
                // Nothing references it: the bytes must still be deleted.
                object.state = ObjectState::Destroyed as i32;
                object.destroyed_at_ms = at_ms;
            }
        }
    }

    fn check_writers(&self, range: &StreamRange) -> Result<(), Rejection> {
        // (epoch, last sequence) per writer: committed, then advanced by the batches of this
        // range one by one, so a writer may have several batches in one commit.
        let mut tails: BTreeMap<u64, (u64, Option<u64>)> = BTreeMap::new();
        for w in &range.writers {
            if w.first_sequence > w.last_sequence
                || w.base_offset < range.start_offset
                || w.end_offset > range.end_offset
                || w.base_offset >= w.end_offset
            {
                return Err(rej(
                    RejectionKind::InvalidArgument,
                    format!(
                        "writer {} batch does not fit range [{}, {})",
                        w.writer_id, range.start_offset, range.end_offset
                    ),
                ));
            }
            let tail = tails.entry(w.writer_id).or_insert_with(|| {
                self.writers
                    .get(&(range.stream_id, w.writer_id))
                    .map_or((w.writer_epoch, None), |r| {
                        (r.writer_epoch, r.batches.last().map(|b| b.last_sequence))
                    })
            });
            if w.writer_epoch < tail.0 {
                return Err(rej(
                    RejectionKind::WriterFenced,
                    format!(
                        "writer {} epoch {} is older than {}",
                        w.writer_id, w.writer_epoch, tail.0
                    ),
                )
                .with_current(tail.0));
            }
            if w.writer_epoch == tail.0
                && let Some(last) = tail.1
                && Some(w.first_sequence) != last.checked_add(1)
            {
                return Err(rej(
                    RejectionKind::Conflict,
                    format!(
                        "writer {} sequence {} does not follow {last}",
                        w.writer_id, w.first_sequence
                    ),
                )
                .with_current(last));
            }
            *tail = (w.writer_epoch, Some(w.last_sequence));
        }
        Ok(())
    }

    fn record_writers(&mut self, range: &StreamRange, at_ms: u64) {
        for w in &range.writers {
            let key = (range.stream_id, w.writer_id);
            let mut record = self.writers.get(&key).cloned().unwrap_or(WriterRecord {
                stream_id: range.stream_id,
                writer_id: w.writer_id,
                writer_epoch: w.writer_epoch,
                ..Default::default()
            });
            if record.writer_epoch != w.writer_epoch {
                record.writer_epoch = w.writer_epoch;
                record.batches.clear();
            }
            record.batches.push(WriterBatch {
                first_sequence: w.first_sequence,
                last_sequence: w.last_sequence,
                base_offset: w.base_offset,
                end_offset: w.end_offset,
            });
            if record.batches.len() > WRITER_BATCHES {
                let excess = record.batches.len() - WRITER_BATCHES;
                record.batches.drain(..excess);
            }
            record.updated_at_ms = at_ms;
            self.writers.insert(key, record);
        }
    }

    fn commit_stream_set_object(&mut self, c: &CommitStreamSetObject, at_ms: u64) -> CommandResult {
        // A WAL commit holds one range per stream; a compaction may hold several ranges of
        // one stream (runs separated by data held elsewhere), ascending and disjoint.
        let compaction = !c.compacted_object_ids.is_empty();
        let mut last_end: BTreeMap<u64, u64> = BTreeMap::new();
        for r in &c.ranges {
            let repeated = match last_end.insert(r.stream_id, r.end_offset) {
                None => false,
                Some(end) => !compaction || r.start_offset < end,
            };
            if r.end_offset <= r.start_offset || repeated {
                return Err(rej(
                    RejectionKind::InvalidArgument,
                    format!(
                        "object {}: range [{}, {}) of stream {} is empty, repeated or overlapping",
                        c.object_id, r.start_offset, r.end_offset, r.stream_id
                    ),
                ));
            }
        }
        if self.prepared_object(c.object_id, c.node_id)?.is_none() {
            return redundant(Reply::Commit(CommitReply::default()));
        }
        let mut results = Vec::with_capacity(c.ranges.len());
        if c.compacted_object_ids.is_empty() {
            for range in &c.ranges {
                let verdict = self.stream(range.stream_id).and_then(|stream| {
                    Self::check_owner(stream, c.node_id, c.node_epoch, range.stream_epoch)?;
                    if stream.state != StreamState::Open as i32 {
                        return Err(rej(
                            RejectionKind::StreamFenced,
                            format!("stream {} is closed", range.stream_id),
                        ));
                    }
                    if range.start_offset != stream.end_offset {
                        return Err(rej(
                            RejectionKind::Conflict,
                            format!(
                                "stream {} range starts at {} but its committed end is {}",
                                range.stream_id, range.start_offset, stream.end_offset
                            ),
                        )
                        .with_current(stream.end_offset));
                    }
                    self.check_writers(range)
                });
                if verdict.is_ok() {
                    let mut stream = self.streams[&range.stream_id].clone();
                    stream.end_offset = range.end_offset;
                    self.streams.insert(range.stream_id, stream);
                    self.ranges.insert(
                        (range.stream_id, range.start_offset),
                        RangeRecord {
                            stream_id: range.stream_id,
                            start_offset: range.start_offset,
                            end_offset: range.end_offset,
                            object_id: c.object_id,
                        },
                    );
                    if let Some(object) = self.objects.get_mut(&c.object_id) {
                        object.live_ranges += 1;
                    }
                    self.record_writers(range, at_ms);
                }
                results.push(RangeResult {
                    stream_id: range.stream_id,
                    rejection: verdict.err(),
                });
            }
        } else {
            let sources: BTreeSet<u64> = c.compacted_object_ids.iter().copied().collect();
            for id in &sources {
                if let Some(source) = self.objects.get(id)
                    && source.state == ObjectState::Prepared as i32
                {
                    return Err(rej(
                        RejectionKind::InvalidArgument,
                        format!("compaction source {id} was never committed"),
                    ));
                }
            }
            let plans: Vec<Option<RangeMove>> = c
                .ranges
                .iter()
                .map(|r| self.plan_move(r.stream_id, r.start_offset, r.end_offset, &sources))
                .collect::<Result<_, _>>()?;
            for (range, plan) in c.ranges.iter().zip(&plans) {
                let rejection = match plan {
                    Some(m) => {
                        self.execute_move(m, c.object_id, at_ms);
                        None
                    }
                    None => Some(rej(
                        RejectionKind::NotFound,
                        format!(
                            "stream {} no longer holds [{}, {})",
                            range.stream_id, range.start_offset, range.end_offset
                        ),
                    )),
                };
                results.push(RangeResult {
                    stream_id: range.stream_id,
                    rejection,
                });
            }
        }
        self.finish_object(c.object_id, ObjectKind::StreamSet, c.object_size, at_ms);
        done(Reply::Commit(CommitReply { ranges: results }))
    }

    fn compact_stream_object(&mut self, c: &CompactStreamObject, at_ms: u64) -> CommandResult {
        if c.end_offset <= c.start_offset {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "stream object range [{}, {}) is empty",
                    c.start_offset, c.end_offset
                ),
            ));
        }
        if self.prepared_object(c.object_id, c.node_id)?.is_none() {
            return redundant(unit());
        }
        let sources: BTreeSet<u64> = c.source_object_ids.iter().copied().collect();
        let Some(plan) = self.plan_move(c.stream_id, c.start_offset, c.end_offset, &sources)?
        else {
            return Err(rej(
                RejectionKind::NotFound,
                format!(
                    "stream {} no longer holds [{}, {})",
                    c.stream_id, c.start_offset, c.end_offset
                ),
            ));
        };
        self.execute_move(&plan, c.object_id, at_ms);
        self.finish_object(c.object_id, ObjectKind::Stream, c.object_size, at_ms);
        done(unit())
    }

    fn expire_prepared_objects(&mut self, c: &ExpirePreparedObjects) -> CommandResult {
        let expired: Vec<u64> = self
            .objects
            .values()
            .filter(|o| o.state == ObjectState::Prepared as i32 && o.expires_at_ms <= c.now_ms)
            .map(|o| o.object_id)
            .collect();
        if expired.is_empty() {
            return redundant(Reply::Count(0));
        }
        for id in &expired {
            if let Some(object) = self.objects.get_mut(id) {
                object.state = ObjectState::Destroyed as i32;
                object.destroyed_at_ms = c.now_ms;
            }
        }
        done(Reply::Count(expired.len() as u64))
    }

    fn clean_destroyed_objects(&mut self, c: &CleanDestroyedObjects) -> CommandResult {
        for id in &c.object_ids {
            if let Some(object) = self.objects.get(id)
                && object.state != ObjectState::Destroyed as i32
            {
                return Err(rej(
                    RejectionKind::Conflict,
                    format!("object {id} is not destroyed"),
                ));
            }
        }
        let removed = remove_where(&mut self.objects, c.object_ids.iter().copied());
        if removed == 0 {
            return redundant(Reply::Count(0));
        }
        done(Reply::Count(removed as u64))
    }

    fn allocate_producer_ids(&mut self, c: &AllocateProducerIds) -> CommandResult {
        check_count(
            "producer id",
            u64::from(c.count),
            u64::from(MAX_PRODUCER_IDS),
        )?;
        let start = self.counters.next_producer_id;
        self.counters.next_producer_id += u64::from(c.count);
        done(Reply::Range(IdRange {
            start,
            end: self.counters.next_producer_id,
        }))
    }

    // ------------------------------------------------------------------ KV

    fn kv_reply(&self, key: &str) -> KvReply {
        match self.kv.get(key) {
            Some(r) => KvReply {
                previous: Some(r.value.clone()),
                version: r.version,
            },
            None => KvReply::default(),
        }
    }

    fn put_kv(&mut self, ctx: &ApplyContext, c: &PutKv) -> CommandResult {
        let previous = self.kv_reply(&c.key);
        if previous.previous.as_ref() == Some(&c.value) {
            return redundant(Reply::Kv(previous));
        }
        self.kv.insert(
            c.key.clone(),
            KvRecord {
                key: c.key.clone(),
                value: c.value.clone(),
                version: ctx.index,
            },
        );
        done(Reply::Kv(KvReply {
            previous: previous.previous,
            version: ctx.index,
        }))
    }

    fn put_kv_if_absent(&mut self, ctx: &ApplyContext, c: &PutKvIfAbsent) -> CommandResult {
        if let Some(existing) = self.kv.get(&c.key) {
            if existing.value == c.value {
                return redundant(Reply::Kv(self.kv_reply(&c.key)));
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!("key {:?} already holds another value", c.key),
            )
            .with_current(existing.version)
            .with_value(Some(existing.value.clone())));
        }
        self.kv.insert(
            c.key.clone(),
            KvRecord {
                key: c.key.clone(),
                value: c.value.clone(),
                version: ctx.index,
            },
        );
        done(Reply::Kv(KvReply {
            previous: None,
            version: ctx.index,
        }))
    }

    fn delete_kv(&mut self, c: &DeleteKv) -> CommandResult {
        match self.kv.remove(&c.key) {
            None => redundant(Reply::Kv(KvReply::default())),
            Some(r) => done(Reply::Kv(KvReply {
                previous: Some(r.value),
                version: 0,
            })),
        }
    }

    fn delete_kv_if_matches(&mut self, c: &DeleteKvIfMatches) -> CommandResult {
        match self.kv.get(&c.key) {
            None => redundant(Reply::Kv(KvReply::default())),
            Some(r) if r.value != c.expected => Err(rej(
                RejectionKind::Conflict,
                format!("key {:?} holds another value", c.key),
            )
            .with_current(r.version)
            .with_value(Some(r.value.clone()))),
            Some(_) => {
                let r = self.kv.remove(&c.key).expect("checked above");
                done(Reply::Kv(KvReply {
                    previous: Some(r.value),
                    version: 0,
                }))
            }
        }
    }

    // ------------------------------------------------------------------ catalog

    fn create_database(&mut self, c: &CreateDatabase, at_ms: u64) -> CommandResult {
        check_name("database", &c.name)?;
        if let Some(db) = self.databases.get(&c.name) {
            if db.properties == c.properties && db.comment == c.comment {
                return redundant(Reply::Id(db.database_id));
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!("database {:?} already exists", c.name),
            )
            .with_current(db.database_id));
        }
        let database_id = self.counters.next_database_id;
        self.counters.next_database_id += 1;
        self.databases.insert(
            c.name.clone(),
            DatabaseRecord {
                database_id,
                name: c.name.clone(),
                properties: c.properties.clone(),
                comment: c.comment.clone(),
                created_at_ms: at_ms,
            },
        );
        done(Reply::Id(database_id))
    }

    fn tables_of(&self, database: &str) -> Vec<(String, String)> {
        self.table_names
            .range((database.to_string(), String::new())..)
            .take_while(|((db, _), _)| db == database)
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn drop_database(&mut self, c: &DropDatabase, at_ms: u64) -> CommandResult {
        if !self.databases.contains_key(&c.name) {
            return redundant(unit());
        }
        let tables = self.tables_of(&c.name);
        if !tables.is_empty() && !c.cascade {
            return Err(rej(
                RejectionKind::NotEmpty,
                format!(
                    "database {:?} still has {} table(s); drop them or cascade",
                    c.name,
                    tables.len()
                ),
            ));
        }
        for (_, table) in tables {
            if let Some(id) = self.table_names.get(&(c.name.clone(), table)).copied() {
                self.remove_table(id, at_ms);
            }
        }
        self.databases.remove(&c.name);
        done(unit())
    }

    fn validate_table(c: &CreateTable) -> Result<(), Rejection> {
        check_name("table", &c.name)?;
        let invalid = |m: String| Err(rej(RejectionKind::InvalidArgument, m));
        check_count("bucket", u64::from(c.bucket_count), u64::from(MAX_BUCKETS))?;
        for (what, cols) in [
            ("primary key", &c.primary_key),
            ("bucket key", &c.bucket_key),
            ("partition key", &c.partition_keys),
        ] {
            let unique: BTreeSet<&String> = cols.iter().collect();
            if unique.len() != cols.len() || cols.iter().any(String::is_empty) {
                return invalid(format!("{what} columns {cols:?} are empty or repeated"));
            }
        }
        if !c.primary_key.is_empty() {
            if let Some(p) = c.partition_keys.iter().find(|p| !c.primary_key.contains(p)) {
                return invalid(format!(
                    "partition key {p:?} must be part of the primary key {:?}",
                    c.primary_key
                ));
            }
            if let Some(b) = c
                .bucket_key
                .iter()
                .find(|b| !c.primary_key.contains(b) || c.partition_keys.contains(b))
            {
                return invalid(format!(
                    "bucket key {b:?} must be part of the primary key without the partition keys"
                ));
            }
        }
        Ok(())
    }

    fn create_buckets(
        &mut self,
        table_id: u64,
        partition_id: u64,
        count: u32,
        at_ms: u64,
    ) -> (u64, u32) {
        let first = self.counters.next_stream_id;
        for bucket in 0..count {
            let key = (table_id, partition_id, bucket);
            let stream_id = self.new_stream(at_ms, Some(key));
            self.buckets.insert(
                key,
                BucketRecord {
                    table_id,
                    partition_id,
                    bucket,
                    stream_id,
                    ..Default::default()
                },
            );
        }
        (first, count)
    }

    fn create_table(&mut self, c: &CreateTable, at_ms: u64) -> CommandResult {
        if !self.databases.contains_key(&c.database) {
            return Err(rej(
                RejectionKind::NotFound,
                format!("database {:?} does not exist", c.database),
            ));
        }
        Self::validate_table(c)?;
        if let Some(existing) = self.table_by_name(&c.database, &c.name) {
            let same = existing.schema == c.schema
                && existing.schema_version == 1
                && existing.primary_key == c.primary_key
                && existing.bucket_key == c.bucket_key
                && existing.partition_keys == c.partition_keys
                && existing.bucket_count == c.bucket_count
                && existing.options == c.options
                && existing.comment == c.comment;
            if same {
                let first = self
                    .buckets
                    .get(&(existing.table_id, 0, 0))
                    .map_or(0, |b| b.stream_id);
                let count = if existing.is_partitioned() {
                    0
                } else {
                    existing.bucket_count
                };
                return redundant(Reply::Table(TableCreated {
                    table_id: existing.table_id,
                    partition_id: 0,
                    first_stream_id: first,
                    stream_count: count,
                }));
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!("table {}.{} already exists", c.database, c.name),
            )
            .with_current(existing.table_id));
        }
        let table_id = self.counters.next_table_id;
        self.counters.next_table_id += 1;
        self.tables.insert(
            table_id,
            TableRecord {
                table_id,
                database: c.database.clone(),
                name: c.name.clone(),
                schema: c.schema.clone(),
                schema_version: 1,
                primary_key: c.primary_key.clone(),
                bucket_key: c.bucket_key.clone(),
                partition_keys: c.partition_keys.clone(),
                bucket_count: c.bucket_count,
                options: c.options.clone(),
                comment: c.comment.clone(),
                created_at_ms: at_ms,
            },
        );
        self.table_names
            .insert((c.database.clone(), c.name.clone()), table_id);
        let (first_stream_id, stream_count) = if c.partition_keys.is_empty() {
            self.create_buckets(table_id, 0, c.bucket_count, at_ms)
        } else {
            (0, 0)
        };
        done(Reply::Table(TableCreated {
            table_id,
            partition_id: 0,
            first_stream_id,
            stream_count,
        }))
    }

    /// Removes the buckets (and their streams and KV snapshots) of one partition (0: none).
    fn remove_buckets(&mut self, table_id: u64, partition_id: u64, at_ms: u64) {
        let buckets: Vec<BucketRecord> = self
            .buckets
            .range((table_id, partition_id, 0)..=(table_id, partition_id, u32::MAX))
            .map(|(_, b)| b.clone())
            .collect();
        for b in buckets {
            self.remove_stream(b.stream_id, at_ms);
            self.buckets.remove(&(table_id, partition_id, b.bucket));
        }
        let snapshots: Vec<_> = self
            .kv_snapshots
            .range((table_id, partition_id, 0, 0)..=(table_id, partition_id, u32::MAX, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        remove_where(&mut self.kv_snapshots, snapshots);
    }

    fn remove_table(&mut self, table_id: u64, at_ms: u64) {
        let Some(table) = self.tables.remove(&table_id) else {
            return;
        };
        self.table_names.remove(&(table.database, table.name));
        let partitions: Vec<PartitionRecord> = self
            .partitions
            .range((table_id, 0)..=(table_id, u64::MAX))
            .map(|(_, p)| p.clone())
            .collect();
        for p in partitions {
            self.remove_buckets(table_id, p.partition_id, at_ms);
            self.partitions.remove(&(table_id, p.partition_id));
            self.partition_names.remove(&(table_id, p.name));
        }
        self.remove_buckets(table_id, 0, at_ms);
        self.lake_snapshots.remove(&table_id);
        let offsets: Vec<_> = self
            .group_offsets
            .keys()
            .filter(|k| k.1 == table_id)
            .cloned()
            .collect();
        remove_where(&mut self.group_offsets, offsets);
    }

    fn drop_table(&mut self, c: &DropTable, at_ms: u64) -> CommandResult {
        let Some(id) = self
            .table_names
            .get(&(c.database.clone(), c.name.clone()))
            .copied()
        else {
            return redundant(unit());
        };
        self.remove_table(id, at_ms);
        done(Reply::Id(id))
    }

    fn alter_table(&mut self, c: &AlterTable) -> CommandResult {
        let table = self.table(c.table_id)?;
        if let Some(key) = c
            .set_options
            .keys()
            .chain(&c.reset_options)
            .find(|k| IMMUTABLE_OPTIONS.contains(&k.as_str()))
        {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!("option {key:?} cannot be changed after the table is created"),
            ));
        }
        let mut updated = table.clone();
        if !c.new_schema.is_empty() {
            if c.expected_schema_version != table.schema_version {
                return Err(rej(
                    RejectionKind::Conflict,
                    format!(
                        "table {} is at schema version {}, not {}",
                        c.table_id, table.schema_version, c.expected_schema_version
                    ),
                )
                .with_current(u64::from(table.schema_version)));
            }
            if c.new_schema != table.schema {
                updated.schema = c.new_schema.clone();
                updated.schema_version += 1;
            }
        }
        for (k, v) in &c.set_options {
            updated.options.insert(k.clone(), v.clone());
        }
        for k in &c.reset_options {
            updated.options.remove(k);
        }
        if &updated == table {
            return redundant(Reply::Id(c.table_id));
        }
        self.tables.insert(c.table_id, updated);
        done(Reply::Id(c.table_id))
    }

    fn create_partition(&mut self, c: &CreatePartition, at_ms: u64) -> CommandResult {
        let table = self.table(c.table_id)?;
        check_name("partition", &c.name)?;
        if !table.is_partitioned() {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!("table {} is not partitioned", c.table_id),
            ));
        }
        let keys: BTreeSet<&String> = c.values.keys().collect();
        let expected: BTreeSet<&String> = table.partition_keys.iter().collect();
        if keys != expected {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "partition values must name exactly the partition keys {:?}",
                    table.partition_keys
                ),
            ));
        }
        let bucket_count = table.bucket_count;
        if let Some(&id) = self.partition_names.get(&(c.table_id, c.name.clone())) {
            let existing = &self.partitions[&(c.table_id, id)];
            if existing.values != c.values {
                return Err(rej(
                    RejectionKind::AlreadyExists,
                    format!("partition {:?} exists with other values", c.name),
                ));
            }
            let first = self
                .buckets
                .get(&(c.table_id, id, 0))
                .map_or(0, |b| b.stream_id);
            return redundant(Reply::Table(TableCreated {
                table_id: c.table_id,
                partition_id: id,
                first_stream_id: first,
                stream_count: bucket_count,
            }));
        }
        let partition_id = self.counters.next_partition_id;
        self.counters.next_partition_id += 1;
        self.partitions.insert(
            (c.table_id, partition_id),
            PartitionRecord {
                table_id: c.table_id,
                partition_id,
                name: c.name.clone(),
                values: c.values.clone(),
                created_at_ms: at_ms,
            },
        );
        self.partition_names
            .insert((c.table_id, c.name.clone()), partition_id);
        let (first_stream_id, stream_count) =
            self.create_buckets(c.table_id, partition_id, bucket_count, at_ms);
        done(Reply::Table(TableCreated {
            table_id: c.table_id,
            partition_id,
            first_stream_id,
            stream_count,
        }))
    }

    fn drop_partition(&mut self, c: &DropPartition, at_ms: u64) -> CommandResult {
        self.table(c.table_id)?;
        let Some(id) = self.partition_names.remove(&(c.table_id, c.name.clone())) else {
            return redundant(unit());
        };
        self.partitions.remove(&(c.table_id, id));
        self.remove_buckets(c.table_id, id, at_ms);
        done(Reply::Id(id))
    }

    fn lead_bucket(&mut self, c: &LeadBucket) -> CommandResult {
        let key = (c.table_id, c.partition_id, c.bucket);
        let bucket = self.bucket(key)?;
        let Some(node) = self.nodes.get(&c.leader_node_id) else {
            return Err(rej(
                RejectionKind::NotFound,
                format!("node {} is not registered", c.leader_node_id),
            ));
        };
        if bucket.leader_node_id == node.node_id && bucket.leader_node_epoch == node.node_epoch {
            return redundant(Reply::Epoch(bucket.leader_epoch));
        }
        let mut bucket = bucket.clone();
        bucket.leader_node_id = node.node_id;
        bucket.leader_node_epoch = node.node_epoch;
        bucket.leader_epoch += 1;
        let epoch = bucket.leader_epoch;
        self.buckets.insert(key, bucket);
        done(Reply::Epoch(epoch))
    }

    fn commit_kv_snapshot(&mut self, c: &CommitKvSnapshot, at_ms: u64) -> CommandResult {
        let key = (c.table_id, c.partition_id, c.bucket);
        if !self.table(c.table_id)?.is_primary_key_table() {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!("table {} has no primary key", c.table_id),
            ));
        }
        let bucket = self.bucket(key)?;
        if bucket.leader_node_id != c.node_id
            || bucket.leader_node_epoch != c.node_epoch
            || bucket.leader_epoch != c.leader_epoch
        {
            return Err(rej(
                RejectionKind::LeaderFenced,
                format!(
                    "bucket {} of table {} is led by node {} at leader epoch {}",
                    c.bucket, c.table_id, bucket.leader_node_id, bucket.leader_epoch
                ),
            )
            .with_current(bucket.leader_epoch));
        }
        let end = self
            .streams
            .get(&bucket.stream_id)
            .map_or(0, |s| s.end_offset);
        if c.log_offset > end {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "snapshot offset {} is beyond the committed end {end}",
                    c.log_offset
                ),
            )
            .with_current(end));
        }
        if let Some(existing) =
            self.kv_snapshots
                .get(&(c.table_id, c.partition_id, c.bucket, c.snapshot_id))
        {
            if existing.log_offset == c.log_offset && existing.location == c.location {
                return redundant(Reply::Id(c.snapshot_id));
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!("snapshot {} exists with other contents", c.snapshot_id),
            ));
        }
        if let Some(latest) = self.latest_kv_snapshot(key)
            && (c.snapshot_id < latest.snapshot_id || c.log_offset < latest.log_offset)
        {
            return Err(rej(
                RejectionKind::Conflict,
                format!(
                    "snapshot {} at offset {} is older than snapshot {} at offset {}",
                    c.snapshot_id, c.log_offset, latest.snapshot_id, latest.log_offset
                ),
            )
            .with_current(latest.log_offset));
        }
        self.kv_snapshots.insert(
            (c.table_id, c.partition_id, c.bucket, c.snapshot_id),
            KvSnapshotRecord {
                table_id: c.table_id,
                partition_id: c.partition_id,
                bucket: c.bucket,
                snapshot_id: c.snapshot_id,
                log_offset: c.log_offset,
                location: c.location.clone(),
                size_bytes: c.size_bytes,
                leader_epoch: c.leader_epoch,
                created_at_ms: at_ms,
            },
        );
        done(Reply::Id(c.snapshot_id))
    }

    fn drop_kv_snapshot(&mut self, c: &DropKvSnapshot) -> CommandResult {
        let key = (c.table_id, c.partition_id, c.bucket, c.snapshot_id);
        if !self.kv_snapshots.contains_key(&key) {
            return redundant(unit());
        }
        let latest = self
            .latest_kv_snapshot((c.table_id, c.partition_id, c.bucket))
            .map(|s| s.snapshot_id);
        if latest == Some(c.snapshot_id) {
            return Err(rej(
                RejectionKind::Conflict,
                format!(
                    "snapshot {} is the latest of its bucket and is kept",
                    c.snapshot_id
                ),
            ));
        }
        self.kv_snapshots.remove(&key);
        done(unit())
    }

    fn commit_lake_snapshot(&mut self, c: &CommitLakeSnapshot, at_ms: u64) -> CommandResult {
        self.table(c.table_id)?;
        let previous = self.lake_snapshots.get(&c.table_id);
        if previous.is_some_and(|p| p.snapshot_id == c.snapshot_id) {
            return redundant(Reply::Id(c.table_id));
        }
        let mut offsets: BTreeMap<(u64, u32), u64> = previous
            .map(|p| {
                p.bucket_offsets
                    .iter()
                    .map(|b| ((b.partition_id, b.bucket), b.offset))
                    .collect()
            })
            .unwrap_or_default();
        for b in &c.bucket_offsets {
            let bucket = self.bucket((c.table_id, b.partition_id, b.bucket))?;
            let end = self
                .streams
                .get(&bucket.stream_id)
                .map_or(0, |s| s.end_offset);
            if b.offset > end {
                return Err(rej(
                    RejectionKind::InvalidArgument,
                    format!(
                        "tiered offset {} of bucket {} is beyond its committed end {end}",
                        b.offset, b.bucket
                    ),
                )
                .with_current(end));
            }
            let before = offsets.get(&(b.partition_id, b.bucket)).copied();
            if before.is_some_and(|o| b.offset < o) {
                return Err(rej(
                    RejectionKind::Conflict,
                    format!(
                        "tiered offset of bucket {} would move back from {} to {}",
                        b.bucket,
                        before.unwrap_or(0),
                        b.offset
                    ),
                )
                .with_current(before.unwrap_or(0)));
            }
            offsets.insert((b.partition_id, b.bucket), b.offset);
        }
        self.lake_snapshots.insert(
            c.table_id,
            LakeSnapshotRecord {
                table_id: c.table_id,
                snapshot_id: c.snapshot_id,
                metadata_location: c.metadata_location.clone(),
                bucket_offsets: offsets
                    .into_iter()
                    .map(|((partition_id, bucket), offset)| BucketOffset {
                        partition_id,
                        bucket,
                        offset,
                    })
                    .collect(),
                committed_at_ms: at_ms,
            },
        );
        done(Reply::Id(c.table_id))
    }

    fn allocate(&mut self, c: &Allocate) -> CommandResult {
        check_sequence(&c.sequence)?;
        check_count("allocation", c.count, u64::from(u32::MAX))?;
        let start = self.sequences.get(&c.sequence).map_or(1, |s| s.next);
        let end = start.checked_add(c.count).ok_or_else(|| {
            rej(
                RejectionKind::InvalidArgument,
                format!("sequence {:?} is exhausted", c.sequence),
            )
        })?;
        self.sequences.insert(
            c.sequence.clone(),
            SequenceRecord {
                name: c.sequence.clone(),
                next: end,
            },
        );
        done(Reply::Range(IdRange { start, end }))
    }

    fn register_coordinator(&mut self, c: &RegisterCoordinator) -> CommandResult {
        if let Some(current) = &self.coordinator {
            if c.lease_term == current.epoch
                && c.node_id == current.node_id
                && c.node_epoch == current.node_epoch
            {
                return redundant(Reply::Epoch(current.epoch));
            }
            if c.lease_term <= current.epoch {
                return Err(rej(
                    RejectionKind::CoordinatorFenced,
                    format!(
                        "lease term {} is not above the current coordinator epoch {}",
                        c.lease_term, current.epoch
                    ),
                )
                .with_current(current.epoch));
            }
        }
        self.coordinator = Some(CoordinatorRecord {
            node_id: c.node_id,
            node_epoch: c.node_epoch,
            epoch: c.lease_term,
        });
        done(Reply::Epoch(c.lease_term))
    }

    fn upgrade_metadata_version(
        &mut self,
        ctx: &ApplyContext,
        c: &UpgradeMetadataVersion,
        fatal: &mut Option<Fatal>,
    ) -> CommandResult {
        if c.version <= self.metadata_version {
            return redundant(Reply::Epoch(u64::from(self.metadata_version)));
        }
        if c.version > ctx.supported_version {
            // This binary cannot follow: stop rather than diverge from the nodes that can.
            // (Whether every live node supports the version is the coordinator's check.)
            *fatal = Some(Fatal::UnsupportedVersion {
                version: c.version,
                supported: ctx.supported_version,
            });
            return redundant(Reply::Epoch(u64::from(self.metadata_version)));
        }
        self.metadata_version = c.version;
        done(Reply::Epoch(u64::from(c.version)))
    }

    // ------------------------------------------------------------------ offsets

    fn check_tables<'a>(
        &self,
        table_ids: impl IntoIterator<Item = &'a u64>,
    ) -> Result<(), Rejection> {
        for id in table_ids {
            self.table(*id)?;
        }
        Ok(())
    }

    fn register_producer_offsets(
        &mut self,
        c: &RegisterProducerOffsets,
        at_ms: u64,
    ) -> CommandResult {
        check_name("producer", &c.producer_id)?;
        self.check_tables(c.offsets.iter().map(|o| &o.table_id))?;
        if let Some(existing) = self.producer_offsets.get(&c.producer_id) {
            if existing.offsets == c.offsets && existing.ttl_ms == c.ttl_ms {
                return redundant(unit());
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!(
                    "producer {:?} already registered other offsets",
                    c.producer_id
                ),
            ));
        }
        self.producer_offsets.insert(
            c.producer_id.clone(),
            ProducerOffsetsRecord {
                producer_id: c.producer_id.clone(),
                offsets: c.offsets.clone(),
                ttl_ms: c.ttl_ms,
                registered_at_ms: at_ms,
            },
        );
        done(unit())
    }

    fn delete_producer_offsets(&mut self, c: &DeleteProducerOffsets) -> CommandResult {
        match self.producer_offsets.remove(&c.producer_id) {
            Some(_) => done(unit()),
            None => redundant(unit()),
        }
    }

    fn expire_producer_offsets(&mut self, c: &ExpireProducerOffsets) -> CommandResult {
        let expired: Vec<String> = self
            .producer_offsets
            .values()
            .filter(|p| p.registered_at_ms.saturating_add(p.ttl_ms) <= c.now_ms)
            .map(|p| p.producer_id.clone())
            .collect();
        let n = remove_where(&mut self.producer_offsets, expired) as u64;
        if n == 0 {
            redundant(Reply::Count(0))
        } else {
            done(Reply::Count(n))
        }
    }

    fn commit_group_offsets(&mut self, c: &CommitGroupOffsets, at_ms: u64) -> CommandResult {
        check_name("group", &c.group_id)?;
        self.check_tables(c.offsets.iter().map(|o| &o.table_id))?;
        for o in &c.offsets {
            self.group_offsets.insert(
                (c.group_id.clone(), o.table_id, o.partition_id, o.bucket),
                GroupOffsetRecord {
                    group_id: c.group_id.clone(),
                    table_id: o.table_id,
                    partition_id: o.partition_id,
                    bucket: o.bucket,
                    offset: o.offset,
                    leader_epoch: o.leader_epoch,
                    metadata: o.metadata.clone(),
                    committed_at_ms: at_ms,
                },
            );
        }
        done(Reply::Count(c.offsets.len() as u64))
    }

    fn group_keys(&self, group_id: &str) -> Vec<(String, u64, u64, u32)> {
        self.group_offsets
            .range(
                (group_id.to_string(), 0, 0, 0)
                    ..=(group_id.to_string(), u64::MAX, u64::MAX, u32::MAX),
            )
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn delete_group_offsets(&mut self, c: &DeleteGroupOffsets) -> CommandResult {
        let keys: Vec<_> = if c.buckets.is_empty() {
            self.group_keys(&c.group_id)
        } else {
            c.buckets
                .iter()
                .map(|b| (c.group_id.clone(), b.table_id, b.partition_id, b.bucket))
                .collect()
        };
        let n = remove_where(&mut self.group_offsets, keys) as u64;
        if n == 0 {
            redundant(Reply::Count(0))
        } else {
            done(Reply::Count(n))
        }
    }

    fn expire_group_offsets(&mut self, c: &ExpireGroupOffsets) -> CommandResult {
        let mut last_commit: BTreeMap<&String, u64> = BTreeMap::new();
        for r in self.group_offsets.values() {
            let last = last_commit.entry(&r.group_id).or_default();
            *last = (*last).max(r.committed_at_ms);
        }
        let expired: Vec<String> = last_commit
            .into_iter()
            .filter(|(_, last)| last.saturating_add(c.retention_ms) <= c.now_ms)
            .map(|(g, _)| g.clone())
            .collect();
        let mut n = 0u64;
        for group in expired {
            let keys = self.group_keys(&group);
            n += remove_where(&mut self.group_offsets, keys) as u64;
        }
        if n == 0 {
            redundant(Reply::Count(0))
        } else {
            done(Reply::Count(n))
        }
    }
}
