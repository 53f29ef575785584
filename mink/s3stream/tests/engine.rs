//! The stream engine, against each object store: memory, the durable local filesystem, and
//! moto (a real S3-compatible server, started by scripts/test.sh). Metadata is a real SQLite
//! command log shared by the engines ("nodes") of a test.
#![allow(clippy::print_stderr, clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use mink_metadata::{Command, ExpirePreparedObjects};
use mink_sql::{SinkConfig, SqliteStore};
use object_store::{ObjectStore, ObjectStoreExt as _};
use s3stream::format::RecordBatch;
use s3stream::store::{self, FaultyObjectStore, ObjectFaults};
use s3stream::*;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Local,
    S3,
}

/// One test's world: a metadata database and an object store, shared by its nodes.
struct World {
    _dir: tempfile::TempDir,
    meta_url: String,
    store: Arc<dyn ObjectStore>,
}

impl World {
    fn new(kind: Kind) -> Option<World> {
        let dir = tempfile::tempdir().unwrap();
        let meta_url = format!("sqlite://{}", dir.path().join("meta.db").display());
        let store = match kind {
            Kind::Memory => store::open("memory://").unwrap(),
            Kind::Local => store::open(dir.path().join("objects").to_str().unwrap()).unwrap(),
            Kind::S3 => {
                let endpoint = match std::env::var("MINK_TEST_S3_ENDPOINT") {
                    Ok(e) if !e.is_empty() => e,
                    _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
                        panic!("CI=true but MINK_TEST_S3_ENDPOINT is not set")
                    }
                    _ => return None,
                };
                let bucket = std::env::var("MINK_TEST_S3_BUCKET").unwrap();
                store::open(&format!(
                    "s3://{bucket}/engine-{:016x}?endpoint={endpoint}&allow_http=true\
                     &region=us-east-1&access_key_id=test&secret_access_key=test",
                    rand::random::<u64>()
                ))
                .unwrap()
            }
        };
        Some(World {
            _dir: dir,
            meta_url,
            store,
        })
    }

    async fn node(&self, node_id: u64) -> S3Stream {
        self.node_on(node_id, Arc::clone(&self.store), config())
            .await
    }

    async fn node_on(
        &self,
        node_id: u64,
        store: Arc<dyn ObjectStore>,
        config: EngineConfig,
    ) -> S3Stream {
        self.node_with(node_id, store, config, None).await
    }

    /// A node on the world's store under faults of its own (seeded by `seed`).
    async fn faulty_node(
        &self,
        node_id: u64,
        seed: u64,
        config: EngineConfig,
    ) -> (S3Stream, Arc<ObjectFaults>) {
        let faults = ObjectFaults::new(seed);
        let store = Arc::new(FaultyObjectStore::new(
            Arc::clone(&self.store),
            Arc::clone(&faults),
        ));
        (self.node_on(node_id, store, config).await, faults)
    }

    /// A node whose metadata connection runs under `meta_faults`.
    async fn node_with(
        &self,
        node_id: u64,
        store: Arc<dyn ObjectStore>,
        config: EngineConfig,
        meta_faults: Option<Arc<mink_sql::Faults>>,
    ) -> S3Stream {
        let mut meta: Arc<dyn mink_sql::LogStore> =
            Arc::new(SqliteStore::connect(&self.meta_url).await.unwrap());
        if let Some(faults) = meta_faults {
            meta = Arc::new(mink_sql::FaultyStore::new(meta, faults));
        }
        let mut c = SinkConfig::new(node_id);
        c.lease_ttl = Duration::from_millis(1000);
        c.tail_poll_interval = Duration::from_millis(5);
        let sink = mink_sql::Sink::start(meta, c).await.unwrap();
        S3Stream::start(sink, store, config)
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        flush_delay: Duration::from_millis(5),
        flush_bytes: 64 << 10,
        block_bytes: 4 << 10,
        prepare_batch: 8,
        max_backoff: Duration::from_millis(50),
        ..EngineConfig::default()
    }
}

/// A new stream, open on `node` at epoch 1.
async fn new_stream(node: &S3Stream) -> u64 {
    let s = node.create_streams(1).await.unwrap();
    node.open(s, 1).await.unwrap();
    s
}

/// `n` new streams, open on `node` at epoch 1.
async fn new_streams(node: &S3Stream, n: usize) -> Vec<u64> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        streams.push(new_stream(node).await);
    }
    streams
}

fn payload(stream: u64, offset: u64) -> Bytes {
    Bytes::from(format!("stream {stream} offset {offset} ").repeat(8))
}

/// Reads a whole stream from `from`, checking offsets are contiguous.
async fn read_all(engine: &S3Stream, stream_id: u64, from: u64) -> Vec<RecordBatch> {
    let end = engine.info(stream_id).unwrap().end_offset;
    let mut out: Vec<RecordBatch> = Vec::new();
    let mut next = from;
    while next < end {
        let batches = engine.fetch(stream_id, next, 16 << 10).await.unwrap();
        assert!(!batches.is_empty(), "no data at {next} below the end {end}");
        for b in batches {
            assert!(
                b.base_offset <= next && b.end_offset() > next,
                "gap at {next}: {b:?}"
            );
            next = b.end_offset();
            out.push(untimed(b));
        }
    }
    out
}

/// `b` without its time: appends are stamped with the engine's clock, which tests compare
/// apart (`batches_are_found_by_time`).
fn untimed(b: RecordBatch) -> RecordBatch {
    assert!(b.timestamp_ms > 0, "an append without a time: {b:?}");
    RecordBatch {
        timestamp_ms: 0,
        ..b
    }
}

macro_rules! suite {
    ($name:ident) => {
        mod $name {
            suite!(@case $name, memory, Memory);
            suite!(@case $name, local, Local);
            suite!(@case $name, s3, S3);
        }
    };
    (@case $name:ident, $case:ident, $kind:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            let Some(world) = super::World::new(super::Kind::$kind) else {
                eprintln!("skipped: MINK_TEST_S3_ENDPOINT is not set");
                return;
            };
            super::$name(world).await;
        }
    };
}

async fn appends_are_read_back_in_order(world: World) {
    let engine = world.node(1).await;
    let first = engine.create_streams(3).await.unwrap();
    for s in first..first + 3 {
        assert_eq!(engine.open(s, 1).await.unwrap().end_offset, 0);
    }
    // Concurrent appends to three streams share stream-set objects.
    let mut tasks = Vec::new();
    for s in first..first + 3 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut acks = Vec::new();
            for i in 0..40u64 {
                let count = (i % 3 + 1) as u32;
                acks.push(engine.append(s, count, payload(s, i), None).await.unwrap());
            }
            acks
        }));
    }
    for (k, t) in tasks.into_iter().enumerate() {
        let acks = t.await.unwrap();
        let mut next = 0;
        for a in &acks {
            assert_eq!(a.base_offset, next, "stream {k}: offsets are contiguous");
            next = a.end_offset;
        }
    }
    let flushes = engine.stats().flushes.load(Ordering::Relaxed);
    assert!(
        flushes < 120,
        "{flushes} flushes for 120 appends: nothing was batched"
    );
    // From the log cache, then from object storage on a node with cold caches.
    let hot = read_all(&engine, first + 1, 0).await;
    assert_eq!(hot.len(), 40);
    let cold = world.node(2).await;
    let batches = read_all(&cold, first + 1, 0).await;
    assert_eq!(batches, hot);
    assert!(cold.stats().object_reads.load(Ordering::Relaxed) > 0);
    // Reading from the middle of a batch returns that batch.
    let mid = hot[5].base_offset + u64::from(hot[5].count) - 1;
    let got = cold.fetch(first + 1, mid, 1).await.unwrap().remove(0);
    assert_eq!(untimed(got), hot[5]);
    // At the end: nothing; past it: out of range.
    let end = cold.info(first + 1).unwrap().end_offset;
    assert!(cold.fetch(first + 1, end, 1024).await.unwrap().is_empty());
    assert!(matches!(
        cold.fetch(first + 1, end + 1, 1024).await,
        Err(StreamError::OutOfRange { .. })
    ));
    engine.shutdown().await;
    cold.shutdown().await;
}
suite!(appends_are_read_back_in_order);

/// Flushes build in the buffers of committed objects, and what a reused buffer held before
/// never shows in what was stored (the local store keeps no reference to a PUT's bytes, so
/// the buffers come back; an in-memory store keeps them and they are never reused).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flushes_reuse_committed_object_buffers() {
    let world = World::new(Kind::Local).unwrap();
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    for i in 0..6u64 {
        // Each append waits for its ack: one flush each, built after the last one committed.
        engine.append(s, 1, payload(s, i), None).await.unwrap();
    }
    let reused = engine.stats().object_buffers_reused.load(Ordering::Relaxed);
    assert!(reused >= 4, "{reused} of 6 flushes reused a buffer");
    let hot = read_all(&engine, s, 0).await;
    let cold = world.node(2).await;
    assert_eq!(read_all(&cold, s, 0).await, hot);
    assert_eq!(hot.len(), 6);
}

async fn a_takeover_fences_the_old_owner(world: World) {
    let a = world.node(1).await;
    let b = world.node(2).await;
    let s = new_stream(&a).await;
    for i in 0..5 {
        a.append(s, 1, payload(s, i), None).await.unwrap();
    }
    // B takes the stream over at a higher epoch; it resumes at the committed end.
    let info = b.open(s, 2).await.unwrap();
    assert_eq!(info.end_offset, 5);
    let fenced = a.append(s, 1, payload(s, 99), None).await;
    assert!(
        matches!(fenced, Err(StreamError::Fenced { .. })),
        "{fenced:?}"
    );
    assert!(matches!(
        a.append(s, 1, payload(s, 100), None).await,
        Err(StreamError::Fenced { .. })
    ));
    assert!(
        a.failed().is_none(),
        "a fenced stream does not stop the engine"
    );
    let ack = b.append(s, 1, payload(s, 5), None).await.unwrap();
    assert_eq!(ack.base_offset, 5);
    // A lower epoch cannot take it back.
    assert!(matches!(
        a.open(s, 1).await,
        Err(StreamError::Fenced { .. })
    ));
    let all = read_all(&b, s, 0).await;
    assert_eq!(all.len(), 6);
    assert!(
        all.iter()
            .all(|b| !b.payload.starts_with(b"stream 1 offset 99"))
    );
    a.shutdown().await;
    b.shutdown().await;
}
suite!(a_takeover_fences_the_old_owner);

async fn idempotent_writers_are_answered_with_original_offsets(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    let w = |first, last| WriterBatchId {
        writer_id: 77,
        writer_epoch: 3,
        first_sequence: first,
        last_sequence: last,
        any_first_sequence: false,
    };
    let a = engine
        .append(s, 2, payload(s, 0), Some(w(0, 1)))
        .await
        .unwrap();
    let b = engine
        .append(s, 3, payload(s, 2), Some(w(2, 4)))
        .await
        .unwrap();
    assert!(!a.duplicate && !b.duplicate);
    // A retry of either batch gets its original offsets and writes nothing.
    let again = engine
        .append(s, 2, payload(s, 0), Some(w(0, 1)))
        .await
        .unwrap();
    assert_eq!(
        (again.base_offset, again.end_offset, again.duplicate),
        (0, 2, true)
    );
    let end = engine.info(s).unwrap().end_offset;
    assert_eq!(end, 5);
    // Skipping sequences, or an older writer epoch, is refused; so is a writer (or a new
    // epoch of one) that does not start at sequence 0.
    assert!(matches!(
        engine.append(s, 1, payload(s, 9), Some(w(9, 9))).await,
        Err(StreamError::OutOfOrderSequence { expected: 5, .. })
    ));
    for late in [
        WriterBatchId {
            writer_id: 78,
            ..w(3, 3)
        },
        WriterBatchId {
            writer_epoch: 4,
            ..w(5, 5)
        },
    ] {
        assert!(matches!(
            engine.append(s, 1, payload(s, 9), Some(late)).await,
            Err(StreamError::OutOfOrderSequence {
                expected: 0,
                got: _,
                ..
            })
        ));
    }
    let old = WriterBatchId {
        writer_epoch: 2,
        ..w(5, 5)
    };
    assert!(matches!(
        engine.append(s, 1, payload(s, 9), Some(old)).await,
        Err(StreamError::WriterFenced { .. })
    ));
    engine.shutdown().await;
    // After a crash, the new owner recognises the retry from the metadata alone.
    let next = world.node(2).await;
    next.open(s, 2).await.unwrap();
    let retry = next
        .append(s, 3, payload(s, 2), Some(w(2, 4)))
        .await
        .unwrap();
    assert_eq!(
        (retry.base_offset, retry.end_offset, retry.duplicate),
        (2, 5, true)
    );
    let c = next
        .append(s, 1, payload(s, 5), Some(w(5, 5)))
        .await
        .unwrap();
    assert_eq!(c.base_offset, 5);
    assert_eq!(read_all(&next, s, 0).await.len(), 3);
    // A writer that may start anywhere (a Kafka producer the stream holds no state for)
    // starts where it is, and goes on from there.
    let anywhere = |first, last| WriterBatchId {
        writer_id: 79,
        any_first_sequence: true,
        ..w(first, last)
    };
    let start = next
        .append(s, 1, payload(s, 9), Some(anywhere(40, 40)))
        .await
        .unwrap();
    assert!(!start.duplicate);
    assert!(matches!(
        next.append(s, 1, payload(s, 9), Some(anywhere(42, 42)))
            .await,
        Err(StreamError::OutOfOrderSequence { expected: 41, .. })
    ));
    next.append(s, 1, payload(s, 9), Some(anywhere(41, 41)))
        .await
        .unwrap();
    next.shutdown().await;
}
suite!(idempotent_writers_are_answered_with_original_offsets);

