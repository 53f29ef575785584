//! Producer and consumer-group offsets.

use super::*;

impl State {
    pub(super) fn check_tables<'a>(
        &self,
        table_ids: impl IntoIterator<Item = &'a u64>,
    ) -> Result<(), Rejection> {
        for id in table_ids {
            self.table(*id)?;
        }
        Ok(())
    }

    pub(super) fn register_producer_offsets(
        &mut self,
        c: &RegisterProducerOffsets,
        at_ms: u64,
    ) -> CommandResult {
        check_name("producer", &c.producer_id)?;
        self.check_tables(c.offsets.iter().map(|o| &o.table_id))?;
        if let Some(existing) = self.producer_offsets.get(&c.producer_id) {
            if existing.offsets == c.offsets && existing.ttl_ms == c.ttl_ms {
                return redundant(unit());
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!(
                    "producer {:?} already registered other offsets",
                    c.producer_id
                ),
            ));
        }
        self.producer_offsets.insert(
            c.producer_id.clone(),
            ProducerOffsetsRecord {
                producer_id: c.producer_id.clone(),
                offsets: c.offsets.clone(),
                ttl_ms: c.ttl_ms,
                registered_at_ms: at_ms,
            },
        );
        done(unit())
    }

    pub(super) fn delete_producer_offsets(&mut self, c: &DeleteProducerOffsets) -> CommandResult {
        match self.producer_offsets.remove(&c.producer_id) {
            Some(_) => done(unit()),
            None => redundant(unit()),
        }
    }

    pub(super) fn expire_producer_offsets(&mut self, c: &ExpireProducerOffsets) -> CommandResult {
        let expired: Vec<String> = self
            .producer_offsets
            .values()
            .filter(|p| p.registered_at_ms.saturating_add(p.ttl_ms) <= c.now_ms)
            .map(|p| p.producer_id.clone())
            .collect();
        let n = remove_where(&mut self.producer_offsets, expired) as u64;
        if n == 0 {
            redundant(Reply::Count(0))
        } else {
            done(Reply::Count(n))
        }
    }

    pub(super) fn commit_group_offsets(
        &mut self,
        c: &CommitGroupOffsets,
        at_ms: u64,
    ) -> CommandResult {
        check_name("group", &c.group_id)?;
        if self.metadata_version >= crate::GROUP_FENCING_VERSION && c.coordinator_epoch != 0 {
            self.check_coordinator(c.coordinator_epoch)?;
        }
        self.check_tables(c.offsets.iter().map(|o| &o.table_id))?;
        for o in &c.offsets {
            self.group_offsets.insert(
                (c.group_id.clone(), o.table_id, o.partition_id, o.bucket),
                GroupOffsetRecord {
                    group_id: c.group_id.clone(),
                    table_id: o.table_id,
                    partition_id: o.partition_id,
                    bucket: o.bucket,
                    offset: o.offset,
                    leader_epoch: o.leader_epoch,
                    metadata: o.metadata.clone(),
                    committed_at_ms: at_ms,
                },
            );
        }
        done(Reply::Count(c.offsets.len() as u64))
    }

    pub(super) fn group_keys(&self, group_id: &str) -> Vec<(String, u64, u64, u32)> {
        self.group_offsets
            .range(
                (group_id.to_string(), 0, 0, 0)
                    ..=(group_id.to_string(), u64::MAX, u64::MAX, u32::MAX),
            )
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub(super) fn delete_group_offsets(&mut self, c: &DeleteGroupOffsets) -> CommandResult {
        let keys: Vec<_> = if c.buckets.is_empty() {
            self.group_keys(&c.group_id)
        } else {
            c.buckets
                .iter()
                .map(|b| (c.group_id.clone(), b.table_id, b.partition_id, b.bucket))
                .collect()
        };
        let n = remove_where(&mut self.group_offsets, keys) as u64;
        if n == 0 {
            redundant(Reply::Count(0))
        } else {
            done(Reply::Count(n))
        }
    }

    /// The groups whose last commit is `retention_ms` or more before `now_ms`: what
    /// [`ExpireGroupOffsets`] drops (the coordinator asks first, to propose only when some are).
    pub fn groups_past_retention(&self, now_ms: u64, retention_ms: u64) -> Vec<String> {
        let mut last_commit: BTreeMap<&String, u64> = BTreeMap::new();
        for r in self.group_offsets.values() {
            let last = last_commit.entry(&r.group_id).or_default();
            *last = (*last).max(r.committed_at_ms);
        }
        last_commit
            .into_iter()
            .filter(|(_, last)| last.saturating_add(retention_ms) <= now_ms)
            .map(|(g, _)| g.clone())
            .collect()
    }

    pub(super) fn expire_group_offsets(&mut self, c: &ExpireGroupOffsets) -> CommandResult {
        let mut n = 0u64;
        for group in self.groups_past_retention(c.now_ms, c.retention_ms) {
            let keys = self.group_keys(&group);
            n += remove_where(&mut self.group_offsets, keys) as u64;
        }
        if n == 0 {
            redundant(Reply::Count(0))
        } else {
            done(Reply::Count(n))
        }
    }
}
