//! The stream engine: open streams, append, flush stream-set objects, commit them in order.
//!
//! Write path: an append gets its offsets and joins the node's WAL buffer. A flush (at
//! `flush_bytes`, or `flush_delay` after the first buffered append) takes the buffer, takes a
//! pre-prepared object id, builds one object and PUTs it, retrying the same bytes. Several
//! PUTs may be in flight; one committer applies `CommitStreamSetObject` strictly in flush
//! order, and only then acknowledges the appends of each committed range. Buffered and
//! in-flight bytes are bounded: past the bound, appends wait.
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
    pub log_cache_bytes: usize,
    pub block_cache_bytes: usize,
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
            log_cache_bytes: 256 << 20,
            block_cache_bytes: 256 << 20,
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
    pub puts: AtomicU64,
    pub put_retries: AtomicU64,
    pub hedged_puts: AtomicU64,
    pub commits: AtomicU64,
    pub reputs_after_expiry: AtomicU64,
    pub fenced_ranges: AtomicU64,
    pub object_reads: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn count_read(engine: &Engine) {
    add(&engine.stats.object_reads, 1);
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
    _inflight: OwnedSemaphorePermit,
}

/// A flush on its way to the committer: uploaded under `object_id`, or failed. Every flush
/// reaches the committer, so a failed one never holds back the ones after it.
struct Uploaded {
    flush: Flush,
    object_id: Result<u64, StreamError>,
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
    ids: tokio::sync::Mutex<VecDeque<(u64, u64)>>,
    pub(crate) log_cache: LogCache,
    pub(crate) index_cache: IndexCache,
    pub(crate) block_cache: BlockCache,
    pub(crate) stats: EngineStats,
    shutdown: watch::Sender<bool>,
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
            ids: tokio::sync::Mutex::new(VecDeque::new()),
            stats: EngineStats::default(),
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

    /// Hits and misses of the read caches, by name (`log`, `index`, `block`).
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

    /// Creates `count` streams; returns the first id (ids are consecutive).
    pub async fn create_streams(&self, count: u32) -> Result<u64, StreamError> {
        let proposed = self
            .engine
            .sink
            .propose(Command::CreateStreams(CreateStreams { count }))
            .await?;
        match proposed.result {
            Ok(Outcome::Done(Reply::Range(r)) | Outcome::Redundant(Reply::Range(r))) => Ok(r.start),
            Ok(other) => Err(StreamError::Failed(format!("unexpected reply {other:?}"))),
            Err(r) => Err(StreamError::Invalid(r.to_string())),
        }
    }

    /// Opens a stream for appending at `epoch` (above any epoch it was opened at before, or
    /// the bucket's leader epoch). Appends resume at the committed end.
    pub async fn open(&self, stream_id: u64, epoch: u64) -> Result<StreamInfo, StreamError> {
        let node = self.engine.sink.node();
        let proposed = self
            .engine
            .sink
            .propose(Command::OpenStream(OpenStream {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                stream_id,
                stream_epoch: epoch,
            }))
            .await?;
        let position = match proposed.result {
            Ok(outcome) => match outcome.into_reply() {
                Reply::Stream(p) => p,
                other => return Err(StreamError::Failed(format!("unexpected reply {other:?}"))),
            },
            Err(r) => return Err(StreamError::from_rejection(stream_id, &r)),
        };
        let info = StreamInfo {
            stream_id,
            epoch,
            start_offset: position.start_offset,
            end_offset: position.end_offset,
        };
        let stale = {
            let mut state = self.engine.state.lock().expect("wal lock");
            if let Some(o) = state.streams.get(&stream_id)
                && o.epoch == epoch
                && o.fenced.is_none()
                && !o.closing
            {
                // Already open here at this epoch: keep the appends in flight.
                return Ok(info);
            }
            // Appends buffered under an older epoch can never commit: fail them now, so the
            // new epoch starts clean at the committed end.
            let stale = state.pending.remove(&stream_id).unwrap_or_default();
            let freed: usize = stale.iter().map(|p| p.batch.payload.len().max(1)).sum();
            state.pending_bytes -= freed;
            state.streams.insert(
                stream_id,
                Owned {
                    epoch,
                    next_offset: position.end_offset,
                    fenced: None,
                    closing: false,
                    writers: HashMap::new(),
                    unanswered: 0,
                },
            );
            stale
        };
        for p in stale {
            let _ = p.ack.send(Err(StreamError::Fenced {
                stream_id,
                reason: format!("reopened at epoch {epoch}"),
            }));
        }
        Ok(info)
    }

