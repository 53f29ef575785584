//! Every change to cluster state is one of these commands.
//!
//! The wire form is protobuf (prost, hand-written messages: no code generator). Compatibility
//! rules, enforced by the fixture test in `tests/fixtures.rs`:
//! - a field or a command variant is never renumbered and its tag is never reused;
//! - new fields are added with new tags and must have a meaning when absent (their default);
//! - a new command, or a changed apply rule, gets a `since` version above the current
//!   [`METADATA_VERSION`](crate::METADATA_VERSION) and is only proposed once the cluster's
//!   `metadata_version` has been raised to it (see [`Command::since`]).
//!
//! Commands that carry `node_id` and `node_epoch` are checked against the node's registered
//! epoch; commands that carry `coordinator_epoch` must come from the current lease holder.

use std::collections::BTreeMap;

/// The state machine's input. One variant per command of the specification's table.
#[derive(Clone, PartialEq, Eq, ::prost::Oneof)]
pub enum Command {
    // ---- s3stream ----
    #[prost(message, tag = "1")]
    RegisterNode(RegisterNode),
    #[prost(message, tag = "2")]
    CreateStreams(CreateStreams),
    #[prost(message, tag = "3")]
    OpenStream(OpenStream),
    #[prost(message, tag = "4")]
    CloseStream(CloseStream),
    #[prost(message, tag = "5")]
    TrimStream(TrimStream),
    #[prost(message, tag = "6")]
    DeleteStream(DeleteStream),
    #[prost(message, tag = "7")]
    PlaceStream(PlaceStream),
    #[prost(message, tag = "8")]
    TransferStream(TransferStream),
    #[prost(message, tag = "9")]
    CompleteTransfer(CompleteTransfer),
    #[prost(message, tag = "10")]
    PrepareObject(PrepareObject),
    #[prost(message, tag = "11")]
    CommitStreamSetObject(CommitStreamSetObject),
    #[prost(message, tag = "12")]
    CompactStreamObject(CompactStreamObject),
    #[prost(message, tag = "13")]
    ExpirePreparedObjects(ExpirePreparedObjects),
    #[prost(message, tag = "14")]
    CleanDestroyedObjects(CleanDestroyedObjects),
    #[prost(message, tag = "15")]
    AllocateProducerIds(AllocateProducerIds),
    // ---- KV ----
    #[prost(message, tag = "20")]
    PutKv(PutKv),
    #[prost(message, tag = "21")]
    PutKvIfAbsent(PutKvIfAbsent),
    #[prost(message, tag = "22")]
    DeleteKv(DeleteKv),
    #[prost(message, tag = "23")]
    DeleteKvIfMatches(DeleteKvIfMatches),
    // ---- Catalog ----
    #[prost(message, tag = "30")]
    CreateDatabase(CreateDatabase),
    #[prost(message, tag = "31")]
    DropDatabase(DropDatabase),
    #[prost(message, tag = "32")]
    CreateTable(CreateTable),
    #[prost(message, tag = "33")]
    DropTable(DropTable),
    #[prost(message, tag = "34")]
    AlterTable(AlterTable),
    #[prost(message, tag = "35")]
    CreatePartition(CreatePartition),
    #[prost(message, tag = "36")]
    DropPartition(DropPartition),
    #[prost(message, tag = "37")]
    LeadBucket(LeadBucket),
    #[prost(message, tag = "38")]
    CommitKvSnapshot(CommitKvSnapshot),
    #[prost(message, tag = "39")]
    DropKvSnapshot(DropKvSnapshot),
    #[prost(message, tag = "40")]
    CommitLakeSnapshot(CommitLakeSnapshot),
    #[prost(message, tag = "41")]
    Allocate(Allocate),
    #[prost(message, tag = "42")]
    RegisterCoordinator(RegisterCoordinator),
    #[prost(message, tag = "43")]
    UpgradeMetadataVersion(UpgradeMetadataVersion),
    #[prost(message, tag = "44")]
    ResignCoordinator(ResignCoordinator),
    // ---- Offsets ----
    #[prost(message, tag = "50")]
    RegisterProducerOffsets(RegisterProducerOffsets),
    #[prost(message, tag = "51")]
    DeleteProducerOffsets(DeleteProducerOffsets),
    #[prost(message, tag = "52")]
    ExpireProducerOffsets(ExpireProducerOffsets),
    #[prost(message, tag = "53")]
    CommitGroupOffsets(CommitGroupOffsets),
    #[prost(message, tag = "54")]
    DeleteGroupOffsets(DeleteGroupOffsets),
    #[prost(message, tag = "55")]
    ExpireGroupOffsets(ExpireGroupOffsets),
}

