//! The stream engine: open streams, append, flush stream-set objects, commit them in order.
//!
//! Write path: an append gets its offsets and joins the node's WAL buffer. A flush (at
//! `flush_bytes`, or `flush_delay` after the first buffered append) takes the buffer, takes a
//! pre-prepared object id, builds one object and PUTs it, retrying the same bytes. Several
//! PUTs may be in flight; one committer applies `CommitStreamSetObject` strictly in flush
//! order (the commits of the flushes uploaded meanwhile queued together, in one metadata
//! transaction), and only then acknowledges the appends of each committed range. Buffered
//! and in-flight bytes are bounded: past the bound, appends wait.
//!
//! Failure policy:
//! - a range rejected because its stream was fenced fails that range's appends; the stream is
//!   marked fenced, its buffered appends fail, and later ranges of it fail at their commits;
//! - an expired prepared id re-PUTs the same bytes under a new id and commits again;
//! - a node-epoch fence, a halted metadata sink, or a rejection that cannot happen fails
//!   everything in flight and the engine: its owner restarts it under a new node epoch.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mink_metadata::{
    CloseStream, Command, CommitStreamSetObject, CreateStreams, DeleteStream, OpenStream, Outcome,
    PrepareObject, Rejection, RejectionKind, Reply, StreamRange, TrimStream, WriterRange,
};
use mink_sql::{Sink, SinkError};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cache::{BlockCache, CacheStats, IndexCache, LogCache};
use crate::format::{ObjectBuilder, RecordBatch};

mod objects;
mod pipeline;
mod streams;
mod writers;

/// How the engine runs. The defaults suit real S3; see `docs/s3stream.md` for the cost.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Objects live under this prefix of the store.
    pub object_prefix: String,
    /// Flush when this many bytes are buffered.
    pub flush_bytes: usize,
    /// Flush at the latest this long after the first buffered append.
    pub flush_delay: Duration,
    /// Bound on buffered plus in-flight append bytes; past it, appends wait.
    pub max_buffered_bytes: usize,
    /// Stream-set objects being PUT at once.
    pub max_inflight_flushes: usize,
    /// Object ids reserved per `PrepareObject`.
    pub prepare_batch: u32,
    /// How long a prepared id stays valid.
    pub prepare_ttl: Duration,
    /// Target size of a data block (a reader fetches about this much per miss).
    pub block_bytes: usize,
    /// How far ahead of a sequential reader the next blocks of its stream are loaded into the
    /// block cache, at most (a window is four of the reader's fetches; 0: no read-ahead).
    pub read_ahead_bytes: usize,
    pub log_cache_bytes: usize,
    pub block_cache_bytes: usize,
    /// How long an object a reader would read whole waits for room in half the block cache
    /// (made as readers read the blocks they were given) before it is read by its index and
    /// ranges instead (or a quarter of it in which no unread block is read): one GET instead
    /// of several, for a wait of about a block's reading.
    pub whole_read_wait: Duration,
    /// GETs the read path has in flight at once (object indexes and runs of blocks,
    /// read-aheads included; at least 1); more wait their turn. S3 serves many at once; a
    /// store that serves requests on a few cores (moto, a one-node MinIO) reads fastest with
    /// about as many as it has cores to spare, as each request it takes on at once costs it
    /// memory and CPU.
    pub max_reads_in_flight: usize,
    pub index_cache_bytes: usize,
    /// Longest wait between retries of a failing PUT.
    pub max_backoff: Duration,
    /// Start a second PUT of the same bytes if the first has not answered after this long.
    pub hedge_after: Option<Duration>,
    /// Times prepared ids expire at, and cleanup compares against.
    pub clock: Arc<dyn mink_metadata::Clock>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            object_prefix: "s3stream/objects".to_string(),
            flush_bytes: 8 << 20,
            flush_delay: Duration::from_millis(50),
            max_buffered_bytes: 128 << 20,
            max_inflight_flushes: 4,
            prepare_batch: 64,
            prepare_ttl: Duration::from_secs(600),
            block_bytes: 1 << 20,
            read_ahead_bytes: 16 << 20,
            log_cache_bytes: 256 << 20,
            block_cache_bytes: 256 << 20,
            whole_read_wait: Duration::from_millis(200),
            max_reads_in_flight: 64,
            index_cache_bytes: 16 << 20,
            max_backoff: Duration::from_secs(2),
            hedge_after: None,
            clock: mink_metadata::system_clock(),
        }
    }
}

