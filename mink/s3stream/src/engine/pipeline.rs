//! The flush and commit pipeline: buffered appends become one stream-set object, PUT in parallel, committed strictly in flush order, then answered.

use super::*;

impl Engine {
    /// Stops the engine: every buffered append fails with `error`; so will every flush that
    /// reaches the committer.
    pub(super) fn fail(&self, error: &StreamError) {
        {
            let mut failed = self.failed.lock().expect("failed lock");
            if failed.is_some() {
                return;
            }
            if *error != StreamError::Shutdown {
                tracing::error!(%error, "stream engine failed");
            }
            *failed = Some(error.clone());
        }
        let pending = {
            let mut state = self.state.lock().expect("wal lock");
            state.pending_bytes = 0;
            state.first_pending = None;
            let pending = std::mem::take(&mut state.pending);
            for (stream_id, batches) in &pending {
                if let Some(o) = state.streams.get_mut(stream_id) {
                    o.unanswered = o.unanswered.saturating_sub(batches.len() as u64);
                }
            }
            pending
        };
        for p in pending.into_values().flatten() {
            let _ = p.ack.send(Err(error.clone()));
        }
        self.drained.notify_waiters();
    }

    /// `n` appends of `stream_id` accepted under `epoch` got their answer.
    pub(super) fn answered(&self, stream_id: u64, epoch: u64, n: u64) {
        let mut state = self.state.lock().expect("wal lock");
        if let Some(o) = state.streams.get_mut(&stream_id)
            && o.epoch == epoch
        {
            o.unanswered = o.unanswered.saturating_sub(n);
        }
        drop(state);
        self.drained.notify_waiters();
    }

    /// Marks a stream fenced and fails its buffered appends.
    /// The stream, as opened at `epoch`, can take no more appends (fenced or gone): its
    /// buffered appends fail. A newer opening of it is left alone.
    pub(super) fn fence(&self, stream_id: u64, epoch: u64, error: &StreamError) {
        let pending = {
            let mut state = self.state.lock().expect("wal lock");
            let current = state.streams.get(&stream_id).map(|o| o.epoch);
            if current != Some(epoch) {
                return;
            }
            let pending = state.pending.remove(&stream_id).unwrap_or_default();
            let freed: usize = pending.iter().map(|p| p.batch.payload.len().max(1)).sum();
            state.pending_bytes -= freed;
            if let Some(o) = state.streams.get_mut(&stream_id) {
                o.fenced = Some(error.to_string());
            }
            pending
        };
        let n = pending.len() as u64;
        for p in pending {
            let _ = p.ack.send(Err(error.clone()));
        }
        self.answered(stream_id, epoch, n);
    }

    pub(super) async fn run_flusher(self: Arc<Self>, uploaded: mpsc::UnboundedSender<Uploaded>) {
        let mut shutdown = self.shutdown.subscribe();
        loop {
            // Wait for something to flush, then for the size threshold or the delay.
            let first = loop {
                if let Some(t) = self.state.lock().expect("wal lock").first_pending {
                    break t;
                }
                tokio::select! {
                    _ = self.new_data.notified() => {}
                    _ = shutdown.changed() => return,
                }
            };
            tokio::select! {
                _ = self.flush_kick.notified() => {}
                _ = tokio::time::sleep_until(first + self.config.flush_delay) => {}
                _ = shutdown.changed() => return,
            }
            let put_slot = tokio::select! {
                p = Arc::clone(&self.inflight).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = shutdown.changed() => return,
            };
            let Some(flush) = self.take_flush() else {
                continue;
            };
            add(&self.stats.flushes, 1);
            let engine = Arc::clone(&self);
            let uploaded = uploaded.clone();
            tokio::spawn(async move {
                let done = engine.upload(flush).await;
                // The slot bounds PUTs, not commits: a commit held up by the database (a slow
                // sync of its log) lets the next PUTs go on, and their commits then share one
                // transaction. Memory stays bounded by `max_buffered_bytes`.
                drop(put_slot);
                let _ = uploaded.send(done);
                // Counted once the committer has it: whoever waits on `uploads` may rely on the
                // flush being queued for commit.
                add(&engine.stats.uploads, 1);
                engine.counted.notify_waiters();
            });
        }
    }

