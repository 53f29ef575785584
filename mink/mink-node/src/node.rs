use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use arrow::array::RecordBatch;
use mink_log::LogTablet;
use mink_log::options::TableOptions;
use mink_log::routing::{buckets_of, split_by_bucket, split_by_partition};
use mink_metadata::{BucketKey, BucketRecord, TableRecord, View};
use mink_sql::{Sink, SinkConfig};
use s3stream::{AppendAck, CompactionConfig, EngineConfig, S3Stream, WriterBatchId};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{BucketRef, NodeError, NodeResult};

/// How a node runs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: u64,
    /// Where clients reach this node (its Flight address), as registered in the metadata.
    pub advertised_address: String,
    /// Where clients reach each of its listeners, by protocol (`flight` defaults to the
    /// advertised address); registered from metadata_version 3.
    pub listeners: std::collections::BTreeMap<String, String>,
    /// `sqlite://...`, `sqlite::memory:` or `postgres://...`.
    pub metadata_url: String,
    /// `file:///...`, a path, `s3://...` or `memory://`.
    pub object_store_url: String,
    pub lease_ttl: Duration,
    pub engine: EngineConfig,
    pub compaction: CompactionConfig,
    /// How often leadership is reconciled with the metadata view, and how often the
    /// coordinator plans (on the lease holder).
    pub leadership_interval: Duration,
    /// How often leaders apply `table.log.ttl` to their buckets.
    pub retention_interval: Duration,
    /// Where the working copies of primary-key buckets live (rebuildable; not backed up).
    pub kv_dir: std::path::PathBuf,
    /// How often a leader snapshots the working copies of its primary-key buckets.
    pub kv_snapshot_interval: Duration,
    /// KV snapshots kept per bucket (the coordinator drops older ones).
    pub kv_snapshots_retained: usize,
    /// Wall-clock time for everything this node stamps or compares (rows of the metadata log,
    /// prepared objects, retention, the changelog).
    pub clock: Arc<dyn mink_metadata::Clock>,
    /// Log-tail rows the SQL engine's scans of a lake table may read (as they report them)
    /// before its next round is due, sooner than its freshness says; 0 ignores the reports.
    pub tail_rows_for_a_round: u64,
    /// Faults injected into every request this node makes to the object store (tests: a slow
    /// or paused store under the real one); `None` in service.
    pub object_faults: Option<Arc<s3stream::store::ObjectFaults>>,
    /// Start even though the object store holds objects past this metadata's ids, deleting
    /// them (a metadata database restored from a backup, the newer one gone for good).
    pub claim_object_store: bool,
    /// How long a group's committed offsets outlive its last commit (Kafka's
    /// `offsets.retention.minutes`, 7 days); the coordinator drops them after.
    pub group_offsets_retention: Duration,
    /// How often the coordinator drops offsets past their retention (1 min).
    pub group_offsets_check_interval: Duration,
}

impl NodeConfig {
    /// The coordinator's settings, from the node's: it plans every `leadership_interval`,
    /// fails over after holding the lease for half a TTL, cleans up objects at the compaction
    /// interval.
    pub fn coordinator(&self) -> mink_coordinator::CoordinatorConfig {
        let mut c = mink_coordinator::CoordinatorConfig::for_lease_ttl(self.lease_ttl);
        c.tick = self.leadership_interval;
        c.cleanup_interval = self.compaction.interval;
        c.compaction = self.compaction.clone();
        c.planner.kv_snapshots_retained = self.kv_snapshots_retained;
        c.group_offsets_retention = self.group_offsets_retention;
        c.group_offsets_check_interval = self.group_offsets_check_interval;
        c
    }
}

impl NodeConfig {
    pub fn new(node_id: u64, metadata_url: &str, object_store_url: &str) -> Self {
        NodeConfig {
            node_id,
            advertised_address: String::new(),
            listeners: std::collections::BTreeMap::new(),
            metadata_url: metadata_url.to_string(),
            object_store_url: object_store_url.to_string(),
            lease_ttl: Duration::from_secs(30),
            engine: EngineConfig::default(),
            compaction: CompactionConfig::default(),
            leadership_interval: Duration::from_millis(200),
            retention_interval: Duration::from_secs(60),
            kv_dir: default_kv_dir(node_id, metadata_url),
            kv_snapshot_interval: Duration::from_secs(600),
            kv_snapshots_retained: 1,
            clock: mink_metadata::system_clock(),
            tail_rows_for_a_round: 100_000,
            object_faults: None,
            group_offsets_retention: Duration::from_secs(7 * 24 * 3600),
            group_offsets_check_interval: Duration::from_secs(60),
            claim_object_store: false,
        }
    }
}

/// Where, under `kv_dir`, the key-location indexes of the primary-key lake tables this node
/// tiers live (a cache of the lake, like the working copies).
pub(crate) const LAKE_KEYS_DIR: &str = "lake-keys";

