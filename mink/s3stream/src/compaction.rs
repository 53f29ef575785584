//! Compaction and cleanup: keep the number of objects bounded and delete what nothing
//! references.
//!
//! Compaction (every node, for its own objects; the lease holder also for dead nodes):
//! - stream-set objects merge into new stream-set objects of at most `stream_set_object_bytes`
//!   each, except that a stream with more than `split_stream_bytes` in them goes into stream
//!   objects of its own (of at most `stream_object_bytes` each);
//! - consecutive small stream objects of one stream merge into one, up to
//!   `stream_object_bytes`.
//!
//! Each round moves at most `max_round_bytes` of sources, paced to `max_bytes_per_sec` of GETs
//! and PUTs together (`min_bytes_per_sec` while the node's writes outrun half that); a round
//! that left sources for lack of budget is followed by the next at once. Data moves whole
//! batches, so offsets and batch boundaries never change. A source object whose every range
//! moved becomes destroyed.
//!
//! Cleanup (lease holder): expires prepared ids past their deadline, deletes destroyed objects
//! once `destroyed_grace` has passed (readers holding an older view may still read them) and
//! forgets them (`CleanDestroyedObjects`), and sweeps the store for orphans — objects whose id
//! the metadata no longer knows (a PUT that landed after its id expired and was cleaned).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use mink_metadata::{
    CleanDestroyedObjects, Command, CommitStreamSetObject, CompactStreamObject,
    ExpirePreparedObjects, ObjectKind, ObjectRecord, ObjectState, Outcome, Reply, StreamRange,
};
use object_store::ObjectStoreExt as _;
use object_store::path::Path;

use crate::engine::{S3Stream, StreamError, object_id_of, object_path};
use crate::format::{ObjectBuilder, RecordBatch, decode_object};

/// Compaction and cleanup settings.
#[derive(Clone, Debug)]
pub struct CompactionConfig {
    /// How often a node compacts (the spec's `wal_upload_interval`).
    pub interval: Duration,
    /// A stream with more than this in the stream-set objects being merged gets its own
    /// stream object.
    pub split_stream_bytes: u64,
    /// Stream objects merge up to this size, and a stream split out of stream-set objects is
    /// cut into stream objects of at most this size (beyond one batch).
    pub stream_object_bytes: u64,
    /// What stays in stream-set objects is written as objects of at most this size (beyond one
    /// stream's data): one PUT is one burst, which the pace spreads only between objects (a
    /// 310 MB stream-set object held moto for 2.4 s and the writes' acknowledgements with it).
    pub stream_set_object_bytes: u64,
    /// At most this many bytes of sources per round.
    pub max_round_bytes: u64,
    /// A round's object reads and writes together move at most this many bytes per second
    /// (0: as fast as they go). A round at full speed takes the cores and the store from the
    /// writes being acknowledged for seconds at a time; paced, it costs them a steady share.
    ///
    /// Compaction yields to writes it cannot keep up with: while the node's streams are
    /// appended faster than half this pace (the last second or more), the pace is
    /// `min_bytes_per_sec`. Their PUTs and commits then have the store, the cores and the disk
    /// to themselves, and the deferred work is done when they ease.
    pub max_bytes_per_sec: u64,
    /// The pace while compaction yields, so that it still makes progress (at most
    /// `max_bytes_per_sec`).
    pub min_bytes_per_sec: u64,
    /// Destroyed objects are deleted this long after they were destroyed.
    pub destroyed_grace: Duration,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            interval: Duration::from_secs(10),
            split_stream_bytes: 16 << 20,
            stream_object_bytes: 128 << 20,
            stream_set_object_bytes: 32 << 20,
            max_round_bytes: 512 << 20,
            max_bytes_per_sec: 64 << 20,
            min_bytes_per_sec: 8 << 20,
            destroyed_grace: Duration::from_secs(300),
        }
    }
}

