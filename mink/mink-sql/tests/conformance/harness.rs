//! One suite, every backend: each scenario is an `async fn(TestDb)`, and [`conformance!`]
//! generates one test per backend for it. Postgres tests each get their own schema, so they
//! share one server (started by scripts/test.sh and passed in `MINK_TEST_POSTGRES_URL`).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use mink_metadata::*;
use mink_sql::*;
use sqlx::postgres::PgConnectOptions;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    SqliteFile,
    SqliteMemory,
    Postgres,
}

/// A fresh, empty database for one test.
pub struct TestDb {
    pub backend: Backend,
    /// Keeps the SQLite file alive for the test's duration.
    _dir: Option<tempfile::TempDir>,
    sqlite_url: Option<String>,
    pg_options: Option<PgConnectOptions>,
    /// `sqlite::memory:` lives in one connection: every "open" shares it.
    memory: Option<Arc<dyn LogStore>>,
    /// A URL/schema description another process can open.
    pub locator: String,
}

pub fn postgres_url() -> Option<String> {
    match std::env::var("MINK_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "CI=true but MINK_TEST_POSTGRES_URL is not set: run the suite with scripts/test.sh"
            )
        }
        _ => None,
    }
}

impl TestDb {
    /// `None` when the backend is not available here (Postgres outside CI without a server).
    pub async fn new(backend: Backend) -> Option<TestDb> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("MINK_TEST_LOG")
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        match backend {
            Backend::SqliteFile => {
                let dir = tempfile::tempdir().expect("tempdir");
                let url = format!("sqlite://{}", dir.path().join("meta.db").display());
                Some(TestDb {
                    backend,
                    _dir: Some(dir),
                    sqlite_url: Some(url.clone()),
                    pg_options: None,
                    memory: None,
                    locator: url,
                })
            }
            Backend::SqliteMemory => {
                let store: Arc<dyn LogStore> = Arc::new(
                    SqliteStore::connect("sqlite::memory:")
                        .await
                        .expect("memory"),
                );
                Some(TestDb {
                    backend,
                    _dir: None,
                    sqlite_url: None,
                    pg_options: None,
                    memory: Some(store),
                    locator: "sqlite::memory:".to_string(),
                })
            }
            Backend::Postgres => {
                let url = postgres_url()?;
                let schema = format!("t_{:016x}", rand::random::<u64>());
                let mut conn: sqlx::PgConnection = sqlx::Connection::connect(&url)
                    .await
                    .expect("connect postgres");
                sqlx::query(&format!("CREATE SCHEMA {schema}"))
                    .execute(&mut conn)
                    .await
                    .expect("create schema");
                let options = PgConnectOptions::from_str(&url)
                    .expect("postgres url")
                    .options([("search_path", schema.as_str())]);
                Some(TestDb {
                    backend,
                    _dir: None,
                    sqlite_url: None,
                    pg_options: Some(options),
                    memory: None,
                    locator: format!("{url}#{schema}"),
                })
            }
        }
    }

    pub fn multi_node(&self) -> bool {
        self.backend != Backend::SqliteMemory
    }

    /// A new store on this database, with its own connections (except in memory).
    pub async fn store(&self) -> Arc<dyn LogStore> {
        if let Some(store) = &self.memory {
            return Arc::clone(store);
        }
        if let Some(url) = &self.sqlite_url {
            return Arc::new(SqliteStore::connect(url).await.expect("open sqlite"));
        }
        let options = self.pg_options.clone().expect("postgres options");
        Arc::new(
            PostgresStore::connect_with(options)
                .await
                .expect("open postgres"),
        )
    }

    /// A store wrapped in fault injection.
    pub async fn faulty_store(&self, faults: &Arc<Faults>) -> Arc<dyn LogStore> {
        Arc::new(FaultyStore::new(self.store().await, Arc::clone(faults)))
    }
}

