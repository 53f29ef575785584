//! The records the state is made of. Each record carries its own key fields, so a snapshot is
//! simply every record of every map, in key order, and decoding rebuilds the maps from them.
//! Same compatibility rules as commands: never renumber a tag.

use std::collections::BTreeMap;

use crate::command::{BucketOffset, TableBucketOffset};
use crate::outcome::StoredResult;

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct NodeRecord {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub incarnation: u64,
    #[prost(string, tag = "4")]
    pub address: String,
    #[prost(uint32, tag = "5")]
    pub supported_metadata_version: u32,
    #[prost(uint64, tag = "6")]
    pub registered_at_ms: u64,
    /// Listener addresses by protocol (from metadata_version 3).
    #[prost(btree_map = "string, string", tag = "7")]
    pub listeners: BTreeMap<String, String>,
}

/// The last row a node process had applied, with its results, so that a resend of that row
/// after an unknown outcome is recognised and answered with what the first copy produced.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct RowTokenRecord {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub incarnation: u64,
    #[prost(uint64, tag = "4")]
    pub sequence: u64,
    #[prost(message, repeated, tag = "5")]
    pub results: Vec<StoredResult>,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CoordinatorRecord {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    /// The lease term the holder registered with.
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    /// The holder gave the role up (`ResignCoordinator`): nobody coordinates until the next
    /// registration, which must still bring a higher term.
    #[prost(bool, tag = "4")]
    pub resigned: bool,
}

