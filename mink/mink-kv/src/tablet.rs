//! One bucket of a primary-key table: the working copy, the overlay of writes in flight, and
//! the bucket's stream, which holds the changelog and is the truth.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use mink_log::LogTablet;
use mink_log::codec::Compression;
use s3stream::{Appending, S3Stream, WriterBatchId};
use tokio::sync::{mpsc, oneshot};

use crate::changelog::{self, ChangeType};
use crate::definition::KvTableDef;
use crate::merge::{self, AutoIds, KvWrite};
use crate::rows::{self, RowCodec};
use crate::store::{KvStore, StoreSnapshot};
use crate::{KeyChange, KvError, KvResult};

/// How long an open waits for an earlier tablet of the bucket to let go of its working copy.
const OPEN_WAIT: Duration = Duration::from_secs(2);

/// How far a stored changelog read goes per fetch while replaying.
const REPLAY_BYTES: usize = 8 << 20;

/// The answer to a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteAck {
    /// Offsets `[base, end)` of the changelog rows stored; `None` when the write changed
    /// nothing and had no writer id (nothing was appended).
    pub offsets: Option<(u64, u64)>,
    /// A retried idempotent batch: the offsets are the original write's.
    pub duplicate: bool,
    /// Changelog rows the write produced (0 for a duplicate or a write that changed nothing).
    pub changes: usize,
}

/// The latest KV snapshot of a bucket (from the metadata log), to rebuild from.
#[derive(Clone, Debug)]
pub struct SnapshotSource {
    pub objects: Arc<dyn object_store::ObjectStore>,
    pub location: object_store::path::Path,
    /// The snapshot holds every change below this offset.
    pub log_offset: u64,
}

/// A submitted write (see [`KvTablet::submit`]): resolves once acknowledged or failed.
#[must_use = "a write is only acknowledged once this resolves"]
#[derive(Debug)]
pub struct PendingKv(oneshot::Receiver<KvResult<WriteAck>>);

impl Future for PendingKv {
    type Output = KvResult<WriteAck>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(KvError::Aborted("the tablet closed".into()))))
    }
}

/// Settings of a tablet.
#[derive(Clone, Debug)]
pub struct KvTabletConfig {
    pub compression: Compression,
    /// How often the working copy is forced to disk (between, commits are not fsynced).
    pub sync_interval: Duration,
    /// What the working copy belongs to (cluster, table, stream). A copy found at the path
    /// with another identity (another cluster's, a dropped table's) is discarded, not used.
    pub identity: String,
    /// The metadata sequence auto-increment values come from (one per table; default: one
    /// per stream).
    pub auto_increment_sequence: String,
    /// Stamps the changelog (`_commit_timestamp`).
    pub clock: Arc<dyn mink_metadata::Clock>,
}

impl Default for KvTabletConfig {
    fn default() -> Self {
        KvTabletConfig {
            compression: Compression::Zstd,
            sync_interval: Duration::from_secs(1),
            identity: String::new(),
            auto_increment_sequence: String::new(),
            clock: mink_metadata::system_clock(),
        }
    }
}

/// A bucket of a primary-key table on this node. Writes need the bucket's stream open here
/// (the leader); lookups and scans read the working copy, which holds only acknowledged rows.
#[derive(Clone)]
pub struct KvTablet {
    inner: Arc<Inner>,
}

struct Inner {
    def: Arc<KvTableDef>,
    codec: RowCodec,
    log: LogTablet,
    view: SchemaRef,
    store: Arc<KvStore>,
    streams: S3Stream,
    stream_id: u64,
    /// Held from the merge until the append is submitted: one changelog at a time, in order.
    /// Guards the auto-increment values at hand.
    write: tokio::sync::Mutex<AutoIds>,
    auto_increment_sequence: String,
    clock: Arc<dyn mink_metadata::Clock>,
    overlay: Mutex<Overlay>,
    applier: mpsc::UnboundedSender<InFlight>,
    /// The stream's epoch when the tablet opened: it writes only while that holds.
    epoch: u64,
    /// Set for good once an append or the working copy fails: every write merged after it
    /// may have read what failed, so the tablet refuses writes until reopened (replayed).
    failed: Mutex<Option<String>>,
}

/// The after-images of writes appended but not yet applied, by key: the base offset of the
/// write that set it and the encoded row (`None`: deleted).
#[derive(Default)]
struct Overlay {
    rows: HashMap<Vec<u8>, (u64, Option<Vec<u8>>)>,
}

