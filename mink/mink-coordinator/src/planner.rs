//! The pure planner: what the coordinator should do, from what it sees. No I/O, no clock: the
//! same observation always gives the same steps, in the same order, so golden cases pin it.

use std::collections::{BTreeMap, BTreeSet};

use mink_metadata::{
    BucketKey, BucketRecord, Command, DropKvSnapshot, LeadBucket, PlaceStream, State, StreamRecord,
    StreamState, TransferStream,
};

/// Key prefix of the metadata KV entries marking drained nodes (`coordinator/drained/<id>`):
/// a drained node is given no buckets, and `plan_drain` moves its buckets off it.
pub const DRAINED_PREFIX: &str = "coordinator/drained/";

/// The KV key marking `node_id` drained.
pub fn drained_key(node_id: u64) -> String {
    format!("{DRAINED_PREFIX}{node_id}")
}

/// What the coordinator sees at one moment.
#[derive(Clone, Copy, Debug)]
pub struct Observation<'a> {
    pub state: &'a State,
    /// Nodes whose heartbeat is younger than the lease TTL, with the node epoch it carries.
    pub live: &'a BTreeMap<u64, u64>,
    /// Whether a leader missing from `live` may be declared dead. False while the coordinator
    /// is new: a holder that has just taken the lease gives the other nodes time to be seen
    /// heartbeating before it moves their buckets (a whole cluster starting at once).
    pub failover: bool,
    /// Nodes that stopped cleanly (expired their own heartbeat on the way out), with the node
    /// epoch they stopped at. Their buckets fail over at once, grace or not: nothing is left to
    /// wait for.
    pub stopped: &'a BTreeMap<u64, u64>,
    /// Streams whose transfer has been pending longer than the coordinator waits for a
    /// leader to hand a bucket over: their target leads them anyway (which fences the old
    /// leader, as a failover does).
    pub overdue: &'a BTreeSet<u64>,
}

/// How the planner behaves.
#[derive(Clone, Debug)]
pub struct PlannerConfig {
    /// KV snapshots kept per bucket; older ones are dropped.
    pub kv_snapshots_retained: usize,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            kv_snapshots_retained: 1,
        }
    }
}

/// Why a bucket gets a new leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    /// It has none yet (a new table or partition).
    Unassigned,
    /// Its leader restarted (registered again at a new node epoch): the new life takes it back.
    Restarted,
    /// Its leader's heartbeat expired: the least loaded live node takes it.
    Failover { from: u64 },
    /// An operator asked to even out the buckets per node.
    Rebalance { from: u64 },
    /// Its leader is drained.
    Drain { from: u64 },
    /// Its leader handed it over (closed its stream) in a move to this node.
    HandedOver { from: u64 },
    /// A move to this node waited too long for its leader to hand it over.
    HandoverOverdue { from: u64 },
}

/// One thing to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Make `node_id` the bucket's leader at the next leader epoch (`LeadBucket`); the new
    /// leader opens the bucket's stream at that epoch, which fences the old one.
    Lead {
        bucket: BucketKey,
        node_id: u64,
        why: Why,
    },
    /// Move a bucket gracefully (`TransferStream`, after `PlaceStream` on `from` when the
    /// stream is not placed there yet): its leader stops taking writes (redirecting them to
    /// `to`), waits for the appends in flight and closes the stream; once the stream is closed
    /// the planner leads the bucket on `to` ([`Why::HandedOver`]), which completes the
    /// transfer (`CompleteTransfer`).
    Transfer {
        bucket: BucketKey,
        stream_id: u64,
        from: u64,
        to: u64,
        place_first: bool,
        why: Why,
    },
    /// Forget a transfer that can no longer happen (its target is gone, or the bucket moved
    /// otherwise): `PlaceStream` on the bucket's leader.
    CancelTransfer {
        bucket: BucketKey,
        stream_id: u64,
        leader: u64,
    },
    /// Forget a KV snapshot older than the ones kept (`DropKvSnapshot`); once that is
    /// committed its file at `location` may be deleted.
    DropKvSnapshot {
        bucket: BucketKey,
        snapshot_id: u64,
        location: String,
    },
}

