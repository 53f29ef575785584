//! The node service: what a `mink` process runs behind its frontends.
//!
//! A [`Node`] owns the metadata sink (its node identity and epoch), the stream engine, and the
//! log tablets of the buckets it leads. Catalog changes go through the command log. Bucket
//! leadership is real: the lease holder (coordinator) leads every bucket without a leader with
//! `LeadBucket` (round-robin over live nodes), and every node opens the stream of each bucket it
//! leads at that bucket's leader epoch, so a replaced leader is fenced by s3stream. Requests for
//! a bucket this node does not lead fail with [`NodeError::NotLeader`] naming the leader.

mod catalog;
mod cluster;
mod kv;
mod leadership;
mod node;
mod retention;

pub use s3stream::{AppendAck, WriterBatchId};

pub use catalog::{
    BucketInfo, MAX_PARTITIONS_PER_TABLE, PartitionInfo, TableChange, TableInfo, TableSpec,
};
pub use cluster::{ClusterStatus, NodeStatus};
pub use kv::ROW_KIND;
pub use node::{
    ALLOCATED_WRITER_EPOCH, BucketWrite, MAX_NEW_PARTITIONS_PER_WRITE, Node, NodeConfig,
    PendingWrite, WriteTarget, WriterId,
};

/// Errors of node operations, classed by who can act (they map onto gRPC statuses).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    Invalid(String),
    /// The bucket is led by another node: send the request there.
    #[error("bucket {bucket}{} of table {table} is led by node {leader} at {address}", partition.as_ref().map(|p| format!(" of partition {p:?}")).unwrap_or_default())]
    NotLeader {
        table: String,
        partition: Option<String>,
        bucket: u32,
        leader: u64,
        address: String,
    },
    /// Try again shortly (no leader yet, catching up, storage or metadata unavailable).
    #[error("{0}")]
    Unavailable(String),
    /// This node cannot serve any more (fenced, metadata halted): restart it.
    #[error("{0}")]
    Failed(String),
}

impl From<mink_log::LogError> for NodeError {
    fn from(e: mink_log::LogError) -> Self {
        match e {
            mink_log::LogError::Invalid(m) => NodeError::Invalid(m),
            mink_log::LogError::Stream(s) => s.into(),
            other => NodeError::Invalid(other.to_string()),
        }
    }
}

impl From<s3stream::StreamError> for NodeError {
    fn from(e: s3stream::StreamError) -> Self {
        use s3stream::StreamError as S;
        match e {
            S::NotFound { .. } => NodeError::NotFound(e.to_string()),
            S::OutOfRange { .. }
            | S::Invalid(_)
            | S::OutOfOrderSequence { .. }
            | S::WriterFenced { .. } => NodeError::Invalid(e.to_string()),
            S::Fenced { .. }
            | S::NotOpen { .. }
            | S::NotLeader { .. }
            | S::SequenceInFlight { .. } => NodeError::Unavailable(e.to_string()),
            S::Storage(_) | S::Shutdown => NodeError::Unavailable(e.to_string()),
            _ => NodeError::Failed(e.to_string()),
        }
    }
}

impl From<mink_sql::SinkError> for NodeError {
    fn from(e: mink_sql::SinkError) -> Self {
        match e {
            mink_sql::SinkError::Store(_) => NodeError::Unavailable(e.to_string()),
            mink_sql::SinkError::NotEnabled { .. } | mink_sql::SinkError::TooLarge { .. } => {
                NodeError::Invalid(e.to_string())
            }
            _ => NodeError::Failed(e.to_string()),
        }
    }
}

pub type NodeResult<T> = Result<T, NodeError>;
