//! The sink: propose → group commit → append → tail → apply → publish → resolve.
//!
//! Three tasks per node:
//! - the *flusher* drains the proposal queue into rows of up to `max_commands_per_row`
//!   commands (and `max_row_bytes`), appends one row at a time, and waits until the tailer has
//!   applied it before it sends the next (one row in flight per process);
//! - the *tailer* reads rows past the applied index, applies them, publishes the new view,
//!   and only then resolves the proposers of its own row;
//! - the *membership* loop (`lease.rs`) heartbeats, holds the lease, snapshots and truncates.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use mink_metadata::*;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::config::SinkConfig;
use crate::error::SinkError;
use crate::lease::{self, LeaseStatus};
use crate::store::{Heartbeat, LogRow, LogStore, StoreError};

mod flush;
mod tail;

pub(crate) use flush::{Appender, Proposal};
pub(crate) use tail::Tail;

/// A proposal's answer: the index at which it was applied (the caller's next view is at least
/// there) and what apply said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposed {
    pub index: u64,
    pub result: CommandResult,
}

/// A command queued by [`Sink::submit_all`].
#[derive(Debug)]
pub struct Submitted(oneshot::Receiver<Result<Proposed, SinkError>>);

impl Submitted {
    /// Waits until this node has applied the command, as [`Sink::propose`] does.
    pub async fn applied(self) -> Result<Proposed, SinkError> {
        self.0.await.map_err(|_| SinkError::Shutdown)?
    }
}

/// Counters for benchmarks, metrics and tests.
#[derive(Debug, Default)]
pub struct SinkStats {
    pub rows_appended: AtomicU64,
    pub commands_appended: AtomicU64,
    /// Appends that lost the race for an index and were retried.
    pub append_conflicts: AtomicU64,
    /// Appends that failed (outcome unknown) and were resent.
    pub append_errors: AtomicU64,
    pub rows_applied: AtomicU64,
    pub duplicate_rows: AtomicU64,
    pub reinstalls: AtomicU64,
    pub holes: AtomicU64,
    pub snapshots_written: AtomicU64,
    pub rows_truncated: AtomicU64,
    /// Attempts to take or renew the lease, counted once answered (or timed out).
    pub lease_attempts: AtomicU64,
    /// Maintenance steps the lease holder finished (snapshot, truncation and metadata version
    /// checks): a test's event for "the holder has looked".
    pub maintenance_steps: AtomicU64,
    /// Told when `lease_attempts` or `maintenance_steps` moves ([`SinkStats::reaches`]).
    counted: Notify,
}

impl SinkStats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// [`SinkStats::add`] of a counter waiters are told about.
    pub(crate) fn add_told(&self, counter: fn(&SinkStats) -> &AtomicU64, n: u64) {
        Self::add(counter(self), n);
        self.counted.notify_waiters();
    }

    /// Returns once `counter` reaches `n`, so a test sees the lease loop or the holder's
    /// maintenance at work without polling. Only `lease_attempts` and `maintenance_steps` are
    /// told; another counter waits for one of them to move.
    pub async fn reaches(&self, counter: fn(&SinkStats) -> &AtomicU64, n: u64) {
        loop {
            let mut told = std::pin::pin!(self.counted.notified());
            told.as_mut().enable();
            if Self::get(counter(self)) >= n {
                return;
            }
            told.await;
        }
    }
}

struct InFlight {
    token: RowToken,
    tx: oneshot::Sender<Result<Resolution, SinkError>>,
}

struct Resolution {
    index: u64,
    results: Vec<CommandResult>,
    fenced: bool,
}