    /// Appends one batch spanning `count` offsets. Returns once the batch is on object storage
    /// and committed. With `writer`, a retry of a batch already written returns its original
    /// offsets instead of writing it again.
    pub async fn append(
        &self,
        stream_id: u64,
        count: u32,
        payload: Bytes,
        writer: Option<WriterBatchId>,
    ) -> Result<AppendAck, StreamError> {
        self.submit(stream_id, count, payload, writer).await?.await
    }

    /// The first half of [`S3Stream::append`]: waits for room in the write buffer, then takes
    /// the batch's offsets and returns; the returned [`Appending`] resolves once the batch is
    /// durable. Batches submitted one after another to a stream are stored in that order, so
    /// a caller can pipeline many appends (and idempotent sequences stay in order) while
    /// waiting for their durability together.
    pub async fn submit(
        &self,
        stream_id: u64,
        count: u32,
        payload: Bytes,
        writer: Option<WriterBatchId>,
    ) -> Result<Appending, StreamError> {
        self.submit_at(stream_id, None, count, payload, writer)
            .await
    }

    /// [`S3Stream::submit`] only while the stream is open here at `epoch` (when given): a
    /// caller that computed its batch for one opening of the stream never appends it to a
    /// later one (fails with [`StreamError::Fenced`]).
    pub async fn submit_at(
        &self,
        stream_id: u64,
        epoch: Option<u64>,
        count: u32,
        payload: Bytes,
        writer: Option<WriterBatchId>,
    ) -> Result<Appending, StreamError> {
        let engine = &self.engine;
        let check_epoch = |owned: &Owned| match epoch {
            Some(e) if owned.epoch != e => Err(StreamError::Fenced {
                stream_id,
                reason: format!("open at epoch {}, the batch was made for {e}", owned.epoch),
            }),
            _ => Ok(()),
        };
        if let Some(e) = self.failed() {
            return Err(e);
        }
        if count == 0 {
            return Err(StreamError::Invalid(
                "a batch spans at least one offset".into(),
            ));
        }
        let size = payload.len().max(1);
        if size > engine.config.max_buffered_bytes / 2 {
            return Err(StreamError::Invalid(format!(
                "a batch of {size} bytes exceeds the limit of {}",
                engine.config.max_buffered_bytes / 2
            )));
        }
        // What can be answered without room in the buffer is answered first.
        {
            let state = engine.state.lock().expect("wal lock");
            check_epoch(Self::writable(&state, stream_id)?)?;
            if let Some(w) = writer
                && let Some(ack) = engine.committed_duplicate(stream_id, w)
            {
                return Ok(Appending::ready(ack));
            }
        }
        let permit = Arc::clone(&engine.budget)
            .acquire_many_owned(u32::try_from(size).unwrap_or(u32::MAX))
            .await
            .map_err(|_| StreamError::Shutdown)?;
        let (rx, base_offset) = {
            let mut state = engine.state.lock().expect("wal lock");
            if let Some(e) = self.failed() {
                return Err(e);
            }
            check_epoch(Self::writable(&state, stream_id)?)?;
            let owned = state.streams.get_mut(&stream_id).expect("checked above");
            if let Some(w) = writer
                && let Some(ack) = engine.check_writer(stream_id, owned, w)?
            {
                return Ok(Appending::ready(ack));
            }
            let base_offset = owned.next_offset;
            owned.next_offset += u64::from(count);
            owned.unanswered += 1;
            let epoch = owned.epoch;
            let (tx, rx) = oneshot::channel();
            state.pending.entry(stream_id).or_default().push(Pending {
                batch: RecordBatch {
                    base_offset,
                    count,
                    payload,
                },
                epoch,
                writer,
                ack: tx,
                _permit: permit,
            });
            state.pending_bytes += size;
            if state.first_pending.is_none() {
                state.first_pending = Some(Instant::now());
                engine.new_data.notify_one();
            }
            if state.pending_bytes >= engine.config.flush_bytes {
                engine.flush_kick.notify_one();
            }
            (rx, base_offset)
        };
        add(&engine.stats.appends, 1);
        add(&engine.stats.appended_bytes, size as u64);
        Ok(Appending {
            base_offset,
            waiting: Waiting::Pending(rx),
        })
    }