async fn batches_are_found_by_time(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    let time = |i: u64| if i == 30 { 5 } else { 1_000 + 10 * i as i64 };
    // Six objects of ten batches; 4 KiB blocks of ~200-byte batches: several blocks each.
    for round in 0..6u64 {
        let mut pending = Vec::new();
        for i in round * 10..round * 10 + 10 {
            pending.push(
                engine
                    .submit_at(s, Some(1), 1, payload(s, i), None, time(i))
                    .await
                    .unwrap(),
            );
        }
        futures::future::try_join_all(pending).await.unwrap();
    }
    let found = |engine: S3Stream, at: i64| async move {
        engine
            .offset_for_time(s, 0, at)
            .await
            .unwrap()
            .map(|b| (b.base_offset, b.timestamp_ms))
    };
    let cold = world.node(2).await;
    for node in [&engine, &cold] {
        assert_eq!(found(node.clone(), 0).await, Some((0, 1_000)));
        assert_eq!(found(node.clone(), 1_250).await, Some((25, 1_250)));
        assert_eq!(found(node.clone(), 1_249).await, Some((25, 1_250)));
        // Batch 30 went back in time: the first batch at or after the time is 31.
        assert_eq!(found(node.clone(), 1_291).await, Some((31, 1_310)));
        assert_eq!(found(node.clone(), 1_591).await, None, "nothing that late");
    }
    // Fetches return each batch's time.
    let fetched = cold.fetch(s, 30, 1).await.unwrap();
    assert_eq!((fetched[0].base_offset, fetched[0].timestamp_ms), (30, 5));
    // Trimmed batches are not found.
    engine.trim(s, 40).await.unwrap();
    cold.sink()
        .wait_applied(engine.sink().view().applied_index)
        .await
        .unwrap();
    assert_eq!(found(cold.clone(), 0).await, Some((40, 1_400)));
    // A search can start at an offset.
    let later = cold.offset_for_time(s, 45, 0).await.unwrap().unwrap();
    assert_eq!(later.base_offset, 45);
}
suite!(batches_are_found_by_time);

async fn submitted_appends_keep_their_order_and_resolve_when_durable(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    // Submit a pipeline of idempotent batches without waiting for any of them.
    let mut pending = Vec::new();
    for i in 0..50u64 {
        let w = WriterBatchId {
            writer_id: 5,
            writer_epoch: 0,
            first_sequence: i,
            last_sequence: i,
            any_first_sequence: false,
        };
        pending.push(engine.submit(s, 1, payload(s, i), Some(w)).await.unwrap());
    }
    let acks = futures::future::try_join_all(pending).await.unwrap();
    let bases: Vec<u64> = acks.iter().map(|a| a.base_offset).collect();
    assert_eq!(bases, (0..50).collect::<Vec<_>>());
    assert_eq!(engine.info(s).unwrap().end_offset, 50);
    // A retry of a recent batch submitted later is a duplicate, answered at once.
    let w = WriterBatchId {
        writer_id: 5,
        writer_epoch: 0,
        first_sequence: 47,
        last_sequence: 47,
        any_first_sequence: false,
    };
    let again = engine
        .submit(s, 1, payload(s, 47), Some(w))
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!((again.base_offset, again.duplicate), (47, true));
    engine.shutdown().await;
}
suite!(submitted_appends_keep_their_order_and_resolve_when_durable);

async fn retriable_storage_failures_are_retried_with_the_same_bytes(world: World) {
    let faults = ObjectFaults::new(9);
    let faulty: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&faults),
    ));
    let engine = world.node_on(1, faulty, config()).await;
    let s = engine.create_streams(2).await.unwrap();
    engine.open(s, 1).await.unwrap();
    engine.open(s + 1, 1).await.unwrap();
    // 503 SlowDown and PUTs whose outcome the engine never learns.
    faults.put_throttled.store(300, Ordering::Relaxed);
    faults.put_unknown.store(300, Ordering::Relaxed);
    let mut tasks = Vec::new();
    for stream in [s, s + 1] {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..30 {
                engine
                    .append(stream, 1, payload(stream, i), None)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    faults.clear();
    assert!(faults.injected() > 0);
    assert!(engine.stats().put_retries.load(Ordering::Relaxed) > 0);
    for stream in [s, s + 1] {
        let batches = read_all(&world.node(2).await, stream, 0).await;
        let offsets: Vec<u64> = batches.iter().map(|b| b.base_offset).collect();
        assert_eq!(
            offsets,
            (0..30).collect::<Vec<_>>(),
            "each record exactly once"
        );
        for b in &batches {
            assert_eq!(b.payload, payload(stream, b.base_offset));
        }
    }
    engine.shutdown().await;
}
suite!(retriable_storage_failures_are_retried_with_the_same_bytes);

async fn an_expired_object_id_is_replaced_and_the_bytes_put_again(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    engine.append(s, 1, payload(s, 0), None).await.unwrap();
    // The coordinator expires every prepared id, including the ones this node holds.
    let epoch = tokio::time::timeout(
        Duration::from_secs(5),
        engine
            .sink()
            .lease()
            .wait_for(|l| l.coordinator_epoch().is_some()),
    )
    .await
    .unwrap()
    .unwrap()
    .coordinator_epoch()
    .unwrap();
    let expired = engine
        .sink()
        .propose(Command::ExpirePreparedObjects(ExpirePreparedObjects {
            coordinator_epoch: epoch,
            now_ms: u64::MAX,
        }))
        .await
        .unwrap();
    assert!(expired.result.is_ok());
    let ack = engine.append(s, 1, payload(s, 1), None).await.unwrap();
    assert_eq!(ack.base_offset, 1);
    assert!(engine.stats().reputs_after_expiry.load(Ordering::Relaxed) >= 1);
    assert_eq!(read_all(&engine, s, 0).await.len(), 2);
    engine.shutdown().await;
}
suite!(an_expired_object_id_is_replaced_and_the_bytes_put_again);

async fn appends_wait_when_the_buffer_is_full(world: World) {
    let faults = ObjectFaults::new(3);
    let faulty: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&faults),
    ));
    let small = EngineConfig {
        max_buffered_bytes: 4 << 10,
        ..config()
    };
    let engine = world.node_on(1, faulty, small).await;
    let s = new_stream(&engine).await;
    faults.pause();
    // Pipelined, as a producer writes: each batch submitted without waiting for the one
    // before to be durable (an append awaited one at a time never fills the buffer).
    let writer = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let mut appending = Vec::new();
            for i in 0..20 {
                let payload = Bytes::from(vec![b'x'; 1000 + i]);
                appending.push(engine.submit(s, 1, payload, None).await.unwrap());
            }
            let mut acks = Vec::new();
            for a in appending {
                acks.push(a.await);
            }
            acks
        })
    };
    within(
        "an append to wait for room in the buffer",
        engine.stat_reaches(|s| &s.appends_waited, 1),
    )
    .await;
    assert!(
        !writer.is_finished(),
        "appends wait for room instead of growing memory"
    );
    assert!(engine.stats().appends.load(Ordering::Relaxed) <= 5);
    faults.resume();
    let acks = writer.await.unwrap();
    assert!(
        acks.iter().all(Result::is_ok),
        "waiting appends do not fail"
    );
    engine.shutdown().await;
}
suite!(appends_wait_when_the_buffer_is_full);

async fn a_fenced_node_fails_everything_and_a_restart_resumes(world: World) {
    let old = world.node(1).await;
    let s = new_stream(&old).await;
    let mut acked = BTreeMap::new();
    for i in 0..10 {
        let a = old.append(s, 1, payload(s, i), None).await.unwrap();
        acked.insert(a.base_offset, payload(s, i));
    }
    // The node restarts elsewhere under a new node epoch while the old process lives on.
    let new = world.node(1).await;
    let late = old.append(s, 1, payload(s, 10), None).await;
    assert!(
        late.is_err(),
        "the old process may no longer write: {late:?}"
    );
    assert!(
        matches!(old.failed(), Some(StreamError::Failed(_))),
        "its engine stops: {:?}",
        old.failed()
    );
    assert!(matches!(
        old.append(s, 1, payload(s, 11), None).await,
        Err(StreamError::Failed(_))
    ));
    // Closing on a failed engine answers instead of waiting for appends that never will be.
    assert!(
        tokio::time::timeout(Duration::from_secs(2), old.close(s))
            .await
            .is_ok()
    );
    let info = new.open(s, 2).await.unwrap();
    assert_eq!(info.end_offset, 10, "resumes at the committed end");
    let a = new.append(s, 1, payload(s, 10), None).await.unwrap();
    acked.insert(a.base_offset, payload(s, 10));
    let all = read_all(&new, s, 0).await;
    let stored: BTreeMap<u64, Bytes> = all
        .into_iter()
        .map(|b| (b.base_offset, b.payload))
        .collect();
    assert_eq!(stored, acked, "every acknowledged record, exactly once");
    old.shutdown().await;
    new.shutdown().await;
}
suite!(a_fenced_node_fails_everything_and_a_restart_resumes);

async fn trim_and_close_and_delete(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    for i in 0..20 {
        engine.append(s, 1, payload(s, i), None).await.unwrap();
    }
    assert!(matches!(
        engine.trim(s, 21).await,
        Err(StreamError::Invalid(_))
    ));
    let info = engine.trim(s, 12).await.unwrap();
    assert_eq!((info.start_offset, info.end_offset), (12, 20));
    assert!(matches!(
        engine.fetch(s, 11, 1024).await,
        Err(StreamError::OutOfRange { start: 12, .. })
    ));
    assert_eq!(read_all(&engine, s, 12).await.len(), 8);
    engine.close(s).await.unwrap();
    assert!(matches!(
        engine.append(s, 1, payload(s, 20), None).await,
        Err(StreamError::NotOpen { .. })
    ));
    assert_eq!(
        read_all(&engine, s, 12).await.len(),
        8,
        "closed streams stay readable"
    );
    engine.delete(s).await.unwrap();
    assert!(matches!(engine.info(s), Err(StreamError::NotFound { .. })));
    engine.shutdown().await;
}
suite!(trim_and_close_and_delete);

fn compaction() -> CompactionConfig {
    CompactionConfig {
        interval: Duration::from_millis(50),
        split_stream_bytes: 8 << 10,
        stream_object_bytes: 64 << 10,
        stream_set_object_bytes: 64 << 20,
        max_round_bytes: 64 << 20,
        max_bytes_per_sec: 0,
        min_bytes_per_sec: 0,
        destroyed_grace: Duration::ZERO,
    }
}

/// Live (committed) objects by kind, and every object id listed in the store.
async fn objects(engine: &S3Stream, world: &World) -> (usize, usize, Vec<u64>) {
    use futures::TryStreamExt as _;
    let view = engine.sink().view();
    let live = |k| {
        view.state
            .objects
            .values()
            .filter(|o| o.state() == mink_metadata::ObjectState::Committed && o.kind() == k)
            .count()
    };
    let listed: Vec<u64> = world
        .store
        .list(Some(&object_store::path::Path::from("s3stream/objects")))
        .map_ok(|m| object_id_of(&m.location).unwrap())
        .try_collect()
        .await
        .unwrap();
    (
        live(mink_metadata::ObjectKind::StreamSet),
        live(mink_metadata::ObjectKind::Stream),
        listed,
    )
}

