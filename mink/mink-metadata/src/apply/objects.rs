//! Objects and idempotent writers: prepared ids, stream-set and stream objects (commits, compactions, expiry, cleanup), writer sequences, producer ids.

use super::*;

impl State {
    pub(super) fn prepare_object(&mut self, c: &PrepareObject) -> CommandResult {
        check_count(
            "prepared object",
            u64::from(c.count),
            u64::from(MAX_PREPARE),
        )?;
        let start = self.counters.next_object_id;
        for object_id in start..start + u64::from(c.count) {
            self.objects.insert(
                object_id,
                ObjectRecord {
                    object_id,
                    state: ObjectState::Prepared as i32,
                    node_id: c.node_id,
                    expires_at_ms: c.expires_at_ms,
                    ..Default::default()
                },
            );
        }
        self.counters.next_object_id = start + u64::from(c.count);
        done(Reply::Range(IdRange {
            start,
            end: self.counters.next_object_id,
        }))
    }

    /// A prepared id of this node, ready to be committed as `kind`.
    pub(super) fn prepared_object(
        &self,
        object_id: u64,
        node_id: u64,
    ) -> Result<Option<&ObjectRecord>, Rejection> {
        let object = self.objects.get(&object_id).ok_or_else(|| {
            rej(
                RejectionKind::NotFound,
                format!("object {object_id} was never prepared"),
            )
        })?;
        if object.node_id != node_id {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "object {object_id} was prepared for node {}, not {node_id}",
                    object.node_id
                ),
            ));
        }
        match ObjectState::try_from(object.state) {
            Ok(ObjectState::Prepared) => Ok(Some(object)),
            Ok(ObjectState::Committed) => Ok(None),
            _ => Err(rej(
                RejectionKind::Expired,
                format!("object {object_id} expired before its commit; prepare a new id"),
            )),
        }
    }

    /// Plans replacing a stream's `[start, end)` held by `sources` with one new range.
    /// `Ok(None)`: the data is gone (stream deleted or trimmed past `end`).
    pub(super) fn plan_move(
        &self,
        stream_id: u64,
        start: u64,
        end: u64,
        sources: &BTreeSet<u64>,
    ) -> Result<Option<RangeMove>, Rejection> {
        let Some(stream) = self.streams.get(&stream_id) else {
            return Ok(None);
        };
        let from = start.max(stream.start_offset);
        if from >= end {
            return Ok(None);
        }
        let conflict = |why: String| {
            rej(
                RejectionKind::Conflict,
                format!("compaction of stream {stream_id} [{start}, {end}): {why}"),
            )
        };
        let mut replaced = Vec::new();
        let mut cursor: Option<u64> = None;
        for range in self.stream_ranges(stream_id, from, end) {
            if !sources.contains(&range.object_id) {
                return Err(conflict(format!(
                    "offset {} lives in object {}, which is not a source",
                    range.start_offset, range.object_id
                )));
            }
            match cursor {
                None if range.start_offset > from => {
                    return Err(conflict(format!("no range holds offset {from}")));
                }
                Some(c) if c != range.start_offset => {
                    return Err(conflict(format!("ranges are not contiguous at {c}")));
                }
                _ => {}
            }
            cursor = Some(range.end_offset);
            replaced.push((stream_id, range.start_offset));
        }
        if cursor != Some(end) {
            return Err(conflict(format!(
                "the sources' ranges end at {}, not {end}",
                cursor.unwrap_or(from)
            )));
        }
        let first = replaced.first().map_or(from, |k| k.1);
        if first < start && start > stream.start_offset {
            // The new object would be credited with [first, start), which it does not hold.
            return Err(conflict(format!(
                "offset {start} is inside the range starting at {first}"
            )));
        }
        Ok(Some(RangeMove {
            stream_id,
            start: first,
            end,
            replaced,
        }))
    }

    pub(super) fn execute_move(&mut self, m: &RangeMove, object_id: u64, at_ms: u64) {
        let mut data_times = Vec::new();
        if self.metadata_version >= crate::DATA_TIME_VERSION {
            for key in &m.replaced {
                if let Some(range) = self.ranges.get(key) {
                    data_times.extend(self.data_times(range));
                    // As it goes, so a move of many ranges stays linear in them.
                    if data_times.len() > 2 * MAX_DATA_TIMES {
                        coarsen(&mut data_times, m.start, MAX_DATA_TIMES);
                    }
                }
            }
            coarsen(&mut data_times, m.start, MAX_DATA_TIMES);
        }
        for key in &m.replaced {
            if let Some(range) = self.ranges.remove(key) {
                self.release_object_range(range.object_id, at_ms);
            }
        }
        self.ranges.insert(
            (m.stream_id, m.start),
            RangeRecord {
                stream_id: m.stream_id,
                start_offset: m.start,
                end_offset: m.end,
                object_id,
                data_times,
            },
        );
        if let Some(object) = self.objects.get_mut(&object_id) {
            object.live_ranges += 1;
        }
    }

    pub(super) fn finish_object(
        &mut self,
        object_id: u64,
        kind: ObjectKind,
        size: u64,
        at_ms: u64,
    ) {
        if let Some(object) = self.objects.get_mut(&object_id) {
            object.kind = kind as i32;
            object.size = size;
            object.committed_at_ms = at_ms;
            if object.live_ranges > 0 {
                object.state = ObjectState::Committed as i32;
            } else {
                // Nothing references it: the bytes must still be deleted.
                object.state = ObjectState::Destroyed as i32;
                object.destroyed_at_ms = at_ms;
            }
        }
    }

    pub(super) fn check_writers(&self, range: &StreamRange) -> Result<(), Rejection> {
        // (epoch, last sequence) per writer: committed, then advanced by the batches of this
        // range one by one, so a writer may have several batches in one commit.
        let mut tails: BTreeMap<u64, (u64, Option<u64>)> = BTreeMap::new();
        for w in &range.writers {
            if w.first_sequence > w.last_sequence
                || w.base_offset < range.start_offset
                || w.end_offset > range.end_offset
                || w.base_offset >= w.end_offset
            {
                return Err(rej(
                    RejectionKind::InvalidArgument,
                    format!(
                        "writer {} batch does not fit range [{}, {})",
                        w.writer_id, range.start_offset, range.end_offset
                    ),
                ));
            }
            let tail = tails.entry(w.writer_id).or_insert_with(|| {
                self.writers
                    .get(&(range.stream_id, w.writer_id))
                    .map_or((w.writer_epoch, None), |r| {
                        (r.writer_epoch, r.batches.last().map(|b| b.last_sequence))
                    })
            });
            if w.writer_epoch < tail.0 {
                return Err(rej(
                    RejectionKind::WriterFenced,
                    format!(
                        "writer {} epoch {} is older than {}",
                        w.writer_id, w.writer_epoch, tail.0
                    ),
                )
                .with_current(tail.0));
            }
            if w.writer_epoch == tail.0
                && let Some(last) = tail.1
                && Some(w.first_sequence) != last.checked_add(1)
            {
                return Err(rej(
                    RejectionKind::Conflict,
                    format!(
                        "writer {} sequence {} does not follow {last}",
                        w.writer_id, w.first_sequence
                    ),
                )
                .with_current(last));
            }
            *tail = (w.writer_epoch, Some(w.last_sequence));
        }
        Ok(())
    }

    pub(super) fn record_writers(&mut self, range: &StreamRange, at_ms: u64) {
        for w in &range.writers {
            let key = (range.stream_id, w.writer_id);
            let mut record = self.writers.get(&key).cloned().unwrap_or(WriterRecord {
                stream_id: range.stream_id,
                writer_id: w.writer_id,
                writer_epoch: w.writer_epoch,
                ..Default::default()
            });
            if record.writer_epoch != w.writer_epoch {
                record.writer_epoch = w.writer_epoch;
                record.batches.clear();
            }
            record.batches.push(WriterBatch {
                first_sequence: w.first_sequence,
                last_sequence: w.last_sequence,
                base_offset: w.base_offset,
                end_offset: w.end_offset,
            });
            if record.batches.len() > WRITER_BATCHES {
                let excess = record.batches.len() - WRITER_BATCHES;
                record.batches.drain(..excess);
            }
            record.updated_at_ms = at_ms;
            self.writers.insert(key, record);
        }
    }

    pub(super) fn commit_stream_set_object(
        &mut self,
        c: &CommitStreamSetObject,
        at_ms: u64,
    ) -> CommandResult {
        // A WAL commit holds one range per stream; a compaction may hold several ranges of
        // one stream (runs separated by data held elsewhere), ascending and disjoint.
        let compaction = !c.compacted_object_ids.is_empty();
        let mut last_end: BTreeMap<u64, u64> = BTreeMap::new();
        for r in &c.ranges {
            let repeated = match last_end.insert(r.stream_id, r.end_offset) {
                None => false,
                Some(end) => !compaction || r.start_offset < end,
            };
            if r.end_offset <= r.start_offset || repeated {
                return Err(rej(
                    RejectionKind::InvalidArgument,
                    format!(
                        "object {}: range [{}, {}) of stream {} is empty, repeated or overlapping",
                        c.object_id, r.start_offset, r.end_offset, r.stream_id
                    ),
                ));
            }
        }
        if self.prepared_object(c.object_id, c.node_id)?.is_none() {
            return redundant(Reply::Commit(CommitReply::default()));
        }
        let mut results = Vec::with_capacity(c.ranges.len());
        if c.compacted_object_ids.is_empty() {
            for range in &c.ranges {
                let verdict = self.stream(range.stream_id).and_then(|stream| {
                    Self::check_owner(stream, c.node_id, c.node_epoch, range.stream_epoch)?;
                    if stream.state != StreamState::Open as i32 {
                        return Err(rej(
                            RejectionKind::StreamFenced,
                            format!("stream {} is closed", range.stream_id),
                        ));
                    }
                    if range.start_offset != stream.end_offset {
                        return Err(rej(
                            RejectionKind::Conflict,
                            format!(
                                "stream {} range starts at {} but its committed end is {}",
                                range.stream_id, range.start_offset, stream.end_offset
                            ),
                        )
                        .with_current(stream.end_offset));
                    }
                    self.check_writers(range)
                });
                if verdict.is_ok() {
                    let mut stream = self.streams[&range.stream_id].clone();
                    stream.end_offset = range.end_offset;
                    self.streams.insert(range.stream_id, stream);
                    self.ranges.insert(
                        (range.stream_id, range.start_offset),
                        RangeRecord {
                            stream_id: range.stream_id,
                            start_offset: range.start_offset,
                            end_offset: range.end_offset,
                            object_id: c.object_id,
                            data_times: Vec::new(),
                        },
                    );
                    if let Some(object) = self.objects.get_mut(&c.object_id) {
                        object.live_ranges += 1;
                    }
                    self.record_writers(range, at_ms);
                }
                results.push(RangeResult {
                    stream_id: range.stream_id,
                    rejection: verdict.err(),
                });
            }
        } else {
            let sources: BTreeSet<u64> = c.compacted_object_ids.iter().copied().collect();
            for id in &sources {
                if let Some(source) = self.objects.get(id)
                    && source.state == ObjectState::Prepared as i32
                {
                    return Err(rej(
                        RejectionKind::InvalidArgument,
                        format!("compaction source {id} was never committed"),
                    ));
                }
            }
            let plans: Vec<Option<RangeMove>> = c
                .ranges
                .iter()
                .map(|r| self.plan_move(r.stream_id, r.start_offset, r.end_offset, &sources))
                .collect::<Result<_, _>>()?;
            for (range, plan) in c.ranges.iter().zip(&plans) {
                let rejection = match plan {
                    Some(m) => {
                        self.execute_move(m, c.object_id, at_ms);
                        None
                    }
                    None => Some(rej(
                        RejectionKind::NotFound,
                        format!(
                            "stream {} no longer holds [{}, {})",
                            range.stream_id, range.start_offset, range.end_offset
                        ),
                    )),
                };
                results.push(RangeResult {
                    stream_id: range.stream_id,
                    rejection,
                });
            }
        }
        self.finish_object(c.object_id, ObjectKind::StreamSet, c.object_size, at_ms);
        done(Reply::Commit(CommitReply { ranges: results }))
    }

    pub(super) fn compact_stream_object(
        &mut self,
        c: &CompactStreamObject,
        at_ms: u64,
    ) -> CommandResult {
        if c.end_offset <= c.start_offset {
            return Err(rej(
                RejectionKind::InvalidArgument,
                format!(
                    "stream object range [{}, {}) is empty",
                    c.start_offset, c.end_offset
                ),
            ));
        }
        if self.prepared_object(c.object_id, c.node_id)?.is_none() {
            return redundant(unit());
        }
        let sources: BTreeSet<u64> = c.source_object_ids.iter().copied().collect();
        let Some(plan) = self.plan_move(c.stream_id, c.start_offset, c.end_offset, &sources)?
        else {
            return Err(rej(
                RejectionKind::NotFound,
                format!(
                    "stream {} no longer holds [{}, {})",
                    c.stream_id, c.start_offset, c.end_offset
                ),
            ));
        };
        self.execute_move(&plan, c.object_id, at_ms);
        self.finish_object(c.object_id, ObjectKind::Stream, c.object_size, at_ms);
        done(unit())
    }

    pub(super) fn expire_prepared_objects(&mut self, c: &ExpirePreparedObjects) -> CommandResult {
        let expired: Vec<u64> = self
            .objects
            .values()
            .filter(|o| o.state == ObjectState::Prepared as i32 && o.expires_at_ms <= c.now_ms)
            .map(|o| o.object_id)
            .collect();
        if expired.is_empty() {
            return redundant(Reply::Count(0));
        }
        for id in &expired {
            if let Some(object) = self.objects.get_mut(id) {
                object.state = ObjectState::Destroyed as i32;
                object.destroyed_at_ms = c.now_ms;
            }
        }
        done(Reply::Count(expired.len() as u64))
    }

    pub(super) fn clean_destroyed_objects(&mut self, c: &CleanDestroyedObjects) -> CommandResult {
        for id in &c.object_ids {
            if let Some(object) = self.objects.get(id)
                && object.state != ObjectState::Destroyed as i32
            {
                return Err(rej(
                    RejectionKind::Conflict,
                    format!("object {id} is not destroyed"),
                ));
            }
        }
        let removed = remove_where(&mut self.objects, c.object_ids.iter().copied());
        if removed == 0 {
            return redundant(Reply::Count(0));
        }
        done(Reply::Count(removed as u64))
    }

    pub(super) fn allocate_producer_ids(&mut self, c: &AllocateProducerIds) -> CommandResult {
        check_count(
            "producer id",
            u64::from(c.count),
            u64::from(MAX_PRODUCER_IDS),
        )?;
        let start = self.counters.next_producer_id;
        self.counters.next_producer_id += u64::from(c.count);
        done(Reply::Range(IdRange {
            start,
            end: self.counters.next_producer_id,
        }))
    }
}

