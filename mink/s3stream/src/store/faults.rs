//! Fault injection around a real object store. Requests still reach the real store; the
//! wrapper decides whether the caller sees a throttled request (503 SlowDown, nothing stored), a
//! server error, added latency, a pause, or an unknown outcome (the PUT landed but the caller
//! timed out waiting for the answer).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use tokio::sync::watch;

/// What an injected failure looked like to the caller.
#[derive(Debug, thiserror::Error)]
pub enum InjectedFault {
    #[error("injected: 503 SlowDown (request not processed)")]
    SlowDown,
    #[error("injected: 500 InternalError (request not processed)")]
    ServerError,
    #[error("injected: timed out after the request was sent (outcome unknown)")]
    UnknownOutcome,
}

/// Knobs shared between a test and the [`FaultyObjectStore`]s it wraps. Probabilities are per
/// mille and apply independently to each request.
#[derive(Debug)]
pub struct ObjectFaults {
    /// A PUT is throttled (503 SlowDown) and not stored.
    pub put_throttled: AtomicU32,
    /// A PUT is stored, then the caller times out: the outcome is unknown to it.
    pub put_unknown: AtomicU32,
    /// A GET, LIST or DELETE fails with a server error.
    pub read_error: AtomicU32,
    /// Added to every PUT, in microseconds (models a slow object store).
    pub put_latency_us: AtomicU64,
    /// Added to every other request, in microseconds.
    pub latency_us: AtomicU64,
    /// Added to the next PUT only, in microseconds (one slow request among fast ones).
    pub slow_next_put_us: AtomicU64,
    paused: watch::Sender<bool>,
    dice: mink_sql::Dice,
    puts: AtomicU64,
    /// GETs in flight now, watched by tests that wait for requests to reach the store.
    gets: watch::Sender<u64>,
    max_gets: AtomicU64,
    /// PUTs begun so far (waiting at a pause or a latency included).
    puts_begun: watch::Sender<u64>,
}

impl ObjectFaults {
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(ObjectFaults {
            put_throttled: AtomicU32::new(0),
            put_unknown: AtomicU32::new(0),
            read_error: AtomicU32::new(0),
            put_latency_us: AtomicU64::new(0),
            latency_us: AtomicU64::new(0),
            slow_next_put_us: AtomicU64::new(0),
            paused: watch::channel(false).0,
            dice: mink_sql::Dice::new(seed),
            puts: AtomicU64::new(0),
            gets: watch::channel(0).0,
            max_gets: AtomicU64::new(0),
            puts_begun: watch::channel(0).0,
        })
    }

    /// Every request from now on waits until [`ObjectFaults::resume`].
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    pub fn clear(&self) {
        for p in [&self.put_throttled, &self.put_unknown, &self.read_error] {
            p.store(0, Ordering::Relaxed);
        }
        self.put_latency_us.store(0, Ordering::Relaxed);
        self.latency_us.store(0, Ordering::Relaxed);
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.dice.injected()
    }

    /// PUTs that reached the real store.
    pub fn puts(&self) -> u64 {
        self.puts.load(Ordering::Relaxed)
    }

    /// GETs in flight now (waiting at a pause included).
    pub fn gets_in_flight(&self) -> u64 {
        *self.gets.borrow()
    }

    /// Returns once at least `n` GETs are in flight at once (waiting at a pause included).
    pub async fn gets_in_flight_reach(&self, n: u64) {
        let mut gets = self.gets.subscribe();
        let _ = gets.wait_for(|&g| g >= n).await;
    }

    /// Returns once at least `n` PUTs have begun (reached this store, at a pause or a latency
    /// or past them): a test's event for "the flush is at the store".
    pub async fn puts_begun_reach(&self, n: u64) {
        let mut begun = self.puts_begun.subscribe();
        let _ = begun.wait_for(|&p| p >= n).await;
    }

    /// PUTs begun so far.
    pub fn puts_begun(&self) -> u64 {
        *self.puts_begun.borrow()
    }

    /// The most GETs that were in flight at once.
    pub fn max_gets_in_flight(&self) -> u64 {
        self.max_gets.load(Ordering::Relaxed)
    }

    fn roll(&self, per_mille: &AtomicU32) -> bool {
        self.dice.roll(per_mille)
    }

    async fn gate(&self, latency: &AtomicU64) {
        let mut paused = self.paused.subscribe();
        let _ = paused.wait_for(|p| !*p).await;
        let us = latency.load(Ordering::Relaxed);
        if us > 0 {
            tokio::time::sleep(Duration::from_micros(us)).await;
        }
    }
}

