//! The statements an engine is running: what `system.queries` lists and what a cancel stops.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mink_metadata::Clock as _;

/// One running statement.
#[derive(Clone, Debug)]
pub struct RunningQuery {
    pub id: u64,
    pub sql: String,
    /// Who runs it: `flight sql`, `cli`.
    pub source: &'static str,
    pub started_at_ms: i64,
    pub started: Instant,
    /// The Flight SQL statement handle it runs under.
    pub handle: Option<String>,
    /// Stops its stream (a Flight SQL statement).
    pub cancel: Option<futures::stream::AbortHandle>,
}

/// The running statements of an engine (shared by its forks).
#[derive(Debug, Default)]
pub struct Queries {
    next: AtomicU64,
    running: Mutex<BTreeMap<u64, RunningQuery>>,
}

impl Queries {
    /// Records `sql` as running until the returned guard is dropped.
    pub fn track(
        self: &Arc<Self>,
        sql: &str,
        source: &'static str,
        handle: Option<String>,
        cancel: Option<futures::stream::AbortHandle>,
    ) -> QueryGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        // Shown to users as when the statement started: the system's clock, read where Mink
        // reads it.
        let started_at_ms = i64::try_from(mink_metadata::SystemClock.now_ms()).unwrap_or(i64::MAX);
        self.running.lock().expect("queries").insert(
            id,
            RunningQuery {
                id,
                sql: sql.to_string(),
                source,
                started_at_ms,
                started: Instant::now(),
                handle,
                cancel,
            },
        );
        QueryGuard {
            queries: Arc::clone(self),
            id,
        }
    }

    /// Stops the statement running under Flight SQL handle `handle`; whether one was.
    pub fn cancel(&self, handle: &str) -> bool {
        let running = self.running.lock().expect("queries");
        let found = running
            .values()
            .find(|q| q.handle.as_deref() == Some(handle))
            .and_then(|q| q.cancel.clone());
        found.map(|c| c.abort()).is_some()
    }

    pub fn running(&self) -> Vec<RunningQuery> {
        self.running
            .lock()
            .expect("queries")
            .values()
            .cloned()
            .collect()
    }
}

/// Removes its statement from the running ones when dropped (the statement ended, failed or
/// its reader went away).
#[derive(Debug)]
pub struct QueryGuard {
    queries: Arc<Queries>,
    id: u64,
}

impl QueryGuard {
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for QueryGuard {
    fn drop(&mut self) {
        self.queries
            .running
            .lock()
            .expect("queries")
            .remove(&self.id);
    }
}
