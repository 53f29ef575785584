//! Fault injection around a real [`LogStore`]: the statements still run against the real
//! database; the wrapper decides whether the caller sees the connection drop before the
//! statement (nothing happened), after COMMIT (it happened, the caller cannot know), a
//! statement error, added latency, or a pause (every call hangs until resumed).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::store::*;

/// Knobs shared between a test and the [`FaultyStore`]s it wraps. All probabilities are per
/// mille and apply independently to each call.
#[derive(Debug)]
pub struct Faults {
    /// A write's connection drops before COMMIT reaches the database: the caller gets
    /// `Unavailable`, nothing was written.
    pub drop_before_commit: AtomicU32,
    /// A write commits, then the connection drops before the reply: the caller gets
    /// `Unavailable` although the write happened.
    pub drop_after_commit: AtomicU32,
    /// Any call (reads too) fails with a statement error before running.
    pub statement_error: AtomicU32,
    /// Added to every call, in microseconds.
    pub latency_us: AtomicU64,
    /// Unconditional: the next append commits and then reports a dropped connection.
    pub next_append_lost_after_commit: AtomicBool,
    /// Unconditional: the next append commits, then the store pauses (as if the process froze
    /// right after COMMIT) and the append reports a dropped connection once resumed.
    pub pause_after_next_append: AtomicBool,
    /// Like `pause_after_next_append`, for the next append whose row holds a
    /// `CommitStreamSetObject` (other rows, a lease or coordinator command, pass).
    pub pause_after_next_object_commit: AtomicBool,
    paused: watch::Sender<bool>,
    dice: Dice,
    /// Appends begun so far (waiting at a pause included).
    appends_begun: watch::Sender<u64>,
}

/// Seeded dice for fault injection, shared by the fault wrappers of the metadata store and the
/// object store: a fault with a chance in per mille, and a count of those injected.
#[derive(Debug)]
pub struct Dice {
    rng: Mutex<StdRng>,
    injected: AtomicU64,
}

impl Dice {
    pub fn new(seed: u64) -> Self {
        Dice {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            injected: AtomicU64::new(0),
        }
    }

    /// Whether a fault with a chance of `per_mille` in 1000 strikes now (counted if so).
    pub fn roll(&self, per_mille: &AtomicU32) -> bool {
        let p = per_mille.load(Ordering::Relaxed);
        if p == 0 {
            return false;
        }
        let hit = self
            .rng
            .lock()
            .expect("fault rng lock")
            .random_range(0..1000)
            < p;
        if hit {
            self.count();
        }
        hit
    }

    /// Counts a fault injected unconditionally.
    pub fn count(&self) {
        self.injected.fetch_add(1, Ordering::Relaxed);
    }

    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }
}

impl Faults {
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(Faults {
            drop_before_commit: AtomicU32::new(0),
            drop_after_commit: AtomicU32::new(0),
            statement_error: AtomicU32::new(0),
            latency_us: AtomicU64::new(0),
            next_append_lost_after_commit: AtomicBool::new(false),
            pause_after_next_append: AtomicBool::new(false),
            pause_after_next_object_commit: AtomicBool::new(false),
            paused: watch::channel(false).0,
            dice: Dice::new(seed),
            appends_begun: watch::channel(0).0,
        })
    }

    /// Every call from now on waits (before touching the database) until [`Faults::resume`].
    /// Models a process stopped by the scheduler, a GC pause, or a network partition.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    pub fn set(&self, drop_before_commit: u32, drop_after_commit: u32, statement_error: u32) {
        self.drop_before_commit
            .store(drop_before_commit, Ordering::Relaxed);
        self.drop_after_commit
            .store(drop_after_commit, Ordering::Relaxed);
        self.statement_error
            .store(statement_error, Ordering::Relaxed);
    }

    pub fn clear(&self) {
        self.set(0, 0, 0);
        self.latency_us.store(0, Ordering::Relaxed);
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.dice.injected()
    }

    /// Appends begun so far (those waiting at a pause included).
    pub fn appends_begun(&self) -> u64 {
        *self.appends_begun.borrow()
    }

    /// Returns once at least `n` appends have begun: a test's event for "the row reached the
    /// (paused) database".
    pub async fn appends_begun_reach(&self, n: u64) {
        let mut begun = self.appends_begun.subscribe();
        let _ = begun.wait_for(|&b| b >= n).await;
    }

    fn roll(&self, per_mille: &AtomicU32) -> bool {
        self.dice.roll(per_mille)
    }

    async fn gate(&self) -> StoreResult<()> {
        let mut paused = self.paused.subscribe();
        // The sender lives in `self`, so the wait ends only by a resume.
        let _ = paused.wait_for(|p| !*p).await;
        let latency = self.latency_us.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        if self.roll(&self.statement_error) {
            return Err(StoreError::Unavailable(
                "injected: statement failed".to_string(),
            ));
        }
        Ok(())
    }

    /// Runs a write under the before/after-commit faults.
    async fn write<T>(&self, op: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        self.gate().await?;
        if self.roll(&self.drop_before_commit) {
            return Err(StoreError::Unavailable(
                "injected: connection dropped before COMMIT".to_string(),
            ));
        }
        let result = op.await?;
        if self.roll(&self.drop_after_commit) {
            return Err(StoreError::Unavailable(
                "injected: connection dropped after COMMIT".to_string(),
            ));
        }
        Ok(result)
    }

    async fn read<T>(&self, op: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        self.gate().await?;
        op.await
    }
}