/// What one round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundReport {
    pub sources: usize,
    pub objects_written: usize,
    pub bytes_read: u64,
    /// Bytes of the objects written whose commit was accepted.
    pub bytes_written: u64,
    /// How long the round waited for its pace (`max_bytes_per_sec`).
    pub paced: Duration,
    /// Sources were left for lack of budget (`max_round_bytes`): the background loop starts
    /// the next round at once when nothing was refused.
    pub more: bool,
    /// Commits the metadata log refused (a concurrent trim, delete or compaction): their
    /// sources stay and the next round tries again.
    pub refused: Vec<String>,
}

impl RoundReport {
    /// Counts an object the round wrote: its bytes, or why the metadata log refused it.
    fn count(&mut self, written: Result<u64, String>) {
        match written {
            Ok(bytes) => {
                self.objects_written += 1;
                self.bytes_written += bytes;
            }
            Err(refused) => self.refused.push(refused),
        }
    }
}

/// What one cleanup did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub expired: u64,
    pub deleted: u64,
    pub orphans: u64,
}

fn committed(o: &ObjectRecord) -> bool {
    o.state() == ObjectState::Committed
}

impl S3Stream {
    /// One compaction round over the committed objects prepared by `node_id` (this node's own,
    /// or a dead node's when this node holds the lease).
    pub async fn compact_once(
        &self,
        node_id: u64,
        config: &CompactionConfig,
    ) -> Result<RoundReport, StreamError> {
        let append_rate = || self.engine.append_rate();
        let mut pacer = Pacer::new(config, &append_rate);
        let mut report = self
            .compact_stream_sets(node_id, config, &mut pacer)
            .await?;
        let merged = self
            .merge_stream_objects(node_id, config, &mut pacer)
            .await?;
        report.sources += merged.sources;
        report.objects_written += merged.objects_written;
        report.bytes_read += merged.bytes_read;
        report.bytes_written += merged.bytes_written;
        report.refused.extend(merged.refused);
        report.more |= merged.more;
        report.paced = pacer.paced;
        Ok(report)
    }

    /// GETs a whole source object, once the pace allows its `size` bytes.
    async fn read_object(
        &self,
        object_id: u64,
        size: u64,
        pacer: &mut Pacer<'_>,
    ) -> Result<Bytes, StreamError> {
        pacer.take(size).await;
        let path = object_path(&self.engine.config.object_prefix, object_id);
        let got = self
            .engine
            .store
            .get(&path)
            .await
            .map_err(|e| StreamError::Storage(e.to_string()))?;
        got.bytes()
            .await
            .map_err(|e| StreamError::Storage(e.to_string()))
    }

    /// PUTs a new object built by the round, once the pace allows its bytes.
    async fn put_object(&self, bytes: &Bytes, pacer: &mut Pacer<'_>) -> Result<u64, StreamError> {
        pacer.take(bytes.len() as u64).await;
        Ok(self.engine.put_new_object(bytes).await?.0)
    }

