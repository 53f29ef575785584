//! The loop that runs the planner on the lease holder and carries out its steps under the
//! coordinator epoch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use mink_metadata::{Command, ExpireGroupOffsets, PutKv};
use mink_sql::{NodeRow, Sink};
use object_store::ObjectStoreExt as _;
use s3stream::{CompactionConfig, S3Stream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::planner::{self, Observation, PlannerConfig, Step};

/// How the coordinator runs.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// How often leadership and KV snapshot pruning are planned.
    pub tick: Duration,
    /// How long a new lease holder waits before it declares nodes dead: long enough for every
    /// live node to have heartbeated (they do every lease TTL / 4).
    pub failover_grace: Duration,
    /// How long a move waits for the bucket's leader to hand it over before the target leads
    /// it anyway (fencing the old leader, as a failover does).
    pub handover_timeout: Duration,
    /// How often objects are cleaned up and dead nodes' objects compacted.
    pub cleanup_interval: Duration,
    /// How long a group's committed offsets outlive its last commit (Kafka's
    /// `offsets.retention.minutes`, 7 days).
    pub group_offsets_retention: Duration,
    /// How often offsets past their retention are dropped (Kafka's
    /// `offsets.retention.check.interval.ms`; 1 min here).
    pub group_offsets_check_interval: Duration,
    pub planner: PlannerConfig,
    pub compaction: CompactionConfig,
}

impl CoordinatorConfig {
    /// Defaults for a lease TTL: failover after half a TTL of holding the lease.
    pub fn for_lease_ttl(ttl: Duration) -> Self {
        CoordinatorConfig {
            tick: Duration::from_millis(200),
            failover_grace: ttl / 2,
            handover_timeout: ttl,
            cleanup_interval: CompactionConfig::default().interval,
            group_offsets_retention: Duration::from_secs(7 * 24 * 3600),
            group_offsets_check_interval: Duration::from_secs(60),
            planner: PlannerConfig::default(),
            compaction: CompactionConfig::default(),
        }
    }
}

/// KV key of an operator's rebalance request; its value is the request's token.
pub const REBALANCE_REQUEST: &str = "coordinator/rebalance/request";
/// KV key the coordinator answers a rebalance request in: `<token>\n` then one line per move.
pub const REBALANCE_DONE: &str = "coordinator/rebalance/done";

/// A duty of the lease holder that needs more than the coordinator has (the lake, the node's
/// tables): the coordinator runs it beside its planning, so that one place decides when a
/// node acts as the lease holder.
///
/// Contract: rounds run only while the node holds the lease, with the coordinator epoch it
/// holds (every command a round proposes carries it), one at a time, `period` apart (from the
/// end of one round to the start of the next). When the lease is lost or passes to a new
/// epoch, the round in progress is dropped at its next await and [`Duty::lease_lost`] is
/// called: a round must leave nothing that a later round, on this node or another, cannot
/// finish or clean up.
pub trait Duty: Send + Sync + 'static {
    /// For logs.
    fn name(&self) -> &'static str;
    fn period(&self) -> Duration;
    /// One round of the duty (it keeps its own schedule per table: a round may do nothing).
    fn round(&self, coordinator_epoch: u64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// Forgets what was kept for the epoch that ended.
    fn lease_lost(&self) {}
}

/// Starts the coordinator loop of a node: it idles until the node holds the lease, then
/// plans and acts every tick, and runs `duties`, until the lease is lost or the sink shuts
/// down.
pub fn spawn(
    sink: Sink,
    streams: S3Stream,
    config: CoordinatorConfig,
    duties: Vec<Arc<dyn Duty>>,
) -> JoinHandle<()> {
    tokio::spawn(run(sink, streams, config, duties))
}

/// Runs `duty` round after round at `epoch`, until aborted (the lease lost).
async fn run_duty(duty: Arc<dyn Duty>, epoch: u64) {
    tracing::debug!(duty = duty.name(), coordinator_epoch = epoch, "running");
    loop {
        duty.round(epoch).await;
        tokio::time::sleep(duty.period()).await;
    }
}