/// What a queued write waits for before it is answered, in order.
enum Waiting {
    /// Its changelog's durability.
    Append(Appending),
    /// Nothing: it changed nothing and appended nothing, but it may have read the writes
    /// before it, so it is answered after them.
    Nothing,
    /// A retried idempotent batch, answered with its original offsets once the writes
    /// before it are visible.
    Duplicate(WriteAck),
}

struct InFlight {
    waiting: Waiting,
    base: u64,
    puts: Vec<KeyChange>,
    changes: usize,
    reply: oneshot::Sender<KvResult<WriteAck>>,
}

impl std::fmt::Debug for KvTablet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvTablet")
            .field("stream_id", &self.inner.stream_id)
            .finish_non_exhaustive()
    }
}

impl KvTablet {
    /// Opens the tablet of a bucket whose stream `stream_id` is open on this node at the
    /// bucket's leader epoch: brings the working copy at `store_path` up to the stream's
    /// committed end (from the bucket's latest KV `snapshot` when the copy is behind it or
    /// unusable) by replaying the changelog, then serves.
    pub async fn open(
        streams: S3Stream,
        stream_id: u64,
        def: Arc<KvTableDef>,
        store_path: &Path,
        config: &KvTabletConfig,
        snapshot: Option<&SnapshotSource>,
    ) -> KvResult<Self> {
        let codec = RowCodec::new(&def)?;
        let storage = changelog::storage_schema(&def.schema);
        let info = streams.info(stream_id)?;
        let log = LogTablet::new(streams.clone(), stream_id, storage, config.compression)
            .at_epoch(info.epoch);
        let format = format!("{}|{}|stream {stream_id}", rows::FORMAT, config.identity);
        // A tablet being dropped (a previous opening of this bucket) may hold the file for a
        // moment longer; one still in use holds it until its writers give up.
        let waited = std::time::Instant::now();
        let store = loop {
            match KvStore::open(store_path, &format, config.sync_interval) {
                Err(KvError::Aborted(_)) if waited.elapsed() < OPEN_WAIT => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                r => break Arc::new(r?),
            }
        };
        let mut from = store.next_offset()?;
        let usable = from >= info.start_offset && from <= info.end_offset;
        match snapshot {
            // The snapshot is further along than the copy (or the copy is of no use).
            Some(s) if !usable || s.log_offset > from => {
                let rows =
                    crate::snapshot::restore(&s.objects, &s.location, s.log_offset, &codec, &store)
                        .await?;
                tracing::info!(
                    stream_id,
                    rows,
                    offset = s.log_offset,
                    "restored a KV snapshot"
                );
                from = s.log_offset;
            }
            _ if usable => {}
            _ if info.start_offset == 0 => {
                store.reset(0)?;
                from = 0;
            }
            _ => {
                return Err(KvError::Store(format!(
                    "the working copy is at offset {from}, the stream holds [{}, {}) and there \
                     is no KV snapshot to rebuild from",
                    info.start_offset, info.end_offset
                )));
            }
        }
        replay(&log, &codec, &store, from, info.end_offset).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            view: changelog::view_schema(&def.schema),
            def,
            codec,
            log,
            store,
            streams,
            stream_id,
            write: tokio::sync::Mutex::new(AutoIds::default()),
            clock: Arc::clone(&config.clock),
            auto_increment_sequence: if config.auto_increment_sequence.is_empty() {
                format!("auto-increment/stream-{stream_id}")
            } else {
                config.auto_increment_sequence.clone()
            },
            overlay: Mutex::new(Overlay::default()),
            applier: tx,
            epoch: info.epoch,
            failed: Mutex::new(None),
        });
        tokio::spawn(apply_loop(Arc::downgrade(&inner), rx));
        Ok(KvTablet { inner })
    }

    pub fn definition(&self) -> &Arc<KvTableDef> {
        &self.inner.def
    }

    /// Writes a batch: a retry of an idempotent batch is answered with its original offsets
    /// first; otherwise the changelog is computed against the working copy and the writes in
    /// flight, appended, and applied once durable. Returns once acknowledged (durable and
    /// visible to lookups), or failed with nothing visible.
    pub async fn write(&self, write: KvWrite, writer: Option<WriterBatchId>) -> KvResult<WriteAck> {
        self.submit(write, writer).await?.await
    }

    /// [`KvTablet::write`] in two steps: returns once the changelog is submitted (writes
    /// submitted one after another are merged and stored in that order); the [`PendingKv`]
    /// resolves with the acknowledgement. For pipelining.
    pub async fn submit(
        &self,
        write: KvWrite,
        writer: Option<WriterBatchId>,
    ) -> KvResult<PendingKv> {
        let inner = &self.inner;
        let mut auto_ids = inner.write.lock().await;
        self.check_writable()?;
        let (tx, rx) = oneshot::channel();
        let queue = |f: InFlight| {
            inner
                .applier
                .send(f)
                .map_err(|_| KvError::Aborted("the tablet is closing".into()))
        };
        if let Some(w) = writer
            && let Some(ack) = inner.streams.check_writer_batch(inner.stream_id, w)?
        {
            queue(InFlight {
                waiting: Waiting::Duplicate(WriteAck {
                    offsets: Some((ack.base_offset, ack.end_offset)),
                    duplicate: true,
                    changes: 0,
                }),
                base: ack.base_offset,
                puts: Vec::new(),
                changes: 0,
                reply: tx,
            })?;
            return Ok(PendingKv(rx));
        }
        if inner.def.auto_increment.is_some() {
            // A batch that cannot be stored takes no values.
            mink_log::codec::check_batch(&inner.def.write_schema(), &write.batch)?;
            self.reserve_ids(&mut auto_ids, write.batch.num_rows())
                .await?;
        }
        let merged = merge::merge(
            &inner.def,
            &inner.codec,
            &write,
            &mut |keys| self.current(keys),
            &mut auto_ids,
        )?;
        let commit_ms = i64::try_from(inner.clock.now_ms()).unwrap_or(i64::MAX);
        let stored = match merge::changelog_batch(&inner.log.schema, &merged, commit_ms)? {
            Some(batch) => Some(batch),
            // An idempotent writer's batch is recorded even when it changes nothing, so its
            // next sequence follows on.
            None if writer.is_some() && write.batch.num_rows() > 0 => {
                Some(changelog::stored_batch(
                    &inner.log.schema,
                    marker_row(&inner.def, &write.batch)?,
                    vec![ChangeType::Noop as i8],
                    commit_ms,
                )?)
            }
            None => None,
        };
        let waiting = match &stored {
            Some(batch) => match inner.log.submit(batch, writer).await {
                Ok(a) => Waiting::Append(a),
                Err(e) => {
                    // A refusal of the batch itself (too large) leaves the tablet usable;
                    // anything else means the stream is no longer ours at this epoch.
                    if !matches!(e, mink_log::LogError::Invalid(_)) {
                        self.fail(&e.to_string());
                    }
                    return Err(e.into());
                }
            },
            None => Waiting::Nothing,
        };
        let base = match &waiting {
            Waiting::Append(a) => a.base_offset(),
            _ => 0,
        };
        if matches!(&waiting, Waiting::Append(a) if !a.is_duplicate()) {
            let mut overlay = inner.overlay.lock().expect("overlay lock");
            for (key, value) in &merged.puts {
                overlay.rows.insert(key.clone(), (base, value.clone()));
            }
        }
        queue(InFlight {
            waiting,
            base,
            changes: merged.changelog_rows(),
            puts: merged.puts,
            reply: tx,
        })?;
        drop(auto_ids);
        Ok(PendingKv(rx))
    }

    /// Refuses writes once the tablet failed or the stream moved on from its epoch.
    fn check_writable(&self) -> KvResult<()> {
        if let Some(why) = self.inner.failed.lock().expect("failed lock").clone() {
            return Err(KvError::Aborted(format!(
                "this bucket's tablet failed ({why}); it reopens on the next request"
            )));
        }
        let info = self.inner.streams.info(self.inner.stream_id)?;
        if info.epoch != self.inner.epoch {
            self.fail(&format!(
                "the stream moved from epoch {} to {}",
                self.inner.epoch, info.epoch
            ));
            return Err(KvError::Aborted(
                "this bucket was reopened (a leader change); retry".into(),
            ));
        }
        Ok(())
    }

    /// Marks the tablet failed for good and drops the overlay (nothing in it will apply).
    fn fail(&self, why: &str) {
        fail(&self.inner, why);
    }

    /// Whether the tablet failed and must be reopened.
    pub fn is_failed(&self) -> bool {
        self.inner.failed.lock().expect("failed lock").is_some()
    }

    /// Makes sure at least `n` auto-increment values are at hand, taking a range of the
    /// table's sequence from the metadata log when not. Values never come back: a range lost
    /// with a leader leaves a gap, never a duplicate.
    async fn reserve_ids(&self, ids: &mut AutoIds, n: usize) -> KvResult<()> {
        if ids.remaining() >= n as u64 {
            return Ok(());
        }
        let count = self.inner.def.auto_increment_cache.max(n as u64);
        let proposed = self
            .inner
            .streams
            .sink()
            .propose(mink_metadata::Command::Allocate(mink_metadata::Allocate {
                sequence: self.inner.auto_increment_sequence.clone(),
                count,
            }))
            .await
            .map_err(|e| KvError::Aborted(format!("auto-increment values: {e}")))?;
        match proposed.result {
            Ok(outcome) => match outcome.into_reply() {
                mink_metadata::Reply::Range(r) => {
                    *ids = AutoIds {
                        next: i64::try_from(r.start).unwrap_or(i64::MAX),
                        end: i64::try_from(r.end).unwrap_or(i64::MAX),
                    };
                    Ok(())
                }
                other => Err(KvError::Store(format!("unexpected reply {other:?}"))),
            },
            Err(r) => Err(KvError::Invalid(format!("auto-increment values: {r}"))),
        }
    }

    /// The rows of `keys` as the writer sees them: in-flight writes first, then the copy.
    fn current(&self, keys: &[&[u8]]) -> KvResult<Vec<Option<Vec<u8>>>> {
        let mut out: Vec<Option<Option<Vec<u8>>>> = {
            let overlay = self.inner.overlay.lock().expect("overlay lock");
            keys.iter()
                .map(|k| overlay.rows.get(*k).map(|(_, v)| v.clone()))
                .collect()
        };
        let missing: Vec<&[u8]> = keys
            .iter()
            .zip(&out)
            .filter(|(_, o)| o.is_none())
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            let mut stored = self.inner.store.get_many(&missing)?.into_iter();
            for o in out.iter_mut().filter(|o| o.is_none()) {
                *o = Some(stored.next().flatten());
            }
        }
        Ok(out.into_iter().map(Option::flatten).collect())
    }

    /// Point lookup: the rows stored under the keys given as the physical key columns (in key
    /// order), in the order asked; missing keys are left out.
    pub fn lookup(&self, key_columns: &[ArrayRef]) -> KvResult<RecordBatch> {
        Ok(self.lookup_positions(key_columns)?.0)
    }

    /// [`KvTablet::lookup`], with the position (among the keys asked) of each row found.
    pub fn lookup_positions(
        &self,
        key_columns: &[ArrayRef],
    ) -> KvResult<(RecordBatch, Vec<usize>)> {
        let keys = self.inner.codec.keys_of(key_columns)?;
        let keys: Vec<&[u8]> = (0..keys.num_rows()).map(|i| keys.row(i).data()).collect();
        self.inner.store.with_rows(&keys, |found| {
            let positions = found
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_some())
                .map(|(i, _)| i)
                .collect();
            Ok((self.batch(found.iter().flatten().copied())?, positions))
        })
    }

    /// Prefix lookup: every row whose bucket key equals one of the given bucket-key rows, in
    /// key order per prefix.
    pub fn prefix_lookup(&self, bucket_columns: &[ArrayRef]) -> KvResult<RecordBatch> {
        if !self.inner.def.supports_prefix_lookup() {
            return Err(KvError::Invalid(
                "prefix lookups need a bucket key that is a proper prefix of the primary key \
                 (without partition keys)"
                    .into(),
            ));
        }
        let prefixes = self.inner.codec.prefixes_of(bucket_columns)?;
        let snapshot = self.inner.store.snapshot()?;
        let mut values = Vec::new();
        for i in 0..prefixes.num_rows() {
            let p = prefixes.row(i).data();
            values.extend(
                snapshot
                    .scan(p, Some(p), usize::MAX)?
                    .into_iter()
                    .map(|(_, v)| v),
            );
        }
        self.batch(values.iter().map(Vec::as_slice))
    }

    /// A scan of every row as of one offset.
    pub fn snapshot(&self) -> KvResult<KvScan> {
        Ok(KvScan {
            snapshot: self.inner.store.snapshot()?,
            tablet: self.clone(),
            next: Some(Vec::new()),
        })
    }

    /// Reads the changelog from `offset` (about `max_bytes` of stored data) as changelog view
    /// batches with their offsets.
    pub async fn read_changelog(
        &self,
        offset: u64,
        max_bytes: usize,
    ) -> KvResult<Vec<mink_log::ReadBatch>> {
        let batches = self.inner.log.read(offset, max_bytes, &[]).await?;
        batches
            .into_iter()
            .map(|b| {
                // A writer's marker leaves a batch without rows: continue from `end_offset`.
                Ok(mink_log::ReadBatch {
                    batch: changelog::to_view(&self.inner.view, &b.batch, b.base_offset)?,
                    ..b
                })
            })
            .collect()
    }

    /// The changelog offset the working copy has reached.
    pub fn applied_offset(&self) -> KvResult<u64> {
        self.inner.store.next_offset()
    }

    fn batch<'a>(&self, values: impl Iterator<Item = &'a [u8]>) -> KvResult<RecordBatch> {
        let values: Vec<&[u8]> = values.collect();
        let schema = self.inner.def.schema.clone();
        if values.is_empty() {
            return Ok(RecordBatch::new_empty(schema));
        }
        Ok(RecordBatch::try_new(
            schema,
            self.inner.codec.decode(values)?,
        )?)
    }
}