/// Why a stream operation failed, classed by what the caller can do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The stream was opened at a higher epoch elsewhere (or its bucket got a new leader).
    #[error("stream {stream_id} is fenced: {reason}")]
    Fenced { stream_id: u64, reason: String },
    /// This node does not have the stream open.
    #[error("stream {stream_id} is not open on this node")]
    NotOpen { stream_id: u64 },
    #[error("stream {stream_id} does not exist")]
    NotFound { stream_id: u64 },
    /// The bucket is led by another node.
    #[error("stream {stream_id} belongs to a bucket led by node {leader}")]
    NotLeader { stream_id: u64, leader: u64 },
    /// Offsets outside `[start, end)` (trimmed, or beyond the committed end).
    #[error("offset {offset} of stream {stream_id} is out of range [{start}, {end})")]
    OutOfRange {
        stream_id: u64,
        offset: u64,
        start: u64,
        end: u64,
    },
    /// An idempotent writer skipped or repeated sequence numbers (`expected` is the next one
    /// the stream takes from it: 0 for a writer, or a writer epoch, new to the stream).
    #[error("writer {writer_id}: sequence {got} is out of order, expected {expected}")]
    OutOfOrderSequence {
        writer_id: u64,
        expected: u64,
        got: u64,
    },
    /// The writer's batch is still being written; ask again once it is acknowledged.
    #[error("writer {writer_id}: sequences {first}..={last} are still in flight")]
    SequenceInFlight {
        writer_id: u64,
        first: u64,
        last: u64,
    },
    #[error("writer {writer_id} epoch {epoch} is fenced by epoch {current}")]
    WriterFenced {
        writer_id: u64,
        epoch: u64,
        current: u64,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
    /// One batch larger than the engine buffers: it can never be taken whole.
    #[error("a batch of {size} bytes exceeds the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    /// The engine stopped (node fenced, metadata sink halted, or a rejection that cannot
    /// happen): restart it under a new node epoch.
    #[error("the stream engine failed: {0}")]
    Failed(String),
    #[error("object storage: {0}")]
    Storage(String),
    #[error("the stream engine is shut down")]
    Shutdown,
}

impl StreamError {
    fn from_rejection(stream_id: u64, r: &Rejection) -> Self {
        match r.kind() {
            RejectionKind::StreamFenced | RejectionKind::LeaderFenced => StreamError::Fenced {
                stream_id,
                reason: r.message.clone(),
            },
            RejectionKind::NotLeader => StreamError::NotLeader {
                stream_id,
                leader: r.current.unwrap_or(0),
            },
            RejectionKind::NotFound => StreamError::NotFound { stream_id },
            RejectionKind::InvalidArgument | RejectionKind::BelowFloor => {
                StreamError::Invalid(r.message.clone())
            }
            _ => StreamError::Failed(r.to_string()),
        }
    }
}

impl From<SinkError> for StreamError {
    fn from(e: SinkError) -> Self {
        match e {
            SinkError::Shutdown => StreamError::Shutdown,
            other => StreamError::Failed(other.to_string()),
        }
    }
}

/// Identity and sequence range of an idempotent writer's batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterBatchId {
    pub writer_id: u64,
    pub writer_epoch: u64,
    pub first_sequence: u64,
    pub last_sequence: u64,
    /// A writer the stream holds no state for may start at any sequence, as a Kafka producer
    /// may (its state can have gone with a topic deleted and created again; Kafka accepts any
    /// first sequence from a producer the partition does not know). Otherwise a writer starts
    /// at sequence 0. Either way it goes on without gaps from its first batch.
    pub any_first_sequence: bool,
}

/// An append submitted to the write buffer (see [`S3Stream::submit`]): resolves once it is
/// durable and committed, or failed.
#[derive(Debug)]
#[must_use = "an append is only known durable once this resolves"]
pub struct Appending {
    base_offset: u64,
    waiting: Waiting,
}

impl Appending {
    fn ready(ack: AppendAck) -> Self {
        Appending {
            base_offset: ack.base_offset,
            waiting: Waiting::Ready(Some(ack)),
        }
    }

    /// The offset of the batch's first record, known from submission on.
    pub fn base_offset(&self) -> u64 {
        self.base_offset
    }

    /// Whether this append was answered at submission as an idempotent duplicate (it then
    /// resolves at once with the original offsets and writes nothing).
    pub fn is_duplicate(&self) -> bool {
        matches!(self.waiting, Waiting::Ready(_))
    }
}

#[derive(Debug)]
enum Waiting {
    /// Answered without writing (an idempotent duplicate).
    Ready(Option<AppendAck>),
    Pending(oneshot::Receiver<Result<AppendAck, StreamError>>),
}