/// Aborts the duties' tasks when dropped: a lease lost, or the coordinator gone.
struct Running(Vec<JoinHandle<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

async fn run(sink: Sink, streams: S3Stream, config: CoordinatorConfig, duties: Vec<Arc<dyn Duty>>) {
    let mut lease = sink.lease();
    loop {
        let held = lease
            .wait_for(|s| s.coordinator_epoch().is_some())
            .await
            .map(|s| s.coordinator_epoch());
        let Ok(Some(epoch)) = held else { return };
        tracing::info!(coordinator_epoch = epoch, "coordinating");
        // Clean-up and dead nodes' compaction run beside the planning, not in its tick: one
        // compaction of a node that died under load takes tens of seconds, and a failover or a
        // rebalance waiting behind it is a cluster serving nothing meanwhile.
        let mut tasks: Vec<JoinHandle<()>> = duties
            .iter()
            .map(|d| tokio::spawn(run_duty(Arc::clone(d), epoch)))
            .collect();
        tasks.push(tokio::spawn(clean_up_rounds(
            sink.clone(),
            streams.clone(),
            config.clone(),
            epoch,
        )));
        let running = Running(tasks);
        let mut coordinator = Coordinator {
            sink: &sink,
            streams: &streams,
            config: &config,
            epoch,
            since: Instant::now(),
            last_offsets_expiry: None,
            transfers: HashMap::new(),
        };
        loop {
            tokio::select! {
                _ = coordinator.tick() => {}
                _ = lease.wait_for(|s| s.coordinator_epoch() != Some(epoch)) => break,
            }
            tokio::select! {
                _ = tokio::time::sleep(config.tick) => {}
                changed = lease.wait_for(|s| s.coordinator_epoch() != Some(epoch)) => {
                    if changed.is_err() { return; }
                    break;
                }
            }
        }
        drop(running);
        for d in &duties {
            d.lease_lost();
        }
        tracing::info!(coordinator_epoch = epoch, "no longer coordinating");
    }
}

struct Coordinator<'a> {
    sink: &'a Sink,
    streams: &'a S3Stream,
    config: &'a CoordinatorConfig,
    epoch: u64,
    /// When this node took the lease at `epoch`.
    since: Instant,
    /// When committed offsets were last expired (`None`: not yet at this epoch).
    last_offsets_expiry: Option<Instant>,
    /// Pending transfers (by stream) and when this coordinator first saw each.
    transfers: HashMap<u64, Instant>,
}