/// At most this many data times per range: enough that retention overshoots a TTL by a small
/// share of it, few enough that a range stays small in every snapshot.
const MAX_DATA_TIMES: usize = 32;

/// Merges adjacent runs (of a range starting at `start`) until at most `max` remain, each time
/// the two whose merge overstates the age of the fewest offsets by the least (the older run's
/// offsets times the gap; the first such pair on a tie, so every node merges alike). A merged
/// run takes the later time: a row may be kept longer, never trimmed early. Weighing by offsets
/// keeps runs even: merging the closest in time alone would snowball the oldest into one run
/// stamped with a recent time.
fn coarsen(times: &mut Vec<DataTime>, start: u64, max: usize) {
    while times.len() > max.max(1) {
        let offsets = |i: usize| {
            let from = if i == 0 {
                start
            } else {
                times[i - 1].end_offset
            };
            u128::from(times[i].end_offset.saturating_sub(from))
        };
        let cost = |i: usize| {
            let (a, b) = (times[i].at_ms, times[i + 1].at_ms);
            let older = if a <= b { i } else { i + 1 };
            u128::from(a.abs_diff(b)) * offsets(older)
        };
        let i = (0..times.len() - 1)
            .min_by_key(|&i| cost(i))
            .expect("at least two runs");
        let next = times.remove(i + 1);
        times[i] = DataTime {
            end_offset: next.end_offset,
            at_ms: times[i].at_ms.max(next.at_ms),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(pairs: &[(u64, u64)]) -> Vec<DataTime> {
        pairs
            .iter()
            .map(|&(end_offset, at_ms)| DataTime { end_offset, at_ms })
            .collect()
    }

    #[test]
    fn coarsening_merges_the_runs_closest_in_time_and_keeps_the_later_time() {
        let mut t = runs(&[(10, 100), (20, 105), (30, 500), (40, 900), (50, 902)]);
        coarsen(&mut t, 0, 3);
        assert_eq!(t, runs(&[(20, 105), (30, 500), (50, 902)]));
        coarsen(&mut t, 0, 1);
        assert_eq!(t, runs(&[(50, 902)]));
        let mut ties = runs(&[(1, 10), (2, 20), (3, 30)]);
        coarsen(&mut ties, 0, 2);
        assert_eq!(ties, runs(&[(2, 20), (3, 30)]), "the first of equal gaps");
    }
}
