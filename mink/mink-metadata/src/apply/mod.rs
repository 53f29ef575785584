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

mod catalog;
mod kv;
mod objects;
mod offsets;
mod streams;

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
            Command::ResignCoordinator(c) => self.resign_coordinator(c),
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
        if coordinator.epoch == epoch && coordinator.resigned {
            return Err(rej(
                RejectionKind::CoordinatorFenced,
                format!(
                    "coordinator epoch {epoch} resigned (node {} gave the role up)",
                    coordinator.node_id
                ),
            )
            .with_current(coordinator.epoch));
        }
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
}
