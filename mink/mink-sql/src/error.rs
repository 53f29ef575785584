use mink_metadata::DecodeError;

use crate::store::StoreError;

/// Why a proposal (or a wait) failed. Cloneable: one failure is fanned out to every waiter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// The sink stopped applying the log (a row it cannot decode or must not apply). Nothing
    /// was skipped; the node needs an operator (or a newer binary).
    #[error("metadata sink halted at index {index}: {reason}")]
    Halted { index: u64, reason: String },
    /// A newer process registered this node id; this one may no longer write.
    #[error("node {node_id} epoch {node_epoch} was fenced by a newer registration")]
    Fenced { node_id: u64, node_epoch: u64 },
    /// The command is newer than the cluster's `metadata_version`.
    #[error("{command} needs metadata_version {since}; the cluster is at {current}")]
    NotEnabled {
        command: &'static str,
        since: u32,
        current: u32,
    },
    /// This process was superseded while its row's fate was hidden in rows it never read
    /// (truncated before it caught up): the commands may or may not have taken effect.
    #[error(
        "node {node_id} epoch {node_epoch} was superseded; whether its last proposal applied is unknown"
    )]
    OutcomeUnknown { node_id: u64, node_epoch: u64 },
    #[error("command of {size} bytes exceeds the row limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// Starting the sink failed.
    #[error("metadata sink could not start: {0}")]
    Start(String),
    /// The node's own check before it registers refused the start
    /// ([`crate::SinkConfig::before_register`]).
    #[error("{}", .0.message)]
    Refused(crate::config::Refusal),
    #[error("metadata store: {0}")]
    Store(#[from] StoreError),
    #[error("metadata sink is shut down")]
    Shutdown,
}

impl SinkError {
    pub(crate) fn decode(index: u64, what: &str, e: &DecodeError) -> Self {
        SinkError::Halted {
            index,
            reason: format!("{what} failed to decode: {e}"),
        }
    }
}