impl CoordinatorRecord {
    /// The node coordinating now: the holder, unless it resigned.
    pub fn active(&self) -> Option<u64> {
        (!self.resigned).then_some(self.node_id)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum StreamState {
    Closed = 0,
    Open = 1,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct StreamRecord {
    #[prost(uint64, tag = "1")]
    pub stream_id: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    #[prost(enumeration = "StreamState", tag = "3")]
    pub state: i32,
    #[prost(uint64, tag = "4")]
    pub owner_node_id: u64,
    #[prost(uint64, tag = "5")]
    pub owner_node_epoch: u64,
    /// First readable offset (moved by trims).
    #[prost(uint64, tag = "6")]
    pub start_offset: u64,
    /// Committed end, the high watermark: reads never go above it.
    #[prost(uint64, tag = "7")]
    pub end_offset: u64,
    /// The bucket this stream stores; `table_id == 0` for a stream of no table.
    #[prost(uint64, tag = "8")]
    pub table_id: u64,
    #[prost(uint64, tag = "9")]
    pub partition_id: u64,
    #[prost(uint32, tag = "10")]
    pub bucket: u32,
    #[prost(uint64, tag = "11")]
    pub placement_node_id: u64,
    #[prost(uint64, tag = "12")]
    pub transfer_to_node_id: u64,
    #[prost(uint64, tag = "13")]
    pub created_at_ms: u64,
}

/// `[start_offset, end_offset)` of a stream lives in `object_id`.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct RangeRecord {
    #[prost(uint64, tag = "1")]
    pub stream_id: u64,
    #[prost(uint64, tag = "2")]
    pub start_offset: u64,
    #[prost(uint64, tag = "3")]
    pub end_offset: u64,
    #[prost(uint64, tag = "4")]
    pub object_id: u64,
    /// When the range's data was committed, by run of offsets, ascending; empty: all of it
    /// when its object was (a range committed with its object, or moved before
    /// [`DATA_TIME_VERSION`](crate::DATA_TIME_VERSION)). Compaction moves data into new
    /// objects, so their commit time says nothing of the data's age; these times move with it.
    #[prost(message, repeated, tag = "5")]
    pub data_times: Vec<DataTime>,
}

/// A run of a range's offsets, `[the previous run's end (or the range's start), end_offset)`,
/// whose data was all committed at or before `at_ms`.
#[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
pub struct DataTime {
    #[prost(uint64, tag = "1")]
    pub end_offset: u64,
    #[prost(uint64, tag = "2")]
    pub at_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum ObjectKind {
    StreamSet = 0,
    Stream = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum ObjectState {
    /// Id handed out; the PUT may or may not have happened.
    Prepared = 0,
    /// Referenced by at least one range when committed.
    Committed = 1,
    /// No longer referenced (or expired before commit): delete from object storage after the
    /// grace period, then `CleanDestroyedObjects`.
    Destroyed = 2,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct ObjectRecord {
    #[prost(uint64, tag = "1")]
    pub object_id: u64,
    #[prost(enumeration = "ObjectKind", tag = "2")]
    pub kind: i32,
    #[prost(enumeration = "ObjectState", tag = "3")]
    pub state: i32,
    /// The node the id was prepared for.
    #[prost(uint64, tag = "4")]
    pub node_id: u64,
    #[prost(uint64, tag = "5")]
    pub size: u64,
    /// Number of range records pointing at this object.
    #[prost(uint64, tag = "6")]
    pub live_ranges: u64,
    #[prost(uint64, tag = "7")]
    pub expires_at_ms: u64,
    #[prost(uint64, tag = "8")]
    pub committed_at_ms: u64,
    #[prost(uint64, tag = "9")]
    pub destroyed_at_ms: u64,
}

/// One batch an idempotent writer appended.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct WriterBatch {
    #[prost(uint64, tag = "1")]
    pub first_sequence: u64,
    #[prost(uint64, tag = "2")]
    pub last_sequence: u64,
    #[prost(uint64, tag = "3")]
    pub base_offset: u64,
    #[prost(uint64, tag = "4")]
    pub end_offset: u64,
}

/// A writer's state on one stream: its epoch and its last few batches (Kafka keeps five), so a
/// retry of any of them is answered with its original offsets.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct WriterRecord {
    #[prost(uint64, tag = "1")]
    pub stream_id: u64,
    #[prost(uint64, tag = "2")]
    pub writer_id: u64,
    #[prost(uint64, tag = "3")]
    pub writer_epoch: u64,
    #[prost(message, repeated, tag = "4")]
    pub batches: Vec<WriterBatch>,
    #[prost(uint64, tag = "5")]
    pub updated_at_ms: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct KvRecord {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    /// Log index of the write that set this value.
    #[prost(uint64, tag = "3")]
    pub version: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct DatabaseRecord {
    #[prost(uint64, tag = "1")]
    pub database_id: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(btree_map = "string, string", tag = "3")]
    pub properties: BTreeMap<String, String>,
    #[prost(string, tag = "4")]
    pub comment: String,
    #[prost(uint64, tag = "5")]
    pub created_at_ms: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct TableRecord {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(string, tag = "2")]
    pub database: String,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(bytes = "vec", tag = "4")]
    pub schema: Vec<u8>,
    #[prost(uint32, tag = "5")]
    pub schema_version: u32,
    #[prost(string, repeated, tag = "6")]
    pub primary_key: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub bucket_key: Vec<String>,
    #[prost(string, repeated, tag = "8")]
    pub partition_keys: Vec<String>,
    #[prost(uint32, tag = "9")]
    pub bucket_count: u32,
    #[prost(btree_map = "string, string", tag = "10")]
    pub options: BTreeMap<String, String>,
    #[prost(string, tag = "11")]
    pub comment: String,
    #[prost(uint64, tag = "12")]
    pub created_at_ms: u64,
}

impl TableRecord {
    pub fn is_primary_key_table(&self) -> bool {
        !self.primary_key.is_empty()
    }

    pub fn is_partitioned(&self) -> bool {
        !self.partition_keys.is_empty()
    }

    /// Whether the table is tiered into the lake (Fluss's `table.datalake.enabled`).
    pub fn is_lake_enabled(&self) -> bool {
        self.options
            .get(crate::OPTION_DATALAKE_ENABLED)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct PartitionRecord {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(uint64, tag = "2")]
    pub partition_id: u64,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(btree_map = "string, string", tag = "4")]
    pub values: BTreeMap<String, String>,
    #[prost(uint64, tag = "5")]
    pub created_at_ms: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct BucketRecord {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(uint64, tag = "2")]
    pub partition_id: u64,
    #[prost(uint32, tag = "3")]
    pub bucket: u32,
    #[prost(uint64, tag = "4")]
    pub stream_id: u64,
    /// 0 while no leader has been assigned.
    #[prost(uint64, tag = "5")]
    pub leader_node_id: u64,
    #[prost(uint64, tag = "6")]
    pub leader_node_epoch: u64,
    #[prost(uint64, tag = "7")]
    pub leader_epoch: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct KvSnapshotRecord {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(uint64, tag = "2")]
    pub partition_id: u64,
    #[prost(uint32, tag = "3")]
    pub bucket: u32,
    #[prost(uint64, tag = "4")]
    pub snapshot_id: u64,
    #[prost(uint64, tag = "5")]
    pub log_offset: u64,
    #[prost(string, tag = "6")]
    pub location: String,
    #[prost(uint64, tag = "7")]
    pub size_bytes: u64,
    #[prost(uint64, tag = "8")]
    pub leader_epoch: u64,
    #[prost(uint64, tag = "9")]
    pub created_at_ms: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct LakeSnapshotRecord {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(int64, tag = "2")]
    pub snapshot_id: i64,
    #[prost(string, tag = "3")]
    pub metadata_location: String,
    /// Tiered offset of every bucket tiered so far, sorted by (partition, bucket).
    #[prost(message, repeated, tag = "4")]
    pub bucket_offsets: Vec<BucketOffset>,
    #[prost(uint64, tag = "5")]
    pub committed_at_ms: u64,
}

impl LakeSnapshotRecord {
    pub fn tiered_offset(&self, partition_id: u64, bucket: u32) -> Option<u64> {
        self.bucket_offsets
            .iter()
            .find(|b| b.partition_id == partition_id && b.bucket == bucket)
            .map(|b| b.offset)
    }

    /// The first offset the lake holds for a bucket (0 for a table tiered from its creation).
    pub fn lake_start(&self, partition_id: u64, bucket: u32) -> u64 {
        self.bucket_offsets
            .iter()
            .find(|b| b.partition_id == partition_id && b.bucket == bucket)
            .map_or(0, |b| b.lake_start)
    }
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct SequenceRecord {
    #[prost(string, tag = "1")]
    pub name: String,
    /// The next value `Allocate` hands out.
    #[prost(uint64, tag = "2")]
    pub next: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct ProducerOffsetsRecord {
    #[prost(string, tag = "1")]
    pub producer_id: String,
    #[prost(message, repeated, tag = "2")]
    pub offsets: Vec<TableBucketOffset>,
    #[prost(uint64, tag = "3")]
    pub ttl_ms: u64,
    #[prost(uint64, tag = "4")]
    pub registered_at_ms: u64,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct GroupOffsetRecord {
    #[prost(string, tag = "1")]
    pub group_id: String,
    #[prost(uint64, tag = "2")]
    pub table_id: u64,
    #[prost(uint64, tag = "3")]
    pub partition_id: u64,
    #[prost(uint32, tag = "4")]
    pub bucket: u32,
    #[prost(uint64, tag = "5")]
    pub offset: u64,
    #[prost(int32, tag = "6")]
    pub leader_epoch: i32,
    #[prost(string, tag = "7")]
    pub metadata: String,
    #[prost(uint64, tag = "8")]
    pub committed_at_ms: u64,
}

/// Id counters. Every id is handed out once and never reused.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct Counters {
    #[prost(uint64, tag = "1")]
    pub next_database_id: u64,
    #[prost(uint64, tag = "2")]
    pub next_table_id: u64,
    #[prost(uint64, tag = "3")]
    pub next_partition_id: u64,
    #[prost(uint64, tag = "4")]
    pub next_stream_id: u64,
    #[prost(uint64, tag = "5")]
    pub next_object_id: u64,
    #[prost(uint64, tag = "6")]
    pub next_producer_id: u64,
}

impl Counters {
    pub(crate) fn initial() -> Self {
        Counters {
            next_database_id: 1,
            next_table_id: 1,
            next_partition_id: 1,
            next_stream_id: 1,
            next_object_id: 1,
            next_producer_id: 1,
        }
    }
}
