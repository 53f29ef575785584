//! The read path: the log cache, then object indexes and blocks (cached), then ranged GETs.
//! Reads never go above a stream's committed end in this node's metadata view.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use object_store::ObjectStoreExt as _;

use crate::engine::{S3Stream, StreamError, StreamInfo, object_path};
use crate::format::{BlockIndex, FOOTER_LEN, RecordBatch, decode_block, parse_footer, parse_index};

/// How much of an object's tail a first read fetches, hoping to get the index with the footer.
const TAIL_READ: u64 = 64 << 10;
/// Blocks one fetch reads from object storage at once.
const FETCH_CONCURRENCY: usize = 16;

// By value, to fit `map_err`.
#[allow(clippy::needless_pass_by_value)]
fn storage(e: object_store::Error) -> StreamError {
    StreamError::Storage(e.to_string())
}

impl S3Stream {
    /// The stream's readable range in this node's view.
    pub fn info(&self, stream_id: u64) -> Result<StreamInfo, StreamError> {
        let view = self.engine.sink.view();
        let s = view
            .state
            .streams
            .get(&stream_id)
            .ok_or(StreamError::NotFound { stream_id })?;
        Ok(StreamInfo {
            stream_id,
            epoch: s.epoch,
            start_offset: s.start_offset,
            end_offset: s.end_offset,
        })
    }

