use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use arrow::array::RecordBatch;
use mink_log::LogTablet;
use mink_log::options::TableOptions;
use mink_log::routing::split_by_bucket;
use mink_metadata::{BucketKey, BucketRecord, TableRecord, View};
use mink_sql::{Sink, SinkConfig};
use s3stream::{AppendAck, CompactionConfig, EngineConfig, S3Stream, WriterBatchId};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{NodeError, NodeResult};

/// How a node runs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: u64,
    /// Where clients reach this node (its Flight address), as registered in the metadata.
    pub advertised_address: String,
    /// `sqlite://...`, `sqlite::memory:` or `postgres://...`.
    pub metadata_url: String,
    /// `file:///...`, a path, `s3://...` or `memory://`.
    pub object_store_url: String,
    pub lease_ttl: Duration,
    pub engine: EngineConfig,
    pub compaction: CompactionConfig,
    /// How often leadership is reconciled with the metadata view.
    pub leadership_interval: Duration,
}

impl NodeConfig {
    pub fn new(node_id: u64, metadata_url: &str, object_store_url: &str) -> Self {
        NodeConfig {
            node_id,
            advertised_address: String::new(),
            metadata_url: metadata_url.to_string(),
            object_store_url: object_store_url.to_string(),
            lease_ttl: Duration::from_secs(30),
            engine: EngineConfig::default(),
            compaction: CompactionConfig::default(),
            leadership_interval: Duration::from_millis(200),
        }
    }
}

/// An idempotent writer's identity (from `allocate_writer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterId {
    pub writer_id: u64,
    pub writer_epoch: u64,
}

/// What happened to the rows of one bucket in a write.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketWrite {
    pub partition_id: u64,
    pub bucket: u32,
    pub rows: usize,
    pub result: Result<AppendAck, NodeError>,
}

/// A bucket this node leads: its tablet at the leader epoch it was opened with.
#[derive(Clone, Debug)]
pub(crate) struct Led {
    pub(crate) leader_epoch: u64,
    pub(crate) tablet: Arc<LogTablet>,
}

