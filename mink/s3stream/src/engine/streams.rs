//! A stream's life on this node: create, open (fencing older epochs), append, close, trim, delete.

use super::*;

impl S3Stream {
    /// Creates `count` streams; returns the first id (ids are consecutive).
    pub async fn create_streams(&self, count: u32) -> Result<u64, StreamError> {
        let proposed = self
            .engine
            .sink
            .propose(Command::CreateStreams(CreateStreams { count }))
            .await?;
        match proposed.result {
            Ok(Outcome::Done(Reply::Range(r)) | Outcome::Redundant(Reply::Range(r))) => Ok(r.start),
            Ok(other) => Err(StreamError::Failed(format!("unexpected reply {other:?}"))),
            Err(r) => Err(StreamError::Invalid(r.to_string())),
        }
    }

    /// Opens a stream for appending at `epoch` (above any epoch it was opened at before, or
    /// the bucket's leader epoch). Appends resume at the committed end.
    pub async fn open(&self, stream_id: u64, epoch: u64) -> Result<StreamInfo, StreamError> {
        let node = self.engine.sink.node();
        let proposed = self
            .engine
            .sink
            .propose(Command::OpenStream(OpenStream {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                stream_id,
                stream_epoch: epoch,
            }))
            .await?;
        let position = match proposed.result {
            Ok(outcome) => match outcome.into_reply() {
                Reply::Stream(p) => p,
                other => return Err(StreamError::Failed(format!("unexpected reply {other:?}"))),
            },
            Err(r) => return Err(StreamError::from_rejection(stream_id, &r)),
        };
        let info = StreamInfo {
            stream_id,
            epoch,
            start_offset: position.start_offset,
            end_offset: position.end_offset,
        };
        let stale = {
            let mut state = self.engine.state.lock().expect("wal lock");
            if let Some(o) = state.streams.get(&stream_id)
                && o.epoch == epoch
                && o.fenced.is_none()
                && !o.closing
            {
                // Already open here at this epoch: keep the appends in flight.
                return Ok(info);
            }
            // Appends buffered under an older epoch can never commit: fail them now, so the
            // new epoch starts clean at the committed end.
            let stale = state.pending.remove(&stream_id).unwrap_or_default();
            let freed: usize = stale.iter().map(|p| p.batch.payload.len().max(1)).sum();
            state.pending_bytes -= freed;
            state.streams.insert(
                stream_id,
                Owned {
                    epoch,
                    next_offset: position.end_offset,
                    fenced: None,
                    closing: false,
                    writers: HashMap::new(),
                    unanswered: 0,
                },
            );
            stale
        };
        for p in stale {
            let _ = p.ack.send(Err(StreamError::Fenced {
                stream_id,
                reason: format!("reopened at epoch {epoch}"),
            }));
        }
        Ok(info)
    }

    /// Appends one batch spanning `count` offsets, stamped with the engine clock's time.
    /// Returns once the batch is on object storage and committed. With `writer`, a retry of a
    /// batch already written returns its original offsets instead of writing it again.
    pub async fn append(
        &self,
        stream_id: u64,
        count: u32,
        payload: Bytes,
        writer: Option<WriterBatchId>,
    ) -> Result<AppendAck, StreamError> {
        self.submit(stream_id, count, payload, writer).await?.await
    }

    /// The first half of [`S3Stream::append`]: waits for room in the write buffer, then takes
    /// the batch's offsets and returns; the returned [`Appending`] resolves once the batch is
    /// durable. Batches submitted one after another to a stream are stored in that order, so
    /// a caller can pipeline many appends (and idempotent sequences stay in order) while
    /// waiting for their durability together.
    pub async fn submit(
        &self,
        stream_id: u64,
        count: u32,
        payload: Bytes,
        writer: Option<WriterBatchId>,
    ) -> Result<Appending, StreamError> {
        self.submit_at(stream_id, None, count, payload, writer, self.now_ms())
            .await
    }