    /// Batches of `stream_id` overlapping `[start, end)` in a decoded object.
    fn batches_of(
        decoded: &HashMap<u64, Vec<(u64, RecordBatch)>>,
        object_id: u64,
        stream_id: u64,
        start: u64,
        end: u64,
    ) -> Vec<RecordBatch> {
        decoded
            .get(&object_id)
            .map(|batches| {
                batches
                    .iter()
                    .filter(|(s, b)| {
                        *s == stream_id && b.end_offset() > start && b.base_offset < end
                    })
                    .map(|(_, b)| b.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn compact_stream_sets(
        &self,
        node_id: u64,
        config: &CompactionConfig,
        pacer: &mut Pacer<'_>,
    ) -> Result<RoundReport, StreamError> {
        let view = self.engine.sink.view();
        let state = &view.state;
        // Oldest first, within the round's budget.
        let mut sources = BTreeSet::new();
        let mut budget = 0u64;
        let mut more = false;
        for o in state
            .objects
            .values()
            .filter(|o| committed(o) && o.node_id == node_id && o.kind() == ObjectKind::StreamSet)
        {
            if budget + o.size > config.max_round_bytes && !sources.is_empty() {
                more = true;
                break;
            }
            budget += o.size;
            sources.insert(o.object_id);
        }
        // Worth a round: more objects than their bytes pack into, or a stream big enough to
        // split out (read from their indexes). A round packs streams into stream-set objects
        // so that any two consecutive ones hold more than `stream_set_object_bytes`, so its
        // own output is at most `2 * bytes / stream_set_object_bytes + 1` objects: without
        // this, that output (or a lone big object) would be rewritten every round.
        let packed = 2 * budget / config.stream_set_object_bytes.max(1) + 1;
        if sources.len() as u64 <= packed {
            if sources.is_empty() {
                return Ok(RoundReport::default());
            }
            let mut per_stream: HashMap<u64, u64> = HashMap::new();
            for &id in &sources {
                let size = state.objects.get(&id).map_or(0, |o| o.size);
                for e in self.object_index(id, size).await?.iter() {
                    *per_stream.entry(e.stream_id).or_default() += u64::from(e.size);
                }
            }
            if per_stream.values().all(|&b| b <= config.split_stream_bytes) {
                return Ok(RoundReport::default());
            }
        }
        let mut decoded: HashMap<u64, Vec<(u64, RecordBatch)>> = HashMap::new();
        let mut report = RoundReport {
            sources: sources.len(),
            more,
            ..RoundReport::default()
        };
        for id in &sources {
            let size = state.objects.get(id).map_or(0, |o| o.size);
            let bytes = self.read_object(*id, size, pacer).await?;
            report.bytes_read += bytes.len() as u64;
            let blocks = decode_off_runtime(*id, bytes).await?;
            decoded.insert(
                *id,
                blocks
                    .into_iter()
                    .flat_map(|(e, batches)| batches.into_iter().map(move |b| (e.stream_id, b)))
                    .collect(),
            );
        }
        // Per stream: the runs of consecutive ranges held by the sources. A stream whose
        // ranges alternate between sources and other objects (after takeovers) has several.
        struct Run {
            start: u64,
            end: u64,
            batches: Vec<RecordBatch>,
        }
        let mut runs: BTreeMap<u64, Vec<Run>> = BTreeMap::new();
        let mut previous_in_sources: Option<u64> = None;
        for ((stream_id, _), range) in state.ranges.iter() {
            if !sources.contains(&range.object_id) {
                previous_in_sources = None;
                continue;
            }
            let batches = Self::batches_of(
                &decoded,
                range.object_id,
                *stream_id,
                range.start_offset,
                range.end_offset,
            );
            let stream_runs = runs.entry(*stream_id).or_default();
            match stream_runs.last_mut() {
                Some(run)
                    if previous_in_sources == Some(*stream_id) && run.end == range.start_offset =>
                {
                    run.end = range.end_offset;
                    run.batches.extend(batches);
                }
                _ => stream_runs.push(Run {
                    start: range.start_offset,
                    end: range.end_offset,
                    batches,
                }),
            }
            previous_in_sources = Some(*stream_id);
        }
        // What stays in stream-set objects, a stream's runs together, cut between streams.
        let mut stream_sets: Vec<StreamSetPart> = Vec::new();
        let mut split = Vec::new();
        for (stream_id, stream_runs) in runs {
            let bytes: u64 = stream_runs
                .iter()
                .flat_map(|r| &r.batches)
                .map(|b| b.payload.len() as u64)
                .sum();
            if bytes > config.split_stream_bytes {
                for run in stream_runs {
                    split.extend(
                        cut_run(run.start, run.end, run.batches, config.stream_object_bytes)
                            .into_iter()
                            .map(|(start, end, batches)| (stream_id, start, end, batches)),
                    );
                }
                continue;
            }
            if stream_sets
                .last()
                .is_none_or(|p| p.bytes + bytes > config.stream_set_object_bytes)
            {
                stream_sets.push(StreamSetPart::default());
            }
            let part = stream_sets.last_mut().expect("pushed above when none fits");
            part.bytes += bytes;
            for Run {
                start,
                end,
                batches,
            } in stream_runs
            {
                part.batches
                    .extend(batches.into_iter().map(|b| (stream_id, b)));
                part.ranges.push(StreamRange {
                    stream_id,
                    stream_epoch: 0,
                    start_offset: start,
                    end_offset: end,
                    writers: vec![],
                });
            }
        }
        // Split-out streams first: each becomes stream objects.
        let sources_list: Vec<u64> = sources.iter().copied().collect();
        for (stream_id, start, end, batches) in split {
            let written = self
                .write_stream_object(stream_id, start, end, batches, &sources_list, pacer)
                .await?;
            report.count(written);
        }
        // Then the rest into stream-set objects (none when every stream was split out).
        for part in stream_sets {
            let written = self
                .write_stream_set_object(part, &sources_list, pacer)
                .await?;
            report.count(written);
        }
        Ok(report)
    }

    /// Writes and commits one stream-set object of a round: `Ok(Err(_))` when the metadata
    /// log refused it (another compaction or a trim got there first: the sources stay, and
    /// the next round tries again).
    async fn write_stream_set_object(
        &self,
        part: StreamSetPart,
        sources: &[u64],
        pacer: &mut Pacer<'_>,
    ) -> Result<Result<u64, String>, StreamError> {
        let bytes = build_off_runtime(self.engine.config.block_bytes, part.batches).await?;
        let object_id = self.put_object(&bytes, pacer).await?;
        let node = self.engine.sink.node();
        let proposed = self
            .engine
            .sink
            .propose(Command::CommitStreamSetObject(CommitStreamSetObject {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                object_id,
                object_size: bytes.len() as u64,
                ranges: part.ranges,
                compacted_object_ids: sources.to_vec(),
            }))
            .await?;
        match proposed.result {
            Ok(_) => Ok(Ok(bytes.len() as u64)),
            Err(r) => {
                tracing::info!(%r, "stream-set compaction not committed");
                Ok(Err(r.to_string()))
            }
        }
    }

    async fn write_stream_object(
        &self,
        stream_id: u64,
        start: u64,
        end: u64,
        batches: Vec<RecordBatch>,
        sources: &[u64],
        pacer: &mut Pacer<'_>,
    ) -> Result<Result<u64, String>, StreamError> {
        let bytes = build_off_runtime(
            self.engine.config.block_bytes,
            batches.into_iter().map(|b| (stream_id, b)).collect(),
        )
        .await?;
        let object_id = self.put_object(&bytes, pacer).await?;
        let node = self.engine.sink.node();
        let proposed = self
            .engine
            .sink
            .propose(Command::CompactStreamObject(CompactStreamObject {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                object_id,
                stream_id,
                start_offset: start,
                end_offset: end,
                object_size: bytes.len() as u64,
                source_object_ids: sources.to_vec(),
            }))
            .await?;
        match proposed.result {
            Ok(Outcome::Done(_)) => Ok(Ok(bytes.len() as u64)),
            Ok(other) => Ok(Err(format!(
                "stream object of stream {stream_id}: {other:?}"
            ))),
            Err(r) => {
                tracing::info!(%r, stream_id, "stream object not committed");
                Ok(Err(r.to_string()))
            }
        }
    }

    async fn merge_stream_objects(
        &self,
        node_id: u64,
        config: &CompactionConfig,
        pacer: &mut Pacer<'_>,
    ) -> Result<RoundReport, StreamError> {
        let view = self.engine.sink.view();
        let state = &view.state;
        let mut report = RoundReport::default();
        // Per stream, runs of consecutive ranges held by small stream objects of this node.
        let mut runs: Vec<(u64, u64, u64, Vec<u64>, u64)> = Vec::new();
        let mut current: Option<(u64, u64, u64, Vec<u64>, u64)> = None;
        for range in state.ranges.values() {
            let small = state.objects.get(&range.object_id).filter(|o| {
                committed(o)
                    && o.node_id == node_id
                    && o.kind() == ObjectKind::Stream
                    && o.size < config.stream_object_bytes
            });
            let extends = current.as_ref().is_some_and(|c| {
                c.0 == range.stream_id
                    && c.2 == range.start_offset
                    && small.is_some_and(|o| c.4 + o.size <= config.stream_object_bytes)
            });
            if let (true, Some(c), Some(o)) = (extends, current.as_mut(), small) {
                c.2 = range.end_offset;
                c.3.push(o.object_id);
                c.4 += o.size;
                continue;
            }
            if let Some(c) = current.take()
                && c.3.len() > 1
            {
                runs.push(c);
            }
            current = small.map(|o| {
                (
                    range.stream_id,
                    range.start_offset,
                    range.end_offset,
                    vec![o.object_id],
                    o.size,
                )
            });
        }
        if let Some(c) = current.take()
            && c.3.len() > 1
        {
            runs.push(c);
        }
        let mut budget = 0u64;
        for (stream_id, start, end, sources, size) in runs {
            if budget + size > config.max_round_bytes && budget > 0 {
                report.more = true;
                break;
            }
            budget += size;
            let mut batches = Vec::new();
            for id in &sources {
                let size = state.objects.get(id).map_or(0, |o| o.size);
                let bytes = self.read_object(*id, size, pacer).await?;
                report.bytes_read += bytes.len() as u64;
                for (e, bs) in decode_off_runtime(*id, bytes).await? {
                    if e.stream_id == stream_id {
                        batches.extend(
                            bs.into_iter()
                                .filter(|b| b.end_offset() > start && b.base_offset < end),
                        );
                    }
                }
            }
            report.sources += sources.len();
            let written = self
                .write_stream_object(stream_id, start, end, batches, &sources, pacer)
                .await?;
            report.count(written);
        }
        Ok(report)
    }

    /// Lease-holder cleanup (see the module docs). `coordinator_epoch` is this node's, from
    /// its lease.
    pub async fn cleanup_once(
        &self,
        coordinator_epoch: u64,
        config: &CompactionConfig,
    ) -> Result<CleanupReport, StreamError> {
        let sink = &self.engine.sink;
        let mut report = CleanupReport::default();
        let now = self.engine.config.clock.now_ms();
        let proposed = sink
            .propose(Command::ExpirePreparedObjects(ExpirePreparedObjects {
                coordinator_epoch,
                now_ms: now,
            }))
            .await?;
        if let Ok(Outcome::Done(Reply::Count(n))) = proposed.result {
            report.expired = n;
        }
        let view = sink.view();
        let grace = u64::try_from(config.destroyed_grace.as_millis()).unwrap_or(u64::MAX);
        let due: Vec<u64> = view
            .state
            .objects
            .values()
            .filter(|o| {
                o.state() == ObjectState::Destroyed
                    && o.destroyed_at_ms.saturating_add(grace) <= now
            })
            .map(|o| o.object_id)
            .collect();
        if !due.is_empty() {
            self.delete_objects(&due).await?;
            let proposed = sink
                .propose(Command::CleanDestroyedObjects(CleanDestroyedObjects {
                    coordinator_epoch,
                    object_ids: due,
                }))
                .await?;
            if let Ok(Outcome::Done(Reply::Count(n))) = proposed.result {
                report.deleted = n;
            }
        }
        report.orphans = self.sweep_orphans().await?;
        Ok(report)
    }

    async fn delete_objects(&self, ids: &[u64]) -> Result<(), StreamError> {
        let prefix = self.engine.config.object_prefix.clone();
        let paths: Vec<object_store::Result<Path>> =
            ids.iter().map(|id| Ok(object_path(&prefix, *id))).collect();
        let mut results = self
            .engine
            .store
            .delete_stream(futures::stream::iter(paths).boxed());
        while let Some(r) = results.next().await {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(StreamError::Storage(e.to_string())),
            }
        }
        Ok(())
    }

    /// Deletes objects in the store whose id the metadata no longer knows (allocated, then
    /// cleaned) or has destroyed. Prepared ids are left alone: their PUT may be under way.
    async fn sweep_orphans(&self) -> Result<u64, StreamError> {
        let view = self.engine.sink.view();
        let state = &view.state;
        let prefix = Path::from(self.engine.config.object_prefix.as_str());
        let listed: Vec<Path> = self
            .engine
            .store
            .list(Some(&prefix))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| StreamError::Storage(e.to_string()))?;
        let orphans: Vec<u64> = listed
            .iter()
            .filter_map(object_id_of)
            .filter(|id| *id < state.counters.next_object_id && !state.objects.contains_key(id))
            .collect();
        if !orphans.is_empty() {
            tracing::info!(count = orphans.len(), "deleting orphaned objects");
            self.delete_objects(&orphans).await?;
        }
        Ok(orphans.len() as u64)
    }
}

impl S3Stream {
    /// Compacts this node's own objects every `config.interval`. Stops with the engine.
    pub fn spawn_background(&self, config: CompactionConfig) {
        let engine = self.clone();
        let task = tokio::spawn(async move {
            let mut shutdown = engine.shutdown_watch();
            let mut more = false;
            loop {
                if !more {
                    tokio::select! {
                        _ = tokio::time::sleep(config.interval) => {}
                        _ = shutdown.changed() => return,
                    }
                }
                // Back to back only while rounds make progress: a refused commit (a
                // concurrent trim or compaction) waits for the next interval.
                more = match engine.background_round(&config).await {
                    Ok(report) => report.more && report.refused.is_empty(),
                    Err(e) => {
                        tracing::warn!(error = %e, "compaction round failed");
                        false
                    }
                };
            }
        });
        self.add_task(task);
    }

    async fn background_round(
        &self,
        config: &CompactionConfig,
    ) -> Result<RoundReport, StreamError> {
        // Only this node's own objects: the lease holder's duties (object cleanup, the objects
        // of dead nodes) are the coordinator's (`mink-coordinator`), which calls
        // `cleanup_once` and `compact_once` itself.
        self.compact_once(self.engine.sink.node().node_id, config)
            .await
    }
}

/// One stream-set object a round writes: its batches (stream id, batch; in order), its ranges,
/// and their payload bytes.
#[derive(Default)]
struct StreamSetPart {
    batches: Vec<(u64, RecordBatch)>,
    ranges: Vec<StreamRange>,
    bytes: u64,
}

/// Cuts a run `[start, end)` of one stream (its `batches`, in order) into consecutive pieces
/// of at most `max_bytes` of payload each (a batch larger than that is a piece of its own):
/// the pieces cover the run exactly, each ending where the next one's first batch begins.
fn cut_run(
    start: u64,
    end: u64,
    batches: Vec<RecordBatch>,
    max_bytes: u64,
) -> Vec<(u64, u64, Vec<RecordBatch>)> {
    let mut pieces: Vec<(u64, u64, Vec<RecordBatch>)> = Vec::new();
    let mut current: Vec<RecordBatch> = Vec::new();
    let mut current_bytes = 0u64;
    let mut current_start = start;
    for b in batches {
        let size = b.payload.len() as u64;
        if !current.is_empty() && current_bytes + size > max_bytes {
            let next_start = b.base_offset.max(current_start);
            pieces.push((current_start, next_start, std::mem::take(&mut current)));
            current_start = next_start;
            current_bytes = 0;
        }
        current_bytes += size;
        current.push(b);
    }
    pieces.push((current_start, end, current));
    pieces
}

/// Spaces a round's GETs and PUTs so that together they move at most the pace: each waits
/// until the bytes before it have had their time. An object moves whole, so the pace holds on
/// average over a round, not within one object. The pace is set again at each GET and PUT,
/// from the rate the node's streams were last appended at (see `max_bytes_per_sec`).
struct Pacer<'a> {
    max_bytes_per_sec: u64,
    min_bytes_per_sec: u64,
    /// The rate the node's streams are being appended at, bytes per second.
    append_rate: &'a (dyn Fn() -> u64 + Sync),
    /// When the bytes taken so far have had their time; `None` before the first.
    paid_until: Option<tokio::time::Instant>,
    paced: Duration,
}

impl<'a> Pacer<'a> {
    fn new(config: &CompactionConfig, append_rate: &'a (dyn Fn() -> u64 + Sync)) -> Pacer<'a> {
        Pacer {
            max_bytes_per_sec: config.max_bytes_per_sec,
            min_bytes_per_sec: config.min_bytes_per_sec,
            append_rate,
            paid_until: None,
            paced: Duration::ZERO,
        }
    }

    /// Waits until `bytes` may move, and books their time.
    async fn take(&mut self, bytes: u64) {
        if self.max_bytes_per_sec == 0 {
            return;
        }
        let now = tokio::time::Instant::now();
        let start = self.paid_until.map_or(now, |t| t.max(now));
        if start > now {
            self.paced += start - now;
            tokio::time::sleep_until(start).await;
        }
        let pace = pace(
            self.max_bytes_per_sec,
            self.min_bytes_per_sec,
            (self.append_rate)(),
        );
        #[allow(clippy::cast_precision_loss)] // a duration, not an exact count
        let time = Duration::from_secs_f64(bytes as f64 / pace as f64);
        self.paid_until = Some(start + time);
    }
}

/// Compaction's pace beside writes appended at `append_rate` bytes per second. A round reads
/// and writes each byte once, so at `max` it keeps up with writes of `max / 2`; while the
/// writes are faster than that it cannot keep up anyway, and slowing down to `min` only moves
/// its work to after them, when the store and cores are free again.
fn pace(max: u64, min: u64, append_rate: u64) -> u64 {
    if append_rate.saturating_mul(2) <= max {
        max
    } else {
        // Never zero: a booking at zero bytes per second would never end.
        min.clamp(1, max)
    }
}

/// The rate a counter went up at over its last window of at least `WINDOW`, measured when
/// asked (compaction asks at each GET and PUT; nothing is counted on the write path).
#[derive(Debug)]
pub(crate) struct RateWindow {
    start: Option<(tokio::time::Instant, u64)>,
    rate: u64,
}

impl RateWindow {
    const WINDOW: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> RateWindow {
        RateWindow {
            start: None,
            rate: 0,
        }
    }

