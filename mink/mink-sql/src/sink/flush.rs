//! The flusher: drains the proposal queue into rows (group commit) and appends one row at a
//! time, waiting until the tailer has applied it.

use std::collections::VecDeque;

use super::*;

pub(crate) struct Proposal {
    pub(crate) command: Command,
    pub(crate) size: usize,
    pub(crate) tx: oneshot::Sender<Result<Proposed, SinkError>>,
}

/// Appends this process's rows, one at a time.
pub(crate) struct Appender {
    pub(super) shared: Arc<Shared>,
    pub(super) sequence: u64,
    /// Row times never go backwards within a process, even if the wall clock does.
    pub(super) last_ms: u64,
}

impl Appender {
    /// Appends one row of `commands` and waits for the tailer to apply it. Retries until the
    /// row is known applied: after an unknown outcome the same bytes are resent, and the
    /// row's token makes a second copy a no-op.
    pub(super) async fn commit(&mut self, commands: Vec<Command>) -> Result<Resolution, SinkError> {
        let shared = Arc::clone(&self.shared);
        self.sequence += 1;
        let token = RowToken {
            node_id: shared.config.node_id,
            node_epoch: shared.node_epoch.load(Ordering::Acquire),
            incarnation: shared.incarnation,
            sequence: self.sequence,
        };
        let count = commands.len();
        self.last_ms = self.last_ms.max(shared.config.clock.now_ms());
        let bytes = encode_row(&Row {
            token,
            proposed_at_ms: self.last_ms,
            commands,
        });
        let (tx, mut rx) = oneshot::channel();
        {
            // Checked under the in-flight lock: `halt` sets the error first and then takes the
            // in-flight row, so either it sees this row or this check sees the halt.
            let mut inflight = shared.inflight.lock().expect("inflight lock");
            if let Some(e) = shared.halted() {
                return Err(e);
            }
            *inflight = Some(InFlight { token, tx });
        }
        let mut backoff = Backoff::new(shared.config.max_backoff);
        loop {
            match shared.store.append(&bytes).await {
                Ok(index) => {
                    SinkStats::add(&shared.stats.rows_appended, 1);
                    SinkStats::add(&shared.stats.commands_appended, count as u64);
                    *shared.own_row.lock().expect("own row lock") = Some(LogRow {
                        index,
                        payload: bytes,
                    });
                    shared.tail_kick.notify_one();
                    break;
                }
                Err(StoreError::AppendConflict) => {
                    SinkStats::add(&shared.stats.append_conflicts, 1);
                }
                Err(e) => {
                    SinkStats::add(&shared.stats.append_errors, 1);
                    tracing::warn!(node_id = token.node_id, sequence = token.sequence, error = %e, "append failed; resending the same row");
                    shared.tail_kick.notify_one();
                    // The row may have committed: if the tailer resolves it meanwhile, done.
                    tokio::select! {
                        r = &mut rx => return Self::finish(r, count),
                        _ = tokio::time::sleep(backoff.next()) => {}
                    }
                    if let Some(e) = shared.halted() {
                        return Err(e);
                    }
                }
            }
        }
        loop {
            tokio::select! {
                r = &mut rx => return Self::finish(r, count),
                _ = tokio::time::sleep(shared.config.tail_poll_interval) => {
                    if let Some(e) = shared.halted() {
                        return Err(e);
                    }
                    shared.tail_kick.notify_one();
                }
            }
        }
    }

    pub(super) fn finish(
        r: Result<Result<Resolution, SinkError>, oneshot::error::RecvError>,
        count: usize,
    ) -> Result<Resolution, SinkError> {
        let mut resolution = r.map_err(|_| SinkError::Shutdown)??;
        if resolution.results.len() != count {
            // A superseded row: one rejection stands for all its commands.
            let first = resolution.results.first().cloned().unwrap_or_else(|| {
                Err(Rejection::new(
                    RejectionKind::Unspecified,
                    "row outcome lost",
                ))
            });
            resolution.results = vec![first; count];
        }
        Ok(resolution)
    }

    pub(super) async fn run(mut self, mut queue: mpsc::Receiver<Vec<Proposal>>) {
        let shared = Arc::clone(&self.shared);
        let mut closing = shared.closing.subscribe();
        // Proposals received but not yet in a row, in queue order.
        let mut carry: VecDeque<Proposal> = VecDeque::new();
        loop {
            if *closing.borrow_and_update() {
                return; // what is still queued fails with `Shutdown`
            }
            if carry.is_empty() {
                tokio::select! {
                    p = queue.recv() => match p {
                        Some(p) => carry.extend(p),
                        None => return,
                    },
                    _ = closing.changed() => return,
                }
            }
            let mut bytes = 0;
            let mut batch = Vec::new();
            'fill: loop {
                while let Some(p) = carry.front() {
                    let full = batch.len() >= shared.config.max_commands_per_row
                        || (!batch.is_empty() && bytes + p.size > shared.config.max_row_bytes);
                    if full {
                        break 'fill;
                    }
                    bytes += p.size;
                    batch.extend(carry.pop_front());
                }
                match queue.try_recv() {
                    Ok(p) => carry.extend(p),
                    Err(_) => break,
                }
            }
            let (commands, senders): (Vec<Command>, Vec<_>) =
                batch.into_iter().map(|p| (p.command, p.tx)).unzip();
            match self.commit(commands).await {
                Ok(resolution) => {
                    for (tx, result) in senders.into_iter().zip(resolution.results) {
                        let _ = tx.send(Ok(Proposed {
                            index: resolution.index,
                            result,
                        }));
                    }
                    if resolution.fenced {
                        let node = shared.node();
                        shared.halt(SinkError::Fenced {
                            node_id: node.node_id,
                            node_epoch: node.node_epoch,
                        });
                    }
                }
                Err(e) => {
                    for tx in senders {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}
