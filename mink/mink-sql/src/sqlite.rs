//! The command log on SQLite: a file (one node, durable) or `sqlite::memory:` (tests).
//!
//! Writers use `BEGIN IMMEDIATE`, so a write transaction takes the write lock before it reads
//! `MAX(idx)`: two writers never compute the same index, and WAL readers never block them.
//! Files run in WAL mode with `synchronous=FULL`: a committed row survives power loss.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::store::*;

/// SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes.
fn transient(code: &str) -> bool {
    code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6))
}

// By value, to fit `map_err`.
#[allow(clippy::needless_pass_by_value)]
fn classify(e: sqlx::Error) -> StoreError {
    classify_with(&e, transient)
}

/// A caller cancelled between `BEGIN IMMEDIATE` and the `Transaction` guard existing leaves the
/// connection inside a transaction that holds the database's write lock. Such a connection is
/// closed instead of returned to the pool; closing it rolls the transaction back.
fn close_if_in_transaction(
    conn: &mut sqlx::SqliteConnection,
    _: sqlx::pool::PoolConnectionMetadata,
) -> futures::future::BoxFuture<'_, Result<bool, sqlx::Error>> {
    let keep = !sqlx::Connection::is_in_transaction(conn);
    Box::pin(async move { Ok(keep) })
}

