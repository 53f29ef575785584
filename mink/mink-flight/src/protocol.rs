//! Mink's Arrow Flight protocol: what goes in descriptors, tickets, action bodies and
//! `app_metadata`. Everything is JSON (UTF-8), so any Flight client can speak it; schemas
//! travel as base64 of an Arrow IPC schema message (`pyarrow.Schema.serialize()`).
//! `docs/flight.md` is the user-facing description of the same contract.

use std::collections::BTreeMap;

use arrow::datatypes::Schema;
use base64::Engine as _;
pub use mink_log::filter::{Filter, Op, Predicate};
use serde::{Deserialize, Serialize};

/// Response header on every call: the metadata index the answering node had applied.
pub const APPLIED_INDEX_HEADER: &str = "mink-applied-index";
/// Request header: answer only once the node has applied at least this index
/// (read-your-writes across nodes). Waits a bounded time, then fails with `UNAVAILABLE`.
pub const MIN_APPLIED_INDEX_HEADER: &str = "mink-min-applied-index";
/// On a `NOT_LEADER` error (gRPC `FAILED_PRECONDITION`): the node leading the bucket.
pub const LEADER_NODE_HEADER: &str = "mink-leader-node";
/// On a `NOT_LEADER` error: the Flight address of the leader (`host:port`).
pub const LEADER_ADDRESS_HEADER: &str = "mink-leader-address";
/// On a `NOT_LEADER` error: the bucket's leader epoch.
pub const LEADER_EPOCH_HEADER: &str = "mink-leader-epoch";
/// On an `OFFSET_OUT_OF_RANGE` error: the bucket's first offset and its high watermark.
pub const START_OFFSET_HEADER: &str = "mink-start-offset";
pub const END_OFFSET_HEADER: &str = "mink-end-offset";
/// On an `OUT_OF_ORDER_SEQUENCE` error: the sequence the bucket takes next from the writer.
pub const EXPECTED_SEQUENCE_HEADER: &str = "mink-expected-sequence";
/// On a `WRITER_FENCED` error: the writer's current epoch.
pub const WRITER_EPOCH_HEADER: &str = "mink-writer-epoch";
/// On every error: the error's [`ErrorCode`] (`NOT_FOUND`, `NOT_LEADER`, ...).
pub const ERROR_CODE_HEADER: &str = "mink-error-code";
/// Set by a node forwarding a read to a bucket's leader: the leader answers from what it
/// leads and never forwards it again.
pub const FORWARDED_HEADER: &str = "mink-forwarded";

/// `DoAction` types. The body and the single result are JSON.
pub mod action {
    /// [`super::CreateDatabase`] → `{}`
    pub const CREATE_DATABASE: &str = "create_database";
    /// [`super::DropDatabase`] → `{}`
    pub const DROP_DATABASE: &str = "drop_database";
    /// `{}` → [`super::Databases`]
    pub const LIST_DATABASES: &str = "list_databases";
    /// [`super::ListTables`] → [`super::Tables`]
    pub const LIST_TABLES: &str = "list_tables";
    /// [`super::CreateTable`] → [`super::TableDescription`]
    pub const CREATE_TABLE: &str = "create_table";
    /// [`super::DropTable`] → `{}`
    pub const DROP_TABLE: &str = "drop_table";
    /// [`super::AlterTable`] → [`super::TableDescription`]
    pub const ALTER_TABLE: &str = "alter_table";
    /// [`super::TableRef`] → [`super::TableDescription`]
    pub const DESCRIBE_TABLE: &str = "describe_table";
    /// [`super::PartitionRef`] → [`super::PartitionDescription`]
    pub const CREATE_PARTITION: &str = "create_partition";
    /// [`super::PartitionRef`] → `{}`
    pub const DROP_PARTITION: &str = "drop_partition";
    /// `{}` → [`super::Writer`]: an idempotent writer id for `DoPut`.
    pub const ALLOCATE_WRITER: &str = "allocate_writer";
    /// `{}` → [`super::ClusterDescription`]
    pub const DESCRIBE_CLUSTER: &str = "describe_cluster";
    /// [`super::Rebalance`] → [`super::Rebalanced`]
    pub const REBALANCE: &str = "rebalance";
    /// [`super::DrainNode`] → `{}`
    pub const DRAIN_NODE: &str = "drain_node";
    /// [`super::TailScan`] → `{}`: a query's scan read this many log-tail rows of a lake
    /// table (sent to the node tiering it: the leader of its first bucket).
    pub const REPORT_TAIL_SCAN: &str = "report_tail_scan";
    /// [`super::WriterPositionsRequest`] → [`super::WriterPositions`]: where an idempotent
    /// writer's committed batches end in each bucket (a connector resuming after a crash).
    pub const WRITER_POSITIONS: &str = "writer_positions";

