//! `DoPut`: batches submitted to the node in order (pipelined), answered once durable, in
//! order; rows for buckets led elsewhere are forwarded by the node's write session.

use arrow::array::RecordBatch;
use arrow_flight::decode::{DecodedFlightData, DecodedPayload};
use arrow_flight::error::FlightError;
use arrow_flight::{FlightData, PutResult};
use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use futures::stream::FuturesOrdered;
use mink_node::{WriteSession, WriteTarget};
use tokio::sync::mpsc;
use tonic::Status;

use super::{MinkFlight, error_body};
use crate::protocol::{self, ErrorCode};

impl MinkFlight {
    /// Runs one `DoPut` stream: submits batches in order (pipelined up to the configured
    /// depth) and answers each once durable, in order.
    pub(super) async fn put(
        self,
        descriptor: protocol::WriteDescriptor,
        mut input: BoxStream<'static, Result<DecodedFlightData, FlightError>>,
        tx: mpsc::Sender<Result<PutResult, Status>>,
    ) -> tonic::Code {
        let writer = descriptor.writer_id;
        let writer_epoch = descriptor.writer_epoch.unwrap_or(0);
        let session = self.node.write_session();
        // The stream's schema message, while its batches come one message each.
        let mut schema_header: Option<Bytes> = None;
        let mut in_flight = FuturesOrdered::new();
        // Bytes of the batches in flight, as received: small batches pipeline deeper (a
        // count alone held 64 client-routed parts, too few to fill a flush).
        let mut in_flight_bytes = 0usize;
        let mut next = 0u64;
        let mut failure: Option<Status> = None;
        let mut input_done = false;
        loop {
            let can_read = !input_done
                && failure.is_none()
                && in_flight.len() < self.config.put_pipeline_depth
                && in_flight_bytes < self.config.put_pipeline_bytes;
            if !can_read && in_flight.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                Some((index, writes, arrived, size)) = in_flight.next(), if !in_flight.is_empty() => {
                    // Answered in order. Rows of a routed write whose bucket another node leads
                    // were forwarded by the session, in this stream's order per leader.
                    let (writes, arrived): (Vec<mink_node::BucketWrite>, std::time::Instant) =
                        (writes, arrived);
                    in_flight_bytes -= size;
                    let buckets = writes.iter().map(bucket_result).collect();
                    crate::metrics::metrics().ack.record(arrived.elapsed().as_secs_f64(), &[]);
                    let ack = PutResult {
                        app_metadata: protocol::to_json(&protocol::PutAck {
                            batch: index,
                            buckets,
                            applied_index: self.node.view().applied_index,
                        }),
                    };
                    if tx.send(Ok(ack)).await.is_err() {
                        return tonic::Code::Cancelled;
                    }
                }
                // A stopping node takes no more batches, so the drain of its connections
                // does not wait on a stream its client keeps open; those in flight are
                // still answered.
                () = self.node.until_stopping(), if can_read => {
                    failure = Some(self.error(mink_node::NodeError::Unavailable(format!(
                        "node {} is shutting down: batch {next} and after were not written; write them again",
                        self.node.node_id()
                    ))));
                }
                item = input.next(), if can_read => {
                    let decoded = match item {
                        None => { input_done = true; continue; }
                        Some(Err(e)) => {
                            failure = Some(self.input_error(next, &e));
                            continue;
                        }
                        Some(Ok(d)) => d,
                    };
                    let app_metadata = decoded.app_metadata();
                    let batch = match decoded.payload {
                        DecodedPayload::RecordBatch(b) => b,
                        DecodedPayload::Schema(_) => {
                            schema_header = Some(decoded.inner.data_header.clone());
                            continue;
                        }
                        DecodedPayload::None => {
                            // A dictionary: the batches after it are not one message each.
                            schema_header = None;
                            continue;
                        }
                    };
                    let ipc = schema_header.as_ref().map(|s| mink_log::codec::IpcBatch {
                        schema_header: s.clone(),
                        header: decoded.inner.data_header.clone(),
                        body: decoded.inner.data_body.clone(),
                    });
                    let index = next;
                    next += 1;
                    let arrived = std::time::Instant::now();
                    let size = decoded.inner.data_header.len() + decoded.inner.data_body.len();
                    match self.submit(&session, &descriptor, writer, writer_epoch, &batch, &app_metadata, ipc).await {
                        Ok(pending) => {
                            in_flight_bytes += size;
                            in_flight.push_back(async move {
                                (index, pending.await, arrived, size)
                            });
                        }
                        Err(status) => {
                            failure = Some(Status::with_metadata(
                                status.code(),
                                format!("batch {index}: {}", status.message()),
                                status.metadata().clone(),
                            ));
                        }
                    }
                }
            }
        }
        match failure {
            Some(status) => fail(&tx, status).await,
            None => tonic::Code::Ok,
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn submit(
        &self,
        session: &WriteSession,
        d: &protocol::WriteDescriptor,
        writer: Option<u64>,
        writer_epoch: u64,
        batch: &RecordBatch,
        app_metadata: &Bytes,
        ipc: Option<mink_log::codec::IpcBatch>,
    ) -> Result<mink_node::PendingWrite, Status> {
        let meta: protocol::BatchMetadata = if app_metadata.is_empty() {
            protocol::BatchMetadata::default()
        } else {
            protocol::parse("batch app_metadata", app_metadata).map_err(|e| self.invalid(e.0))?
        };
        let bucket = meta.bucket.or(d.bucket);
        let writer = match (writer, meta.sequence) {
            (Some(id), Some(seq)) => {
                let last = meta.last_sequence.unwrap_or(seq);
                if last < seq {
                    return Err(
                        self.invalid(format!("last_sequence {last} is below sequence {seq}"))
                    );
                }
                Some(s3stream_writer(id, writer_epoch, seq, last))
            }
            (Some(_), None) => {
                return Err(
                    self.invalid("an idempotent writer's batch needs its sequence in app_metadata")
                );
            }
            (None, Some(_)) => {
                return Err(self.invalid("a batch sequence needs a writer_id in the descriptor"));
            }
            (None, None) => None,
        };
        let target = WriteTarget {
            partition: meta.partition.or_else(|| d.partition.clone()),
            bucket,
            writer,
            columns: d.columns.clone(),
            ipc,
            ..WriteTarget::default()
        };
        let pending = session
            .submit(&d.database, &d.table, batch, &target)
            .await
            .map_err(|e| self.error(e))?;
        crate::metrics::metrics().rows.add(
            batch.num_rows() as u64,
            &[opentelemetry::KeyValue::new("direction", "in")],
        );
        Ok(pending)
    }
}

/// Counts the bytes and rows of encoded messages going out.
pub(crate) fn count_out(data: &[FlightData], rows: usize) {
    let bytes = data
        .iter()
        .map(|d| d.data_header.len() + d.data_body.len())
        .sum();
    crate::metrics::transferred("out", bytes, rows);
}

/// Ends a stream with an error; its code for the metrics.
pub(crate) async fn fail<T>(tx: &mpsc::Sender<Result<T, Status>>, status: Status) -> tonic::Code {
    let code = status.code();
    let _ = tx.send(Err(status)).await;
    code
}

fn s3stream_writer(
    writer_id: u64,
    writer_epoch: u64,
    first_sequence: u64,
    last_sequence: u64,
) -> mink_node::WriterBatchId {
    mink_node::WriterBatchId {
        writer_id,
        writer_epoch,
        first_sequence,
        last_sequence,
        any_first_sequence: false,
    }
}

pub(crate) fn bucket_result(w: &mink_node::BucketWrite) -> protocol::BucketResult {
    let (base, end, duplicate, error) = match &w.result {
        Ok(ack) => (
            Some(ack.base_offset),
            Some(ack.end_offset),
            ack.duplicate,
            None,
        ),
        Err(e) => (None, None, false, Some(error_body(e))),
    };
    protocol::BucketResult {
        partition: w.partition.clone(),
        bucket: w.bucket,
        rows: w.rows as u64,
        base_offset: base,
        end_offset: end,
        duplicate,
        error,
    }
}

impl MinkFlight {
    /// The status ending a `DoPut` whose input failed at batch `index`: a message over the
    /// size limit is `RESOURCE_EXHAUSTED` (`TOO_LARGE`), anything else malformed is
    /// `INVALID_ARGUMENT`.
    fn input_error(&self, index: u64, e: &FlightError) -> Status {
        match e {
            // tonic's decoder refuses an oversized message before it is read.
            FlightError::Tonic(s)
                if s.code() == tonic::Code::OutOfRange
                    && s.message().contains("message length too large") =>
            {
                self.status(
                    ErrorCode::TooLarge,
                    format!(
                        "batch {index}: the message is over this node's limit of {} bytes \
                         (--max-message-bytes); send smaller batches ({})",
                        self.config.max_message_bytes,
                        s.message()
                    ),
                )
            }
            FlightError::Tonic(s) => self.invalid(format!("batch {index}: {}", s.message())),
            other => self.invalid(format!("batch {index}: {other}")),
        }
    }
}