impl Future for Appending {
    type Output = Result<AppendAck, StreamError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.waiting {
            Waiting::Ready(ack) => std::task::Poll::Ready(ack.take().ok_or(StreamError::Shutdown)),
            Waiting::Pending(rx) => std::pin::Pin::new(rx)
                .poll(cx)
                .map(|r| r.map_err(|_| StreamError::Shutdown)?),
        }
    }
}

/// Where an append landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendAck {
    pub base_offset: u64,
    pub end_offset: u64,
    /// The batch had been written before (an idempotent retry); these are its original offsets.
    pub duplicate: bool,
}

/// A stream's readable range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    pub stream_id: u64,
    pub epoch: u64,
    pub start_offset: u64,
    /// The committed end (high watermark).
    pub end_offset: u64,
}

/// Counters for benchmarks, metrics and tests.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub appends: AtomicU64,
    pub appended_bytes: AtomicU64,
    pub flushes: AtomicU64,
    /// Flushes whose object is PUT and queued for commit (which may still wait for earlier ones).
    pub uploads: AtomicU64,
    pub puts: AtomicU64,
    pub put_retries: AtomicU64,
    pub hedged_puts: AtomicU64,
    pub commits: AtomicU64,
    /// Commits queued behind an earlier one of the same group (see `docs/s3stream.md`, the
    /// write path): they share its metadata transaction instead of waiting for their own.
    pub grouped_commits: AtomicU64,
    pub reputs_after_expiry: AtomicU64,
    pub fenced_ranges: AtomicU64,
    /// GETs of object data (indexes and runs of blocks).
    pub object_reads: AtomicU64,
    /// GETs of object indexes (counted in `object_reads` too), whole objects read with their
    /// index included.
    pub index_reads: AtomicU64,
    /// GETs of whole objects (counted in `index_reads` and `object_reads` too): see
    /// `docs/s3stream.md` (Reads) for when an object is read whole.
    pub whole_object_reads: AtomicU64,
    /// Objects a reader would have read whole but read by their index and blocks: half the
    /// block cache had no room for them beside the blocks readers were given and have not read.
    pub whole_reads_refused: AtomicU64,
    /// Objects to be read whole that waited for room in half the block cache (readers reading
    /// the blocks they were given make it): read whole after all, or refused after the wait.
    pub whole_reads_waited: AtomicU64,
    /// Blocks read from object storage whose checksum was computed: once per block read,
    /// however many fetches decode it from the block cache.
    pub blocks_verified: AtomicU64,
    /// GETs a read-ahead started: of block runs, indexes and whole objects (counted in
    /// `object_reads` too).
    pub read_ahead_reads: AtomicU64,
    /// GETs of the read path that waited for one of `max_reads_in_flight` to end.
    pub reads_queued: AtomicU64,
    /// Blocks (and their bytes) read-aheads made sure of: loaded, or found loaded.
    pub read_ahead_blocks: AtomicU64,
    pub read_ahead_bytes: AtomicU64,
    /// Flushes that built their object in a committed object's buffer.
    pub object_buffers_reused: AtomicU64,
    /// Appends that waited for room in `max_buffered_bytes` (the buffer full of appends not
    /// yet flushed).
    pub appends_waited: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// A GET of the read path (a read-ahead's: `ahead`): counted, and in flight only with one of
/// the engine's `max_reads_in_flight` permits.
pub(crate) async fn read_range(
    engine: &Engine,
    path: &Path,
    range: std::ops::Range<u64>,
    ahead: bool,
) -> object_store::Result<Bytes> {
    let _permit = read_permit(engine, ahead).await;
    engine.store.get_range(path, range).await
}

/// Counts a GET of the read path (a read-ahead's: `ahead`) and waits for one of the engine's
/// `max_reads_in_flight` permits, to be held while it is in flight.
pub(crate) async fn read_permit(engine: &Engine, ahead: bool) -> tokio::sync::SemaphorePermit<'_> {
    // In this order: a fetch's GETs (all but the read-ahead's) never seem to go down.
    add(&engine.stats.object_reads, 1);
    if ahead {
        add(&engine.stats.read_ahead_reads, 1);
    }
    match engine.reads.try_acquire() {
        Ok(permit) => permit,
        Err(_) => {
            add(&engine.stats.reads_queued, 1);
            engine.counted.notify_waiters();
            engine
                .reads
                .acquire()
                .await
                .expect("the read permits are never closed")
        }
    }
}

/// The path of an object id. Fixed-width hex keeps listings in id order.
pub fn object_path(prefix: &str, object_id: u64) -> Path {
    Path::from(format!("{prefix}/{object_id:016x}"))
}

