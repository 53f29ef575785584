//! Golden cases of the planner: each scenario is a cluster as the coordinator sees it (nodes,
//! heartbeats, buckets and their leaders, KV snapshots) and the steps it plans; the whole
//! transcript is compared with `tests/golden/<scenario>.txt`. The expectations that matter are
//! also asserted in code, so a regenerated golden file cannot hide a broken rule. Every reason a
//! bucket moves has a case.
//!
//! Regenerate after an intended change with `MINK_BLESS=1 cargo nextest run -p
//! mink-coordinator` and review the diff.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use mink_coordinator::planner::{self, Observation, PlannerConfig, Step, Why};
use mink_metadata::{
    BucketRecord, KvRecord, KvSnapshotRecord, NodeRecord, State, StreamRecord, StreamState,
    TableRecord,
};

/// A cluster as the coordinator sees it.
struct Cluster {
    state: State,
    live: BTreeMap<u64, u64>,
    stopped: BTreeMap<u64, u64>,
    overdue: BTreeSet<u64>,
}

impl Cluster {
    /// Nodes `1..=n`, registered at epoch 1 and heartbeating.
    fn nodes(n: u64) -> Self {
        let mut c = Cluster {
            state: State::default(),
            live: BTreeMap::new(),
            stopped: BTreeMap::new(),
            overdue: BTreeSet::new(),
        };
        for id in 1..=n {
            c.register(id, 1);
            c.live.insert(id, 1);
        }
        c
    }

    fn register(&mut self, id: u64, epoch: u64) {
        self.state.nodes.insert(
            id,
            NodeRecord {
                node_id: id,
                node_epoch: epoch,
                address: format!("10.0.0.{id}:7171"),
                ..Default::default()
            },
        );
    }

    /// Buckets `0..count` of `table`, led by `leaders[b % len]` at node epoch 1 (0: none).
    fn table(&mut self, table: u64, count: u32, leaders: &[u64]) {
        for b in 0..count {
            let leader = leaders[b as usize % leaders.len()];
            self.state.buckets.insert(
                (table, 0, b),
                BucketRecord {
                    table_id: table,
                    partition_id: 0,
                    bucket: b,
                    stream_id: table * 100 + u64::from(b),
                    leader_node_id: leader,
                    leader_node_epoch: u64::from(leader != 0),
                    leader_epoch: u64::from(leader != 0),
                },
            );
        }
    }

    /// Applies a planned step's effect on the state the way the metadata log would (enough
    /// for the next plan): transfers mark the stream, leads move the bucket.
    fn apply(&mut self, steps: &[Step]) {
        for step in steps {
            match step {
                Step::Transfer {
                    stream_id,
                    from,
                    to,
                    ..
                } => {
                    let s = self.stream(*stream_id);
                    s.placement_node_id = *from;
                    s.transfer_to_node_id = *to;
                }
                Step::CancelTransfer {
                    stream_id, leader, ..
                } => {
                    let s = self.stream(*stream_id);
                    s.placement_node_id = *leader;
                    s.transfer_to_node_id = 0;
                }
                Step::Lead {
                    bucket, node_id, ..
                } => {
                    let epoch = self.state.nodes[node_id].node_epoch;
                    let b = self.state.buckets.get_mut(bucket).unwrap();
                    b.leader_node_id = *node_id;
                    b.leader_node_epoch = epoch;
                    b.leader_epoch += 1;
                }
                Step::DropKvSnapshot { .. } => {}
            }
        }
    }

    /// The stream record of a bucket's stream (created open at the bucket's leader epoch).
    fn stream(&mut self, stream_id: u64) -> &mut StreamRecord {
        let b = self
            .state
            .buckets
            .values()
            .find(|b| b.stream_id == stream_id)
            .cloned()
            .unwrap();
        self.state
            .streams
            .entry(stream_id)
            .or_insert_with(|| StreamRecord {
                stream_id,
                epoch: b.leader_epoch,
                state: StreamState::Open as i32,
                owner_node_id: b.leader_node_id,
                owner_node_epoch: b.leader_node_epoch,
                table_id: b.table_id,
                partition_id: b.partition_id,
                bucket: b.bucket,
                ..Default::default()
            })
    }

