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

pub use config::{BeforeRegister, BeforeRegisterFn, Refusal, SinkConfig};
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
            "unsupported metadata URL {:?}: use sqlite::memory:, sqlite://<path> or postgres://...",
            redact_url(url)
        )))
    }
}

/// `url` with its secrets replaced by `***`: a password in its user info, and the values of
/// query parameters that name a secret, password or token. Printed settings end up in logs.
pub fn redact_url(url: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut out = match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            match authority.rsplit_once('@') {
                Some((user_info, host)) => match user_info.split_once(':') {
                    Some((user, _)) => format!("{scheme}://{user}:***@{host}{path}"),
                    None => base.to_string(),
                },
                None => base.to_string(),
            }
        }
        None => base.to_string(),
    };
    if !query.is_empty() {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _))
                    if ["secret", "password", "token"]
                        .iter()
                        .any(|s| key.to_ascii_lowercase().contains(s)) =>
                {
                    format!("{key}=***")
                }
                _ => pair.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn printed_settings_hide_their_secrets() {
        assert_eq!(
            redact_url("postgres://mink:mink@db:5432/mink?sslmode=require"),
            "postgres://mink:***@db:5432/mink?sslmode=require"
        );
        assert_eq!(
            redact_url(
                "s3://b/p?endpoint=http://s3:9000&access_key_id=k&secret_access_key=s&session_token=t"
            ),
            "s3://b/p?endpoint=http://s3:9000&access_key_id=k&secret_access_key=***&session_token=***"
        );
        for plain in [
            "postgres://mink@db/mink",
            "sqlite:///x/m.db",
            "/data/objects",
        ] {
            assert_eq!(redact_url(plain), plain);
        }
    }
}
