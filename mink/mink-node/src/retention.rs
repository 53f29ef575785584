//! Log retention (`table.log.ttl`): every `retention_interval`, each leader trims its buckets'
//! streams past the data older than the table's TTL.
//!
//! Age is known per commit: the rows of one commit are as old as it, and compaction carries
//! those times into the objects it writes (from metadata_version 6; coarsened to a few runs per
//! stored range, each taking its newest time). So a row goes once the rows it shares a run with
//! are older than the TTL: it may be kept a little longer, never trimmed early.

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

/// The offset to trim a stream to: the end of its oldest run of data all committed more than
/// `ttl` before `now_ms`, if that is past the stream's start.
pub(crate) fn expired_end(
    state: &State,
    stream_id: u64,
    now_ms: u64,
    ttl: Duration,
) -> Option<u64> {
    let cutoff = now_ms.checked_sub(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))?;
    let stream = state.streams.get(&stream_id)?;
    let mut end = stream.start_offset;
    'ranges: for (_, range) in state.ranges.range((stream_id, 0)..=(stream_id, u64::MAX)) {
        for run in state.data_times(range) {
            if run.at_ms == 0 || run.at_ms >= cutoff {
                break 'ranges;
            }
            end = end.max(run.end_offset);
        }
    }
    // Never past a retention floor: the latest KV snapshot of a primary-key bucket.
    if let Some(floor) = state.trim_floor(stream) {
        end = end.min(floor);
    }
    (end > stream.start_offset).then_some(end)
}
