//! What applying a command produces: an [`Outcome`] (done, or redundant duplicate work) with a
//! [`Reply`], or a [`Rejection`]. Results are deterministic, so every node computes the same
//! ones; the last row's results are kept in the state (see `RowTokenRecord`) and therefore have
//! a wire form too.

use std::fmt;

/// The result of one command.
pub type CommandResult = Result<Outcome, Rejection>;

/// A command that was accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The command changed the state.
    Done(Reply),
    /// The command asked for something that already holds (a retry of work already done).
    /// Nothing changed; the reply describes the existing state.
    Redundant(Reply),
}

impl Outcome {
    pub fn reply(&self) -> &Reply {
        match self {
            Outcome::Done(r) | Outcome::Redundant(r) => r,
        }
    }

    pub fn into_reply(self) -> Reply {
        match self {
            Outcome::Done(r) | Outcome::Redundant(r) => r,
        }
    }

    pub fn is_redundant(&self) -> bool {
        matches!(self, Outcome::Redundant(_))
    }
}

/// The data a command answers with.
#[derive(Clone, PartialEq, Eq, ::prost::Oneof)]
pub enum Reply {
    #[prost(message, tag = "1")]
    Unit(Unit),
    /// A new or existing id (database, ...).
    #[prost(uint64, tag = "2")]
    Id(u64),
    /// Allocated ids `[start, end)`.
    #[prost(message, tag = "3")]
    Range(IdRange),
    /// A node, leader or coordinator epoch.
    #[prost(uint64, tag = "4")]
    Epoch(u64),
    #[prost(message, tag = "5")]
    Stream(StreamPosition),
    #[prost(message, tag = "6")]
    Commit(CommitReply),
    #[prost(message, tag = "7")]
    Kv(KvReply),
    #[prost(message, tag = "8")]
    Table(TableCreated),
    /// How many items the command affected.
    #[prost(uint64, tag = "9")]
    Count(u64),
}

#[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
pub struct Unit {}

