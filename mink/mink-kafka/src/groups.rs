//! Consumer groups, Kafka's classic protocol: members join, the leader assigns partitions
//! (with the clients' own assignors, range or roundrobin), everyone syncs and heartbeats; a
//! member that stops heartbeating or leaves starts a rebalance.
//!
//! The coordinator of every group is the node holding the cluster's lease (it is in every
//! node's view; FindCoordinator names it, and other nodes answer NOT_COORDINATOR). Membership
//! lives in its memory; a group's generation and committed offsets go through the command log
//! ([`mink_node::Node::set_group_generation`], [`mink_node::Node::commit_group_offsets`]), so
//! after a failover the next lease holder continues past the last generation, the members
//! rejoin there, and no committed offset is lost.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupResponse, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;
use mink_node::Node;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How often sessions and rebalance deadlines are checked.
pub(crate) const TICK: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl Phase {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Empty => "Empty",
            Phase::PreparingRebalance => "PreparingRebalance",
            Phase::CompletingRebalance => "CompletingRebalance",
            Phase::Stable => "Stable",
        }
    }
}

pub(crate) struct Member {
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    /// A static member's `group.instance.id`.
    pub(crate) instance_id: Option<String>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    pub(crate) protocols: Vec<(String, Bytes)>,
    last_seen: Instant,
    pub(crate) assignment: Bytes,
    /// This member's JoinGroup waiting for the round to complete.
    joining: Option<(oneshot::Sender<JoinGroupResponse>, i16)>,
    /// This member's SyncGroup waiting for the leader's assignment.
    syncing: Option<oneshot::Sender<SyncGroupResponse>>,
}

pub(crate) struct Group {
    pub(crate) phase: Phase,
    pub(crate) generation: i32,
    pub(crate) protocol_type: String,
    pub(crate) protocol: Option<String>,
    pub(crate) leader: Option<String>,
    pub(crate) members: BTreeMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, not joined yet.
    pending: HashSet<String>,
    /// When a rebalance stops waiting for members that have not rejoined.
    deadline: Option<Instant>,
    /// A rebalance of a group that was empty completes no sooner than this, so members
    /// starting together join one generation (Kafka's `group.initial.rebalance.delay.ms`).
    not_before: Option<Instant>,
    /// Since when the group has had no members (None while it has some).
    empty_since: Option<Instant>,
    /// Taken over from another coordinator at its last recorded generation, and no rebalance
    /// completed here since: the members of that generation are not known here, and their
    /// commits at it are taken (as Kafka's coordinator, which loads them, takes them).
    inherited: bool,
}

/// The groups this node coordinates.
pub(crate) struct Groups {
    node: Node,
    initial_delay: Duration,
    empty_retention: Duration,
    pub(crate) groups: Mutex<BTreeMap<String, Group>>,
    /// Groups this coordinator dropped (emptied, or deleted): their recorded generation is not
    /// another coordinator's, so its members' commits are not taken as after a failover.
    forgotten: Mutex<HashSet<String>>,
    next_member: std::sync::atomic::AtomicU64,
}

/// What a JoinGroup asks.
pub(crate) struct Join {
    pub(crate) group: String,
    pub(crate) member_id: String,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    /// `group.instance.id` (JoinGroup from version 5): a static member.
    pub(crate) instance_id: Option<String>,
    pub(crate) session_timeout: Duration,
    pub(crate) rebalance_timeout: Duration,
    pub(crate) protocol_type: String,
    pub(crate) protocols: Vec<(String, Bytes)>,
    /// The request's version: from 4, a new member first gets its id (MEMBER_ID_REQUIRED).
    pub(crate) version: i16,
}

fn join_error(code: ResponseError, member_id: &str) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(code.code())
        .with_generation_id(-1)
        .with_member_id(StrBytes::from_string(member_id.to_string()))
}

fn sync_error(code: ResponseError) -> SyncGroupResponse {
    SyncGroupResponse::default().with_error_code(code.code())
}