/// A directory per cluster (metadata database) and node under the system's temporary directory:
/// working copies are a cache, and two nodes on one host never share one.
fn default_kv_dir(node_id: u64, metadata_url: &str) -> std::path::PathBuf {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::hash::DefaultHasher::new();
    metadata_url.hash(&mut h);
    std::env::temp_dir()
        .join("mink-kv")
        .join(format!("{:016x}-node-{node_id}", h.finish()))
}

/// An idempotent writer's identity (from `allocate_writer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterId {
    pub writer_id: u64,
    pub writer_epoch: u64,
}

/// Where an idempotent writer's committed batches end in one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterPosition {
    pub partition: Option<String>,
    pub bucket: u32,
    pub writer_epoch: u64,
    pub last_sequence: u64,
}

/// What happened to the rows of one bucket in a write.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketWrite {
    /// The partition's name (partitioned tables only).
    pub partition: Option<String>,
    pub partition_id: u64,
    pub bucket: u32,
    pub rows: usize,
    pub result: Result<AppendAck, NodeError>,
    /// With `NotLeader` on a routed write (no bucket or writer named, not a partial update):
    /// the bucket's rows, as a batch the leader takes as is (with `_row_kind` for a
    /// primary-key table), so a frontend can forward them.
    pub unsent: Option<RecordBatch>,
}

/// A bucket's part of a write once submitted: `(partition, partition_id, bucket, rows,
/// submitted or refused, rows to forward)`.
pub(crate) type Submitted<S> = (
    Option<String>,
    u64,
    u32,
    usize,
    NodeResult<S>,
    Option<RecordBatch>,
);

/// A submitted write (see [`Node::submit_write`]): resolves to its per-bucket results.
#[must_use = "a write is only known durable once this resolves"]
pub struct PendingWrite {
    results: futures::future::BoxFuture<'static, Vec<BucketWrite>>,
    /// Parts refused with `NotLeader` whose rows a session forwards to their leaders.
    pub(crate) forwards: Vec<Forward>,
}

/// A part of a routed write for a bucket another node leads: the rows that leader takes.
#[derive(Clone, Debug)]
pub(crate) struct Forward {
    /// Its place among the write's results.
    pub(crate) position: usize,
    pub(crate) partition: Option<String>,
    pub(crate) bucket: u32,
    pub(crate) address: String,
    pub(crate) rows: RecordBatch,
}

impl std::fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingWrite")
    }
}

impl PendingWrite {
    /// The per-bucket results of submitted parts `(partition, partition_id, bucket, rows,
    /// submitted, unsent)`: each submitted part's acknowledgement by `ack`.
    pub(crate) fn of<S, F>(
        parts: Vec<Submitted<S>>,
        ack: impl Fn(S) -> F + Send + Sync + 'static,
    ) -> Self
    where
        S: Send + 'static,
        F: Future<Output = NodeResult<AppendAck>> + Send + 'static,
    {
        let forwards = parts
            .iter()
            .enumerate()
            .filter_map(|(position, (partition, _, bucket, _, submitted, unsent))| {
                match (submitted, unsent) {
                    (Err(NodeError::NotLeader { address, .. }), Some(rows))
                        if !address.is_empty() =>
                    {
                        Some(Forward {
                            position,
                            partition: partition.clone(),
                            bucket: *bucket,
                            address: address.clone(),
                            rows: rows.clone(),
                        })
                    }
                    _ => None,
                }
            })
            .collect();
        let ack = Arc::new(ack);
        PendingWrite {
            results: Box::pin(futures::future::join_all(parts.into_iter().map(
                move |(partition, partition_id, bucket, rows, submitted, unsent)| {
                    let ack = Arc::clone(&ack);
                    async move {
                        let result = match submitted {
                            Ok(s) => ack(s).await,
                            Err(e) => Err(e),
                        };
                        BucketWrite {
                            partition,
                            partition_id,
                            bucket,
                            rows,
                            result,
                            unsent,
                        }
                    }
                },
            ))),
            forwards,
        }
    }

    pub(crate) fn ready(results: Vec<BucketWrite>) -> Self {
        PendingWrite {
            results: Box::pin(std::future::ready(results)),
            forwards: Vec::new(),
        }
    }

    /// This write with some of its results replaced once `replace` resolves: `(position,
    /// result)` pairs.
    pub(crate) fn with_replaced(
        self,
        replace: impl Future<Output = Vec<(usize, NodeResult<AppendAck>)>> + Send + 'static,
    ) -> Self {
        let results = self.results;
        PendingWrite {
            results: Box::pin(async move {
                let (mut results, replaced) = futures::join!(results, replace);
                for (position, result) in replaced {
                    if let Some(w) = results.get_mut(position) {
                        w.result = result;
                        w.unsent = None;
                    }
                }
                results
            }),
            forwards: Vec::new(),
        }
    }
}