    fn drain(&mut self, id: u64) {
        let key = planner::drained_key(id);
        self.state.kv.insert(
            key.clone(),
            KvRecord {
                key,
                value: Vec::new(),
                ..Default::default()
            },
        );
    }

    fn snapshot(&mut self, bucket: (u64, u64, u32), id: u64) {
        let (t, p, b) = bucket;
        self.state.kv_snapshots.insert(
            (t, p, b, id),
            KvSnapshotRecord {
                table_id: t,
                partition_id: p,
                bucket: b,
                snapshot_id: id,
                log_offset: id * 10,
                location: format!("kv-snapshots/{t}/{p}/{b}/{id}"),
                ..Default::default()
            },
        );
    }

    fn observe(&self, failover: bool) -> Observation<'_> {
        Observation {
            state: &self.state,
            live: &self.live,
            failover,
            stopped: &self.stopped,
            overdue: &self.overdue,
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let drained = planner::drained(&self.state);
        for n in self.state.nodes.values() {
            let heartbeat = match (self.live.get(&n.node_id), self.stopped.get(&n.node_id)) {
                (Some(e), _) => format!("heartbeating at epoch {e}"),
                (None, Some(e)) => format!("stopped cleanly at epoch {e}"),
                (None, None) => "heartbeat expired".to_string(),
            };
            let d = if drained.contains(&n.node_id) {
                ", drained"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "node {} registered at epoch {}, {heartbeat}{d}",
                n.node_id, n.node_epoch
            );
        }
        for ((t, p, b), r) in self.state.buckets.iter() {
            let moving = match self.state.streams.get(&r.stream_id) {
                Some(s) if s.transfer_to_node_id != 0 => format!(
                    ", moving from node {} to node {}{}",
                    s.placement_node_id,
                    s.transfer_to_node_id,
                    if s.state == StreamState::Closed as i32 {
                        " (stream closed)"
                    } else {
                        ""
                    }
                ),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "bucket {t}/{p}/{b}: leader node {} (epoch {}), leader epoch {}{moving}",
                r.leader_node_id, r.leader_node_epoch, r.leader_epoch
            );
        }
        for s in self.state.kv_snapshots.values() {
            let _ = writeln!(
                out,
                "KV snapshot {} of bucket {}/{}/{}",
                s.snapshot_id, s.table_id, s.partition_id, s.bucket
            );
        }
        out
    }
}

/// A scenario's transcript: what was seen and what each planner call planned.
struct Transcript {
    out: String,
}

impl Transcript {
    fn new(cluster: &Cluster) -> Self {
        Transcript {
            out: format!("--- cluster ---\n{}", cluster.render()),
        }
    }

    fn plan(&mut self, what: &str, steps: Vec<Step>) -> Vec<Step> {
        let _ = writeln!(self.out, "--- {what} ---");
        if steps.is_empty() {
            let _ = writeln!(self.out, "(nothing)");
        }
        for s in &steps {
            let _ = writeln!(self.out, "{s}");
        }
        steps
    }

    fn finish(self, name: &str) {
        // At run time: a shared target directory may hold a binary built from another checkout.
        let path = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
            .join("tests/golden")
            .join(format!("{name}.txt"));
        if std::env::var_os("MINK_BLESS").is_some() {
            std::fs::write(&path, &self.out).unwrap();
            return;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
            panic!(
                "{} is missing: run with MINK_BLESS=1 and review it",
                path.display()
            )
        });
        assert_eq!(
            self.out,
            want,
            "{name}: the plan differs from {} (MINK_BLESS=1 to accept an intended change)",
            path.display()
        );
    }
}