impl Step {
    /// The commands carrying this step under `coordinator_epoch`, to propose in order.
    pub fn commands(&self, coordinator_epoch: u64) -> Vec<Command> {
        match self {
            Step::Lead {
                bucket: (table_id, partition_id, bucket),
                node_id,
                ..
            } => vec![Command::LeadBucket(LeadBucket {
                coordinator_epoch,
                table_id: *table_id,
                partition_id: *partition_id,
                bucket: *bucket,
                leader_node_id: *node_id,
            })],
            Step::Transfer {
                stream_id,
                from,
                to,
                place_first,
                ..
            } => {
                let place = Command::PlaceStream(PlaceStream {
                    coordinator_epoch,
                    stream_id: *stream_id,
                    node_id: *from,
                });
                let transfer = Command::TransferStream(TransferStream {
                    coordinator_epoch,
                    stream_id: *stream_id,
                    from_node_id: *from,
                    to_node_id: *to,
                });
                if *place_first {
                    vec![place, transfer]
                } else {
                    vec![transfer]
                }
            }
            Step::CancelTransfer {
                stream_id, leader, ..
            } => vec![Command::PlaceStream(PlaceStream {
                coordinator_epoch,
                stream_id: *stream_id,
                node_id: *leader,
            })],
            Step::DropKvSnapshot {
                bucket: (table_id, partition_id, bucket),
                snapshot_id,
                ..
            } => vec![Command::DropKvSnapshot(DropKvSnapshot {
                coordinator_epoch,
                table_id: *table_id,
                partition_id: *partition_id,
                bucket: *bucket,
                snapshot_id: *snapshot_id,
            })],
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Lead {
                bucket: (t, p, b),
                node_id,
                why,
            } => write!(f, "lead bucket {t}/{p}/{b} on node {node_id} ({why:?})"),
            Step::Transfer {
                bucket: (t, p, b),
                from,
                to,
                why,
                ..
            } => write!(
                f,
                "move bucket {t}/{p}/{b} from node {from} to node {to} ({why:?})"
            ),
            Step::CancelTransfer {
                bucket: (t, p, b),
                leader,
                ..
            } => write!(
                f,
                "cancel the move of bucket {t}/{p}/{b} (it stays on node {leader})"
            ),
            Step::DropKvSnapshot {
                bucket: (t, p, b),
                snapshot_id,
                location,
            } => write!(
                f,
                "drop KV snapshot {snapshot_id} of bucket {t}/{p}/{b} ({location})"
            ),
        }
    }
}

impl std::fmt::Display for Why {
    /// The reason in an operator's words.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::Unassigned => write!(f, "it had no leader"),
            Why::Restarted => write!(f, "its leader restarted"),
            Why::Failover { from } => write!(f, "node {from} stopped heartbeating"),
            Why::Rebalance { .. } => write!(f, "to even out the buckets per node"),
            Why::Drain { from } => write!(f, "node {from} is drained"),
            Why::HandedOver { from } => write!(f, "node {from} handed it over"),
            Why::HandoverOverdue { from } => {
                write!(f, "node {from} did not hand it over in time")
            }
        }
    }
}

/// A bucket by its table's name: `app.events bucket 3`, or `app.events partition 2024-01-01
/// bucket 3` (ids only when the table is not in `state`).
pub fn bucket_name(state: &State, (table_id, partition_id, bucket): BucketKey) -> String {
    let table = state.tables.get(&table_id).map_or_else(
        || format!("table {table_id}"),
        |t| format!("{}.{}", t.database, t.name),
    );
    let partition = match state.partitions.get(&(table_id, partition_id)) {
        Some(p) => format!(" partition {}", p.name),
        None if partition_id != 0 => format!(" partition {partition_id}"),
        None => String::new(),
    };
    format!("{table}{partition} bucket {bucket}")
}