/// Parses an object id back from its path (for the orphan sweep).
pub fn object_id_of(path: &Path) -> Option<u64> {
    u64::from_str_radix(path.filename()?, 16).ok()
}

type AckSender = oneshot::Sender<Result<AppendAck, StreamError>>;

struct Pending {
    batch: RecordBatch,
    /// The stream epoch the append was accepted under.
    epoch: u64,
    writer: Option<WriterBatchId>,
    ack: AckSender,
    _permit: OwnedSemaphorePermit,
}

/// The writer's latest sequence this node has accepted (in flight or committed).
#[derive(Clone, Copy, Debug)]
struct WriterTail {
    epoch: u64,
    last_sequence: u64,
}

struct Owned {
    epoch: u64,
    /// Next offset to assign.
    next_offset: u64,
    fenced: Option<String>,
    /// Being closed or deleted: no new appends.
    closing: bool,
    writers: HashMap<u64, WriterTail>,
    /// Appends accepted but not yet answered.
    unanswered: u64,
}

#[derive(Default)]
struct WalState {
    streams: HashMap<u64, Owned>,
    pending: BTreeMap<u64, Vec<Pending>>,
    pending_bytes: usize,
    first_pending: Option<Instant>,
    next_seq: u64,
}

/// One flushed buffer: what goes into one stream-set object.
struct Flush {
    seq: u64,
    /// stream -> (epoch, batches), in stream order.
    streams: BTreeMap<u64, (u64, Vec<Pending>)>,
    bytes: Bytes,
}

/// A flush on its way to the committer: uploaded under `object_id` (with the time its id
/// expires, ms), or failed. Every flush reaches the committer, so a failed one never holds
/// back the ones after it.
struct Uploaded {
    flush: Flush,
    object_id: Result<(u64, u64), StreamError>,
}

pub(crate) struct Engine {
    pub(crate) sink: Sink,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) config: EngineConfig,
    state: Mutex<WalState>,
    budget: Arc<Semaphore>,
    inflight: Arc<Semaphore>,
    /// Something was buffered into an empty buffer: start the delay timer.
    new_data: Notify,
    /// The buffer reached `flush_bytes`: flush now.
    flush_kick: Notify,
    drained: Notify,
    failed: Mutex<Option<StreamError>>,
    /// Buffers of committed objects, for the next flushes to build in: a fresh buffer is
    /// fresh pages that the kernel zeroes as they are first written (under the flusher, 8 % of
    /// the CPU of a Kafka produce benchmark's process, node and load, on moto).
    object_buffers: Mutex<Vec<bytes::BytesMut>>,
    ids: tokio::sync::Mutex<VecDeque<(u64, u64)>>,
    pub(crate) log_cache: LogCache,
    pub(crate) index_cache: IndexCache,
    pub(crate) block_cache: BlockCache,
    /// Blocks being read from object storage, so no block is read twice at once.
    pub(crate) loads: Mutex<crate::read::Loads>,
    /// Object indexes being read, so readers meeting a new object together read it once.
    pub(crate) index_loads: Mutex<crate::read::IndexLoads>,
    /// Streams being read sequentially from object storage (for read-ahead).
    pub(crate) readers: Mutex<crate::read::Readers>,
    /// Bytes of read-ahead windows being loaded.
    pub(crate) read_ahead_inflight: AtomicU64,
    /// Told whenever a read-ahead ends.
    pub(crate) read_ahead_ended: Notify,
    /// Bytes of whole objects being read for readers entering them (see `read::load_index`).
    pub(crate) whole_reads_inflight: AtomicU64,
    /// One permit per GET of the read path in flight (`max_reads_in_flight`).
    pub(crate) reads: Semaphore,
    /// Told whenever a counter [`S3Stream::stat_reaches`] waits on goes up: a read waited for
    /// a permit (`stats.reads_queued`) or for room to read an object whole
    /// (`stats.whole_reads_waited`), or a flush was PUT (`stats.uploads`).
    pub(crate) counted: Notify,
    pub(crate) stats: EngineStats,
    /// The rate `stats.appended_bytes` goes up at, for compaction to yield to.
    append_window: Mutex<crate::compaction::RateWindow>,
    shutdown: watch::Sender<bool>,
}

impl Engine {
    /// Bytes per second appended to the node's streams over the last second or more.
    pub(crate) fn append_rate(&self) -> u64 {
        let total = self.stats.appended_bytes.load(Ordering::Relaxed);
        self.append_window
            .lock()
            .expect("append window lock")
            .observe(Instant::now(), total)
    }
}