    /// How an append by writer batch `w` would be answered, without taking it: `Some(ack)`
    /// with the original offsets of a batch already stored, an error for a batch fenced, out of
    /// order or still in flight, `None` for the writer's next batch. Lets a caller recognise a
    /// retry before doing work for it (a primary-key changelog); the answer holds while the
    /// caller is the stream's only submitter.
    pub fn check_writer_batch(
        &self,
        stream_id: u64,
        w: WriterBatchId,
    ) -> Result<Option<AppendAck>, StreamError> {
        if let Some(e) = self.failed() {
            return Err(e);
        }
        let engine = &self.engine;
        let state = engine.state.lock().expect("wal lock");
        let owned = Self::writable(&state, stream_id)?;
        engine.classify_writer_batch(stream_id, owned, w)
    }

    /// The stream's local state, if it may take appends.
    fn writable(state: &WalState, stream_id: u64) -> Result<&Owned, StreamError> {
        let owned = state
            .streams
            .get(&stream_id)
            .filter(|o| !o.closing)
            .ok_or(StreamError::NotOpen { stream_id })?;
        if let Some(reason) = &owned.fenced {
            return Err(StreamError::Fenced {
                stream_id,
                reason: reason.clone(),
            });
        }
        Ok(owned)
    }

    /// Waits until every append accepted for `stream_id` so far has been answered, then
    /// closes the stream. Its committed data stays readable.
    pub async fn close(&self, stream_id: u64) -> Result<(), StreamError> {
        let epoch = self.start_closing(stream_id)?;
        self.drain(stream_id).await;
        let node = self.engine.sink.node();
        self.let_go(
            stream_id,
            Command::CloseStream(CloseStream {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                stream_id,
                stream_epoch: epoch,
            }),
        )
        .await
    }

    /// Proposes the close or delete of a stream this node stops writing, and forgets its
    /// local state whatever the answer.
    async fn let_go(&self, stream_id: u64, command: Command) -> Result<(), StreamError> {
        let proposed = self.engine.sink.propose(command).await?;
        self.engine
            .state
            .lock()
            .expect("wal lock")
            .streams
            .remove(&stream_id);
        proposed
            .result
            .map(|_| ())
            .map_err(|r| StreamError::from_rejection(stream_id, &r))
    }

    /// Refuses new appends to the stream from now on; returns its epoch.
    fn start_closing(&self, stream_id: u64) -> Result<u64, StreamError> {
        let mut state = self.engine.state.lock().expect("wal lock");
        let owned = state
            .streams
            .get_mut(&stream_id)
            .ok_or(StreamError::NotOpen { stream_id })?;
        owned.closing = true;
        Ok(owned.epoch)
    }

    async fn drain(&self, stream_id: u64) {
        loop {
            let notified = self.engine.drained.notified();
            if self.failed().is_some() {
                return;
            }
            {
                let state = self.engine.state.lock().expect("wal lock");
                if state
                    .streams
                    .get(&stream_id)
                    .is_none_or(|o| o.unanswered == 0)
                {
                    return;
                }
            }
            self.engine.flush_kick.notify_one();
            notified.await;
        }
    }