async fn a_paced_round_moves_at_most_its_rate(world: World) {
    let engine = world.node(1).await;
    let first = engine.create_streams(2).await.unwrap();
    let mut expected: BTreeMap<u64, Vec<RecordBatch>> = BTreeMap::new();
    for s in first..first + 2 {
        engine.open(s, 1).await.unwrap();
    }
    // Stream-set objects of 16 or 4 KiB: the first stream is split out, the second stays.
    for round in 0..6u64 {
        for s in first..first + 2 {
            let size = if s == first { 16 << 10 } else { 4 << 10 };
            let p = Bytes::from(vec![round as u8; size]);
            let a = engine.append(s, 2, p.clone(), None).await.unwrap();
            expected.entry(s).or_default().push(RecordBatch {
                base_offset: a.base_offset,
                count: 2,
                timestamp_ms: 0,
                payload: p,
            });
        }
    }
    let rate = 128 << 10;
    let paced = CompactionConfig {
        split_stream_bytes: 64 << 10,
        stream_object_bytes: 128 << 10,
        max_bytes_per_sec: rate,
        ..compaction()
    };
    let started = std::time::Instant::now();
    let report = engine.compact_once(1, &paced).await.unwrap();
    let took = started.elapsed();
    assert!(report.sources >= 6, "{report:?}");
    assert_eq!(report.objects_written, 2, "{report:?}");
    // Each GET and PUT starts once the bytes before it had their time at the rate, so the
    // last starts no sooner than all but the last (at most one object, < 128 KiB) allow.
    let moved = report.bytes_read + report.bytes_written;
    assert!(moved > 2 * 6 * (20 << 10), "{report:?}");
    let least = Duration::from_secs_f64((moved - (128 << 10)) as f64 / rate as f64);
    assert!(
        took >= least && report.paced > Duration::ZERO,
        "a round moving {moved} bytes at {rate} B/s took {took:?} (at least {least:?}): {report:?}"
    );
    for (s, batches) in &expected {
        assert_eq!(&read_all(&world.node(2).await, *s, 0).await, batches);
    }
    // Unpaced, a round never waits.
    for s in first..first + 2 {
        engine.append(s, 1, payload(s, 1), None).await.unwrap();
        engine.append(s, 1, payload(s, 2), None).await.unwrap();
    }
    let report = engine.compact_once(1, &compaction()).await.unwrap();
    assert!(report.sources >= 2, "{report:?}");
    assert_eq!(report.paced, Duration::ZERO);
    engine.shutdown().await;
}
suite!(a_paced_round_moves_at_most_its_rate);

async fn a_round_short_of_budget_says_more_remains(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    for offset in 0..8 {
        engine.append(s, 1, payload(s, offset), None).await.unwrap();
    }
    let (sets, _, _) = objects(&engine, &world).await;
    assert_eq!(sets, 8, "one stream-set object per append");
    let size = engine
        .sink()
        .view()
        .state
        .objects
        .values()
        .map(|o| o.size)
        .max()
        .unwrap();
    // A budget of three objects: rounds of three follow each other until no two objects fit
    // in the budget together.
    let small = CompactionConfig {
        max_round_bytes: 3 * size,
        ..compaction()
    };
    let mut rounds = Vec::new();
    loop {
        let report = engine.compact_once(1, &small).await.unwrap();
        rounds.push((report.sources, report.more));
        if !report.more {
            break;
        }
        assert!(rounds.len() < 10, "rounds never end: {rounds:?}");
    }
    assert_eq!(rounds.first(), Some(&(3, true)), "{rounds:?}");
    assert_eq!(objects(&engine, &world).await.0, 3, "{rounds:?}");
    assert_eq!(read_all(&engine, s, 0).await.len(), 8);
    engine.shutdown().await;
}
suite!(a_round_short_of_budget_says_more_remains);

async fn coordinator_epoch(engine: &S3Stream) -> u64 {
    tokio::time::timeout(
        Duration::from_secs(5),
        engine
            .sink()
            .lease()
            .wait_for(|l| l.coordinator_epoch().is_some()),
    )
    .await
    .unwrap()
    .unwrap()
    .coordinator_epoch()
    .unwrap()
}

/// Opens `n` new streams and appends to each in 12 rounds (one object per round), batches of
/// 3 000 bytes to the first and of `others` bytes to the rest: returns the first stream and
/// what each holds.
async fn streams_in_rounds(
    engine: &S3Stream,
    n: u32,
    others: usize,
) -> (u64, BTreeMap<u64, Vec<RecordBatch>>) {
    let first = engine.create_streams(n).await.unwrap();
    let n = u64::from(n);
    for s in first..first + n {
        engine.open(s, 1).await.unwrap();
    }
    let mut expected: BTreeMap<u64, Vec<RecordBatch>> = BTreeMap::new();
    for round in 0..12u64 {
        for s in first..first + n {
            let size = if s == first { 3000 } else { others };
            let p = Bytes::from(vec![(round as u8) ^ (s as u8); size]);
            let a = engine.append(s, 2, p.clone(), None).await.unwrap();
            expected.entry(s).or_default().push(RecordBatch {
                base_offset: a.base_offset,
                count: 2,
                timestamp_ms: 0,
                payload: p,
            });
        }
    }
    (first, expected)
}

async fn compaction_merges_splits_and_keeps_every_record(world: World) {
    let engine = world.node(1).await;
    // Many small flushes; stream `first` is big enough to be split out into stream objects.
    let (first, mut expected) = streams_in_rounds(&engine, 4, 40).await;
    let (sets_before, _, _) = objects(&engine, &world).await;
    assert!(
        sets_before >= 6,
        "{sets_before} stream-set objects before compaction"
    );
    let report = engine.compact_once(1, &compaction()).await.unwrap();
    assert_eq!(report.sources, sets_before);
    let (sets, streams, _) = objects(&engine, &world).await;
    assert_eq!(sets, 1, "stream-set objects merged into one");
    assert_eq!(
        streams, 1,
        "the big stream was split into its own stream object"
    );
    // Every record is still there, read cold from objects.
    let reader = world.node(2).await;
    for (s, batches) in &expected {
        assert_eq!(&read_all(&reader, *s, 0).await, batches, "stream {s}");
    }
    // The sources are destroyed; cleanup deletes them from the store and the metadata.
    let epoch = coordinator_epoch(&engine).await;
    let cleaned = engine.cleanup_once(epoch, &compaction()).await.unwrap();
    assert_eq!(cleaned.deleted as usize, sets_before);
    let (_, _, listed) = objects(&engine, &world).await;
    let view = engine.sink().view();
    let live: Vec<u64> = view
        .state
        .objects
        .keys()
        .copied()
        .filter(|id| view.state.objects[id].state() == mink_metadata::ObjectState::Committed)
        .collect();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort_unstable();
    assert_eq!(
        listed_sorted, live,
        "the store holds exactly the live objects"
    );
    // More writes, then merging the small stream objects of the split stream.
    for round in 0..6u64 {
        let p = Bytes::from(vec![round as u8; 3000]);
        let a = engine.append(first, 2, p.clone(), None).await.unwrap();
        expected.get_mut(&first).unwrap().push(RecordBatch {
            base_offset: a.base_offset,
            count: 2,
            timestamp_ms: 0,
            payload: p,
        });
        engine.compact_once(1, &compaction()).await.unwrap();
    }
    let (_, streams, _) = objects(&engine, &world).await;
    assert!(
        streams <= 3,
        "{streams} stream objects for one stream: small ones merge"
    );
    assert_eq!(
        &read_all(&world.node(3).await, first, 0).await,
        &expected[&first]
    );
    engine.shutdown().await;
    reader.shutdown().await;
}
suite!(compaction_merges_splits_and_keeps_every_record);

async fn a_round_writes_objects_of_bounded_size(world: World) {
    let engine = world.node(1).await;
    // Stream `first` is split out (36 000 bytes); the others stay (4 800 bytes each).
    let (first, expected) = streams_in_rounds(&engine, 6, 400).await;
    let (sets_before, _, _) = objects(&engine, &world).await;
    // Stream objects of at most three batches, stream-set objects of at most two streams.
    let bounded = CompactionConfig {
        stream_object_bytes: 10_000,
        stream_set_object_bytes: 10_000,
        ..compaction()
    };
    let report = engine.compact_once(1, &bounded).await.unwrap();
    assert_eq!(report.sources, sets_before, "{report:?}");
    assert!(report.refused.is_empty(), "{report:?}");
    let (sets, streams, _) = objects(&engine, &world).await;
    assert_eq!(streams, 4, "the split stream in pieces of three batches");
    assert_eq!(sets, 3, "five streams of 4 800 bytes, two per object");
    let view = engine.sink().view();
    for o in view
        .state
        .objects
        .values()
        .filter(|o| o.state() == mink_metadata::ObjectState::Committed)
    {
        assert!(
            o.size < 12_000,
            "object {} is {} bytes",
            o.object_id,
            o.size
        );
    }
    // The pieces of the split stream follow each other without a gap.
    let ranges: Vec<(u64, u64)> = view
        .state
        .stream_ranges(first, 0, u64::MAX)
        .map(|r| (r.start_offset, r.end_offset))
        .collect();
    assert_eq!(ranges.len(), 4, "{ranges:?}");
    assert!(ranges.windows(2).all(|w| w[0].1 == w[1].0), "{ranges:?}");
    let reader = world.node(2).await;
    for (s, batches) in &expected {
        assert_eq!(&read_all(&reader, *s, 0).await, batches, "stream {s}");
    }
    // Its own output is not rewritten by the next round.
    let again = engine.compact_once(1, &bounded).await.unwrap();
    assert_eq!(again.sources, 0, "{again:?}");
    assert_eq!(again.objects_written, 0, "{again:?}");
    engine.shutdown().await;
    reader.shutdown().await;
}
suite!(a_round_writes_objects_of_bounded_size);

/// `event` awaited for at most 30 s; past that, a failure naming what was waited for.
async fn within<T>(what: &str, event: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), event)
        .await
        .unwrap_or_else(|_| panic!("waited 30 s for {what}"))
}

async fn orphans_are_swept(world: World) {
    use object_store::ObjectStoreExt as _;
    // Prepared ids that lapse quickly: the spare ones expire and get cleaned.
    let clock = mink_metadata::ManualClock::new(1_800_000_000_000);
    let short = EngineConfig {
        prepare_ttl: Duration::from_millis(100),
        clock: clock.clone(),
        ..config()
    };
    let engine = world.node_on(1, Arc::clone(&world.store), short).await;
    let s = new_stream(&engine).await;
    engine.append(s, 1, payload(s, 0), None).await.unwrap();
    let epoch = coordinator_epoch(&engine).await;
    clock.advance(Duration::from_millis(150));
    let cleaned = engine.cleanup_once(epoch, &compaction()).await.unwrap();
    assert!(cleaned.expired > 0 && cleaned.deleted > 0, "{cleaned:?}");
    let view = engine.sink().view();
    let forgotten = (1..view.state.counters.next_object_id)
        .find(|id| !view.state.objects.contains_key(id))
        .expect("a cleaned id");
    // A PUT of that id lands late (the writer was slow); one id never handed out too.
    let late = object_path("s3stream/objects", forgotten);
    world
        .store
        .put(&late, Bytes::from_static(b"late").into())
        .await
        .unwrap();
    let unknown = object_path(
        "s3stream/objects",
        view.state.counters.next_object_id + 1000,
    );
    world
        .store
        .put(&unknown, Bytes::from_static(b"?").into())
        .await
        .unwrap();
    let report = engine.cleanup_once(epoch, &compaction()).await.unwrap();
    assert_eq!(report.orphans, 1);
    assert!(
        world.store.head(&late).await.is_err(),
        "the late PUT was swept"
    );
    assert!(
        world.store.head(&unknown).await.is_ok(),
        "ids never handed out are not ours to judge"
    );
    assert_eq!(read_all(&engine, s, 0).await.len(), 1);
    engine.shutdown().await;
}
suite!(orphans_are_swept);

async fn another_node_compacts_a_dead_nodes_objects(world: World) {
    let dead = world.node(7).await;
    let first = dead.create_streams(2).await.unwrap();
    for s in [first, first + 1] {
        dead.open(s, 1).await.unwrap();
    }
    for i in 0..5 {
        for s in [first, first + 1] {
            dead.append(s, 1, payload(s, i), None).await.unwrap();
        }
    }
    dead.shutdown().await;
    dead.sink().shutdown().await; // its heartbeat expires at once
    let holder = world.node(1).await;
    coordinator_epoch(&holder).await;
    let before = objects(&holder, &world).await.0;
    assert!(before >= 2);
    // The coordinator's duty (mink-coordinator runs it on the lease holder).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while objects(&holder, &world).await.0 > 1 {
        holder.compact_once(7, &compaction()).await.unwrap();
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead node's objects never compacted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in [first, first + 1] {
        assert_eq!(read_all(&holder, s, 0).await.len(), 5);
    }
    holder.shutdown().await;
}
suite!(another_node_compacts_a_dead_nodes_objects);