/// Rows of a tablet at one offset, in key order, page by page.
#[derive(Debug)]
pub struct KvScan {
    snapshot: StoreSnapshot,
    tablet: KvTablet,
    /// Where the next page starts; `None` once done.
    next: Option<Vec<u8>>,
}

impl KvScan {
    /// The offset the scan is consistent at: every change below it, none at or above.
    pub fn offset(&self) -> u64 {
        self.snapshot.next_offset
    }

    /// The next page of at most `max_rows` rows, `None` at the end.
    pub fn next_batch(&mut self, max_rows: usize) -> KvResult<Option<RecordBatch>> {
        let Some(from) = self.next.take() else {
            return Ok(None);
        };
        let rows = self.snapshot.scan(&from, None, max_rows.max(1))?;
        if rows.is_empty() {
            return Ok(None);
        }
        if rows.len() == max_rows.max(1) {
            let mut after = rows[rows.len() - 1].0.clone();
            after.push(0);
            self.next = Some(after);
        }
        Ok(Some(
            self.tablet.batch(rows.iter().map(|(_, v)| v.as_slice()))?,
        ))
    }
}

/// Applies durable writes to the working copy in order and answers their writers. After any
/// failure (an append, or the working copy itself) the tablet is failed for good: the writes
/// queued after it were merged on top of what failed, so they are refused even if their own
/// append was stored (a retry of an idempotent batch is then answered as a duplicate by the
/// reopened tablet), and nothing more is applied until it is reopened and replayed.
async fn apply_loop(inner: std::sync::Weak<Inner>, mut rx: mpsc::UnboundedReceiver<InFlight>) {
    // Writes durable and good, not yet applied: applied together in one transaction as soon
    // as the next write is not durable yet (appends of one flush complete together).
    let mut group: Vec<Applied> = Vec::new();
    loop {
        let next = if group.is_empty() {
            rx.recv().await
        } else {
            match rx.try_recv() {
                Ok(f) => Some(f),
                Err(_) => {
                    apply_group(&inner, &mut group);
                    rx.recv().await
                }
            }
        };
        let Some(f) = next else { break };
        let result = match f.waiting {
            Waiting::Append(mut a) => match futures::FutureExt::now_or_never(&mut a) {
                Some(r) => r,
                None => {
                    apply_group(&inner, &mut group);
                    a.await
                }
            }
            .map(Some)
            .map_err(KvError::from),
            Waiting::Nothing => Ok(None),
            Waiting::Duplicate(ack) => {
                // Answered once the writes before it are visible.
                apply_group(&inner, &mut group);
                let _ = f.reply.send(Ok(ack));
                continue;
            }
        };
        let Some(strong) = inner.upgrade() else {
            let _ = f
                .reply
                .send(Err(KvError::Aborted("the tablet closed".into())));
            continue;
        };
        let failed = strong.failed.lock().expect("failed lock").clone();
        match (result, failed) {
            (Ok(Some(ack)), None) if !ack.duplicate => {
                group.push(Applied {
                    puts: f.puts,
                    base: f.base,
                    ack: WriteAck {
                        offsets: Some((ack.base_offset, ack.end_offset)),
                        duplicate: false,
                        changes: f.changes,
                    },
                    end: ack.end_offset,
                    reply: f.reply,
                });
                if group.len() >= MAX_APPLY_GROUP {
                    apply_group(&inner, &mut group);
                }
            }
            (result, failed) => {
                apply_group(&inner, &mut group);
                let answer = match (result, failed) {
                    (Ok(Some(ack)), _) if ack.duplicate => Ok(WriteAck {
                        offsets: Some((ack.base_offset, ack.end_offset)),
                        duplicate: true,
                        changes: 0,
                    }),
                    (Ok(_), Some(why)) => Err(KvError::Aborted(format!(
                        "an earlier write of this bucket failed ({why}); retry"
                    ))),
                    (Ok(_), None) => Ok(WriteAck {
                        offsets: None,
                        duplicate: false,
                        changes: 0,
                    }),
                    (Err(e), _) => {
                        fail(&strong, &e.to_string());
                        Err(e)
                    }
                };
                let _ = f.reply.send(answer);
            }
        }
    }
    apply_group(&inner, &mut group);
}

