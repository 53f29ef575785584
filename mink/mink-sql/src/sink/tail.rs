//! The tailer: reads rows past the applied index, applies them, publishes the new view, and
//! only then resolves the proposers of its own row.

use super::*;

/// The tailer's working state: the state it applies to and the index it is at.
pub(crate) struct Tail {
    pub(super) state: State,
    pub(super) applied: u64,
    pub(super) supported: u32,
    pub(super) read_batch: u32,
    pub(super) read_max_bytes: u64,
}

type AppliedRow = (u64, RowToken, RowOutcome);

enum TailStep {
    /// Applied these rows.
    Applied(Vec<AppliedRow>),
    /// The rows after `applied` were truncated: reinstalled the snapshot.
    Reinstalled,
    /// Caught up with the log.
    Idle,
    /// Rows after `applied` exist but the next one is missing and not covered by the snapshot.
    Hole { missing: u64, next_present: u64 },
}

impl Tail {
    /// Starts from the stored snapshot, if any.
    pub(super) async fn load(
        store: &dyn LogStore,
        supported: u32,
        read_batch: u32,
        read_max_bytes: u64,
    ) -> Result<Tail, SinkError> {
        let mut tail = Tail {
            state: State::default(),
            applied: 0,
            supported,
            read_batch,
            read_max_bytes,
        };
        if let Some(s) = store.load_snapshot().await? {
            tail.install(&s.payload, s.applied_index)?;
        }
        Ok(tail)
    }

    pub(super) fn install(&mut self, payload: &[u8], row_index: u64) -> Result<(), SinkError> {
        let (index, state) = decode_snapshot(payload, self.supported)
            .map_err(|e| SinkError::decode(row_index, "snapshot", &e))?;
        if index != row_index {
            return Err(SinkError::Halted {
                index: row_index,
                reason: format!("snapshot row says {row_index} but encodes {index}"),
            });
        }
        self.state = state;
        self.applied = index;
        Ok(())
    }

    /// Reads once past the applied index and applies what it can. `own` is a row this
    /// process just appended; when it is the next one, it is applied without a read.
    async fn step(
        &mut self,
        store: &dyn LogStore,
        own: Option<LogRow>,
    ) -> Result<TailStep, SinkError> {
        let rows = match own {
            Some(row) if row.index == self.applied + 1 => vec![row],
            _ => {
                store
                    .read_after(self.applied, self.read_batch, self.read_max_bytes)
                    .await?
            }
        };
        let Some(first) = rows.first() else {
            return Ok(TailStep::Idle);
        };
        if first.index != self.applied + 1 {
            // Below the snapshot's index the missing rows were truncated: reinstall from the
            // snapshot. Above it, it is a hole: never skip it.
            let next_present = first.index;
            return match store.load_snapshot().await? {
                Some(s)
                    if s.applied_index + 1 >= next_present && s.applied_index > self.applied =>
                {
                    self.install(&s.payload, s.applied_index)?;
                    Ok(TailStep::Reinstalled)
                }
                _ => Ok(TailStep::Hole {
                    missing: self.applied + 1,
                    next_present,
                }),
            };
        }
        let mut applied_rows = Vec::with_capacity(rows.len());
        for row in rows {
            if row.index != self.applied + 1 {
                break; // a hole inside the batch: the next step reports it
            }
            let decoded = decode_row(&row.payload, self.supported)
                .map_err(|e| SinkError::decode(row.index, &format!("log row {}", row.index), &e))?;
            let ctx = ApplyContext {
                index: row.index,
                at_ms: decoded.proposed_at_ms,
                supported_version: self.supported,
            };
            let outcome = self
                .state
                .apply_row(&ctx, &decoded)
                .map_err(|e| SinkError::Halted {
                    index: row.index,
                    reason: e.to_string(),
                })?;
            self.applied = row.index;
            applied_rows.push((row.index, decoded.token, outcome));
        }
        Ok(TailStep::Applied(applied_rows))
    }

    /// One step with its effects on the sink: publish the view, then resolve the proposers.
    async fn step_shared(&mut self, shared: &Shared) -> Result<TailStep, SinkError> {
        let own = {
            let mut slot = shared.own_row.lock().expect("own row lock");
            match slot.as_ref().map(|r| r.index) {
                Some(index) if index == self.applied + 1 => slot.take(),
                Some(index) if index <= self.applied => {
                    *slot = None;
                    None
                }
                _ => None,
            }
        };
        let step = self.step(shared.store.as_ref(), own).await?;
        match &step {
            TailStep::Applied(rows) => {
                let duplicates = rows
                    .iter()
                    .filter(|r| matches!(r.2, RowOutcome::Duplicate(_)))
                    .count();
                SinkStats::add(&shared.stats.duplicate_rows, duplicates as u64);
                SinkStats::add(&shared.stats.rows_applied, rows.len() as u64);
                // Publish before resolving: a proposer that gets its answer sees its write.
                shared.publish(self.applied, &self.state);
                self.resolve(shared, rows, false);
                self.check_superseded(shared);
            }
            TailStep::Reinstalled => {
                tracing::info!(
                    node_id = shared.config.node_id,
                    index = self.applied,
                    "log truncated past this node; reinstalled from the snapshot"
                );
                SinkStats::add(&shared.stats.reinstalls, 1);
                shared.publish(self.applied, &self.state);
                self.resolve(shared, &[], true);
                self.check_superseded(shared);
            }
            TailStep::Idle | TailStep::Hole { .. } => {}
        }
        Ok(step)
    }