    /// The counter is `total` at `now`: the rate over the window that ends now if it is long
    /// enough, else over the last one that was (0 before any).
    pub(crate) fn observe(&mut self, now: tokio::time::Instant, total: u64) -> u64 {
        match self.start {
            Some((at, from)) if now.duration_since(at) >= Self::WINDOW => {
                let secs = now.duration_since(at).as_secs_f64();
                #[allow(
                    clippy::cast_precision_loss,
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss
                )] // a rate, not an exact count
                {
                    self.rate = (total.saturating_sub(from) as f64 / secs) as u64;
                }
                self.start = Some((now, total));
            }
            Some(_) => {}
            None => self.start = Some((now, total)),
        }
        self.rate
    }
}

/// Decodes a whole object on the blocking pool: a round decodes hundreds of megabytes, which
/// on a runtime worker would hold up the appends, commits and acknowledgements queued there.
async fn decode_off_runtime(
    object_id: u64,
    bytes: Bytes,
) -> Result<Vec<(crate::format::BlockIndex, Vec<RecordBatch>)>, StreamError> {
    tokio::task::spawn_blocking(move || decode_object(&bytes))
        .await
        .map_err(|e| StreamError::Failed(format!("compaction: decoding stopped: {e}")))?
        .map_err(|e| StreamError::Storage(format!("object {object_id} is corrupt: {e}")))
}