impl Step {
    /// The step for an operator (`mink cluster rebalance`): buckets by their table's name in
    /// `state`, the reason in words. [`Step`]'s `Display` is the compact form, with ids.
    pub fn describe(&self, state: &State) -> String {
        match self {
            Step::Lead {
                bucket,
                node_id,
                why,
            } => format!(
                "lead {} on node {node_id} ({why})",
                bucket_name(state, *bucket)
            ),
            Step::Transfer {
                bucket,
                from,
                to,
                why,
                ..
            } => format!(
                "move {} from node {from} to node {to} ({why})",
                bucket_name(state, *bucket)
            ),
            Step::CancelTransfer { bucket, leader, .. } => format!(
                "cancel the move of {} (it stays on node {leader})",
                bucket_name(state, *bucket)
            ),
            Step::DropKvSnapshot {
                bucket,
                snapshot_id,
                location,
            } => format!(
                "drop KV snapshot {snapshot_id} of {} ({location})",
                bucket_name(state, *bucket)
            ),
        }
    }
}

/// Nodes marked drained in the metadata.
pub fn drained(state: &State) -> BTreeSet<u64> {
    state
        .kv
        .range(DRAINED_PREFIX.to_string()..)
        .take_while(|(k, _)| k.starts_with(DRAINED_PREFIX))
        .filter_map(|(k, _)| k[DRAINED_PREFIX.len()..].parse().ok())
        .collect()
}

/// The node a bucket's pending move goes to: its stream is being transferred away from the
/// node it is placed on, which still leads it.
pub fn moving_to(state: &State, b: &BucketRecord) -> Option<u64> {
    let s = state.streams.get(&b.stream_id)?;
    (s.transfer_to_node_id != 0
        && s.placement_node_id == b.leader_node_id
        && s.transfer_to_node_id != b.leader_node_id)
        .then_some(s.transfer_to_node_id)
}

/// Whether the leader has handed the bucket over: its stream is closed at the leader epoch.
pub fn handed_over(stream: &StreamRecord, b: &BucketRecord) -> bool {
    stream.state == StreamState::Closed as i32 && stream.epoch == b.leader_epoch
}

/// Buckets led per node (leaders of any epoch), a bucket being moved counted on its target.
fn load(state: &State) -> BTreeMap<u64, usize> {
    let mut load = BTreeMap::new();
    for b in state.buckets.values() {
        let node = moving_to(state, b).unwrap_or(b.leader_node_id);
        if node != 0 {
            *load.entry(node).or_insert(0) += 1;
        }
    }
    load
}

/// Buckets of each table per node, (table, node) → count, counted as [`load`] counts them.
fn table_load(state: &State) -> BTreeMap<(u64, u64), usize> {
    let mut load = BTreeMap::new();
    for b in state.buckets.values() {
        let node = moving_to(state, b).unwrap_or(b.leader_node_id);
        if node != 0 {
            *load.entry((b.table_id, node)).or_insert(0) += 1;
        }
    }
    load
}

/// The candidate leading the fewest buckets of `table_id`, then the least loaded, then the
/// lowest id, counted as taking one more: a new table spreads over the live nodes even when
/// one of them leads far fewer buckets overall (a restarted node), as Kafka spreads a topic's
/// partitions over the brokers.
fn take_spreading(
    candidates: &mut BTreeMap<u64, usize>,
    per_table: &mut BTreeMap<(u64, u64), usize>,
    table_id: u64,
) -> Option<u64> {
    let (&id, _) = candidates.iter().min_by_key(|(id, n)| {
        let of_table = per_table.get(&(table_id, **id)).copied().unwrap_or(0);
        (of_table, **n, **id)
    })?;
    *candidates.get_mut(&id).expect("present") += 1;
    *per_table.entry((table_id, id)).or_insert(0) += 1;
    Some(id)
}

/// Live nodes that may take buckets (registered, not drained), with their load.
fn candidates(obs: &Observation<'_>) -> BTreeMap<u64, usize> {
    let drained = drained(obs.state);
    let load = load(obs.state);
    obs.live
        .keys()
        .filter(|&id| obs.state.nodes.contains_key(id) && !drained.contains(id))
        .map(|id| (*id, load.get(id).copied().unwrap_or(0)))
        .collect()
}

/// The least loaded candidate (the lowest id among equals), counted as taking one more.
fn take_least_loaded(candidates: &mut BTreeMap<u64, usize>) -> Option<u64> {
    let (&id, _) = candidates.iter().min_by_key(|(id, n)| (**n, **id))?;
    *candidates.get_mut(&id).expect("present") += 1;
    Some(id)
}

