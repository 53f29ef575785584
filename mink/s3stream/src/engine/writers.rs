//! Idempotent writers: recognising retries and refusing batches out of sequence or of an older epoch.

use super::*;

impl Engine {
    /// A retry of a batch the metadata already holds: its original offsets.
    pub(super) fn committed_duplicate(
        &self,
        stream_id: u64,
        w: WriterBatchId,
    ) -> Option<AppendAck> {
        let view = self.sink.view();
        let record = view.state.writers.get(&(stream_id, w.writer_id))?;
        if record.writer_epoch != w.writer_epoch {
            return None;
        }
        record
            .batches
            .iter()
            .find(|b| b.first_sequence == w.first_sequence && b.last_sequence == w.last_sequence)
            .map(|b| AppendAck {
                base_offset: b.base_offset,
                end_offset: b.end_offset,
                duplicate: true,
            })
    }

    /// Checks an idempotent writer's batch before it is buffered. `Ok(Some)` answers a retry of
    /// a committed batch with its original offsets.
    pub(super) fn check_writer(
        &self,
        stream_id: u64,
        owned: &mut Owned,
        w: WriterBatchId,
    ) -> Result<Option<AppendAck>, StreamError> {
        if let Some(ack) = self.classify_writer_batch(stream_id, owned, w)? {
            return Ok(Some(ack));
        }
        owned.writers.insert(
            w.writer_id,
            WriterTail {
                epoch: w.writer_epoch,
                last_sequence: w.last_sequence,
            },
        );
        Ok(None)
    }

    /// [`Engine::check_writer`] without taking the batch.
    pub(super) fn classify_writer_batch(
        &self,
        stream_id: u64,
        owned: &Owned,
        w: WriterBatchId,
    ) -> Result<Option<AppendAck>, StreamError> {
        if w.first_sequence > w.last_sequence {
            return Err(StreamError::Invalid(format!(
                "writer {}: first sequence {} after last {}",
                w.writer_id, w.first_sequence, w.last_sequence
            )));
        }
        if let Some(ack) = self.committed_duplicate(stream_id, w) {
            return Ok(Some(ack));
        }
        let view = self.sink.view();
        let committed = view
            .state
            .writers
            .get(&(stream_id, w.writer_id))
            .and_then(|r| {
                r.batches.last().map(|b| WriterTail {
                    epoch: r.writer_epoch,
                    last_sequence: b.last_sequence,
                })
            });
        let tail = owned.writers.get(&w.writer_id).copied().or(committed);
        // As in Kafka: a writer at a new epoch starts at sequence 0, and so does one new to the
        // stream unless it may start anywhere.
        let starts_anew = match tail {
            None => !w.any_first_sequence,
            Some(t) => w.writer_epoch > t.epoch,
        };
        if starts_anew && w.first_sequence != 0 {
            return Err(StreamError::OutOfOrderSequence {
                writer_id: w.writer_id,
                expected: 0,
                got: w.first_sequence,
            });
        }
        if let Some(tail) = tail {
            if w.writer_epoch < tail.epoch {
                return Err(StreamError::WriterFenced {
                    writer_id: w.writer_id,
                    epoch: w.writer_epoch,
                    current: tail.epoch,
                });
            }
            if w.writer_epoch == tail.epoch
                && Some(w.first_sequence) != tail.last_sequence.checked_add(1)
            {
                // Accepted here but not yet committed: the retry must wait for the answer.
                // Older than the last committed batches kept: out of order for good.
                let committed_last = committed
                    .filter(|c| c.epoch == w.writer_epoch)
                    .map(|c| c.last_sequence);
                if w.last_sequence <= tail.last_sequence
                    && committed_last.is_none_or(|c| w.last_sequence > c)
                {
                    return Err(StreamError::SequenceInFlight {
                        writer_id: w.writer_id,
                        first: w.first_sequence,
                        last: w.last_sequence,
                    });
                }
                return Err(StreamError::OutOfOrderSequence {
                    writer_id: w.writer_id,
                    expected: tail.last_sequence.saturating_add(1),
                    got: w.first_sequence,
                });
            }
        }
        Ok(None)
    }
}