impl Future for PendingWrite {
    type Output = Vec<BucketWrite>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.results.as_mut().poll(cx)
    }
}

/// Where a write goes (see [`Node::write`]). The default routes every row by its values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteTarget {
    pub partition: Option<String>,
    pub bucket: Option<u32>,
    pub writer: Option<WriterBatchId>,
    /// Primary-key tables: a partial update setting only these columns (see
    /// [`Node::submit_kv_write`]).
    pub columns: Option<Vec<String>>,
    /// The batch as the frontend received it (its Arrow IPC messages): a log table stores it
    /// as received, without encoding it again, when it goes whole to one bucket under the
    /// table's schema and compression (a client that routes and compresses its rows itself).
    pub ipc: Option<mink_log::codec::IpcBatch>,
    /// The rows' time, milliseconds since the epoch (the latest of them: a Kafka producer's
    /// record times); the leader's clock at append when `None`. Log tables only, and kept only
    /// by a write its leader takes directly (a forwarded write is stamped by the leader).
    pub timestamp_ms: Option<i64>,
    /// Log tables: stores the rows with this compression instead of the table's (a Kafka
    /// producer's choice under Kafka's `compression.type=producer`). Like `timestamp_ms`, kept
    /// only by a write its leader takes directly.
    pub compression: Option<mink_log::codec::Compression>,
    /// The writer may have raised its epoch itself, as Kafka's idempotent producers do
    /// (KIP-360: librdkafka bumps it after a batch fails and starts its partitions again at
    /// sequence 0). Otherwise (Flight) a writer's epoch is the one `allocate_writer` gave, so
    /// nobody can fence a writer by sending its id at a higher epoch.
    pub epoch_may_rise: bool,
}

impl WriteTarget {
    /// A write the node routes itself: no bucket, no writer, not a partial update.
    pub fn is_routed(&self) -> bool {
        self.bucket.is_none() && self.writer.is_none() && self.columns.is_none()
    }
}

/// The epoch `allocate_writer` hands out with every writer id. A Flight client cannot raise
/// it (a writer that must start over takes a new id); a Kafka producer can
/// ([`WriteTarget::epoch_may_rise`]).
pub const ALLOCATED_WRITER_EPOCH: u64 = 0;

/// How long a write waits for a new bucket's first leader before answering "retry".
const LEADER_WAIT: Duration = Duration::from_secs(5);

/// Most partitions one write may create (see `MAX_PARTITIONS_PER_TABLE` for the table limit).
pub const MAX_NEW_PARTITIONS_PER_WRITE: usize = 64;

/// A bucket this node leads: its stream, opened at the leader epoch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Led {
    pub(crate) leader_epoch: u64,
    pub(crate) stream_id: u64,
}