    /// Reads batches from the one containing `offset`, in order, until `max_bytes` are
    /// gathered (at least one batch when there is one) or the committed end is reached.
    /// Reading at the committed end returns nothing; below the start is out of range.
    pub async fn fetch(
        &self,
        stream_id: u64,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<RecordBatch>, StreamError> {
        // A compaction may delete an object between reading the view and the GET: one retry
        // on a fresh view finds the data where it moved.
        match self.fetch_once(stream_id, offset, max_bytes).await {
            Err(StreamError::Storage(_)) => self.fetch_once(stream_id, offset, max_bytes).await,
            other => other,
        }
    }

    async fn fetch_once(
        &self,
        stream_id: u64,
        offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<RecordBatch>, StreamError> {
        let engine = &self.engine;
        let view = engine.sink.view();
        let stream = view
            .state
            .streams
            .get(&stream_id)
            .ok_or(StreamError::NotFound { stream_id })?;
        let (start, end) = (stream.start_offset, stream.end_offset);
        if offset < start || offset > end {
            return Err(StreamError::OutOfRange {
                stream_id,
                offset,
                start,
                end,
            });
        }
        if offset == end {
            return Ok(Vec::new());
        }
        if let Some(batches) = engine.log_cache.read(stream_id, offset, end, max_bytes)
            && !batches.is_empty()
        {
            return Ok(batches);
        }
        // Plan the blocks this read needs (about `max_bytes` of them), fetch the missing ones
        // concurrently, then decode them in order.
        let mut plan: Vec<(u64, BlockIndex, u64)> = Vec::new();
        let mut planned = 0u64;
        let mut cursor = offset;
        let ranges: Vec<_> = view
            .state
            .stream_ranges(stream_id, offset, end)
            .cloned()
            .collect();
        'ranges: for group in ranges.chunks(FETCH_CONCURRENCY) {
            // The indexes of the next few objects, fetched together.
            let indexes = self.indexes_of(&view.state, group).await?;
            for (range, index) in group.iter().zip(indexes) {
                let limit = range.end_offset.min(end);
                let wanted: Vec<BlockIndex> = index
                    .iter()
                    .filter(|e| {
                        e.stream_id == stream_id && e.end_offset > cursor && e.start_offset < limit
                    })
                    .copied()
                    .collect();
                for entry in &wanted {
                    plan.push((range.object_id, *entry, limit));
                    planned += u64::from(entry.size);
                    cursor = entry.end_offset.min(limit);
                    if planned >= max_bytes as u64 {
                        break 'ranges;
                    }
                }
            }
        }
        let blocks: Vec<Bytes> = futures::stream::iter(
            plan.iter()
                .map(|&(object_id, entry, _)| (object_id, entry))
                .collect::<Vec<_>>()
                .into_iter()
                .map(|(object_id, entry)| self.block(object_id, entry)),
        )
        .buffered(FETCH_CONCURRENCY)
        .try_collect()
        .await?;
        let mut out = Vec::new();
        let mut next = offset;
        let mut bytes = 0usize;
        for ((object_id, entry, limit), block) in plan.iter().zip(blocks) {
            let batches = decode_block(&block, entry)
                .map_err(|e| StreamError::Storage(format!("object {object_id} is corrupt: {e}")))?;
            for b in batches {
                if b.end_offset() <= next {
                    continue;
                }
                if b.base_offset >= *limit {
                    break;
                }
                if b.base_offset > next {
                    // The metadata says these offsets are here; the object disagrees.
                    return Err(StreamError::Storage(format!(
                        "object {object_id} lacks offsets {next}..{} of stream {stream_id}",
                        b.base_offset
                    )));
                }
                next = b.end_offset();
                bytes += b.payload.len();
                out.push(b);
                if bytes >= max_bytes {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// The first committed batch at or after offset `from` whose time is at or after
    /// `timestamp_ms` (Kafka's "offset for time"), or `None` when no batch is that late. Batch times need not ascend: this is the
    /// first batch in offset order that qualifies. Only the object indexes (cached, fetched by
    /// every read) and the one block that holds the answer are read: a block whose latest time
    /// is earlier is skipped whole. Batches of unknown time (format version 1) never qualify.
    pub async fn offset_for_time(
        &self,
        stream_id: u64,
        from: u64,
        timestamp_ms: i64,
    ) -> Result<Option<RecordBatch>, StreamError> {
        match self
            .offset_for_time_once(stream_id, from, timestamp_ms)
            .await
        {
            Err(StreamError::Storage(_)) => {
                self.offset_for_time_once(stream_id, from, timestamp_ms)
                    .await
            }
            other => other,
        }
    }

    async fn offset_for_time_once(
        &self,
        stream_id: u64,
        from: u64,
        timestamp_ms: i64,
    ) -> Result<Option<RecordBatch>, StreamError> {
        let view = self.engine.sink.view();
        let stream = view
            .state
            .streams
            .get(&stream_id)
            .ok_or(StreamError::NotFound { stream_id })?;
        let (start, end) = (stream.start_offset.max(from), stream.end_offset);
        if start >= end {
            return Ok(None);
        }
        let ranges: Vec<_> = view
            .state
            .stream_ranges(stream_id, start, end)
            .cloned()
            .collect();
        for group in ranges.chunks(FETCH_CONCURRENCY) {
            let indexes = self.indexes_of(&view.state, group).await?;
            for (range, index) in group.iter().zip(indexes) {
                let (low, high) = (range.start_offset.max(start), range.end_offset.min(end));
                for entry in index.iter().filter(|e| {
                    e.stream_id == stream_id
                        && e.end_offset > low
                        && e.start_offset < high
                        && e.max_timestamp_ms >= timestamp_ms
                }) {
                    let block = self.block(range.object_id, *entry).await?;
                    let batches = decode_block(&block, entry).map_err(|e| {
                        StreamError::Storage(format!("object {} is corrupt: {e}", range.object_id))
                    })?;
                    if let Some(b) = batches.into_iter().find(|b| {
                        b.end_offset() > low
                            && b.base_offset < high
                            && b.timestamp_ms >= timestamp_ms
                    }) {
                        return Ok(Some(b));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Waits (up to `timeout`) until the stream's committed end is beyond `offset`.
    pub async fn wait_beyond(
        &self,
        stream_id: u64,
        offset: u64,
        timeout: Duration,
    ) -> Result<StreamInfo, StreamError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let applied = self.engine.sink.view().applied_index;
            let info = self.info(stream_id)?;
            if info.end_offset > offset {
                return Ok(info);
            }
            match tokio::time::timeout_at(deadline, self.engine.sink.wait_applied(applied + 1))
                .await
            {
                Ok(r) => {
                    r?;
                }
                Err(_) => return Ok(info),
            }
        }
    }

    /// The indexes of the objects holding `ranges`, fetched together (cached ones from the
    /// cache), in order.
    async fn indexes_of(
        &self,
        state: &mink_metadata::State,
        ranges: &[mink_metadata::RangeRecord],
    ) -> Result<Vec<Arc<Vec<BlockIndex>>>, StreamError> {
        let mut sized = Vec::with_capacity(ranges.len());
        for range in ranges {
            let object = state.objects.get(&range.object_id).ok_or_else(|| {
                StreamError::Storage(format!("object {} is not in the metadata", range.object_id))
            })?;
            sized.push((range.object_id, object.size));
        }
        futures::stream::iter(
            sized
                .into_iter()
                .map(|(id, size)| self.object_index(id, size)),
        )
        .buffered(FETCH_CONCURRENCY)
        .try_collect()
        .await
    }

    pub(crate) async fn object_index(
        &self,
        object_id: u64,
        size: u64,
    ) -> Result<Arc<Vec<BlockIndex>>, StreamError> {
        let engine = &self.engine;
        if let Some(index) = engine.index_cache.get(&object_id) {
            return Ok(index);
        }
        let path = object_path(&engine.config.object_prefix, object_id);
        let corrupt = |e| StreamError::Storage(format!("object {object_id} is corrupt: {e}"));
        if size < FOOTER_LEN as u64 {
            return Err(StreamError::Storage(format!(
                "object {object_id} is {size} bytes, too small to be an object"
            )));
        }
        let tail_start = size.saturating_sub(TAIL_READ);
        crate::engine::count_read(engine);
        let tail = engine
            .store
            .get_range(&path, tail_start..size)
            .await
            .map_err(storage)?;
        let footer = parse_footer(&tail, size).map_err(corrupt)?;
        let index_bytes: Bytes = if footer.index_position >= tail_start {
            let at = usize::try_from(footer.index_position - tail_start).unwrap_or(usize::MAX);
            tail.slice(at..at + footer.index_len as usize)
        } else {
            crate::engine::count_read(engine);
            engine
                .store
                .get_range(
                    &path,
                    footer.index_position..footer.index_position + u64::from(footer.index_len),
                )
                .await
                .map_err(storage)?
        };
        let index = Arc::new(parse_index(&index_bytes, &footer).map_err(corrupt)?);
        engine.index_cache.insert(
            object_id,
            Arc::clone(&index),
            index.len() * size_of::<BlockIndex>() + 64,
        );
        Ok(index)
    }

    async fn block(&self, object_id: u64, entry: BlockIndex) -> Result<Bytes, StreamError> {
        let engine = &self.engine;
        if let Some(block) = engine.block_cache.get(&(object_id, entry.position)) {
            return Ok(block);
        }
        crate::engine::count_read(engine);
        let block = engine
            .store
            .get_range(
                &object_path(&engine.config.object_prefix, object_id),
                entry.range(),
            )
            .await
            .map_err(storage)?;
        engine
            .block_cache
            .insert((object_id, entry.position), block.clone(), block.len());
        Ok(block)
    }
}
