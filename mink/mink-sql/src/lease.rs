//! Membership: heartbeats and the lease; and the lease holder's maintenance (snapshots,
//! truncation, metadata-version upgrades).
//!
//! Every `lease_ttl / 4` a node writes its heartbeat (database clock, applied index, supported
//! version) and tries to acquire or renew the lease, both at once and each bounded by the
//! interval. A renew that fails or does not answer in time loses the lease at once; so does a
//! TTL passing since the last renew was *sent*, which is never later than the database considers
//! the lease expired. On gaining the lease the node applies `RegisterCoordinator` with the
//! lease's term before it publishes [`LeaseStatus::Held`], so every coordinator command it issues
//! carries an epoch that a later holder's registration fences. A holder on its way out releases
//! the lease and resigns through the log (`ResignCoordinator`); the others try for the lease as
//! soon as they apply that, not at their next tick.
//!
//! Maintenance runs in its own task while the lease is held and is cancelled the moment it is
//! lost, so a slow snapshot never delays a renewal.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mink_metadata::*;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, timeout};

use crate::error::SinkError;
use crate::sink::{Proposal, Proposed, Shared, SinkStats};
use crate::store::Heartbeat;

/// Whether this node holds the lease (and so runs the coordinator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseStatus {
    NotHeld,
    /// Held; `coordinator_epoch` is what coordinator commands must carry.
    Held {
        coordinator_epoch: u64,
    },
}

impl LeaseStatus {
    pub fn coordinator_epoch(self) -> Option<u64> {
        match self {
            LeaseStatus::Held { coordinator_epoch } => Some(coordinator_epoch),
            LeaseStatus::NotHeld => None,
        }
    }
}

async fn propose(
    queue: &mpsc::Sender<Vec<Proposal>>,
    shared: &Shared,
    command: Command,
) -> Result<Proposed, SinkError> {
    if let Some(e) = shared.halted() {
        return Err(e);
    }
    let current = shared.view().state.metadata_version;
    if command.since() > current {
        return Err(SinkError::NotEnabled {
            command: command.name(),
            since: command.since(),
            current,
        });
    }
    let (tx, rx) = oneshot::channel();
    let size = encoded_command_len(&command);
    queue
        .send(vec![Proposal { command, size, tx }])
        .await
        .map_err(|_| SinkError::Shutdown)?;
    rx.await.map_err(|_| SinkError::Shutdown)?
}

// ============================================================================ membership

struct Membership {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Vec<Proposal>>,
    /// When the last successful acquire/renew was sent.
    renewed_at: Option<Instant>,
    held_term: Option<u64>,
}

impl Membership {
    fn set_lost(&mut self, why: &str) {
        if self.held_term.take().is_some() {
            tracing::warn!(node_id = self.shared.config.node_id, why, "lease lost");
        }
        self.shared.lease.send_if_modified(|s| {
            let changed = *s != LeaseStatus::NotHeld;
            *s = LeaseStatus::NotHeld;
            changed
        });
    }

    fn ttl_passed(&self) -> bool {
        self.renewed_at
            .is_none_or(|t| t.elapsed() >= self.shared.config.lease_ttl)
    }

    async fn heartbeat(shared: &Shared, limit: Duration) {
        let node = shared.node();
        let heartbeat = Heartbeat {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            applied_index: shared.view().applied_index,
            supported_version: shared.config.supported_metadata_version,
        };
        match timeout(limit, shared.store.heartbeat(&heartbeat)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(node_id = node.node_id, error = %e, "heartbeat failed"),
            Err(_) => tracing::warn!(node_id = node.node_id, "heartbeat timed out"),
        }
    }