    pub(super) fn take_flush(&self) -> Option<Flush> {
        let (seq, pending, pending_bytes) = {
            let mut state = self.state.lock().expect("wal lock");
            if state.pending.is_empty() {
                state.first_pending = None;
                return None;
            }
            let pending = std::mem::take(&mut state.pending);
            let bytes = std::mem::take(&mut state.pending_bytes);
            state.first_pending = None;
            let seq = state.next_seq;
            state.next_seq += 1;
            (seq, pending, bytes)
        };
        // The payloads, a 16-byte header per batch, and a little for block checksums and
        // the index: built without reallocating (and copying) a growing buffer.
        let batches: usize = pending.values().map(Vec::len).sum();
        let mut builder = ObjectBuilder::with_buffer(
            self.config.block_bytes,
            self.object_buffer(pending_bytes + batches * 24 + 4096),
        );
        let mut streams = BTreeMap::new();
        let mut broken = None;
        for (stream_id, batches) in pending {
            // Reopening fails what was buffered before, so one stream's batches share an epoch.
            let epoch = batches.first().map_or(0, |p| p.epoch);
            for p in &batches {
                if let Err(e) = builder.push(stream_id, &p.batch) {
                    broken.get_or_insert(StreamError::Failed(format!(
                        "stream {stream_id}: offsets out of order in the buffer: {e}"
                    )));
                }
            }
            streams.insert(stream_id, (epoch, batches));
        }
        let (bytes, _) = builder.finish();
        let flush = Flush {
            seq,
            streams,
            bytes,
        };
        if let Some(e) = broken {
            // Cannot happen; if it does, nothing this engine holds can be trusted.
            self.fail(&e);
            self.answer_flush(flush, &e);
            return None;
        }
        Some(flush)
    }

    pub(super) async fn upload(&self, flush: Flush) -> Uploaded {
        let started = Instant::now();
        let object_id = self.put_new_object(&flush.bytes).await;
        let m = crate::metrics::metrics();
        m.upload
            .record(crate::metrics::seconds(started.elapsed()), &[]);
        m.flush_bytes.record(flush.bytes.len() as u64, &[]);
        Uploaded { flush, object_id }
    }

    /// An empty buffer with room for `capacity` bytes, a committed object's if one is kept.
    fn object_buffer(&self, capacity: usize) -> bytes::BytesMut {
        let kept = self
            .object_buffers
            .lock()
            .expect("object buffers lock")
            .pop();
        if kept.is_some() {
            add(&self.stats.object_buffers_reused, 1);
        }
        let mut buf = kept.unwrap_or_default();
        buf.reserve(capacity);
        buf
    }

    /// Keeps a flushed object's buffer for a later flush, unless something still holds it (a
    /// hedged PUT) or enough are kept (one per flush in flight, and one being built).
    fn recycle(&self, bytes: Bytes) {
        if let Ok(mut buf) = bytes.try_into_mut() {
            buf.clear();
            let mut kept = self.object_buffers.lock().expect("object buffers lock");
            if kept.len() <= self.config.max_inflight_flushes {
                kept.push(buf);
            }
        }
    }

    /// Fails every append of a flush.
    pub(super) fn answer_flush(&self, flush: Flush, error: &StreamError) {
        self.recycle(flush.bytes);
        for (stream_id, (epoch, batches)) in flush.streams {
            let n = batches.len() as u64;
            for p in batches {
                let _ = p.ack.send(Err(error.clone()));
            }
            self.answered(stream_id, epoch, n);
        }
    }

