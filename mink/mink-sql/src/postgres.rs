//! The command log on Postgres, shared by every node of a cluster.
//!
//! Appends run under READ COMMITTED: two nodes may compute the same `MAX(idx) + 1`; the primary
//! key lets exactly one of them commit, and the other gets a unique violation (reported as
//! [`StoreError::AppendConflict`]) and retries at the next index.

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::store::*;

/// Class 08 (connection), 53 (resources), 57P (shutdown, cannot connect now), and
/// serialization failures and deadlocks.
fn transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P")
        || code == "40001"
        || code == "40P01"
}

// By value, to fit `map_err`.
#[allow(clippy::needless_pass_by_value)]
fn classify(e: sqlx::Error) -> StoreError {
    classify_with(&e, transient)
}

const NOW_MS: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// [`LogStore`] on Postgres.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/db`) and applies the migrations.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let options = PgConnectOptions::from_str(url).map_err(classify)?;
        Self::connect_with(options).await
    }

    /// Connects with explicit options (for example a `search_path` that puts the tables in
    /// their own schema).
    pub async fn connect_with(options: PgConnectOptions) -> StoreResult<Self> {
        // The pool retries a connection that fails until its acquire timeout (30 s), then says
        // only "pool timed out": one connection first names why (refused, unknown host, bad
        // password), at once.
        {
            use sqlx::{ConnectOptions as _, Connection as _};
            let first = options.connect().await.map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot connect to PostgreSQL at {}:{}: {e}",
                    options.get_host(),
                    options.get_port()
                ))
            })?;
            let _ = first.close().await;
        }
        // A query waiting for a connection while PostgreSQL is down retries connecting with a
        // backoff that doubles up to a fifth of this timeout: at sqlx's default 30 s, writes
        // went on up to 6 s after PostgreSQL was back. At 5 s a restarted PostgreSQL is found
        // within a second, and a call that times out is retried by the sink's own backoff.
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(classify)?;
        sqlx::migrate!("./migrations/postgres")
            .run(&pool)
            .await
            .map_err(|e| StoreError::Database(format!("migration failed: {e}")))?;
        Ok(PostgresStore { pool })
    }
}

#[async_trait]
impl LogStore for PostgresStore {
    async fn append(&self, payload: &[u8]) -> StoreResult<u64> {
        let idx: i64 = sqlx::query_scalar(
            "INSERT INTO meta_log (idx, payload) \
             SELECT COALESCE(MAX(idx), 0) + 1, $1 FROM meta_log RETURNING idx",
        )
        .bind(payload)
        .fetch_one(&self.pool)
        .await
        .map_err(classify)?;
        Ok(to_u64(idx))
    }

    async fn read_after(
        &self,
        after: u64,
        max_rows: u32,
        max_bytes: u64,
    ) -> StoreResult<Vec<LogRow>> {
        // Streamed, so that rows past the byte budget are never held in memory.
        let rows = sqlx::query_as::<_, (i64, Vec<u8>)>(
            "SELECT idx, payload FROM meta_log WHERE idx > $1 ORDER BY idx LIMIT $2",
        )
        .bind(to_i64(after))
        .bind(i64::from(max_rows))
        .fetch(&self.pool);
        collect_rows(rows, max_bytes, classify).await
    }

    async fn log_bounds(&self) -> StoreResult<Option<(u64, u64)>> {
        let (min, max): (Option<i64>, Option<i64>) =
            sqlx::query_as("SELECT MIN(idx), MAX(idx) FROM meta_log")
                .fetch_one(&self.pool)
                .await
                .map_err(classify)?;
        Ok(min.zip(max).map(|(a, b)| (to_u64(a), to_u64(b))))
    }

    async fn load_snapshot(&self) -> StoreResult<Option<SnapshotRow>> {
        let row: Option<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT applied_idx, payload FROM meta_snapshot WHERE id = 1")
                .fetch_optional(&self.pool)
                .await
                .map_err(classify)?;
        Ok(row.map(|(i, payload)| SnapshotRow {
            applied_index: to_u64(i),
            payload,
        }))
    }

    async fn store_snapshot(&self, applied_index: u64, payload: &[u8]) -> StoreResult<bool> {
        let written = sqlx::query(
            "INSERT INTO meta_snapshot (id, applied_idx, payload) VALUES (1, $1, $2) \
             ON CONFLICT (id) DO UPDATE SET applied_idx = EXCLUDED.applied_idx, \
             payload = EXCLUDED.payload WHERE meta_snapshot.applied_idx < EXCLUDED.applied_idx",
        )
        .bind(to_i64(applied_index))
        .bind(payload)
        .execute(&self.pool)
        .await
        .map_err(classify)?
        .rows_affected();
        Ok(written == 1)
    }

    async fn truncate(&self, up_to: u64) -> StoreResult<u64> {
        let deleted = sqlx::query(
            "DELETE FROM meta_log WHERE idx <= $1 \
             AND idx < (SELECT MAX(idx) FROM meta_log) \
             AND idx <= (SELECT COALESCE(MAX(applied_idx), 0) FROM meta_snapshot)",
        )
        .bind(to_i64(up_to))
        .execute(&self.pool)
        .await
        .map_err(classify)?
        .rows_affected();
        Ok(deleted)
    }

