//! Nodes and streams: registration, open, close, trim, delete, placement and transfer.

use super::*;

impl State {
    pub(super) fn register_node(&mut self, c: &RegisterNode, at_ms: u64) -> CommandResult {
        if c.node_id == 0 || c.node_epoch == 0 {
            return Err(rej(
                RejectionKind::InvalidArgument,
                "node id and node epoch must be positive",
            ));
        }
        if c.supported_metadata_version < self.metadata_version {
            return Err(rej(
                RejectionKind::NotEnabled,
                format!(
                    "node {} supports metadata_version {} but the cluster is at {}: upgrade it",
                    c.node_id, c.supported_metadata_version, self.metadata_version
                ),
            )
            .with_current(u64::from(self.metadata_version)));
        }
        if let Some(node) = self.nodes.get(&c.node_id) {
            if c.node_epoch == node.node_epoch && c.incarnation == node.incarnation {
                // The same process again: from version 3 it may (re)state its listeners, as a
                // node registered before the cluster reached 3 does once it has.
                if self.metadata_version >= 3 && node.listeners != c.listeners {
                    let mut node = node.clone();
                    node.listeners = c.listeners.clone();
                    let epoch = node.node_epoch;
                    self.nodes.insert(c.node_id, node);
                    return done(Reply::Epoch(epoch));
                }
                return redundant(Reply::Epoch(node.node_epoch));
            }
            if c.node_epoch <= node.node_epoch {
                return Err(rej(
                    RejectionKind::NodeFenced,
                    format!(
                        "node {} is registered at epoch {}; register above it",
                        c.node_id, node.node_epoch
                    ),
                )
                .with_current(node.node_epoch));
            }
        }
        self.nodes.insert(
            c.node_id,
            NodeRecord {
                node_id: c.node_id,
                node_epoch: c.node_epoch,
                incarnation: c.incarnation,
                address: c.address.clone(),
                supported_metadata_version: c.supported_metadata_version,
                registered_at_ms: at_ms,
                // A rule of version 3: nodes of an older cluster must build the same state.
                listeners: if self.metadata_version >= 3 {
                    c.listeners.clone()
                } else {
                    BTreeMap::new()
                },
            },
        );
        done(Reply::Epoch(c.node_epoch))
    }

    pub(super) fn new_stream(&mut self, at_ms: u64, binding: Option<BucketKey>) -> u64 {
        let stream_id = self.counters.next_stream_id;
        self.counters.next_stream_id += 1;
        let (table_id, partition_id, bucket) = binding.unwrap_or_default();
        self.streams.insert(
            stream_id,
            StreamRecord {
                stream_id,
                epoch: 0,
                state: StreamState::Closed as i32,
                table_id,
                partition_id,
                bucket,
                created_at_ms: at_ms,
                ..Default::default()
            },
        );
        stream_id
    }

    pub(super) fn create_streams(&mut self, c: &CreateStreams, at_ms: u64) -> CommandResult {
        check_count("stream", u64::from(c.count), u64::from(MAX_BUCKETS))?;
        let start = self.counters.next_stream_id;
        for _ in 0..c.count {
            self.new_stream(at_ms, None);
        }
        done(Reply::Range(IdRange {
            start,
            end: self.counters.next_stream_id,
        }))
    }