/// Whether the node leading `b` is alive in the life that leads it.
fn leader_state(obs: &Observation<'_>, b: &BucketRecord) -> LeaderState {
    if b.leader_node_id == 0 {
        return LeaderState::None;
    }
    let registered = obs.state.nodes.get(&b.leader_node_id).map(|n| n.node_epoch);
    match (obs.live.get(&b.leader_node_id), registered) {
        // Registered again since it was given the bucket, and heartbeating in that new life.
        (Some(&live_epoch), Some(epoch)) if epoch != b.leader_node_epoch && live_epoch == epoch => {
            LeaderState::Restarted
        }
        (Some(_), _) => LeaderState::Live,
        (None, _) => LeaderState::Dead,
    }
}

enum LeaderState {
    None,
    Live,
    Restarted,
    Dead,
}

/// Every bucket's leadership: unassigned buckets to the live node leading the fewest buckets
/// of their table (the least loaded among those), buckets of a restarted leader back to it,
/// and (with `obs.failover`, or at once when it stopped cleanly) buckets of a dead leader to
/// the least loaded live nodes. Buckets
/// led by a live node never move here (see [`plan_rebalance`]).
pub fn plan_leadership(obs: &Observation<'_>) -> Vec<Step> {
    let mut candidates = candidates(obs);
    let mut per_table = table_load(obs.state);
    let mut steps = Vec::new();
    for (key, b) in obs.state.buckets.iter() {
        let why = match leader_state(obs, b) {
            LeaderState::Live => {
                steps.extend(plan_transfer(obs, &candidates, *key, b));
                continue;
            }
            LeaderState::Restarted => {
                // Its new life takes it back, even when drained (a drain moves it next).
                steps.push(Step::Lead {
                    bucket: *key,
                    node_id: b.leader_node_id,
                    why: Why::Restarted,
                });
                continue;
            }
            LeaderState::None => Why::Unassigned,
            LeaderState::Dead
                if obs.failover
                    || obs.stopped.get(&b.leader_node_id) == Some(&b.leader_node_epoch) =>
            {
                Why::Failover {
                    from: b.leader_node_id,
                }
            }
            LeaderState::Dead => continue,
        };
        let node = if why == Why::Unassigned {
            take_spreading(&mut candidates, &mut per_table, key.0)
        } else {
            take_least_loaded(&mut candidates).inspect(|id| {
                *per_table.entry((key.0, *id)).or_insert(0) += 1;
            })
        };
        if let Some(node_id) = node {
            steps.push(Step::Lead {
                bucket: *key,
                node_id,
                why,
            });
        }
    }
    steps
}

/// The next step of a pending transfer of a bucket whose leader is live, if any: lead it on
/// the target once the leader has handed it over (or the handover is overdue); forget the
/// transfer when its target may no longer take buckets or the bucket is led elsewhere.
fn plan_transfer(
    obs: &Observation<'_>,
    candidates: &BTreeMap<u64, usize>,
    key: BucketKey,
    b: &BucketRecord,
) -> Option<Step> {
    let stream = obs.state.streams.get(&b.stream_id)?;
    let to = stream.transfer_to_node_id;
    if to == 0 || to == b.leader_node_id {
        // None pending, or the target leads it already (and completes the transfer).
        return None;
    }
    let from = stream.placement_node_id;
    if from != b.leader_node_id || !candidates.contains_key(&to) {
        return Some(Step::CancelTransfer {
            bucket: key,
            stream_id: b.stream_id,
            leader: b.leader_node_id,
        });
    }
    let why = if handed_over(stream, b) {
        Why::HandedOver { from }
    } else if obs.overdue.contains(&b.stream_id) {
        Why::HandoverOverdue { from }
    } else {
        return None;
    };
    Some(Step::Lead {
        bucket: key,
        node_id: to,
        why,
    })
}