/// `(bucket, node, why)` of the leadership steps.
fn leads(steps: &[Step]) -> Vec<((u64, u64, u32), u64, Why)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Lead {
                bucket,
                node_id,
                why,
            } => Some((*bucket, *node_id, *why)),
            _ => None,
        })
        .collect()
}

/// `(bucket, to, why)` of the moves.
fn transfers(steps: &[Step]) -> Vec<((u64, u64, u32), u64, Why)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Transfer {
                bucket, to, why, ..
            } => Some((*bucket, *to, *why)),
            _ => None,
        })
        .collect()
}

fn config() -> PlannerConfig {
    PlannerConfig {
        kv_snapshots_retained: 1,
    }
}

#[test]
fn new_buckets_go_to_the_least_loaded_live_nodes() {
    let mut c = Cluster::nodes(3);
    c.table(1, 2, &[1]); // node 1 already leads two buckets
    c.table(2, 5, &[0]);
    c.live.remove(&3); // node 3 is down: it gets nothing
    let mut t = Transcript::new(&c);
    let steps = t.plan("plan", planner::plan(&c.observe(true), &config()));
    let got = leads(&steps);
    assert_eq!(got.len(), 5);
    assert!(got.iter().all(|(_, _, why)| *why == Why::Unassigned));
    let on = |n| got.iter().filter(|(_, node, _)| *node == n).count();
    // They alternate (the table spreads), the less loaded node 2 first on each tie.
    assert_eq!(
        got.iter().map(|(_, node, _)| *node).collect::<Vec<_>>(),
        [2, 1, 2, 1, 2]
    );
    assert_eq!((on(1), on(2), on(3)), (2, 3, 0));
    t.finish("new_buckets");
}

#[test]
fn a_new_tables_buckets_spread_over_the_live_nodes() {
    let mut c = Cluster::nodes(3);
    // Node 1 came back from a restart after its buckets failed over: it leads none.
    c.table(1, 12, &[2, 3]);
    c.table(2, 8, &[0]);
    let mut t = Transcript::new(&c);
    let steps = t.plan("plan", planner::plan(&c.observe(true), &config()));
    let got = leads(&steps);
    assert_eq!(got.len(), 8);
    assert!(got.iter().all(|(_, _, why)| *why == Why::Unassigned));
    let on = |n| got.iter().filter(|(_, node, _)| *node == n).count();
    // Spread over every live node, not all on the empty one; the extra bucket on the least
    // loaded.
    assert_eq!((on(1), on(2), on(3)), (3, 3, 2));
    t.finish("new_table_spreads");
}

#[test]
fn a_restarted_node_takes_its_buckets_back() {
    let mut c = Cluster::nodes(2);
    c.table(1, 4, &[1, 2]);
    // Node 2 restarted: registered again at epoch 2 and heartbeats in that life.
    c.register(2, 2);
    c.live.insert(2, 2);
    let mut t = Transcript::new(&c);
    let steps = t.plan("plan", planner::plan(&c.observe(true), &config()));
    assert_eq!(
        leads(&steps),
        vec![
            ((1, 0, 1), 2, Why::Restarted),
            ((1, 0, 3), 2, Why::Restarted)
        ]
    );
    // Registered again but not heartbeating in the new life yet: wait for it.
    c.live.insert(2, 1);
    let steps = t.plan(
        "plan before the new life heartbeats",
        planner::plan(&c.observe(true), &config()),
    );
    assert!(steps.is_empty(), "{steps:?}");
    t.finish("restarted_node");
}

