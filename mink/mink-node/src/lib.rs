//! The node service: what a `mink` process runs behind its frontends.
//!
//! A [`Node`] owns the metadata sink (its node identity and epoch), the stream engine, and the
//! log tablets of the buckets it leads. Catalog changes go through the command log. Bucket
//! leadership is real: the lease holder (coordinator) leads every bucket without a leader with
//! `LeadBucket` (round-robin over live nodes), and every node opens the stream of each bucket it
//! leads at that bucket's leader epoch, so a replaced leader is fenced by s3stream. Requests for
//! a bucket this node does not lead fail with [`NodeError::NotLeader`] naming the leader.

mod bucket;
mod catalog;
mod cluster;
mod error;
mod forward;
mod groups;
mod identity;
mod kv;
mod lake_maintenance;
mod leadership;
mod node;
mod read;
mod retention;
mod session;
mod tiering;

pub use s3stream::{AppendAck, WriterBatchId, latency_histogram};

pub use bucket::BucketRef;

pub use catalog::{
    BucketInfo, LakeInfo, MAX_PARTITIONS_PER_TABLE, PartitionInfo, TableChange, TableInfo,
    TableSpec,
};
pub use cluster::{ClusterStatus, NodeStatus};
pub use kv::ROW_KIND;
/// Most buckets a table may have (`bucket.num`), so most partitions a Kafka topic may have.
pub use mink_metadata::MAX_BUCKETS;
pub use node::{
    ALLOCATED_WRITER_EPOCH, BucketWrite, MAX_NEW_PARTITIONS_PER_WRITE, Node, NodeConfig,
    PendingWrite, WriteTarget, WriterId,
};

pub use error::{NodeError, NodeResult};
pub use forward::Forwarder;
pub use groups::CommittedOffset;
pub use read::{
    BucketRead, Filter, ReadData, ReadItem, ReadKind, ReadOptions, ReadPlan, ReadRequest,
    ReadSource, ReadStart, ReadStop,
};
pub use session::WriteSession;