/// KV snapshots beyond the newest `kv_snapshots_retained` of each bucket.
pub fn plan_kv_snapshot_pruning(state: &State, config: &PlannerConfig) -> Vec<Step> {
    let keep = config.kv_snapshots_retained.max(1);
    let mut by_bucket: BTreeMap<BucketKey, Vec<(u64, &str)>> = BTreeMap::new();
    for ((t, p, b, id), s) in state.kv_snapshots.iter() {
        by_bucket
            .entry((*t, *p, *b))
            .or_default()
            .push((*id, s.location.as_str()));
    }
    let mut steps = Vec::new();
    for (bucket, mut snapshots) in by_bucket {
        snapshots.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
        for (snapshot_id, location) in snapshots.into_iter().skip(keep) {
            steps.push(Step::DropKvSnapshot {
                bucket,
                snapshot_id,
                location: location.to_string(),
            });
        }
    }
    steps
}

/// Leadership, then KV snapshot pruning: what the coordinator does on every tick.
pub fn plan(obs: &Observation<'_>, config: &PlannerConfig) -> Vec<Step> {
    let mut steps = plan_leadership(obs);
    steps.extend(plan_kv_snapshot_pruning(obs.state, config));
    steps
}

/// Moves of every bucket off drained live nodes, to the least loaded others: what the
/// coordinator does on every tick while a node is drained.
pub fn plan_drain(obs: &Observation<'_>) -> Vec<Step> {
    moves(obs, false)
}

/// [`plan_drain`], then moves that even out the buckets led per live, undrained node (at most
/// one apart afterwards): from the most loaded node to the least loaded, one bucket at a
/// time, the highest bucket key of the most loaded first. Buckets whose leader is not live
/// are left to failover. What `mink cluster rebalance` does.
pub fn plan_rebalance(obs: &Observation<'_>) -> Vec<Step> {
    moves(obs, true)
}