#[test]
fn a_dead_nodes_buckets_fail_over_to_the_least_loaded_live_nodes() {
    let mut c = Cluster::nodes(3);
    c.table(1, 6, &[1, 2, 3]);
    c.table(2, 2, &[1]);
    c.live.remove(&3);
    let mut t = Transcript::new(&c);
    // A coordinator that has just taken the lease does not declare anyone dead yet.
    let early = t.plan(
        "plan during the failover grace",
        planner::plan(&c.observe(false), &config()),
    );
    assert!(early.is_empty(), "{early:?}");
    let steps = t.plan("plan", planner::plan(&c.observe(true), &config()));
    // Node 1 leads 4, node 2 leads 2: both of node 3's buckets go to node 2.
    assert_eq!(
        leads(&steps),
        vec![
            ((1, 0, 2), 2, Why::Failover { from: 3 }),
            ((1, 0, 5), 2, Why::Failover { from: 3 })
        ]
    );
    // With every node down, nothing can move.
    c.live.clear();
    let none = t.plan(
        "plan with no live node",
        planner::plan(&c.observe(true), &config()),
    );
    assert!(none.is_empty());
    t.finish("failover");
}

#[test]
fn a_cleanly_stopped_nodes_buckets_fail_over_at_once() {
    let mut c = Cluster::nodes(3);
    c.table(1, 6, &[1, 2, 3]);
    // Node 3 stopped with SIGTERM: it expired its own heartbeat in its last life (epoch 1).
    c.live.remove(&3);
    c.stopped.insert(3, 1);
    let mut t = Transcript::new(&c);
    // A coordinator that has just taken the lease (the stopped node held it) moves them
    // during its grace: there is nobody to wait for.
    let steps = t.plan(
        "plan during the failover grace",
        planner::plan(&c.observe(false), &config()),
    );
    assert_eq!(
        leads(&steps),
        vec![
            ((1, 0, 2), 1, Why::Failover { from: 3 }),
            ((1, 0, 5), 2, Why::Failover { from: 3 })
        ]
    );
    t.finish("stopped_node");
}

#[test]
fn drained_nodes_lose_their_buckets_and_get_no_new_ones() {
    let mut c = Cluster::nodes(3);
    c.table(1, 6, &[1, 2, 3]);
    c.table(2, 2, &[0]);
    c.drain(3);
    let mut t = Transcript::new(&c);
    let steps = t.plan("plan", planner::plan(&c.observe(true), &config()));
    let new = leads(&steps);
    assert!(
        new.iter()
            .all(|(_, n, why)| *n != 3 && *why == Why::Unassigned)
    );
    let steps = t.plan("drain", planner::plan_drain(&c.observe(true)));
    let moved = transfers(&steps);
    assert_eq!(moved.len(), 2);
    assert!(
        moved
            .iter()
            .all(|(_, n, why)| *n != 3 && *why == Why::Drain { from: 3 })
    );
    t.finish("drain");
}

#[test]
fn a_rebalance_evens_out_the_buckets_per_node() {
    let mut c = Cluster::nodes(3);
    c.table(1, 8, &[1, 1, 1, 2]);
    // Node 3 joined after the table was created: it leads nothing.
    let mut t = Transcript::new(&c);
    let nothing = t.plan("plan", planner::plan(&c.observe(true), &config()));
    assert!(nothing.is_empty(), "live leaders never move on their own");
    let steps = t.plan("rebalance", planner::plan_rebalance(&c.observe(true)));
    let mut load: BTreeMap<u64, i64> = BTreeMap::from([(1, 6), (2, 2), (3, 0)]);
    for (_, to, why) in transfers(&steps) {
        let Why::Rebalance { from } = why else {
            panic!("{why:?}")
        };
        *load.get_mut(&from).unwrap() -= 1;
        *load.get_mut(&to).unwrap() += 1;
    }
    let (min, max) = (*load.values().min().unwrap(), *load.values().max().unwrap());
    assert!(max - min <= 1, "{load:?}");
    assert_eq!(steps.len(), 3, "as few moves as evening out needs");
    // What `mink cluster rebalance` prints: the table's name and the reason in words.
    c.state.tables.insert(
        1,
        TableRecord {
            table_id: 1,
            database: "app".into(),
            name: "events".into(),
            ..Default::default()
        },
    );
    assert_eq!(
        steps[0].describe(&c.state),
        "move app.events bucket 6 from node 1 to node 3 (to even out the buckets per node)"
    );
    t.finish("rebalance");
}