#[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
pub struct IdRange {
    #[prost(uint64, tag = "1")]
    pub start: u64,
    #[prost(uint64, tag = "2")]
    pub end: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
pub struct StreamPosition {
    #[prost(uint64, tag = "1")]
    pub stream_epoch: u64,
    #[prost(uint64, tag = "2")]
    pub start_offset: u64,
    #[prost(uint64, tag = "3")]
    pub end_offset: u64,
}

/// Per-range results of a `CommitStreamSetObject`, in the command's range order.
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct CommitReply {
    #[prost(message, repeated, tag = "1")]
    pub ranges: Vec<RangeResult>,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct RangeResult {
    #[prost(uint64, tag = "1")]
    pub stream_id: u64,
    /// `None`: committed.
    #[prost(message, optional, tag = "2")]
    pub rejection: Option<Rejection>,
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct KvReply {
    /// The value before this command (for a rejected condition: the current value).
    #[prost(bytes = "vec", optional, tag = "1")]
    pub previous: Option<Vec<u8>>,
    /// Log index of the write that produced the value now stored (0 when absent).
    #[prost(uint64, tag = "2")]
    pub version: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
pub struct TableCreated {
    #[prost(uint64, tag = "1")]
    pub table_id: u64,
    #[prost(uint64, tag = "2")]
    pub partition_id: u64,
    #[prost(uint64, tag = "3")]
    pub first_stream_id: u64,
    #[prost(uint32, tag = "4")]
    pub stream_count: u32,
}

/// Why a command was refused. Kinds are the categories a frontend maps onto gRPC statuses and
/// Kafka error codes; the message says what was wrong in words a user can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum RejectionKind {
    Unspecified = 0,
    /// The node epoch is older than the node's registered epoch (a restarted node's
    /// predecessor), or the row's token belongs to a superseded process.
    NodeFenced = 1,
    /// A stream was opened at a higher epoch by someone else.
    StreamFenced = 2,
    /// The coordinator epoch is not the current lease holder's.
    CoordinatorFenced = 3,
    /// The bucket's leader epoch moved on.
    LeaderFenced = 4,
    /// An idempotent writer's epoch moved on.
    WriterFenced = 5,
    NotFound = 6,
    AlreadyExists = 7,
    InvalidArgument = 8,
    /// A precondition on current state failed (compare-and-set, offsets, sequences).
    Conflict = 9,
    NotEmpty = 10,
    /// A prepared object id expired before its commit: prepare a new id and retry.
    Expired = 11,
    /// A trim would cross a retention floor.
    BelowFloor = 12,
    /// The command needs a higher cluster `metadata_version`.
    NotEnabled = 13,
    /// The request is for a bucket this node does not lead.
    NotLeader = 14,
}

impl RejectionKind {
    /// Fencing means the caller has been superseded; retrying the same request cannot succeed.
    pub fn is_fenced(self) -> bool {
        matches!(
            self,
            RejectionKind::NodeFenced
                | RejectionKind::StreamFenced
                | RejectionKind::CoordinatorFenced
                | RejectionKind::LeaderFenced
                | RejectionKind::WriterFenced
        )
    }
}

#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct Rejection {
    #[prost(enumeration = "RejectionKind", tag = "1")]
    pub kind: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    /// The current epoch, offset or version the caller must catch up with, when relevant.
    #[prost(uint64, optional, tag = "3")]
    pub current: Option<u64>,
    /// The current value, for KV conditions.
    #[prost(bytes = "vec", optional, tag = "4")]
    pub value: Option<Vec<u8>>,
}

impl Rejection {
    pub fn new(kind: RejectionKind, message: impl Into<String>) -> Self {
        Rejection {
            kind: kind as i32,
            message: message.into(),
            current: None,
            value: None,
        }
    }

    pub fn with_current(mut self, current: u64) -> Self {
        self.current = Some(current);
        self
    }

    pub fn with_value(mut self, value: Option<Vec<u8>>) -> Self {
        self.value = value;
        self
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind(), self.message)
    }
}

impl std::error::Error for Rejection {}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum ResultStatus {
    Unspecified = 0,
    Done = 1,
    Redundant = 2,
    Rejected = 3,
}

/// Wire form of a [`CommandResult`].
#[derive(Clone, PartialEq, Eq, ::prost::Message)]
pub struct StoredResult {
    // The reply's variants use tags 1-19.
    #[prost(oneof = "Reply", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9")]
    pub reply: Option<Reply>,
    #[prost(enumeration = "ResultStatus", tag = "20")]
    pub status: i32,
    #[prost(message, optional, tag = "21")]
    pub rejection: Option<Rejection>,
}

impl From<&CommandResult> for StoredResult {
    fn from(result: &CommandResult) -> Self {
        match result {
            Ok(Outcome::Done(r)) => StoredResult {
                status: ResultStatus::Done as i32,
                reply: Some(r.clone()),
                rejection: None,
            },
            Ok(Outcome::Redundant(r)) => StoredResult {
                status: ResultStatus::Redundant as i32,
                reply: Some(r.clone()),
                rejection: None,
            },
            Err(e) => StoredResult {
                status: ResultStatus::Rejected as i32,
                reply: None,
                rejection: Some(e.clone()),
            },
        }
    }
}

impl StoredResult {
    pub fn to_result(&self) -> CommandResult {
        let reply = || self.reply.clone().unwrap_or(Reply::Unit(Unit {}));
        match ResultStatus::try_from(self.status) {
            Ok(ResultStatus::Done) => Ok(Outcome::Done(reply())),
            Ok(ResultStatus::Redundant) => Ok(Outcome::Redundant(reply())),
            _ => Err(self.rejection.clone().unwrap_or_else(|| {
                Rejection::new(RejectionKind::Unspecified, "result lost in encoding")
            })),
        }
    }
}
