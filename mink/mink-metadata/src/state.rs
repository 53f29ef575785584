//! The cluster state: ordered persistent maps only, so that every process iterates (and encodes)
//! it identically, and cloning it for a published view shares structure instead of copying.

use std::fmt::Write as _;
use std::sync::Arc;

use imbl::OrdMap;

use crate::record::*;

/// Key of a bucket: (table, partition or 0, bucket).
pub type BucketKey = (u64, u64, u32);

/// The whole replicated state. Mutated only by [`State::apply_row`](crate::State::apply_row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    /// Gates new commands and changed apply rules; raised by `UpgradeMetadataVersion` only when
    /// every live node supports the new version.
    pub metadata_version: u32,
    pub counters: Counters,
    pub coordinator: Option<CoordinatorRecord>,
    pub nodes: OrdMap<u64, NodeRecord>,
    pub row_tokens: OrdMap<u64, RowTokenRecord>,
    pub streams: OrdMap<u64, StreamRecord>,
    /// (stream, start offset) -> range.
    pub ranges: OrdMap<(u64, u64), RangeRecord>,
    pub objects: OrdMap<u64, ObjectRecord>,
    /// (stream, writer) -> writer state.
    pub writers: OrdMap<(u64, u64), WriterRecord>,
    pub kv: OrdMap<String, KvRecord>,
    pub databases: OrdMap<String, DatabaseRecord>,
    pub tables: OrdMap<u64, TableRecord>,
    /// (database, table name) -> table id.
    pub table_names: OrdMap<(String, String), u64>,
    /// (table, partition id) -> partition.
    pub partitions: OrdMap<(u64, u64), PartitionRecord>,
    /// (table, partition name) -> partition id.
    pub partition_names: OrdMap<(u64, String), u64>,
    pub buckets: OrdMap<BucketKey, BucketRecord>,
    /// (table, partition, bucket, snapshot id) -> KV snapshot.
    pub kv_snapshots: OrdMap<(u64, u64, u32, u64), KvSnapshotRecord>,
    /// table -> latest lake snapshot.
    pub lake_snapshots: OrdMap<u64, LakeSnapshotRecord>,
    pub sequences: OrdMap<String, SequenceRecord>,
    pub producer_offsets: OrdMap<String, ProducerOffsetsRecord>,
    /// (group, table, partition, bucket) -> committed offset.
    pub group_offsets: OrdMap<(String, u64, u64, u32), GroupOffsetRecord>,
}

impl Default for State {
    fn default() -> Self {
        State {
            metadata_version: 1,
            counters: Counters::initial(),
            coordinator: None,
            nodes: OrdMap::new(),
            row_tokens: OrdMap::new(),
            streams: OrdMap::new(),
            ranges: OrdMap::new(),
            objects: OrdMap::new(),
            writers: OrdMap::new(),
            kv: OrdMap::new(),
            databases: OrdMap::new(),
            tables: OrdMap::new(),
            table_names: OrdMap::new(),
            partitions: OrdMap::new(),
            partition_names: OrdMap::new(),
            buckets: OrdMap::new(),
            kv_snapshots: OrdMap::new(),
            lake_snapshots: OrdMap::new(),
            sequences: OrdMap::new(),
            producer_offsets: OrdMap::new(),
            group_offsets: OrdMap::new(),
        }
    }
}

impl State {
    pub fn table_by_name(&self, database: &str, name: &str) -> Option<&TableRecord> {
        let id = self
            .table_names
            .get(&(database.to_string(), name.to_string()))?;
        self.tables.get(id)
    }

    /// The newest KV snapshot of a bucket.
    pub fn latest_kv_snapshot(&self, bucket: BucketKey) -> Option<&KvSnapshotRecord> {
        let (t, p, b) = bucket;
        self.kv_snapshots
            .range((t, p, b, 0)..=(t, p, b, u64::MAX))
            .next_back()
            .map(|(_, v)| v)
    }

    /// Ranges of a stream overlapping `[from, to)`, in offset order.
    pub fn stream_ranges(
        &self,
        stream_id: u64,
        from: u64,
        to: u64,
    ) -> impl Iterator<Item = &RangeRecord> {
        // The range containing `from` starts at or before it.
        let first = self
            .ranges
            .range((stream_id, 0)..=(stream_id, from))
            .next_back()
            .filter(|(_, r)| r.end_offset > from)
            .map(|(k, _)| k.1)
            .unwrap_or(from);
        self.ranges
            .range((stream_id, first)..(stream_id, to.max(first)))
            .map(|(_, r)| r)
    }

    /// When `range`'s data was committed, by run of offsets (see [`RangeRecord::data_times`]).
    /// An `at_ms` of 0 is unknown: the range's object is gone or was never committed.
    pub fn data_times(&self, range: &RangeRecord) -> Vec<DataTime> {
        if !range.data_times.is_empty() {
            return range.data_times.clone();
        }
        let at_ms = self
            .objects
            .get(&range.object_id)
            .map_or(0, |o| o.committed_at_ms);
        vec![DataTime {
            end_offset: range.end_offset,
            at_ms,
        }]
    }

    /// A deterministic, line-per-record text rendering, for golden tests and debugging.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "metadata_version: {}", self.metadata_version);
        let _ = writeln!(out, "counters: {:?}", self.counters);
        if let Some(c) = &self.coordinator {
            let _ = writeln!(out, "coordinator: {c:?}");
        }
        fn section<K, V: std::fmt::Debug>(out: &mut String, name: &str, map: &OrdMap<K, V>)
        where
            K: Ord + Clone,
        {
            if map.is_empty() {
                return;
            }
            let _ = writeln!(out, "{name}:");
            for v in map.values() {
                let _ = writeln!(out, "  {v:?}");
            }
        }
        section(&mut out, "nodes", &self.nodes);
        section(&mut out, "row_tokens", &self.row_tokens);
        section(&mut out, "streams", &self.streams);
        section(&mut out, "ranges", &self.ranges);
        section(&mut out, "objects", &self.objects);
        section(&mut out, "writers", &self.writers);
        section(&mut out, "kv", &self.kv);
        section(&mut out, "databases", &self.databases);
        section(&mut out, "tables", &self.tables);
        section(&mut out, "partitions", &self.partitions);
        section(&mut out, "buckets", &self.buckets);
        section(&mut out, "kv_snapshots", &self.kv_snapshots);
        section(&mut out, "lake_snapshots", &self.lake_snapshots);
        section(&mut out, "sequences", &self.sequences);
        section(&mut out, "producer_offsets", &self.producer_offsets);
        section(&mut out, "group_offsets", &self.group_offsets);
        out
    }
}

/// An immutable state at an applied index. Publishing one per applied row is cheap: the maps
/// share structure with the previous view.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct View {
    /// Index of the last applied log row (0 before the first row).
    pub applied_index: u64,
    pub state: Arc<State>,
}

impl View {
    pub fn new(applied_index: u64, state: State) -> Self {
        View {
            applied_index,
            state: Arc::new(state),
        }
    }
}
