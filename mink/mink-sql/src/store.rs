//! The storage interface of the command log: the four tables and the few operations the sink
//! performs on them. One implementation per database ([`crate::SqliteStore`],
//! [`crate::PostgresStore`]); faults are injected by wrapping one ([`crate::FaultyStore`]).

use std::fmt::Debug;

use async_trait::async_trait;

/// A row of `meta_log`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRow {
    pub index: u64,
    pub payload: Vec<u8>,
}

/// The `meta_snapshot` row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRow {
    pub applied_index: u64,
    pub payload: Vec<u8>,
}

/// A lease granted (or renewed) to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    /// Rises each time the lease changes hands; becomes the coordinator epoch.
    pub term: u64,
    /// Database time at which the lease lapses unless renewed.
    pub expires_at_ms: i64,
}

/// The `meta_lease` row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRow {
    pub node_id: u64,
    pub node_epoch: u64,
    pub term: u64,
    pub expires_at_ms: i64,
    /// Database time when the row was read.
    pub now_ms: i64,
}

/// What a node reports every heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub node_id: u64,
    pub node_epoch: u64,
    pub applied_index: u64,
    pub supported_version: u32,
}

/// A `meta_node` row, with its age by the database's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRow {
    pub node_id: u64,
    pub node_epoch: u64,
    pub heartbeat_ms: i64,
    pub applied_index: u64,
    pub supported_version: u32,
    /// Database time minus `heartbeat_ms`.
    pub age_ms: i64,
}

impl NodeRow {
    /// Whether the node stopped cleanly: it expired its own heartbeat on the way out
    /// (`expire_heartbeat` sets it to 0), and has not heartbeated since.
    pub fn stopped_cleanly(&self) -> bool {
        self.heartbeat_ms == 0
    }
}

/// Errors of a store operation, classed by what the caller can do about them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another writer took the index this append computed. Retry: the next attempt computes a
    /// new one.
    #[error("another writer appended at the same index")]
    AppendConflict,
    /// The database could not be reached, or the connection broke. For writes the outcome is
    /// unknown: the statement may or may not have committed. Retry.
    #[error("metadata database unavailable: {0}")]
    Unavailable(String),
    /// The database refused the statement (schema, permissions, constraint). Retrying the
    /// same statement is unlikely to help, but the sink keeps trying with backoff and alarms.
    #[error("metadata database error: {0}")]
    Database(String),
}