/// Opens the database another process described with [`TestDb::locator`].
pub async fn open_locator(locator: &str) -> Arc<dyn LogStore> {
    if let Some((url, schema)) = locator.split_once('#') {
        let options = PgConnectOptions::from_str(url)
            .expect("postgres url")
            .options([("search_path", schema)]);
        Arc::new(PostgresStore::connect_with(options).await.expect("open"))
    } else {
        connect(locator).await.expect("open")
    }
}

/// Intervals short enough for tests to run in seconds.
pub fn config(node_id: u64) -> SinkConfig {
    let mut c = SinkConfig::new(node_id);
    c.address = format!("127.0.0.1:{}", 9000 + node_id);
    c.lease_ttl = Duration::from_millis(1000);
    c.tail_poll_interval = Duration::from_millis(5);
    c.max_backoff = Duration::from_millis(100);
    c
}

/// A node that proposes nothing on its own (no lease: no coordinator registration, no
/// snapshots, no version upgrades), for tests that plant rows in the log by hand.
pub fn quiet(node_id: u64) -> SinkConfig {
    let mut c = config(node_id);
    c.lease_enabled = false;
    c
}

pub async fn start(db: &TestDb, config: SinkConfig) -> Sink {
    let store = db.store().await;
    Sink::start(store, config).await.expect("start sink")
}

/// Polls `check` until it holds, failing the test after `limit`.
pub async fn eventually<F: FnMut() -> bool>(what: &str, limit: Duration, mut check: F) {
    let deadline = tokio::time::Instant::now() + limit;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn ok(sink: &Sink, command: Command) -> (u64, Outcome) {
    let name = command.name();
    let p = sink.propose(command).await.expect("propose");
    match p.result {
        Ok(outcome) => (p.index, outcome),
        Err(e) => panic!("{name} rejected: {e}"),
    }
}

pub fn put(key: &str, value: &str) -> Command {
    Command::PutKv(PutKv {
        key: key.to_string(),
        value: value.as_bytes().to_vec(),
    })
}

pub fn kv(view: &View, key: &str) -> Option<String> {
    view.state
        .kv
        .get(key)
        .map(|r| String::from_utf8_lossy(&r.value).into_owned())
}

/// Asserts that the sink's live state equals, byte for byte, what a cold start (snapshot + log)
/// computes at the same index.
pub async fn assert_same_as_cold_start(db: &TestDb, sink: &Sink) {
    let store = db.store().await;
    for _ in 0..50 {
        let cold = load_view(store.as_ref(), sink.config().supported_metadata_version)
            .await
            .expect("cold start");
        let live = sink.wait_applied(cold.applied_index).await.expect("live");
        if live.applied_index == cold.applied_index {
            assert_eq!(
                encode_snapshot(live.applied_index, &live.state),
                encode_snapshot(cold.applied_index, &cold.state),
                "live and cold-start states differ at {}",
                live.applied_index
            );
            return;
        }
    }
    panic!("the log kept moving; could not compare at one index");
}

/// Generates `mod $name { sqlite_file, [sqlite_memory,] postgres }` tests running the
/// scenario `$name(TestDb)`. `multi_node` scenarios skip `sqlite::memory:` (one node only).
macro_rules! conformance {
    ($name:ident) => {
        mod $name {
            crate::harness::conformance!(@case $name, sqlite_file, SqliteFile);
            crate::harness::conformance!(@case $name, sqlite_memory, SqliteMemory);
            crate::harness::conformance!(@case $name, postgres, Postgres);
        }
    };
    ($name:ident, multi_node) => {
        mod $name {
            crate::harness::conformance!(@case $name, sqlite_file, SqliteFile);
            crate::harness::conformance!(@case $name, postgres, Postgres);
        }
    };
    (@case $name:ident, $case:ident, $backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            let Some(db) =
                crate::harness::TestDb::new(crate::harness::Backend::$backend).await
            else {
                eprintln!("skipped: MINK_TEST_POSTGRES_URL is not set");
                return;
            };
            super::$name(db).await;
        }
    };
}
pub(crate) use conformance;
