//! The catalog: databases, tables, partitions, bucket leadership, KV and lake snapshots, allocation, the coordinator and the metadata version.

use super::*;

impl State {
    pub(super) fn create_database(&mut self, c: &CreateDatabase, at_ms: u64) -> CommandResult {
        check_name("database", &c.name)?;
        if let Some(db) = self.databases.get(&c.name) {
            if db.properties == c.properties && db.comment == c.comment {
                return redundant(Reply::Id(db.database_id));
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!("database {:?} already exists", c.name),
            )
            .with_current(db.database_id));
        }
        let database_id = self.counters.next_database_id;
        self.counters.next_database_id += 1;
        self.databases.insert(
            c.name.clone(),
            DatabaseRecord {
                database_id,
                name: c.name.clone(),
                properties: c.properties.clone(),
                comment: c.comment.clone(),
                created_at_ms: at_ms,
            },
        );
        done(Reply::Id(database_id))
    }

    pub(super) fn tables_of(&self, database: &str) -> Vec<(String, String)> {
        self.table_names
            .range((database.to_string(), String::new())..)
            .take_while(|((db, _), _)| db == database)
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub(super) fn drop_database(&mut self, c: &DropDatabase, at_ms: u64) -> CommandResult {
        if !self.databases.contains_key(&c.name) {
            return redundant(unit());
        }
        let tables = self.tables_of(&c.name);
        if !tables.is_empty() && !c.cascade {
            return Err(rej(
                RejectionKind::NotEmpty,
                format!(
                    "database {:?} still has {} table(s); drop them or cascade",
                    c.name,
                    tables.len()
                ),
            ));
        }
        for (_, table) in tables {
            if let Some(id) = self.table_names.get(&(c.name.clone(), table)).copied() {
                self.remove_table(id, at_ms);
            }
        }
        self.databases.remove(&c.name);
        done(unit())
    }

    pub(super) fn validate_table(c: &CreateTable) -> Result<(), Rejection> {
        check_name("table", &c.name)?;
        let invalid = |m: String| Err(rej(RejectionKind::InvalidArgument, m));
        check_count("bucket", u64::from(c.bucket_count), u64::from(MAX_BUCKETS))?;
        for (what, cols) in [
            ("primary key", &c.primary_key),
            ("bucket key", &c.bucket_key),
            ("partition key", &c.partition_keys),
        ] {
            let unique: BTreeSet<&String> = cols.iter().collect();
            if unique.len() != cols.len() || cols.iter().any(String::is_empty) {
                return invalid(format!("{what} columns {cols:?} are empty or repeated"));
            }
        }
        if !c.primary_key.is_empty() {
            if let Some(p) = c.partition_keys.iter().find(|p| !c.primary_key.contains(p)) {
                return invalid(format!(
                    "partition key {p:?} must be part of the primary key {:?}",
                    c.primary_key
                ));
            }
            if let Some(b) = c
                .bucket_key
                .iter()
                .find(|b| !c.primary_key.contains(b) || c.partition_keys.contains(b))
            {
                return invalid(format!(
                    "bucket key {b:?} must be part of the primary key without the partition keys"
                ));
            }
        }
        Ok(())
    }

    pub(super) fn create_buckets(
        &mut self,
        table_id: u64,
        partition_id: u64,
        count: u32,
        at_ms: u64,
    ) -> (u64, u32) {
        let first = self.counters.next_stream_id;
        for bucket in 0..count {
            let key = (table_id, partition_id, bucket);
            let stream_id = self.new_stream(at_ms, Some(key));
            self.buckets.insert(
                key,
                BucketRecord {
                    table_id,
                    partition_id,
                    bucket,
                    stream_id,
                    ..Default::default()
                },
            );
        }
        (first, count)
    }

    pub(super) fn create_table(&mut self, c: &CreateTable, at_ms: u64) -> CommandResult {
        if !self.databases.contains_key(&c.database) {
            return Err(rej(
                RejectionKind::NotFound,
                format!("database {:?} does not exist", c.database),
            ));
        }
        Self::validate_table(c)?;
        if let Some(existing) = self.table_by_name(&c.database, &c.name) {
            let same = existing.schema == c.schema
                && existing.schema_version == 1
                && existing.primary_key == c.primary_key
                && existing.bucket_key == c.bucket_key
                && existing.partition_keys == c.partition_keys
                && existing.bucket_count == c.bucket_count
                && existing.options == c.options
                && existing.comment == c.comment;
            if same {
                let first = self
                    .buckets
                    .get(&(existing.table_id, 0, 0))
                    .map_or(0, |b| b.stream_id);
                let count = if existing.is_partitioned() {
                    0
                } else {
                    existing.bucket_count
                };
                return redundant(Reply::Table(TableCreated {
                    table_id: existing.table_id,
                    partition_id: 0,
                    first_stream_id: first,
                    stream_count: count,
                }));
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!("table {}.{} already exists", c.database, c.name),
            )
            .with_current(existing.table_id));
        }
        let table_id = self.counters.next_table_id;
        self.counters.next_table_id += 1;
        self.tables.insert(
            table_id,
            TableRecord {
                table_id,
                database: c.database.clone(),
                name: c.name.clone(),
                schema: c.schema.clone(),
                schema_version: 1,
                primary_key: c.primary_key.clone(),
                bucket_key: c.bucket_key.clone(),
                partition_keys: c.partition_keys.clone(),
                bucket_count: c.bucket_count,
                options: c.options.clone(),
                comment: c.comment.clone(),
                created_at_ms: at_ms,
            },
        );
        self.table_names
            .insert((c.database.clone(), c.name.clone()), table_id);
        let (first_stream_id, stream_count) = if c.partition_keys.is_empty() {
            self.create_buckets(table_id, 0, c.bucket_count, at_ms)
        } else {
            (0, 0)
        };
        done(Reply::Table(TableCreated {
            table_id,
            partition_id: 0,
            first_stream_id,
            stream_count,
        }))
    }

    /// Removes the buckets (and their streams and KV snapshots) of one partition (0: none).
    pub(super) fn remove_buckets(&mut self, table_id: u64, partition_id: u64, at_ms: u64) {
        let buckets: Vec<BucketRecord> = self
            .buckets
            .range((table_id, partition_id, 0)..=(table_id, partition_id, u32::MAX))
            .map(|(_, b)| b.clone())
            .collect();
        for b in buckets {
            self.remove_stream(b.stream_id, at_ms);
            self.buckets.remove(&(table_id, partition_id, b.bucket));
        }
        let snapshots: Vec<_> = self
            .kv_snapshots
            .range((table_id, partition_id, 0, 0)..=(table_id, partition_id, u32::MAX, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        remove_where(&mut self.kv_snapshots, snapshots);
    }

    pub(super) fn remove_table(&mut self, table_id: u64, at_ms: u64) {
        let Some(table) = self.tables.remove(&table_id) else {
            return;
        };
        self.table_names.remove(&(table.database, table.name));
        let partitions: Vec<PartitionRecord> = self
            .partitions
            .range((table_id, 0)..=(table_id, u64::MAX))
            .map(|(_, p)| p.clone())
            .collect();
        for p in partitions {
            self.remove_buckets(table_id, p.partition_id, at_ms);
            self.partitions.remove(&(table_id, p.partition_id));
            self.partition_names.remove(&(table_id, p.name));
        }
        self.remove_buckets(table_id, 0, at_ms);
        self.lake_snapshots.remove(&table_id);
        let offsets: Vec<_> = self
            .group_offsets
            .keys()
            .filter(|k| k.1 == table_id)
            .cloned()
            .collect();
        remove_where(&mut self.group_offsets, offsets);
    }

    pub(super) fn drop_table(&mut self, c: &DropTable, at_ms: u64) -> CommandResult {
        let Some(id) = self
            .table_names
            .get(&(c.database.clone(), c.name.clone()))
            .copied()
        else {
            return redundant(unit());
        };
        self.remove_table(id, at_ms);
        done(Reply::Id(id))
    }

    pub(super) fn alter_table(&mut self, c: &AlterTable) -> CommandResult {
        let table = self.table(c.table_id)?;
        if let Some(key) = c
            .set_options
            .keys()
            .chain(&c.reset_options)
            .find(|k| IMMUTABLE_OPTIONS.contains(&k.as_str()))
        {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!("option {key:?} cannot be changed after the table is created"),
            ));
        }
        let mut updated = table.clone();
        if !c.new_schema.is_empty() {
            if c.expected_schema_version != table.schema_version {
                return Err(rej(
                    RejectionKind::Conflict,
                    format!(
                        "table {} is at schema version {}, not {}",
                        c.table_id, table.schema_version, c.expected_schema_version
                    ),
                )
                .with_current(u64::from(table.schema_version)));
            }
            if c.new_schema != table.schema {
                updated.schema = c.new_schema.clone();
                updated.schema_version += 1;
            }
        }
        for (k, v) in &c.set_options {
            updated.options.insert(k.clone(), v.clone());
        }
        for k in &c.reset_options {
            updated.options.remove(k);
        }
        if &updated == table {
            return redundant(Reply::Id(c.table_id));
        }
        // The lake turned off: its record goes (reads of the table are the log's again, and
        // retention is the log's TTL alone); the Iceberg table stays as it is.
        if self.metadata_version >= crate::LAKE_DISABLE_VERSION
            && table.is_lake_enabled()
            && !updated.is_lake_enabled()
        {
            self.lake_snapshots.remove(&c.table_id);
        }
        self.tables.insert(c.table_id, updated);
        done(Reply::Id(c.table_id))
    }

    pub(super) fn create_partition(&mut self, c: &CreatePartition, at_ms: u64) -> CommandResult {
        let table = self.table(c.table_id)?;
        check_name("partition", &c.name)?;
        if !table.is_partitioned() {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!("table {} is not partitioned", c.table_id),
            ));
        }
        let keys: BTreeSet<&String> = c.values.keys().collect();
        let expected: BTreeSet<&String> = table.partition_keys.iter().collect();
        if keys != expected {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "partition values must name exactly the partition keys {:?}",
                    table.partition_keys
                ),
            ));
        }
        let bucket_count = table.bucket_count;
        if let Some(&id) = self.partition_names.get(&(c.table_id, c.name.clone())) {
            let existing = &self.partitions[&(c.table_id, id)];
            if existing.values != c.values {
                return Err(rej(
                    RejectionKind::AlreadyExists,
                    format!("partition {:?} exists with other values", c.name),
                ));
            }
            let first = self
                .buckets
                .get(&(c.table_id, id, 0))
                .map_or(0, |b| b.stream_id);
            return redundant(Reply::Table(TableCreated {
                table_id: c.table_id,
                partition_id: id,
                first_stream_id: first,
                stream_count: bucket_count,
            }));
        }
        let partition_id = self.counters.next_partition_id;
        self.counters.next_partition_id += 1;
        self.partitions.insert(
            (c.table_id, partition_id),
            PartitionRecord {
                table_id: c.table_id,
                partition_id,
                name: c.name.clone(),
                values: c.values.clone(),
                created_at_ms: at_ms,
            },
        );
        self.partition_names
            .insert((c.table_id, c.name.clone()), partition_id);
        let (first_stream_id, stream_count) =
            self.create_buckets(c.table_id, partition_id, bucket_count, at_ms);
        done(Reply::Table(TableCreated {
            table_id: c.table_id,
            partition_id,
            first_stream_id,
            stream_count,
        }))
    }

    pub(super) fn drop_partition(&mut self, c: &DropPartition, at_ms: u64) -> CommandResult {
        self.table(c.table_id)?;
        let Some(id) = self.partition_names.remove(&(c.table_id, c.name.clone())) else {
            return redundant(unit());
        };
        self.partitions.remove(&(c.table_id, id));
        self.remove_buckets(c.table_id, id, at_ms);
        done(Reply::Id(id))
    }

    pub(super) fn lead_bucket(&mut self, c: &LeadBucket) -> CommandResult {
        let key = (c.table_id, c.partition_id, c.bucket);
        let bucket = self.bucket(key)?;
        let Some(node) = self.nodes.get(&c.leader_node_id) else {
            return Err(rej(
                RejectionKind::NotFound,
                format!("node {} is not registered", c.leader_node_id),
            ));
        };
        if bucket.leader_node_id == node.node_id && bucket.leader_node_epoch == node.node_epoch {
            return redundant(Reply::Epoch(bucket.leader_epoch));
        }
        let mut bucket = bucket.clone();
        bucket.leader_node_id = node.node_id;
        bucket.leader_node_epoch = node.node_epoch;
        bucket.leader_epoch += 1;
        let epoch = bucket.leader_epoch;
        self.buckets.insert(key, bucket);
        done(Reply::Epoch(epoch))
    }

    pub(super) fn commit_kv_snapshot(&mut self, c: &CommitKvSnapshot, at_ms: u64) -> CommandResult {
        let key = (c.table_id, c.partition_id, c.bucket);
        if !self.table(c.table_id)?.is_primary_key_table() {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!("table {} has no primary key", c.table_id),
            ));
        }
        let bucket = self.bucket(key)?;
        if bucket.leader_node_id != c.node_id
            || bucket.leader_node_epoch != c.node_epoch
            || bucket.leader_epoch != c.leader_epoch
        {
            return Err(rej(
                RejectionKind::LeaderFenced,
                format!(
                    "bucket {} of table {} is led by node {} at leader epoch {}",
                    c.bucket, c.table_id, bucket.leader_node_id, bucket.leader_epoch
                ),
            )
            .with_current(bucket.leader_epoch));
        }
        let end = self
            .streams
            .get(&bucket.stream_id)
            .map_or(0, |s| s.end_offset);
        if c.log_offset > end {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "snapshot offset {} is beyond the committed end {end}",
                    c.log_offset
                ),
            )
            .with_current(end));
        }
        if let Some(existing) =
            self.kv_snapshots
                .get(&(c.table_id, c.partition_id, c.bucket, c.snapshot_id))
        {
            if existing.log_offset == c.log_offset && existing.location == c.location {
                return redundant(Reply::Id(c.snapshot_id));
            }
            return Err(rej(
                RejectionKind::AlreadyExists,
                format!("snapshot {} exists with other contents", c.snapshot_id),
            ));
        }
        if let Some(latest) = self.latest_kv_snapshot(key)
            && (c.snapshot_id < latest.snapshot_id || c.log_offset < latest.log_offset)
        {
            return Err(rej(
                RejectionKind::Conflict,
                format!(
                    "snapshot {} at offset {} is older than snapshot {} at offset {}",
                    c.snapshot_id, c.log_offset, latest.snapshot_id, latest.log_offset
                ),
            )
            .with_current(latest.log_offset));
        }
        self.kv_snapshots.insert(
            (c.table_id, c.partition_id, c.bucket, c.snapshot_id),
            KvSnapshotRecord {
                table_id: c.table_id,
                partition_id: c.partition_id,
                bucket: c.bucket,
                snapshot_id: c.snapshot_id,
                log_offset: c.log_offset,
                location: c.location.clone(),
                size_bytes: c.size_bytes,
                leader_epoch: c.leader_epoch,
                created_at_ms: at_ms,
            },
        );
        done(Reply::Id(c.snapshot_id))
    }

    pub(super) fn drop_kv_snapshot(&mut self, c: &DropKvSnapshot) -> CommandResult {
        let key = (c.table_id, c.partition_id, c.bucket, c.snapshot_id);
        if !self.kv_snapshots.contains_key(&key) {
            return redundant(unit());
        }
        let latest = self
            .latest_kv_snapshot((c.table_id, c.partition_id, c.bucket))
            .map(|s| s.snapshot_id);
        if latest == Some(c.snapshot_id) {
            return Err(rej(
                RejectionKind::Conflict,
                format!(
                    "snapshot {} is the latest of its bucket and is kept",
                    c.snapshot_id
                ),
            ));
        }
        self.kv_snapshots.remove(&key);
        done(unit())
    }

    pub(super) fn commit_lake_snapshot(
        &mut self,
        c: &CommitLakeSnapshot,
        at_ms: u64,
    ) -> CommandResult {
        let table = self.table(c.table_id)?;
        // A round that was under way when the lake was disabled records nothing.
        if self.metadata_version >= crate::LAKE_DISABLE_VERSION && !table.is_lake_enabled() {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!("table {} is not tiered into the lake", c.table_id),
            ));
        }
        let previous = self.lake_snapshots.get(&c.table_id);
        if previous.is_some_and(|p| p.snapshot_id == c.snapshot_id) {
            return redundant(Reply::Id(c.table_id));
        }
        let before: BTreeMap<(u64, u32), u64> = previous
            .map(|p| {
                p.bucket_offsets
                    .iter()
                    .map(|b| ((b.partition_id, b.bucket), b.offset))
                    .collect()
            })
            .unwrap_or_default();
        let mut offsets = before.clone();
        // Where the lake begins per bucket: set once, by the first snapshot that tiers it.
        let mut starts: BTreeMap<(u64, u32), u64> = previous
            .map(|p| {
                p.bucket_offsets
                    .iter()
                    .map(|b| ((b.partition_id, b.bucket), b.lake_start))
                    .collect()
            })
            .unwrap_or_default();
        for b in &c.bucket_offsets {
            starts
                .entry((b.partition_id, b.bucket))
                .or_insert(b.lake_start);
            let bucket = self.bucket((c.table_id, b.partition_id, b.bucket))?;
            let end = self
                .streams
                .get(&bucket.stream_id)
                .map_or(0, |s| s.end_offset);
            if b.offset > end {
                return Err(rej(
                    RejectionKind::InvalidArgument,
                    format!(
                        "tiered offset {} of bucket {} is beyond its committed end {end}",
                        b.offset, b.bucket
                    ),
                )
                .with_current(end));
            }
            let before = offsets.get(&(b.partition_id, b.bucket)).copied();
            if before.is_some_and(|o| b.offset < o) {
                return Err(rej(
                    RejectionKind::Conflict,
                    format!(
                        "tiered offset of bucket {} would move back from {} to {}",
                        b.bucket,
                        before.unwrap_or(0),
                        b.offset
                    ),
                )
                .with_current(before.unwrap_or(0)));
            }
            offsets.insert((b.partition_id, b.bucket), b.offset);
        }
        // Buckets of dropped partitions are forgotten with them.
        offsets.retain(|&(partition_id, bucket), _| {
            self.buckets
                .contains_key(&(c.table_id, partition_id, bucket))
        });
        // The time the lake last caught up with the log: a snapshot that tiers nothing new
        // (a compaction) leaves it, so the lake's lag and the tiering schedule stay true.
        let committed_at_ms = match previous {
            Some(p) if offsets.iter().all(|(k, o)| before.get(k) == Some(o)) => p.committed_at_ms,
            _ => at_ms,
        };
        self.lake_snapshots.insert(
            c.table_id,
            LakeSnapshotRecord {
                table_id: c.table_id,
                snapshot_id: c.snapshot_id,
                metadata_location: c.metadata_location.clone(),
                bucket_offsets: offsets
                    .into_iter()
                    .map(|((partition_id, bucket), offset)| BucketOffset {
                        partition_id,
                        bucket,
                        offset,
                        lake_start: starts.get(&(partition_id, bucket)).copied().unwrap_or(0),
                    })
                    .collect(),
                committed_at_ms,
            },
        );
        done(Reply::Id(c.table_id))
    }

    pub(super) fn allocate(&mut self, c: &Allocate) -> CommandResult {
        check_sequence(&c.sequence)?;
        check_count("allocation", c.count, u64::from(u32::MAX))?;
        let start = self.sequences.get(&c.sequence).map_or(1, |s| s.next);
        let end = start.checked_add(c.count).ok_or_else(|| {
            rej(
                RejectionKind::InvalidArgument,
                format!("sequence {:?} is exhausted", c.sequence),
            )
        })?;
        self.sequences.insert(
            c.sequence.clone(),
            SequenceRecord {
                name: c.sequence.clone(),
                next: end,
            },
        );
        done(Reply::Range(IdRange { start, end }))
    }

    pub(super) fn register_coordinator(&mut self, c: &RegisterCoordinator) -> CommandResult {
        if let Some(current) = &self.coordinator {
            if c.lease_term == current.epoch
                && c.node_id == current.node_id
                && c.node_epoch == current.node_epoch
                && !current.resigned
            {
                return redundant(Reply::Epoch(current.epoch));
            }
            if c.lease_term <= current.epoch {
                return Err(rej(
                    RejectionKind::CoordinatorFenced,
                    format!(
                        "lease term {} is not above the current coordinator epoch {}",
                        c.lease_term, current.epoch
                    ),
                )
                .with_current(current.epoch));
            }
        }
        self.coordinator = Some(CoordinatorRecord {
            node_id: c.node_id,
            node_epoch: c.node_epoch,
            epoch: c.lease_term,
            resigned: false,
        });
        done(Reply::Epoch(c.lease_term))
    }

    /// The holder gives the role up; its epoch stays, so a later registration must still bring
    /// a higher term and nothing at this epoch is accepted again.
    pub(super) fn resign_coordinator(&mut self, c: &ResignCoordinator) -> CommandResult {
        let Some(current) = &mut self.coordinator else {
            return Err(rej(
                RejectionKind::CoordinatorFenced,
                "no coordinator is registered",
            ));
        };
        if current.epoch != c.coordinator_epoch
            || current.node_id != c.node_id
            || current.node_epoch != c.node_epoch
        {
            return Err(rej(
                RejectionKind::CoordinatorFenced,
                format!(
                    "coordinator epoch {} of node {} is not current (current {} held by node {})",
                    c.coordinator_epoch, c.node_id, current.epoch, current.node_id
                ),
            )
            .with_current(current.epoch));
        }
        if current.resigned {
            return redundant(Reply::Epoch(current.epoch));
        }
        current.resigned = true;
        done(Reply::Epoch(current.epoch))
    }

    pub(super) fn upgrade_metadata_version(
        &mut self,
        ctx: &ApplyContext,
        c: &UpgradeMetadataVersion,
        fatal: &mut Option<Fatal>,
    ) -> CommandResult {
        if c.version <= self.metadata_version {
            return redundant(Reply::Epoch(u64::from(self.metadata_version)));
        }
        if c.version > ctx.supported_version {
            // This binary cannot follow: stop rather than diverge from the nodes that can.
            // (Whether every live node supports the version is the coordinator's check.)
            *fatal = Some(Fatal::UnsupportedVersion {
                version: c.version,
                supported: ctx.supported_version,
            });
            return redundant(Reply::Epoch(u64::from(self.metadata_version)));
        }
        self.metadata_version = c.version;
        done(Reply::Epoch(u64::from(c.version)))
    }
}
