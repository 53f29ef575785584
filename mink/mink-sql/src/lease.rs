//! Membership: heartbeats, the lease, and the lease holder's maintenance (snapshots,
//! truncation, metadata-version upgrades).
//!
//! Every `lease_ttl / 4` a node writes its heartbeat (database clock, applied index, supported
//! version) and tries to acquire or renew the lease. A renew that fails, or does not answer
//! within the interval, loses the lease at once; so does a TTL passing since the last renew
//! was *sent*, which is never later than the database considers the lease expired. On gaining
//! the lease the node applies `RegisterCoordinator` with the lease's term before it publishes
//! [`LeaseStatus::Held`], so every coordinator command it issues carries an epoch that a later
//! holder's registration fences.

use std::sync::Arc;
use std::time::Duration;

use mink_metadata::*;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout};

use crate::error::SinkError;
use crate::sink::{Proposal, Proposed, Shared, SinkStats};
use crate::store::{Heartbeat, StoreError};

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
    queue: &mpsc::Sender<Proposal>,
    shared: &Shared,
    command: Command,
) -> Result<Proposed, SinkError> {
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
        .send(Proposal { command, size, tx })
        .await
        .map_err(|_| SinkError::Shutdown)?;
    rx.await.map_err(|_| SinkError::Shutdown)?
}

struct Membership {
    shared: Arc<Shared>,
    queue: mpsc::Sender<Proposal>,
    /// When the last successful acquire/renew was sent.
    renewed_at: Option<Instant>,
    held_term: Option<u64>,
    /// Index of the newest snapshot known to be stored and verified.
    last_snapshot: u64,
    /// The log is truncated up to here (as far as this node knows).
    truncated_to: u64,
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

    async fn heartbeat(&self, limit: Duration) {
        let node = self.shared.node();
        let heartbeat = Heartbeat {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            applied_index: self.shared.view().applied_index,
            supported_version: self.shared.config.supported_metadata_version,
        };
        match timeout(limit, self.shared.store.heartbeat(&heartbeat)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(node_id = node.node_id, error = %e, "heartbeat failed"),
            Err(_) => tracing::warn!(node_id = node.node_id, "heartbeat timed out"),
        }
    }