fn fault(kind: InjectedFault) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyObjectStore",
        source: Box::new(kind),
    }
}

/// A GET in flight, counted while it lives (cancelled ones too).
struct InFlight<'a>(&'a ObjectFaults);

impl<'a> InFlight<'a> {
    fn new(faults: &'a ObjectFaults) -> Self {
        let mut now = 0;
        faults.gets.send_modify(|g| {
            *g += 1;
            now = *g;
        });
        faults.max_gets.fetch_max(now, Ordering::Relaxed);
        InFlight(faults)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.gets.send_modify(|g| *g -= 1);
    }
}

/// An [`ObjectStore`] that runs every request on `inner` under the shared [`ObjectFaults`].
#[derive(Debug)]
pub struct FaultyObjectStore {
    inner: Arc<dyn ObjectStore>,
    faults: Arc<ObjectFaults>,
}

impl FaultyObjectStore {
    pub fn new(inner: Arc<dyn ObjectStore>, faults: Arc<ObjectFaults>) -> Self {
        FaultyObjectStore { inner, faults }
    }

    async fn read_gate(&self) -> Result<()> {
        self.faults.gate(&self.faults.latency_us).await;
        if self.faults.roll(&self.faults.read_error) {
            return Err(fault(InjectedFault::ServerError));
        }
        Ok(())
    }
}

impl fmt::Display for FaultyObjectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyObjectStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyObjectStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.faults.puts_begun.send_modify(|p| *p += 1);
        self.faults.gate(&self.faults.put_latency_us).await;
        let slow = self.faults.slow_next_put_us.swap(0, Ordering::Relaxed);
        if slow > 0 {
            tokio::time::sleep(Duration::from_micros(slow)).await;
        }
        if self.faults.roll(&self.faults.put_throttled) {
            return Err(fault(InjectedFault::SlowDown));
        }
        let result = self.inner.put_opts(location, payload, opts).await?;
        self.faults.puts.fetch_add(1, Ordering::Relaxed);
        if self.faults.roll(&self.faults.put_unknown) {
            return Err(fault(InjectedFault::UnknownOutcome));
        }
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.faults.gate(&self.faults.put_latency_us).await;
        if self.faults.roll(&self.faults.put_throttled) {
            return Err(fault(InjectedFault::SlowDown));
        }
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let _get = InFlight::new(&self.faults);
        self.read_gate().await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let _get = InFlight::new(&self.faults);
        self.read_gate().await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let faults = Arc::clone(&self.faults);
        let inner = Arc::clone(&self.inner);
        // Each delete passes the gate; a failed one is reported for its path.
        locations
            .and_then(move |path| {
                let faults = Arc::clone(&faults);
                async move {
                    faults.gate(&faults.latency_us).await;
                    if faults.roll(&faults.read_error) {
                        return Err(fault(InjectedFault::ServerError));
                    }
                    Ok(path)
                }
            })
            .boxed()
            .flat_map(move |r| match r {
                Ok(path) => inner.delete_stream(futures::stream::once(async { Ok(path) }).boxed()),
                Err(e) => futures::stream::once(async { Err(e) }).boxed(),
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.faults.roll(&self.faults.read_error) {
            return futures::stream::once(async { Err(fault(InjectedFault::ServerError)) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.read_gate().await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.read_gate().await?;
        self.inner.copy_opts(from, to, options).await
    }
}