pub(crate) struct Inner {
    pub(crate) config: NodeConfig,
    pub(crate) sink: Sink,
    pub(crate) streams: S3Stream,
    pub(crate) led: RwLock<HashMap<BucketKey, Led>>,
    pub(crate) kv: RwLock<HashMap<BucketKey, crate::kv::OpenKv>>,
    /// The lake (Iceberg catalog and warehouse), opened on first use.
    pub(crate) lake: tokio::sync::OnceCell<mink_lake::Lake>,
    /// Decoded schemas (and primary-key definitions) by table and schema version.
    #[allow(clippy::type_complexity)]
    pub(crate) described: RwLock<
        HashMap<
            (u64, u32),
            (
                arrow::datatypes::SchemaRef,
                Option<Arc<mink_kv::KvTableDef>>,
            ),
        >,
    >,
    /// How this node reaches other nodes (set by the frontend that owns the wire).
    pub(crate) forwarder: RwLock<Option<Arc<dyn crate::Forwarder>>>,
    /// Tiering rounds run here (`Node::lake_rounds`).
    pub(crate) lake_rounds: AtomicU64,
    /// Reads served here (`Node::reads_served`).
    pub(crate) reads_served: AtomicU64,
    /// Retention passes finished (`Node::retention_passes`).
    pub(crate) retention_passes: watch::Sender<u64>,
    /// Table id → log-tail rows queries reported scanning since its last round here.
    pub(crate) tail_demand: Mutex<HashMap<u64, u64>>,
    /// Held through a tiering round: the scheduler's and `tier_now`'s rounds of a table would
    /// otherwise build on the same lake snapshot and all but one fail to commit.
    pub(crate) tiering: tokio::sync::Mutex<()>,
    /// Serialises KV tablet opens (each replays its changelog).
    pub(crate) kv_opening: tokio::sync::Mutex<()>,
    pub(crate) round_robin: AtomicU64,
    /// Serialises stream opens, so the leadership loop and a write do not open one twice.
    pub(crate) opening: tokio::sync::Mutex<()>,
    pub(crate) shutdown: watch::Sender<bool>,
    /// Set by [`Node::begin_shutdown`]: tails end, so frontends can drain.
    pub(crate) stopping: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// A running Mink node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node_id", &self.inner.config.node_id)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Connects to the metadata database and the object store, registers this node at a new
    /// node epoch, and starts leadership, the coordinator (active while this node holds the
    /// lease), retention, KV snapshots and compaction.
    pub async fn start(config: NodeConfig) -> NodeResult<Node> {
        let meta = mink_sql::connect(&config.metadata_url)
            .await
            .map_err(|e| NodeError::Unavailable(format!("metadata database: {e}")))?;
        let mut store = s3stream::store::open(&config.object_store_url)
            .map_err(|e| NodeError::Invalid(e.to_string()))?;
        if let Some(faults) = &config.object_faults {
            store = Arc::new(s3stream::store::FaultyObjectStore::new(
                store,
                Arc::clone(faults),
            ));
        }
        let mut sink_config = SinkConfig::new(config.node_id);
        sink_config.address = config.advertised_address.clone();
        sink_config.listeners = config.listeners.clone();
        sink_config
            .listeners
            .entry("flight".to_string())
            .or_insert_with(|| config.advertised_address.clone());
        sink_config.lease_ttl = config.lease_ttl;
        sink_config.clock = Arc::clone(&config.clock);
        sink_config.before_register =
            Some(crate::identity::check_before_register(Arc::clone(&store)));
        let sink = Sink::start(meta, sink_config).await?;
        let claimed = crate::identity::claim_store(
            &sink,
            store.as_ref(),
            &config.engine.object_prefix,
            config.claim_object_store,
        );
        if let Err(e) = claimed.await {
            sink.shutdown().await;
            return Err(e);
        }
        let mut engine = config.engine.clone();
        engine.clock = Arc::clone(&config.clock);
        let streams = S3Stream::start(sink.clone(), store, engine);
        streams.spawn_background(config.compaction.clone());
        let node = Node {
            inner: Arc::new(Inner {
                config,
                sink,
                streams,
                led: RwLock::new(HashMap::new()),
                lake: tokio::sync::OnceCell::new(),
                kv: RwLock::new(HashMap::new()),
                described: RwLock::new(HashMap::new()),
                forwarder: RwLock::new(None),
                lake_rounds: AtomicU64::new(0),
                reads_served: AtomicU64::new(0),
                retention_passes: watch::channel(0).0,
                tail_demand: Default::default(),
                tiering: Default::default(),
                kv_opening: tokio::sync::Mutex::new(()),
                round_robin: AtomicU64::new(0),
                opening: tokio::sync::Mutex::new(()),
                shutdown: watch::channel(false).0,
                stopping: watch::channel(false).0,
                tasks: Mutex::new(Vec::new()),
            }),
        };
        let leadership = tokio::spawn(crate::leadership::run(node.clone()));
        let retention = tokio::spawn(crate::retention::run(node.clone()));
        let snapshots = tokio::spawn(crate::kv::run_snapshots(node.clone()));
        let tiering = tokio::spawn(crate::tiering::run(node.clone()));
        // The lease holder's duties beyond the coordinator's own, run by it while the lease
        // is held.
        let duties: Vec<Arc<dyn mink_coordinator::Duty>> = vec![
            Arc::new(crate::lake_maintenance::LakeMaintenanceDuty::new(
                node.clone(),
            )),
            Arc::new(crate::tiering::LakeSnapshotsDuty::new(node.clone())),
        ];
        let coordinator = mink_coordinator::spawn(
            node.inner.sink.clone(),
            node.inner.streams.clone(),
            node.inner.config.coordinator(),
            duties,
        );
        node.inner.tasks.lock().expect("tasks lock").extend([
            leadership,
            retention,
            snapshots,
            tiering,
            coordinator,
        ]);
        tracing::info!(node_id = node.inner.config.node_id, "node started");
        Ok(node)
    }