    /// Answers this process's row in flight once the state covers it. `reinstalled`: the
    /// state just jumped over rows this node never read.
    pub(super) fn resolve(&self, shared: &Shared, applied_rows: &[AppliedRow], reinstalled: bool) {
        let mut guard = shared.inflight.lock().expect("inflight lock");
        let Some(token) = guard.as_ref().map(|f| f.token) else {
            return;
        };
        let mut resolution = None;
        for (index, row_token, outcome) in applied_rows {
            if *row_token != token {
                continue;
            }
            if let Some(results) = outcome.results() {
                resolution = Some(Ok(Resolution {
                    index: *index,
                    results: results.to_vec(),
                    fenced: matches!(outcome, RowOutcome::Fenced(_)),
                }));
                break;
            }
        }
        if resolution.is_none() {
            resolution = self.covered_by_state(token, reinstalled);
        }
        if let Some(resolution) = resolution
            && let Some(inflight) = guard.take()
        {
            let _ = inflight.tx.send(resolution);
        }
    }

    /// The row's effect is in the state but its log row is gone (reinstalled from a snapshot),
    /// or the process was superseded so the row can never apply.
    pub(super) fn covered_by_state(
        &self,
        token: RowToken,
        reinstalled: bool,
    ) -> Option<Result<Resolution, SinkError>> {
        if let Some(last) = self.state.row_tokens.get(&token.node_id)
            && last.node_epoch == token.node_epoch
            && last.incarnation == token.incarnation
            && last.sequence == token.sequence
        {
            return Some(Ok(Resolution {
                index: self.applied,
                results: last.results.iter().map(StoredResult::to_result).collect(),
                fenced: false,
            }));
        }
        let node = self.state.nodes.get(&token.node_id)?;
        let superseded = node.node_epoch > token.node_epoch
            || (node.node_epoch == token.node_epoch && node.incarnation != token.incarnation);
        if !superseded {
            return None;
        }
        if reinstalled {
            // The row may have applied in the rows this node skipped, before the newer process
            // registered (its token record is gone): nobody can tell.
            return Some(Err(SinkError::OutcomeUnknown {
                node_id: token.node_id,
                node_epoch: token.node_epoch,
            }));
        }
        // Every row up to `applied` was read and this one was not among them: it lands after
        // the newer registration, if ever, and is then void.
        let rejection = Rejection::new(
            RejectionKind::NodeFenced,
            format!(
                "node {} epoch {} was superseded by epoch {}",
                token.node_id, token.node_epoch, node.node_epoch
            ),
        )
        .with_current(node.node_epoch);
        Some(Ok(Resolution {
            index: self.applied,
            // The count is filled in by the flusher, which knows the row's size.
            results: vec![Err(rejection)],
            fenced: true,
        }))
    }

    /// A newer process registered this node id: this one must stop writing.
    pub(super) fn check_superseded(&self, shared: &Shared) {
        if !shared.registered.load(Ordering::Acquire) {
            return;
        }
        let me = shared.node();
        if let Some(node) = self.state.nodes.get(&me.node_id)
            && (node.node_epoch > me.node_epoch
                || (node.node_epoch == me.node_epoch && node.incarnation != shared.incarnation))
        {
            shared.halt(SinkError::Fenced {
                node_id: me.node_id,
                node_epoch: me.node_epoch,
            });
        }
    }

    /// Applies until caught up with the log (used at start). Waits out holes.
    pub(super) async fn catch_up(
        &mut self,
        store: &dyn LogStore,
        poll: Duration,
    ) -> Result<(), SinkError> {
        let mut hole_since = None;
        loop {
            match self.step(store, None).await? {
                TailStep::Applied(_) | TailStep::Reinstalled => hole_since = None,
                TailStep::Idle => return Ok(()),
                TailStep::Hole {
                    missing,
                    next_present,
                } => {
                    let since = *hole_since.get_or_insert_with(tokio::time::Instant::now);
                    tracing::warn!(missing, next_present, waited = ?since.elapsed(), "hole in the metadata log; waiting");
                    tokio::time::sleep(poll).await;
                }
            }
        }
    }

    pub(super) async fn run(mut self, shared: Arc<Shared>) {
        let mut backoff = Backoff::new(shared.config.max_backoff);
        let mut shutdown = shared.shutdown.subscribe();
        let mut hole_since: Option<tokio::time::Instant> = None;
        loop {
            if shared.is_shutdown() || shared.halted().is_some() {
                return;
            }
            let wait = match self.step_shared(&shared).await {
                Ok(TailStep::Applied(_) | TailStep::Reinstalled) => {
                    backoff.reset();
                    hole_since = None;
                    continue;
                }
                Ok(TailStep::Idle) => shared.config.tail_poll_interval,
                Ok(TailStep::Hole {
                    missing,
                    next_present,
                }) => {
                    let since = *hole_since.get_or_insert_with(tokio::time::Instant::now);
                    SinkStats::add(&shared.stats.holes, 1);
                    if since.elapsed() > Duration::from_secs(1) {
                        tracing::error!(
                            node_id = shared.config.node_id,
                            missing,
                            next_present,
                            waited = ?since.elapsed(),
                            "hole in the metadata log: row {missing} is missing above the snapshot; waiting, never skipping"
                        );
                    }
                    shared.config.tail_poll_interval
                }
                Err(SinkError::Store(e)) => {
                    tracing::warn!(node_id = shared.config.node_id, error = %e, "tailing the metadata log failed; retrying");
                    backoff.next()
                }
                Err(e) => {
                    shared.halt(e);
                    return;
                }
            };
            tokio::select! {
                _ = shared.tail_kick.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}