/// Most durable writes applied in one transaction of the working copy.
const MAX_APPLY_GROUP: usize = 256;

/// A durable write waiting to be applied and answered.
struct Applied {
    puts: Vec<KeyChange>,
    base: u64,
    end: u64,
    ack: WriteAck,
    reply: oneshot::Sender<KvResult<WriteAck>>,
}

/// Applies a group of durable writes in one transaction, then answers them. If the working
/// copy fails they are stored but not applied: a retry is answered as a duplicate once the
/// reopened tablet has replayed them.
fn apply_group(inner: &std::sync::Weak<Inner>, group: &mut Vec<Applied>) {
    if group.is_empty() {
        return;
    }
    let writes = std::mem::take(group);
    let Some(inner) = inner.upgrade() else {
        for w in writes {
            let _ = w
                .reply
                .send(Err(KvError::Aborted("the tablet closed".into())));
        }
        return;
    };
    let end = writes.last().map_or(0, |w| w.end);
    let puts: Vec<&[KeyChange]> = writes.iter().map(|w| w.puts.as_slice()).collect();
    let applied = inner.store.apply_all(&puts, end);
    match applied {
        Ok(()) => {
            {
                let mut overlay = inner.overlay.lock().expect("overlay lock");
                for w in &writes {
                    for (key, _) in &w.puts {
                        if overlay.rows.get(key).is_some_and(|(b, _)| *b == w.base) {
                            overlay.rows.remove(key);
                        }
                    }
                }
            }
            for w in writes {
                let _ = w.reply.send(Ok(w.ack));
            }
        }
        Err(e) => {
            fail(&inner, &e.to_string());
            for w in writes {
                let _ = w.reply.send(Err(KvError::Aborted(format!(
                    "the working copy failed ({e}); the write is stored, retry to confirm"
                ))));
            }
        }
    }
}

