//! [`mink_node::Forwarder`] over Arrow Flight: the node decides what goes to which leader;
//! this carries it there as a `DoGet` or `DoPut` marked forwarded, with this node's applied
//! index, and brings the answer back as node results.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use mink_node::{AppendAck, BucketRef, NodeError, NodeResult};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use crate::encode::BatchEncoder;
use crate::protocol::{self, ErrorBody, ErrorCode, FORWARDED_HEADER, Ticket};

/// Longest a forwarded request may take: one slow leader holds a request at most this long.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Flight channels to other nodes, connected on first use and kept.
#[derive(Debug)]
pub(crate) struct FlightForwarder {
    peers: Mutex<HashMap<String, Channel>>,
    max_message_bytes: usize,
}

impl FlightForwarder {
    pub(crate) fn new(max_message_bytes: usize) -> Self {
        FlightForwarder {
            peers: Mutex::new(HashMap::new()),
            max_message_bytes,
        }
    }

    fn client(&self, address: &str) -> NodeResult<FlightServiceClient<Channel>> {
        let channel = {
            let mut peers = self.peers.lock().expect("peers lock");
            match peers.get(address) {
                Some(c) => c.clone(),
                None => {
                    let endpoint = Endpoint::from_shared(format!("http://{address}"))
                        .map_err(|e| NodeError::Failed(format!("leader address {address:?}: {e}")))?
                        .connect_timeout(Duration::from_secs(5))
                        .initial_stream_window_size(crate::STREAM_WINDOW)
                        .initial_connection_window_size(crate::CONNECTION_WINDOW);
                    let c = endpoint.connect_lazy();
                    peers.insert(address.to_string(), c.clone());
                    c
                }
            }
        };
        Ok(FlightServiceClient::new(channel)
            .max_encoding_message_size(self.max_message_bytes)
            .max_decoding_message_size(self.max_message_bytes))
    }

    /// A `DoGet` of `ticket` at the leader, marked forwarded: its batches with their
    /// `app_metadata`.
    /// The batches (with their app metadata) of a `DoGet` of `ticket` at `address`; with
    /// `schema_too`, the stream's schema first, as an empty batch (a lookup that finds no key
    /// answers with the schema alone).
    async fn get(
        &self,
        address: &str,
        ticket: &Ticket,
        applied_index: u64,
        schema_too: bool,
    ) -> NodeResult<BoxStream<'static, NodeResult<(RecordBatch, bytes::Bytes)>>> {
        let mut client = self.client(address)?;
        let mut request = Request::new(arrow_flight::Ticket::new(protocol::to_json(ticket)));
        forwarding(request.metadata_mut(), applied_index);
        request.set_timeout(FORWARD_TIMEOUT);
        let response = client
            .do_get(request)
            .await
            .map_err(|s| from_status(address, &s))?;
        let decoder = FlightDataDecoder::new(
            response
                .into_inner()
                .map_err(|s| FlightError::Tonic(Box::new(s))),
        );
        let address = address.to_string();
        Ok(decoder
            .filter_map(move |item| {
                let address = address.clone();
                async move {
                    match item {
                        Ok(d) => {
                            let meta = d.app_metadata();
                            match d.payload {
                                DecodedPayload::RecordBatch(b) => Some(Ok((b, meta))),
                                DecodedPayload::Schema(schema) if schema_too => {
                                    Some(Ok((RecordBatch::new_empty(schema), meta)))
                                }
                                _ => None,
                            }
                        }
                        Err(FlightError::Tonic(s)) => Some(Err(from_status(&address, &s))),
                        Err(e) => Some(Err(NodeError::Unavailable(format!(
                            "a read forwarded to {address} failed: {e}"
                        )))),
                    }
                }
            })
            .boxed())
    }
}

/// Marks a request as forwarded and carries this node's metadata position, so the leader
/// answers with what this node has seen (a new schema, a new partition).
fn forwarding(metadata: &mut MetadataMap, applied_index: u64) {
    metadata.insert(FORWARDED_HEADER, MetadataValue::from_static("1"));
    metadata.insert(
        protocol::MIN_APPLIED_INDEX_HEADER,
        MetadataValue::from(applied_index),
    );
}