#[test]
fn old_kv_snapshots_are_dropped() {
    let mut c = Cluster::nodes(1);
    c.table(1, 2, &[1]);
    for id in 1..=3 {
        c.snapshot((1, 0, 0), id);
    }
    c.snapshot((1, 0, 1), 7);
    let mut t = Transcript::new(&c);
    let steps = t.plan("plan", planner::plan(&c.observe(true), &config()));
    let dropped: Vec<u64> = steps
        .iter()
        .filter_map(|s| match s {
            Step::DropKvSnapshot { snapshot_id, .. } => Some(*snapshot_id),
            _ => None,
        })
        .collect();
    assert_eq!(dropped, vec![2, 1], "all but the newest of each bucket");
    let two = t.plan(
        "plan keeping two",
        planner::plan(
            &c.observe(true),
            &PlannerConfig {
                kv_snapshots_retained: 2,
            },
        ),
    );
    assert_eq!(two.len(), 1);
    t.finish("kv_snapshots");
}

#[test]
fn a_move_waits_for_the_leader_to_hand_the_bucket_over() {
    let mut c = Cluster::nodes(3);
    c.table(1, 3, &[1, 2, 3]);
    c.drain(3);
    let mut t = Transcript::new(&c);
    let steps = t.plan("drain", planner::plan_drain(&c.observe(true)));
    assert_eq!(
        transfers(&steps),
        vec![((1, 0, 2), 1, Why::Drain { from: 3 })]
    );
    c.apply(&steps);
    // Pending: the target is not given the bucket, nor is it moved again.
    let t2 = Transcript::new(&c);
    t.out.push_str(&t2.out);
    let waiting = t.plan(
        "plan while node 3 hands over",
        planner::plan(&c.observe(true), &config()),
    );
    assert!(waiting.is_empty(), "{waiting:?}");
    let again = t.plan(
        "drain while node 3 hands over",
        planner::plan_drain(&c.observe(true)),
    );
    assert!(again.is_empty(), "{again:?}");
    // Node 3 closed the stream at its leader epoch: node 1 leads it.
    c.stream(102).state = StreamState::Closed as i32;
    let steps = t.plan(
        "plan once handed over",
        planner::plan(&c.observe(true), &config()),
    );
    assert_eq!(
        leads(&steps),
        vec![((1, 0, 2), 1, Why::HandedOver { from: 3 })]
    );
    t.finish("handover");
}

/// Even totals can hide a table whose buckets one node leads all of (after restarts and
/// failovers): its writes then all land there. A rebalance spreads each table partition too,
/// pairing moves so that the totals stay even.
#[test]
fn a_rebalance_spreads_each_table_over_the_nodes() {
    let mut c = Cluster::nodes(3);
    c.table(1, 3, &[1]);
    c.table(2, 3, &[2]);
    c.table(3, 4, &[3, 3, 3, 1]);
    let mut t = Transcript::new(&c);
    let steps = t.plan("rebalance", planner::plan_rebalance(&c.observe(true)));
    let mut leaders: BTreeMap<(u64, u64, u32), u64> = c
        .state
        .buckets
        .iter()
        .map(|(k, b)| (*k, b.leader_node_id))
        .collect();
    for (bucket, to, why) in transfers(&steps) {
        assert!(matches!(why, Why::Rebalance { .. }), "{why:?}");
        leaders.insert(bucket, to);
    }
    let mut totals: BTreeMap<u64, i64> = BTreeMap::new();
    let mut per_table: BTreeMap<(u64, u64), i64> = BTreeMap::new();
    for ((table, _, _), node) in &leaders {
        *totals.entry(*node).or_default() += 1;
        *per_table.entry((*table, *node)).or_default() += 1;
    }
    let spread = |of: &dyn Fn(u64) -> i64| {
        let counts: Vec<i64> = (1..=3).map(of).collect();
        counts.iter().max().unwrap() - counts.iter().min().unwrap()
    };
    assert!(
        spread(&|n| totals.get(&n).copied().unwrap_or(0)) <= 1,
        "{totals:?}"
    );
    for table in 1..=3 {
        assert!(
            spread(&|n| per_table.get(&(table, n)).copied().unwrap_or(0)) <= 1,
            "table {table}: {per_table:?}"
        );
    }
    assert!(steps.len() <= 6, "{}", steps.len());
    // Once the moves are done, a rebalance plans nothing more.
    for (key, node) in &leaders {
        let epoch = c.state.nodes[node].node_epoch;
        let b = c.state.buckets.get_mut(key).unwrap();
        b.leader_node_id = *node;
        b.leader_node_epoch = epoch;
    }
    let again = t.plan("rebalance again", planner::plan_rebalance(&c.observe(true)));
    assert!(again.is_empty(), "{again:?}");
    t.finish("rebalance_per_table");
}