pub(crate) struct Inner {
    pub(crate) config: NodeConfig,
    pub(crate) sink: Sink,
    pub(crate) streams: S3Stream,
    pub(crate) led: RwLock<HashMap<BucketKey, Led>>,
    pub(crate) round_robin: AtomicU64,
    /// Serialises stream opens, so the leadership loop and a write do not open one twice.
    pub(crate) opening: tokio::sync::Mutex<()>,
    pub(crate) shutdown: watch::Sender<bool>,
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
    /// node epoch, and starts leadership and compaction.
    pub async fn start(config: NodeConfig) -> NodeResult<Node> {
        let meta = mink_sql::connect(&config.metadata_url)
            .await
            .map_err(|e| NodeError::Unavailable(format!("metadata database: {e}")))?;
        let store = s3stream::store::open(&config.object_store_url)
            .map_err(|e| NodeError::Invalid(e.to_string()))?;
        let mut sink_config = SinkConfig::new(config.node_id);
        sink_config.address = config.advertised_address.clone();
        sink_config.lease_ttl = config.lease_ttl;
        let sink = Sink::start(meta, sink_config).await?;
        let streams = S3Stream::start(sink.clone(), store, config.engine.clone());
        streams.spawn_background(config.compaction.clone());
        let node = Node {
            inner: Arc::new(Inner {
                config,
                sink,
                streams,
                led: RwLock::new(HashMap::new()),
                round_robin: AtomicU64::new(0),
                opening: tokio::sync::Mutex::new(()),
                shutdown: watch::channel(false).0,
                tasks: Mutex::new(Vec::new()),
            }),
        };
        let leadership = tokio::spawn(crate::leadership::run(node.clone()));
        node.inner
            .tasks
            .lock()
            .expect("tasks lock")
            .push(leadership);
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

    pub fn streams(&self) -> &S3Stream {
        &self.inner.streams
    }

    /// Waits (at most `limit`) until this node has applied metadata `index`: read-your-writes
    /// across nodes (`mink-min-applied-index`).
    pub async fn wait_applied(&self, index: u64, limit: Duration) -> NodeResult<View> {
        match tokio::time::timeout(limit, self.inner.sink.wait_applied(index)).await {
            Ok(view) => Ok(view?),
            Err(_) => Err(NodeError::Unavailable(format!(
                "node {} has applied metadata up to {}, not yet {index}; retry",
                self.node_id(),
                self.view().applied_index
            ))),
        }
    }

    /// Allocates an idempotent writer id.
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
                    writer_epoch: 0,
                }),
                other => Err(NodeError::Failed(format!("unexpected reply {other:?}"))),
            },
            Err(r) => Err(NodeError::Failed(r.to_string())),
        }
    }

    /// The tablet of a bucket this node leads, or where to go instead. A bucket the metadata
    /// says this node leads but the leadership loop has not opened yet is opened now, so a
    /// client redirected here does not bounce.
    pub async fn tablet(
        &self,
        table: &TableRecord,
        partition_id: u64,
        bucket: u32,
    ) -> NodeResult<Arc<LogTablet>> {
        let key = (table.table_id, partition_id, bucket);
        if let Some(led) = self.inner.led.read().expect("led lock").get(&key) {
            return Ok(Arc::clone(&led.tablet));
        }
        let view = self.view();
        let record = view.state.buckets.get(&key).ok_or_else(|| {
            NodeError::NotFound(format!(
                "bucket {bucket} of {}.{} does not exist",
                table.database, table.name
            ))
        })?;
        if record.leader_node_id == 0 {
            return Err(NodeError::Unavailable(format!(
                "bucket {bucket} of {}.{} has no leader yet; retry",
                table.database, table.name
            )));
        }
        let me = self.inner.sink.node();
        if record.leader_node_id == me.node_id {
            if record.leader_node_epoch != me.node_epoch {
                return Err(NodeError::Unavailable(format!(
                    "bucket {bucket} of {}.{} is being moved off this node's previous life; retry",
                    table.database, table.name
                )));
            }
            return self.lead(table, record).await;
        }
        let address = view
            .state
            .nodes
            .get(&record.leader_node_id)
            .map(|n| n.address.clone())
            .unwrap_or_default();
        Err(NodeError::NotLeader {
            table: format!("{}.{}", table.database, table.name),
            bucket,
            leader: record.leader_node_id,
            address,
        })
    }

    /// Opens the stream of a bucket this node leads at the bucket's leader epoch (fencing the
    /// previous writer) and keeps its tablet. Idempotent: reopening at the same epoch keeps the
    /// appends in flight.
    pub(crate) async fn lead(
        &self,
        table: &TableRecord,
        b: &BucketRecord,
    ) -> NodeResult<Arc<LogTablet>> {
        let key = (b.table_id, b.partition_id, b.bucket);
        let _opening = self.inner.opening.lock().await;
        if let Some(led) = self.inner.led.read().expect("led lock").get(&key)
            && led.leader_epoch == b.leader_epoch
        {
            return Ok(Arc::clone(&led.tablet));
        }
        let schema = self.table_schema(table)?;
        let options = TableOptions::parse(&table.options)?;
        self.inner.streams.open(b.stream_id, b.leader_epoch).await?;
        tracing::info!(
            table = %table.name,
            bucket = b.bucket,
            leader_epoch = b.leader_epoch,
            "leading bucket"
        );
        let tablet = Arc::new(LogTablet::new(
            self.inner.streams.clone(),
            b.stream_id,
            schema,
            options.compression,
        ));
        self.inner.led.write().expect("led lock").insert(
            key,
            Led {
                leader_epoch: b.leader_epoch,
                tablet: Arc::clone(&tablet),
            },
        );
        Ok(tablet)
    }
    /// Writes `batch` to a table. Without `bucket`, rows are routed by the bucket key (or the
    /// whole batch goes to the next bucket, round-robin, for a table without one). With
    /// `bucket`, every row must belong to it, and `writer` (with its per-bucket sequence) makes
    /// the write idempotent. Returns a result per bucket, so a client can retry only what failed.
    pub async fn write(
        &self,
        database: &str,
        table: &str,
        batch: &RecordBatch,
        bucket: Option<u32>,
        writer: Option<WriterBatchId>,
    ) -> NodeResult<Vec<BucketWrite>> {
        let record = self.table_record(database, table)?;
        if record.is_partitioned() {
            return Err(NodeError::Invalid(format!(
                "{database}.{table} is partitioned: write to a partition (not supported yet)"
            )));
        }
        let options = TableOptions::parse(&record.options)?;
        let schema = self.table_schema(&record)?;
        let batch = mink_log::codec::check_batch(&schema, batch)?;
        let key: Vec<usize> = options
            .bucket_key
            .iter()
            .map(|c| {
                schema
                    .index_of(c)
                    .map_err(|e| NodeError::Invalid(e.to_string()))
            })
            .collect::<NodeResult<_>>()?;
        let parts: Vec<(u32, RecordBatch)> = match (bucket, key.is_empty()) {
            (Some(b), _) if b >= record.bucket_count => {
                return Err(NodeError::Invalid(format!(
                    "bucket {b} does not exist: {database}.{table} has {} buckets",
                    record.bucket_count
                )));
            }
            (Some(b), true) => vec![(b, batch)],
            (Some(b), false) => {
                let parts = split_by_bucket(&batch, &key, record.bucket_count)?;
                if parts.iter().any(|(p, _)| *p != b) {
                    return Err(NodeError::Invalid(format!(
                        "the batch for bucket {b} holds rows of other buckets (see the routing function)"
                    )));
                }
                parts
            }
            (None, true) => {
                let b = self.inner.round_robin.fetch_add(1, Ordering::Relaxed)
                    % u64::from(record.bucket_count);
                vec![(u32::try_from(b).unwrap_or(0), batch)]
            }
            (None, false) => split_by_bucket(&batch, &key, record.bucket_count)?,
        };
        if writer.is_some() && bucket.is_none() {
            return Err(NodeError::Invalid(
                "an idempotent write names its bucket (writers route rows themselves)".into(),
            ));
        }
        let writes = parts.into_iter().map(|(b, part)| {
            let record = &record;
            async move {
                let rows = part.num_rows();
                let result = match self.tablet(record, 0, b).await {
                    Ok(tablet) => tablet.append(&part, writer).await.map_err(NodeError::from),
                    Err(e) => Err(e),
                };
                BucketWrite {
                    partition_id: 0,
                    bucket: b,
                    rows,
                    result,
                }
            }
        });
        // Concurrently: the engine puts them in one object, one flush delay for all.
        Ok(futures::future::join_all(writes).await)
    }

    /// Reads a bucket from `offset` (any node can read; no leadership needed).
    pub async fn read(
        &self,
        database: &str,
        table: &str,
        bucket: u32,
        offset: u64,
        max_bytes: usize,
        columns: &[String],
    ) -> NodeResult<Vec<mink_log::ReadBatch>> {
        let record = self.table_record(database, table)?;
        let view = self.view();
        let b = view
            .state
            .buckets
            .get(&(record.table_id, 0, bucket))
            .ok_or_else(|| {
                NodeError::NotFound(format!(
                    "bucket {bucket} of {database}.{table} does not exist"
                ))
            })?;
        let schema = self.table_schema(&record)?;
        let options = TableOptions::parse(&record.options)?;
        let tablet = LogTablet::new(
            self.inner.streams.clone(),
            b.stream_id,
            schema,
            options.compression,
        );
        Ok(tablet.read(offset, max_bytes, columns).await?)
    }

    /// The committed end (high watermark) and start of a bucket.
    pub fn bucket_offsets(
        &self,
        database: &str,
        table: &str,
        bucket: u32,
    ) -> NodeResult<(u64, u64)> {
        let record = self.table_record(database, table)?;
        let view = self.view();
        let b = view
            .state
            .buckets
            .get(&(record.table_id, 0, bucket))
            .ok_or_else(|| {
                NodeError::NotFound(format!(
                    "bucket {bucket} of {database}.{table} does not exist"
                ))
            })?;
        let s =
            view.state.streams.get(&b.stream_id).ok_or_else(|| {
                NodeError::NotFound(format!("the stream of bucket {bucket} is gone"))
            })?;
        Ok((s.start_offset, s.end_offset))
    }

    /// Waits (at most `limit`) until a bucket's committed end passes `offset`: tailing.
    pub async fn wait_for_data(
        &self,
        database: &str,
        table: &str,
        bucket: u32,
        offset: u64,
        limit: Duration,
    ) -> NodeResult<u64> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let applied = self.view().applied_index;
            let (_, end) = self.bucket_offsets(database, table, bucket)?;
            if end > offset {
                return Ok(end);
            }
            if tokio::time::timeout_at(deadline, self.inner.sink.wait_applied(applied + 1))
                .await
                .is_err()
            {
                return Ok(end);
            }
        }
    }

    /// Stops the node cleanly (releases the lease, expires the heartbeat).
    pub async fn shutdown(&self) {
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
