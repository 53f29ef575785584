//! One bucket of a log table, on its stream.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use s3stream::{AppendAck, Appending, S3Stream, WriterBatchId};

use crate::codec::{self, Compression};
use crate::{LogError, LogResult};

/// Rows read from a bucket; `base_offset` is the offset of the first row, `end_offset` the
/// offset after the stored batch (where the next read starts; a reader that filters rows, such
/// as a changelog view, may hold fewer rows than offsets).
#[derive(Clone, Debug, PartialEq)]
pub struct ReadBatch {
    pub base_offset: u64,
    pub end_offset: u64,
    /// The stored batch's time (milliseconds since the epoch; see [`StoredBatch`]).
    pub timestamp_ms: i64,
    pub batch: RecordBatch,
}

/// A bucket of a log table: its stream, the table's schema and storage options. Appends need
/// the stream open on this node (the bucket's leader); reads work on any node.
#[derive(Clone, Debug)]
pub struct LogTablet {
    pub stream_id: u64,
    pub schema: SchemaRef,
    pub compression: Compression,
    streams: S3Stream,
    /// Appends only while the stream is open at this epoch (see [`LogTablet::at_epoch`]).
    epoch: Option<u64>,
}

impl LogTablet {
    pub fn new(
        streams: S3Stream,
        stream_id: u64,
        schema: SchemaRef,
        compression: Compression,
    ) -> Self {
        LogTablet {
            stream_id,
            schema,
            compression,
            streams,
            epoch: None,
        }
    }

    /// Stores what this handle appends with `compression` instead of the table's (readers
    /// decode either: each stored batch says how its buffers are compressed).
    #[must_use]
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// Appends only while the stream is open on this node at `epoch`: a writer whose batches
    /// depend on what it read (a primary-key changelog) never appends to a later opening.
    #[must_use]
    pub fn at_epoch(mut self, epoch: u64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// Appends a batch (checked against the table's schema); one offset per row, stamped with
    /// the engine clock's time. Returns once the rows are durable. With `writer`, a retry of a batch already stored returns its
    /// original offsets.
    pub async fn append(
        &self,
        batch: &RecordBatch,
        writer: Option<WriterBatchId>,
    ) -> LogResult<AppendAck> {
        Ok(self.submit(batch, writer).await?.await?)
    }

    /// Like [`LogTablet::append`], but returns once the rows have their offsets (in submission
    /// order); the [`Appending`] resolves when they are durable. For pipelining.
    pub async fn submit(
        &self,
        batch: &RecordBatch,
        writer: Option<WriterBatchId>,
    ) -> LogResult<Appending> {
        self.submit_received(batch, None, writer, None).await
    }

    /// [`LogTablet::submit`] of a batch stored as received when `ipc` allows it (see [`codec::stored_as_received`]): no encoding. The
    /// batch's time is `timestamp_ms` (the latest time of its rows, such as a Kafka producer's
    /// record times), or the engine clock's when `None`.
    pub async fn submit_received(
        &self,
        batch: &RecordBatch,
        ipc: Option<&codec::IpcBatch>,
        writer: Option<WriterBatchId>,
        timestamp_ms: Option<i64>,
    ) -> LogResult<Appending> {
        let timestamp_ms = timestamp_ms.unwrap_or_else(|| self.streams.now_ms());
        let rows = u32::try_from(batch.num_rows())
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| LogError::Invalid(format!("a batch of {} rows", batch.num_rows())))?;
        // A batch received as the table stores it (checked by the caller) is stored as is.
        let bytes = match ipc
            .and_then(|ipc| codec::stored_as_received(ipc, &self.schema, self.compression))
        {
            Some(bytes) => bytes,
            None => {
                codec::encode_batch(&codec::check_batch(&self.schema, batch)?, self.compression)?
            }
        };
        Ok(self
            .streams
            .submit_at(
                self.stream_id,
                self.epoch,
                rows,
                bytes,
                writer,
                timestamp_ms,
            )
            .await?)
    }

    /// Reads rows from `offset` (the first batch starts exactly there), about `max_bytes` of
    /// stored data, keeping `columns` (all when empty).
    pub async fn read(
        &self,
        offset: u64,
        max_bytes: usize,
        columns: &[String],
    ) -> LogResult<Vec<ReadBatch>> {
        let stored = self.read_stored(offset, max_bytes).await?;
        let mut out = Vec::with_capacity(stored.len());
        for s in &stored {
            if let Some(b) = self.decode_stored(s, offset, columns)? {
                out.push(b);
            }
        }
        Ok(out)
    }

    /// The stored batches from the one holding `offset`, about `max_bytes` of them, undecoded.
    pub async fn read_stored(&self, offset: u64, max_bytes: usize) -> LogResult<Vec<StoredBatch>> {
        Ok(self
            .streams
            .fetch(self.stream_id, offset, max_bytes)
            .await?
            .into_iter()
            .map(|s| StoredBatch {
                base_offset: s.base_offset,
                end_offset: s.end_offset(),
                timestamp_ms: s.timestamp_ms,
                payload: s.payload,
            })
            .collect())
    }

    /// Decodes a stored batch as [`LogTablet::read`] does: its rows from `offset` on, in the
    /// table's current schema, keeping `columns`. `None` when no row is left.
    pub fn decode_stored(
        &self,
        s: &StoredBatch,
        offset: u64,
        columns: &[String],
    ) -> LogResult<Option<ReadBatch>> {
        let mut batch = codec::decode_columns(&s.payload, &self.schema, columns)?;
        let mut base_offset = s.base_offset;
        if base_offset < offset {
            let skip = usize::try_from(offset - base_offset).unwrap_or(usize::MAX);
            batch = batch.slice(
                skip.min(batch.num_rows()),
                batch.num_rows().saturating_sub(skip),
            );
            base_offset = offset;
        }
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        Ok(Some(ReadBatch {
            base_offset,
            end_offset: s.end_offset,
            timestamp_ms: s.timestamp_ms,
            batch,
        }))
    }
}

/// A batch as stored in the bucket's stream: an Arrow IPC stream of one record batch.
#[derive(Clone, Debug)]
pub struct StoredBatch {
    pub base_offset: u64,
    pub end_offset: u64,
    /// Milliseconds since the epoch: the writer's time for the batch (the latest of its rows),
    /// the append time unless the writer gave one; `-1` for batches stored before batches
    /// carried a time.
    pub timestamp_ms: i64,
    pub payload: bytes::Bytes,
}