/// A node's stream engine. Cheap to clone.
#[derive(Clone)]
pub struct S3Stream {
    pub(crate) engine: Arc<Engine>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl std::fmt::Debug for S3Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Stream")
            .field("node", &self.engine.sink.node())
            .finish_non_exhaustive()
    }
}

impl S3Stream {
    /// Starts the engine of the node `sink` belongs to, on `store`.
    pub fn start(sink: Sink, store: Arc<dyn ObjectStore>, config: EngineConfig) -> Self {
        let budget = Arc::new(Semaphore::new(config.max_buffered_bytes));
        let inflight = Arc::new(Semaphore::new(config.max_inflight_flushes.max(1)));
        let engine = Arc::new(Engine {
            log_cache: LogCache::new(config.log_cache_bytes),
            index_cache: IndexCache::new(config.index_cache_bytes),
            block_cache: BlockCache::new(config.block_cache_bytes),
            loads: Mutex::new(HashMap::new()),
            index_loads: Mutex::new(HashMap::new()),
            readers: Mutex::new(crate::read::Readers::default()),
            read_ahead_inflight: AtomicU64::new(0),
            read_ahead_ended: Notify::new(),
            whole_reads_inflight: AtomicU64::new(0),
            reads: Semaphore::new(config.max_reads_in_flight.max(1)),
            counted: Notify::new(),
            sink,
            store,
            config,
            state: Mutex::new(WalState::default()),
            budget,
            inflight,
            new_data: Notify::new(),
            flush_kick: Notify::new(),
            drained: Notify::new(),
            failed: Mutex::new(None),
            object_buffers: Mutex::new(Vec::new()),
            ids: tokio::sync::Mutex::new(VecDeque::new()),
            stats: EngineStats::default(),
            append_window: Mutex::new(crate::compaction::RateWindow::new()),
            shutdown: watch::channel(false).0,
        });
        let (uploaded_tx, uploaded_rx) = mpsc::unbounded_channel();
        let flusher = tokio::spawn(Arc::clone(&engine).run_flusher(uploaded_tx));
        let committer = tokio::spawn(Arc::clone(&engine).run_committer(uploaded_rx));
        S3Stream {
            engine,
            tasks: Arc::new(Mutex::new(vec![flusher, committer])),
        }
    }

    /// The object store the engine writes to (for neighbours such as KV snapshots).
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.engine.store)
    }

    pub fn stats(&self) -> &EngineStats {
        &self.engine.stats
    }

    /// Returns once `stat` of [`EngineStats`] reaches `n`, so a test can see a wait or a PUT at
    /// work without polling. Only `reads_queued` (GETs that waited for a permit),
    /// `whole_reads_waited` (whole reads that waited for room), `uploads` (flushes PUT) and
    /// `appends_waited` are told; any other counter waits for one of them to move.
    pub async fn stat_reaches(&self, stat: fn(&EngineStats) -> &AtomicU64, n: u64) {
        let engine = &self.engine;
        loop {
            let mut waited = std::pin::pin!(engine.counted.notified());
            waited.as_mut().enable();
            if stat(&engine.stats).load(Ordering::Relaxed) >= n {
                return;
            }
            waited.await;
        }
    }

    /// The engine clock's time, as [`S3Stream::append`] stamps batches with it.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.engine.config.clock.now_ms()).unwrap_or(i64::MAX)
    }

    /// Hits, misses and entries evicted unread of the read caches, by name (`log`, `index`,
    /// `block`).
    pub fn cache_stats(&self) -> [(&'static str, &CacheStats); 3] {
        [
            ("log", &self.engine.log_cache.stats),
            ("index", &self.engine.index_cache.stats),
            ("block", &self.engine.block_cache.stats),
        ]
    }

    pub fn sink(&self) -> &Sink {
        &self.engine.sink
    }

    /// Why the engine failed, if it did.
    pub fn failed(&self) -> Option<StreamError> {
        self.engine.failed.lock().expect("failed lock").clone()
    }

    pub(crate) fn shutdown_watch(&self) -> watch::Receiver<bool> {
        self.engine.shutdown.subscribe()
    }

    pub(crate) fn add_task(&self, task: JoinHandle<()>) {
        self.tasks.lock().expect("tasks lock").push(task);
    }

    /// Stops the flusher and committer; appends not yet committed fail with `Shutdown`.
    pub async fn shutdown(&self) {
        self.engine.shutdown.send_replace(true);
        self.engine.fail(&StreamError::Shutdown);
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("tasks lock"));
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
    }
}
