//! Wall-clock time, injected. Apply never reads a clock (times travel inside commands); the
//! components that stamp commands and data (the sink, the stream engine, retention, the KV
//! changelog) take a [`Clock`], so tests can set time instead of sleeping for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The time in milliseconds since the Unix epoch.
///
/// Contract: `now_ms` is cheap and never blocks. It may go backwards (a wall clock is
/// adjusted); callers that need order keep their own maximum (the sink does for row times).
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> u64;
}

/// The system's wall clock: the one place Mink reads it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when told (tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now_ms: u64) -> Arc<Self> {
        Arc::new(ManualClock(AtomicU64::new(now_ms)))
    }

    pub fn advance(&self, by: std::time::Duration) {
        self.0.fetch_add(
            u64::try_from(by.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The system clock, shared.
pub fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}
