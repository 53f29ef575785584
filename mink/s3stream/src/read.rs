//! The read path: the log cache, then object indexes and blocks (cached), then ranged GETs.
//! Reads never go above a stream's committed end in this node's metadata view.
//!
//! Blocks missing from the cache are read with as few GETs as possible: adjacent blocks of one
//! object (a stream's run in a compacted object) in one ranged GET of up to
//! [`COALESCE_BYTES`], several GETs at once, and a block some read is already loading is
//! awaited, never read twice; an object's index too. A stream read sequentially from object
//! storage (a consumer catching up) is read ahead: each such fetch starts loading the next
//! `EngineConfig::read_ahead_bytes` of the stream into the block cache, so the next fetch finds
//! its blocks there or on their way. A GET also takes along the adjacent blocks that readers
//! (its own included) will ask for within their reach, so readers of many streams at once
//! share the GETs of the objects their streams are slices of. A reader that reads on and enters
//! a small object at its start reads it whole, index and blocks in one GET, when the object is
//! its stream's alone or readers reading on are about to read at least half of its streams,
//! while half the block cache has room for it beside the blocks readers were given and have
//! not read (waiting a little for readers to read theirs). A fetch reads the indexes of only
//! as many objects as it is likely to need.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt as _, StreamExt as _, TryStreamExt as _};
use object_store::ObjectStoreExt as _;

use crate::engine::{
    Engine, S3Stream, StreamError, StreamInfo, object_path, read_permit, read_range,
};
use crate::format::{
    BlockIndex, FOOTER_LEN, RecordBatch, decode_verified_block, parse_footer, parse_index,
    verify_block,
};

/// How much of an object's tail a first read fetches, hoping to get the index with the footer.
const TAIL_READ: u64 = 64 << 10;
/// GETs one fetch has in flight at once.
const FETCH_CONCURRENCY: usize = 16;
/// How many of its next objects a reader counts as about to be read ([`S3Stream::read_whole`]).
const RANGES_AHEAD: usize = 32;
/// A lone reader's missing blocks go in up to this many GETs at once (fewer with more readers).
const READ_SPLIT: u64 = 4;
/// Adjacent blocks of an object are read in one ranged GET of at most this many bytes, and
/// objects up to this size may be read whole (see `docs/s3stream.md`, Reads).
pub const COALESCE_BYTES: u64 = 16 << 20;

/// A ranged GET of adjacent blocks of one object, shared by every read that needs them: each
/// block, or why it is corrupt (which fails only the reads that need that block).
pub(crate) type Load = Shared<BoxFuture<'static, LoadResult>>;

/// What a [`Load`] gives: the run's blocks, each checked, or why the GET failed.
pub(crate) type LoadResult = Result<Arc<Vec<Result<Bytes, StreamError>>>, StreamError>;

/// Blocks being loaded, by (object id, block position): the load and the block's place in it.
pub(crate) type Loads = HashMap<(u64, u64), (Load, usize)>;

/// Object indexes being read, by object id.
pub(crate) type IndexLoads =
    HashMap<u64, Shared<BoxFuture<'static, Result<Arc<Vec<BlockIndex>>, StreamError>>>>;

/// A stream's sequential reading: where its last fetch from object storage ended, and the
/// window of offsets its last read-ahead loaded (or is loading).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reader {
    next: u64,
    /// Offsets its last sequential fetch covered.
    stride: u64,
    /// Offsets its read-ahead window covers: the stride times the fetches a window holds.
    reach: u64,
    ahead_from: u64,
    ahead_to: u64,
    loading: bool,
    /// Its last fetch continued the one before: it reads on (its own GETs may read ahead).
    proven: bool,
    /// Its first fetch is at the stream's start: a consumer catching up from the earliest
    /// offset, which reads on too (its first GET may read ahead as well).
    from_start: bool,
    /// When it last read (the engine's clock).
    seen_ms: u64,
}

/// Streams whose sequential reads are remembered at most (past it, forgotten all at once).
const READERS: usize = 65_536;
/// A reader that has not read for this long is forgotten: it no longer takes a share of the
/// read-ahead budget ([`S3Stream::reach`]).
const READER_IDLE_MS: u64 = 30_000;
/// Idle readers are looked for at most this often.
const PRUNE_EVERY_MS: u64 = 1_000;

/// The streams read sequentially of late, by stream id.
#[derive(Debug, Default)]
pub(crate) struct Readers {
    by_stream: HashMap<u64, Reader>,
    pruned_ms: u64,
}

impl Readers {
    /// The reader of `stream_id`, reading at `now_ms` (new ones start blank), and how many
    /// streams have read within [`READER_IDLE_MS`] (give or take [`PRUNE_EVERY_MS`]).
    fn of(&mut self, stream_id: u64, now_ms: u64) -> (usize, &mut Reader) {
        let known = self.by_stream.contains_key(&stream_id);
        if now_ms >= self.pruned_ms.saturating_add(PRUNE_EVERY_MS)
            || (self.by_stream.len() >= READERS && !known)
        {
            // A reader whose read-ahead is loading stays: the load reports to it.
            self.by_stream
                .retain(|_, r| r.loading || r.seen_ms.saturating_add(READER_IDLE_MS) > now_ms);
            self.pruned_ms = now_ms;
            if self.by_stream.len() >= READERS && !known {
                self.by_stream.clear();
            }
        }
        let n = self.by_stream.len().max(1);
        let r = self.by_stream.entry(stream_id).or_default();
        r.seen_ms = now_ms;
        (n, r)
    }

    /// Streams read of late (give or take the idle ones not yet pruned).
    fn len(&self) -> usize {
        self.by_stream.len()
    }

    fn get(&self, stream_id: u64) -> Option<&Reader> {
        self.by_stream.get(&stream_id)
    }

    fn get_mut(&mut self, stream_id: u64) -> Option<&mut Reader> {
        self.by_stream.get_mut(&stream_id)
    }
}

/// A read-ahead window is this many of its reader's fetches (at most `read_ahead_bytes`).
const READ_AHEAD_FETCHES: u64 = 4;
/// Fetches count as at least this many bytes when sizing a window.
const MIN_FETCH_BYTES: u64 = 256 << 10;