/// What every task of one sink shares.
pub(crate) struct Shared {
    pub(crate) config: SinkConfig,
    pub(crate) store: Arc<dyn LogStore>,
    view: ArcSwap<View>,
    applied: watch::Sender<u64>,
    halted: Mutex<Option<SinkError>>,
    inflight: Mutex<Option<InFlight>>,
    /// This process's last appended row, as the database indexed it: when the tailer stands
    /// right before it, it applies these bytes instead of reading them back.
    own_row: Mutex<Option<LogRow>>,
    tail_kick: Notify,
    pub(crate) node_epoch: AtomicU64,
    pub(crate) incarnation: u64,
    /// Set once this process's `RegisterNode` applied; from then on a newer registration of
    /// the same node id fences this process.
    registered: std::sync::atomic::AtomicBool,
    pub(crate) stats: Arc<SinkStats>,
    pub(crate) shutdown: watch::Sender<bool>,
    /// Set first on a clean shutdown: no new proposals; the flusher finishes its row and stops.
    closing: watch::Sender<bool>,
    pub(crate) lease: watch::Sender<LeaseStatus>,
    /// Set once this process has given the lease up for good ([`Sink::resign`]); from then on
    /// it heartbeats but never acquires.
    pub(crate) resigned: std::sync::atomic::AtomicBool,
    /// Held by a membership tick, and by [`Sink::resign`]: a renewal in flight never races
    /// the release.
    pub(crate) lease_turn: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("node_id", &self.config.node_id)
            .field("node_epoch", &self.node_epoch)
            .field("applied", &*self.applied.borrow())
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn view(&self) -> View {
        View::clone(&self.view.load())
    }

    pub(crate) fn applied_watch(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    pub(crate) fn halted(&self) -> Option<SinkError> {
        self.halted.lock().expect("halt lock").clone()
    }

    pub(crate) fn node(&self) -> NodeRef {
        NodeRef {
            node_id: self.config.node_id,
            node_epoch: self.node_epoch.load(Ordering::Acquire),
        }
    }

    /// Stops the sink for good: every waiter and every later proposal gets `error`.
    fn halt(&self, error: SinkError) {
        {
            let mut halted = self.halted.lock().expect("halt lock");
            if halted.is_some() {
                return;
            }
            if error != SinkError::Shutdown {
                tracing::error!(node_id = self.config.node_id, %error, "metadata sink halted");
            }
            *halted = Some(error.clone());
        }
        // A halted process acts as coordinator no more (the membership loop releases the lease).
        self.lease.send_replace(LeaseStatus::NotHeld);
        if let Some(inflight) = self.inflight.lock().expect("inflight lock").take() {
            let _ = inflight.tx.send(Err(error));
        }
        // Wake wait_applied callers so that they see the halt.
        self.applied.send_modify(|_| {});
    }

    fn publish(&self, index: u64, state: &State) {
        self.view.store(Arc::new(View::new(index, state.clone())));
        self.applied.send_replace(index);
    }

    fn is_shutdown(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Exponential backoff between retries of a failing store call.
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(max: Duration) -> Self {
        Backoff {
            next: Duration::from_millis(5),
            max,
        }
    }

    pub(crate) fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub(crate) fn reset(&mut self) {
        self.next = Duration::from_millis(5);
    }
}

struct Tasks {
    flusher: JoinHandle<()>,
    /// Tailer, membership, maintenance.
    others: Vec<JoinHandle<()>>,
}

struct Inner {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Vec<Proposal>>,
    tasks: Mutex<Option<Tasks>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.closing.send_replace(true);
        self.shared.shutdown.send_replace(true);
    }
}

/// One node's handle on the command log. Cheap to clone; all clones share the node.
#[derive(Clone)]
pub struct Sink {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.shared.fmt(f)
    }
}