    pub fn node_id(&self) -> u64 {
        self.inner.config.node_id
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    /// The current metadata view (never blocks).
    pub fn view(&self) -> View {
        self.inner.sink.view()
    }

    /// The cluster's lake: iceberg-rust's SQL catalog on the metadata database, the warehouse
    /// under the object store (opened on first use).
    pub async fn lake(&self) -> NodeResult<&mink_lake::Lake> {
        self.inner
            .lake
            .get_or_try_init(|| async {
                let config = &self.inner.config;
                let lake = mink_lake::Lake::open(
                    &config.metadata_url,
                    &config.object_store_url,
                    self.inner.streams.object_store(),
                )
                .await?;
                Ok::<_, NodeError>(
                    lake.with_key_index_dir(config.kv_dir.join(LAKE_KEYS_DIR))
                        .with_clock(Arc::clone(&config.clock)),
                )
            })
            .await
    }

    pub fn streams(&self) -> &S3Stream {
        &self.inner.streams
    }

    /// Waits (until `deadline`) for this node to apply metadata past `applied`: `Ok(false)` at
    /// the deadline. Fails when the metadata log has halted (shutdown, a fenced node), which
    /// no waiting changes, so a caller looping on it ends instead of spinning, and as soon as
    /// the node is stopping.
    pub(crate) async fn next_applied(
        &self,
        applied: u64,
        deadline: tokio::time::Instant,
    ) -> NodeResult<bool> {
        tokio::select! {
            waited = tokio::time::timeout_at(deadline, self.inner.sink.wait_applied(applied + 1)) => {
                match waited {
                    Ok(view) => view.map(|_| true).map_err(NodeError::from),
                    Err(_) => Ok(false),
                }
            }
            () = self.until_stopping() => Err(self.shutting_down()),
        }
    }

    /// Waits (at most `limit`) until this node has applied metadata `index`: read-your-writes
    /// across nodes (`mink-min-applied-index`).
    /// A stopping node ends the wait at once ([`NodeError::Unavailable`]).
    pub async fn wait_applied(&self, index: u64, limit: Duration) -> NodeResult<View> {
        let waited = tokio::select! {
            waited = tokio::time::timeout(limit, self.inner.sink.wait_applied(index)) => waited,
            () = self.until_stopping() => return Err(self.shutting_down()),
        };
        match waited {
            Ok(view) => Ok(view?),
            Err(_) => Err(NodeError::Unavailable(format!(
                "node {} has applied metadata up to {}, not yet {index}; retry",
                self.node_id(),
                self.view().applied_index
            ))),
        }
    }

    /// What a request waiting on a stopping node is answered.
    pub(crate) fn shutting_down(&self) -> NodeError {
        NodeError::Unavailable(format!(
            "node {} is shutting down; retry at another node or once it is back",
            self.node_id()
        ))
    }

    /// Nodes whose heartbeat is younger than the lease TTL.
    pub async fn live_nodes(&self) -> NodeResult<std::collections::BTreeSet<u64>> {
        Ok(self
            .inner
            .sink
            .live_nodes()
            .await?
            .into_iter()
            .map(|n| n.node_id)
            .collect())
    }

    /// Allocates an idempotent writer id.
    /// Where writer `writer_id`'s committed batches end in each bucket of `database.table`
    /// (buckets it never wrote to are left out): what a writer whose sequences follow a
    /// source's offsets resumes from. Writer records are kept as long as their streams.
    pub fn writer_positions(
        &self,
        database: &str,
        table: &str,
        writer_id: u64,
    ) -> NodeResult<Vec<WriterPosition>> {
        let record = self.table_record(database, table)?;
        let view = self.view();
        let mut out = Vec::new();
        for (&(_, partition_id, bucket), b) in view
            .state
            .buckets
            .range((record.table_id, 0, 0)..=(record.table_id, u64::MAX, u32::MAX))
        {
            let Some(w) = view.state.writers.get(&(b.stream_id, writer_id)) else {
                continue;
            };
            let Some(last) = w.batches.last() else {
                continue;
            };
            out.push(WriterPosition {
                partition: view
                    .state
                    .partitions
                    .get(&(record.table_id, partition_id))
                    .map(|p| p.name.clone()),
                bucket,
                writer_epoch: w.writer_epoch,
                last_sequence: last.last_sequence,
            });
        }
        Ok(out)
    }

    pub async fn allocate_writer(&self) -> NodeResult<WriterId> {
        let proposed = self
            .inner
            .sink
            .propose(mink_metadata::Command::AllocateProducerIds(
                mink_metadata::AllocateProducerIds { count: 1 },
            ))
            .await?;
        match proposed.result {
            Ok(outcome) => match outcome.into_reply() {
                mink_metadata::Reply::Range(r) => Ok(WriterId {
                    writer_id: r.start,
                    writer_epoch: ALLOCATED_WRITER_EPOCH,
                }),
                other => Err(NodeError::Failed(format!("unexpected reply {other:?}"))),
            },
            Err(r) => Err(NodeError::Failed(r.to_string())),
        }
    }

    /// Checks an idempotent writer's identity as Kafka checks producer ids: only ids that
    /// `allocate_writer` handed out (another node's allocation this node has not applied yet
    /// is caught up with first), at the epoch it handed out unless `epoch_may_rise`. (The
    /// stream then checks that the writer starts at sequence 0 in each bucket and at each new
    /// epoch, keeps its order, and never goes back to an older epoch.)
    async fn check_writer(&self, w: &WriterBatchId, epoch_may_rise: bool) -> NodeResult<()> {
        let allocated = |v: &View| (1..v.state.counters.next_producer_id).contains(&w.writer_id);
        if !allocated(&self.view()) && !allocated(&self.inner.sink.catch_up().await?) {
            return Err(NodeError::UnknownWriter {
                writer_id: w.writer_id,
            });
        }
        if w.writer_epoch != ALLOCATED_WRITER_EPOCH && !epoch_may_rise {
            return Err(NodeError::WriterFenced {
                writer_id: w.writer_id,
                epoch: w.writer_epoch,
                current: ALLOCATED_WRITER_EPOCH,
            });
        }
        Ok(())
    }

    /// The tablet of a bucket this node leads, or where to go instead. A bucket the metadata
    /// says this node leads but the leadership loop has not opened yet is opened now, so a
    /// client redirected here does not bounce; a bucket without a leader yet (a partition
    /// created a moment ago) is waited for, briefly.
    pub async fn tablet(
        &self,
        table: &TableRecord,
        partition_id: u64,
        bucket: u32,
    ) -> NodeResult<LogTablet> {
        let key = (table.table_id, partition_id, bucket);
        let schema = self.table_schema(table)?;
        let options = TableOptions::parse(&table.options)?;
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        loop {
            let led = self.inner.led.read().expect("led lock").get(&key).cloned();
            let view = self.view();
            let record = view.state.buckets.get(&key).ok_or_else(|| {
                NodeError::NotFound(format!(
                    "bucket {bucket} of {}.{} does not exist",
                    table.database, table.name
                ))
            })?;
            let me = self.inner.sink.node();
            let mine =
                record.leader_node_id == me.node_id && record.leader_node_epoch == me.node_epoch;
            // A move in progress: its leader hands the bucket over to `moving`.
            let moving = mink_coordinator::planner::moving_to(&view.state, record);
            if let Some(led) = led {
                // Still the leader at that epoch in the newest view: a bucket moved away a
                // moment ago is redirected now rather than fenced at its next commit.
                if mine && record.leader_epoch == led.leader_epoch && moving.is_none() {
                    return Ok(LogTablet::new(
                        self.inner.streams.clone(),
                        led.stream_id,
                        schema,
                        options.compression,
                    ));
                }
                if !mine || record.leader_epoch != led.leader_epoch {
                    let mut led_now = self.inner.led.write().expect("led lock");
                    if led_now
                        .get(&key)
                        .is_some_and(|l| l.leader_epoch == led.leader_epoch)
                    {
                        led_now.remove(&key);
                    }
                }
            }
            if let Some(to) = moving.filter(|_| mine) {
                // Being handed over: writes go to the node that leads it next.
                return Err(self.not_leader(table, &view, record, to, record.leader_epoch + 1));
            }
            if record.leader_node_id == 0
                || (record.leader_node_id == me.node_id
                    && record.leader_node_epoch != me.node_epoch)
                || moving == Some(me.node_id)
            {
                // The coordinator has not (re)assigned it yet, or is moving it here.
                if !self.next_applied(view.applied_index, deadline).await? {
                    return Err(NodeError::Unavailable(format!(
                        "bucket {bucket} of {}.{} has no leader yet; retry",
                        table.database, table.name
                    )));
                }
                continue;
            }
            if record.leader_node_id == me.node_id {
                let stream_id = self.lead(table, record).await?;
                return Ok(LogTablet::new(
                    self.inner.streams.clone(),
                    stream_id,
                    schema,
                    options.compression,
                ));
            }
            return Err(self.not_leader(
                table,
                &view,
                record,
                record.leader_node_id,
                record.leader_epoch,
            ));
        }
    }

    /// `NotLeader` for a bucket of `table`, naming `leader` and where to reach it.
    fn not_leader(
        &self,
        table: &TableRecord,
        view: &View,
        record: &BucketRecord,
        leader: u64,
        leader_epoch: u64,
    ) -> NodeError {
        let address = view
            .state
            .nodes
            .get(&leader)
            .map(|n| n.address.clone())
            .unwrap_or_default();
        NodeError::NotLeader {
            bucket: BucketRef {
                database: table.database.clone(),
                table: table.name.clone(),
                partition: view
                    .state
                    .partitions
                    .get(&(table.table_id, record.partition_id))
                    .map(|p| p.name.clone()),
                bucket: record.bucket,
            },
            leader,
            address,
            leader_epoch,
        }
    }

    /// Opens the stream of a bucket this node leads at the bucket's leader epoch (fencing the
    /// previous writer) and remembers it. Idempotent: reopening at the same epoch keeps the
    /// appends in flight. Returns the stream id.
    pub(crate) async fn lead(&self, table: &TableRecord, b: &BucketRecord) -> NodeResult<u64> {
        let key = (b.table_id, b.partition_id, b.bucket);
        let _opening = self.inner.opening.lock().await;
        if let Some(led) = self.inner.led.read().expect("led lock").get(&key)
            && led.leader_epoch == b.leader_epoch
        {
            return Ok(led.stream_id);
        }
        self.inner.streams.open(b.stream_id, b.leader_epoch).await?;
        tracing::info!(
            table = %table.name,
            partition = b.partition_id,
            bucket = b.bucket,
            leader_epoch = b.leader_epoch,
            "leading bucket"
        );
        self.inner.led.write().expect("led lock").insert(
            key,
            Led {
                leader_epoch: b.leader_epoch,
                stream_id: b.stream_id,
            },
        );
        Ok(b.stream_id)
    }

    /// Writes `batch` to a table.
    ///
    /// Routed (no `target.bucket`): rows go to their partition (created if new) and, by the
    /// bucket key, to their bucket; a table without a bucket key puts the whole batch (per
    /// partition) in the next bucket, round-robin. Targeted (`target.bucket`, and
    /// `target.partition` for a partitioned table): every row must belong there, and
    /// `target.writer` (with its per-bucket sequence) makes the write idempotent.
    ///
    /// Returns a result per bucket, so a client can retry only what failed. An error for the
    /// whole request (unknown table, rows that do not fit the schema) stores nothing.
    pub async fn write(
        &self,
        database: &str,
        table: &str,
        batch: &RecordBatch,
        target: &WriteTarget,
    ) -> NodeResult<Vec<BucketWrite>> {
        Ok(self
            .submit_write(database, table, batch, target)
            .await?
            .await)
    }

    /// [`Node::write`] in two steps: returns once the rows have their offsets (writes submitted
    /// one after another are stored in that order per bucket); the [`PendingWrite`] resolves
    /// with the per-bucket results once they are durable. For pipelining a stream of batches.
    pub async fn submit_write(
        &self,
        database: &str,
        table: &str,
        batch: &RecordBatch,
        target: &WriteTarget,
    ) -> NodeResult<PendingWrite> {
        if let Some(w) = &target.writer {
            self.check_writer(w, target.epoch_may_rise).await?;
        }
        let record = self.table_record(database, table)?;
        if record.is_primary_key_table() {
            return self.submit_kv_write(database, table, batch, target).await;
        }
        let schema = self.table_schema(&record)?;
        let batch = mink_log::codec::check_batch(&schema, batch)?;
        if batch.num_rows() == 0 {
            return Ok(PendingWrite::ready(Vec::new()));
        }
        let whole_rows = batch.num_rows();
        let parts = self.route(&record, &schema, batch, target).await?;
        let routed = target.is_routed();
        let mut submitted = Vec::with_capacity(parts.len());
        for (partition, partition_id, b, part) in parts {
            let rows = part.num_rows();
            // The batch as received, when it all goes to this bucket.
            let ipc = target.ipc.as_ref().filter(|_| rows == whole_rows);
            let (appending, unsent) = match self.tablet(&record, partition_id, b).await {
                Ok(tablet) => (
                    match target.compression {
                        Some(c) => tablet.with_compression(c),
                        None => tablet,
                    }
                    .submit_received(&part, ipc, target.writer, target.timestamp_ms)
                    .await
                    .map_err(NodeError::from),
                    None,
                ),
                Err(e @ NodeError::NotLeader { .. }) => (Err(e), routed.then_some(part)),
                Err(e) => (Err(e), None),
            };
            submitted.push((partition, partition_id, b, rows, appending, unsent));
        }
        // The engine puts them in one object: one flush delay for all of them.
        Ok(PendingWrite::of(submitted, |appending| async move {
            appending.await.map_err(NodeError::from)
        }))
    }

    /// Splits a checked batch (it may carry extra columns after the table's) into its
    /// partitions, creating new ones, and buckets: `(partition, partition_id, bucket, rows)`.
    /// All rows are checked before anything is created.
    pub(crate) async fn route(
        &self,
        record: &TableRecord,
        schema: &arrow::datatypes::SchemaRef,
        batch: RecordBatch,
        target: &WriteTarget,
    ) -> NodeResult<Vec<(Option<String>, u64, u32, RecordBatch)>> {
        let (database, table) = (&record.database, &record.name);
        let options = TableOptions::parse(&record.options)?;
        let index_of = |c: &String| {
            schema
                .index_of(c)
                .map_err(|e| NodeError::Invalid(e.to_string()))
        };
        let key: Vec<usize> = options
            .bucket_key
            .iter()
            .map(index_of)
            .collect::<NodeResult<_>>()?;
        if target.writer.is_some() && target.bucket.is_none() {
            return Err(NodeError::Invalid(
                "an idempotent write names its bucket (writers route rows themselves)".into(),
            ));
        }
        if let Some(b) = target.bucket
            && b >= record.bucket_count
        {
            return Err(NodeError::Invalid(format!(
                "bucket {b} does not exist: {database}.{table} has {} buckets",
                record.bucket_count
            )));
        }
        // Partitions first (all rows checked before anything is created or stored).
        let by_partition: Vec<(Option<String>, RecordBatch)> = if record.is_partitioned() {
            let pkey: Vec<usize> = record
                .partition_keys
                .iter()
                .map(index_of)
                .collect::<NodeResult<_>>()?;
            let parts = split_by_partition(&batch, &pkey)?;
            if let Some(p) = &target.partition
                && parts.iter().any(|(name, _)| name != p)
            {
                return Err(NodeError::Invalid(format!(
                    "the batch for partition {p:?} holds rows of other partitions"
                )));
            }
            if target.bucket.is_some() && target.partition.is_none() {
                return Err(NodeError::Invalid(format!(
                    "{database}.{table} is partitioned: a write to a bucket names its partition too"
                )));
            }
            let new = parts
                .iter()
                .filter(|(name, _)| {
                    !self
                        .view()
                        .state
                        .partition_names
                        .contains_key(&(record.table_id, name.clone()))
                })
                .count();
            if new > MAX_NEW_PARTITIONS_PER_WRITE {
                return Err(NodeError::Invalid(format!(
                    "the batch would create {new} partitions; at most {MAX_NEW_PARTITIONS_PER_WRITE} per write (create them ahead, or check the partition columns)"
                )));
            }
            parts.into_iter().map(|(n, b)| (Some(n), b)).collect()
        } else {
            if let Some(p) = &target.partition {
                return Err(NodeError::Invalid(format!(
                    "{database}.{table} is not partitioned, yet the write names partition {p:?}"
                )));
            }
            vec![(None, batch)]
        };
        let mut parts: Vec<(Option<String>, u64, u32, RecordBatch)> = Vec::new();
        for (partition, batch) in by_partition {
            let partition_id = match &partition {
                Some(name) => self.ensure_partition(record, name).await?,
                None => 0,
            };
            match (target.bucket, key.is_empty()) {
                (Some(b), true) => parts.push((partition, partition_id, b, batch)),
                (Some(b), false) => {
                    let buckets = buckets_of(&batch, &key, record.bucket_count)?;
                    if let Some((row, belongs)) =
                        buckets.into_iter().enumerate().find(|(_, p)| *p != b)
                    {
                        return Err(NodeError::WrongBucket {
                            row,
                            bucket: b,
                            belongs,
                        });
                    }
                    parts.push((partition, partition_id, b, batch));
                }
                (None, true) => {
                    let b = self.inner.round_robin.fetch_add(1, Ordering::Relaxed)
                        % u64::from(record.bucket_count);
                    parts.push((
                        partition,
                        partition_id,
                        u32::try_from(b).unwrap_or(0),
                        batch,
                    ));
                }
                (None, false) => {
                    for (b, part) in split_by_bucket(&batch, &key, record.bucket_count)? {
                        parts.push((partition.clone(), partition_id, b, part));
                    }
                }
            }
        }
        Ok(parts)
    }

    /// Stops the node as a crash would (for tests of failover): the metadata sink stops at
    /// once without releasing the lease or expiring the heartbeat, so other nodes see this one
    /// die only when its heartbeat ages out; nothing in flight is acknowledged afterwards.
    pub async fn abort(&self) {
        self.inner.sink.abort();
        self.inner.shutdown.send_replace(true);
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().expect("tasks lock"));
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        self.inner.streams.shutdown().await;
    }