async fn a_crash_between_put_and_commit_loses_nothing_acknowledged(world: World) {
    let meta = mink_sql::Faults::new(11);
    let puts = ObjectFaults::new(12);
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&puts),
    ));
    // Prepared ids expire when the test moves the clock, not while a loaded machine is slow.
    let clock = mink_metadata::ManualClock::new(1_800_000_000_000);
    let short = EngineConfig {
        prepare_ttl: Duration::from_millis(300),
        clock: clock.clone(),
        ..config()
    };
    let node = world
        .node_with(1, store, short.clone(), Some(Arc::clone(&meta)))
        .await;
    let s = new_stream(&node).await;
    let w = |seq| WriterBatchId {
        writer_id: 5,
        writer_epoch: 0,
        first_sequence: seq,
        last_sequence: seq,
        any_first_sequence: false,
    };
    node.append(s, 1, payload(s, 0), Some(w(0))).await.unwrap();
    // The metadata database stops answering: the next object is PUT but never committed.
    meta.pause();
    let put_before = puts.puts();
    let unacked = {
        let node = node.clone();
        tokio::spawn(async move { node.append(s, 1, payload(s, 1), Some(w(1))).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while puts.puts() == put_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the object was never PUT"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The process dies (nothing released).
    node.sink().abort();
    node.shutdown().await;
    assert!(unacked.await.unwrap().is_err(), "never acknowledged");
    meta.resume();
    // Restarted, it resumes at the committed end; the client's retry is stored once.
    let restarted = world.node_on(1, Arc::clone(&world.store), short).await;
    assert_eq!(restarted.open(s, 2).await.unwrap().end_offset, 1);
    let retry = restarted
        .append(s, 1, payload(s, 1), Some(w(1)))
        .await
        .unwrap();
    assert_eq!((retry.base_offset, retry.duplicate), (1, false));
    let again = restarted
        .append(s, 1, payload(s, 1), Some(w(1)))
        .await
        .unwrap();
    assert_eq!((again.base_offset, again.duplicate), (1, true));
    assert_eq!(read_all(&restarted, s, 0).await.len(), 2);
    // The object PUT by the dead process is prepared, never committed: it expires, and the
    // cleanup deletes it.
    let epoch = coordinator_epoch(&restarted).await;
    clock.advance(Duration::from_secs(1));
    let report = restarted.cleanup_once(epoch, &compaction()).await.unwrap();
    assert!(report.expired > 0 && report.deleted > 0, "{report:?}");
    let (_, _, listed) = objects(&restarted, &world).await;
    let view = restarted.sink().view();
    assert!(
        listed.iter().all(|id| view
            .state
            .objects
            .get(id)
            .is_some_and(|o| o.state() == mink_metadata::ObjectState::Committed
                || o.state() == mink_metadata::ObjectState::Prepared)),
        "only live or still-usable objects remain: {listed:?}"
    );
    restarted.shutdown().await;
}
suite!(a_crash_between_put_and_commit_loses_nothing_acknowledged);

async fn a_crash_between_commit_and_ack_is_answered_on_retry(world: World) {
    let meta = mink_sql::Faults::new(13);
    let node = world
        .node_with(
            1,
            Arc::clone(&world.store),
            config(),
            Some(Arc::clone(&meta)),
        )
        .await;
    let s = new_stream(&node).await;
    let w = |seq| WriterBatchId {
        writer_id: 9,
        writer_epoch: 2,
        first_sequence: seq,
        last_sequence: seq,
        any_first_sequence: false,
    };
    node.append(s, 1, payload(s, 0), Some(w(0))).await.unwrap();
    // The row with the object's commit lands, then the store freezes (rows of other commands,
    // such as the lease holder's, pass).
    meta.pause_after_next_object_commit
        .store(true, Ordering::Relaxed);
    let pending = {
        let node = node.clone();
        tokio::spawn(async move { node.append(s, 1, payload(s, 1), Some(w(1))).await })
    };
    // The commit row lands, then the process freezes before it can acknowledge, and dies.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let observer = world.node(2).await;
    loop {
        if observer.info(s).unwrap().end_offset == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the commit never landed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    node.sink().abort();
    node.shutdown().await;
    assert!(
        pending.await.unwrap().is_err(),
        "the writer never got its answer"
    );
    meta.resume();
    // The writer retries against the new owner: the original offsets, nothing written twice.
    let restarted = world.node(1).await;
    restarted.open(s, 2).await.unwrap();
    let retry = restarted
        .append(s, 1, payload(s, 1), Some(w(1)))
        .await
        .unwrap();
    assert_eq!(
        (retry.base_offset, retry.end_offset, retry.duplicate),
        (1, 2, true)
    );
    let next = restarted
        .append(s, 1, payload(s, 2), Some(w(2)))
        .await
        .unwrap();
    assert_eq!(next.base_offset, 2);
    let all = read_all(&restarted, s, 0).await;
    let offsets: Vec<u64> = all.iter().map(|b| b.base_offset).collect();
    assert_eq!(offsets, vec![0, 1, 2]);
    observer.shutdown().await;
    restarted.shutdown().await;
}
suite!(a_crash_between_commit_and_ack_is_answered_on_retry);

async fn a_crash_during_compaction_loses_nothing(world: World) {
    let puts = ObjectFaults::new(21);
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&puts),
    ));
    let clock = mink_metadata::ManualClock::new(1_800_000_000_000);
    let short = EngineConfig {
        prepare_ttl: Duration::from_millis(300),
        clock: clock.clone(),
        ..config()
    };
    let node = world.node_on(1, Arc::clone(&store), short.clone()).await;
    let first = node.create_streams(2).await.unwrap();
    for s in [first, first + 1] {
        node.open(s, 1).await.unwrap();
        for i in 0..4 {
            node.append(s, 1, payload(s, i), None).await.unwrap();
        }
    }
    // The compaction's PUT never returns (the process dies mid-compaction).
    puts.put_latency_us.store(3_600_000_000, Ordering::Relaxed);
    let begun = puts.puts_begun();
    let compacting = {
        let node = node.clone();
        tokio::spawn(async move { node.compact_once(1, &compaction()).await })
    };
    within(
        "the compaction's PUT to reach the paused store",
        puts.puts_begun_reach(begun + 1),
    )
    .await;
    compacting.abort();
    node.sink().abort();
    node.shutdown().await;
    let restarted = world.node_on(1, Arc::clone(&world.store), short).await;
    for s in [first, first + 1] {
        let batches = read_all(&restarted, s, 0).await;
        assert_eq!(batches.len(), 4, "stream {s}");
    }
    // A second attempt completes, and cleanup leaves only live objects.
    restarted.compact_once(1, &compaction()).await.unwrap();
    let epoch = coordinator_epoch(&restarted).await;
    clock.advance(Duration::from_millis(400));
    restarted.cleanup_once(epoch, &compaction()).await.unwrap();
    for s in [first, first + 1] {
        assert_eq!(read_all(&world.node(3).await, s, 0).await.len(), 4);
    }
    restarted.shutdown().await;
}
suite!(a_crash_during_compaction_loses_nothing);

/// The model: per stream, its batches by base offset and its start offset.
#[derive(Default)]
struct Model {
    streams: BTreeMap<u64, (u64, BTreeMap<u64, RecordBatch>)>,
}

impl Model {
    fn end(&self, s: u64) -> u64 {
        self.streams[&s]
            .1
            .values()
            .next_back()
            .map_or(0, RecordBatch::end_offset)
    }

    /// What a fetch at `offset` must return first: the batch holding it.
    fn batch_at(&self, s: u64, offset: u64) -> &RecordBatch {
        self.streams[&s]
            .1
            .range(..=offset)
            .next_back()
            .map(|(_, b)| b)
            .filter(|b| b.end_offset() > offset)
            .expect("model holds the offset")
    }
}

async fn random_operations_match_a_model(world: World) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let policy = CompactionConfig {
        split_stream_bytes: 2 << 10,
        stream_object_bytes: 16 << 10,
        ..compaction()
    };
    let mut nodes = vec![world.node(1).await, world.node(2).await];
    let first = nodes[0].create_streams(3).await.unwrap();
    let streams: Vec<u64> = (first..first + 3).collect();
    let mut model = Model::default();
    // stream -> (owning node index, epoch)
    let mut owner: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
    for &s in &streams {
        nodes[0].open(s, 1).await.unwrap();
        owner.insert(s, (0, 1));
        model.streams.insert(s, (0, BTreeMap::new()));
    }
    for step in 0..250 {
        let s = streams[rng.random_range(0..streams.len())];
        match rng.random_range(0..100) {
            0..=54 => {
                let (n, _) = owner[&s];
                let count = rng.random_range(1..4u32);
                let size = if rng.random_bool(0.2) {
                    1500
                } else {
                    rng.random_range(1..200)
                };
                let p = Bytes::from(vec![step as u8; size]);
                let ack = nodes[n].append(s, count, p.clone(), None).await.unwrap();
                assert_eq!(ack.base_offset, model.end(s), "step {step}: offsets follow");
                model.streams.get_mut(&s).unwrap().1.insert(
                    ack.base_offset,
                    RecordBatch {
                        base_offset: ack.base_offset,
                        count,
                        timestamp_ms: 0,
                        payload: p,
                    },
                );
            }
            55..=62 => {
                let (n, _) = owner[&s];
                let (start, _) = model.streams[&s];
                let end = model.end(s);
                if end > start {
                    let to = rng.random_range(start..=end);
                    let info = nodes[n].trim(s, to).await.unwrap();
                    assert_eq!(info.start_offset, to.max(start));
                    let (start, batches) = model.streams.get_mut(&s).unwrap();
                    *start = to.max(*start);
                    batches.retain(|_, b| b.end_offset() > *start);
                }
            }
            63..=74 => {
                // Every node compacts its own objects; the object count must then be bounded.
                let mut reports = Vec::new();
                for (i, node) in nodes.iter().enumerate() {
                    let report = node.compact_once(i as u64 + 1, &policy).await.unwrap();
                    assert!(
                        report.refused.is_empty(),
                        "step {step}: {:?}",
                        report.refused
                    );
                    reports.push(report);
                }
                let latest = nodes
                    .iter()
                    .map(|n| n.sink().view().applied_index)
                    .max()
                    .unwrap();
                let view = nodes[0].sink().wait_applied(latest).await.unwrap();
                let sets = view
                    .state
                    .objects
                    .values()
                    .filter(|o| {
                        o.state() == mink_metadata::ObjectState::Committed
                            && o.kind() == mink_metadata::ObjectKind::StreamSet
                    })
                    .count();
                assert!(
                    sets <= nodes.len(),
                    "step {step}: {sets} stream-set objects after compaction: {reports:?} {:?}",
                    view.state
                        .objects
                        .values()
                        .filter(|o| o.state() == mink_metadata::ObjectState::Committed)
                        .map(|o| (o.object_id, o.node_id, o.kind(), o.live_ranges, o.size))
                        .collect::<Vec<_>>()
                );
                for &s in &streams {
                    let objects: std::collections::BTreeSet<u64> = view
                        .state
                        .ranges
                        .range((s, 0)..=(s, u64::MAX))
                        .map(|(_, r)| r.object_id)
                        .filter(|id| {
                            view.state.objects[id].kind() == mink_metadata::ObjectKind::Stream
                        })
                        .collect();
                    let bytes: u64 = model.streams[&s]
                        .1
                        .values()
                        .map(|b| b.payload.len() as u64 + 16)
                        .sum();
                    let bound = bytes / policy.stream_object_bytes + 2 + nodes.len() as u64;
                    assert!(
                        objects.len() as u64 <= bound,
                        "step {step}: stream {s} spans {} stream objects (bound {bound})",
                        objects.len()
                    );
                }
            }
            75..=79 => {
                let holder = if nodes[0]
                    .sink()
                    .lease()
                    .borrow()
                    .coordinator_epoch()
                    .is_some()
                {
                    0
                } else {
                    1
                };
                if let Some(epoch) = nodes[holder].sink().lease().borrow().coordinator_epoch() {
                    nodes[holder].cleanup_once(epoch, &policy).await.unwrap();
                }
            }
            80..=89 => {
                // The other node takes the stream over at the next epoch.
                let (n, epoch) = owner[&s];
                let other = 1 - n;
                let info = nodes[other].open(s, epoch + 1).await.unwrap();
                assert_eq!(info.end_offset, model.end(s));
                assert!(matches!(
                    nodes[n]
                        .append(s, 1, Bytes::from_static(b"stale"), None)
                        .await,
                    Err(StreamError::Fenced { .. }) | Err(StreamError::NotOpen { .. })
                ));
                owner.insert(s, (other, epoch + 1));
            }
            _ => {
                // A node restarts: its streams are reopened at the next epoch.
                let n = rng.random_range(0..nodes.len());
                nodes[n].shutdown().await;
                nodes[n].sink().shutdown().await;
                nodes[n] = world.node(n as u64 + 1).await;
                for (&stream, (o, epoch)) in owner.iter_mut() {
                    if *o == n {
                        *epoch += 1;
                        nodes[n].open(stream, *epoch).await.unwrap();
                    }
                }
            }
        }
        // Every step: a random read from a random node matches the model.
        let (start, _) = model.streams[&s];
        let end = model.end(s);
        let reader = &nodes[rng.random_range(0..nodes.len())];
        reader
            .sink()
            .wait_applied(nodes[owner[&s].0].sink().view().applied_index)
            .await
            .unwrap();
        if end > start {
            let offset = rng.random_range(start..end);
            let got: Vec<RecordBatch> = reader
                .fetch(s, offset, rng.random_range(1..4096))
                .await
                .unwrap()
                .into_iter()
                .map(untimed)
                .collect();
            assert_eq!(
                &got[0],
                model.batch_at(s, offset),
                "step {step}: fetch {s}@{offset}"
            );
            for pair in got.windows(2) {
                assert_eq!(pair[0].end_offset(), pair[1].base_offset);
                assert_eq!(&pair[1], model.batch_at(s, pair[1].base_offset));
            }
        }
        let info = reader.info(s).unwrap();
        assert_eq!(
            (info.start_offset, info.end_offset),
            (start, end),
            "step {step}"
        );
    }
    // In full, from a fresh node with cold caches.
    let fresh = world.node(3).await;
    for &s in &streams {
        let (start, batches) = &model.streams[&s];
        let expected: Vec<RecordBatch> = batches.values().cloned().collect();
        let first_offset = expected
            .first()
            .map_or(*start, |b| b.base_offset.max(*start));
        if !expected.is_empty() {
            assert_eq!(
                read_all(&fresh, s, first_offset).await,
                expected,
                "stream {s}"
            );
        }
    }
    for node in nodes {
        node.shutdown().await;
    }
    fresh.shutdown().await;
}
suite!(random_operations_match_a_model);