    pub(super) fn open_stream(&mut self, c: &OpenStream) -> CommandResult {
        let stream = self.stream(c.stream_id)?.clone();
        if stream.table_id != 0 {
            let bucket = self.bucket((stream.table_id, stream.partition_id, stream.bucket))?;
            if bucket.leader_node_id != c.node_id || bucket.leader_node_epoch != c.node_epoch {
                return Err(rej(
                    RejectionKind::NotLeader,
                    format!(
                        "stream {} belongs to a bucket led by node {}",
                        c.stream_id, bucket.leader_node_id
                    ),
                )
                .with_current(bucket.leader_node_id));
            }
            if bucket.leader_epoch != c.stream_epoch {
                return Err(rej(
                    RejectionKind::LeaderFenced,
                    format!(
                        "stream {} must be opened at the bucket's leader epoch {}",
                        c.stream_id, bucket.leader_epoch
                    ),
                )
                .with_current(bucket.leader_epoch));
            }
        }
        let position = |s: &StreamRecord| {
            Reply::Stream(StreamPosition {
                stream_epoch: s.epoch,
                start_offset: s.start_offset,
                end_offset: s.end_offset,
            })
        };
        let owned_by_caller =
            stream.owner_node_id == c.node_id && stream.owner_node_epoch == c.node_epoch;
        if c.stream_epoch == 0 {
            return Err(rej(
                RejectionKind::InvalidArgument,
                "stream epochs start at 1 (0 means never opened)",
            ));
        }
        if c.stream_epoch < stream.epoch || (c.stream_epoch == stream.epoch && !owned_by_caller) {
            return Err(rej(
                RejectionKind::StreamFenced,
                format!(
                    "stream {} is at epoch {} owned by node {}; open it at a higher epoch",
                    c.stream_id, stream.epoch, stream.owner_node_id
                ),
            )
            .with_current(stream.epoch));
        }
        if c.stream_epoch == stream.epoch && stream.state == StreamState::Open as i32 {
            return redundant(position(&stream));
        }
        let mut stream = stream;
        stream.epoch = c.stream_epoch;
        stream.owner_node_id = c.node_id;
        stream.owner_node_epoch = c.node_epoch;
        stream.state = StreamState::Open as i32;
        let reply = position(&stream);
        self.streams.insert(c.stream_id, stream);
        done(reply)
    }