    /// A node registered while the cluster was below metadata_version 3 states its listener
    /// addresses once the cluster has reached it (the same registration, now recorded).
    async fn restate_listeners(&self, limit: Duration) {
        let view = self.shared.view();
        let node = self.shared.node();
        let listeners = &self.shared.config.listeners;
        let recorded = view.state.nodes.get(&node.node_id);
        if view.state.metadata_version < 3
            || recorded.is_none_or(|n| n.node_epoch != node.node_epoch || &n.listeners == listeners)
        {
            return;
        }
        let register = Command::RegisterNode(RegisterNode {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            incarnation: self.shared.incarnation,
            address: self.shared.config.address.clone(),
            supported_metadata_version: self.shared.config.supported_metadata_version,
            listeners: listeners.clone(),
        });
        if let Ok(Err(e)) = timeout(limit, propose(&self.queue, &self.shared, register)).await {
            tracing::warn!(node_id = node.node_id, error = %e, "stating listeners failed");
        }
    }

    async fn renew(&mut self, limit: Duration) {
        let node = self.shared.node();
        let sent = Instant::now();
        let ttl_ms = self.shared.config.lease_ttl_ms();
        let answer = timeout(
            limit,
            self.shared
                .store
                .acquire_lease(node.node_id, node.node_epoch, ttl_ms),
        )
        .await;
        self.shared.stats.add_told(|s| &s.lease_attempts, 1);
        let grant = match answer {
            Ok(Ok(grant)) => grant,
            Ok(Err(e)) => return self.set_lost(&format!("renew failed: {e}")),
            Err(_) => return self.set_lost("renew timed out"),
        };
        let Some(grant) = grant else {
            return self.set_lost("held by another node");
        };
        self.renewed_at = Some(sent);
        if self.held_term == Some(grant.term) {
            return;
        }
        // Newly acquired (or acquired anew under another term): whatever was held before is
        // gone; take the coordinator role through the log before acting on it.
        self.set_lost("the lease term changed");
        let register = Command::RegisterCoordinator(RegisterCoordinator {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            lease_term: grant.term,
        });
        match timeout(limit, propose(&self.queue, &self.shared, register)).await {
            Ok(Ok(Proposed { result: Ok(_), .. })) => {
                if !self.ttl_passed() {
                    tracing::info!(node_id = node.node_id, term = grant.term, "lease acquired");
                    self.held_term = Some(grant.term);
                    self.shared.lease.send_replace(LeaseStatus::Held {
                        coordinator_epoch: grant.term,
                    });
                }
            }
            Ok(Ok(Proposed {
                result: Err(rejection),
                ..
            })) => {
                tracing::warn!(node_id = node.node_id, %rejection, "coordinator registration refused");
                let _ = timeout(
                    limit,
                    self.shared
                        .store
                        .release_lease(node.node_id, node.node_epoch),
                )
                .await;
            }
            Ok(Err(e)) => {
                tracing::warn!(node_id = node.node_id, error = %e, "coordinator registration failed");
            }
            Err(_) => tracing::warn!(node_id = node.node_id, "coordinator registration timed out"),
        }
    }

    async fn tick(&mut self, interval: Duration) {
        if self.shared.halted().is_some() {
            // A halted (or fenced) process must not hold the lease: give it up at once.
            if self.held_term.is_some() {
                let node = self.shared.node();
                let _ = timeout(
                    interval,
                    self.shared
                        .store
                        .release_lease(node.node_id, node.node_epoch),
                )
                .await;
                self.set_lost("the sink halted");
            }
            return;
        }
        let shared = Arc::clone(&self.shared);
        let _turn = shared.lease_turn.lock().await;
        self.restate_listeners(interval).await;
        let heartbeat = Self::heartbeat(&shared, interval);
        if shared.resigned.load(Ordering::Acquire) {
            // Given up for good (the node is on its way out): heartbeat only.
            self.held_term = None;
            heartbeat.await;
        } else if shared.config.lease_enabled {
            tokio::join!(heartbeat, self.renew(interval));
        } else {
            heartbeat.await;
        }
    }
}