    /// Moves the stream's start forward (retention). The floors its table sets are enforced
    /// by the metadata log.
    pub async fn trim(&self, stream_id: u64, new_start: u64) -> Result<StreamInfo, StreamError> {
        let epoch = {
            let state = self.engine.state.lock().expect("wal lock");
            state
                .streams
                .get(&stream_id)
                .map(|o| o.epoch)
                .ok_or(StreamError::NotOpen { stream_id })?
        };
        let node = self.engine.sink.node();
        let proposed = self
            .engine
            .sink
            .propose(Command::TrimStream(TrimStream {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                stream_id,
                stream_epoch: epoch,
                new_start_offset: new_start,
            }))
            .await?;
        match proposed.result {
            Ok(outcome) => match outcome.into_reply() {
                Reply::Stream(p) => {
                    self.engine.log_cache.trim(stream_id, p.start_offset);
                    Ok(StreamInfo {
                        stream_id,
                        epoch,
                        start_offset: p.start_offset,
                        end_offset: p.end_offset,
                    })
                }
                other => Err(StreamError::Failed(format!("unexpected reply {other:?}"))),
            },
            Err(r) => Err(StreamError::from_rejection(stream_id, &r)),
        }
    }

    /// Deletes a stream of no table (after closing it here, if open).
    pub async fn delete(&self, stream_id: u64) -> Result<(), StreamError> {
        let open = self.start_closing(stream_id).ok();
        if open.is_some() {
            self.drain(stream_id).await;
        }
        let epoch = open.unwrap_or_else(|| {
            self.engine
                .sink
                .view()
                .state
                .streams
                .get(&stream_id)
                .map_or(0, |s| s.epoch)
        });
        let node = self.engine.sink.node();
        let deleted = self
            .let_go(
                stream_id,
                Command::DeleteStream(DeleteStream {
                    node_id: node.node_id,
                    node_epoch: node.node_epoch,
                    stream_id,
                    stream_epoch: epoch,
                }),
            )
            .await;
        self.engine.log_cache.trim(stream_id, u64::MAX);
        deleted
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

impl Engine {
    /// Checks an idempotent writer's batch before it is buffered. `Ok(Some)` answers a retry of
    /// a committed batch with its original offsets.
    /// A retry of a batch the metadata already holds: its original offsets.
    fn committed_duplicate(&self, stream_id: u64, w: WriterBatchId) -> Option<AppendAck> {
        let view = self.sink.view();
        let record = view.state.writers.get(&(stream_id, w.writer_id))?;
        if record.writer_epoch != w.writer_epoch {
            return None;
        }
        record
            .batches
            .iter()
            .find(|b| b.first_sequence == w.first_sequence && b.last_sequence == w.last_sequence)
            .map(|b| AppendAck {
                base_offset: b.base_offset,
                end_offset: b.end_offset,
                duplicate: true,
            })
    }

    /// Checks an idempotent writer's batch before it is buffered. `Ok(Some)` answers a retry of
    /// a committed batch with its original offsets.
    fn check_writer(
        &self,
        stream_id: u64,
        owned: &mut Owned,
        w: WriterBatchId,
    ) -> Result<Option<AppendAck>, StreamError> {
        if let Some(ack) = self.classify_writer_batch(stream_id, owned, w)? {
            return Ok(Some(ack));
        }
        owned.writers.insert(
            w.writer_id,
            WriterTail {
                epoch: w.writer_epoch,
                last_sequence: w.last_sequence,
            },
        );
        Ok(None)
    }

    /// [`Engine::check_writer`] without taking the batch.
    fn classify_writer_batch(
        &self,
        stream_id: u64,
        owned: &Owned,
        w: WriterBatchId,
    ) -> Result<Option<AppendAck>, StreamError> {
        if w.first_sequence > w.last_sequence {
            return Err(StreamError::Invalid(format!(
                "writer {}: first sequence {} after last {}",
                w.writer_id, w.first_sequence, w.last_sequence
            )));
        }
        if let Some(ack) = self.committed_duplicate(stream_id, w) {
            return Ok(Some(ack));
        }
        let view = self.sink.view();
        let committed = view
            .state
            .writers
            .get(&(stream_id, w.writer_id))
            .and_then(|r| {
                r.batches.last().map(|b| WriterTail {
                    epoch: r.writer_epoch,
                    last_sequence: b.last_sequence,
                })
            });
        let tail = owned.writers.get(&w.writer_id).copied().or(committed);
        // As in Kafka: a writer new to the stream, or at a new epoch, starts at sequence 0.
        let starts_anew = tail.is_none_or(|t| w.writer_epoch > t.epoch);
        if starts_anew && w.first_sequence != 0 {
            return Err(StreamError::OutOfOrderSequence {
                writer_id: w.writer_id,
                expected: 0,
                got: w.first_sequence,
            });
        }
        if let Some(tail) = tail {
            if w.writer_epoch < tail.epoch {
                return Err(StreamError::WriterFenced {
                    writer_id: w.writer_id,
                    epoch: w.writer_epoch,
                    current: tail.epoch,
                });
            }
            if w.writer_epoch == tail.epoch
                && Some(w.first_sequence) != tail.last_sequence.checked_add(1)
            {
                // Accepted here but not yet committed: the retry must wait for the answer.
                // Older than the last committed batches kept: out of order for good.
                let committed_last = committed
                    .filter(|c| c.epoch == w.writer_epoch)
                    .map(|c| c.last_sequence);
                if w.last_sequence <= tail.last_sequence
                    && committed_last.is_none_or(|c| w.last_sequence > c)
                {
                    return Err(StreamError::SequenceInFlight {
                        writer_id: w.writer_id,
                        first: w.first_sequence,
                        last: w.last_sequence,
                    });
                }
                return Err(StreamError::OutOfOrderSequence {
                    writer_id: w.writer_id,
                    expected: tail.last_sequence.saturating_add(1),
                    got: w.first_sequence,
                });
            }
        }
        Ok(None)
    }

    /// Stops the engine: every buffered append fails with `error`; so will every flush that
    /// reaches the committer.
    fn fail(&self, error: &StreamError) {
        {
            let mut failed = self.failed.lock().expect("failed lock");
            if failed.is_some() {
                return;
            }
            if *error != StreamError::Shutdown {
                tracing::error!(%error, "stream engine failed");
            }
            *failed = Some(error.clone());
        }
        let pending = {
            let mut state = self.state.lock().expect("wal lock");
            state.pending_bytes = 0;
            state.first_pending = None;
            let pending = std::mem::take(&mut state.pending);
            for (stream_id, batches) in &pending {
                if let Some(o) = state.streams.get_mut(stream_id) {
                    o.unanswered = o.unanswered.saturating_sub(batches.len() as u64);
                }
            }
            pending
        };
        for p in pending.into_values().flatten() {
            let _ = p.ack.send(Err(error.clone()));
        }
        self.drained.notify_waiters();
    }

    /// `n` appends of `stream_id` accepted under `epoch` got their answer.
    fn answered(&self, stream_id: u64, epoch: u64, n: u64) {
        let mut state = self.state.lock().expect("wal lock");
        if let Some(o) = state.streams.get_mut(&stream_id)
            && o.epoch == epoch
        {
            o.unanswered = o.unanswered.saturating_sub(n);
        }
        drop(state);
        self.drained.notify_waiters();
    }

    /// Marks a stream fenced and fails its buffered appends.
    /// The stream, as opened at `epoch`, can take no more appends (fenced or gone): its
    /// buffered appends fail. A newer opening of it is left alone.
    fn fence(&self, stream_id: u64, epoch: u64, error: &StreamError) {
        let pending = {
            let mut state = self.state.lock().expect("wal lock");
            let current = state.streams.get(&stream_id).map(|o| o.epoch);
            if current != Some(epoch) {
                return;
            }
            let pending = state.pending.remove(&stream_id).unwrap_or_default();
            let freed: usize = pending.iter().map(|p| p.batch.payload.len().max(1)).sum();
            state.pending_bytes -= freed;
            if let Some(o) = state.streams.get_mut(&stream_id) {
                o.fenced = Some(error.to_string());
            }
            pending
        };
        let n = pending.len() as u64;
        for p in pending {
            let _ = p.ack.send(Err(error.clone()));
        }
        self.answered(stream_id, epoch, n);
    }

    async fn run_flusher(self: Arc<Self>, uploaded: mpsc::UnboundedSender<Uploaded>) {
        let mut shutdown = self.shutdown.subscribe();
        loop {
            // Wait for something to flush, then for the size threshold or the delay.
            let first = loop {
                if let Some(t) = self.state.lock().expect("wal lock").first_pending {
                    break t;
                }
                tokio::select! {
                    _ = self.new_data.notified() => {}
                    _ = shutdown.changed() => return,
                }
            };
            tokio::select! {
                _ = self.flush_kick.notified() => {}
                _ = tokio::time::sleep_until(first + self.config.flush_delay) => {}
                _ = shutdown.changed() => return,
            }
            let inflight = tokio::select! {
                p = Arc::clone(&self.inflight).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = shutdown.changed() => return,
            };
            let Some(flush) = self.take_flush(inflight) else {
                continue;
            };
            add(&self.stats.flushes, 1);
            let engine = Arc::clone(&self);
            let uploaded = uploaded.clone();
            tokio::spawn(async move {
                let _ = uploaded.send(engine.upload(flush).await);
            });
        }
    }

    fn take_flush(&self, inflight: OwnedSemaphorePermit) -> Option<Flush> {
        let (seq, pending) = {
            let mut state = self.state.lock().expect("wal lock");
            if state.pending.is_empty() {
                state.first_pending = None;
                return None;
            }
            let pending = std::mem::take(&mut state.pending);
            state.pending_bytes = 0;
            state.first_pending = None;
            let seq = state.next_seq;
            state.next_seq += 1;
            (seq, pending)
        };
        let mut builder = ObjectBuilder::new(self.config.block_bytes);
        let mut streams = BTreeMap::new();
        let mut broken = None;
        for (stream_id, batches) in pending {
            // Reopening fails what was buffered before, so one stream's batches share an epoch.
            let epoch = batches.first().map_or(0, |p| p.epoch);
            for p in &batches {
                if let Err(e) = builder.push(stream_id, &p.batch) {
                    broken.get_or_insert(StreamError::Failed(format!(
                        "stream {stream_id}: offsets out of order in the buffer: {e}"
                    )));
                }
            }
            streams.insert(stream_id, (epoch, batches));
        }
        let (bytes, _) = builder.finish();
        let flush = Flush {
            seq,
            streams,
            bytes,
            _inflight: inflight,
        };
        if let Some(e) = broken {
            // Cannot happen; if it does, nothing this engine holds can be trusted.
            self.fail(&e);
            self.answer_flush(flush, &e);
            return None;
        }
        Some(flush)
    }

    /// A prepared object id that stays valid for a while yet.
    pub(crate) async fn object_id(&self) -> Result<u64, StreamError> {
        let mut ids = self.ids.lock().await;
        let ttl_ms = u64::try_from(self.config.prepare_ttl.as_millis()).unwrap_or(u64::MAX);
        let margin = ttl_ms / 4;
        loop {
            let now = self.config.clock.now_ms();
            // An id too close to its expiry is let lapse unused.
            while let Some((id, expires)) = ids.pop_front() {
                if expires > now + margin {
                    return Ok(id);
                }
            }
            let node = self.sink.node();
            let count = self.config.prepare_batch.max(1);
            let expires = now.saturating_add(ttl_ms);
            let proposed = self
                .sink
                .propose(Command::PrepareObject(PrepareObject {
                    node_id: node.node_id,
                    node_epoch: node.node_epoch,
                    count,
                    expires_at_ms: expires,
                }))
                .await?;
            match proposed.result {
                Ok(outcome) => match outcome.into_reply() {
                    Reply::Range(r) => ids.extend((r.start..r.end).map(|id| (id, expires))),
                    other => {
                        return Err(StreamError::Failed(format!("unexpected reply {other:?}")));
                    }
                },
                Err(r) => return Err(StreamError::Failed(format!("PrepareObject refused: {r}"))),
            }
        }
    }

    /// Writes a new object: takes a prepared id and PUTs `bytes` at its path (see
    /// [`Engine::put`]). Returns the id, for the commit that makes the object live.
    pub(crate) async fn put_new_object(&self, bytes: &Bytes) -> Result<u64, StreamError> {
        let object_id = self.object_id().await?;
        self.put(&object_path(&self.config.object_prefix, object_id), bytes)
            .await?;
        Ok(object_id)
    }

    /// PUTs `bytes` at `path`, retrying the same bytes until it succeeds (hedging a slow PUT
    /// when configured). Gives up only when the engine stops.
    pub(crate) async fn put(&self, path: &Path, bytes: &Bytes) -> Result<(), StreamError> {
        let mut backoff = Duration::from_millis(10);
        loop {
            if let Some(e) = self.failed.lock().expect("failed lock").clone() {
                return Err(e);
            }
            add(&self.stats.puts, 1);
            let attempt = self.store.put(path, PutPayload::from_bytes(bytes.clone()));
            let result = match self.config.hedge_after {
                None => attempt.await,
                Some(after) => {
                    tokio::pin!(attempt);
                    tokio::select! {
                        r = &mut attempt => r,
                        _ = tokio::time::sleep(after) => {
                            add(&self.stats.hedged_puts, 1);
                            let hedge = self.store.put(path, PutPayload::from_bytes(bytes.clone()));
                            tokio::select! {
                                r = &mut attempt => r,
                                r = hedge => r,
                            }
                        }
                    }
                }
            };
            match result {
                Ok(_) => return Ok(()),
                // Retrying cannot fix credentials or permissions.
                Err(
                    e @ (object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. }),
                ) => return Err(StreamError::Storage(e.to_string())),
                Err(e) => {
                    add(&self.stats.put_retries, 1);
                    tracing::warn!(%path, error = %e, "PUT failed; retrying with the same bytes");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
            }
        }
    }

    async fn upload(self: Arc<Self>, flush: Flush) -> Uploaded {
        let started = Instant::now();
        let object_id = self.put_new_object(&flush.bytes).await;
        let m = crate::metrics::metrics();
        m.upload
            .record(crate::metrics::seconds(started.elapsed()), &[]);
        m.flush_bytes.record(flush.bytes.len() as u64, &[]);
        Uploaded { flush, object_id }
    }

    /// Fails every append of a flush.
    fn answer_flush(&self, flush: Flush, error: &StreamError) {
        for (stream_id, (epoch, batches)) in flush.streams {
            let n = batches.len() as u64;
            for p in batches {
                let _ = p.ack.send(Err(error.clone()));
            }
            self.answered(stream_id, epoch, n);
        }
    }

    async fn run_committer(self: Arc<Self>, mut uploaded: mpsc::UnboundedReceiver<Uploaded>) {
        let mut next = 0u64;
        let mut waiting: BTreeMap<u64, Uploaded> = BTreeMap::new();
        while let Some(u) = uploaded.recv().await {
            waiting.insert(u.flush.seq, u);
            while let Some(u) = waiting.remove(&next) {
                next += 1;
                match u.object_id {
                    Ok(object_id) => self.commit(u.flush, object_id).await,
                    Err(e) => {
                        self.fail(&e);
                        self.answer_flush(u.flush, &e);
                    }
                }
            }
        }
    }

    /// Commits one uploaded flush and answers its appends range by range.
    async fn commit(&self, flush: Flush, mut object_id: u64) {
        loop {
            if let Some(e) = self.failed.lock().expect("failed lock").clone() {
                return self.answer_flush(flush, &e);
            }
            let node = self.sink.node();
            let ranges: Vec<StreamRange> = flush
                .streams
                .iter()
                .map(|(stream_id, (epoch, batches))| StreamRange {
                    stream_id: *stream_id,
                    stream_epoch: *epoch,
                    start_offset: batches.first().map_or(0, |p| p.batch.base_offset),
                    end_offset: batches.last().map_or(0, |p| p.batch.end_offset()),
                    writers: batches
                        .iter()
                        .filter_map(|p| {
                            p.writer.map(|w| WriterRange {
                                writer_id: w.writer_id,
                                writer_epoch: w.writer_epoch,
                                first_sequence: w.first_sequence,
                                last_sequence: w.last_sequence,
                                base_offset: p.batch.base_offset,
                                end_offset: p.batch.end_offset(),
                            })
                        })
                        .collect(),
                })
                .collect();
            let command = Command::CommitStreamSetObject(CommitStreamSetObject {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                object_id,
                object_size: flush.bytes.len() as u64,
                ranges,
                compacted_object_ids: vec![],
            });
            let started = Instant::now();
            let proposed = self.sink.propose(command).await;
            crate::metrics::metrics()
                .commit
                .record(crate::metrics::seconds(started.elapsed()), &[]);
            let proposed = match proposed {
                Ok(p) => p,
                Err(e) => {
                    let e = StreamError::from(e);
                    self.fail(&e);
                    return self.answer_flush(flush, &e);
                }
            };
            match proposed.result {
                Ok(Outcome::Done(Reply::Commit(reply))) => {
                    add(&self.stats.commits, 1);
                    let results: HashMap<u64, Option<Rejection>> = reply
                        .ranges
                        .into_iter()
                        .map(|r| (r.stream_id, r.rejection))
                        .collect();
                    return self.answer_committed(flush, &results);
                }
                // The id lapsed before the commit (expired, or expired and already forgotten):
                // the same bytes under a new id. Its siblings were prepared together and have
                // lapsed too.
                Err(r) if matches!(r.kind(), RejectionKind::Expired | RejectionKind::NotFound) => {
                    add(&self.stats.reputs_after_expiry, 1);
                    self.ids.lock().await.clear();
                    let reput = async {
                        let id = self.object_id().await?;
                        self.put(&object_path(&self.config.object_prefix, id), &flush.bytes)
                            .await?;
                        Ok::<_, StreamError>(id)
                    };
                    match reput.await {
                        Ok(id) => object_id = id,
                        Err(e) => {
                            self.fail(&e);
                            return self.answer_flush(flush, &e);
                        }
                    }
                }
                other => {
                    let e = StreamError::Failed(format!(
                        "commit of object {object_id} answered {other:?}"
                    ));
                    self.fail(&e);
                    return self.answer_flush(flush, &e);
                }
            }
        }
    }

    fn answer_committed(&self, flush: Flush, results: &HashMap<u64, Option<Rejection>>) {
        for (stream_id, (epoch, batches)) in flush.streams {
            let n = batches.len() as u64;
            match results.get(&stream_id) {
                Some(None) => {
                    for p in batches {
                        let ack = AppendAck {
                            base_offset: p.batch.base_offset,
                            end_offset: p.batch.end_offset(),
                            duplicate: false,
                        };
                        self.log_cache.insert(stream_id, p.batch);
                        let _ = p.ack.send(Ok(ack));
                    }
                }
                // Fenced, or deleted meanwhile: that stream is done here; the others go on.
                Some(Some(rejection))
                    if rejection.kind().is_fenced()
                        || rejection.kind() == RejectionKind::NotFound =>
                {
                    add(&self.stats.fenced_ranges, 1);
                    let e = StreamError::from_rejection(stream_id, rejection);
                    let e = match e {
                        StreamError::Failed(_) => StreamError::Fenced {
                            stream_id,
                            reason: rejection.message.clone(),
                        },
                        other => other,
                    };
                    self.fence(stream_id, epoch, &e);
                    for p in batches {
                        let _ = p.ack.send(Err(e.clone()));
                    }
                }
                Some(Some(rejection)) => {
                    // A gap or a stale sequence in ranges this node assigned itself: its view
                    // of the stream is wrong, so nothing it holds can be trusted.
                    let e = StreamError::Failed(format!(
                        "stream {stream_id}: range refused: {rejection}"
                    ));
                    self.fail(&e);
                    for p in batches {
                        let _ = p.ack.send(Err(e.clone()));
                    }
                }
                None => {
                    let e = StreamError::Failed(format!("stream {stream_id}: no range result"));
                    self.fail(&e);
                    for p in batches {
                        let _ = p.ack.send(Err(e.clone()));
                    }
                }
            }
            self.answered(stream_id, epoch, n);
        }
    }
}