    pub(super) async fn run_committer(
        self: Arc<Self>,
        mut uploaded: mpsc::UnboundedReceiver<Uploaded>,
    ) {
        let mut next = 0u64;
        let mut waiting: BTreeMap<u64, Uploaded> = BTreeMap::new();
        while let Some(u) = uploaded.recv().await {
            waiting.insert(u.flush.seq, u);
            // Everything uploaded while the last commits were in flight.
            while let Ok(u) = uploaded.try_recv() {
                waiting.insert(u.flush.seq, u);
            }
            let mut ready = Vec::new();
            while let Some(u) = waiting.remove(&next) {
                next += 1;
                ready.push(u);
            }
            self.commit_ready(ready).await;
        }
    }

    /// Commits consecutive uploaded flushes in flush order. An id close to its expiry (a PUT
    /// retried for minutes) commits on its own: if it has lapsed, its bytes are PUT again under
    /// a new id before anything after it commits, as the flushes after it continue its streams.
    async fn commit_ready(&self, ready: Vec<Uploaded>) {
        let ttl_ms = u64::try_from(self.config.prepare_ttl.as_millis()).unwrap_or(u64::MAX);
        let mut group: Vec<(Flush, u64)> = Vec::new();
        for u in ready {
            match u.object_id {
                Ok((id, expires)) if expires > self.config.clock.now_ms() + ttl_ms / 8 => {
                    group.push((u.flush, id));
                }
                Ok((id, _)) => {
                    self.commit(std::mem::take(&mut group)).await;
                    self.commit(vec![(u.flush, id)]).await;
                }
                Err(e) => {
                    self.commit(std::mem::take(&mut group)).await;
                    self.fail(&e);
                    self.answer_flush(u.flush, &e);
                }
            }
        }
        self.commit(group).await;
    }

    /// Commits `group` (uploaded flushes, in flush order) and answers their appends range by
    /// range. Their commands are queued together, so the metadata sink appends them in one
    /// row: one transaction and one sync of the database's log for all of them, instead of one
    /// each while the others wait. A flush whose id had lapsed is PUT again under a new one
    /// and committed again.
    async fn commit(&self, mut group: Vec<(Flush, u64)>) {
        while !group.is_empty() {
            if let Some(e) = self.failed.lock().expect("failed lock").clone() {
                for (flush, _) in group {
                    self.answer_flush(flush, &e);
                }
                return;
            }
            let commands = group
                .iter()
                .map(|(flush, object_id)| self.commit_command(flush, *object_id))
                .collect();
            let started = Instant::now();
            let submitted = match self.sink.submit_all(commands).await {
                Ok(s) => s,
                Err(e) => {
                    let e = StreamError::from(e);
                    self.fail(&e);
                    for (flush, _) in group {
                        self.answer_flush(flush, &e);
                    }
                    return;
                }
            };
            add(&self.stats.grouped_commits, group.len() as u64 - 1);
            let mut again = Vec::new();
            for ((flush, object_id), submitted) in group.into_iter().zip(submitted) {
                let proposed = submitted.applied().await;
                crate::metrics::metrics()
                    .commit
                    .record(crate::metrics::seconds(started.elapsed()), &[]);
                again.extend(self.settle(flush, object_id, proposed).await);
            }
            group = again;
        }
    }

    /// The command that makes `flush`, uploaded as `object_id`, live.
    fn commit_command(&self, flush: &Flush, object_id: u64) -> Command {
        let node = self.sink.node();
        let ranges: Vec<StreamRange> = flush
            .streams
            .iter()
            .map(|(stream_id, (epoch, batches))| StreamRange {
                stream_id: *stream_id,
                stream_epoch: *epoch,
                start_offset: batches.first().map_or(0, |p| p.batch.base_offset),
                end_offset: batches.last().map_or(0, |p| p.batch.end_offset()),
                writers: batches
                    .iter()
                    .filter_map(|p| {
                        p.writer.map(|w| WriterRange {
                            writer_id: w.writer_id,
                            writer_epoch: w.writer_epoch,
                            first_sequence: w.first_sequence,
                            last_sequence: w.last_sequence,
                            base_offset: p.batch.base_offset,
                            end_offset: p.batch.end_offset(),
                        })
                    })
                    .collect(),
            })
            .collect();
        Command::CommitStreamSetObject(CommitStreamSetObject {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            object_id,
            object_size: flush.bytes.len() as u64,
            ranges,
            compacted_object_ids: vec![],
        })
    }