/// Identity of a node process as the state machine knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeRef {
    pub node_id: u64,
    pub node_epoch: u64,
}

impl Command {
    /// The lowest cluster `metadata_version` at which this command may be proposed. A binary
    /// decodes only commands whose `since` is at most the version it supports; the sink refuses
    /// to propose a command whose `since` is above the cluster's current version, so a node
    /// running an older binary is never fed a row it cannot read.
    pub fn since(&self) -> u32 {
        match self {
            // Producer offsets (exactly-once sinks) arrived after the base command set.
            Command::RegisterProducerOffsets(_)
            | Command::DeleteProducerOffsets(_)
            | Command::ExpireProducerOffsets(_) => 2,
            Command::ResignCoordinator(_) => crate::RESIGN_VERSION,
            _ => 1,
        }
    }

    /// A stable, human-readable name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Command::RegisterNode(_) => "RegisterNode",
            Command::CreateStreams(_) => "CreateStreams",
            Command::OpenStream(_) => "OpenStream",
            Command::CloseStream(_) => "CloseStream",
            Command::TrimStream(_) => "TrimStream",
            Command::DeleteStream(_) => "DeleteStream",
            Command::PlaceStream(_) => "PlaceStream",
            Command::TransferStream(_) => "TransferStream",
            Command::CompleteTransfer(_) => "CompleteTransfer",
            Command::PrepareObject(_) => "PrepareObject",
            Command::CommitStreamSetObject(_) => "CommitStreamSetObject",
            Command::CompactStreamObject(_) => "CompactStreamObject",
            Command::ExpirePreparedObjects(_) => "ExpirePreparedObjects",
            Command::CleanDestroyedObjects(_) => "CleanDestroyedObjects",
            Command::AllocateProducerIds(_) => "AllocateProducerIds",
            Command::PutKv(_) => "PutKv",
            Command::PutKvIfAbsent(_) => "PutKvIfAbsent",
            Command::DeleteKv(_) => "DeleteKv",
            Command::DeleteKvIfMatches(_) => "DeleteKvIfMatches",
            Command::CreateDatabase(_) => "CreateDatabase",
            Command::DropDatabase(_) => "DropDatabase",
            Command::CreateTable(_) => "CreateTable",
            Command::DropTable(_) => "DropTable",
            Command::AlterTable(_) => "AlterTable",
            Command::CreatePartition(_) => "CreatePartition",
            Command::DropPartition(_) => "DropPartition",
            Command::LeadBucket(_) => "LeadBucket",
            Command::CommitKvSnapshot(_) => "CommitKvSnapshot",
            Command::DropKvSnapshot(_) => "DropKvSnapshot",
            Command::CommitLakeSnapshot(_) => "CommitLakeSnapshot",
            Command::Allocate(_) => "Allocate",
            Command::RegisterCoordinator(_) => "RegisterCoordinator",
            Command::UpgradeMetadataVersion(_) => "UpgradeMetadataVersion",
            Command::ResignCoordinator(_) => "ResignCoordinator",
            Command::RegisterProducerOffsets(_) => "RegisterProducerOffsets",
            Command::DeleteProducerOffsets(_) => "DeleteProducerOffsets",
            Command::ExpireProducerOffsets(_) => "ExpireProducerOffsets",
            Command::CommitGroupOffsets(_) => "CommitGroupOffsets",
            Command::DeleteGroupOffsets(_) => "DeleteGroupOffsets",
            Command::ExpireGroupOffsets(_) => "ExpireGroupOffsets",
        }
    }

    /// The node identity this command claims, when it carries one.
    pub fn node(&self) -> Option<NodeRef> {
        let (node_id, node_epoch) = match self {
            Command::RegisterNode(c) => (c.node_id, c.node_epoch),
            Command::OpenStream(c) => (c.node_id, c.node_epoch),
            Command::CloseStream(c) => (c.node_id, c.node_epoch),
            Command::TrimStream(c) => (c.node_id, c.node_epoch),
            Command::DeleteStream(c) => (c.node_id, c.node_epoch),
            Command::CompleteTransfer(c) => (c.node_id, c.node_epoch),
            Command::PrepareObject(c) => (c.node_id, c.node_epoch),
            Command::CommitStreamSetObject(c) => (c.node_id, c.node_epoch),
            Command::CompactStreamObject(c) => (c.node_id, c.node_epoch),
            Command::CommitKvSnapshot(c) => (c.node_id, c.node_epoch),
            Command::RegisterCoordinator(c) => (c.node_id, c.node_epoch),
            Command::ResignCoordinator(c) => (c.node_id, c.node_epoch),
            _ => return None,
        };
        Some(NodeRef {
            node_id,
            node_epoch,
        })
    }

    /// The coordinator epoch this command claims, for commands only the lease holder issues.
    pub fn coordinator_epoch(&self) -> Option<u64> {
        Some(match self {
            Command::PlaceStream(c) => c.coordinator_epoch,
            Command::TransferStream(c) => c.coordinator_epoch,
            Command::ExpirePreparedObjects(c) => c.coordinator_epoch,
            Command::CleanDestroyedObjects(c) => c.coordinator_epoch,
            Command::LeadBucket(c) => c.coordinator_epoch,
            Command::DropKvSnapshot(c) => c.coordinator_epoch,
            Command::CommitLakeSnapshot(c) => c.coordinator_epoch,
            Command::UpgradeMetadataVersion(c) => c.coordinator_epoch,
            Command::ExpireProducerOffsets(c) => c.coordinator_epoch,
            Command::ExpireGroupOffsets(c) => c.coordinator_epoch,
            _ => return None,
        })
    }
}