async fn commits_follow_flush_order_even_when_puts_do_not(world: World) {
    let faults = ObjectFaults::new(31);
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&faults),
    ));
    let engine = world.node_on(1, store, config()).await;
    let first = engine.create_streams(2).await.unwrap();
    engine.open(first, 1).await.unwrap();
    engine.open(first + 1, 1).await.unwrap();
    engine
        .append(first, 1, payload(first, 0), None)
        .await
        .unwrap(); // ids prepared
    // The first flush's PUT is slow; the second one's is fast.
    faults.slow_next_put_us.store(400_000, Ordering::Relaxed);
    let begun = faults.puts_begun();
    let slow = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.append(first, 1, payload(first, 1), None).await })
    };
    within(
        "the slow flush's PUT to begin",
        faults.puts_begun_reach(begun + 1),
    )
    .await;
    let fast = engine
        .append(first + 1, 1, payload(first + 1, 0), None)
        .await;
    // Acknowledged, so the earlier flush is committed too (before it, or in its transaction).
    assert_eq!(
        engine.info(first).unwrap().end_offset,
        2,
        "the later flush was acknowledged before the earlier one committed"
    );
    slow.await.unwrap().unwrap();
    fast.unwrap();
    assert!(
        engine.stats().flushes.load(Ordering::Relaxed) >= 3,
        "two objects were in flight"
    );
    engine.shutdown().await;
}
suite!(commits_follow_flush_order_even_when_puts_do_not);

async fn commits_held_up_by_the_database_go_on_putting_and_share_a_transaction(world: World) {
    let meta = mink_sql::Faults::new(43);
    let two_slots = EngineConfig {
        max_inflight_flushes: 2,
        ..config()
    };
    let engine = world
        .node_with(
            1,
            Arc::clone(&world.store),
            two_slots,
            Some(Arc::clone(&meta)),
        )
        .await;
    let s = new_stream(&engine).await;
    engine.append(s, 1, payload(s, 0), None).await.unwrap(); // ids prepared
    let uploads = engine.stats().uploads.load(Ordering::Relaxed);
    let sink = engine.sink().stats();
    // The metadata database stops answering (a slow sync of its log): the next commit waits.
    meta.pause();
    let mut acks = Vec::new();
    for i in 1..=6 {
        let writer = engine.clone();
        acks.push(tokio::spawn(async move {
            writer.append(s, 1, payload(s, i), None).await
        }));
        // Each append its own flush: PUT although two of them already wait for a commit.
        tokio::time::timeout(
            Duration::from_secs(10),
            engine.stat_reaches(|s| &s.uploads, uploads + i),
        )
        .await
        .unwrap_or_else(|_| {
            panic!("waited 10 s for flush {i} to be PUT with the commits held up (2 PUT slots)")
        });
    }
    let shared_before =
        sink.commands_appended.load(Ordering::Relaxed) - sink.rows_appended.load(Ordering::Relaxed);
    meta.resume();
    for (i, ack) in acks.into_iter().enumerate() {
        assert_eq!(ack.await.unwrap().unwrap().base_offset, i as u64 + 1);
    }
    // The first waited on its own; the five PUT meanwhile were queued together.
    assert!(engine.stats().grouped_commits.load(Ordering::Relaxed) >= 4);
    let shared = sink.commands_appended.load(Ordering::Relaxed)
        - sink.rows_appended.load(Ordering::Relaxed)
        - shared_before;
    assert!(shared >= 4, "commits that shared a row: {shared}");
    assert!(engine.failed().is_none());
    assert_eq!(read_all(&world.node(2).await, s, 0).await.len(), 7);
    engine.shutdown().await;
}
suite!(commits_held_up_by_the_database_go_on_putting_and_share_a_transaction);

async fn a_fenced_range_is_dropped_while_the_rest_of_its_object_commits(world: World) {
    let a = world.node(1).await;
    let b = world.node(2).await;
    let first = a.create_streams(2).await.unwrap();
    let (lost, kept) = (first, first + 1);
    a.open(lost, 1).await.unwrap();
    a.open(kept, 1).await.unwrap();
    a.append(lost, 1, payload(lost, 0), None).await.unwrap();
    // B takes `lost` over; A's next object holds appends to both streams.
    b.open(lost, 2).await.unwrap();
    let to_lost = {
        let a = a.clone();
        tokio::spawn(async move { a.append(lost, 1, payload(lost, 1), None).await })
    };
    let to_kept = a.append(kept, 1, payload(kept, 0), None).await;
    assert!(matches!(
        to_lost.await.unwrap(),
        Err(StreamError::Fenced { .. })
    ));
    assert_eq!(
        to_kept.unwrap().base_offset,
        0,
        "the other stream of the object committed"
    );
    assert!(a.failed().is_none());
    assert!(a.stats().fenced_ranges.load(Ordering::Relaxed) >= 1);
    b.sink()
        .wait_applied(a.sink().view().applied_index)
        .await
        .unwrap();
    assert_eq!(read_all(&b, lost, 0).await.len(), 1);
    assert_eq!(read_all(&b, kept, 0).await.len(), 1);
    a.shutdown().await;
    b.shutdown().await;
}
suite!(a_fenced_range_is_dropped_while_the_rest_of_its_object_commits);

async fn metadata_connection_faults_are_retried_without_duplicates(world: World) {
    let meta = mink_sql::Faults::new(41);
    let engine = world
        .node_with(
            1,
            Arc::clone(&world.store),
            config(),
            Some(Arc::clone(&meta)),
        )
        .await;
    let s = new_stream(&engine).await;
    // Connections drop before and after COMMIT, statements fail.
    meta.set(150, 150, 50);
    for i in 0..30 {
        let ack = engine.append(s, 1, payload(s, i), None).await.unwrap();
        assert_eq!(ack.base_offset, i);
    }
    meta.clear();
    assert!(meta.injected() > 0);
    let batches = read_all(&world.node(2).await, s, 0).await;
    assert_eq!(batches.len(), 30, "each record exactly once");
    engine.shutdown().await;
}
suite!(metadata_connection_faults_are_retried_without_duplicates);

async fn a_slow_put_is_hedged(world: World) {
    let faults = ObjectFaults::new(51);
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&faults),
    ));
    let hedged = EngineConfig {
        hedge_after: Some(Duration::from_millis(200)),
        ..config()
    };
    let engine = world.node_on(1, store, hedged).await;
    let s = new_stream(&engine).await;
    engine.append(s, 1, payload(s, 0), None).await.unwrap();
    faults.slow_next_put_us.store(5_000_000, Ordering::Relaxed);
    let started = tokio::time::Instant::now();
    engine.append(s, 1, payload(s, 1), None).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the hedge answered first"
    );
    // (A PUT of a loaded test server may be hedged too.)
    assert!(engine.stats().hedged_puts.load(Ordering::Relaxed) >= 1);
    assert_eq!(read_all(&engine, s, 0).await.len(), 2);
    engine.shutdown().await;
}
suite!(a_slow_put_is_hedged);

async fn pipelined_batches_of_one_writer_share_a_flush(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    let w = |seq| WriterBatchId {
        writer_id: 4,
        writer_epoch: 0,
        first_sequence: seq,
        last_sequence: seq,
        any_first_sequence: false,
    };
    engine
        .append(s, 1, payload(s, 0), Some(w(0)))
        .await
        .unwrap();
    // Ten batches accepted in sequence order before any is acknowledged (like a producer with
    // several requests in flight): they land in one object and commit together, each checked
    // against the one before it.
    let appends = (1..11).map(|i| engine.append(s, 1, payload(s, i), Some(w(i))));
    let acks = futures::future::join_all(appends).await;
    for (i, ack) in acks.iter().enumerate() {
        assert_eq!(ack.as_ref().unwrap().base_offset, i as u64 + 1);
    }
    assert!(engine.failed().is_none());
    assert!(
        engine.stats().commits.load(Ordering::Relaxed) < 10,
        "they shared commits"
    );
    engine.shutdown().await;
}
suite!(pipelined_batches_of_one_writer_share_a_flush);

async fn reopening_with_appends_in_flight_starts_clean(world: World) {
    let faults = ObjectFaults::new(61);
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&faults),
    ));
    let a = world.node_on(1, store, config()).await;
    let b = world.node(2).await;
    let s = new_stream(&a).await;
    a.append(s, 1, payload(s, 0), None).await.unwrap(); // ids prepared
    faults.pause();
    let begun = faults.puts_begun();
    let old: Vec<_> = (1..4)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move { a.append(s, 1, payload(s, i), None).await })
        })
        .collect();
    within(
        "the old appends' flush to reach the paused store",
        faults.puts_begun_reach(begun + 1),
    )
    .await;
    // Leadership goes to B and comes back to A at a higher epoch.
    b.open(s, 2).await.unwrap();
    assert_eq!(a.open(s, 3).await.unwrap().end_offset, 1);
    // The fresh append takes its offsets (at epoch 3) while the old ones are still in flight.
    let fresh = a.submit(s, 1, payload(s, 100), None).await.unwrap();
    let fresh = tokio::spawn(fresh);
    faults.resume();
    for t in old {
        assert!(matches!(t.await.unwrap(), Err(StreamError::Fenced { .. })));
    }
    let ack = fresh.await.unwrap().unwrap();
    assert_eq!(
        ack.base_offset, 1,
        "the new epoch continues at the committed end"
    );
    assert!(a.failed().is_none());
    let all = read_all(&a, s, 0).await;
    assert_eq!(all.len(), 2);
    assert_eq!(all[1].payload, payload(s, 100));
    a.shutdown().await;
    b.shutdown().await;
}
suite!(reopening_with_appends_in_flight_starts_clean);

async fn a_stream_deleted_under_an_append_fails_only_that_stream(world: World) {
    let faults = ObjectFaults::new(71);
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&faults),
    ));
    let a = world.node_on(1, store, config()).await;
    let b = world.node(2).await;
    let first = a.create_streams(2).await.unwrap();
    let (doomed, other) = (first, first + 1);
    a.open(doomed, 1).await.unwrap();
    a.open(other, 1).await.unwrap();
    a.append(other, 1, payload(other, 0), None).await.unwrap();
    faults.pause();
    let begun = faults.puts_begun();
    let pending = {
        let a = a.clone();
        tokio::spawn(async move { a.append(doomed, 1, payload(doomed, 0), None).await })
    };
    within(
        "the doomed append's flush to reach the paused store",
        faults.puts_begun_reach(begun + 1),
    )
    .await;
    b.open(doomed, 2).await.unwrap();
    b.delete(doomed).await.unwrap();
    faults.resume();
    assert!(matches!(
        pending.await.unwrap(),
        Err(StreamError::NotFound { .. } | StreamError::Fenced { .. })
    ));
    assert!(a.failed().is_none(), "the engine goes on");
    assert_eq!(
        a.append(other, 1, payload(other, 1), None)
            .await
            .unwrap()
            .base_offset,
        1
    );
    a.shutdown().await;
    b.shutdown().await;
}
suite!(a_stream_deleted_under_an_append_fails_only_that_stream);

async fn an_id_forgotten_while_its_put_was_slow_is_replaced(world: World) {
    let faults = ObjectFaults::new(81);
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&faults),
    ));
    let clock = mink_metadata::ManualClock::new(1_800_000_000_000);
    let short = EngineConfig {
        prepare_ttl: Duration::from_millis(200),
        clock: clock.clone(),
        ..config()
    };
    let engine = world.node_on(1, store, short).await;
    let s = new_stream(&engine).await;
    engine.append(s, 1, payload(s, 0), None).await.unwrap();
    let epoch = coordinator_epoch(&engine).await;
    // The next PUT takes long enough for its id to expire and be cleaned meanwhile.
    faults.slow_next_put_us.store(600_000, Ordering::Relaxed);
    let begun = faults.puts_begun();
    let slow = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.append(s, 1, payload(s, 1), None).await })
    };
    within("the slow PUT to begin", faults.puts_begun_reach(begun + 1)).await;
    clock.advance(Duration::from_millis(400));
    let cleaned = engine.cleanup_once(epoch, &compaction()).await.unwrap();
    assert!(cleaned.deleted > 0, "{cleaned:?}");
    assert_eq!(slow.await.unwrap().unwrap().base_offset, 1);
    assert!(engine.stats().reputs_after_expiry.load(Ordering::Relaxed) >= 1);
    assert!(engine.failed().is_none());
    assert_eq!(read_all(&engine, s, 0).await.len(), 2);
    engine.shutdown().await;
}
suite!(an_id_forgotten_while_its_put_was_slow_is_replaced);