    async fn renew(&mut self, limit: Duration) {
        let node = self.shared.node();
        let sent = Instant::now();
        let ttl_ms = self.shared.config.lease_ttl_ms();
        let grant = match timeout(
            limit,
            self.shared
                .store
                .acquire_lease(node.node_id, node.node_epoch, ttl_ms),
        )
        .await
        {
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
        // Newly acquired: take the coordinator role through the log before acting on it.
        let register = Command::RegisterCoordinator(RegisterCoordinator {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            lease_term: grant.term,
        });
        match propose(&self.queue, &self.shared, register).await {
            Ok(Proposed { result: Ok(_), .. }) => {
                if self
                    .renewed_at
                    .is_some_and(|t| t.elapsed() < self.shared.config.lease_ttl)
                {
                    tracing::info!(node_id = node.node_id, term = grant.term, "lease acquired");
                    self.held_term = Some(grant.term);
                    self.shared.lease.send_replace(LeaseStatus::Held {
                        coordinator_epoch: grant.term,
                    });
                }
            }
            Ok(Proposed {
                result: Err(rejection),
                ..
            }) => {
                tracing::warn!(node_id = node.node_id, %rejection, "coordinator registration refused");
                let _ = self
                    .shared
                    .store
                    .release_lease(node.node_id, node.node_epoch)
                    .await;
            }
            Err(e) => {
                tracing::warn!(node_id = node.node_id, error = %e, "coordinator registration failed")
            }
        }
    }

    /// Lease-holder work: snapshot, truncation, and raising the metadata version.
    async fn maintain(&mut self, coordinator_epoch: u64) {
        let view = self.shared.view();
        let node_id = self.shared.config.node_id;
        if view.applied_index >= self.last_snapshot + self.shared.config.snapshot_interval {
            match self.snapshot(&view).await {
                Ok(index) => self.last_snapshot = index,
                Err(e) => tracing::warn!(node_id, error = %e, "metadata snapshot failed"),
            }
        }
        // Retried every tick: a node that was alive at snapshot time may have died since, or
        // caught up.
        if self.last_snapshot > self.truncated_to
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

    /// Writes a snapshot of `view` and verifies it: read back, decoded, equal to the live
    /// state. Returns the index of the newest snapshot stored.
    async fn snapshot(&self, view: &View) -> Result<u64, String> {
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
        if stored.applied_index != view.applied_index {
            // A newer one exists (written by a faster holder): not ours to verify.
            return Ok(stored.applied_index.max(self.last_snapshot));
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
        tracing::debug!(index, "metadata snapshot written");
        Ok(index)
    }

    /// Deletes log rows behind the last verified snapshot and behind every live node's
    /// applied index (heartbeats carry it), so live nodes rarely need to reinstall.
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
            .unwrap_or(self.last_snapshot);
        let up_to = self.last_snapshot.min(live_floor);
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
        if let Err(rejection) = proposed.result {
            tracing::warn!(%rejection, "metadata version upgrade refused");
        } else {
            tracing::info!(from = current, to = target, "metadata version raised");
        }
        Ok(())
    }

    async fn tick(&mut self, interval: Duration) {
        self.heartbeat(interval).await;
        if !self.shared.config.lease_enabled || self.shared.halted().is_some() {
            return;
        }
        self.renew(interval).await;
        if let Some(term) = self.held_term {
            if self
                .renewed_at
                .is_none_or(|t| t.elapsed() >= self.shared.config.lease_ttl)
            {
                self.set_lost("a TTL passed since the last renew was sent");
            } else {
                self.maintain(term).await;
            }
        }
    }
}

/// The membership loop of one sink.
pub(crate) async fn run(shared: Arc<Shared>, queue: mpsc::Sender<Proposal>) {
    let interval = shared.config.heartbeat_interval();
    let last_snapshot = match shared.store.load_snapshot().await {
        Ok(s) => s.map_or(0, |s| s.applied_index),
        Err(StoreError::Unavailable(_)) | Err(_) => 0,
    };
    let mut membership = Membership {
        shared: Arc::clone(&shared),
        queue,
        renewed_at: None,
        held_term: None,
        last_snapshot,
        truncated_to: 0,
    };
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let started = Instant::now();
        // A tick never outlives the lease it may be acting under: once a TTL has passed since
        // the last renew was sent, the lease is lost whatever the tick is waiting for.
        let deadline = match (membership.held_term, membership.renewed_at) {
            (Some(_), Some(renewed)) => renewed + shared.config.lease_ttl,
            _ => started + shared.config.lease_ttl,
        };
        let ticked = tokio::select! {
            r = tokio::time::timeout_at(deadline, membership.tick(interval)) => r,
            _ = shutdown.changed() => return,
        };
        if ticked.is_err() {
            membership.set_lost("a TTL passed since the last renew was sent");
        }
        let mut next = started + interval;
        if let (Some(_), Some(renewed)) = (membership.held_term, membership.renewed_at) {
            next = next.min(renewed + shared.config.lease_ttl);
        }
        // The holder also wakes as soon as the log has grown by a snapshot interval.
        let snapshot_due = membership.last_snapshot + shared.config.snapshot_interval;
        let mut applied = shared.applied_watch();
        // (If it is already due, the last attempt failed: wait for the next tick.)
        let wake_on_growth = membership.held_term.is_some() && *applied.borrow() < snapshot_due;
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = applied.wait_for(|a| *a >= snapshot_due), if wake_on_growth => {}
            _ = shutdown.changed() => return,
        }
        if membership.held_term.is_some()
            && membership
                .renewed_at
                .is_none_or(|t| t.elapsed() >= shared.config.lease_ttl)
        {
            membership.set_lost("a TTL passed since the last renew was sent");
        }
    }
}