// ================================ s3stream ================================

/// A node process announces itself. `node_epoch` is chosen by the proposer (one above the
/// epoch it last saw) and must rise; `incarnation` is random per process start, so two
/// processes that pick the same epoch are told apart and a resend is recognised.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct RegisterNode {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub incarnation: u64,
    /// Where clients and peers reach this node (host:port of its Flight listener).
    #[prost(string, tag = "4")]
    pub address: String,
    /// Highest `metadata_version` this node's binary supports.
    #[prost(uint32, tag = "5")]
    pub supported_metadata_version: u32,
    /// Where clients reach each of this node's listeners, by protocol (`flight`, `kafka`,
    /// `flight-sql`). Recorded from metadata_version 3; an older cluster ignores it.
    #[prost(btree_map = "string, string", tag = "6")]
    pub listeners: BTreeMap<String, String>,
}

/// Allocates `count` new stream ids (unbound to any table). Reply: [`Reply::Range`](crate::Reply).
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CreateStreams {
    #[prost(uint32, tag = "1")]
    pub count: u32,
}

/// Opens a stream for writing at `stream_epoch` on this node. A higher epoch takes the stream
/// over and fences every earlier writer. Streams that belong to a bucket may only be opened by
/// the bucket's leader at its leader epoch.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct OpenStream {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub stream_id: u64,
    #[prost(uint64, tag = "4")]
    pub stream_epoch: u64,
}

/// Closes a stream its owner has open. Committed data stays readable.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CloseStream {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub stream_id: u64,
    #[prost(uint64, tag = "4")]
    pub stream_epoch: u64,
}

/// Moves a stream's start offset forward. Never past the committed end, and never past the
/// floors the stream's table sets (latest KV snapshot offset, tiered lake offset).
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct TrimStream {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub stream_id: u64,
    #[prost(uint64, tag = "4")]
    pub stream_epoch: u64,
    #[prost(uint64, tag = "5")]
    pub new_start_offset: u64,
}

/// Deletes a stream that belongs to no table. Objects only it referenced become destroyed.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DeleteStream {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub stream_id: u64,
    #[prost(uint64, tag = "4")]
    pub stream_epoch: u64,
}

/// Coordinator: records on which node a stream should be served.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct PlaceStream {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub stream_id: u64,
    #[prost(uint64, tag = "3")]
    pub node_id: u64,
}

