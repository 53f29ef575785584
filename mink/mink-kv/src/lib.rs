//! Primary-key tables: the table definition (keys, merge engine, delete behaviour, changelog
//! image), the merge of a write batch into a changelog, the bucket's local working copy and the
//! KV tablet that ties them to the bucket's stream.
//!
//! A write is processed in this order, per bucket and under one lock: a retried idempotent
//! batch is recognised and answered with its original offsets; the changelog is computed against
//! the working copy plus the overlay of writes still in flight; the changelog is appended to the
//! stream; once durable it is applied to the working copy and the write is acknowledged. The
//! stream is the truth: the working copy is rebuilt from it (after-images overwrite, merges are
//! never re-run).

pub mod changelog;
pub mod definition;
pub mod merge;
pub mod rows;
pub mod snapshot;
pub mod store;
pub mod tablet;

pub use changelog::ChangeType;
pub use definition::{AggFunction, ChangelogImage, DeleteBehavior, KvTableDef, MergeEngine};
pub use merge::{KvWrite, Merged, RowKind};
pub use snapshot::SnapshotInfo;
pub use tablet::{KvScan, KvTablet, KvTabletConfig, PendingKv, SnapshotSource, WriteAck};

/// Errors of primary-key tables.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// A table definition or a write that breaks a rule; nothing was stored.
    #[error("{0}")]
    Invalid(String),
    /// A delete on a table whose `table.delete.behavior` is `disable`.
    #[error("delete operations are disabled for this table (table.delete.behavior is 'disable')")]
    DeletionDisabled,
    #[error(transparent)]
    Log(#[from] mink_log::LogError),
    #[error(transparent)]
    Stream(#[from] s3stream::StreamError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The local working copy failed (disk, corruption); it can be rebuilt from the stream.
    #[error("local working copy: {0}")]
    Store(String),
    /// An earlier write of this bucket failed after this one's changelog was computed on top of
    /// it; nothing of this write is visible. Retriable.
    #[error("an earlier write of this bucket failed: {0}")]
    Aborted(String),
}

impl From<redb::Error> for KvError {
    fn from(e: redb::Error) -> Self {
        KvError::Store(e.to_string())
    }
}

pub type KvResult<T> = Result<T, KvError>;

/// A key of the working copy and its new row (encoded), `None` when deleted.
pub type KeyChange = (Vec<u8>, Option<Vec<u8>>);

fn invalid(message: impl Into<String>) -> KvError {
    KvError::Invalid(message.into())
}