    /// [`S3Stream::submit`] only while the stream is open here at `epoch` (when given): a
    /// caller that computed its batch for one opening of the stream never appends it to a
    /// later one (fails with [`StreamError::Fenced`]). The batch carries `timestamp_ms` (the
    /// latest time of its rows), which [`S3Stream::offset_for_time`] searches by.
    pub async fn submit_at(
        &self,
        stream_id: u64,
        epoch: Option<u64>,
        count: u32,
        payload: Bytes,
        writer: Option<WriterBatchId>,
        timestamp_ms: i64,
    ) -> Result<Appending, StreamError> {
        let engine = &self.engine;
        let check_epoch = |owned: &Owned| match epoch {
            Some(e) if owned.epoch != e => Err(StreamError::Fenced {
                stream_id,
                reason: format!("open at epoch {}, the batch was made for {e}", owned.epoch),
            }),
            _ => Ok(()),
        };
        if let Some(e) = self.failed() {
            return Err(e);
        }
        if count == 0 {
            return Err(StreamError::Invalid(
                "a batch spans at least one offset".into(),
            ));
        }
        let size = payload.len().max(1);
        if size > engine.config.max_buffered_bytes / 2 {
            return Err(StreamError::TooLarge {
                size,
                limit: engine.config.max_buffered_bytes / 2,
            });
        }
        // What can be answered without room in the buffer is answered first.
        {
            let state = engine.state.lock().expect("wal lock");
            check_epoch(Self::writable(&state, stream_id)?)?;
            if let Some(w) = writer
                && let Some(ack) = engine.committed_duplicate(stream_id, w)
            {
                return Ok(Appending::ready(ack));
            }
        }
        let bytes = u32::try_from(size).unwrap_or(u32::MAX);
        let permit = match Arc::clone(&engine.budget).try_acquire_many_owned(bytes) {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(StreamError::Shutdown),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                // Buffered appends fill `max_buffered_bytes`: wait for flushes to make room.
                engine.stats.appends_waited.fetch_add(1, Ordering::Relaxed);
                engine.counted.notify_waiters();
                Arc::clone(&engine.budget)
                    .acquire_many_owned(bytes)
                    .await
                    .map_err(|_| StreamError::Shutdown)?
            }
        };
        let (rx, base_offset) = {
            let mut state = engine.state.lock().expect("wal lock");
            if let Some(e) = self.failed() {
                return Err(e);
            }
            check_epoch(Self::writable(&state, stream_id)?)?;
            let owned = state.streams.get_mut(&stream_id).expect("checked above");
            if let Some(w) = writer
                && let Some(ack) = engine.check_writer(stream_id, owned, w)?
            {
                return Ok(Appending::ready(ack));
            }
            let base_offset = owned.next_offset;
            owned.next_offset += u64::from(count);
            owned.unanswered += 1;
            let epoch = owned.epoch;
            let (tx, rx) = oneshot::channel();
            state.pending.entry(stream_id).or_default().push(Pending {
                batch: RecordBatch {
                    base_offset,
                    count,
                    timestamp_ms,
                    payload,
                },
                epoch,
                writer,
                ack: tx,
                _permit: permit,
            });
            state.pending_bytes += size;
            if state.first_pending.is_none() {
                state.first_pending = Some(Instant::now());
                engine.new_data.notify_one();
            }
            if state.pending_bytes >= engine.config.flush_bytes {
                engine.flush_kick.notify_one();
            }
            (rx, base_offset)
        };
        add(&engine.stats.appends, 1);
        add(&engine.stats.appended_bytes, size as u64);
        Ok(Appending {
            base_offset,
            waiting: Waiting::Pending(rx),
        })
    }

    /// How an append by writer batch `w` would be answered, without taking it: `Some(ack)`
    /// with the original offsets of a batch already stored, an error for a batch fenced, out of
    /// order or still in flight, `None` for the writer's next batch. Lets a caller recognise a
    /// retry before doing work for it (a primary-key changelog); the answer holds while the
    /// caller is the stream's only submitter.
    pub fn check_writer_batch(
        &self,
        stream_id: u64,
        w: WriterBatchId,
    ) -> Result<Option<AppendAck>, StreamError> {
        if let Some(e) = self.failed() {
            return Err(e);
        }
        let engine = &self.engine;
        let state = engine.state.lock().expect("wal lock");
        let owned = Self::writable(&state, stream_id)?;
        engine.classify_writer_batch(stream_id, owned, w)
    }

    /// The stream's local state, if it may take appends.
    pub(super) fn writable(state: &WalState, stream_id: u64) -> Result<&Owned, StreamError> {
        let owned = state
            .streams
            .get(&stream_id)
            .filter(|o| !o.closing)
            .ok_or(StreamError::NotOpen { stream_id })?;
        if let Some(reason) = &owned.fenced {
            return Err(StreamError::Fenced {
                stream_id,
                reason: reason.clone(),
            });
        }
        Ok(owned)
    }

    /// Refuses new appends to `stream_id` (`NotOpen`) and waits until every append accepted
    /// so far has been answered: the first half of [`S3Stream::close`], for a caller that
    /// has something to do between the last append and the close (a handover). Returns the
    /// epoch the stream is open at.
    pub async fn stop_appends(&self, stream_id: u64) -> Result<u64, StreamError> {
        let epoch = self.start_closing(stream_id)?;
        self.drain(stream_id).await;
        Ok(epoch)
    }

    /// Waits until every append accepted for `stream_id` so far has been answered, then
    /// closes the stream. Its committed data stays readable.
    pub async fn close(&self, stream_id: u64) -> Result<(), StreamError> {
        let epoch = self.stop_appends(stream_id).await?;
        let node = self.engine.sink.node();
        self.let_go(
            stream_id,
            Command::CloseStream(CloseStream {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                stream_id,
                stream_epoch: epoch,
            }),
        )
        .await
    }

    /// Proposes the close or delete of a stream this node stops writing, and forgets its
    /// local state whatever the answer.
    pub(super) async fn let_go(&self, stream_id: u64, command: Command) -> Result<(), StreamError> {
        let proposed = self.engine.sink.propose(command).await?;
        self.engine
            .state
            .lock()
            .expect("wal lock")
            .streams
            .remove(&stream_id);
        proposed
            .result
            .map(|_| ())
            .map_err(|r| StreamError::from_rejection(stream_id, &r))
    }

    /// Refuses new appends to the stream from now on; returns its epoch.
    pub(super) fn start_closing(&self, stream_id: u64) -> Result<u64, StreamError> {
        let mut state = self.engine.state.lock().expect("wal lock");
        let owned = state
            .streams
            .get_mut(&stream_id)
            .ok_or(StreamError::NotOpen { stream_id })?;
        owned.closing = true;
        Ok(owned.epoch)
    }

    pub(super) async fn drain(&self, stream_id: u64) {
        loop {
            let notified = self.engine.drained.notified();
            if self.failed().is_some() {
                return;
            }
            {
                let state = self.engine.state.lock().expect("wal lock");
                if state
                    .streams
                    .get(&stream_id)
                    .is_none_or(|o| o.unanswered == 0)
                {
                    return;
                }
            }
            self.engine.flush_kick.notify_one();
            notified.await;
        }
    }

    /// Moves the stream's start forward (retention). The floors its table sets are enforced
    /// by the metadata log.
    pub async fn trim(&self, stream_id: u64, new_start: u64) -> Result<StreamInfo, StreamError> {
        let epoch = {
            let state = self.engine.state.lock().expect("wal lock");
            state
                .streams
                .get(&stream_id)
                .map(|o| o.epoch)
                .ok_or(StreamError::NotOpen { stream_id })?
        };
        let node = self.engine.sink.node();
        let proposed = self
            .engine
            .sink
            .propose(Command::TrimStream(TrimStream {
                node_id: node.node_id,
                node_epoch: node.node_epoch,
                stream_id,
                stream_epoch: epoch,
                new_start_offset: new_start,
            }))
            .await?;
        match proposed.result {
            Ok(outcome) => match outcome.into_reply() {
                Reply::Stream(p) => {
                    self.engine.log_cache.trim(stream_id, p.start_offset);
                    Ok(StreamInfo {
                        stream_id,
                        epoch,
                        start_offset: p.start_offset,
                        end_offset: p.end_offset,
                    })
                }
                other => Err(StreamError::Failed(format!("unexpected reply {other:?}"))),
            },
            Err(r) => Err(StreamError::from_rejection(stream_id, &r)),
        }
    }

    /// Deletes a stream of no table (after closing it here, if open).
    pub async fn delete(&self, stream_id: u64) -> Result<(), StreamError> {
        let open = self.start_closing(stream_id).ok();
        if open.is_some() {
            self.drain(stream_id).await;
        }
        let epoch = open.unwrap_or_else(|| {
            self.engine
                .sink
                .view()
                .state
                .streams
                .get(&stream_id)
                .map_or(0, |s| s.epoch)
        });
        let node = self.engine.sink.node();
        let deleted = self
            .let_go(
                stream_id,
                Command::DeleteStream(DeleteStream {
                    node_id: node.node_id,
                    node_epoch: node.node_epoch,
                    stream_id,
                    stream_epoch: epoch,
                }),
            )
            .await;
        self.engine.log_cache.trim(stream_id, u64::MAX);
        deleted
    }
}