/// Buckets moving to a node count toward its load but are not its to move: a plan that
/// empties what it owns must not then look there for a table's bucket (it panicked).
#[test]
fn a_rebalance_counts_buckets_under_way_but_moves_only_owned_ones() {
    let mut c = Cluster::nodes(3);
    c.table(1, 2, &[1]);
    c.table(2, 5, &[2]);
    c.table(3, 2, &[2]);
    let moving: Vec<u64> = c
        .state
        .buckets
        .iter()
        .filter(|(k, _)| k.0 == 2)
        .map(|(_, b)| b.stream_id)
        .collect();
    for id in moving {
        let s = c.stream(id);
        s.placement_node_id = 2;
        s.transfer_to_node_id = 1;
    }
    let steps = planner::plan_rebalance(&c.observe(true));
    let moved = transfers(&steps);
    assert!(
        moved
            .iter()
            .all(|(b, _, why)| b.0 == 1 && matches!(why, Why::Rebalance { from: 1 })),
        "{moved:?}"
    );
}

#[test]
fn a_move_that_cannot_finish_is_forced_or_cancelled() {
    let mut c = Cluster::nodes(3);
    c.table(1, 4, &[1, 1, 1, 2]);
    let mut t = Transcript::new(&c);
    let steps = t.plan("rebalance", planner::plan_rebalance(&c.observe(true)));
    assert_eq!(transfers(&steps).len(), 1);
    c.apply(&steps);
    let (bucket, to, _) = transfers(&steps)[0];
    let stream_id = c.state.buckets[&bucket].stream_id;
    // The leader does not hand over in time: the target leads it anyway (fencing it).
    c.overdue.insert(stream_id);
    let steps = t.plan(
        "plan with the handover overdue",
        planner::plan(&c.observe(true), &config()),
    );
    assert_eq!(
        leads(&steps),
        vec![(bucket, to, Why::HandoverOverdue { from: 1 })]
    );
    c.overdue.clear();
    // The target died before the handover: the move is forgotten, the bucket stays.
    c.live.remove(&to);
    let steps = t.plan(
        "plan with the target dead",
        planner::plan(&c.observe(true), &config()),
    );
    assert!(
        matches!(steps.as_slice(), [Step::CancelTransfer { leader: 1, .. }]),
        "{steps:?}"
    );
    c.live.insert(to, 1);
    // The leader died mid-move and the bucket failed over elsewhere: the move is forgotten.
    c.state.buckets.get_mut(&bucket).unwrap().leader_node_id = 2;
    let steps = t.plan(
        "plan after a failover elsewhere",
        planner::plan(&c.observe(true), &config()),
    );
    assert!(
        matches!(steps.as_slice(), [Step::CancelTransfer { leader: 2, .. }]),
        "{steps:?}"
    );
    t.finish("handover_forced_or_cancelled");
}