/// Adjacent blocks of one object to read in one GET, each with the slot of the read that asked
/// for it (none: widened in for another stream's reader).
type Run = Vec<(BlockIndex, Take)>;

/// Why a block is in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Take {
    /// The `i`-th block the read asked for.
    Asked(usize),
    /// Another stream's reader will ask for it soon.
    Widened,
    /// Cached or being loaded already: read along only to reach wanted blocks beyond it in
    /// the same GET (a few bytes again instead of a GET of their own).
    Passing,
}

/// A block a fetch needs: at hand, or the `k`-th block of the `i`-th load it awaits.
enum Slot {
    Ready(Bytes),
    Loading(usize, usize),
}

// By value, to fit `map_err`.
#[allow(clippy::needless_pass_by_value)]
fn storage(e: object_store::Error) -> StreamError {
    StreamError::Storage(e.to_string())
}

impl S3Stream {
    /// The stream's readable range in this node's view.
    pub fn info(&self, stream_id: u64) -> Result<StreamInfo, StreamError> {
        let view = self.engine.sink.view();
        let s = view
            .state
            .streams
            .get(&stream_id)
            .ok_or(StreamError::NotFound { stream_id })?;
        Ok(StreamInfo {
            stream_id,
            epoch: s.epoch,
            start_offset: s.start_offset,
            end_offset: s.end_offset,
        })
    }