impl Coordinator<'_> {
    async fn tick(&mut self) {
        let rows = match self.sink.node_rows().await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "coordinator: cannot read heartbeats");
                return;
            }
        };
        let nodes = |keep: &dyn Fn(&NodeRow) -> bool| -> BTreeMap<u64, u64> {
            rows.iter()
                .filter(|n| keep(n))
                .map(|n| (n.node_id, n.node_epoch))
                .collect()
        };
        let live = nodes(&|n| self.sink.is_live(n));
        let stopped = nodes(&NodeRow::stopped_cleanly);
        let view = self.sink.view();
        let overdue = self.overdue(&view.state);
        let obs = Observation {
            state: &view.state,
            live: &live,
            failover: self.since.elapsed() >= self.config.failover_grace,
            stopped: &stopped,
            overdue: &overdue,
        };
        let mut steps = planner::plan(&obs, &self.config.planner);
        steps.extend(planner::plan_drain(&obs));
        for step in &steps {
            self.carry_out(step).await;
        }
        self.answer_rebalance(&live).await;
        if self
            .last_offsets_expiry
            .is_none_or(|t| t.elapsed() >= self.config.group_offsets_check_interval)
        {
            self.last_offsets_expiry = Some(Instant::now());
            self.expire_group_offsets().await;
        }
    }

    /// Drops the committed offsets of groups whose last commit is past their retention (a
    /// command only when some group is).
    async fn expire_group_offsets(&self) {
        let now_ms = u64::try_from(self.streams.now_ms()).unwrap_or(0);
        let retention_ms =
            u64::try_from(self.config.group_offsets_retention.as_millis()).unwrap_or(u64::MAX);
        if self
            .sink
            .view()
            .state
            .groups_past_retention(now_ms, retention_ms)
            .is_empty()
        {
            return;
        }
        let command = Command::ExpireGroupOffsets(ExpireGroupOffsets {
            coordinator_epoch: self.epoch,
            now_ms,
            retention_ms,
        });
        match self.sink.propose(command).await {
            Ok(p) => {
                if let Err(r) = p.result {
                    tracing::info!(rejection = %r, "expiring group offsets refused");
                }
            }
            Err(e) => tracing::warn!(error = %e, "expiring group offsets failed"),
        }
    }

    /// Streams whose transfer has been pending longer than the handover timeout (counted from
    /// when this coordinator first saw it).
    fn overdue(&mut self, state: &mink_metadata::State) -> BTreeSet<u64> {
        let now = Instant::now();
        let pending: BTreeSet<u64> = state
            .buckets
            .values()
            .filter(|b| planner::moving_to(state, b).is_some())
            .map(|b| b.stream_id)
            .collect();
        self.transfers.retain(|id, _| pending.contains(id));
        pending
            .into_iter()
            .filter(|id| {
                now.duration_since(*self.transfers.entry(*id).or_insert(now))
                    >= self.config.handover_timeout
            })
            .collect()
    }

    /// Proposes a step's commands in order; a step refused (the state moved on) is planned
    /// anew next tick.
    async fn carry_out(&self, step: &Step) -> bool {
        for command in step.commands(self.epoch) {
            if !self.propose(step, command).await {
                return false;
            }
        }
        if !matches!(step, Step::DropKvSnapshot { .. }) {
            tracing::info!(%step, "coordinator");
        }
        if let Step::DropKvSnapshot { location, .. } = step {
            tracing::debug!(%step, "coordinator");
            let path = object_store::path::Path::from(location.as_str());
            if let Err(e) = self.streams.object_store().delete(&path).await {
                tracing::warn!(error = %e, %location, "deleting a dropped KV snapshot");
            }
        }
        true
    }

    async fn propose(&self, step: &Step, command: Command) -> bool {
        match self.sink.propose(command).await {
            Ok(p) if p.result.is_ok() => true,
            Ok(p) => {
                if let Err(r) = p.result {
                    tracing::info!(%step, rejection = %r, "coordinator step refused");
                }
                false
            }
            Err(e) => {
                tracing::warn!(%step, error = %e, "coordinator step failed");
                false
            }
        }
    }

    /// Carries out a pending rebalance request and records what it moved.
    async fn answer_rebalance(&self, live: &BTreeMap<u64, u64>) {
        let view = self.sink.view();
        let Some(request) = view.state.kv.get(REBALANCE_REQUEST) else {
            return;
        };
        let token = String::from_utf8_lossy(&request.value).into_owned();
        let answered = view
            .state
            .kv
            .get(REBALANCE_DONE)
            .is_some_and(|d| String::from_utf8_lossy(&d.value).lines().next() == Some(&token));
        if answered {
            return;
        }
        let overdue = BTreeSet::new();
        let stopped = BTreeMap::new();
        let obs = Observation {
            state: &view.state,
            live,
            failover: false,
            stopped: &stopped,
            overdue: &overdue,
        };
        let mut report = format!("{token}\n");
        for step in planner::plan_rebalance(&obs) {
            if self.carry_out(&step).await {
                report.push_str(&format!("{}\n", step.describe(&view.state)));
            }
        }
        let done = Command::PutKv(PutKv {
            key: REBALANCE_DONE.to_string(),
            value: report.into_bytes(),
        });
        if let Err(e) = self.sink.propose(done).await {
            tracing::warn!(error = %e, "coordinator: recording a rebalance");
        }
    }
}

/// Object cleanup, and compaction of the objects of nodes that are not live (nobody else
/// compacts them), every `cleanup_interval` at `epoch`, until aborted (the lease lost).
async fn clean_up_rounds(sink: Sink, streams: S3Stream, config: CoordinatorConfig, epoch: u64) {
    loop {
        tokio::time::sleep(config.cleanup_interval).await;
        if let Err(e) = streams.cleanup_once(epoch, &config.compaction).await {
            tracing::warn!(error = %e, "object cleanup failed");
        }
        let live: BTreeMap<u64, u64> = match sink.live_nodes().await {
            Ok(rows) => rows.iter().map(|n| (n.node_id, n.node_epoch)).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "clean-up: cannot read heartbeats");
                continue;
            }
        };
        let view = sink.view();
        for node_id in planner::dead_nodes_with_objects(&view.state, &live) {
            if let Err(e) = streams.compact_once(node_id, &config.compaction).await {
                tracing::warn!(error = %e, node_id, "compacting a dead node's objects failed");
            }
        }
    }
}
