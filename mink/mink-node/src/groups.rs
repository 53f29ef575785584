//! Consumer groups' durable state in the command log: committed offsets and generations. A
//! frontend keeps a group's membership in memory on the node coordinating it; what must outlive
//! that node is here, so the next coordinator carries the group on (and a connector's position
//! survives it).

use std::time::Duration;

use mink_metadata::{
    Command, CommitGroupOffsets, DeleteGroupOffsets, ExpireGroupOffsets, GroupOffset, PutKv,
    RejectionKind,
};

use crate::{BucketRef, Node, NodeError, NodeResult};

/// One committed position of a group in a bucket (Kafka's OffsetCommit entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedOffset {
    pub bucket: BucketRef,
    /// The next offset the group reads.
    pub offset: u64,
    pub leader_epoch: i32,
    pub metadata: String,
    /// When the command log applied the commit (milliseconds since the epoch).
    pub committed_at_ms: u64,
}

/// The metadata key of a group's generation.
fn generation_key(group: &str) -> String {
    format!("group.generation/{group}")
}

impl Node {
    /// Milliseconds since the epoch by this node's clock.
    pub fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// Commits `offsets` of `group`, all in one command: each names a bucket of a table that
    /// exists. The answer comes once the command is applied here. `coordinator_epoch` is the
    /// epoch at which the caller coordinates the group ([`Node::group_coordinator_epoch`], for
    /// Kafka's OffsetCommit): once the cluster runs metadata_version 5, a commit from an epoch
    /// that is no longer current is refused with [`NodeError::NotCoordinator`], so a paused
    /// ex-coordinator cannot overwrite what its successor's members committed. `None` for a
    /// position no group coordinator owns (a connector's).
    pub async fn commit_group_offsets(
        &self,
        group: &str,
        offsets: &[(BucketRef, u64, i32, String)],
        coordinator_epoch: Option<u64>,
    ) -> NodeResult<()> {
        let view = self.view();
        let mut entries = Vec::with_capacity(offsets.len());
        for (b, offset, leader_epoch, metadata) in offsets {
            let record = self.table_record(&b.database, &b.table)?;
            let bucket = self.bucket_record(&view, &record, b.partition.as_deref(), b.bucket)?;
            entries.push(GroupOffset {
                table_id: record.table_id,
                partition_id: bucket.partition_id,
                bucket: b.bucket,
                offset: *offset,
                leader_epoch: *leader_epoch,
                metadata: metadata.clone(),
            });
        }
        let proposed = self
            .inner
            .sink
            .propose(Command::CommitGroupOffsets(CommitGroupOffsets {
                group_id: group.to_string(),
                offsets: entries,
                coordinator_epoch: coordinator_epoch.unwrap_or(0),
            }))
            .await?;
        match proposed.result {
            Ok(_) => Ok(()),
            Err(r) if r.kind() == RejectionKind::CoordinatorFenced => {
                Err(NodeError::NotCoordinator {
                    epoch: coordinator_epoch.unwrap_or(0),
                    current: r.current.unwrap_or(0),
                })
            }
            Err(r) => Err(NodeError::Failed(r.to_string())),
        }
    }

    /// The offsets `group` has committed, in tables that still exist.
    pub fn group_offsets(&self, group: &str) -> Vec<CommittedOffset> {
        let view = self.view();
        let key = group.to_string();
        view.state
            .group_offsets
            .range((key.clone(), 0, 0, 0)..=(key, u64::MAX, u64::MAX, u32::MAX))
            .filter_map(|(_, r)| {
                let table = view.state.tables.get(&r.table_id)?;
                let partition = if r.partition_id == 0 {
                    None
                } else {
                    Some(
                        view.state
                            .partitions
                            .get(&(r.table_id, r.partition_id))?
                            .name
                            .clone(),
                    )
                };
                Some(CommittedOffset {
                    bucket: BucketRef::new(
                        &table.database,
                        &table.name,
                        partition.as_deref(),
                        r.bucket,
                    ),
                    offset: r.offset,
                    leader_epoch: r.leader_epoch,
                    metadata: r.metadata.clone(),
                    committed_at_ms: r.committed_at_ms,
                })
            })
            .collect()
    }

    /// Every group with committed offsets.
    pub fn groups_with_offsets(&self) -> Vec<String> {
        let view = self.view();
        let mut groups: Vec<String> = view
            .state
            .group_offsets
            .values()
            .map(|r| r.group_id.clone())
            .collect();
        groups.dedup();
        groups
    }

    /// Deletes every committed offset of `group`.
    pub async fn delete_group_offsets(&self, group: &str) -> NodeResult<()> {
        self.propose_kv(Command::DeleteGroupOffsets(DeleteGroupOffsets {
            group_id: group.to_string(),
            buckets: vec![],
        }))
        .await
    }

    /// On the lease holder: drops the offsets of every group whose latest commit is older than
    /// `retention` (Kafka's `offsets.retention.minutes`). Elsewhere: `Unavailable`.
    pub async fn expire_group_offsets(&self, retention: Duration) -> NodeResult<()> {
        let epoch = self
            .inner
            .sink
            .lease()
            .borrow()
            .coordinator_epoch()
            .ok_or_else(|| {
                NodeError::Unavailable("offsets expire on the node holding the lease".into())
            })?;
        self.propose_kv(Command::ExpireGroupOffsets(ExpireGroupOffsets {
            coordinator_epoch: epoch,
            now_ms: self.now_ms(),
            retention_ms: u64::try_from(retention.as_millis()).unwrap_or(u64::MAX),
        }))
        .await
    }

    /// The last generation `group` completed a rebalance at (0 before its first).
    pub fn group_generation(&self, group: &str) -> i32 {
        self.view()
            .state
            .kv
            .get(&generation_key(group))
            .and_then(|r| r.value.as_slice().try_into().ok())
            .map_or(0, i32::from_be_bytes)
    }

    /// Records that `group` completed a rebalance at `generation`, so a coordinator taking the
    /// group over after this one continues past it.
    pub async fn set_group_generation(&self, group: &str, generation: i32) -> NodeResult<()> {
        self.propose_kv(Command::PutKv(PutKv {
            key: generation_key(group),
            value: generation.to_be_bytes().to_vec(),
        }))
        .await
    }

    /// The coordinator epoch at which this node coordinates consumer groups, if its view says
    /// it does (it holds the lease and has not resigned it).
    pub fn group_coordinator_epoch(&self) -> Option<u64> {
        self.view()
            .state
            .coordinator
            .as_ref()
            .filter(|c| c.active() == Some(self.node_id()))
            .map(|c| c.epoch)
    }

    /// The node coordinating consumer groups: the lease holder, if the view names one that has
    /// not resigned.
    pub fn group_coordinator(&self) -> Option<u64> {
        self.view()
            .state
            .coordinator
            .as_ref()
            .and_then(|c| c.active())
    }
}
