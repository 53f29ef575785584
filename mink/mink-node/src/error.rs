//! What can go wrong in the node service, kept structured until a frontend maps it to its own
//! codes (Flight: `mink-error-code` and a gRPC status; Kafka: its error codes).

use crate::BucketRef;

/// Errors of node operations, classed by who can act.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error("table {database}.{table} does not exist")]
    TableNotFound { database: String, table: String },
    /// A database, partition, bucket or node that does not exist.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// The request or its data is wrong; retrying it unchanged fails again.
    #[error("{0}")]
    Invalid(String),
    /// One batch larger than a bucket's stream takes whole (Kafka's MESSAGE_TOO_LARGE); an
    /// invalid request everywhere else.
    #[error("a batch of {size} bytes exceeds the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    /// A write naming its bucket holds a row its table's bucket key routes to another one.
    #[error(
        "row {row} belongs to bucket {belongs}, not {bucket}: the table routes rows by its bucket key"
    )]
    WrongBucket {
        row: usize,
        bucket: u32,
        belongs: u32,
    },
    /// The bucket is led by another node: send the request there.
    #[error("{bucket} is led by node {leader} at {address} (leader epoch {leader_epoch})")]
    NotLeader {
        bucket: BucketRef,
        leader: u64,
        address: String,
        leader_epoch: u64,
    },
    /// A read outside what the bucket holds: below its start (retention removed it) or past
    /// its high watermark.
    #[error("offset {offset} is out of range: the bucket holds offsets [{start}, {end})")]
    OffsetOutOfRange { offset: u64, start: u64, end: u64 },
    /// An idempotent writer skipped or repeated sequence numbers in a bucket.
    #[error("writer {writer_id}: sequence {got} is out of order, expected {expected}")]
    OutOfOrderSequence {
        writer_id: u64,
        expected: u64,
        got: u64,
    },
    /// An idempotent writer at an epoch other than its current one.
    #[error(
        "writer {writer_id} is at epoch {current}, not {epoch}: epochs come from allocate_writer (a new writer id starts over)"
    )]
    WriterFenced {
        writer_id: u64,
        epoch: u64,
        current: u64,
    },
    /// An idempotent writer id that was never allocated.
    #[error("writer {writer_id} was never allocated: take a writer id from allocate_writer")]
    UnknownWriter { writer_id: u64 },
    /// The caller coordinated consumer groups at coordinator epoch `epoch`, and the lease has
    /// moved on since (to epoch `current`): the group's coordinator is another node now.
    #[error(
        "coordinator epoch {epoch} is no longer current (now {current}): the group's coordinator moved"
    )]
    NotCoordinator { epoch: u64, current: u64 },
    /// Try again shortly (no leader yet, catching up, storage or metadata unavailable).
    #[error("{0}")]
    Unavailable(String),
    /// This node cannot serve any more (fenced, metadata halted): restart it.
    #[error("{0}")]
    Failed(String),
}

impl NodeError {
    /// Whether the same request may succeed later, or at the leader it names.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            NodeError::NotLeader { .. } | NodeError::Unavailable(_)
        )
    }
}

impl From<mink_log::filter::FilterError> for NodeError {
    fn from(e: mink_log::filter::FilterError) -> Self {
        NodeError::Invalid(e.to_string())
    }
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
            S::OutOfRange {
                offset, start, end, ..
            } => NodeError::OffsetOutOfRange { offset, start, end },
            S::OutOfOrderSequence {
                writer_id,
                expected,
                got,
            } => NodeError::OutOfOrderSequence {
                writer_id,
                expected,
                got,
            },
            S::WriterFenced {
                writer_id,
                epoch,
                current,
            } => NodeError::WriterFenced {
                writer_id,
                epoch,
                current,
            },
            S::Invalid(_) => NodeError::Invalid(e.to_string()),
            S::TooLarge { size, limit } => NodeError::TooLarge { size, limit },
            S::Fenced { .. }
            | S::NotOpen { .. }
            | S::NotLeader { .. }
            | S::SequenceInFlight { .. } => NodeError::Unavailable(e.to_string()),
            S::Storage(_) | S::Shutdown => NodeError::Unavailable(e.to_string()),
            _ => NodeError::Failed(e.to_string()),
        }
    }
}

impl From<mink_lake::LakeError> for NodeError {
    fn from(e: mink_lake::LakeError) -> Self {
        use mink_lake::LakeError as L;
        match e {
            L::Incompatible { .. } | L::AlreadyExists(_) | L::Stale(_) | L::NotEmpty(_) => {
                NodeError::Invalid(e.to_string())
            }
            L::NotFound(_) => NodeError::NotFound(e.to_string()),
            L::Gap { .. } | L::Conflict(_) | L::FileGone(_) | L::Iceberg(_) => {
                NodeError::Failed(e.to_string())
            }
        }
    }
}

impl From<mink_read::ReadError> for NodeError {
    fn from(e: mink_read::ReadError) -> Self {
        match e {
            mink_read::ReadError::OffsetOutOfRange { offset, start, end } => {
                NodeError::OffsetOutOfRange { offset, start, end }
            }
            mink_read::ReadError::Lake(l) => l.into(),
            mink_read::ReadError::Invalid(m) => NodeError::Invalid(m),
            mink_read::ReadError::Filter(e) => e.into(),
        }
    }
}

impl From<mink_sql::SinkError> for NodeError {
    fn from(e: mink_sql::SinkError) -> Self {
        match e {
            // A node shutting down: the request may succeed at another node, or at this one
            // once it is back (a client retries UNAVAILABLE, not FAILED).
            mink_sql::SinkError::Store(_) | mink_sql::SinkError::Shutdown => {
                NodeError::Unavailable(e.to_string())
            }
            mink_sql::SinkError::Refused(r) if r.retriable => NodeError::Unavailable(r.message),
            mink_sql::SinkError::NotEnabled { .. }
            | mink_sql::SinkError::TooLarge { .. }
            | mink_sql::SinkError::Refused(_) => NodeError::Invalid(e.to_string()),
            _ => NodeError::Failed(e.to_string()),
        }
    }
}

pub type NodeResult<T> = Result<T, NodeError>;
