//! The cluster as an operator sees and steers it: status, rebalance, drain. The decisions are
//! the coordinator's (`mink-coordinator`, on the lease holder); a request reaches it through
//! the metadata log, so any node takes it.

use std::collections::BTreeMap;
use std::time::Duration;

use mink_coordinator::planner::{self, Observation};
use mink_coordinator::{REBALANCE_DONE, REBALANCE_REQUEST};
use mink_metadata::{Command, DeleteKv, PutKv};

use crate::{Node, NodeError, NodeResult};

/// One node as the cluster sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    pub node_id: u64,
    pub node_epoch: u64,
    pub address: String,
    /// Its heartbeat is younger than the lease TTL.
    pub live: bool,
    /// Milliseconds since its last heartbeat (database clock), if it has one.
    pub heartbeat_age_ms: Option<i64>,
    /// Buckets it leads.
    pub buckets: u64,
    /// Given no buckets; the coordinator moves its buckets off it.
    pub drained: bool,
    /// Its listeners' addresses by protocol (once the cluster is at metadata_version 3).
    pub listeners: BTreeMap<String, String>,
}

/// The cluster as one node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The node that answered.
    pub node_id: u64,
    pub applied_index: u64,
    /// The lease holder and its coordinator epoch.
    pub coordinator: Option<(u64, u64)>,
    pub nodes: Vec<NodeStatus>,
    /// Buckets whose leader is not live (failover pending) or that have none yet.
    pub buckets_without_live_leader: u64,
    /// The lease TTL: a node whose heartbeat is older is down.
    pub lease_ttl_ms: u64,
}

/// How long a rebalance request waits for the coordinator's answer.
const REBALANCE_WAIT: Duration = Duration::from_secs(30);

impl Node {
    pub async fn cluster_status(&self) -> NodeResult<ClusterStatus> {
        // One read of the heartbeats: while the metadata database is unreachable each read
        // waits out the pool's acquire timeout.
        let rows = self.inner.sink.node_rows().await?;
        let ages: BTreeMap<u64, i64> = rows.iter().map(|n| (n.node_id, n.age_ms)).collect();
        let live: BTreeMap<u64, u64> = rows
            .iter()
            .filter(|n| self.inner.sink.is_live(n))
            .map(|n| (n.node_id, n.node_epoch))
            .collect();
        let view = self.view();
        let drained = planner::drained(&view.state);
        let mut led: BTreeMap<u64, u64> = BTreeMap::new();
        let mut orphaned = 0;
        for b in view.state.buckets.values() {
            *led.entry(b.leader_node_id).or_default() += 1;
            if !live.contains_key(&b.leader_node_id) {
                orphaned += 1;
            }
        }
        Ok(ClusterStatus {
            node_id: self.node_id(),
            applied_index: view.applied_index,
            coordinator: view
                .state
                .coordinator
                .as_ref()
                .filter(|c| !c.resigned)
                .map(|c| (c.node_id, c.epoch)),
            nodes: view
                .state
                .nodes
                .values()
                .map(|n| NodeStatus {
                    node_id: n.node_id,
                    node_epoch: n.node_epoch,
                    address: n.address.clone(),
                    live: live.contains_key(&n.node_id),
                    heartbeat_age_ms: ages.get(&n.node_id).copied(),
                    buckets: led.get(&n.node_id).copied().unwrap_or(0),
                    drained: drained.contains(&n.node_id),
                    listeners: n.listeners.clone(),
                })
                .collect(),
            buckets_without_live_leader: orphaned,
            lease_ttl_ms: u64::try_from(self.inner.config.lease_ttl.as_millis())
                .unwrap_or(u64::MAX),
        })
    }

