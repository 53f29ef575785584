//! The metadata command log on SQL: Mink's only ordering point.
//!
//! Nodes propose [`Command`](mink_metadata::Command)s to their [`Sink`]; the sink group-commits
//! them into rows of `meta_log` (index computed by the database as `MAX(idx)+1`), tails the log,
//! applies every row to the same state, and publishes a [`View`](mink_metadata::View). Readers
//! never query SQL. The lease holder snapshots the state into `meta_snapshot` and truncates the
//! log behind it; heartbeats in `meta_node` tell who is alive.
//!
//! Backends: [`SqliteStore`] (one node; a file, or `sqlite::memory:` for tests) and
//! [`PostgresStore`] (a cluster). Both implement [`LogStore`], whose contract the conformance
//! suite in `tests/` checks on each of them. [`FaultyStore`] injects faults around either.

mod config;
mod error;
mod faults;
mod lease;
mod postgres;
mod sink;
mod sqlite;
mod store;

use std::sync::Arc;

pub use config::SinkConfig;
pub use error::SinkError;
pub use faults::{Dice, Faults, FaultyStore};
pub use lease::LeaseStatus;
pub use postgres::PostgresStore;
pub use sink::{Proposed, Sink, SinkStats, Submitted, load_view};
pub use sqlite::SqliteStore;
pub use store::*;

/// Opens the store a URL names: `sqlite::memory:`, `sqlite://path/to/meta.db` (created if
/// missing) or `postgres://user@host:port/database`. Applies the migrations.
pub async fn connect(url: &str) -> StoreResult<Arc<dyn LogStore>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::connect(url).await?))
    } else {
        Err(StoreError::Database(format!(
            "unsupported metadata URL {url:?}: use sqlite::memory:, sqlite://<path> or postgres://..."
        )))
    }
}