    /// The first step of a clean stop, taken before the frontends drain their connections:
    /// every tail ends with [`NodeError::Unavailable`] (its client tails again wherever the
    /// bucket is led next), so no open-ended read holds the drain, and the lease is handed
    /// over ([`Sink::resign`](mink_sql::Sink::resign)), so the coordinator's duties and the
    /// consumer groups move while this node drains. Writes and bounded reads in flight go on
    /// until [`Node::shutdown`].
    pub fn begin_shutdown(&self) {
        if self.inner.stopping.send_replace(true) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let sink = self.inner.sink.clone();
            runtime.spawn(async move { sink.resign().await });
        }
    }

    /// Whether [`Node::begin_shutdown`] (or [`Node::shutdown`]) was called.
    pub fn is_stopping(&self) -> bool {
        *self.inner.stopping.borrow()
    }

    /// Resolves once [`Node::begin_shutdown`] (or [`Node::shutdown`]) is called.
    pub async fn until_stopping(&self) {
        let mut stopping = self.inner.stopping.subscribe();
        let _ = stopping.wait_for(|s| *s).await;
    }

    /// Resolves once this node can serve no more, with why: its metadata sink halted (a newer
    /// registration of its node id fenced it, or its log is damaged). Not on a shutdown. The
    /// process should stop: a restart refuses to run beside a live namesake, or names the
    /// damage.
    pub async fn until_halted(&self) -> NodeError {
        match self.inner.sink.until_halted().await {
            mink_sql::SinkError::Shutdown => std::future::pending().await,
            e => NodeError::from(e),
        }
    }

    /// Stops the node cleanly (releases the lease, expires the heartbeat).
    pub async fn shutdown(&self) {
        self.begin_shutdown();
        self.inner.shutdown.send_replace(true);
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().expect("tasks lock"));
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        self.inner.streams.shutdown().await;
        self.inner.sink.shutdown().await;
    }
}
