//! mink-coordinator: what the lease holder does for the cluster.
//!
//! Its core is a pure planner ([`planner::plan`]: an observation of the metadata view and the
//! live nodes in, steps out), pinned by golden cases. [`spawn`] runs it on every node; it acts
//! only while its node holds the lease, and every command it proposes carries the coordinator
//! epoch, so a paused ex-holder's commands are refused. Each tick it:
//! - gives buckets without a leader to the least loaded live node;
//! - gives the buckets of a restarted node back to its new life;
//! - **fails over** the buckets of a node whose heartbeat expired to the least loaded live
//!   nodes (once it has held the lease for `failover_grace`, so that every live node had time
//!   to heartbeat; at once for a node that stopped cleanly and expired its own heartbeat); the
//!   new leader opens each stream at a higher leader epoch, which fences the
//!   old process, and a primary-key bucket restores its working copy from its KV snapshot and
//!   the changelog after it;
//! - moves buckets off drained nodes, and carries out rebalance requests;
//! - drops KV snapshots beyond the ones kept (and deletes their files);
//! - every `group_offsets_check_interval`: drops committed group offsets past their retention;
//! - beside the ticks, in a task of its own, every `cleanup_interval`: object cleanup and
//!   compaction of dead nodes' objects (one such compaction can take tens of seconds, which a
//!   failover must not wait behind);
//! - beside the ticks, the [`Duty`]s its node hands it (lake maintenance, lake snapshot
//!   records), each while the lease is held and only then.

pub mod planner;
mod run;

pub use planner::{Observation, PlannerConfig, Step, Why};
pub use run::{CoordinatorConfig, Duty, REBALANCE_DONE, REBALANCE_REQUEST, spawn};