impl Sink {
    /// Catches up with the log (snapshot + tail), registers this node at a new node epoch,
    /// and starts the flusher, tailer and membership tasks.
    pub async fn start(store: Arc<dyn LogStore>, config: SinkConfig) -> Result<Sink, SinkError> {
        if config.node_id == 0 {
            return Err(SinkError::Start("node id must be positive".to_string()));
        }
        let supported = config.supported_metadata_version;
        let mut tail = retry_transient(config.lease_ttl, || {
            Tail::load(
                store.as_ref(),
                supported,
                config.read_batch,
                config.read_max_bytes,
            )
        })
        .await
        .map_err(|e| SinkError::Start(e.to_string()))?;
        let shared = Arc::new(Shared {
            view: ArcSwap::from_pointee(View::new(tail.applied, tail.state.clone())),
            applied: watch::channel(tail.applied).0,
            halted: Mutex::new(None),
            inflight: Mutex::new(None),
            own_row: Mutex::new(None),
            tail_kick: Notify::new(),
            node_epoch: AtomicU64::new(0),
            registered: std::sync::atomic::AtomicBool::new(false),
            incarnation: rand::random::<u64>() | 1,
            stats: Arc::new(SinkStats::default()),
            shutdown: watch::channel(false).0,
            closing: watch::channel(false).0,
            lease: watch::channel(LeaseStatus::NotHeld).0,
            resigned: std::sync::atomic::AtomicBool::new(false),
            lease_turn: tokio::sync::Mutex::new(()),
            store,
            config,
        });
        let deadline = tokio::time::Instant::now() + shared.config.lease_ttl;
        loop {
            match tail
                .catch_up(shared.store.as_ref(), shared.config.tail_poll_interval)
                .await
            {
                Ok(()) => break,
                Err(SinkError::Store(e))
                    if e.is_retriable() && tokio::time::Instant::now() < deadline =>
                {
                    tracing::warn!(error = %e, "metadata store unavailable while catching up; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(SinkError::Start(e.to_string())),
            }
        }
        let state_version = tail.state.metadata_version;
        let tail_state_epoch = tail
            .state
            .nodes
            .get(&shared.config.node_id)
            .map_or(0, |n| n.node_epoch);
        if state_version > supported {
            return Err(SinkError::Start(format!(
                "the cluster is at metadata_version {state_version}, this node supports up to {supported}: upgrade it"
            )));
        }

        if let Some(record) = tail.state.nodes.get(&shared.config.node_id) {
            refuse_a_live_namesake(&shared, record).await?;
        }
        if let Some(check) = &shared.config.before_register {
            (check.0)(Arc::new(tail.state.clone()))
                .await
                .map_err(SinkError::Refused)?;
        }
        let tailer = spawn_supervised(Arc::clone(&shared), "tailer", tail.run(Arc::clone(&shared)));
        let registered = register(&shared, supported, tail_state_epoch).await;
        let (epoch, appender) = match registered {
            Ok(r) => r,
            Err(e) => {
                shared.shutdown.send_replace(true);
                tailer.abort();
                return Err(SinkError::Start(e.to_string()));
            }
        };
        shared.registered.store(true, Ordering::Release);
        tracing::info!(
            node_id = shared.config.node_id,
            node_epoch = epoch,
            "metadata sink started"
        );

        let (queue, rx) = mpsc::channel(shared.config.queue_capacity);
        let flusher = spawn_supervised(Arc::clone(&shared), "flusher", appender.run(rx));
        let membership = spawn_supervised(
            Arc::clone(&shared),
            "membership",
            lease::run(Arc::clone(&shared), queue.clone()),
        );
        let maintenance = spawn_supervised(
            Arc::clone(&shared),
            "maintenance",
            lease::run_maintenance(Arc::clone(&shared), queue.clone()),
        );
        Ok(Sink {
            inner: Arc::new(Inner {
                shared,
                queue,
                tasks: Mutex::new(Some(Tasks {
                    flusher,
                    others: vec![tailer, membership, maintenance],
                })),
            }),
        })
    }

    /// Proposes one command and waits until this node has applied it. The view is published
    /// before this returns, so the caller's next [`Sink::view`] includes the write.
    pub async fn propose(&self, command: Command) -> Result<Proposed, SinkError> {
        let submitted = self.submit_all(vec![command]).await?;
        submitted
            .into_iter()
            .next()
            .expect("one submitted per command")
            .applied()
            .await
    }

    /// Queues `commands` together, in order, behind those already queued, and returns
    /// without waiting for them: they are appended in that order, in one row as far as
    /// `max_commands_per_row` and `max_row_bytes` allow (one transaction and one sync of the
    /// database's log, instead of one each). Nothing is queued if any of them is refused.
    pub async fn submit_all(&self, commands: Vec<Command>) -> Result<Vec<Submitted>, SinkError> {
        let shared = &self.inner.shared;
        if let Some(e) = shared.halted() {
            return Err(e);
        }
        if *shared.closing.borrow() {
            return Err(SinkError::Shutdown);
        }
        let current = shared.view.load().state.metadata_version;
        let mut proposals = Vec::with_capacity(commands.len());
        let mut submitted = Vec::with_capacity(commands.len());
        for command in commands {
            if command.since() > current {
                return Err(SinkError::NotEnabled {
                    command: command.name(),
                    since: command.since(),
                    current,
                });
            }
            let size = encoded_command_len(&command);
            if size > shared.config.max_row_bytes {
                return Err(SinkError::TooLarge {
                    size,
                    limit: shared.config.max_row_bytes,
                });
            }
            let (tx, rx) = oneshot::channel();
            proposals.push(Proposal { command, size, tx });
            submitted.push(Submitted(rx));
        }
        self.inner
            .queue
            .send(proposals)
            .await
            .map_err(|_| SinkError::Shutdown)?;
        Ok(submitted)
    }

    /// The current view; never blocks, never touches the database.
    pub fn view(&self) -> View {
        self.inner.shared.view()
    }

    /// Waits until this node has applied `index`, then returns the view (at `index` or later).
    pub async fn wait_applied(&self, index: u64) -> Result<View, SinkError> {
        let shared = &self.inner.shared;
        let mut applied = shared.applied.subscribe();
        loop {
            if let Some(e) = shared.halted() {
                return Err(e);
            }
            if *applied.borrow_and_update() >= index {
                return Ok(shared.view());
            }
            if applied.changed().await.is_err() {
                return Err(SinkError::Shutdown);
            }
        }
    }

    /// Waits until this node has applied every row the log held when called (one read of the
    /// log's end, then [`Sink::wait_applied`]). For a request naming something this node's
    /// view may not have caught up with yet, such as an id another node just allocated.
    pub async fn catch_up(&self) -> Result<View, SinkError> {
        let end = self.inner.shared.store.log_bounds().await?;
        self.wait_applied(end.map_or(0, |(_, last)| last)).await
    }

    /// Nodes whose heartbeat (by the database's clock) is younger than the lease TTL: the ones
    /// alive for assignment and failover.
    pub async fn live_nodes(&self) -> Result<Vec<crate::store::NodeRow>, SinkError> {
        let nodes = self.inner.shared.store.nodes().await?;
        Ok(nodes.into_iter().filter(|n| self.is_live(n)).collect())
    }

    /// Whether a heartbeat row is live: younger than the lease TTL.
    pub fn is_live(&self, node: &crate::store::NodeRow) -> bool {
        node.age_ms < self.inner.shared.config.lease_ttl_ms()
    }

    /// Resolves once the sink has halted for good (a newer registration of this node id fenced
    /// it, its log is damaged, or it was shut down), with why. A node whose sink halted can
    /// serve nothing that needs the metadata any more: its process should stop.
    pub async fn until_halted(&self) -> SinkError {
        let shared = &self.inner.shared;
        let mut applied = shared.applied.subscribe();
        loop {
            if let Some(e) = shared.halted() {
                return e;
            }
            if applied.changed().await.is_err() {
                return shared.halted().unwrap_or(SinkError::Shutdown);
            }
        }
    }

    /// Every node's heartbeat row, live or not.
    pub async fn node_rows(&self) -> Result<Vec<crate::store::NodeRow>, SinkError> {
        Ok(self.inner.shared.store.nodes().await?)
    }

    /// This process's node identity.
    pub fn node(&self) -> NodeRef {
        self.inner.shared.node()
    }

    /// Lease status, as a watch the coordinator and the lifecycle loops follow.
    pub fn lease(&self) -> watch::Receiver<LeaseStatus> {
        self.inner.shared.lease.subscribe()
    }

    pub fn stats(&self) -> &Arc<SinkStats> {
        &self.inner.shared.stats
    }

    pub fn config(&self) -> &SinkConfig {
        &self.inner.shared.config
    }

    /// Why the sink stopped, if it did.
    pub fn halted(&self) -> Option<SinkError> {
        self.inner.shared.halted()
    }

    /// Gives the lease up for good, for a node on its way out that still serves for a while:
    /// stops acquiring it, publishes [`LeaseStatus::NotHeld`] (the coordinator loops stop),
    /// releases the lease row and, from metadata_version 7, proposes `ResignCoordinator`. The
    /// other nodes see that in the log and try for the lease at once instead of at their next
    /// renewal. Heartbeats go on. Idempotent; [`Sink::shutdown`] calls it first.
    pub async fn resign(&self) {
        let shared = &self.inner.shared;
        let limit = shared.config.heartbeat_interval();
        let _turn = shared.lease_turn.lock().await;
        if shared.resigned.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(coordinator_epoch) = shared
            .lease
            .send_replace(LeaseStatus::NotHeld)
            .coordinator_epoch()
        else {
            return;
        };
        let node = shared.node();
        // Released before the resignation is proposed, so that whoever reads it can take the
        // lease at its first try.
        let _ = tokio::time::timeout(
            limit,
            shared.store.release_lease(node.node_id, node.node_epoch),
        )
        .await;
        if shared.view().state.metadata_version < RESIGN_VERSION {
            return;
        }
        let resign = Command::ResignCoordinator(ResignCoordinator {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            coordinator_epoch,
        });
        match tokio::time::timeout(limit, self.propose(resign)).await {
            Ok(Ok(Proposed { result: Ok(_), .. })) => {
                tracing::info!(
                    node_id = node.node_id,
                    coordinator_epoch,
                    "lease handed over"
                );
            }
            // Another node registered first: nothing left to hand over.
            Ok(Ok(Proposed { result: Err(r), .. })) => {
                tracing::debug!(node_id = node.node_id, rejection = %r, "resignation superseded");
            }
            Ok(Err(e)) => tracing::warn!(node_id = node.node_id, error = %e, "resigning failed"),
            Err(_) => tracing::warn!(node_id = node.node_id, "resigning timed out"),
        }
    }

    /// Stops the node cleanly: resigns the lease ([`Sink::resign`]), takes no new proposals,
    /// lets the row in flight finish (its proposers get their answer), stops the loops,
    /// releases the lease and expires this node's heartbeat so that others need not wait a TTL
    /// to take over. Tasks that do not stop within a heartbeat interval are aborted.
    pub async fn shutdown(&self) {
        self.resign().await;
        let shared = &self.inner.shared;
        let limit = shared.config.heartbeat_interval();
        shared.closing.send_replace(true);
        let tasks = self.inner.tasks.lock().expect("tasks lock").take();
        if let Some(tasks) = tasks {
            // The tailer still runs here, so the flusher's last row gets resolved.
            stop(tasks.flusher, limit).await;
            shared.shutdown.send_replace(true);
            for task in tasks.others {
                stop(task, limit).await;
            }
        }
        shared.shutdown.send_replace(true);
        let node = shared.node();
        let _ = tokio::time::timeout(
            limit,
            shared.store.release_lease(node.node_id, node.node_epoch),
        )
        .await;
        let _ = tokio::time::timeout(
            limit,
            shared.store.expire_heartbeat(node.node_id, node.node_epoch),
        )
        .await;
        shared.lease.send_replace(LeaseStatus::NotHeld);
        shared.halt(SinkError::Shutdown);
    }

    /// Stops every task at once without releasing anything: what a crash (SIGKILL) leaves.
    pub fn abort(&self) {
        let shared = &self.inner.shared;
        shared.closing.send_replace(true);
        shared.shutdown.send_replace(true);
        if let Some(tasks) = self.inner.tasks.lock().expect("tasks lock").take() {
            tasks.flusher.abort();
            for task in tasks.others {
                task.abort();
            }
        }
        shared.halt(SinkError::Shutdown);
    }
}

/// Loads the state a cold start would: the stored snapshot, then every row after it, until
/// caught up. Registers nothing and proposes nothing (for tools, tests and read-only checks).
pub async fn load_view(store: &dyn LogStore, supported_version: u32) -> Result<View, SinkError> {
    let mut tail = Tail::load(store, supported_version, 1024, 64 << 20).await?;
    tail.catch_up(store, Duration::from_millis(20)).await?;
    Ok(View::new(tail.applied, tail.state))
}

/// Waits up to `limit` for a task to end, then aborts it.
async fn stop(mut task: JoinHandle<()>, limit: Duration) {
    if tokio::time::timeout(limit, &mut task).await.is_err() {
        task.abort();
        let _ = task.await;
    }
}

/// Retries `op` while it fails with a retriable store error, for up to `limit`.
async fn retry_transient<T, F, Fut>(limit: Duration, mut op: F) -> Result<T, SinkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SinkError>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut backoff = Backoff::new(Duration::from_secs(1));
    loop {
        match op().await {
            Err(SinkError::Store(e))
                if e.is_retriable() && tokio::time::Instant::now() < deadline =>
            {
                tracing::warn!(error = %e, "metadata store unavailable; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
            other => return other,
        }
    }
}

/// Registers this process at a node epoch above any its id used before. The epoch is first
/// announced in `meta_node`, so the coordinator counts this node before it could raise the
/// metadata version past it.
/// Refuses to start while another process serves this node id elsewhere: registering would
/// fence it, and two processes would take turns fencing each other (Kafka refuses a duplicate
/// `broker.id` alike). `record` is the id's registration. A heartbeat that is fresh but from
/// another address may be a crashed process's last one (a restart within the TTL, on a new
/// address): the id is refused only if the heartbeat goes on within one heartbeat interval.
/// The same address is this process's own listener, which the other cannot be holding.
async fn refuse_a_live_namesake(
    shared: &Arc<Shared>,
    record: &NodeRecord,
) -> Result<(), SinkError> {
    let config = &shared.config;
    if record.address.is_empty() || record.address == config.address {
        return Ok(());
    }
    let row = || async {
        let rows = retry_transient(config.lease_ttl, || async {
            Ok(shared.store.nodes().await?)
        })
        .await?;
        Ok::<_, SinkError>(
            rows.into_iter()
                .find(|n| n.node_id == config.node_id && n.node_epoch == record.node_epoch),
        )
    };
    let live = |r: &crate::store::NodeRow| !r.stopped_cleanly() && r.age_ms < config.lease_ttl_ms();
    let Some(first) = row().await?.filter(live) else {
        return Ok(());
    };
    let deadline = tokio::time::Instant::now() + config.heartbeat_interval() + config.lease_ttl / 8;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(config.heartbeat_interval() / 4).await;
        match row().await? {
            Some(r) if r.heartbeat_ms > first.heartbeat_ms && live(&r) => {
                return Err(SinkError::Start(format!(
                    "node {} is running at {} (epoch {}, heartbeat {} ms ago): another process has this node id; stop it, or give this one another id",
                    config.node_id,
                    record.address,
                    record.node_epoch,
                    r.age_ms.max(0)
                )));
            }
            Some(r) if live(&r) => {}
            _ => return Ok(()),
        }
    }
    Ok(())
}

async fn register(
    shared: &Arc<Shared>,
    supported: u32,
    known_epoch: u64,
) -> Result<(u64, Appender), SinkError> {
    let node_id = shared.config.node_id;
    let ttl = shared.config.lease_ttl;
    let stored_epoch = retry_transient(ttl, || async {
        Ok(shared
            .store
            .nodes()
            .await?
            .iter()
            .find(|n| n.node_id == node_id)
            .map_or(0, |n| n.node_epoch))
    })
    .await?;
    let mut epoch = stored_epoch.max(known_epoch) + 1;
    let mut appender = Appender {
        shared: Arc::clone(shared),
        sequence: 0,
        last_ms: 0,
    };
    loop {
        shared.node_epoch.store(epoch, Ordering::Release);
        let heartbeat = Heartbeat {
            node_id,
            node_epoch: epoch,
            applied_index: *shared.applied.borrow(),
            supported_version: supported,
        };
        retry_transient(ttl, || async {
            Ok(shared.store.heartbeat(&heartbeat).await?)
        })
        .await?;
        let register = Command::RegisterNode(RegisterNode {
            node_id,
            node_epoch: epoch,
            incarnation: shared.incarnation,
            address: shared.config.address.clone(),
            supported_metadata_version: supported,
            listeners: shared.config.listeners.clone(),
        });
        let resolution = appender.commit(vec![register]).await?;
        match resolution.results.into_iter().next() {
            Some(Ok(_)) => return Ok((epoch, appender)),
            Some(Err(r)) if r.kind() == RejectionKind::NodeFenced => {
                // Another process registered this id meanwhile: go above it.
                epoch = r.current.unwrap_or(epoch).max(epoch) + 1;
            }
            other => {
                return Err(SinkError::Start(format!(
                    "registering node {node_id} failed: {other:?}"
                )));
            }
        }
    }
}

/// Spawns one of the sink's tasks; if it panics, the sink halts instead of leaving its
/// waiters hanging.
fn spawn_supervised(
    shared: Arc<Shared>,
    name: &'static str,
    task: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    use futures::FutureExt as _;
    tokio::spawn(async move {
        if let Err(panic) = std::panic::AssertUnwindSafe(task).catch_unwind().await {
            let reason = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            shared.halt(SinkError::Halted {
                index: *shared.applied.borrow(),
                reason: format!("the {name} task panicked: {reason}"),
            });
        }
    })
}