/// Coordinator: starts moving a stream from its placed node to another.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct TransferStream {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub stream_id: u64,
    #[prost(uint64, tag = "3")]
    pub from_node_id: u64,
    #[prost(uint64, tag = "4")]
    pub to_node_id: u64,
}

/// The transfer target confirms it has the stream open at `stream_epoch`.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CompleteTransfer {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub stream_id: u64,
    #[prost(uint64, tag = "4")]
    pub stream_epoch: u64,
}

/// Pre-allocates `count` object ids for this node, valid until `expires_at_ms`.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct PrepareObject {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint32, tag = "3")]
    pub count: u32,
    #[prost(uint64, tag = "4")]
    pub expires_at_ms: u64,
}

/// Idempotent-writer bookkeeping for one range: which writer sequences produced which offsets.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct WriterRange {
    #[prost(uint64, tag = "1")]
    pub writer_id: u64,
    #[prost(uint64, tag = "2")]
    pub writer_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub first_sequence: u64,
    #[prost(uint64, tag = "4")]
    pub last_sequence: u64,
    #[prost(uint64, tag = "5")]
    pub base_offset: u64,
    #[prost(uint64, tag = "6")]
    pub end_offset: u64,
}

/// A contiguous piece `[start_offset, end_offset)` of one stream inside an object.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct StreamRange {
    #[prost(uint64, tag = "1")]
    pub stream_id: u64,
    #[prost(uint64, tag = "2")]
    pub stream_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub start_offset: u64,
    #[prost(uint64, tag = "4")]
    pub end_offset: u64,
    #[prost(message, repeated, tag = "5")]
    pub writers: Vec<WriterRange>,
}

/// Commits a stream-set object. Without `compacted_object_ids` it is a WAL flush: each range
/// must continue its stream at the committed end under the stream's current epoch, and each
/// range gets its own result (a fenced stream's range is dropped, the rest commit). With
/// `compacted_object_ids` it is a compaction: the ranges replace the same data held by those
/// source objects, which become destroyed once nothing references them.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CommitStreamSetObject {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub object_id: u64,
    #[prost(uint64, tag = "4")]
    pub object_size: u64,
    #[prost(message, repeated, tag = "5")]
    pub ranges: Vec<StreamRange>,
    #[prost(uint64, repeated, tag = "6")]
    pub compacted_object_ids: Vec<u64>,
}

/// Commits a stream object holding `[start_offset, end_offset)` of one stream, replacing that
/// data in `source_object_ids` (stream-set or stream objects).
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CompactStreamObject {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub object_id: u64,
    #[prost(uint64, tag = "4")]
    pub stream_id: u64,
    #[prost(uint64, tag = "5")]
    pub start_offset: u64,
    #[prost(uint64, tag = "6")]
    pub end_offset: u64,
    #[prost(uint64, tag = "7")]
    pub object_size: u64,
    #[prost(uint64, repeated, tag = "8")]
    pub source_object_ids: Vec<u64>,
}

/// Coordinator: prepared ids whose expiry is at or before `now_ms` can no longer be committed;
/// they become destroyed so that a PUT that landed late is deleted.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct ExpirePreparedObjects {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub now_ms: u64,
}

/// Coordinator: forgets destroyed objects after it deleted them from object storage.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CleanDestroyedObjects {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, repeated, tag = "2")]
    pub object_ids: Vec<u64>,
}

/// Allocates `count` writer (producer) ids.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct AllocateProducerIds {
    #[prost(uint32, tag = "1")]
    pub count: u32,
}