fn moves(obs: &Observation<'_>, even_out: bool) -> Vec<Step> {
    let drained = drained(obs.state);
    let mut candidates = candidates(obs);
    if candidates.is_empty() {
        return Vec::new();
    }
    // Buckets per live leader, in key order.
    let mut owned: BTreeMap<u64, Vec<BucketKey>> = BTreeMap::new();
    for (key, b) in obs.state.buckets.iter() {
        let moving = obs
            .state
            .streams
            .get(&b.stream_id)
            .is_some_and(|s| s.transfer_to_node_id != 0);
        if matches!(leader_state(obs, b), LeaderState::Live) && !moving {
            owned.entry(b.leader_node_id).or_default().push(*key);
        }
    }
    let transfer = |key: BucketKey, from: u64, to: u64, why: Why| {
        let stream_id = obs.state.buckets[&key].stream_id;
        let place_first = obs
            .state
            .streams
            .get(&stream_id)
            .is_none_or(|s| s.placement_node_id != from);
        Step::Transfer {
            bucket: key,
            stream_id,
            from,
            to,
            place_first,
            why,
        }
    };
    let mut steps = Vec::new();
    for (node, keys) in owned.iter_mut().filter(|(n, _)| drained.contains(n)) {
        for key in std::mem::take(keys) {
            let Some(to) = take_least_loaded(&mut candidates) else {
                break;
            };
            steps.push(transfer(key, *node, to, Why::Drain { from: *node }));
        }
    }
    if !even_out {
        return steps;
    }
    // Buckets each node leads per table partition: a rebalance evens out those too, or a hot
    // table's writes can all land on one node while the totals look even.
    let mut spread: BTreeMap<(u64, u64), BTreeMap<u64, usize>> = BTreeMap::new();
    for (node, keys) in &owned {
        for k in keys {
            *spread
                .entry((k.0, k.1))
                .or_default()
                .entry(*node)
                .or_default() += 1;
        }
    }
    let count = |spread: &BTreeMap<(u64, u64), BTreeMap<u64, usize>>, g: (u64, u64), n: u64| {
        spread.get(&g).and_then(|c| c.get(&n)).copied().unwrap_or(0)
    };
    // Moves `at` of `owned[from]` to `to`, keeping the counts.
    let mut shift = |owned: &mut BTreeMap<u64, Vec<BucketKey>>,
                     spread: &mut BTreeMap<(u64, u64), BTreeMap<u64, usize>>,
                     candidates: &mut BTreeMap<u64, usize>,
                     at: usize,
                     from: u64,
                     to: u64| {
        // Counted at its new leader, but not moved again in this plan (a move is one
        // transfer, done before the next plan).
        let key = owned.get_mut(&from).expect("owned").remove(at);
        let g = spread.entry((key.0, key.1)).or_default();
        *g.get_mut(&from).expect("counted") -= 1;
        *g.entry(to).or_default() += 1;
        *candidates.get_mut(&from).expect("present") -= 1;
        *candidates.get_mut(&to).expect("present") += 1;
        steps.push(transfer(key, from, to, Why::Rebalance { from }));
    };
    // The totals first: from the most loaded node to the least, the bucket whose table it
    // holds most of relative to the target.
    loop {
        let (&most, &high) = candidates
            .iter()
            .max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id)))
            .expect("candidates");
        let (&least, &low) = candidates
            .iter()
            .min_by_key(|(id, n)| (**n, **id))
            .expect("candidates");
        if high <= low + 1 {
            break;
        }
        let Some(at) = owned.get(&most).and_then(|keys| {
            // The last among equals (max_by_key keeps the last), as before per-table counts.
            (0..keys.len()).max_by_key(|&i| {
                let g = (keys[i].0, keys[i].1);
                count(&spread, g, most) as i64 - count(&spread, g, least) as i64
            })
        }) else {
            break;
        };
        shift(&mut owned, &mut spread, &mut candidates, at, most, least);
    }
    // Then each table partition: a bucket from a node leading two more of it than another
    // node, paired (when the totals need it) with a bucket of a table the other node leads
    // more of. Each move lowers the sum of squared counts, so this ends.
    let nodes: Vec<u64> = candidates.keys().copied().collect();
    for _ in 0..obs.state.buckets.len() {
        let even = |c: &BTreeMap<u64, usize>| {
            c.values().max().unwrap_or(&0) - c.values().min().unwrap_or(&0) <= 1
        };
        // Per table partition, its most and least loaded nodes (the lowest ids among equals).
        let mut uneven: Vec<(usize, (u64, u64), u64, u64)> = Vec::new();
        for &g in spread.keys() {
            let by = |n: &&u64| count(&spread, g, **n);
            let (Some(&a), Some(&b)) = (
                nodes.iter().max_by_key(|n| (by(n), std::cmp::Reverse(**n))),
                nodes.iter().min_by_key(|n| (by(n), **n)),
            ) else {
                continue;
            };
            let (ca, cb) = (count(&spread, g, a), count(&spread, g, b));
            if ca >= cb + 2 {
                uneven.push((ca - cb, g, a, b));
            }
        }
        uneven.sort_by(|x, y| y.0.cmp(&x.0).then((x.1, x.2, x.3).cmp(&(y.1, y.2, y.3))));
        let mut moved = false;
        for (_, g, a, b) in uneven {
            // A node counted with buckets moving to it (or moved to it above) may own none.
            let Some(at) = owned
                .get(&a)
                .and_then(|keys| (0..keys.len()).rev().find(|&i| (keys[i].0, keys[i].1) == g))
            else {
                continue;
            };
            let mut after = candidates.clone();
            *after.get_mut(&a).expect("present") -= 1;
            *after.get_mut(&b).expect("present") += 1;
            if even(&after) {
                shift(&mut owned, &mut spread, &mut candidates, at, a, b);
                moved = true;
                break;
            }
            let back = owned.get(&b).and_then(|keys| {
                (0..keys.len()).rev().find(|&i| {
                    let u = (keys[i].0, keys[i].1);
                    u != g && count(&spread, u, b) > count(&spread, u, a)
                })
            });
            if let Some(back) = back {
                shift(&mut owned, &mut spread, &mut candidates, at, a, b);
                shift(&mut owned, &mut spread, &mut candidates, back, b, a);
                moved = true;
                break;
            }
        }
        if !moved {
            break;
        }
    }
    steps
}

/// Nodes that hold committed objects but are not live: the coordinator compacts their
/// objects, since nobody else will.
pub fn dead_nodes_with_objects(state: &State, live: &BTreeMap<u64, u64>) -> BTreeSet<u64> {
    state
        .objects
        .values()
        .filter(|o| {
            o.state() == mink_metadata::ObjectState::Committed && !live.contains_key(&o.node_id)
        })
        .map(|o| o.node_id)
        .collect()
}