    /// Reads batches from the one containing `offset`, in order, until `max_bytes` are
    /// gathered (at least one batch when there is one) or the committed end is reached.
    /// Reading at the committed end returns nothing; below the start is out of range.
    pub async fn fetch(
        &self,
        stream_id: u64,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<RecordBatch>, StreamError> {
        // A compaction may delete an object between reading the view and the GET: one retry
        // on a fresh view finds the data where it moved.
        match self.fetch_once(stream_id, offset, max_bytes).await {
            Err(StreamError::Storage(_)) => self.fetch_once(stream_id, offset, max_bytes).await,
            other => other,
        }
    }

    async fn fetch_once(
        &self,
        stream_id: u64,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<RecordBatch>, StreamError> {
        let engine = &self.engine;
        let view = engine.sink.view();
        let stream = view
            .state
            .streams
            .get(&stream_id)
            .ok_or(StreamError::NotFound { stream_id })?;
        let (start, end) = (stream.start_offset, stream.end_offset);
        if offset < start || offset > end {
            return Err(StreamError::OutOfRange {
                stream_id,
                offset,
                start,
                end,
            });
        }
        if offset == end {
            return Ok(Vec::new());
        }
        if let Some(batches) = engine.log_cache.read(stream_id, offset, end, max_bytes)
            && !batches.is_empty()
        {
            return Ok(batches);
        }
        self.note_start(stream_id, start, offset);
        // Plan the blocks this read needs (about `max_bytes` of them), load the missing ones,
        // then decode them in order.
        let plan = self
            .plan_blocks(&view.state, stream_id, offset, end, max_bytes as u64, false)
            .await?;
        let wanted: Vec<(u64, BlockIndex)> = plan.iter().map(|&(o, e, _)| (o, e)).collect();
        if let Some(&(_, last, limit)) = plan.last() {
            let planned = plan.iter().map(|(_, e, _)| u64::from(e.size)).sum();
            self.note_reader(
                stream_id,
                start,
                offset,
                last.end_offset.min(limit),
                planned,
            );
        }
        let blocks = self.load_blocks(&wanted).await?;
        let mut out = Vec::new();
        let mut next = offset;
        let mut bytes = 0usize;
        'blocks: for ((object_id, entry, limit), block) in plan.iter().zip(blocks) {
            let batches = decode_verified_block(&block, entry)
                .map_err(|e| StreamError::Storage(format!("object {object_id} is corrupt: {e}")))?;
            for b in batches {
                if b.end_offset() <= next {
                    continue;
                }
                if b.base_offset >= *limit {
                    break;
                }
                if b.base_offset > next {
                    // The metadata says these offsets are here; the object disagrees.
                    return Err(StreamError::Storage(format!(
                        "object {object_id} lacks offsets {next}..{} of stream {stream_id}",
                        b.base_offset
                    )));
                }
                next = b.end_offset();
                bytes += b.payload.len();
                out.push(b);
                if bytes >= max_bytes {
                    break 'blocks;
                }
            }
        }
        self.read_ahead(stream_id, end, offset, next, bytes as u64);
        Ok(out)
    }

    /// The blocks holding `stream_id` from `offset` (below `end`), about `max_bytes` of them:
    /// (object id, block, the offset the object's range of the stream ends at). For a
    /// read-ahead (`ahead`), the index GETs count as its own.
    async fn plan_blocks(
        &self,
        state: &mink_metadata::State,
        stream_id: u64,
        offset: u64,
        end: u64,
        max_bytes: u64,
        ahead: bool,
    ) -> Result<Vec<(u64, BlockIndex, u64)>, StreamError> {
        let mut plan = Vec::new();
        let mut planned = 0u64;
        let mut cursor = offset;
        let ranges: Vec<_> = state
            .stream_ranges(stream_id, offset, end)
            .cloned()
            .collect();
        // A reader that reads on (from the stream's start, or continuing its last fetch; or a
        // read-ahead) entering a small stream object at its start reads it whole: its index
        // and all its blocks in one GET.
        let at_start = state
            .streams
            .get(&stream_id)
            .is_some_and(|s| s.start_offset == offset);
        let reads_on = at_start
            || self
                .engine
                .readers
                .lock()
                .expect("readers lock")
                .get(stream_id)
                .is_some_and(|r| r.proven || r.loading || (r.next == offset && offset > 0));
        let mut rest = &ranges[..];
        while !rest.is_empty() {
            // The indexes of the next few objects, fetched together: as many as the read is
            // likely to need, taking the stream's share of an object as an even one of its
            // size. Reading further ahead would make a reader's first blocks wait for indexes
            // it does not need yet (and an object read whole brings its blocks as well).
            let next = &rest[..rest.len().min(FETCH_CONCURRENCY)];
            let need = max_bytes.saturating_sub(planned);
            let mut held = 0u64;
            let mut n = next.len();
            for (i, range) in next.iter().enumerate() {
                if i > 0 && held >= need {
                    n = i;
                    break;
                }
                held += state
                    .objects
                    .get(&range.object_id)
                    .map_or(0, |o| o.size / o.live_ranges.max(1));
            }
            let (group, after) = rest.split_at(n);
            rest = after;
            let whole = if reads_on {
                self.read_whole(state, stream_id, offset, group)
            } else {
                Vec::new()
            };
            let indexes = self.indexes_of(state, group, &whole, ahead).await?;
            for (range, index) in group.iter().zip(indexes) {
                let limit = range.end_offset.min(end);
                let wanted: Vec<BlockIndex> = index
                    .iter()
                    .filter(|e| {
                        e.stream_id == stream_id && e.end_offset > cursor && e.start_offset < limit
                    })
                    .copied()
                    .collect();
                for entry in wanted {
                    plan.push((range.object_id, entry, limit));
                    planned += u64::from(entry.size);
                    cursor = entry.end_offset.min(limit);
                    if planned >= max_bytes {
                        return Ok(plan);
                    }
                }
            }
        }
        Ok(plan)
    }

    /// Which of `ranges` (of `stream_id`, read on from `offset`) to read whole: objects of at
    /// most [`COALESCE_BYTES`] the reader enters at their start, when they hold only its stream
    /// (a stream object), or when readers reading on are about to read at least half of the
    /// streams they hold (a stream-set object many catch-up readers meet together). One GET
    /// then brings the index and the blocks, where an index GET and runs of ranged GETs would.
    fn read_whole(
        &self,
        state: &mink_metadata::State,
        stream_id: u64,
        offset: u64,
        ranges: &[mink_metadata::RangeRecord],
    ) -> Vec<bool> {
        // The objects that may be read whole: small ones entered at their start.
        let candidates: Vec<Option<&mink_metadata::ObjectRecord>> = ranges
            .iter()
            .map(|r| {
                state
                    .objects
                    .get(&r.object_id)
                    .filter(|o| r.start_offset >= offset && o.size <= COALESCE_BYTES)
            })
            .collect();
        // Per stream-set candidate, the other readers it still needs to be read whole.
        let mut wanting: HashMap<u64, u64> = candidates
            .iter()
            .flatten()
            .filter_map(|o| Some((o.object_id, readers_for_whole(o)?.saturating_sub(1))))
            .filter(|(_, n)| *n > 0)
            .collect();
        count_readers(&self.engine, state, Some(stream_id), &mut wanting);
        candidates
            .iter()
            .map(|o| o.is_some_and(|o| !wanting.contains_key(&o.object_id)))
            .collect()
    }

    /// After a fetch of `[offset, next)` (`bytes` of batches) of the stream that ends at `end`:
    /// when it continued the stream's previous one (a sequential reader) and has reached the
    /// window the last read-ahead loaded (or there is none),
    /// starts loading the next window of the stream into the block cache: the reader consumes
    /// one window while the next one loads. A window is [`READ_AHEAD_FETCHES`] of the reader's
    /// fetches, at most `read_ahead_bytes`: a reader of small fetches (a Kafka consumer's
    /// megabyte per partition) reads ahead less, so that many of them fit the budget.
    /// Read-aheads in flight stay under a quarter of the block cache.
    fn read_ahead(&self, stream_id: u64, end: u64, offset: u64, next: u64, bytes: u64) {
        let engine = &self.engine;
        let (from, window) = {
            let now_ms = engine.config.clock.now_ms();
            let mut readers = engine.readers.lock().expect("readers lock");
            let (n, r) = readers.of(stream_id, now_ms);
            let window = self.window(bytes, n);
            let sequential =
                (r.next == offset && offset > 0) || (r.ahead_from <= offset && offset < r.ahead_to);
            r.next = next;
            r.proven = sequential;
            r.from_start = false;
            if sequential {
                r.stride = next - offset;
                r.reach = self.reach(r.stride, bytes, n);
            }
            if !sequential {
                // A new reader (or another one) of the stream: an earlier window is not its.
                if !r.loading {
                    (r.ahead_from, r.ahead_to) = (0, 0);
                }
                return;
            }
            if r.loading || window == 0 || next >= end || next < r.ahead_from {
                return;
            }
            let budget = engine.config.block_cache_bytes as u64 / 4;
            if engine.read_ahead_inflight.load(Ordering::Relaxed) + window > budget {
                return;
            }
            engine
                .read_ahead_inflight
                .fetch_add(window, Ordering::Relaxed);
            let from = r.ahead_to.max(next);
            r.ahead_from = from;
            r.loading = true;
            (from, window)
        };
        let this = self.clone();
        tokio::spawn(async move {
            let view = this.engine.sink.view();
            let result = async {
                let plan = this
                    .plan_blocks(&view.state, stream_id, from, end, window, true)
                    .await?;
                let reached = plan
                    .last()
                    .map_or(from, |(_, e, limit)| e.end_offset.min(*limit));
                let wanted: Vec<(u64, BlockIndex)> = plan.iter().map(|&(o, e, _)| (o, e)).collect();
                let blocks = this.load_blocks_for(&wanted, true).await?;
                let stats = &this.engine.stats;
                stats
                    .read_ahead_blocks
                    .fetch_add(blocks.len() as u64, Ordering::Relaxed);
                stats.read_ahead_bytes.fetch_add(
                    blocks.iter().map(|b| b.len() as u64).sum(),
                    Ordering::Relaxed,
                );
                Ok::<_, StreamError>(reached)
            }
            .await;
            let mut readers = this.engine.readers.lock().expect("readers lock");
            if let Some(r) = readers.get_mut(stream_id) {
                r.loading = false;
                // On an error the reader's own fetch reads the blocks (and reports it).
                if r.ahead_from == from {
                    r.ahead_to = result.unwrap_or(from);
                }
            }
            drop(readers);
            this.engine
                .read_ahead_inflight
                .fetch_sub(window, Ordering::Relaxed);
            this.engine.read_ahead_ended.notify_waiters();
        });
    }

    /// How far ahead of a reader whose fetches of `stride` offsets take `bytes` other
    /// streams' GETs take its blocks along ([`S3Stream::widen`]), among `readers` sequential
    /// readers: `read_ahead_bytes` of its offsets, but no more than its share of the block
    /// cache, so that blocks taken early are still cached when their reader gets there; two
    /// fetches at least (and without read-ahead). A share of the whole cache, not of the
    /// read-ahead budget: 16 Kafka consumers' partitions on moto made 560 GETs for what took
    /// 750–940 with a quarter, and consumed 143–151 MB/s instead of 85–108.
    /// Wider than its own window: readers of a stream-set object's streams drift apart, and a
    /// GET that takes a block a little early saves a GET of that block alone.
    fn reach(&self, stride: u64, bytes: u64, readers: usize) -> u64 {
        let config = &self.engine.config;
        let share = (config.block_cache_bytes / readers.max(1)) as u64;
        let horizon = (config.read_ahead_bytes as u64).min(share);
        stride.saturating_mul(horizon.div_ceil(bytes.max(1)).max(2))
    }

    /// The read-ahead window of a reader whose fetches take `bytes`, among `readers`
    /// sequential readers: no more than half its share of the block cache, as its reach
    /// ([`S3Stream::reach`]). Readers catching up together on stream-set objects then stay
    /// within each other's reach, so that they meet each object together and read it whole
    /// ([`S3Stream::read_whole`]), where a leader reading far ahead would read it alone, by its
    /// index and ranges (100 readers of 100 streams on moto: 55 of 82 objects read whole).
    fn window(&self, bytes: u64, readers: usize) -> u64 {
        let config = &self.engine.config;
        let share = (config.block_cache_bytes / (2 * readers.max(1))) as u64;
        (config.read_ahead_bytes as u64)
            .min(READ_AHEAD_FETCHES * bytes.max(MIN_FETCH_BYTES))
            .min(share.max(bytes))
    }

    /// Before a fetch of `[offset, to)` (`bytes` of blocks) loads its blocks: a reader starting
    /// at the stream's start (or continuing) is known as one from now on, not only once its
    /// fetch is done, so that the GETs of readers of other streams starting together take its
    /// blocks along ([`S3Stream::widen`]).
    fn note_reader(&self, stream_id: u64, start: u64, offset: u64, to: u64, bytes: u64) {
        let now_ms = self.engine.config.clock.now_ms();
        let mut readers = self.engine.readers.lock().expect("readers lock");
        let (n, r) = readers.of(stream_id, now_ms);
        if r.stride == 0 && (offset == start || (r.next == offset && offset > 0)) && to > offset {
            r.next = offset;
            r.stride = to - offset;
            r.reach = self.reach(r.stride, bytes, n);
        }
    }

    /// Before a fetch plans its blocks: a reader starting at the stream's start (or continuing)
    /// is known as one at once, its reach unbounded until its plan is known, so that readers of
    /// many streams starting together share their first GETs too ([`S3Stream::widen`]).
    fn note_start(&self, stream_id: u64, start: u64, offset: u64) {
        let now_ms = self.engine.config.clock.now_ms();
        let mut readers = self.engine.readers.lock().expect("readers lock");
        let (_, r) = readers.of(stream_id, now_ms);
        if r.stride == 0 && (offset == start || (r.next == offset && offset > 0)) {
            r.next = offset;
            r.reach = u64::MAX;
            r.from_start = offset == start;
        }
    }

    /// Waits until no read-ahead is loading: for measuring what readers fetch themselves.
    pub async fn read_aheads_settled(&self) {
        let engine = &self.engine;
        loop {
            let ended = engine.read_ahead_ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            if engine.read_ahead_inflight.load(Ordering::Relaxed) == 0 {
                return;
            }
            ended.await;
        }
    }

    /// The first committed batch at or after offset `from` whose time is at or after
    /// `timestamp_ms` (Kafka's "offset for time"), or `None` when no batch is that late. Batch times need not ascend: this is the
    /// first batch in offset order that qualifies. Only the object indexes (cached, fetched by
    /// every read) and the one block that holds the answer are read: a block whose latest time
    /// is earlier is skipped whole. Batches of unknown time (format version 1) never qualify.
    pub async fn offset_for_time(
        &self,
        stream_id: u64,
        from: u64,
        timestamp_ms: i64,
    ) -> Result<Option<RecordBatch>, StreamError> {
        match self
            .offset_for_time_once(stream_id, from, timestamp_ms)
            .await
        {
            Err(StreamError::Storage(_)) => {
                self.offset_for_time_once(stream_id, from, timestamp_ms)
                    .await
            }
            other => other,
        }
    }

    async fn offset_for_time_once(
        &self,
        stream_id: u64,
        from: u64,
        timestamp_ms: i64,
    ) -> Result<Option<RecordBatch>, StreamError> {
        let view = self.engine.sink.view();
        let stream = view
            .state
            .streams
            .get(&stream_id)
            .ok_or(StreamError::NotFound { stream_id })?;
        let (start, end) = (stream.start_offset.max(from), stream.end_offset);
        if start >= end {
            return Ok(None);
        }
        let ranges: Vec<_> = view
            .state
            .stream_ranges(stream_id, start, end)
            .cloned()
            .collect();
        for group in ranges.chunks(FETCH_CONCURRENCY) {
            let indexes = self.indexes_of(&view.state, group, &[], false).await?;
            for (range, index) in group.iter().zip(indexes) {
                let (low, high) = (range.start_offset.max(start), range.end_offset.min(end));
                for entry in index.iter().filter(|e| {
                    e.stream_id == stream_id
                        && e.end_offset > low
                        && e.start_offset < high
                        && e.max_timestamp_ms >= timestamp_ms
                }) {
                    let block = self.block(range.object_id, *entry).await?;
                    let batches = decode_verified_block(&block, entry).map_err(|e| {
                        StreamError::Storage(format!("object {} is corrupt: {e}", range.object_id))
                    })?;
                    if let Some(b) = batches.into_iter().find(|b| {
                        b.end_offset() > low
                            && b.base_offset < high
                            && b.timestamp_ms >= timestamp_ms
                    }) {
                        return Ok(Some(b));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Waits (up to `timeout`) until the stream's committed end is beyond `offset`.
    pub async fn wait_beyond(
        &self,
        stream_id: u64,
        offset: u64,
        timeout: Duration,
    ) -> Result<StreamInfo, StreamError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let applied = self.engine.sink.view().applied_index;
            let info = self.info(stream_id)?;
            if info.end_offset > offset {
                return Ok(info);
            }
            match tokio::time::timeout_at(deadline, self.engine.sink.wait_applied(applied + 1))
                .await
            {
                Ok(r) => {
                    r?;
                }
                Err(_) => return Ok(info),
            }
        }
    }

    /// The indexes of the objects holding `ranges`, fetched together (cached ones from the
    /// cache), in order; the `i`-th object is read whole if `whole[i]` (missing: not) and the
    /// block cache has room for it ([`load_index`]); for a read-ahead if `ahead`.
    async fn indexes_of(
        &self,
        state: &mink_metadata::State,
        ranges: &[mink_metadata::RangeRecord],
        whole: &[bool],
        ahead: bool,
    ) -> Result<Vec<Arc<Vec<BlockIndex>>>, StreamError> {
        let mut sized = Vec::with_capacity(ranges.len());
        for (i, range) in ranges.iter().enumerate() {
            let object = state.objects.get(&range.object_id).ok_or_else(|| {
                StreamError::Storage(format!("object {} is not in the metadata", range.object_id))
            })?;
            let whole = whole.get(i).copied().unwrap_or(false);
            sized.push((range.object_id, object.size, whole));
        }
        futures::stream::iter(
            sized
                .into_iter()
                .map(|(id, size, whole)| self.load_object_index(id, size, whole, ahead)),
        )
        .buffered(FETCH_CONCURRENCY)
        .try_collect()
        .await
    }

    /// An object's block index: from the index cache, or read once however many readers ask
    /// for it at the same time (readers catching up together meet each new object together).
    pub(crate) async fn object_index(
        &self,
        object_id: u64,
        size: u64,
    ) -> Result<Arc<Vec<BlockIndex>>, StreamError> {
        self.load_object_index(object_id, size, false, false).await
    }

    /// [`S3Stream::object_index`], reading the object `whole` if it is read now, for a
    /// read-ahead if `ahead` (if it starts the GET).
    async fn load_object_index(
        &self,
        object_id: u64,
        size: u64,
        whole: bool,
        ahead: bool,
    ) -> Result<Arc<Vec<BlockIndex>>, StreamError> {
        let engine = &self.engine;
        if let Some(index) = engine.index_cache.get(&object_id) {
            return Ok(index);
        }
        let load = {
            let mut loads = engine.index_loads.lock().expect("index loads lock");
            // Looked at again under the lock: a load that ended in between cached its index.
            if let Some(index) = engine.index_cache.get(&object_id) {
                return Ok(index);
            }
            loads
                .entry(object_id)
                .or_insert_with(|| {
                    load_index(Arc::clone(engine), object_id, size, whole, ahead).shared()
                })
                .clone()
        };
        load.await
    }

    async fn block(&self, object_id: u64, entry: BlockIndex) -> Result<Bytes, StreamError> {
        let mut blocks = self.load_blocks(&[(object_id, entry)]).await?;
        Ok(blocks.pop().expect("one block asked, one given"))
    }

    /// The blocks `wanted` (object id, block), in order: from the block cache, from loads in
    /// flight, or read now, runs of adjacent blocks of an object in one ranged GET each.
    pub(crate) async fn load_blocks(
        &self,
        wanted: &[(u64, BlockIndex)],
    ) -> Result<Vec<Bytes>, StreamError> {
        self.load_blocks_for(wanted, false).await
    }

    /// [`S3Stream::load_blocks`], for a read-ahead (`ahead`) or a reader.
    async fn load_blocks_for(
        &self,
        wanted: &[(u64, BlockIndex)],
        ahead: bool,
    ) -> Result<Vec<Bytes>, StreamError> {
        let engine = &self.engine;
        let mut slots = Vec::with_capacity(wanted.len());
        let mut awaited: Vec<Load> = Vec::new();
        {
            let mut loads = engine.loads.lock().expect("loads lock");
            let mut missing = Vec::new();
            for (i, &(object_id, entry)) in wanted.iter().enumerate() {
                let key = (object_id, entry.position);
                // A read-ahead leaves cached blocks unread for their reader.
                let cached = if ahead {
                    engine.block_cache.peek(&key)
                } else {
                    engine.block_cache.get(&key)
                };
                if let Some(block) = cached {
                    slots.push(Some(Slot::Ready(block)));
                    continue;
                }
                if let Some((load, k)) = loads.get(&key) {
                    let at = match awaited.iter().position(|l| l.ptr_eq(load)) {
                        Some(at) => at,
                        None => {
                            awaited.push(load.clone());
                            awaited.len() - 1
                        }
                    };
                    slots.push(Some(Slot::Loading(at, *k)));
                    continue;
                }
                slots.push(None);
                missing.push(i);
            }
            // Runs of adjacent missing blocks, between one block and `COALESCE_BYTES`. A lone
            // reader splits what it misses into four (so it has GETs in flight together);
            // several readers are the parallelism themselves, and fewer, larger GETs cost less
            // where each request costs (S3, moto).
            let total: u64 = missing.iter().map(|&i| u64::from(wanted[i].1.size)).sum();
            let readers = engine.readers.lock().expect("readers lock").len() as u64;
            let split = (READ_SPLIT / readers.max(1)).max(1);
            let cap = (total / split).clamp(engine.config.block_bytes as u64, COALESCE_BYTES);
            let mut runs: Vec<(u64, Run)> = Vec::new();
            for i in missing {
                let (object_id, entry) = wanted[i];
                match runs.last_mut() {
                    Some((o, run))
                        if *o == object_id
                            && run
                                .last()
                                .is_some_and(|(l, _)| l.range().end == entry.position)
                            && entry.range().end - run[0].0.position <= cap =>
                    {
                        run.push((entry, Take::Asked(i)));
                    }
                    _ => runs.push((object_id, vec![(entry, Take::Asked(i))])),
                }
            }
            // Read-aheads too: other readers take what lies within their own windows.
            // What the read asked for ends here (its blocks are of one stream, in order).
            let asked_end = wanted.iter().map(|(_, e)| e.end_offset).max().unwrap_or(0);
            for (object_id, run) in &mut runs {
                self.widen(*object_id, run, &loads, asked_end);
            }
            for (object_id, run) in runs {
                let load = load(Arc::clone(engine), object_id, run.clone(), ahead).shared();
                awaited.push(load.clone());
                let at = awaited.len() - 1;
                for (k, (entry, take)) in run.iter().enumerate() {
                    if *take != Take::Passing {
                        loads.insert((object_id, entry.position), (load.clone(), k));
                    }
                    if let Take::Asked(i) = take {
                        slots[*i] = Some(Slot::Loading(at, k));
                    }
                }
            }
        }
        let loaded: Vec<Arc<Vec<Result<Bytes, StreamError>>>> = futures::stream::iter(awaited)
            .buffered(FETCH_CONCURRENCY)
            .try_collect()
            .await?;
        slots
            .into_iter()
            .zip(wanted)
            .map(
                |(slot, &(object_id, entry))| match slot.expect("every slot filled") {
                    Slot::Ready(block) => Ok(block),
                    Slot::Loading(at, k) => {
                        // Another load's (a read-ahead's, or one that took it along, which
                        // cached it as unread): read now.
                        if !ahead {
                            engine.block_cache.mark_read(&(object_id, entry.position));
                        }
                        loaded[at][k].clone()
                    }
                },
            )
            .collect()
    }
}

impl S3Stream {
    /// Widens a run of blocks of an object with the adjacent blocks that sequential readers
    /// are about to ask for (within their reach; the run's own reader beyond what this read
    /// asked), up to `COALESCE_BYTES`: readers catching up on many streams at once then share
    /// the GETs of the stream-set objects their streams are thin slices of, read-aheads
    /// included, and a reader of a stream object reads on in one GET.
    fn widen(&self, object_id: u64, run: &mut Run, loads: &Loads, asked_end: u64) {
        let engine = &self.engine;
        let Some(index) = engine.index_cache.get(&object_id) else {
            return;
        };
        let readers = engine.readers.lock().expect("readers lock");
        // The run's own stream counts too once its reader has proven sequential (or starts at
        // the stream's start), past the end of what the read asked for (the rest of that is in
        // its other runs): it reads on within its reach, whether or not a read-ahead window is
        // free for it.
        let own = run[0].0.stream_id;
        let reads_ahead = engine.config.read_ahead_bytes > 0;
        let loaded = |e: &BlockIndex| {
            let key = (object_id, e.position);
            loads.contains_key(&key) || engine.block_cache.contains(&key)
        };
        // A second stream's reader asking for an object read by ranges (not whole: its first
        // reader met it alone) takes the rest of it along, for the readers of its streams that
        // have yet to reach it however far behind, when they are at least half its streams:
        // one GET, where each would make its own.
        let second = index.iter().any(|e| e.stream_id != own && loaded(e)) && {
            let mut streams: HashMap<u64, bool> = HashMap::new();
            for e in index.iter() {
                let behind = readers.get(e.stream_id).is_some_and(|r| {
                    (r.proven || r.from_start || r.loading) && e.end_offset > r.next
                });
                *streams.entry(e.stream_id).or_default() |= behind;
            }
            let behind = streams.values().filter(|b| **b).count();
            streams.len() > 1 && 2 * behind >= streams.len()
        };
        // Whether a block is another stream's that its reader asks for soon (`Some(true)`:
        // yet to load; `Some(false)`: loaded or loading, or, taking the rest along, nobody's),
        // or none of the readers' (`None`).
        let soon = |e: &BlockIndex| {
            let wanted = readers.get(e.stream_id).is_some_and(|r| {
                (e.stream_id != own
                    || (reads_ahead && (r.proven || r.from_start) && e.start_offset >= asked_end))
                    && r.reach > 0
                    && e.end_offset > r.next
                    && (second || e.start_offset <= r.next.saturating_add(r.reach))
            });
            if loaded(e) {
                Some(false)
            } else {
                (wanted || second).then_some(wanted)
            }
        };
        let Some(at) = index.iter().position(|e| e.position == run[0].0.position) else {
            return;
        };
        let mut bytes = run.last().map_or(0, |(l, _)| l.range().end) - run[0].0.position;
        // The blocks next to the run on one side, nearest first: taken while they adjoin and
        // fit in `COALESCE_BYTES`, passing over loaded ones only to reach a wanted one.
        let mut grow = |side: &mut dyn Iterator<Item = &BlockIndex>, edge: BlockIndex| {
            let (mut taken, mut passing, mut edge) = (Vec::new(), Vec::new(), edge);
            for e in side {
                let adjoins = e.position == edge.range().end || e.range().end == edge.position;
                if !adjoins || bytes + u64::from(e.size) > COALESCE_BYTES {
                    break;
                }
                match soon(e) {
                    None => break,
                    Some(false) => passing.push((*e, Take::Passing)),
                    Some(true) => {
                        taken.append(&mut passing);
                        taken.push((*e, Take::Widened));
                    }
                }
                bytes += u64::from(e.size);
                edge = *e;
            }
            bytes -= passing.iter().map(|(e, _)| u64::from(e.size)).sum::<u64>();
            taken
        };
        let last = at + run.len() - 1;
        let after = grow(&mut index[last + 1..].iter(), index[last]);
        let mut before = grow(&mut index[..at].iter().rev(), index[at]);
        before.reverse();
        before.append(run);
        before.extend(after);
        *run = before;
    }
}

/// Reads an object's index (with its footer, in one GET when the index is in the object's
/// last [`TAIL_READ`] bytes), caches it, then leaves the index loads in flight. Read `whole`,
/// the object comes in one GET, its blocks go into the block cache as unread, and its index is
/// read from its tail: one GET instead of an index read and runs of blocks, if the readers'
/// unread blocks, those being read whole included, stay within half the block cache with it
/// (so a slow reader's blocks are not evicted before it reads them; without room it waits up to
/// `whole_read_wait` for readers to read theirs, then reads the index alone).
fn load_index(
    engine: Arc<Engine>,
    object_id: u64,
    size: u64,
    whole: bool,
    ahead: bool,
) -> BoxFuture<'static, Result<Arc<Vec<BlockIndex>>, StreamError>> {
    async move {
        let read = async {
            let path = object_path(&engine.config.object_prefix, object_id);
            let corrupt = |e| StreamError::Storage(format!("object {object_id} is corrupt: {e}"));
            if size < FOOTER_LEN as u64 {
                return Err(StreamError::Storage(format!(
                    "object {object_id} is {size} bytes, too small to be an object"
                )));
            }
            count_index_read(&engine);
            // Whether the object fits is decided once its GET may start, not while it waits
            // behind others: readers queued together would otherwise all count as in flight.
            let permit = read_permit(&engine, ahead).await;
            let (reserved, permit) = if whole || wanted_whole(&engine, object_id) {
                WholeRead::reserve_waiting(&engine, size, permit).await
            } else {
                (None, permit)
            };
            let (tail_start, tail) = if reserved.is_some() {
                engine
                    .stats
                    .whole_object_reads
                    .fetch_add(1, Ordering::Relaxed);
                // No range: a store may serve a whole object for less than a range of it (moto
                // copies the object to cut a range out of it).
                let got = async { engine.store.get(&path).await?.bytes().await }
                    .await
                    .map_err(storage)?;
                if got.len() as u64 != size {
                    return Err(StreamError::Storage(format!(
                        "object {object_id} is {} bytes, the metadata says {size}",
                        got.len()
                    )));
                }
                (0, got)
            } else {
                let tail_start = size.saturating_sub(TAIL_READ);
                let tail = engine
                    .store
                    .get_range(&path, tail_start..size)
                    .await
                    .map_err(storage)?;
                (tail_start, tail)
            };
            drop(permit);
            let footer = parse_footer(&tail, size).map_err(corrupt)?;
            let index_bytes: Bytes = if footer.index_position >= tail_start {
                let at = usize::try_from(footer.index_position - tail_start).unwrap_or(usize::MAX);
                tail.slice(at..at + footer.index_len as usize)
            } else {
                count_index_read(&engine);
                let index =
                    footer.index_position..footer.index_position + u64::from(footer.index_len);
                read_range(&engine, &path, index, ahead)
                    .await
                    .map_err(storage)?
            };
            let index = Arc::new(parse_index(&index_bytes, &footer).map_err(corrupt)?);
            if reserved.is_some() {
                // The blocks of streams someone reads: a stream-set object's others would only
                // hold room in the cache (and in the unread bytes) until they are evicted.
                // Of those, only blocks their readers have not gone past nor have already:
                // others would count as unread until evicted, keeping whole reads out.
                let reading_from: HashMap<u64, u64> = {
                    let readers = engine.readers.lock().expect("readers lock");
                    index
                        .iter()
                        .filter_map(|e| Some((e.stream_id, readers.get(e.stream_id)?.next)))
                        .collect()
                };
                let wanted = |e: &&BlockIndex| {
                    reading_from
                        .get(&e.stream_id)
                        .is_some_and(|&next| e.end_offset > next)
                        && !engine.block_cache.contains(&(object_id, e.position))
                };
                for e in index.iter().filter(wanted) {
                    let block = usize::try_from(e.position)
                        .ok()
                        .and_then(|at| Some(at..at.checked_add(e.size as usize)?))
                        .filter(|r| r.end <= tail.len())
                        .ok_or_else(|| {
                            StreamError::Storage(format!(
                                "object {object_id} is corrupt: block at {} beyond its end",
                                e.position
                            ))
                        })?;
                    let block = tail.slice(block);
                    // A block failing its checksum is left out: its readers load it by its
                    // range and get the error, readers of the other streams are not held up.
                    if verify_checked(&engine, &block, e).is_ok() {
                        engine.block_cache.insert_unread(
                            (object_id, e.position),
                            block,
                            e.size as usize,
                        );
                    }
                }
            }
            engine.index_cache.insert(
                object_id,
                Arc::clone(&index),
                index.len() * size_of::<BlockIndex>() + 64,
            );
            Ok(index)
        }
        .await;
        engine
            .index_loads
            .lock()
            .expect("index loads lock")
            .remove(&object_id);
        read
    }
    .boxed()
}

/// Bytes of a whole object being read, counted in `Engine::whole_reads_inflight` until its
/// blocks are in the block cache (as unread) or the read failed.
struct WholeRead<'a>(&'a Engine, u64);

impl<'a> WholeRead<'a> {
    /// Room for `size` bytes more in half the block cache, beside the unread blocks and the
    /// other whole objects being read; none: read the index alone.
    fn reserve(engine: &'a Engine, size: u64) -> Option<Self> {
        let room = (engine.config.block_cache_bytes / 2) as u64;
        let reading = engine
            .whole_reads_inflight
            .fetch_add(size, Ordering::Relaxed);
        let read = WholeRead(engine, size);
        (engine.block_cache.unread_bytes() as u64 + reading + size <= room).then_some(read)
    }

    /// [`WholeRead::reserve`], waiting without `permit` (a GET's turn, taken back after) while
    /// there is no room: readers reading the blocks they were given make some, and one GET of
    /// the whole object costs less than its index GET and runs of ranged GETs. The wait ends
    /// after `whole_read_wait`, or a quarter of it with nothing read (unread blocks nobody
    /// reads, of readers gone, wait to be evicted); then none, the read is refused.
    async fn reserve_waiting(
        engine: &'a Engine,
        size: u64,
        mut permit: tokio::sync::SemaphorePermit<'a>,
    ) -> (Option<Self>, tokio::sync::SemaphorePermit<'a>) {
        let wait = engine.config.whole_read_wait;
        let deadline = tokio::time::Instant::now() + wait;
        let mut waited = false;
        loop {
            let freed = engine.block_cache.unread_freed();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if let Some(reserved) = WholeRead::reserve(engine, size) {
                return (Some(reserved), permit);
            }
            if !waited {
                waited = true;
                engine
                    .stats
                    .whole_reads_waited
                    .fetch_add(1, Ordering::Relaxed);
                engine.counted.notify_waiters();
            }
            drop(permit);
            let until = deadline.min(tokio::time::Instant::now() + wait / 4);
            let freed = tokio::time::timeout_at(until, freed).await;
            permit = engine
                .reads
                .acquire()
                .await
                .expect("the read permits are never closed");
            if freed.is_err() {
                let reserved = WholeRead::reserve(engine, size);
                if reserved.is_none() {
                    engine
                        .stats
                        .whole_reads_refused
                        .fetch_add(1, Ordering::Relaxed);
                }
                return (reserved, permit);
            }
        }
    }
}

impl Drop for WholeRead<'_> {
    fn drop(&mut self) {
        self.0
            .whole_reads_inflight
            .fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// Counts off, from each object's readers still needed in `wanting` (by object id), the
/// readers reading on (proven, from the stream's start, or reading ahead; but `except`) whose
/// next [`RANGES_AHEAD`] ranges within their reach are in it; the objects that got enough
/// leave `wanting`.
fn count_readers(
    engine: &Engine,
    state: &mink_metadata::State,
    except: Option<u64>,
    wanting: &mut HashMap<u64, u64>,
) {
    if wanting.is_empty() {
        return;
    }
    let readers = engine.readers.lock().expect("readers lock");
    for (&stream, r) in &readers.by_stream {
        if Some(stream) == except || !(r.proven || r.from_start || r.loading) {
            continue;
        }
        let until = r.next.saturating_add(r.reach);
        for range in state
            .stream_ranges(stream, r.next, until)
            .take(RANGES_AHEAD)
        {
            if let Some(n) = wanting.get_mut(&range.object_id) {
                *n = n.saturating_sub(1);
            }
        }
        // Enough readers for every object: the rest need not be looked at.
        wanting.retain(|_, n| *n > 0);
        if wanting.is_empty() {
            break;
        }
    }
}

/// Readers reading on that a stream-set object of at most [`COALESCE_BYTES`] needs to be read
/// whole: half its streams (none for other objects).
fn readers_for_whole(object: &mink_metadata::ObjectRecord) -> Option<u64> {
    (object.kind() == mink_metadata::ObjectKind::StreamSet && object.size <= COALESCE_BYTES)
        .then(|| object.live_ranges.div_ceil(2))
}

/// Whether readers reading on are about to read at least half the streams of stream-set object
/// `object_id` ([`readers_for_whole`]): asked when its index GET may start, as readers that
/// start together join the load of the first one to plan (which knew only itself).
fn wanted_whole(engine: &Engine, object_id: u64) -> bool {
    let view = engine.sink.view();
    let Some(needed) = view
        .state
        .objects
        .get(&object_id)
        .and_then(readers_for_whole)
    else {
        return false;
    };
    let mut wanting = HashMap::from([(object_id, needed)]);
    count_readers(engine, &view.state, None, &mut wanting);
    wanting.is_empty()
}

/// [`verify_block`] of a block just read from storage, counted: the block cache and the loads
/// hand out only blocks that passed it, which readers decode without checking the sum again.
fn verify_checked(
    engine: &Engine,
    block: &[u8],
    entry: &BlockIndex,
) -> Result<(), crate::format::FormatError> {
    engine.stats.blocks_verified.fetch_add(1, Ordering::Relaxed);
    verify_block(block, entry)
}

fn count_index_read(engine: &Engine) {
    engine.stats.index_reads.fetch_add(1, Ordering::Relaxed);
}

/// One ranged GET of the adjacent blocks `run` of an object: each block is checksummed, goes
/// into the block cache (a corrupt one does not), then leaves the loads in flight (so a read in
/// between finds it in one or the other).
fn load(
    engine: Arc<Engine>,
    object_id: u64,
    run: Run,
    ahead: bool,
) -> BoxFuture<'static, LoadResult> {
    async move {
        let start = run[0].0.position;
        let end = run.last().expect("a run has blocks").0.range().end;
        let path = object_path(&engine.config.object_prefix, object_id);
        let got = read_range(&engine, &path, start..end, ahead)
            .await
            .map_err(storage);
        let blocks = got.and_then(|bytes| {
            if bytes.len() as u64 != end - start {
                return Err(StreamError::Storage(format!(
                    "object {object_id}: {} bytes read of {start}..{end}",
                    bytes.len()
                )));
            }
            Ok(run
                .iter()
                .map(|(e, _)| {
                    let at = usize::try_from(e.position - start).expect("a run fits in memory");
                    let block = bytes.slice(at..at + e.size as usize);
                    verify_checked(&engine, &block, e).map_err(|err| {
                        StreamError::Storage(format!("object {object_id} is corrupt: {err}"))
                    })?;
                    Ok(block)
                })
                .collect::<Vec<_>>())
        });
        if let Ok(blocks) = &blocks {
            for ((e, take), block) in run.iter().zip(blocks) {
                let (Ok(block), key) = (block, (object_id, e.position)) else {
                    continue;
                };
                match take {
                    // Loaded ahead of its reader's asking: kept until read, as a whole
                    // object's blocks are (in the regular part of the cache a catch-up read
                    // evicted such blocks before their readers came, who read them again).
                    Take::Widened => {
                        engine
                            .block_cache
                            .insert_unread(key, block.clone(), block.len())
                    }
                    // Cached already (unread, maybe: leave it so) or another load's.
                    Take::Passing => {}
                    // Read now, or a read-ahead's, whose window its reader reads next (as
                    // unread, 16 Flight readers' windows took the room of whole-object reads
                    // on moto, and made more GETs).
                    Take::Asked(_) => engine.block_cache.insert(key, block.clone(), block.len()),
                }
            }
        }
        let mut loads = engine.loads.lock().expect("loads lock");
        for (e, _) in run.iter().filter(|(_, t)| *t != Take::Passing) {
            loads.remove(&(object_id, e.position));
        }
        drop(loads);
        blocks.map(Arc::new)
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readers count toward the read-ahead shares while they read, and not once idle.
    #[test]
    fn idle_readers_are_forgotten() {
        let mut readers = Readers::default();
        for stream in 0..10 {
            readers.of(stream, 0);
        }
        // The count is of the others: those that read within the idle time.
        assert_eq!(readers.of(10, 15_000).0, 10);
        assert_eq!(readers.of(0, 20_000).0, 11);
        // Past the idle time, only the two that read since count.
        assert_eq!(readers.of(10, READER_IDLE_MS + 1_000).0, 2);
        assert!(readers.get(5).is_none());
        // A reader whose read-ahead is loading is kept, however long the load takes.
        readers.get_mut(10).unwrap().loading = true;
        assert_eq!(readers.of(0, 10 * READER_IDLE_MS).0, 1);
        assert!(readers.get(10).is_some());
    }
}