// ================================ KV ================================

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct PutKv {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct PutKvIfAbsent {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DeleteKv {
    #[prost(string, tag = "1")]
    pub key: String,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DeleteKvIfMatches {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub expected: Vec<u8>,
}

// ================================ Catalog ================================

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CreateDatabase {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(btree_map = "string, string", tag = "2")]
    pub properties: BTreeMap<String, String>,
    #[prost(string, tag = "3")]
    pub comment: String,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DropDatabase {
    #[prost(string, tag = "1")]
    pub name: String,
    /// Drop the database's tables too; otherwise a non-empty database is refused.
    #[prost(bool, tag = "2")]
    pub cascade: bool,
}

/// Creates a table. An unpartitioned table gets `bucket_count` buckets, each with a new stream,
/// in the same apply: the table and its streams are one ordered step.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CreateTable {
    #[prost(string, tag = "1")]
    pub database: String,
    #[prost(string, tag = "2")]
    pub name: String,
    /// Arrow IPC-encoded schema; opaque to the state machine (the frontends validate it).
    #[prost(bytes = "vec", tag = "3")]
    pub schema: Vec<u8>,
    #[prost(string, repeated, tag = "4")]
    pub primary_key: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub bucket_key: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    pub partition_keys: Vec<String>,
    #[prost(uint32, tag = "7")]
    pub bucket_count: u32,
    /// Table options with Fluss's names (`table.log.ttl`, `table.merge-engine`, ...).
    #[prost(btree_map = "string, string", tag = "8")]
    pub options: BTreeMap<String, String>,
    #[prost(string, tag = "9")]
    pub comment: String,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DropTable {
    #[prost(string, tag = "1")]
    pub database: String,
    #[prost(string, tag = "2")]
    pub name: String,
}

/// Changes a table's options and/or schema. A schema change names the schema version it
/// replaces, so two concurrent changes cannot both win.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct AlterTable {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(btree_map = "string, string", tag = "2")]
    pub set_options: BTreeMap<String, String>,
    #[prost(string, repeated, tag = "3")]
    pub reset_options: Vec<String>,
    /// Empty: schema unchanged.
    #[prost(bytes = "vec", tag = "4")]
    pub new_schema: Vec<u8>,
    #[prost(uint32, tag = "5")]
    pub expected_schema_version: u32,
}

/// Creates a partition of a partitioned table with `bucket_count` buckets and their streams.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CreatePartition {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    /// Partition key column -> value.
    #[prost(btree_map = "string, string", tag = "3")]
    pub values: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DropPartition {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(string, tag = "2")]
    pub name: String,
}

/// Coordinator: makes `leader_node_id` the leader of a bucket at the next leader epoch.
/// `partition_id` is 0 for unpartitioned tables.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct LeadBucket {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub table_id: u64,
    #[prost(uint64, tag = "3")]
    pub partition_id: u64,
    #[prost(uint32, tag = "4")]
    pub bucket: u32,
    #[prost(uint64, tag = "5")]
    pub leader_node_id: u64,
}

/// The bucket leader records a KV snapshot that covers the changelog below `log_offset`.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CommitKvSnapshot {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub table_id: u64,
    #[prost(uint64, tag = "4")]
    pub partition_id: u64,
    #[prost(uint32, tag = "5")]
    pub bucket: u32,
    #[prost(uint64, tag = "6")]
    pub leader_epoch: u64,
    #[prost(uint64, tag = "7")]
    pub snapshot_id: u64,
    /// Next log offset: the snapshot holds every change below it.
    #[prost(uint64, tag = "8")]
    pub log_offset: u64,
    #[prost(string, tag = "9")]
    pub location: String,
    #[prost(uint64, tag = "10")]
    pub size_bytes: u64,
}

/// Coordinator: forgets a KV snapshot (retention). The latest snapshot of a bucket is kept.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DropKvSnapshot {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub table_id: u64,
    #[prost(uint64, tag = "3")]
    pub partition_id: u64,
    #[prost(uint32, tag = "4")]
    pub bucket: u32,
    #[prost(uint64, tag = "5")]
    pub snapshot_id: u64,
}

/// The log offset a bucket has been tiered to.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct BucketOffset {
    #[prost(uint64, tag = "1")]
    pub partition_id: u64,
    #[prost(uint32, tag = "2")]
    pub bucket: u32,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    /// The first offset the lake holds for the bucket: 0, unless the lake was enabled after
    /// retention had trimmed the log.
    #[prost(uint64, tag = "4")]
    pub lake_start: u64,
}

/// Coordinator (tiering): records an Iceberg snapshot and the log offset each bucket was
/// tiered to. Offsets never move backwards.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CommitLakeSnapshot {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub table_id: u64,
    #[prost(int64, tag = "3")]
    pub snapshot_id: i64,
    #[prost(string, tag = "4")]
    pub metadata_location: String,
    #[prost(message, repeated, tag = "5")]
    pub bucket_offsets: Vec<BucketOffset>,
}