    pub(super) fn close_stream(&mut self, c: &CloseStream) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        Self::check_owner(stream, c.node_id, c.node_epoch, c.stream_epoch)?;
        if stream.state == StreamState::Closed as i32 {
            return redundant(unit());
        }
        let mut stream = stream.clone();
        stream.state = StreamState::Closed as i32;
        self.streams.insert(c.stream_id, stream);
        done(unit())
    }

    /// The lowest offset a stream's table allows trimming to (retention floors).
    pub fn trim_floor(&self, stream: &StreamRecord) -> Option<u64> {
        let table = self.tables.get(&stream.table_id)?;
        let key = (stream.table_id, stream.partition_id, stream.bucket);
        let mut floor: Option<u64> = None;
        if table.is_primary_key_table() {
            let kv = self.latest_kv_snapshot(key).map_or(0, |s| s.log_offset);
            floor = Some(floor.map_or(kv, |f| f.min(kv)));
        }
        if table.is_lake_enabled() {
            let tiered = self
                .lake_snapshots
                .get(&stream.table_id)
                .and_then(|l| l.tiered_offset(stream.partition_id, stream.bucket))
                .unwrap_or(0);
            floor = Some(floor.map_or(tiered, |f| f.min(tiered)));
        }
        floor
    }

    pub(super) fn trim_stream(&mut self, c: &TrimStream, at_ms: u64) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        Self::check_owner(stream, c.node_id, c.node_epoch, c.stream_epoch)?;
        if c.new_start_offset > stream.end_offset {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "cannot trim stream {} to {} beyond its committed end {}",
                    c.stream_id, c.new_start_offset, stream.end_offset
                ),
            )
            .with_current(stream.end_offset));
        }
        if c.new_start_offset <= stream.start_offset {
            return redundant(Reply::Stream(StreamPosition {
                stream_epoch: stream.epoch,
                start_offset: stream.start_offset,
                end_offset: stream.end_offset,
            }));
        }
        if let Some(floor) = self.trim_floor(stream)
            && c.new_start_offset > floor
        {
            return Err(rej(
                RejectionKind::BelowFloor,
                format!(
                    "stream {} may not be trimmed past {floor} (latest KV snapshot or tiered offset of its bucket)",
                    c.stream_id
                ),
            )
            .with_current(floor));
        }
        let mut stream = stream.clone();
        stream.start_offset = c.new_start_offset;
        let dropped: Vec<(u64, u64)> = self
            .ranges
            .range((c.stream_id, 0)..(c.stream_id, c.new_start_offset))
            .filter(|(_, r)| r.end_offset <= c.new_start_offset)
            .map(|(k, _)| *k)
            .collect();
        for key in dropped {
            if let Some(range) = self.ranges.remove(&key) {
                self.release_object_range(range.object_id, at_ms);
            }
        }
        let reply = Reply::Stream(StreamPosition {
            stream_epoch: stream.epoch,
            start_offset: stream.start_offset,
            end_offset: stream.end_offset,
        });
        self.streams.insert(c.stream_id, stream);
        done(reply)
    }

    /// One range record stopped pointing at `object_id`.
    pub(super) fn release_object_range(&mut self, object_id: u64, at_ms: u64) {
        if let Some(object) = self.objects.get_mut(&object_id) {
            object.live_ranges = object.live_ranges.saturating_sub(1);
            if object.live_ranges == 0 && object.state == ObjectState::Committed as i32 {
                object.state = ObjectState::Destroyed as i32;
                object.destroyed_at_ms = at_ms;
            }
        }
    }

    /// Removes a stream with its ranges and writer state.
    pub(super) fn remove_stream(&mut self, stream_id: u64, at_ms: u64) {
        let ranges: Vec<(u64, u64)> = self
            .ranges
            .range((stream_id, 0)..=(stream_id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in ranges {
            if let Some(range) = self.ranges.remove(&key) {
                self.release_object_range(range.object_id, at_ms);
            }
        }
        let writers: Vec<(u64, u64)> = self
            .writers
            .range((stream_id, 0)..=(stream_id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        remove_where(&mut self.writers, writers);
        self.streams.remove(&stream_id);
    }

    pub(super) fn delete_stream(&mut self, c: &DeleteStream, at_ms: u64) -> CommandResult {
        let Some(stream) = self.streams.get(&c.stream_id) else {
            return redundant(unit());
        };
        if stream.table_id != 0 {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "stream {} stores bucket {} of table {}: drop the table or partition instead",
                    c.stream_id, stream.bucket, stream.table_id
                ),
            ));
        }
        if c.stream_epoch < stream.epoch {
            return Err(rej(
                RejectionKind::StreamFenced,
                format!("stream {} is at epoch {}", c.stream_id, stream.epoch),
            )
            .with_current(stream.epoch));
        }
        if stream.state == StreamState::Open as i32 {
            Self::check_owner(stream, c.node_id, c.node_epoch, c.stream_epoch)?;
        }
        self.remove_stream(c.stream_id, at_ms);
        done(unit())
    }

    pub(super) fn place_stream(&mut self, c: &PlaceStream) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        if !self.nodes.contains_key(&c.node_id) {
            return Err(rej(
                RejectionKind::NotFound,
                format!("node {} is not registered", c.node_id),
            ));
        }
        if stream.placement_node_id == c.node_id && stream.transfer_to_node_id == 0 {
            return redundant(unit());
        }
        let mut stream = stream.clone();
        stream.placement_node_id = c.node_id;
        stream.transfer_to_node_id = 0;
        self.streams.insert(c.stream_id, stream);
        done(unit())
    }

    pub(super) fn transfer_stream(&mut self, c: &TransferStream) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        if !self.nodes.contains_key(&c.to_node_id) {
            return Err(rej(
                RejectionKind::NotFound,
                format!("node {} is not registered", c.to_node_id),
            ));
        }
        if stream.placement_node_id == c.from_node_id && stream.transfer_to_node_id == c.to_node_id
        {
            return redundant(unit());
        }
        if stream.placement_node_id != c.from_node_id {
            return Err(rej(
                RejectionKind::Conflict,
                format!(
                    "stream {} is placed on node {}, not {}",
                    c.stream_id, stream.placement_node_id, c.from_node_id
                ),
            )
            .with_current(stream.placement_node_id));
        }
        let mut stream = stream.clone();
        stream.transfer_to_node_id = c.to_node_id;
        self.streams.insert(c.stream_id, stream);
        done(unit())
    }

    pub(super) fn complete_transfer(&mut self, c: &CompleteTransfer) -> CommandResult {
        let stream = self.stream(c.stream_id)?;
        if stream.transfer_to_node_id == 0 && stream.placement_node_id == c.node_id {
            return redundant(unit());
        }
        if stream.transfer_to_node_id != c.node_id {
            return Err(rej(
                RejectionKind::Conflict,
                format!(
                    "stream {} has no transfer pending to node {}",
                    c.stream_id, c.node_id
                ),
            ));
        }
        Self::check_owner(stream, c.node_id, c.node_epoch, c.stream_epoch)?;
        let mut stream = stream.clone();
        stream.placement_node_id = c.node_id;
        stream.transfer_to_node_id = 0;
        self.streams.insert(c.stream_id, stream);
        done(unit())
    }
}