/// The membership loop of one sink: heartbeat and lease, every `lease_ttl / 4`.
pub(crate) async fn run(shared: Arc<Shared>, queue: mpsc::Sender<Vec<Proposal>>) {
    let interval = shared.config.heartbeat_interval();
    let mut membership = Membership {
        shared: Arc::clone(&shared),
        queue,
        renewed_at: None,
        held_term: None,
    };
    let mut shutdown = shared.shutdown.subscribe();
    let mut applied = shared.applied_watch();
    let mut woken_for = None;
    loop {
        let started = Instant::now();
        // A tick never outlives the lease it may be acting under.
        let deadline = match (membership.held_term, membership.renewed_at) {
            (Some(_), Some(renewed)) => {
                (renewed + shared.config.lease_ttl).min(started + interval * 3)
            }
            _ => started + interval * 3,
        };
        let ticked = tokio::select! {
            r = tokio::time::timeout_at(deadline, membership.tick(interval)) => r,
            _ = shutdown.changed() => return,
        };
        if ticked.is_err() || (membership.held_term.is_some() && membership.ttl_passed()) {
            membership.set_lost("a TTL passed since the last renew was sent");
        }
        let mut next = started + interval;
        if let (Some(_), Some(renewed)) = (membership.held_term, membership.renewed_at) {
            next = next.min(renewed + shared.config.lease_ttl);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = handed_over(&shared, &mut applied, &mut woken_for) => {}
            _ = shutdown.changed() => return,
        }
        if membership.held_term.is_some() && membership.ttl_passed() {
            membership.set_lost("a TTL passed since the last renew was sent");
        }
    }
}

/// Resolves when the log shows the coordinator resigned at an epoch not seen before, and this
/// node may take the lease: the holder released it on its way out, so trying now beats waiting
/// for the next tick.
async fn handed_over(
    shared: &Shared,
    applied: &mut watch::Receiver<u64>,
    woken_for: &mut Option<u64>,
) {
    if !shared.config.lease_enabled || shared.resigned.load(Ordering::Acquire) {
        return std::future::pending().await;
    }
    loop {
        let resigned = shared
            .view()
            .state
            .coordinator
            .as_ref()
            .filter(|c| c.resigned)
            .map(|c| c.epoch);
        if resigned.is_some() && resigned != *woken_for {
            *woken_for = resigned;
            return;
        }
        if applied.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

// ============================================================================ maintenance

struct Maintenance {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Vec<Proposal>>,
    /// Index of the newest stored snapshot (ours or not): paces snapshots.
    stored: u64,
    /// Index of the newest snapshot this node wrote, read back and compared with its live
    /// state. Truncation never goes past it.
    verified: u64,
    /// The log is truncated up to here, as far as this node knows.
    truncated_to: u64,
}

impl Maintenance {
    async fn step(&mut self, coordinator_epoch: u64) {
        let view = self.shared.view();
        let node_id = self.shared.config.node_id;
        if view.applied_index >= self.stored + self.shared.config.snapshot_interval {
            match self.snapshot(&view).await {
                Ok(()) => {}
                Err(e) => tracing::warn!(node_id, error = %e, "metadata snapshot failed"),
            }
        }
        // Retried every step: a node that was alive at snapshot time may have died since, or
        // caught up.
        if self.verified > self.truncated_to
            && let Err(e) = self.truncate().await
        {
            tracing::warn!(node_id, error = %e, "metadata log truncation failed");
        }
        if let Err(e) = self
            .upgrade_metadata_version(&view, coordinator_epoch)
            .await
        {
            tracing::warn!(node_id, error = %e, "metadata version upgrade failed");
        }
    }

    /// Writes a snapshot of `view`, reads it back, decodes it and compares it with the live
    /// state it was taken from.
    async fn snapshot(&mut self, view: &View) -> Result<(), String> {
        let shared = &self.shared;
        let store = &shared.store;
        let bytes = encode_snapshot(view.applied_index, &view.state);
        let wrote = store
            .store_snapshot(view.applied_index, &bytes)
            .await
            .map_err(|e| e.to_string())?;
        let stored = store
            .load_snapshot()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the snapshot row vanished")?;
        self.stored = self.stored.max(stored.applied_index);
        if stored.applied_index != view.applied_index {
            // A newer one exists, written by another holder: not ours to vouch for.
            return Ok(());
        }
        if wrote {
            SinkStats::add(&shared.stats.snapshots_written, 1);
        }
        let (index, state) =
            decode_snapshot(&stored.payload, shared.config.supported_metadata_version)
                .map_err(|e| format!("the stored snapshot does not decode: {e}"))?;
        if index != view.applied_index || state != *view.state {
            return Err(format!(
                "the stored snapshot at {index} differs from the live state; not truncating"
            ));
        }
        self.verified = index;
        tracing::debug!(index, "metadata snapshot written and verified");
        Ok(())
    }

    /// Deletes log rows behind the verified snapshot and behind every live node's applied
    /// index (heartbeats carry it), so live nodes rarely need to reinstall.
    async fn truncate(&mut self) -> Result<(), String> {
        let store = &self.shared.store;
        let ttl_ms = self.shared.config.lease_ttl_ms();
        let live_floor = store
            .nodes()
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .filter(|n| n.age_ms < ttl_ms)
            .map(|n| n.applied_index)
            .min()
            .unwrap_or(self.verified);
        let up_to = self.verified.min(live_floor);
        if up_to <= self.truncated_to {
            return Ok(());
        }
        let deleted = store.truncate(up_to).await.map_err(|e| e.to_string())?;
        SinkStats::add(&self.shared.stats.rows_truncated, deleted);
        self.truncated_to = up_to;
        Ok(())
    }

    async fn upgrade_metadata_version(
        &self,
        view: &View,
        coordinator_epoch: u64,
    ) -> Result<(), SinkError> {
        let supported = self.shared.config.supported_metadata_version;
        let current = view.state.metadata_version;
        if current >= supported {
            return Ok(());
        }
        let ttl_ms = self.shared.config.lease_ttl_ms();
        let target = self
            .shared
            .store
            .nodes()
            .await?
            .iter()
            .filter(|n| n.age_ms < ttl_ms)
            .map(|n| n.supported_version)
            .min()
            .unwrap_or(supported)
            .min(supported);
        if target <= current {
            return Ok(());
        }
        let upgrade = Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
            coordinator_epoch,
            version: target,
        });
        let proposed = propose(&self.queue, &self.shared, upgrade).await?;
        match proposed.result {
            Err(rejection) => tracing::warn!(%rejection, "metadata version upgrade refused"),
            Ok(_) => tracing::info!(from = current, to = target, "metadata version raised"),
        }
        Ok(())
    }
}