/// Hands out `count` consecutive values of the named sequence (ids, auto-increment ranges).
/// Sequences start at 1.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct Allocate {
    #[prost(string, tag = "1")]
    pub sequence: String,
    #[prost(uint64, tag = "2")]
    pub count: u64,
}

/// The new lease holder takes the coordinator role. `lease_term` is the term the lease row
/// handed out when this node acquired it; it becomes the coordinator epoch that every
/// coordinator command must carry, so a paused ex-holder's commands are rejected.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct RegisterCoordinator {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub lease_term: u64,
}

/// The lease holder gives the coordinator role up on its way out (from metadata_version 7), so
/// that the other nodes, which see it in the log, take the lease at once rather than at their
/// next renewal. `coordinator_epoch` must be the current one; from then on no command at that
/// epoch is accepted, and no node coordinates until the next `RegisterCoordinator`.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct ResignCoordinator {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub coordinator_epoch: u64,
}

/// Coordinator: raises the cluster's `metadata_version` once every live node supports it.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct UpgradeMetadataVersion {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint32, tag = "2")]
    pub version: u32,
}

// ================================ Offsets ================================

/// One bucket's offset in a table.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct TableBucketOffset {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(uint64, tag = "2")]
    pub partition_id: u64,
    #[prost(uint32, tag = "3")]
    pub bucket: u32,
    #[prost(uint64, tag = "4")]
    pub offset: u64,
}

/// Records the offsets an exactly-once producer (a Flink sink, say) had reached when it
/// started, for undo-recovery; kept for `ttl_ms` after registration.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct RegisterProducerOffsets {
    #[prost(string, tag = "1")]
    pub producer_id: String,
    #[prost(message, repeated, tag = "2")]
    pub offsets: Vec<TableBucketOffset>,
    #[prost(uint64, tag = "3")]
    pub ttl_ms: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DeleteProducerOffsets {
    #[prost(string, tag = "1")]
    pub producer_id: String,
}

/// Coordinator: drops producer offsets registered more than their TTL before `now_ms`.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct ExpireProducerOffsets {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub now_ms: u64,
}

/// One committed consumer-group offset (Kafka's OffsetCommit entry).
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct GroupOffset {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(uint64, tag = "2")]
    pub partition_id: u64,
    #[prost(uint32, tag = "3")]
    pub bucket: u32,
    #[prost(uint64, tag = "4")]
    pub offset: u64,
    #[prost(int32, tag = "5")]
    pub leader_epoch: i32,
    #[prost(string, tag = "6")]
    pub metadata: String,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CommitGroupOffsets {
    #[prost(string, tag = "1")]
    pub group_id: String,
    #[prost(message, repeated, tag = "2")]
    pub offsets: Vec<GroupOffset>,
    /// The coordinator epoch of the group coordinator that took the commit (Kafka's
    /// OffsetCommit): from metadata_version 5 a commit from an earlier epoch is refused, so a
    /// paused ex-coordinator cannot move offsets its successor's members committed. 0: not
    /// taken by a group coordinator (a connector's own position), never refused for it.
    #[prost(uint64, tag = "3")]
    pub coordinator_epoch: u64,
}

/// A bucket of a table, as named in group-offset deletes.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct TableBucket {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(uint64, tag = "2")]
    pub partition_id: u64,
    #[prost(uint32, tag = "3")]
    pub bucket: u32,
}

/// Deletes a group's offsets for the named buckets, or all of them when `buckets` is empty.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DeleteGroupOffsets {
    #[prost(string, tag = "1")]
    pub group_id: String,
    #[prost(message, repeated, tag = "2")]
    pub buckets: Vec<TableBucket>,
}

/// Coordinator: drops every offset of a group whose latest commit is older than
/// `retention_ms` at `now_ms` (Kafka's `offsets.retention.minutes`).
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct ExpireGroupOffsets {
    #[prost(uint64, tag = "1")]
    pub coordinator_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub now_ms: u64,
    #[prost(uint64, tag = "3")]
    pub retention_ms: u64,
}