/// Builds an object of `batches` (stream id, batch; in order) on the blocking pool, for the
/// same reason as [`decode_off_runtime`]: building copies every byte of it.
async fn build_off_runtime(
    block_bytes: usize,
    batches: Vec<(u64, RecordBatch)>,
) -> Result<Bytes, StreamError> {
    tokio::task::spawn_blocking(move || {
        let mut builder = ObjectBuilder::new(block_bytes);
        for (stream_id, b) in &batches {
            builder
                .push(*stream_id, b)
                .map_err(|e| StreamError::Failed(format!("compaction: {e}")))?;
        }
        Ok(builder.finish().0)
    })
    .await
    .map_err(|e| StreamError::Failed(format!("compaction: building stopped: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compaction_slows_down_only_for_writes_it_cannot_keep_up_with() {
        let mib = 1 << 20;
        assert_eq!(pace(64 * mib, 8 * mib, 0), 64 * mib);
        // Writes it keeps up with at full pace, and writes it could not keep up with.
        assert_eq!(pace(64 * mib, 8 * mib, 32 * mib), 64 * mib);
        assert_eq!(pace(64 * mib, 8 * mib, 33 * mib), 8 * mib);
        assert_eq!(pace(64 * mib, 8 * mib, 200 * mib), 8 * mib);
        // A floor above the ceiling is the ceiling; a zero pace would never end a wait.
        assert_eq!(pace(4 * mib, 8 * mib, 200 * mib), 4 * mib);
        assert_eq!(pace(64 * mib, 0, 200 * mib), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_yields_its_pace_to_the_writes() {
        let mib = 1 << 20;
        let config = CompactionConfig {
            max_bytes_per_sec: 64 * mib,
            min_bytes_per_sec: 8 * mib,
            ..CompactionConfig::default()
        };
        // Each object waits for the time the one before it booked: 8 MiB at the pace left.
        let waited = |append_rate: u64| {
            let config = config.clone();
            async move {
                let rate = move || append_rate;
                let mut pacer = Pacer::new(&config, &rate);
                for _ in 0..3 {
                    pacer.take(8 * mib).await;
                }
                pacer.paced
            }
        };
        assert_eq!(waited(0).await, Duration::from_millis(250), "64 MiB/s");
        assert_eq!(
            waited(32 * mib).await,
            Duration::from_millis(250),
            "kept up with"
        );
        assert_eq!(
            waited(200 * mib).await,
            Duration::from_secs(2),
            "the 8 MiB/s floor"
        );
    }

    #[test]
    fn a_rate_is_measured_over_windows_of_a_second_or_more() {
        let t0 = tokio::time::Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut w = RateWindow::new();
        assert_eq!(w.observe(at(0), 1_000), 0, "no window yet");
        assert_eq!(
            w.observe(at(500), 9_000),
            0,
            "half a window is not measured"
        );
        assert_eq!(w.observe(at(2_000), 21_000), 10_000, "20 000 bytes in 2 s");
        assert_eq!(
            w.observe(at(2_900), 90_000),
            10_000,
            "the last whole window's rate"
        );
        assert_eq!(w.observe(at(3_000), 21_000 + 3_000), 3_000);
        assert_eq!(w.observe(at(13_000), 24_000), 0, "an idle window");
    }

    #[test]
    fn a_run_is_cut_into_pieces_that_cover_it() {
        let batch = |base_offset, size| RecordBatch {
            base_offset,
            count: 10,
            timestamp_ms: 0,
            payload: Bytes::from(vec![0u8; size]),
        };
        let batches = vec![
            batch(0, 400),
            batch(10, 400),
            batch(20, 900),
            batch(30, 100),
        ];
        let pieces = cut_run(0, 40, batches.clone(), 800);
        let bounds: Vec<(u64, u64, usize)> =
            pieces.iter().map(|(s, e, b)| (*s, *e, b.len())).collect();
        // A batch larger than the bound is a piece of its own; the pieces meet end to start.
        assert_eq!(bounds, vec![(0, 20, 2), (20, 30, 1), (30, 40, 1)]);
        assert_eq!(cut_run(0, 40, batches, 10_000).len(), 1);
    }
}