    async fn now_ms(&self) -> StoreResult<i64> {
        sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
            .fetch_one(&self.pool)
            .await
            .map_err(classify)
    }

    async fn acquire_lease(
        &self,
        node_id: u64,
        node_epoch: u64,
        ttl_ms: i64,
    ) -> StoreResult<Option<LeaseGrant>> {
        let row: Option<(i64, i64)> = sqlx::query_as(&format!(
            "UPDATE meta_lease SET \
               term = CASE WHEN node_id = $1 AND node_epoch = $2 THEN term ELSE term + 1 END, \
               node_id = $1, node_epoch = $2, expires_at_ms = {NOW_MS} + $3 \
             WHERE id = 1 AND (expires_at_ms <= {NOW_MS} OR (node_id = $1 AND node_epoch <= $2)) \
             RETURNING term, expires_at_ms"
        ))
        .bind(to_i64(node_id))
        .bind(to_i64(node_epoch))
        .bind(ttl_ms)
        .fetch_optional(&self.pool)
        .await
        .map_err(classify)?;
        Ok(row.map(|(term, expires_at_ms)| LeaseGrant {
            term: to_u64(term),
            expires_at_ms,
        }))
    }

    async fn release_lease(&self, node_id: u64, node_epoch: u64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE meta_lease SET expires_at_ms = 0 WHERE id = 1 AND node_id = $1 AND node_epoch = $2",
        )
        .bind(to_i64(node_id))
        .bind(to_i64(node_epoch))
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        Ok(())
    }

    async fn read_lease(&self) -> StoreResult<LeaseRow> {
        let (node_id, node_epoch, term, expires_at_ms, now_ms): (i64, i64, i64, i64, i64) =
            sqlx::query_as(&format!(
                "SELECT node_id, node_epoch, term, expires_at_ms, {NOW_MS} FROM meta_lease WHERE id = 1"
            ))
            .fetch_one(&self.pool)
            .await
            .map_err(classify)?;
        Ok(LeaseRow {
            node_id: to_u64(node_id),
            node_epoch: to_u64(node_epoch),
            term: to_u64(term),
            expires_at_ms,
            now_ms,
        })
    }

    async fn heartbeat(&self, hb: &Heartbeat) -> StoreResult<()> {
        sqlx::query(&format!(
            "INSERT INTO meta_node (node_id, node_epoch, heartbeat_ms, applied_idx, supported_version) \
             VALUES ($1, $2, {NOW_MS}, $3, $4) \
             ON CONFLICT (node_id) DO UPDATE SET node_epoch = EXCLUDED.node_epoch, \
               heartbeat_ms = EXCLUDED.heartbeat_ms, applied_idx = EXCLUDED.applied_idx, \
               supported_version = EXCLUDED.supported_version \
             WHERE meta_node.node_epoch <= EXCLUDED.node_epoch"
        ))
        .bind(to_i64(hb.node_id))
        .bind(to_i64(hb.node_epoch))
        .bind(to_i64(hb.applied_index))
        .bind(i32::try_from(hb.supported_version).unwrap_or(i32::MAX))
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        Ok(())
    }

    async fn expire_heartbeat(&self, node_id: u64, node_epoch: u64) -> StoreResult<()> {
        sqlx::query("UPDATE meta_node SET heartbeat_ms = 0 WHERE node_id = $1 AND node_epoch = $2")
            .bind(to_i64(node_id))
            .bind(to_i64(node_epoch))
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn nodes(&self) -> StoreResult<Vec<NodeRow>> {
        let rows: Vec<(i64, i64, i64, i64, i32, i64)> = sqlx::query_as(&format!(
            "SELECT node_id, node_epoch, heartbeat_ms, applied_idx, supported_version, \
             {NOW_MS} - heartbeat_ms FROM meta_node ORDER BY node_id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        Ok(rows
            .into_iter()
            .map(|(id, epoch, hb, applied, version, age)| NodeRow {
                node_id: to_u64(id),
                node_epoch: to_u64(epoch),
                heartbeat_ms: hb,
                applied_index: to_u64(applied),
                supported_version: u32::try_from(version).unwrap_or(0),
                age_ms: age,
            })
            .collect())
    }

    async fn insert_raw(&self, index: u64, payload: &[u8]) -> StoreResult<()> {
        sqlx::query("INSERT INTO meta_log (idx, payload) VALUES ($1, $2)")
            .bind(to_i64(index))
            .bind(payload)
            .execute(&self.pool)
            .await
            .map_err(classify)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::PostgresStore;
    use crate::StoreError;

    /// A database that cannot be reached is named with the reason (the pool alone says only
    /// "pool timed out", after its acquire timeout).
    #[tokio::test]
    async fn an_unreachable_database_is_named_with_why() {
        // A port nothing listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("postgres://mink@127.0.0.1:{port}/mink");
        let Err(StoreError::Unavailable(e)) = PostgresStore::connect(&url).await else {
            panic!("connected to nothing at {url}");
        };
        assert!(
            e.contains(&format!("127.0.0.1:{port}")) && e.to_lowercase().contains("refused"),
            "{e}"
        );
    }
}