    /// Every action with a one-line description (`ListActions`).
    pub const ALL: &[(&str, &str)] = &[
        (CREATE_DATABASE, "create a database: {name, if_not_exists}"),
        (DROP_DATABASE, "drop a database: {name, cascade, if_exists}"),
        (LIST_DATABASES, "list databases: {}"),
        (LIST_TABLES, "list the tables of a database: {database}"),
        (
            CREATE_TABLE,
            "create a log table: {database, table, schema (base64 Arrow IPC), options, partition_keys, comment, if_not_exists}",
        ),
        (DROP_TABLE, "drop a table: {database, table, if_exists}"),
        (
            ALTER_TABLE,
            "change options or add nullable columns: {database, table, set_options, reset_options, schema}",
        ),
        (
            DESCRIBE_TABLE,
            "describe a table and its buckets: {database, table}",
        ),
        (
            CREATE_PARTITION,
            "create a partition: {database, table, partition, if_not_exists}",
        ),
        (
            DROP_PARTITION,
            "drop a partition: {database, table, partition, if_exists}",
        ),
        (ALLOCATE_WRITER, "allocate an idempotent writer id: {}"),
        (
            DESCRIBE_CLUSTER,
            "the nodes, their heartbeats and buckets, the coordinator: {}",
        ),
        (
            REBALANCE,
            "even out the buckets per node (dry_run: only show the moves): {dry_run}",
        ),
        (
            DRAIN_NODE,
            "move every bucket off a node and give it none (undo: give it buckets again): {node_id, undo}",
        ),
        (
            REPORT_TAIL_SCAN,
            "a query read log-tail rows of a lake table (tiers it sooner): {database, table, rows}",
        ),
        (
            WRITER_POSITIONS,
            "an idempotent writer's last sequence per bucket: {database, table, writer_id}",
        ),
    ];
}

/// What went wrong, as a client can act on it. Also the `mink-error-code` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    NotFound,
    AlreadyExists,
    /// The request or its data is wrong; retrying it unchanged fails again.
    Invalid,
    /// The bucket is led by another node (named in the error): send it there.
    NotLeader,
    /// An offset outside what the bucket holds (the valid range is in the error).
    OffsetOutOfRange,
    /// An idempotent writer's batch out of sequence in its bucket (the expected sequence is
    /// in the error).
    OutOfOrderSequence,
    /// An idempotent writer at an epoch other than its current one.
    WriterFenced,
    /// An idempotent writer id that was never allocated.
    UnknownWriter,
    /// A message over the node's size limit: send smaller batches.
    TooLarge,
    /// Retry shortly.
    Unavailable,
    /// The node cannot serve; another node might.
    Failed,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::AlreadyExists => "ALREADY_EXISTS",
            ErrorCode::Invalid => "INVALID",
            ErrorCode::NotLeader => "NOT_LEADER",
            ErrorCode::OffsetOutOfRange => "OFFSET_OUT_OF_RANGE",
            ErrorCode::OutOfOrderSequence => "OUT_OF_ORDER_SEQUENCE",
            ErrorCode::WriterFenced => "WRITER_FENCED",
            ErrorCode::UnknownWriter => "UNKNOWN_WRITER",
            ErrorCode::TooLarge => "TOO_LARGE",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Failed => "FAILED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "NOT_FOUND" => ErrorCode::NotFound,
            "ALREADY_EXISTS" => ErrorCode::AlreadyExists,
            "INVALID" => ErrorCode::Invalid,
            "NOT_LEADER" => ErrorCode::NotLeader,
            "OFFSET_OUT_OF_RANGE" => ErrorCode::OffsetOutOfRange,
            "OUT_OF_ORDER_SEQUENCE" => ErrorCode::OutOfOrderSequence,
            "WRITER_FENCED" => ErrorCode::WriterFenced,
            "UNKNOWN_WRITER" => ErrorCode::UnknownWriter,
            "TOO_LARGE" => ErrorCode::TooLarge,
            "UNAVAILABLE" => ErrorCode::Unavailable,
            "FAILED" => ErrorCode::Failed,
            _ => return None,
        })
    }

    /// Whether the same request may succeed later (or at the leader).
    pub fn is_retriable(self) -> bool {
        matches!(self, ErrorCode::NotLeader | ErrorCode::Unavailable)
    }
}