    /// Answers `flush` by what its commit got, or hands it back with a new object id when its
    /// id had lapsed and its bytes were PUT again under the new one (to be committed again).
    async fn settle(
        &self,
        flush: Flush,
        object_id: u64,
        proposed: Result<mink_sql::Proposed, SinkError>,
    ) -> Option<(Flush, u64)> {
        let proposed = match proposed {
            Ok(p) => p,
            Err(e) => {
                let e = StreamError::from(e);
                self.fail(&e);
                self.answer_flush(flush, &e);
                return None;
            }
        };
        match proposed.result {
            Ok(Outcome::Done(Reply::Commit(reply))) => {
                add(&self.stats.commits, 1);
                let results: HashMap<u64, Option<Rejection>> = reply
                    .ranges
                    .into_iter()
                    .map(|r| (r.stream_id, r.rejection))
                    .collect();
                self.answer_committed(flush, &results);
                None
            }
            // The id lapsed before the commit (expired, or expired and already forgotten):
            // the same bytes under a new id. Its siblings were prepared together and have
            // lapsed too.
            Err(r) if matches!(r.kind(), RejectionKind::Expired | RejectionKind::NotFound) => {
                add(&self.stats.reputs_after_expiry, 1);
                self.ids.lock().await.clear();
                match self.put_new_object(&flush.bytes).await {
                    Ok((id, _)) => Some((flush, id)),
                    Err(e) => {
                        self.fail(&e);
                        self.answer_flush(flush, &e);
                        None
                    }
                }
            }
            other => {
                let e =
                    StreamError::Failed(format!("commit of object {object_id} answered {other:?}"));
                self.fail(&e);
                self.answer_flush(flush, &e);
                None
            }
        }
    }

    pub(super) fn answer_committed(&self, flush: Flush, results: &HashMap<u64, Option<Rejection>>) {
        self.recycle(flush.bytes);
        for (stream_id, (epoch, batches)) in flush.streams {
            let n = batches.len() as u64;
            match results.get(&stream_id) {
                Some(None) => {
                    for p in batches {
                        let ack = AppendAck {
                            base_offset: p.batch.base_offset,
                            end_offset: p.batch.end_offset(),
                            duplicate: false,
                        };
                        self.log_cache.insert(stream_id, p.batch);
                        let _ = p.ack.send(Ok(ack));
                    }
                }
                // Fenced, or deleted meanwhile: that stream is done here; the others go on.
                Some(Some(rejection))
                    if rejection.kind().is_fenced()
                        || rejection.kind() == RejectionKind::NotFound =>
                {
                    add(&self.stats.fenced_ranges, 1);
                    let e = StreamError::from_rejection(stream_id, rejection);
                    let e = match e {
                        StreamError::Failed(_) => StreamError::Fenced {
                            stream_id,
                            reason: rejection.message.clone(),
                        },
                        other => other,
                    };
                    self.fence(stream_id, epoch, &e);
                    for p in batches {
                        let _ = p.ack.send(Err(e.clone()));
                    }
                }
                Some(Some(rejection)) => {
                    // A gap or a stale sequence in ranges this node assigned itself: its view
                    // of the stream is wrong, so nothing it holds can be trusted.
                    let e = StreamError::Failed(format!(
                        "stream {stream_id}: range refused: {rejection}"
                    ));
                    self.fail(&e);
                    for p in batches {
                        let _ = p.ack.send(Err(e.clone()));
                    }
                }
                None => {
                    let e = StreamError::Failed(format!("stream {stream_id}: no range result"));
                    self.fail(&e);
                    for p in batches {
                        let _ = p.ack.send(Err(e.clone()));
                    }
                }
            }
            self.answered(stream_id, epoch, n);
        }
    }
}