const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// [`LogStore`] on SQLite.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// In memory: an idle connection that keeps the database alive while the pool replaces
    /// its connection (sqlx closes a connection whose query was cancelled midway).
    _keeper: Option<SqlitePool>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite:///path/meta.db`,
    /// `sqlite://relative.db` or `sqlite::memory:`) and applies the migrations.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let options = SqliteConnectOptions::from_str(url).map_err(classify)?;
        Self::connect_with(options).await
    }

    pub async fn connect_with(options: SqliteConnectOptions) -> StoreResult<Self> {
        let in_memory = options
            .get_filename()
            .to_string_lossy()
            .starts_with("file:sqlx-in-memory")
            || options.get_filename().as_os_str() == ":memory:";
        let options = options
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(10))
            .synchronous(SqliteSynchronous::Full);
        let one = || {
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .after_release(close_if_in_transaction)
        };
        let keeper = if in_memory {
            Some(
                one()
                    .connect_with(options.clone())
                    .await
                    .map_err(classify)?,
            )
        } else {
            None
        };
        let pool = if in_memory {
            // One working connection, so shared-cache table locks (which ignore
            // busy_timeout) never arise.
            one().connect_with(options).await
        } else {
            SqlitePoolOptions::new()
                .max_connections(4)
                .after_release(close_if_in_transaction)
                .connect_with(options.journal_mode(SqliteJournalMode::Wal))
                .await
        }
        .map_err(classify)?;
        let mut attempt = 0;
        loop {
            match sqlx::migrate!("./migrations/sqlite").run(&pool).await {
                Ok(()) => break,
                // Another process may be migrating the same file right now.
                Err(e) if attempt < 5 => {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, "retrying SQLite migration");
                    tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                }
                Err(e) => return Err(StoreError::Database(format!("migration failed: {e}"))),
            }
        }
        Ok(SqliteStore {
            pool,
            _keeper: keeper,
        })
    }

    /// `PRAGMA synchronous` of the pool's connections (2 = FULL).
    pub async fn synchronous(&self) -> StoreResult<i64> {
        sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&self.pool)
            .await
            .map_err(classify)
    }

    /// An UPDATE of the lease or a node row, conditioned on `(node_id, node_epoch)`.
    async fn update_node_row(
        &self,
        sql: &'static str,
        node_id: u64,
        node_epoch: u64,
    ) -> StoreResult<()> {
        self.write(move |mut tx| async move {
            sqlx::query(sql)
                .bind(to_i64(node_id))
                .bind(to_i64(node_epoch))
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
            Ok(((), tx))
        })
        .await
    }

    /// Runs one write transaction: `BEGIN IMMEDIATE`, the body, COMMIT.
    async fn write<T, F, Fut>(&self, body: F) -> StoreResult<T>
    where
        F: FnOnce(sqlx::Transaction<'static, sqlx::Sqlite>) -> Fut,
        Fut: Future<Output = StoreResult<(T, sqlx::Transaction<'static, sqlx::Sqlite>)>>,
    {
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(classify)?;
        let (value, tx) = body(tx).await?;
        tx.commit().await.map_err(classify)?;
        Ok(value)
    }
}

#[async_trait]
impl LogStore for SqliteStore {
    async fn append(&self, payload: &[u8]) -> StoreResult<u64> {
        let payload = payload.to_vec();
        self.write(|mut tx| async move {
            let idx: i64 = sqlx::query_scalar(
                "INSERT INTO meta_log (idx, payload) \
                 SELECT COALESCE(MAX(idx), 0) + 1, ? FROM meta_log RETURNING idx",
            )
            .bind(payload)
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
            Ok((to_u64(idx), tx))
        })
        .await
    }

    async fn read_after(
        &self,
        after: u64,
        max_rows: u32,
        max_bytes: u64,
    ) -> StoreResult<Vec<LogRow>> {
        // Streamed, so that rows past the byte budget are never held in memory.
        let rows = sqlx::query_as::<_, (i64, Vec<u8>)>(
            "SELECT idx, payload FROM meta_log WHERE idx > ? ORDER BY idx LIMIT ?",
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
        let payload = payload.to_vec();
        self.write(move |mut tx| async move {
            let written = sqlx::query(
                "INSERT INTO meta_snapshot (id, applied_idx, payload) VALUES (1, ?, ?) \
                 ON CONFLICT (id) DO UPDATE SET applied_idx = excluded.applied_idx, \
                 payload = excluded.payload WHERE meta_snapshot.applied_idx < excluded.applied_idx",
            )
            .bind(to_i64(applied_index))
            .bind(payload)
            .execute(&mut *tx)
            .await
            .map_err(classify)?
            .rows_affected();
            Ok((written == 1, tx))
        })
        .await
    }

    async fn truncate(&self, up_to: u64) -> StoreResult<u64> {
        self.write(move |mut tx| async move {
            let deleted = sqlx::query(
                "DELETE FROM meta_log WHERE idx <= ? \
                 AND idx < (SELECT MAX(idx) FROM meta_log) \
                 AND idx <= (SELECT COALESCE(MAX(applied_idx), 0) FROM meta_snapshot)",
            )
            .bind(to_i64(up_to))
            .execute(&mut *tx)
            .await
            .map_err(classify)?
            .rows_affected();
            Ok((deleted, tx))
        })
        .await
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
        self.write(move |mut tx| async move {
            let row: Option<(i64, i64)> = sqlx::query_as(&format!(
                "UPDATE meta_lease SET \
                   term = CASE WHEN node_id = ?1 AND node_epoch = ?2 THEN term ELSE term + 1 END, \
                   node_id = ?1, node_epoch = ?2, expires_at_ms = {NOW_MS} + ?3 \
                 WHERE id = 1 AND (expires_at_ms <= {NOW_MS} OR (node_id = ?1 AND node_epoch <= ?2)) \
                 RETURNING term, expires_at_ms"
            ))
            .bind(to_i64(node_id))
            .bind(to_i64(node_epoch))
            .bind(ttl_ms)
            .fetch_optional(&mut *tx)
            .await
            .map_err(classify)?;
            let grant = row.map(|(term, expires_at_ms)| LeaseGrant {
                term: to_u64(term),
                expires_at_ms,
            });
            Ok((grant, tx))
        })
        .await
    }

    async fn release_lease(&self, node_id: u64, node_epoch: u64) -> StoreResult<()> {
        self.update_node_row(
            "UPDATE meta_lease SET expires_at_ms = 0 WHERE id = 1 AND node_id = ? AND node_epoch = ?",
            node_id,
            node_epoch,
        )
        .await
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
        let hb = *hb;
        self.write(move |mut tx| async move {
            sqlx::query(&format!(
                "INSERT INTO meta_node (node_id, node_epoch, heartbeat_ms, applied_idx, supported_version) \
                 VALUES (?, ?, {NOW_MS}, ?, ?) \
                 ON CONFLICT (node_id) DO UPDATE SET node_epoch = excluded.node_epoch, \
                   heartbeat_ms = excluded.heartbeat_ms, applied_idx = excluded.applied_idx, \
                   supported_version = excluded.supported_version \
                 WHERE meta_node.node_epoch <= excluded.node_epoch"
            ))
            .bind(to_i64(hb.node_id))
            .bind(to_i64(hb.node_epoch))
            .bind(to_i64(hb.applied_index))
            .bind(i64::from(hb.supported_version))
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
            Ok(((), tx))
        })
        .await
    }

    async fn expire_heartbeat(&self, node_id: u64, node_epoch: u64) -> StoreResult<()> {
        self.update_node_row(
            "UPDATE meta_node SET heartbeat_ms = 0 WHERE node_id = ? AND node_epoch = ?",
            node_id,
            node_epoch,
        )
        .await
    }

    async fn nodes(&self) -> StoreResult<Vec<NodeRow>> {
        let rows: Vec<(i64, i64, i64, i64, i64, i64)> = sqlx::query_as(&format!(
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
        let payload = payload.to_vec();
        self.write(move |mut tx| async move {
            sqlx::query("INSERT INTO meta_log (idx, payload) VALUES (?, ?)")
                .bind(to_i64(index))
                .bind(payload)
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
            Ok(((), tx))
        })
        .await
    }
}