/// An error for one bucket of a write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_node_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_address: Option<String>,
    /// `NOT_LEADER`: the bucket's leader epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_epoch: Option<u64>,
    /// `OFFSET_OUT_OF_RANGE`: the offsets the bucket holds, `[start_offset, end_offset)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_offset: Option<u64>,
    /// `OUT_OF_ORDER_SEQUENCE`: the sequence the bucket takes next from the writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_sequence: Option<u64>,
    /// `WRITER_FENCED`: the writer's current epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_epoch: Option<u64>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: String) -> Self {
        ErrorBody {
            code,
            message,
            leader_node_id: None,
            leader_address: None,
            leader_epoch: None,
            start_offset: None,
            end_offset: None,
            expected_sequence: None,
            writer_epoch: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateDatabase {
    pub name: String,
    #[serde(default)]
    pub if_not_exists: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropDatabase {
    pub name: String,
    /// Drop its tables too (otherwise a database with tables is refused).
    #[serde(default)]
    pub cascade: bool,
    #[serde(default)]
    pub if_exists: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Databases {
    pub databases: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListTables {
    pub database: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tables {
    pub tables: Vec<String>,
}

/// A table by name (also the body of `describe_table`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableRef {
    pub database: String,
    pub table: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTable {
    pub database: String,
    pub table: String,
    /// Base64 of an Arrow IPC schema message (see [`encode_schema`]).
    pub schema: String,
    /// Fluss option names: `bucket.num`, `bucket.key`, `table.log.ttl`, `table.log.format`,
    /// `table.log.arrow.compression.type`.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    #[serde(default)]
    pub partition_keys: Vec<String>,
    /// A primary-key table's key columns (they include the partition keys); absent for a
    /// log table. Options such as `table.merge-engine` then apply (see docs/tables.md).
    #[serde(default)]
    pub primary_key: Vec<String>,
    #[serde(default)]
    pub comment: String,
    #[serde(default)]
    pub if_not_exists: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropTable {
    pub database: String,
    pub table: String,
    #[serde(default)]
    pub if_exists: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlterTable {
    pub database: String,
    pub table: String,
    #[serde(default)]
    pub set_options: BTreeMap<String, String>,
    #[serde(default)]
    pub reset_options: Vec<String>,
    /// The whole new schema (base64 IPC): the current columns plus nullable ones at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionRef {
    pub database: String,
    pub table: String,
    /// The partition-key values joined by `$`, in partition-key order.
    pub partition: String,
    /// For `create_partition`: succeed if it exists.
    #[serde(default)]
    pub if_not_exists: bool,
    /// For `drop_partition`: succeed if it does not exist.
    #[serde(default)]
    pub if_exists: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnDescription {
    pub name: String,
    /// Arrow's name for the type (`Int64`, `Utf8`, `List(Int32)`, ...).
    pub r#type: String,
    pub nullable: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionDescription {
    pub partition_id: u64,
    pub name: String,
    pub values: BTreeMap<String, String>,
    pub created_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketDescription {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    pub partition_id: u64,
    pub bucket: u32,
    pub stream_id: u64,
    /// 0 while the bucket has no leader yet.
    pub leader_node_id: u64,
    pub leader_address: String,
    pub leader_epoch: u64,
    /// First readable offset (retention moves it).
    pub start_offset: u64,
    /// The high watermark: the next offset to be written.
    pub end_offset: u64,
    /// Lake-enabled tables: the offset tiering has reached (absent before the first round).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiered_offset: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDescription {
    pub table_id: u64,
    pub database: String,
    pub table: String,
    /// Base64 Arrow IPC schema.
    pub schema: String,
    pub columns: Vec<ColumnDescription>,
    pub schema_version: u32,
    pub options: BTreeMap<String, String>,
    pub partition_keys: Vec<String>,
    pub bucket_count: u32,
    pub bucket_key: Vec<String>,
    /// Empty for a log table.
    #[serde(default)]
    pub primary_key: Vec<String>,
    pub comment: String,
    pub created_at_ms: u64,
    pub partitions: Vec<PartitionDescription>,
    pub buckets: Vec<BucketDescription>,
    /// Tables tiered into the lake: its last recorded snapshot and how far behind it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lake: Option<LakeDescription>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LakeDescription {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_at_ms: Option<u64>,
    /// How long the oldest untiered row has waited at most (0 when everything is tiered).
    pub lag_ms: u64,
}

impl TableDescription {
    pub fn arrow_schema(&self) -> Result<Schema, ProtocolError> {
        decode_schema(&self.schema)
    }

    /// The column a primary-key table generates (`auto-increment.fields`): writers leave it
    /// out.
    pub fn auto_increment_column(&self) -> Option<String> {
        if self.primary_key.is_empty() {
            return None;
        }
        self.options
            .get("auto-increment.fields")
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub writer_id: u64,
    pub writer_epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDescription {
    pub node_id: u64,
    pub node_epoch: u64,
    pub address: String,
    /// Its heartbeat is younger than the lease TTL.
    pub live: bool,
    /// Milliseconds since its last heartbeat (database clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_age_ms: Option<i64>,
    /// Buckets it leads.
    #[serde(default)]
    pub buckets: u64,
    /// Drained: it gets no buckets, and its buckets move to the other nodes.
    #[serde(default)]
    pub drained: bool,
    /// Its listeners' addresses by protocol (`flight`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub listeners: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterDescription {
    /// The node that answered.
    pub node_id: u64,
    pub applied_index: u64,
    /// The node holding the coordinator lease, if known.
    pub coordinator_node_id: Option<u64>,
    /// The coordinator epoch its commands carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator_epoch: Option<u64>,
    pub nodes: Vec<NodeDescription>,
    /// Buckets whose leader is not live (failover pending) or that have none yet.
    #[serde(default)]
    pub buckets_without_live_leader: u64,
    /// The lease TTL (a node whose heartbeat is older is down); absent from older nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rebalance {
    /// Only plan: show the moves, make none.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rebalanced {
    /// One line per bucket moved (or that would move).
    pub moves: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainNode {
    pub node_id: u64,
    /// Give the node buckets again.
    #[serde(default)]
    pub undo: bool,
}

/// `DoPut` descriptor as a command (`FlightDescriptor::new_cmd`). A path descriptor
/// `[database, table]` means the same with every other field left out (a routed write).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteDescriptor {
    pub database: String,
    pub table: String,
    /// Every batch goes to this partition (and must belong to it) unless its metadata says
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Every batch goes to this bucket unless its metadata says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
    /// An idempotent writer (from `allocate_writer`): every batch then names its bucket and
    /// carries its sequence number in that bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer_epoch: Option<u64>,
    /// Primary-key tables: a partial update setting only these columns (the key among them).
    /// By default, a batch with only some of the table's columns sets those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<Vec<String>>,
}

/// `DoPut`: optional `app_metadata` of each batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
    /// The writer's sequence number for this batch in its bucket: 0, 1, 2, ... A retry sends
    /// the same number and is answered with the original offsets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// The batch spans sequences `sequence..=last_sequence` (one when absent): a writer whose
    /// sequences follow a source's offsets, such as a Kafka connector's, numbers a batch
    /// through the last offset it covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sequence: Option<u64>,
}

/// `writer_positions`: where writer `writer_id` stands in each bucket of a table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriterPositionsRequest {
    pub database: String,
    pub table: String,
    pub writer_id: u64,
}

/// A writer's last committed sequence in one bucket (buckets it never wrote to are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterPosition {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    pub bucket: u32,
    pub writer_epoch: u64,
    pub last_sequence: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterPositions {
    pub buckets: Vec<WriterPosition>,
}

/// What happened to the rows of one bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    pub bucket: u32,
    pub rows: u64,
    /// Offsets `[base_offset, end_offset)` of the stored rows (absent on error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_offset: Option<u64>,
    /// The batch had been stored before (an idempotent retry); the offsets are the original.
    #[serde(default)]
    pub duplicate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// `DoPut`: the `app_metadata` of the `PutResult` answering each batch, in batch order, sent
/// once the batch's rows are durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PutAck {
    /// The batch's position in the stream (0-based).
    pub batch: u64,
    pub buckets: Vec<BucketResult>,
    /// The metadata index the node had applied when it answered, the batch's commits
    /// included: a read carrying it as `mink-min-applied-index` sees the rows on any node.
    /// (The `mink-applied-index` header of a `DoPut` is sent before any batch is stored.)
    #[serde(default)]
    pub applied_index: u64,
}

/// `report_tail_scan`: a query's scan of `database.table` read `rows` rows of its log tail.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailScan {
    pub database: String,
    pub table: String,
    pub rows: u64,
}

/// `DoGet` ticket: a table, one partition, or one bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ticket {
    pub database: String,
    pub table: String,
    /// For a partitioned table: only this partition (all of them otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Only this bucket (all of them otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u32>,
    /// With `bucket`: first offset to read (the bucket's start when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// With `bucket`: start at the high watermark (only new rows; for tailing).
    #[serde(default)]
    pub latest: bool,
    /// With `bucket`: stop before this offset (the high watermark at the start otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_offset: Option<u64>,
    /// Columns to return, in this order (all when absent or empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    /// With `bucket`: keep the stream open and send rows as they are written.
    #[serde(default)]
    pub tail: bool,
    /// With `tail`: end the stream after this long without new rows (never when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_idle_ms: Option<u64>,
    /// Stop after about this many rows (whole batches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<u64>,
    /// Primary-key tables: read the changelog (`_change_type`, `_log_offset`,
    /// `_commit_timestamp`, then the columns) with the offsets and tailing of a log read,
    /// instead of the current rows.
    #[serde(default)]
    pub changelog: bool,
    /// Log tables tiered into the lake: `union` (the default: the lake below the log's start,
    /// then the log), `lake` (the lake's rows only) or `log` (the log's rows only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Only rows that meet every predicate: `[{"column": "x", "op": ">=", "value": 5}, ...]`
    /// (ops `=`, `!=`, `<`, `<=`, `>`, `>=`, `in` with `values`, `is_null`, `is_not_null`;
    /// `__bucket`, and `__offset` and `__timestamp` on log tables, select buckets, offset
    /// ranges and time ranges).
    #[serde(default, skip_serializing_if = "Filter::is_empty")]
    pub filter: Filter,
    /// Primary-key tables: the rows of these keys (JSON objects holding every primary-key
    /// column), in this order; missing keys are left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    /// Primary-key tables: every row under each of these bucket-key values (with the
    /// partition columns of a partitioned table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_lookup: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
}

/// `DoGet`: the `app_metadata` of each batch: where its rows are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    pub bucket: u32,
    /// Offset of the batch's first row.
    pub offset: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolError(pub String);

/// Base64 of the Arrow IPC encoding of `schema`.
pub fn encode_schema(schema: &Schema) -> Result<String, ProtocolError> {
    let bytes = mink_log::codec::encode_schema(schema).map_err(|e| ProtocolError(e.to_string()))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Decodes [`encode_schema`]'s output, or base64 of `pyarrow.Schema.serialize()`.
pub fn decode_schema(b64: &str) -> Result<Schema, ProtocolError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| ProtocolError(format!("the schema is not base64: {e}")))?;
    mink_log::codec::decode_schema(&bytes)
        .map_err(|e| ProtocolError(format!("the schema is not an Arrow IPC schema: {e}")))
}

/// Parses a JSON body; an error names the field that does not fit and what it takes
/// (`ticket: field "bucket": invalid value: integer -1, expected an integer from 0 to
/// 4294967295`), or where the JSON itself is broken.
pub fn parse<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, ProtocolError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            return ProtocolError(format!("{what}: {}", json_wording(&inner.to_string())));
        }
        // The position adds nothing once the field is named.
        let message = inner.to_string();
        let message = message
            .rsplit_once(" at line ")
            .map_or(message.as_str(), |(m, _)| m);
        ProtocolError(format!("{what}: field {path:?}: {}", json_wording(message)))
    })?;
    de.end()
        .map_err(|e| ProtocolError(format!("{what}: {e}")))?;
    Ok(value)
}

/// serde's type names in the words of the protocol's users.
fn json_wording(message: &str) -> String {
    message
        .replace("expected u32", "expected an integer from 0 to 4294967295")
        .replace(
            "expected u64",
            "expected an integer from 0 to 18446744073709551615",
        )
        .replace("expected a boolean", "expected true or false")
}

/// Longest error message a node sends. Messages echo user input (names, values); gRPC carries
/// the message in a header, and a client refuses a header block over its limit (16 KiB by
/// default) without showing anything of it.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

/// `message` cut to [`MAX_ERROR_MESSAGE_BYTES`] in its middle, so that both what it is about
/// and what it says about it survive.
pub fn cap_message(message: String) -> String {
    if message.len() <= MAX_ERROR_MESSAGE_BYTES {
        return message;
    }
    let keep = MAX_ERROR_MESSAGE_BYTES / 2 - 32;
    let mut head = keep;
    while !message.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = message.len() - keep;
    while !message.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{} [... {} bytes cut ...] {}",
        &message[..head],
        tail - head,
        &message[tail..]
    )
}

pub fn to_json<T: Serialize>(value: &T) -> bytes::Bytes {
    bytes::Bytes::from(serde_json::to_vec(value).expect("protocol types serialize"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(body: &str) -> String {
        parse::<Ticket>("ticket", body.as_bytes()).unwrap_err().0
    }

    #[test]
    fn json_errors_name_the_field_and_what_it_takes() {
        assert_eq!(
            error(r#"{"database": "a", "table": "b", "bucket": -1}"#),
            "ticket: field \"bucket\": invalid value: integer `-1`, expected an integer from 0 to 4294967295"
        );
        assert_eq!(
            error(r#"{"database": "a", "table": "b", "tail": "yes"}"#),
            "ticket: field \"tail\": invalid type: string \"yes\", expected true or false"
        );
        let unknown = error(r#"{"database": "a", "table": "b", "buckets": 1}"#);
        assert!(
            unknown.starts_with("ticket: ")
                && unknown.contains("unknown field `buckets`, expected one of"),
            "{unknown}"
        );
        let broken = error(r#"{"database": "a", "#);
        assert!(broken.contains("line 1 column"), "{broken}");
        assert!(
            error("{} trailing").starts_with("ticket: "),
            "trailing input"
        );
    }

    #[test]
    fn long_messages_keep_their_ends() {
        let short = "table x does not exist".to_string();
        assert_eq!(cap_message(short.clone()), short);
        let long = format!("table {} does not exist", "é".repeat(10_000));
        let capped = cap_message(long);
        assert!(capped.len() <= MAX_ERROR_MESSAGE_BYTES, "{}", capped.len());
        assert!(capped.starts_with("table éé") && capped.ends_with("éé does not exist"));
        assert!(capped.contains(" bytes cut ...] "));
    }
}