impl StoreError {
    pub fn is_retriable(&self) -> bool {
        !matches!(self, StoreError::Database(_))
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// The command log's tables on one SQL database.
///
/// Contract (every implementation; checked by the conformance suite in `tests/`):
/// - Every operation is one transaction. A write either commits whole or not at all; when the
///   connection breaks after COMMIT was sent, the call returns [`StoreError::Unavailable`] and
///   the caller must treat the outcome as unknown.
/// - `append` computes the new index inside the INSERT as `MAX(idx) + 1` (1 for an empty log).
///   Two concurrent appends never both succeed at one index: the loser gets
///   [`StoreError::AppendConflict`] and nothing is written. The index is never taken from a
///   sequence, an identity column, or the caller.
/// - `read_after` returns committed rows with `idx > after`, ascending, bounded in rows and
///   bytes. Rows are never modified once written; they disappear only through `truncate`.
/// - `store_snapshot` writes only if the stored snapshot's index is lower (compare-and-set on a
///   rising index) and says whether it wrote; `truncate(up_to)` deletes rows with
///   `idx <= up_to` that are also at or below the stored snapshot's index, and never the newest
///   row, so `MAX(idx)` (and therefore the next index) survives truncation.
/// - Times (`now_ms`, heartbeats, lease expiry) come from the database's clock, in
///   milliseconds since the Unix epoch, so nodes with skewed clocks agree.
/// - Lease: `acquire_lease` grants or renews the single lease row to `(node_id, node_epoch)`
///   when it has lapsed, that node-epoch already holds it, or an earlier epoch of the same node
///   holds it (a restarted node has fenced its previous life by registering again, so it takes
///   the lease back at once instead of waiting out the TTL); it sets the expiry to now + ttl
///   and raises `term` when the holder changes. It returns `None` when someone else holds it.
/// - Heartbeats: `heartbeat` upserts the node's row with the database's now; a row is never
///   overwritten by an older node epoch. `expire_heartbeat` marks the row dead (age = now).
#[async_trait]
pub trait LogStore: Debug + Send + Sync + 'static {
    /// Appends one row; returns its index.
    async fn append(&self, payload: &[u8]) -> StoreResult<u64>;

    /// Rows with `idx > after`, ascending: at most `max_rows`, and no more rows once
    /// `max_bytes` of payload are reached (the first row is returned whatever its size).
    async fn read_after(
        &self,
        after: u64,
        max_rows: u32,
        max_bytes: u64,
    ) -> StoreResult<Vec<LogRow>>;

    /// `(MIN(idx), MAX(idx))`, or `None` for an empty log.
    async fn log_bounds(&self) -> StoreResult<Option<(u64, u64)>>;

    async fn load_snapshot(&self) -> StoreResult<Option<SnapshotRow>>;

    /// Writes the snapshot if its index is above the stored one. Returns whether it wrote.
    async fn store_snapshot(&self, applied_index: u64, payload: &[u8]) -> StoreResult<bool>;

    /// Deletes rows at or below `up_to` (and at or below the snapshot index), never the newest.
    /// Returns how many rows it deleted.
    async fn truncate(&self, up_to: u64) -> StoreResult<u64>;

    /// The database's clock.
    async fn now_ms(&self) -> StoreResult<i64>;

    async fn acquire_lease(
        &self,
        node_id: u64,
        node_epoch: u64,
        ttl_ms: i64,
    ) -> StoreResult<Option<LeaseGrant>>;

    /// Lets the lease lapse now, if `(node_id, node_epoch)` holds it.
    async fn release_lease(&self, node_id: u64, node_epoch: u64) -> StoreResult<()>;

    async fn read_lease(&self) -> StoreResult<LeaseRow>;

    async fn heartbeat(&self, heartbeat: &Heartbeat) -> StoreResult<()>;

    async fn expire_heartbeat(&self, node_id: u64, node_epoch: u64) -> StoreResult<()>;

    async fn nodes(&self) -> StoreResult<Vec<NodeRow>>;

    /// Inserts a row at an explicit index, bypassing `append`'s rules. Only for tests that need
    /// to plant a corrupt row or a hole; the sink never calls it.
    async fn insert_raw(&self, index: u64, payload: &[u8]) -> StoreResult<()>;
}

/// Classifies an sqlx error; `transient_code` says whether a database error code means
/// "try again" in the backend's dialect.
pub(crate) fn classify_with(e: &sqlx::Error, transient_code: fn(&str) -> bool) -> StoreError {
    match e {
        sqlx::Error::Database(db) => {
            if matches!(db.kind(), sqlx::error::ErrorKind::UniqueViolation) {
                return StoreError::AppendConflict;
            }
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            if transient_code(&code) {
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Database(e.to_string())
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
        _ => StoreError::Database(e.to_string()),
    }
}

/// Collects streamed `(idx, payload)` rows until `max_bytes` of payload have been read
/// (the row that crosses the budget is kept, so at least one row comes back).
pub(crate) async fn collect_rows(
    mut rows: impl futures::Stream<Item = Result<(i64, Vec<u8>), sqlx::Error>> + Unpin,
    max_bytes: u64,
    classify: fn(sqlx::Error) -> StoreError,
) -> StoreResult<Vec<LogRow>> {
    use futures::TryStreamExt as _;
    let mut out = Vec::new();
    let mut bytes = 0u64;
    while let Some((index, payload)) = rows.try_next().await.map_err(classify)? {
        bytes += payload.len() as u64;
        out.push(LogRow {
            index: to_u64(index),
            payload,
        });
        if bytes >= max_bytes {
            break;
        }
    }
    Ok(out)
}

/// Database integers are signed; ours are not.
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}