async fn an_impossible_rejection_fails_the_engine(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    engine.append(s, 1, payload(s, 0), None).await.unwrap();
    // Someone commits to the stream behind the engine's back (same node, same epoch): the
    // engine's view of the stream's end is now wrong, which it cannot have caused.
    let node = engine.sink().node();
    let ids = engine
        .sink()
        .propose(Command::PrepareObject(mink_metadata::PrepareObject {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            count: 1,
            expires_at_ms: u64::MAX,
        }))
        .await
        .unwrap();
    let Ok(mink_metadata::Outcome::Done(mink_metadata::Reply::Range(r))) = ids.result else {
        panic!("prepared");
    };
    let sneaky = engine
        .sink()
        .propose(Command::CommitStreamSetObject(
            mink_metadata::CommitStreamSetObject {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                object_id: r.start,
                object_size: 1,
                ranges: vec![mink_metadata::StreamRange {
                    stream_id: s,
                    stream_epoch: 1,
                    start_offset: 1,
                    end_offset: 2,
                    writers: vec![],
                }],
                compacted_object_ids: vec![],
            },
        ))
        .await
        .unwrap();
    assert!(sneaky.result.is_ok());
    let refused = engine.append(s, 1, payload(s, 1), None).await;
    assert!(
        matches!(refused, Err(StreamError::Failed(_))),
        "{refused:?}"
    );
    assert!(matches!(engine.failed(), Some(StreamError::Failed(_))));
    assert!(matches!(
        engine.append(s, 1, payload(s, 2), None).await,
        Err(StreamError::Failed(_))
    ));
    engine.shutdown().await;
}
suite!(an_impossible_rejection_fails_the_engine);

/// Appends `n` records of 1 KiB to `s`, all in flight together (so they share objects).
async fn append_kib_records(engine: &S3Stream, s: u64, n: u64) {
    let appends: Vec<_> = (0..n)
        .map(|i| engine.append(s, 1, Bytes::from(vec![(i % 251) as u8; 1024]), None))
        .collect();
    for a in futures::future::join_all(appends).await {
        a.unwrap();
    }
}

/// GETs of a node's foreground fetches (all of its object reads but the read-ahead's).
fn fetch_reads(node: &S3Stream) -> u64 {
    let s = node.stats();
    s.object_reads.load(Ordering::Relaxed) - s.read_ahead_reads.load(Ordering::Relaxed)
}

/// A reader of stream `s` fetching 4 KiB at a time from `next`, each fetch where the last
/// one ended.
struct Sequential<'a> {
    reader: &'a S3Stream,
    s: u64,
    next: u64,
}

impl Sequential<'_> {
    async fn fetch(&mut self) {
        let got = self.reader.fetch(self.s, self.next, 4 << 10).await.unwrap();
        assert_eq!(got[0].base_offset, self.next);
        self.next = got.last().unwrap().end_offset();
    }

    /// Two fetches, which prove the reader sequential and start a read-ahead, and that
    /// read-ahead's end.
    async fn start_a_read_ahead(&mut self) {
        self.fetch().await;
        self.fetch().await;
        tokio::time::timeout(Duration::from_secs(30), self.reader.read_aheads_settled())
            .await
            .expect("waited 30 s for the read-ahead started by two sequential fetches to end");
    }

    /// `n` fetches that make no GET of their own (`why` says why they should not).
    async fn fetches_read_nothing(&mut self, n: usize, why: &str) {
        let before = fetch_reads(self.reader);
        for _ in 0..n {
            self.fetch().await;
        }
        assert_eq!(fetch_reads(self.reader), before, "{why}");
    }
}