    /// The moves a rebalance makes (`dry_run`: planned from this node's view, nothing moves),
    /// as one line each. Otherwise the request goes through the metadata log to the
    /// coordinator, which carries it out; the answer is what it moved, once the buckets are handed
    /// over (or after 30 s).
    pub async fn rebalance(&self, dry_run: bool) -> NodeResult<Vec<String>> {
        if dry_run {
            let live: BTreeMap<u64, u64> = self
                .inner
                .sink
                .live_nodes()
                .await?
                .into_iter()
                .map(|n| (n.node_id, n.node_epoch))
                .collect();
            let view = self.view();
            let overdue = std::collections::BTreeSet::new();
            let stopped = BTreeMap::new();
            let obs = Observation {
                state: &view.state,
                live: &live,
                failover: false,
                stopped: &stopped,
                overdue: &overdue,
            };
            return Ok(planner::plan_rebalance(&obs)
                .iter()
                .map(|step| step.describe(&view.state))
                .collect());
        }
        // A token no earlier request used: this node's identity and applied index.
        let me = self.inner.sink.node();
        let token = format!(
            "{}/{}/{}",
            me.node_id,
            me.node_epoch,
            self.view().applied_index
        );
        self.propose_kv(Command::PutKv(PutKv {
            key: REBALANCE_REQUEST.to_string(),
            value: token.clone().into_bytes(),
        }))
        .await?;
        let deadline = tokio::time::Instant::now() + REBALANCE_WAIT;
        loop {
            let view = self.view();
            if let Some(done) = view.state.kv.get(REBALANCE_DONE) {
                let text = String::from_utf8_lossy(&done.value).into_owned();
                let mut lines = text.lines();
                if lines.next() == Some(token.as_str()) {
                    let moves = lines.map(str::to_string).collect();
                    self.wait_for_moves(deadline).await;
                    return Ok(moves);
                }
            }
            if !self.next_applied(view.applied_index, deadline).await? {
                return Err(NodeError::Unavailable(
                    "the coordinator has not answered the rebalance request yet (is a node holding the lease?); it stays pending".into(),
                ));
            }
        }
    }

    /// Waits (until `deadline` at most) for the moves in progress to finish: each bucket
    /// handed over and led by its target. Moves still running afterwards finish on their own.
    async fn wait_for_moves(&self, deadline: tokio::time::Instant) {
        loop {
            let view = self.view();
            let moving = view
                .state
                .buckets
                .values()
                .any(|b| planner::moving_to(&view.state, b).is_some());
            if !moving {
                return;
            }
            if !matches!(
                self.next_applied(view.applied_index, deadline).await,
                Ok(true)
            ) {
                return;
            }
        }
    }

    /// Marks a node drained (the coordinator moves its buckets to the others and gives it no
    /// new ones), or no longer drained. Refused when no other live node would take buckets:
    /// every bucket, and every new table's, would be left without a leader.
    pub async fn drain(&self, node_id: u64, drained: bool) -> NodeResult<()> {
        let state = self.view().state;
        if !state.nodes.contains_key(&node_id) {
            return Err(NodeError::NotFound(format!(
                "node {node_id} is not registered"
            )));
        }
        if drained {
            let already = planner::drained(&state);
            let others = self
                .inner
                .sink
                .live_nodes()
                .await?
                .iter()
                .filter(|n| {
                    n.node_id != node_id
                        && state.nodes.contains_key(&n.node_id)
                        && !already.contains(&n.node_id)
                })
                .count();
            if others == 0 {
                return Err(NodeError::Invalid(format!(
                    "node {node_id} is the last live node that takes buckets: drained, it would leave every bucket without a leader; start or undrain another node first"
                )));
            }
        }
        let key = planner::drained_key(node_id);
        let command = if drained {
            Command::PutKv(PutKv {
                key,
                value: Vec::new(),
            })
        } else {
            Command::DeleteKv(DeleteKv { key })
        };
        self.propose_kv(command).await
    }

    /// Proposes `command` and waits until it is applied here; a refused command is `Failed`.
    pub(crate) async fn propose_kv(&self, command: Command) -> NodeResult<()> {
        let proposed = self.inner.sink.propose(command).await?;
        proposed
            .result
            .map(|_| ())
            .map_err(|r| NodeError::Failed(r.to_string()))
    }
}