/// Marks a tablet failed for good (the first reason is kept) and drops its overlay.
fn fail(inner: &Inner, why: &str) {
    let mut failed = inner.failed.lock().expect("failed lock");
    if failed.is_none() {
        tracing::warn!(
            stream_id = inner.stream_id,
            reason = why,
            "KV tablet failed"
        );
        *failed = Some(why.to_string());
    }
    inner.overlay.lock().expect("overlay lock").rows.clear();
}

/// Brings the working copy from `from` to `end` by overwriting with after-images.
async fn replay(
    log: &LogTablet,
    codec: &RowCodec,
    store: &KvStore,
    mut from: u64,
    end: u64,
) -> KvResult<()> {
    while from < end {
        let batches = log.read(from, REPLAY_BYTES, &[]).await?;
        if batches.is_empty() {
            return Err(KvError::Store(format!(
                "the changelog ends at {from}, before the committed end {end}"
            )));
        }
        let mut puts: Vec<KeyChange> = Vec::new();
        for b in &batches {
            puts.extend(changelog::key_changes(codec, &b.batch)?);
            from = b.base_offset + b.batch.num_rows() as u64;
        }
        store.apply(&puts, from.min(end))?;
    }
    store.sync()?;
    Ok(())
}

/// The row of a writer's marker: the write's first row, with a zero where it is null in a
/// column the stored schema wants filled (the auto-increment column).
fn marker_row(def: &KvTableDef, batch: &RecordBatch) -> KvResult<Vec<ArrayRef>> {
    let row = batch.slice(0, 1);
    row.columns()
        .iter()
        .zip(def.schema.fields())
        .map(|(c, f)| {
            if f.is_nullable() || c.null_count() == 0 {
                return Ok(c.clone());
            }
            let zero = arrow::array::Int64Array::from(vec![0]);
            Ok(arrow::compute::cast(&zero, f.data_type())?)
        })
        .collect()
}