async fn cold_reads_coalesce_blocks_and_read_ahead(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    // 1 KiB appends in flight together: objects of 64 KiB or more, blocks of 4 KiB, all of
    // the one stream, so each object holds a run of adjacent blocks.
    append_kib_records(&engine, s, 512).await;
    let objects = engine.stats().flushes.load(Ordering::Relaxed);
    let hot = read_all(&engine, s, 0).await;

    // Without read-ahead, fetches of 1 MiB: per object one GET for its index (with the
    // footer) and one for its run of blocks, but for a few more to have four GETs in flight.
    let cold = world
        .node_on(
            2,
            Arc::clone(&world.store),
            EngineConfig {
                read_ahead_bytes: 0,
                ..config()
            },
        )
        .await;
    let mut all = Vec::new();
    while all.len() < hot.len() {
        let from = all.last().map_or(0, |b: &RecordBatch| b.end_offset());
        all.extend(
            cold.fetch(s, from, 1 << 20)
                .await
                .unwrap()
                .into_iter()
                .map(untimed),
        );
    }
    assert_eq!(all, hot);
    let reads = cold.stats().object_reads.load(Ordering::Relaxed);
    assert!(
        reads <= 2 * objects + 4,
        "{reads} GETs to read {objects} objects of 4 KiB blocks cold: blocks were not coalesced"
    );
    cold.shutdown().await;

    // A sequential reader: its third fetch on finds its blocks loaded ahead of it.
    let reader = world
        .node_on(
            3,
            Arc::clone(&world.store),
            EngineConfig {
                read_ahead_bytes: 32 << 10,
                ..config()
            },
        )
        .await;
    let mut seq = Sequential {
        reader: &reader,
        s,
        next: 0,
    };
    seq.start_a_read_ahead().await;
    assert!(
        reader.stats().read_ahead_bytes.load(Ordering::Relaxed) >= 32 << 10,
        "two sequential fetches read 32 KiB ahead"
    );
    seq.fetches_read_nothing(
        6,
        "24 KiB inside the 32 KiB read ahead: the fetches read nothing themselves",
    )
    .await;
    // And the whole stream still reads back, read-ahead or not.
    assert_eq!(read_all(&reader, s, 0).await, hot);
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(cold_reads_coalesce_blocks_and_read_ahead);

/// A sequential reader's read-ahead window is four of its fetches, not `read_ahead_bytes`:
/// many small readers (Kafka consumers fetch a megabyte per partition) fit the budget.
async fn read_ahead_windows_follow_their_readers_fetches(world: World) {
    let engine = world.node(1).await;
    let s = new_stream(&engine).await;
    append_kib_records(&engine, s, 2048).await;
    let reader = world.node_on(2, Arc::clone(&world.store), config()).await;
    let first = reader.fetch(s, 0, 300 << 10).await.unwrap();
    let got = reader
        .fetch(s, first.last().unwrap().end_offset(), 300 << 10)
        .await
        .unwrap();
    let fetched: usize = got.iter().map(|b| b.payload.len()).sum();
    tokio::time::timeout(Duration::from_secs(30), reader.read_aheads_settled())
        .await
        .expect("waited 30 s for the read-ahead started by two sequential fetches to end");
    let ahead = reader.stats().read_ahead_bytes.load(Ordering::Relaxed) as usize;
    // Blocks are 4 KiB: the window ends within a block (and its framing) of four fetches.
    assert!(
        (4 * fetched..4 * fetched + (8 << 10)).contains(&ahead),
        "{ahead} bytes read ahead after a fetch of {fetched}: expected four fetches' worth"
    );
    let before = fetch_reads(&reader);
    let next = got.last().unwrap().end_offset();
    let again = reader.fetch(s, next, 300 << 10).await.unwrap();
    assert_eq!(again[0].base_offset, next);
    let st = reader.stats();
    assert_eq!(
        fetch_reads(&reader),
        before,
        "the second fetch was read ahead (index GETs {}, whole {}, read-ahead {}, at {next}, ahead {ahead})",
        st.index_reads.load(Ordering::Relaxed),
        st.whole_object_reads.load(Ordering::Relaxed),
        st.read_ahead_reads.load(Ordering::Relaxed),
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(read_ahead_windows_follow_their_readers_fetches);

/// `rounds` stream-set objects of `streams`: in object `r`, one 4 KiB block of each stream
/// in turn (4 batches of 1 KiB holding `r`, offsets 4r..4r+4). Then a node without read-ahead
/// to read them, block by block.
async fn stream_set_objects(
    world: &World,
    engine: &S3Stream,
    streams: &[u64],
    rounds: u8,
) -> S3Stream {
    for round in 0..rounds {
        let appends: Vec<_> = streams
            .iter()
            .flat_map(|&s| (0..4).map(move |_| s))
            .map(|s| engine.append(s, 1, Bytes::from(vec![round; 1024]), None))
            .collect();
        for r in futures::future::join_all(appends).await {
            r.unwrap();
        }
    }
    world
        .node_on(
            2,
            Arc::clone(&world.store),
            EngineConfig {
                flush_bytes: 8 << 20,
                read_ahead_bytes: 0,
                ..config()
            },
        )
        .await
}

/// Reads the batch at `offset` of `s` on `reader`, which holds `offset / 4` (see
/// [`stream_set_objects`]).
async fn read_batch(reader: &S3Stream, s: u64, offset: u64) {
    let got = reader.fetch(s, offset, 1).await.unwrap();
    assert_eq!(got[0].base_offset, offset);
    assert_eq!(
        got[0].payload[0],
        (offset / 4) as u8,
        "stream {s} offset {offset}"
    );
}

/// A block read from object storage is checksummed once, as it arrives: fetches that start
/// within it decode it from the block cache without summing it again. A block failing its
/// checksum fails the reads of its stream with the object named, and never hands out its
/// bytes; the other streams of its object read on, whether the object was read whole or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blocks_are_checksummed_once_and_a_bad_one_fails_only_its_reads() {
    let world = World::new(Kind::Local).unwrap();
    let engine = world.node(1).await;
    let streams = new_streams(&engine, 2).await;
    let (a, b) = (streams[0], streams[1]);
    let reader = stream_set_objects(&world, &engine, &streams, 4).await;
    // 16 fetches of one batch each, four per block: four blocks of `a`, plus any adjacent block
    // of `b` a GET took along.
    for offset in 0..16 {
        read_batch(&reader, a, offset).await;
    }
    let verified = reader.stats().blocks_verified.load(Ordering::Relaxed);
    assert!(
        (4..=8).contains(&verified),
        "{verified} block checksums for 16 fetches of 4 blocks (of 8 in the objects)"
    );
    reader.shutdown().await;

    // Flip a byte of `b`'s block in the third object.
    let object_id = engine
        .sink()
        .view()
        .state
        .stream_ranges(b, 8, 12)
        .next()
        .unwrap()
        .object_id;
    let path = object_path(&config().object_prefix, object_id);
    let object = world.store.get(&path).await.unwrap().bytes().await.unwrap();
    let footer = format::parse_footer(&object, object.len() as u64).unwrap();
    let at = footer.index_position as usize;
    let index = format::parse_index(&object[at..at + footer.index_len as usize], &footer).unwrap();
    let block = index.iter().find(|e| e.stream_id == b).unwrap();
    let mut bad = object.to_vec();
    bad[block.position as usize + 20] ^= 0x40;
    world.store.put(&path, bad.into()).await.unwrap();

    // Read whole by a reader from `a`'s start (one reader is half of two streams), and by its
    // index and ranges by one that starts at `b`'s corrupt block.
    for from_start in [true, false] {
        let cold = world.node(3).await;
        if from_start {
            assert_eq!(read_all(&cold, a, 0).await.len(), 16);
        }
        for offset in 0..8 {
            read_batch(&cold, b, offset).await;
        }
        match cold.fetch(b, 8, 1).await {
            Err(StreamError::Storage(e)) => assert!(
                e.contains(&format!(
                    "object {object_id} is corrupt: block checksum mismatch"
                )),
                "{e}"
            ),
            other => panic!("a corrupt block was read: {other:?}"),
        }
        if from_start {
            assert!(cold.stats().whole_object_reads.load(Ordering::Relaxed) > 0);
        } else {
            assert_eq!(read_all(&cold, a, 0).await.len(), 16);
        }
        cold.shutdown().await;
    }
    engine.shutdown().await;
}

async fn readers_of_many_streams_share_gets(world: World) {
    let engine = world.node(1).await;
    let (a, b) = (new_stream(&engine).await, new_stream(&engine).await);
    // Four objects, each one block of `a` then one of `b`.
    let reader = stream_set_objects(&world, &engine, &[a, b], 4).await;
    let read = async |s: u64, offset: u64| read_batch(&reader, s, offset).await;
    // Both streams read sequentially through the first object.
    for offset in 0..4 {
        read(a, offset).await;
        read(b, offset).await;
    }
    // `a` moves into the second object: its GET takes `b`'s next block along, so `b` reads
    // it without a GET of its own.
    let before = fetch_reads(&reader);
    read(a, 4).await;
    assert_eq!(fetch_reads(&reader), before + 1, "one GET for both blocks");
    read(b, 4).await;
    assert_eq!(
        fetch_reads(&reader),
        before + 1,
        "b's block came with a's GET: no GET for it"
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(readers_of_many_streams_share_gets);

/// A GET widened for other streams' readers reads over a block some earlier read loaded (a
/// reader ahead of the others) to reach the wanted blocks beyond it, rather than stopping there
/// and leaving each of them a GET of its own.
async fn widened_gets_pass_over_loaded_blocks(world: World) {
    let engine = world.node(1).await;
    let [a, b, c] = new_streams(&engine, 3).await[..] else {
        unreachable!("three streams")
    };
    // Two objects, each one block of `a`, one of `b`, one of `c`.
    let reader = stream_set_objects(&world, &engine, &[a, b, c], 2).await;
    let read = async |s: u64, offset: u64| read_batch(&reader, s, offset).await;
    // `b` jumps ahead into the second object (nobody else reads yet: its block alone).
    read(b, 4).await;
    // `a` and `c` read sequentially through the first object.
    for offset in 0..4 {
        read(a, offset).await;
        read(c, offset).await;
    }
    // `a` moves on: its GET takes `c`'s block along, over `b`'s loaded one between them.
    let before = fetch_reads(&reader);
    read(a, 4).await;
    assert_eq!(
        fetch_reads(&reader),
        before + 1,
        "one GET for a's and c's blocks"
    );
    read(c, 4).await;
    read(b, 5).await;
    assert_eq!(
        fetch_reads(&reader),
        before + 1,
        "c's block came with a's GET, b's was loaded: no GET for either"
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(widened_gets_pass_over_loaded_blocks);

/// An object one reader ran ahead into (read by its index and ranges, its block alone: the
/// others were too far behind to take theirs along) is read at most twice: the GET of the
/// second stream's reader to reach it takes the rest of it along for the readers of its
/// other streams, however far behind, and they read their blocks without a GET of their own.
async fn a_second_reader_takes_the_rest_of_an_object_along(world: World) {
    let engine = world.node(1).await;
    let streams = new_streams(&engine, 4).await;
    let [a, b, c, d] = streams[..] else {
        unreachable!("four streams")
    };
    // Three objects, each one block of every stream.
    let reader = stream_set_objects(&world, &engine, &streams, 3).await;
    let read = async |s: u64, offset: u64| read_batch(&reader, s, offset).await;
    // All four read through the first object; `a` runs ahead into the third, alone: the
    // others' reach (two fetches) ends in the second.
    for offset in 0..4 {
        for &s in &streams {
            read(s, offset).await;
        }
    }
    for offset in 4..12 {
        read(a, offset).await;
    }
    // `b` follows into the third object: one GET, for its block and `c`'s and `d`'s.
    for offset in 4..8 {
        read(b, offset).await;
    }
    let before = fetch_reads(&reader);
    read(b, 8).await;
    assert_eq!(
        fetch_reads(&reader),
        before + 1,
        "b's GET of the third object"
    );
    for s in [c, d] {
        for offset in 4..12 {
            read(s, offset).await;
        }
    }
    read(b, 9).await;
    assert_eq!(
        fetch_reads(&reader),
        before + 1,
        "c's and d's blocks of the third object came with b's GET: no GET for either"
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(a_second_reader_takes_the_rest_of_an_object_along);

/// A block a GET took along for another stream's reader is kept in the block cache until that
/// reader reads it, while the reader that asked for the GET reads on through more than the
/// cache holds: in the cache's regular part it would be evicted first, and read again.
async fn blocks_taken_along_are_kept_until_read(world: World) {
    let engine = world.node(1).await;
    let streams = new_streams(&engine, 5).await;
    let (a, b) = (streams[0], streams[1]);
    // Eight objects, each one block of every stream (of five: two readers are too few to
    // read one whole). A reader whose cache holds about three blocks.
    stream_set_objects(&world, &engine, &streams, 8)
        .await
        .shutdown()
        .await;
    let reader = world
        .node_on(
            3,
            Arc::clone(&world.store),
            EngineConfig {
                read_ahead_bytes: 0,
                block_cache_bytes: 16 << 10,
                ..config()
            },
        )
        .await;
    let read = async |s: u64, offset: u64| read_batch(&reader, s, offset).await;
    for offset in 0..4 {
        read(a, offset).await;
        read(b, offset).await;
    }
    // `a` enters the second object: its GET takes `b`'s block along. Then it reads on through
    // six more blocks of its own, each more than a third of the cache.
    read(a, 4).await;
    for offset in 5..32 {
        read(a, offset).await;
    }
    let before = fetch_reads(&reader);
    read(b, 4).await;
    assert_eq!(
        fetch_reads(&reader),
        before,
        "b's block, taken along by a's GET, was still cached"
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(blocks_taken_along_are_kept_until_read);

/// A read-ahead over blocks cached ahead of their reader (here by a whole-object read) leaves
/// them unread: counted as read, they went into the cache's regular part and other readers'
/// blocks evicted them before their reader came, who read them again.
async fn a_read_ahead_leaves_cached_blocks_unread(world: World) {
    let engine = world.node(1).await;
    let (s, t) = (new_stream(&engine).await, new_stream(&engine).await);
    // Objects of 16 KiB of one stream each, read whole by a reader entering them at their
    // start, of four blocks (of four 1 KiB batches): 16 of `s`, then 64 of `t`.
    for (stream, objects) in [(s, 16), (t, 64)] {
        for _ in 0..objects {
            append_kib_records(&engine, stream, 16).await;
        }
    }
    let reader = world
        .node_on(
            2,
            Arc::clone(&world.store),
            EngineConfig {
                read_ahead_bytes: 32 << 10,
                block_cache_bytes: 512 << 10,
                ..config()
            },
        )
        .await;
    let mut seq = Sequential {
        reader: &reader,
        s,
        next: 0,
    };
    // `s`'s first object read whole; the second fetch starts a read-ahead over the next
    // 32 KiB, of which the first object's last two blocks are cached already.
    seq.start_a_read_ahead().await;
    // Another reader reads twice the cache's size meanwhile.
    assert_eq!(read_all(&reader, t, 0).await.len(), 1024);
    seq.fetches_read_nothing(
        8,
        "the 32 KiB after the second fetch were cached, unread, since before the other reader read",
    )
    .await;
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(a_read_ahead_leaves_cached_blocks_unread);

/// Readers of many streams starting together on a cold node (a consumer group catching up)
/// read each object's index once, and share the GETs of the objects their streams are slices
/// of from their first fetch on.
async fn readers_starting_together_share_their_first_gets(world: World) {
    let engine = world.node(1).await;
    let streams = new_streams(&engine, 4).await;
    // Two objects, each one block of every stream.
    stream_set_objects(&world, &engine, &streams, 2)
        .await
        .shutdown()
        .await;
    // GETs that take a while, as real ones do (an in-memory store answers at once: then one
    // reader's fetch is over before the next one starts).
    let faults = ObjectFaults::new(3);
    faults.latency_us.store(2_000, Ordering::Relaxed);
    let slow: Arc<dyn ObjectStore> = Arc::new(FaultyObjectStore::new(
        Arc::clone(&world.store),
        Arc::clone(&faults),
    ));
    let reader = world
        .node_on(
            3,
            slow,
            EngineConfig {
                read_ahead_bytes: 0,
                ..config()
            },
        )
        .await;
    let got = futures::future::join_all(streams.iter().map(|&s| reader.fetch(s, 0, 1))).await;
    for (s, got) in streams.iter().zip(got) {
        assert_eq!(got.unwrap()[0].base_offset, 0, "stream {s}");
    }
    let stats = reader.stats();
    let indexes = stats.index_reads.load(Ordering::Relaxed);
    assert_eq!(
        indexes, 1,
        "the first object's index, read once (a one-byte fetch needs no other)"
    );
    assert_eq!(
        fetch_reads(&reader) - indexes,
        1,
        "the four readers' first blocks, adjacent in the first object, in one GET"
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(readers_starting_together_share_their_first_gets);

/// A writer whose objects are cut by size alone (64 KiB): the 5 ms flush delay of
/// [`config`] can cut one short on a busy machine, and the tests reading within the first
/// object count on its 64 KiB.
async fn size_cut_writer(world: &World) -> S3Stream {
    world
        .node_on(
            1,
            Arc::clone(&world.store),
            EngineConfig {
                flush_delay: Duration::from_secs(5),
                ..config()
            },
        )
        .await
}

/// A node whose read-ahead windows (64 KiB) never fit its budget (a quarter of a 128 KiB
/// block cache), to read `s` with.
async fn windowless_reader(world: &World) -> S3Stream {
    world
        .node_on(
            2,
            Arc::clone(&world.store),
            EngineConfig {
                read_ahead_bytes: 64 << 10,
                block_cache_bytes: 128 << 10,
                ..config()
            },
        )
        .await
}

/// A sequential reader left without a read-ahead window (the budget is spent) still reads on:
/// once its fetches have proven sequential, its GET takes along the next blocks of its stream
/// within its reach, and the fetches after it read nothing themselves.
async fn a_sequential_reader_without_a_window_reads_on_in_its_own_gets(world: World) {
    let engine = size_cut_writer(&world).await;
    let s = new_stream(&engine).await;
    // Objects of 64 KiB or more, blocks of 4 KiB, all of the one stream.
    append_kib_records(&engine, s, 512).await;
    let reader = windowless_reader(&world).await;
    // Not at the stream's start: the reader proves itself sequential first.
    let mut seq = Sequential {
        reader: &reader,
        s,
        next: 8,
    };
    seq.fetch().await;
    seq.fetch().await;
    let before = fetch_reads(&reader);
    seq.fetch().await;
    assert_eq!(fetch_reads(&reader), before + 1, "the third fetch: one GET");
    seq.fetches_read_nothing(
        8,
        "32 KiB within the first object and the reader's reach came with that GET",
    )
    .await;
    assert_eq!(reader.stats().read_ahead_reads.load(Ordering::Relaxed), 0);
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(a_sequential_reader_without_a_window_reads_on_in_its_own_gets);

/// A reader whose first fetch is at the stream's start (a consumer catching up from the
/// earliest offset) reads on from its first GET, which takes along the next blocks of its
/// stream within its reach.
async fn a_reader_from_the_start_reads_on_from_its_first_get(world: World) {
    let engine = size_cut_writer(&world).await;
    let s = new_stream(&engine).await;
    append_kib_records(&engine, s, 512).await;
    let reader = windowless_reader(&world).await;
    let mut seq = Sequential {
        reader: &reader,
        s,
        next: 0,
    };
    // Its GETs after the first fetch: indexes of the stream's first objects, and one run of
    // blocks.
    seq.fetch().await;
    seq.fetches_read_nothing(
        8,
        "36 KiB within the first object and the reader's 64 KiB reach came with its first GET",
    )
    .await;
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(a_reader_from_the_start_reads_on_from_its_first_get);

/// The read path has at most `max_reads_in_flight` GETs in flight; the others wait their turn
/// (counted as queued), and every read completes with the right data.
async fn reads_in_flight_are_bounded(world: World) {
    let engine = world.node(1).await;
    // Streams flushed one after another, each into objects of its own: cold readers of them
    // all need GETs of their own.
    let mut streams = Vec::new();
    for _ in 0..6 {
        let s = new_stream(&engine).await;
        append_kib_records(&engine, s, 8).await;
        streams.push(s);
    }
    let mut hot = Vec::new();
    for &s in &streams {
        hot.push(read_all(&engine, s, 0).await);
    }
    let (reader, faults) = world
        .faulty_node(
            2,
            7,
            EngineConfig {
                max_reads_in_flight: 2,
                ..config()
            },
        )
        .await;
    faults.pause();
    let reads: Vec<_> = streams
        .iter()
        .map(|&s| {
            let reader = reader.clone();
            tokio::spawn(async move { read_all(&reader, s, 0).await })
        })
        .collect();
    let bound_at_work = async {
        faults.gets_in_flight_reach(2).await;
        reader.stat_reaches(|s| &s.reads_queued, 1).await;
    };
    if tokio::time::timeout(Duration::from_secs(30), bound_at_work)
        .await
        .is_err()
    {
        panic!(
            "waited 30 s for 2 GETs at the paused store and more queued behind them: \
             {} at the store, {} queued",
            faults.gets_in_flight(),
            reader.stats().reads_queued.load(Ordering::Relaxed)
        );
    }
    faults.resume();
    for (read, hot) in reads.into_iter().zip(hot) {
        assert_eq!(read.await.unwrap(), hot);
    }
    assert_eq!(
        faults.max_gets_in_flight(),
        2,
        "at most max_reads_in_flight GETs at the store at once"
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(reads_in_flight_are_bounded);

/// The sizes of the objects holding `s`, every one a stream object of its own.
fn stream_object_sizes(engine: &S3Stream, s: u64) -> Vec<u64> {
    let view = engine.sink().view();
    let end = engine.info(s).unwrap().end_offset;
    view.state
        .stream_ranges(s, 0, end)
        .map(|r| {
            let o = &view.state.objects[&r.object_id];
            assert_eq!(o.kind(), mink_metadata::ObjectKind::Stream, "{r:?}");
            o.size
        })
        .collect()
}

/// A reader that reads on, entering a small stream object at its start (a consumer catching
/// up after compaction), reads it whole: its index and blocks in one GET per object. Objects
/// read whole stay within half the block cache beside the blocks readers have been given and
/// not read yet; past that, a reader reads the index and its blocks as before.
async fn a_reader_entering_a_stream_object_reads_it_whole(world: World) {
    let engine = world.node(1).await;
    let [a, b, c] = new_streams(&engine, 3).await[..] else {
        unreachable!("three streams")
    };
    append_kib_records(&engine, a, 48).await;
    append_kib_records(&engine, b, 48).await;
    append_kib_records(&engine, c, 48).await;
    engine.compact_once(1, &compaction()).await.unwrap();
    // Two rounds: a in two stream objects (each too large to merge within 64 KiB).
    append_kib_records(&engine, a, 48).await;
    engine.compact_once(1, &compaction()).await.unwrap();
    let sizes_a = stream_object_sizes(&engine, a);
    assert_eq!(sizes_a.len(), 2, "a in two stream objects");
    let size_b = stream_object_sizes(&engine, b)[0];
    let hot: Vec<_> = [a, b, c]
        .iter()
        .map(|&s| read_all(&engine, s, 0))
        .collect::<futures::future::JoinAll<_>>()
        .await;
    let whole = |n: &S3Stream| n.stats().whole_object_reads.load(Ordering::Relaxed);

    // Room enough: one GET per object, nothing else.
    let reader = world.node(2).await;
    assert_eq!(read_all(&reader, a, 0).await, hot[0]);
    assert_eq!(whole(&reader), 2);
    assert_eq!(reader.stats().object_reads.load(Ordering::Relaxed), 2);
    reader.shutdown().await;

    // Half the block cache holds a's first object and half of b's: once a's first block is
    // read, the rest of it is unread and b's object does not fit beside it.
    let reader = world
        .node_on(
            3,
            Arc::clone(&world.store),
            EngineConfig {
                block_cache_bytes: usize::try_from(2 * sizes_a[0] + size_b).unwrap(),
                read_ahead_bytes: 0,
                ..config()
            },
        )
        .await;
    let first = reader.fetch(a, 0, 1).await.unwrap();
    assert_eq!(untimed(first[0].clone()), hot[0][0]);
    assert_eq!(whole(&reader), 1, "a's first object, read whole");
    assert_eq!(read_all(&reader, b, 0).await, hot[1]);
    assert_eq!(whole(&reader), 1, "b's object read by its index and blocks");
    let gets = reader.stats().object_reads.load(Ordering::Relaxed);
    assert!(gets >= 3, "{gets} GETs: a's object, b's index and blocks");
    assert_eq!(read_all(&reader, a, 0).await, hot[0]);
    assert_eq!(whole(&reader), 2, "a's second object, read whole");
    // a is read: nothing is unread, and c's object fits again.
    assert_eq!(read_all(&reader, c, 0).await, hot[2]);
    assert_eq!(whole(&reader), 3, "c's object, read whole");
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(a_reader_entering_a_stream_object_reads_it_whole);

/// Reads `streams` from their start in lockstep, `chunk` bytes per fetch of each in turn (as
/// consumers catching up together do), checking each is contiguous.
async fn read_in_lockstep(
    engine: &S3Stream,
    streams: &[u64],
    chunk: usize,
) -> Vec<Vec<RecordBatch>> {
    let ends: Vec<u64> = streams
        .iter()
        .map(|&s| engine.info(s).unwrap().end_offset)
        .collect();
    let mut next = vec![0u64; streams.len()];
    let mut out = vec![Vec::new(); streams.len()];
    while next.iter().zip(&ends).any(|(n, e)| n < e) {
        for (i, &s) in streams.iter().enumerate() {
            if next[i] == ends[i] {
                continue;
            }
            let batches = engine.fetch(s, next[i], chunk).await.unwrap();
            assert!(!batches.is_empty(), "no data at {} of {s}", next[i]);
            for b in batches {
                assert!(
                    b.base_offset <= next[i] && b.end_offset() > next[i],
                    "gap: {b:?}"
                );
                next[i] = b.end_offset();
                out[i].push(untimed(b));
            }
        }
    }
    out
}

/// Four streams in `rounds` stream-set objects ([`stream_set_objects`]) on node 1: the node,
/// the streams and what each holds (read hot).
async fn four_streams_in_shared_objects(
    world: &World,
    rounds: u8,
) -> (S3Stream, Vec<u64>, Vec<Vec<RecordBatch>>) {
    let engine = world.node(1).await;
    let streams = new_streams(&engine, 4).await;
    stream_set_objects(world, &engine, &streams, rounds)
        .await
        .shutdown()
        .await;
    let hot = read_in_lockstep(&engine, &streams, 4 << 10).await;
    (engine, streams, hot)
}

/// Readers catching up on the streams of a small stream-set object together read it whole,
/// index and blocks in one GET, once at least half of its streams' readers read on; a reader
/// alone reads its index and its own blocks.
async fn readers_catching_up_together_read_stream_set_objects_whole(world: World) {
    let rounds = 6;
    let (engine, streams, hot) = four_streams_in_shared_objects(&world, rounds).await;
    let whole = |n: &S3Stream| n.stats().whole_object_reads.load(Ordering::Relaxed);
    let reader_config = EngineConfig {
        read_ahead_bytes: 0,
        ..config()
    };

    // Alone, a reader is a quarter of each object's streams: never whole.
    let reader = world
        .node_on(3, Arc::clone(&world.store), reader_config.clone())
        .await;
    assert_eq!(
        read_in_lockstep(&reader, &streams[..1], 4 << 10).await[0],
        hot[0]
    );
    assert_eq!(whole(&reader), 0, "a reader alone reads indexes and blocks");
    reader.shutdown().await;

    // Together: once their readers read on, the objects they enter come whole.
    let reader = world
        .node_on(4, Arc::clone(&world.store), reader_config)
        .await;
    assert_eq!(read_in_lockstep(&reader, &streams, 4 << 10).await, hot);
    let (w, gets) = (
        whole(&reader),
        reader.stats().object_reads.load(Ordering::Relaxed),
    );
    assert!(
        w + 2 >= u64::from(rounds),
        "{w} of {rounds} objects read whole ({gets} GETs)"
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(readers_catching_up_together_read_stream_set_objects_whole);

/// Readers catching up apart, with room beside the blocks they were given for one object only:
/// readers entering the next object wait for the others to read theirs, then read it whole,
/// where they would have read its index and ranges (more GETs).
async fn objects_to_read_whole_wait_for_room_beside_unread_blocks(world: World) {
    whole_reads_beside_unread_blocks(world, true).await;
}
suite!(objects_to_read_whole_wait_for_room_beside_unread_blocks);

/// The same, but the other two readers do not read theirs until the first two are done: each
/// wait ends (after a quarter of `whole_read_wait` without a block read), the objects are read
/// by their indexes and ranges, and everything reads back.
async fn objects_to_read_whole_wait_no_longer_when_nobody_reads(world: World) {
    whole_reads_beside_unread_blocks(world, false).await;
}
suite!(objects_to_read_whole_wait_no_longer_when_nobody_reads);

/// [`objects_to_read_whole_wait_for_room_beside_unread_blocks`], the other two readers reading
/// on while the first two wait (`others_read`) or only once they are done.
async fn whole_reads_beside_unread_blocks(world: World, others_read: bool) {
    let rounds = 8;
    let (engine, streams, hot) = four_streams_in_shared_objects(&world, rounds).await;
    let largest = {
        let view = engine.sink().view();
        view.state.objects.values().map(|o| o.size).max().unwrap()
    };
    // Half the cache holds an object beside one stream's unread block of another, not two.
    let reader = world
        .node_on(
            3,
            Arc::clone(&world.store),
            EngineConfig {
                read_ahead_bytes: 0,
                block_cache_bytes: usize::try_from(largest * 13 / 5).unwrap(),
                // Long enough for the others to come on a busy machine: what is measured is
                // that the wait ends when they read, not by the clock.
                whole_read_wait: if others_read {
                    Duration::from_secs(30)
                } else {
                    Duration::from_millis(40)
                },
                ..config()
            },
        )
        .await;
    // Reads `some` streams on together, each from where `got` ends, to their end.
    let read_on = |some: Vec<u64>, mut got: Vec<Vec<RecordBatch>>| {
        let reader = reader.clone();
        async move {
            let end = reader.info(some[0]).unwrap().end_offset;
            let next = |b: &Vec<RecordBatch>| b.last().map_or(0, RecordBatch::end_offset);
            while got.iter().any(|b| next(b) < end) {
                for (i, &s) in some.iter().enumerate() {
                    let from = next(&got[i]);
                    got[i].extend(reader.fetch(s, from, 4 << 10).await.unwrap());
                }
            }
            got.into_iter()
                .map(|b| b.into_iter().map(untimed).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        }
    };
    // Every stream's reader is known (its first fetch); then two read on together: the
    // objects they enter come whole, with the other two streams' blocks, which stay unread.
    let mut first = Vec::new();
    for &s in &streams {
        first.push(reader.fetch(s, 0, 4 << 10).await.unwrap());
    }
    let ahead = tokio::spawn(read_on(streams[..2].to_vec(), first[..2].to_vec()));
    let stats = reader.stats();
    let waited = reader.stat_reaches(|s| &s.whole_reads_waited, 1);
    if tokio::time::timeout(Duration::from_secs(20), waited)
        .await
        .is_err()
    {
        panic!(
            "no whole read waited for room: {} whole, {} refused",
            stats.whole_object_reads.load(Ordering::Relaxed),
            stats.whole_reads_refused.load(Ordering::Relaxed),
        );
    }
    let counts = || {
        (
            stats.whole_object_reads.load(Ordering::Relaxed),
            stats.whole_reads_waited.load(Ordering::Relaxed),
            stats.whole_reads_refused.load(Ordering::Relaxed),
            stats.object_reads.load(Ordering::Relaxed),
        )
    };
    if others_read {
        // The other two read theirs, which makes room.
        let mut got = read_on(streams[2..].to_vec(), first[2..].to_vec()).await;
        got.splice(0..0, ahead.await.unwrap());
        assert_eq!(got, hot);
        let (whole, waited, refused, gets) = counts();
        assert_eq!(
            refused, 0,
            "whole reads refused ({whole} whole, {waited} waited, {gets} GETs)"
        );
        assert!(
            whole + 3 >= u64::from(rounds),
            "{whole} of {rounds} objects read whole ({waited} waited, {gets} GETs)"
        );
    } else {
        let mut got = ahead.await.unwrap();
        let (whole, waited, refused, gets) = counts();
        assert!(
            refused > 0,
            "no whole read refused ({whole} whole, {waited} waited, {gets} GETs)"
        );
        got.extend(read_on(streams[2..].to_vec(), first[2..].to_vec()).await);
        assert_eq!(got, hot);
    }
    reader.shutdown().await;
    engine.shutdown().await;
}

/// Readers that start together join the index loads of the first one to plan, which knew only
/// itself: they are counted again when each GET may start, so every object but the one whose
/// GET started before they came is read whole.
async fn readers_starting_together_are_counted_when_their_gets_start(world: World) {
    let rounds = 6;
    let (engine, streams, hot) = four_streams_in_shared_objects(&world, rounds).await;
    // One GET at a time: the first reader's first index GET waits at the paused store, the
    // others it plans (every object's, in one fetch of a megabyte) wait for their turn.
    let (reader, faults) = world
        .faulty_node(
            3,
            11,
            EngineConfig {
                read_ahead_bytes: 0,
                max_reads_in_flight: 1,
                ..config()
            },
        )
        .await;
    let read = |s: u64| {
        let reader = reader.clone();
        async move {
            let end = reader.info(s).unwrap().end_offset;
            let mut out = Vec::new();
            while (out.last().map_or(0, RecordBatch::end_offset)) < end {
                let from = out.last().map_or(0, RecordBatch::end_offset);
                out.extend(reader.fetch(s, from, 1 << 20).await.unwrap());
            }
            out.into_iter().map(untimed).collect::<Vec<_>>()
        }
    };
    faults.pause();
    let mut reads: Vec<_> = streams.iter().map(|&s| Box::pin(read(s))).collect();
    // Polled once, each reader is known and waits: the first at the store, the others on the
    // loads it started.
    for r in &mut reads {
        assert!(futures::poll!(r.as_mut()).is_pending());
    }
    assert_eq!(faults.gets_in_flight(), 1, "one GET at the paused store");
    faults.resume();
    assert_eq!(futures::future::join_all(reads).await, hot);
    let w = reader.stats().whole_object_reads.load(Ordering::Relaxed);
    assert_eq!(
        w,
        u64::from(rounds) - 1,
        "objects read whole of {rounds} ({} GETs)",
        reader.stats().object_reads.load(Ordering::Relaxed)
    );
    reader.shutdown().await;
    engine.shutdown().await;
}
suite!(readers_starting_together_are_counted_when_their_gets_start);