impl Groups {
    pub(crate) fn new(node: Node, initial_delay: Duration, empty_retention: Duration) -> Self {
        Groups {
            node,
            initial_delay,
            empty_retention,
            groups: Mutex::new(BTreeMap::new()),
            forgotten: Mutex::new(HashSet::new()),
            next_member: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// Drops `group` (DeleteGroups): its members' commits at its last generation are refused
    /// from then on.
    pub(crate) fn forget(&self, groups: &mut BTreeMap<String, Group>, group: &str) {
        groups.remove(group);
        remember(&mut self.forgotten.lock().expect("forgotten"), group);
    }

    /// Whether this node coordinates groups now.
    pub(crate) fn coordinating(&self) -> bool {
        self.node.group_coordinator() == Some(self.node.node_id())
    }

    fn new_member_id(&self, client_id: &str) -> String {
        let n = self
            .next_member
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!(
            "{client_id}-{}-{}-{n}",
            self.node.node_id(),
            self.node.now_ms()
        )
    }

    /// A JoinGroup: resolves when the round it joins completes (or at once with an error).
    pub(crate) async fn join(&self, j: Join) -> JoinGroupResponse {
        let answer = {
            let mut groups = self.groups.lock().expect("groups");
            let group = groups.entry(j.group.clone()).or_insert_with(|| {
                // A group new to this coordinator continues past the last recorded generation.
                let generation = self.node.group_generation(&j.group);
                let dropped_here = self.forgotten.lock().expect("forgotten").remove(&j.group);
                Group {
                    phase: Phase::Empty,
                    generation,
                    protocol_type: j.protocol_type.clone(),
                    protocol: None,
                    leader: None,
                    members: BTreeMap::new(),
                    pending: HashSet::new(),
                    deadline: None,
                    not_before: None,
                    empty_since: None,
                    inherited: generation > 0 && !dropped_here,
                }
            });
            if !group.members.is_empty() && group.protocol_type != j.protocol_type {
                return join_error(ResponseError::InconsistentGroupProtocol, &j.member_id);
            }
            let mut member_id = j.member_id.clone();
            // A static member joining anew replaces its earlier self at once: librdkafka's
            // static members send no LeaveGroup on close, so the one before stayed a member
            // until its session expired, and the group waited for it to rejoin (30 s by
            // default). It leaves as if it had sent one; its partitions are assigned again.
            if member_id.is_empty()
                && let Some(instance) = &j.instance_id
                && let Some(earlier) = group
                    .members
                    .iter()
                    .find(|(_, m)| m.instance_id.as_ref() == Some(instance))
                    .map(|(id, _)| id.clone())
            {
                depart(group, &earlier);
            }
            if member_id.is_empty() {
                member_id = self.new_member_id(&j.client_id);
                if j.version >= 4 {
                    group.pending.insert(member_id.clone());
                    return join_error(ResponseError::MemberIdRequired, &member_id);
                }
            } else if !group.members.contains_key(&member_id) && !group.pending.remove(&member_id) {
                return join_error(ResponseError::UnknownMemberId, &member_id);
            }
            let shares_a_protocol = group.members.values().all(|m| {
                m.protocols
                    .iter()
                    .any(|(name, _)| j.protocols.iter().any(|(n, _)| n == name))
            });
            if j.protocols.is_empty() || !shares_a_protocol {
                return join_error(ResponseError::InconsistentGroupProtocol, &member_id);
            }
            let now = Instant::now();
            // A member of the current generation joining again as it was (its answer was lost,
            // or its client rejoins to be safe) gets that generation back, as from Kafka: a new
            // round would make every member rejoin, and members that each rejoin in turn would
            // never see one complete. The leader of a stable group starts a new round (so it
            // can assign again), and so does a member whose protocols changed.
            let unchanged = group
                .members
                .get(&member_id)
                .is_some_and(|m| m.protocols == j.protocols);
            let leads = group.leader.as_deref() == Some(member_id.as_str());
            if unchanged
                && (group.phase == Phase::CompletingRebalance
                    || (group.phase == Phase::Stable && !leads))
            {
                if let Some(m) = group.members.get_mut(&member_id) {
                    m.last_seen = now;
                }
                return current_generation(group, &member_id);
            }
            let (tx, rx) = oneshot::channel();
            let member = group.members.entry(member_id.clone()).or_insert(Member {
                client_id: j.client_id.clone(),
                client_host: j.client_host.clone(),
                instance_id: j.instance_id.clone(),
                session_timeout: j.session_timeout,
                rebalance_timeout: j.rebalance_timeout,
                protocols: Vec::new(),
                last_seen: now,
                assignment: Bytes::new(),
                joining: None,
                syncing: None,
            });
            member.protocols = j.protocols;
            member.session_timeout = j.session_timeout;
            member.rebalance_timeout = j.rebalance_timeout;
            member.last_seen = now;
            member.joining = Some((tx, j.version));
            group.protocol_type = j.protocol_type;
            if group.phase == Phase::Empty {
                group.not_before = Some(now + self.initial_delay);
            }
            if group.phase != Phase::PreparingRebalance {
                prepare_rebalance(group, now);
            }
            rx
        };
        self.complete_joins(&j.group).await;
        answer
            .await
            .unwrap_or_else(|_| join_error(ResponseError::RebalanceInProgress, &j.member_id))
    }

    /// Completes the rebalance of `group` if every member has rejoined (or, `expired`, drops
    /// those that have not and completes it): a new generation, recorded, then the answers.
    async fn complete_joins(&self, group_id: &str) {
        self.complete_joins_at(group_id, false).await;
    }

    async fn complete_joins_at(&self, group_id: &str, expired: bool) {
        let (generation, answers) = {
            let mut groups = self.groups.lock().expect("groups");
            let Some(group) = groups.get_mut(group_id) else {
                return;
            };
            if group.phase != Phase::PreparingRebalance {
                return;
            }
            if expired {
                group.members.retain(|_, m| m.joining.is_some());
            } else if group.members.values().any(|m| m.joining.is_none())
                || group.not_before.is_some_and(|t| Instant::now() < t)
            {
                return;
            }
            group.not_before = None;
            if group.members.is_empty() {
                group.phase = Phase::Empty;
                group.deadline = None;
                return;
            }
            group.generation += 1;
            group.inherited = false;
            group.deadline = None;
            group.phase = Phase::CompletingRebalance;
            if group
                .leader
                .as_ref()
                .is_none_or(|l| !group.members.contains_key(l))
            {
                group.leader = group.members.keys().next().cloned();
            }
            let leader = group.leader.clone().unwrap_or_default();
            // The leader's most preferred protocol every member supports.
            let protocol = group.members.get(&leader).and_then(|l| {
                l.protocols.iter().map(|(n, _)| n.clone()).find(|n| {
                    group
                        .members
                        .values()
                        .all(|m| m.protocols.iter().any(|(p, _)| p == n))
                })
            });
            group.protocol = protocol;
            let joined: Vec<String> = group
                .members
                .iter()
                .filter(|(_, m)| m.joining.is_some())
                .map(|(id, _)| id.clone())
                .collect();
            let answers: Vec<_> = joined
                .iter()
                .filter_map(|id| {
                    let response = current_generation(group, id);
                    let (tx, _) = group.members.get_mut(id)?.joining.take()?;
                    Some((tx, response))
                })
                .collect();
            (group.generation, answers)
        };
        if let Err(e) = self.node.set_group_generation(group_id, generation).await {
            tracing::warn!(group = group_id, generation, error = %e, "recording a generation failed");
        }
        for (tx, response) in answers {
            let _ = tx.send(response);
        }
    }

    /// A SyncGroup: the leader's assignments end the rebalance; every member gets its own.
    pub(crate) async fn sync(
        &self,
        group_id: &str,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncGroupResponse {
        let rx = {
            let mut groups = self.groups.lock().expect("groups");
            let Some(group) = groups.get_mut(group_id) else {
                return sync_error(ResponseError::UnknownMemberId);
            };
            if !group.members.contains_key(member_id) {
                return sync_error(ResponseError::UnknownMemberId);
            }
            if generation != group.generation {
                return sync_error(ResponseError::IllegalGeneration);
            }
            match group.phase {
                Phase::PreparingRebalance | Phase::Empty => {
                    return sync_error(ResponseError::RebalanceInProgress);
                }
                Phase::Stable => {
                    let m = &group.members[member_id];
                    return self.synced(group, m.assignment.clone());
                }
                Phase::CompletingRebalance => {}
            }
            let (tx, rx) = oneshot::channel();
            if let Some(m) = group.members.get_mut(member_id) {
                m.syncing = Some(tx);
                m.last_seen = Instant::now();
            }
            if group.leader.as_deref() == Some(member_id) {
                for (id, assignment) in assignments {
                    if let Some(m) = group.members.get_mut(&id) {
                        m.assignment = assignment;
                    }
                }
                group.phase = Phase::Stable;
                let protocol_type = group.protocol_type.clone();
                let protocol = group.protocol.clone();
                for m in group.members.values_mut() {
                    if let Some(tx) = m.syncing.take() {
                        let _ = tx.send(
                            SyncGroupResponse::default()
                                .with_protocol_type(Some(StrBytes::from_string(
                                    protocol_type.clone(),
                                )))
                                .with_protocol_name(protocol.clone().map(StrBytes::from_string))
                                .with_assignment(m.assignment.clone()),
                        );
                    }
                }
            }
            rx
        };
        rx.await
            .unwrap_or_else(|_| sync_error(ResponseError::RebalanceInProgress))
    }

    fn synced(&self, group: &Group, assignment: Bytes) -> SyncGroupResponse {
        SyncGroupResponse::default()
            .with_protocol_type(Some(StrBytes::from_string(group.protocol_type.clone())))
            .with_protocol_name(group.protocol.clone().map(StrBytes::from_string))
            .with_assignment(assignment)
    }

    /// A Heartbeat: keeps the member's session; tells it to rejoin during a rebalance.
    pub(crate) fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        generation: i32,
    ) -> ResponseError {
        let mut groups = self.groups.lock().expect("groups");
        let Some(group) = groups.get_mut(group_id) else {
            return ResponseError::UnknownMemberId;
        };
        let phase = group.phase;
        let current = group.generation;
        let Some(m) = group.members.get_mut(member_id) else {
            return ResponseError::UnknownMemberId;
        };
        m.last_seen = Instant::now();
        match phase {
            Phase::PreparingRebalance => ResponseError::RebalanceInProgress,
            _ if generation != current => ResponseError::IllegalGeneration,
            _ => NO_ERROR,
        }
    }

    /// A LeaveGroup of `members`: each answered; the rest of the group rebalances.
    pub(crate) async fn leave(&self, group_id: &str, members: &[String]) -> Vec<ResponseError> {
        let codes = {
            let mut groups = self.groups.lock().expect("groups");
            let Some(group) = groups.get_mut(group_id) else {
                return vec![ResponseError::UnknownMemberId; members.len()];
            };
            members
                .iter()
                .map(|id| {
                    if depart(group, id) {
                        NO_ERROR
                    } else {
                        ResponseError::UnknownMemberId
                    }
                })
                .collect()
        };
        self.complete_joins(group_id).await;
        codes
    }

    /// Whether `member_id` of `group` at `generation` may commit offsets (`generation` < 0:
    /// a consumer outside any group, which may). As in Kafka, a member of the current
    /// generation may commit while the group prepares a rebalance (clients commit what they
    /// read before they rejoin, and keep their positions when they get the same partitions
    /// back); only between the joins and the assignment is a commit refused.
    pub(crate) fn may_commit(
        &self,
        group_id: &str,
        member_id: &str,
        generation: i32,
    ) -> ResponseError {
        if generation < 0 {
            return NO_ERROR;
        }
        let groups = self.groups.lock().expect("groups");
        let Some(group) = groups.get(group_id) else {
            // A group this coordinator has not seen yet (it took over from one that stopped):
            // its members commit at the generation the other recorded until they rejoin.
            let recorded = self.node.group_generation(group_id);
            let dropped_here = self.forgotten.lock().expect("forgotten").contains(group_id);
            return if generation > 0 && generation == recorded && !dropped_here {
                NO_ERROR
            } else {
                ResponseError::IllegalGeneration
            };
        };
        if !group.members.contains_key(member_id) {
            return if group.inherited && generation == group.generation {
                NO_ERROR
            } else {
                ResponseError::UnknownMemberId
            };
        }
        if group.generation != generation {
            return ResponseError::IllegalGeneration;
        }
        if group.phase == Phase::CompletingRebalance {
            return ResponseError::RebalanceInProgress;
        }
        NO_ERROR
    }

    /// Drops members whose session ran out and completes rebalances past their deadline.
    pub(crate) async fn tick(&self) {
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let mut groups = self.groups.lock().expect("groups");
            // A group whose members are all gone is forgotten after `empty_retention`, as
            // Kafka drops an empty group at its next cleanup: its committed offsets (the
            // command log's) still list it, and its generation is recorded for when members
            // come back.
            let mut forgotten = self.forgotten.lock().expect("forgotten");
            groups.retain(|id, g| {
                if g.phase != Phase::Empty || !g.members.is_empty() || !g.pending.is_empty() {
                    g.empty_since = None;
                    return true;
                }
                let since = *g.empty_since.get_or_insert(now);
                let kept = now < since + self.empty_retention;
                if !kept {
                    remember(&mut forgotten, id);
                }
                kept
            });
            drop(forgotten);
            for (id, group) in groups.iter_mut() {
                let before = group.members.len();
                // A member waiting in a JoinGroup keeps its place until the round ends.
                group
                    .members
                    .retain(|_, m| m.joining.is_some() || now < m.last_seen + m.session_timeout);
                if group.members.len() < before {
                    if group.members.is_empty() {
                        group.phase = Phase::Empty;
                        group.leader = None;
                        group.deadline = None;
                    } else if group.phase != Phase::PreparingRebalance {
                        prepare_rebalance(group, now);
                    }
                }
                if group.phase == Phase::PreparingRebalance {
                    let complete = group.members.values().all(|m| m.joining.is_some())
                        && group.not_before.is_none_or(|t| now >= t);
                    if complete || group.deadline.is_some_and(|d| now >= d) {
                        due.push((id.clone(), !complete));
                    }
                }
            }
        }
        for (group, expired) in due {
            self.complete_joins_at(&group, expired).await;
        }
    }
}

/// Forgotten groups kept at most: a node that has forgotten this many (console consumers each
/// make a group of their own) starts again, its oldest zombie members then as after a failover.
const FORGOTTEN_MAX: usize = 100_000;

fn remember(forgotten: &mut HashSet<String>, group: &str) {
    if forgotten.len() >= FORGOTTEN_MAX {
        forgotten.clear();
    }
    forgotten.insert(group.to_string());
}

/// `ResponseError` has no "none": code 0 is this.
pub(crate) const NO_ERROR: ResponseError = ResponseError::Unknown(0);

/// The JoinGroup answer of the group's current generation for `member_id`: the leader's lists
/// every member with its metadata for the chosen protocol.
fn current_generation(group: &Group, member_id: &str) -> JoinGroupResponse {
    let protocol = group.protocol.clone().unwrap_or_default();
    let leader = group.leader.clone().unwrap_or_default();
    let members = if member_id == leader {
        group
            .members
            .iter()
            .map(|(id, m)| {
                JoinGroupResponseMember::default()
                    .with_member_id(StrBytes::from_string(id.clone()))
                    .with_metadata(
                        m.protocols
                            .iter()
                            .find(|(n, _)| *n == protocol)
                            .map(|(_, meta)| meta.clone())
                            .unwrap_or_default(),
                    )
            })
            .collect()
    } else {
        Vec::new()
    };
    JoinGroupResponse::default()
        .with_generation_id(group.generation)
        .with_protocol_type(Some(StrBytes::from_string(group.protocol_type.clone())))
        .with_protocol_name(Some(StrBytes::from_string(protocol)))
        .with_leader(StrBytes::from_string(leader))
        .with_member_id(StrBytes::from_string(member_id.to_string()))
        .with_members(members)
}

/// A new round: every member must rejoin before the longest rebalance timeout among them.
/// Removes `member_id` from `group` as a LeaveGroup does: an empty group is Empty, the others
/// start a round to assign its partitions again. Whether it was a member.
fn depart(group: &mut Group, member_id: &str) -> bool {
    if group.members.remove(member_id).is_none() {
        return false;
    }
    if group.leader.as_deref() == Some(member_id) {
        group.leader = None;
    }
    if group.members.is_empty() {
        group.phase = Phase::Empty;
        group.deadline = None;
    } else if group.phase != Phase::PreparingRebalance {
        prepare_rebalance(group, Instant::now());
    }
    true
}

fn prepare_rebalance(group: &mut Group, now: Instant) {
    group.phase = Phase::PreparingRebalance;
    let timeout = group
        .members
        .values()
        .map(|m| m.rebalance_timeout)
        .max()
        .unwrap_or(Duration::from_secs(60));
    group.deadline = Some(now + timeout);
    // Members waiting in a SyncGroup learn that the round they synced is over.
    for m in group.members.values_mut() {
        if let Some(tx) = m.syncing.take() {
            let _ = tx.send(sync_error(ResponseError::RebalanceInProgress));
        }
    }
}