/// A leader's error as the node's: its code and message (and leader) when it is Mink's, else
/// a failure to reach it.
fn from_status(address: &str, s: &Status) -> NodeError {
    let code = s
        .metadata()
        .get(protocol::ERROR_CODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(ErrorCode::parse);
    match code {
        Some(code) => from_code(code, s.message().to_string()),
        None => NodeError::Unavailable(format!(
            "forwarding to the bucket's leader at {address} failed ({}): retry",
            s.message()
        )),
    }
}

fn from_code(code: ErrorCode, message: String) -> NodeError {
    match code {
        ErrorCode::NotFound => NodeError::NotFound(message),
        ErrorCode::AlreadyExists => NodeError::AlreadyExists(message),
        ErrorCode::Invalid
        | ErrorCode::TooLarge
        | ErrorCode::OffsetOutOfRange
        | ErrorCode::OutOfOrderSequence
        | ErrorCode::WriterFenced
        | ErrorCode::UnknownWriter => NodeError::Invalid(message),
        // The leader moved on since this node looked: the client asks again.
        ErrorCode::NotLeader | ErrorCode::Unavailable => NodeError::Unavailable(message),
        ErrorCode::Failed => NodeError::Failed(message),
    }
}

fn from_body(body: ErrorBody) -> NodeError {
    from_code(body.code, body.message)
}

#[async_trait::async_trait]
impl mink_node::Forwarder for FlightForwarder {
    async fn lookup(
        &self,
        address: &str,
        database: &str,
        table: &str,
        keys: &RecordBatch,
        prefix: bool,
        applied_index: u64,
    ) -> NodeResult<RecordBatch> {
        let asked = crate::keyed::keys_as_json(keys).map_err(NodeError::Failed)?;
        let ticket = Ticket {
            database: database.to_string(),
            table: table.to_string(),
            lookup: (!prefix).then(|| asked.clone()),
            prefix_lookup: prefix.then_some(asked),
            ..Default::default()
        };
        let batches: Vec<(RecordBatch, bytes::Bytes)> = self
            .get(address, &ticket, applied_index, true)
            .await?
            .try_collect()
            .await?;
        match batches.first() {
            None => Err(NodeError::Unavailable(format!(
                "the leader at {address} answered a lookup without a schema"
            ))),
            Some((first, _)) => Ok(arrow::compute::concat_batches(
                &first.schema(),
                batches.iter().map(|(b, _)| b),
            )?),
        }
    }

    async fn snapshot(
        &self,
        address: &str,
        bucket: &BucketRef,
        columns: &[String],
        filter: &mink_node::Filter,
        max_rows: Option<u64>,
        applied_index: u64,
    ) -> NodeResult<BoxStream<'static, NodeResult<(RecordBatch, u64)>>> {
        let ticket = Ticket {
            database: bucket.database.clone(),
            table: bucket.table.clone(),
            partition: bucket.partition.clone(),
            bucket: Some(bucket.bucket),
            columns: columns.to_vec(),
            filter: filter.clone(),
            max_rows,
            ..Default::default()
        };
        Ok(self
            .get(address, &ticket, applied_index, false)
            .await?
            .map(|item| {
                let (batch, meta) = item?;
                let offset = protocol::parse::<protocol::ReadMetadata>("read metadata", &meta)
                    .map(|m| m.offset)
                    .unwrap_or_default();
                Ok((batch, offset))
            })
            .boxed())
    }

    async fn write(
        &self,
        address: &str,
        bucket: &BucketRef,
        rows: &RecordBatch,
        applied_index: u64,
    ) -> NodeResult<(AppendAck, u64)> {
        let descriptor = protocol::WriteDescriptor {
            database: bucket.database.clone(),
            table: bucket.table.clone(),
            partition: bucket.partition.clone(),
            bucket: Some(bucket.bucket),
            ..Default::default()
        };
        let mut encoder = BatchEncoder::new();
        let mut messages = vec![encoder.schema(
            &rows.schema(),
            Some(arrow_flight::FlightDescriptor::new_cmd(protocol::to_json(
                &descriptor,
            ))),
        )];
        messages.extend(
            encoder
                .batch(rows, bytes::Bytes::new())
                .map_err(|e| NodeError::Invalid(e.to_string()))?,
        );
        let mut client = self.client(address)?;
        let mut request = Request::new(futures::stream::iter(messages));
        forwarding(request.metadata_mut(), applied_index);
        request.set_timeout(FORWARD_TIMEOUT);
        let unknown = |why: &str| {
            NodeError::Unavailable(format!(
                "forwarding to the bucket's leader at {address} failed ({why}): the write's outcome is unknown"
            ))
        };
        let ack = async {
            let mut results = client.do_put(request).await?.into_inner();
            results.message().await
        }
        .await;
        let first = match ack {
            Ok(Some(first)) => first,
            Ok(None) => return Err(unknown("the leader closed the write without an answer")),
            // The leader refused the rows themselves: its answer stands for them.
            Err(s) if s.code() == tonic::Code::InvalidArgument => {
                return Err(NodeError::Invalid(s.message().to_string()));
            }
            // Sent, then cut short: the rows may or may not be stored. Never "retry at the
            // leader", which a client without a writer id takes as "not stored".
            Err(s) => return Err(unknown(s.message())),
        };
        let ack: protocol::PutAck = protocol::parse("forwarded PutResult", &first.app_metadata)
            .map_err(|e| unknown(&e.0))?;
        let Some(result) = ack.buckets.into_iter().next() else {
            return Err(unknown("the leader answered without a result"));
        };
        match (result.error, result.base_offset, result.end_offset) {
            (Some(e), _, _) => Err(from_body(e)),
            (None, Some(base_offset), Some(end_offset)) => Ok((
                AppendAck {
                    base_offset,
                    end_offset,
                    duplicate: result.duplicate,
                },
                ack.applied_index,
            )),
            _ => Err(unknown("the leader's answer has no offsets")),
        }
    }
}