/// A [`LogStore`] that runs every call on `inner` under the shared [`Faults`].
#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Arc<dyn LogStore>,
    faults: Arc<Faults>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn LogStore>, faults: Arc<Faults>) -> Self {
        FaultyStore { inner, faults }
    }

    pub fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }
}

#[async_trait]
impl LogStore for FaultyStore {
    async fn append(&self, payload: &[u8]) -> StoreResult<u64> {
        self.faults.appends_begun.send_modify(|b| *b += 1);
        let index = self.faults.write(self.inner.append(payload)).await?;
        let object_commit = || {
            mink_metadata::decode_row(payload, mink_metadata::METADATA_VERSION).is_ok_and(|row| {
                row.commands
                    .iter()
                    .any(|c| matches!(c, mink_metadata::Command::CommitStreamSetObject(_)))
            })
        };
        let pause_here = self
            .faults
            .pause_after_next_append
            .swap(false, Ordering::Relaxed)
            || (self
                .faults
                .pause_after_next_object_commit
                .load(Ordering::Relaxed)
                && object_commit()
                && self
                    .faults
                    .pause_after_next_object_commit
                    .swap(false, Ordering::Relaxed));
        if pause_here {
            self.faults.pause();
            self.faults.gate().await?;
            self.faults.dice.count();
            return Err(StoreError::Unavailable(format!(
                "injected: paused after COMMIT of row {index}, connection dropped"
            )));
        }
        if self
            .faults
            .next_append_lost_after_commit
            .swap(false, Ordering::Relaxed)
        {
            self.faults.dice.count();
            return Err(StoreError::Unavailable(format!(
                "injected: connection dropped after COMMIT of row {index}"
            )));
        }
        Ok(index)
    }

    async fn read_after(
        &self,
        after: u64,
        max_rows: u32,
        max_bytes: u64,
    ) -> StoreResult<Vec<LogRow>> {
        self.faults
            .read(self.inner.read_after(after, max_rows, max_bytes))
            .await
    }

    async fn log_bounds(&self) -> StoreResult<Option<(u64, u64)>> {
        self.faults.read(self.inner.log_bounds()).await
    }

    async fn load_snapshot(&self) -> StoreResult<Option<SnapshotRow>> {
        self.faults.read(self.inner.load_snapshot()).await
    }

    async fn store_snapshot(&self, applied_index: u64, payload: &[u8]) -> StoreResult<bool> {
        self.faults
            .write(self.inner.store_snapshot(applied_index, payload))
            .await
    }

    async fn truncate(&self, up_to: u64) -> StoreResult<u64> {
        self.faults.write(self.inner.truncate(up_to)).await
    }

    async fn now_ms(&self) -> StoreResult<i64> {
        self.faults.read(self.inner.now_ms()).await
    }

    async fn acquire_lease(
        &self,
        node_id: u64,
        node_epoch: u64,
        ttl_ms: i64,
    ) -> StoreResult<Option<LeaseGrant>> {
        self.faults
            .write(self.inner.acquire_lease(node_id, node_epoch, ttl_ms))
            .await
    }

    async fn release_lease(&self, node_id: u64, node_epoch: u64) -> StoreResult<()> {
        self.faults
            .write(self.inner.release_lease(node_id, node_epoch))
            .await
    }

    async fn read_lease(&self) -> StoreResult<LeaseRow> {
        self.faults.read(self.inner.read_lease()).await
    }

    async fn heartbeat(&self, heartbeat: &Heartbeat) -> StoreResult<()> {
        self.faults.write(self.inner.heartbeat(heartbeat)).await
    }

    async fn expire_heartbeat(&self, node_id: u64, node_epoch: u64) -> StoreResult<()> {
        self.faults
            .write(self.inner.expire_heartbeat(node_id, node_epoch))
            .await
    }

    async fn nodes(&self) -> StoreResult<Vec<NodeRow>> {
        self.faults.read(self.inner.nodes()).await
    }

    async fn insert_raw(&self, index: u64, payload: &[u8]) -> StoreResult<()> {
        self.inner.insert_raw(index, payload).await
    }
}