/// The maintenance loop: while this node holds the lease, snapshot, truncate and upgrade every
/// interval and whenever the log has grown by a snapshot interval; stop the moment the lease
/// is lost.
pub(crate) async fn run_maintenance(shared: Arc<Shared>, queue: mpsc::Sender<Vec<Proposal>>) {
    let interval = shared.config.heartbeat_interval();
    let stored = match shared.store.load_snapshot().await {
        Ok(s) => s.map_or(0, |s| s.applied_index),
        Err(_) => 0,
    };
    let mut m = Maintenance {
        shared: Arc::clone(&shared),
        queue,
        stored,
        verified: 0,
        truncated_to: 0,
    };
    let mut lease = shared.lease.subscribe();
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let held = tokio::select! {
            r = lease.wait_for(|s| s.coordinator_epoch().is_some()) => match r {
                Ok(s) => s.coordinator_epoch(),
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        let Some(epoch) = held else { continue };
        loop {
            tokio::select! {
                _ = m.step(epoch) => shared.stats.add_told(|s| &s.maintenance_steps, 1),
                _ = lease.wait_for(|s| s.coordinator_epoch() != Some(epoch)) => break,
                _ = shutdown.changed() => return,
            }
            let due = m.stored + shared.config.snapshot_interval;
            let mut applied = shared.applied_watch();
            // (Already due means the last attempt failed: wait for the next interval.)
            let wake_on_growth = *applied.borrow() < due;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = applied.wait_for(|a| *a >= due), if wake_on_growth => {}
                _ = lease.wait_for(|s| s.coordinator_epoch() != Some(epoch)) => break,
                _ = shutdown.changed() => return,
            }
        }
    }
}
