//! Log retention (`table.log.ttl`): every `retention_interval`, each leader trims its buckets'
//! streams past the data older than the table's TTL.
//!
//! Age is known per stored object (its commit time), so retention works in whole objects: a
//! row goes once every row stored with it is older than the TTL. Compaction rewrites objects
//! and stamps them anew, so a row may outlive its TTL by up to the time since its last
//! compaction; it never goes early.

use std::time::Duration;

use mink_log::options::TableOptions;
use mink_metadata::State;

use crate::Node;

pub(crate) async fn run(node: Node) {
    let mut shutdown = node.inner.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(node.inner.config.retention_interval) => {}
            _ = shutdown.changed() => return,
        }
        let now_ms = node.inner.config.clock.now_ms();
        let led: Vec<_> = node
            .inner
            .led
            .read()
            .expect("led lock")
            .iter()
            .map(|(k, l)| (*k, l.stream_id))
            .collect();
        let view = node.view();
        for ((table_id, _, _), stream_id) in led {
            let Some(table) = view.state.tables.get(&table_id) else {
                continue;
            };
            let Ok(TableOptions {
                log_ttl: Some(ttl), ..
            }) = TableOptions::parse(&table.options)
            else {
                continue;
            };
            let Some(new_start) = expired_end(&view.state, stream_id, now_ms, ttl) else {
                continue;
            };
            match node.inner.streams.trim(stream_id, new_start).await {
                Ok(info) => tracing::info!(
                    table = %table.name,
                    stream_id,
                    start_offset = info.start_offset,
                    "retention trimmed the log"
                ),
                Err(e) => tracing::info!(error = %e, stream_id, "retention could not trim"),
            }
        }
        node.inner.retention_passes.send_modify(|n| *n += 1);
    }
}

impl Node {
    /// Retention passes over the buckets this node leads, finished so far.
    pub fn retention_passes(&self) -> u64 {
        *self.inner.retention_passes.borrow()
    }

    /// Returns once retention has finished `n` passes (a test's event for "retention has
    /// looked").
    pub async fn retention_passes_reach(&self, n: u64) {
        let mut passes = self.inner.retention_passes.subscribe();
        let _ = passes.wait_for(|p| *p >= n).await;
    }
}

/// The offset to trim a stream to: the end of its oldest run of objects all committed more
/// than `ttl` before `now_ms`, if that is past the stream's start.
pub(crate) fn expired_end(
    state: &State,
    stream_id: u64,
    now_ms: u64,
    ttl: Duration,
) -> Option<u64> {
    let cutoff = now_ms.checked_sub(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))?;
    let stream = state.streams.get(&stream_id)?;
    let mut end = stream.start_offset;
    for (_, range) in state.ranges.range((stream_id, 0)..=(stream_id, u64::MAX)) {
        let old = state
            .objects
            .get(&range.object_id)
            .is_some_and(|o| o.committed_at_ms != 0 && o.committed_at_ms < cutoff);
        if !old {
            break;
        }
        end = end.max(range.end_offset);
    }
    // Never past a retention floor: the latest KV snapshot of a primary-key bucket.
    if let Some(floor) = state.trim_floor(stream) {
        end = end.min(floor);
    }
    (end > stream.start_offset).then_some(end)
}
