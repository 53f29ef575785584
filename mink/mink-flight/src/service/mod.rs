//! The Flight service on a node: an adapter that decodes a request, calls the node service
//! (`mink-node`), and encodes its answer. `get` (`DoGet`), `put` (`DoPut`), `action`
//! (`DoAction`), and `forward`: the node's [`mink_node::Forwarder`] over Flight.

mod admin;
mod forward;
mod get;
mod put;

pub(crate) use put::{count_out, fail};

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::error::FlightError;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult,
};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use mink_node::{Node, NodeError, TableInfo};
use tokio::sync::mpsc;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use crate::protocol::{self, ErrorBody, ErrorCode, action};

pub(crate) use admin::describe;

/// Limits and timings of the Flight service.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Largest gRPC message accepted or sent (one Flight batch).
    pub max_message_bytes: usize,
    /// Longest wait for `mink-min-applied-index` before answering `UNAVAILABLE`.
    pub max_applied_wait: Duration,
    /// Most batches of one `DoPut` stream in flight (submitted, not yet durable).
    pub put_pipeline_depth: usize,
    /// Most bytes (as received) of the batches of one `DoPut` stream in flight; a batch is
    /// taken while there are fewer, so one larger than this still goes through.
    pub put_pipeline_bytes: usize,
    /// Stored bytes fetched per read step of a `DoGet`.
    pub read_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_message_bytes: 64 << 20,
            max_applied_wait: Duration::from_secs(10),
            put_pipeline_depth: 1024,
            put_pipeline_bytes: 32 << 20,
            read_bytes: 4 << 20,
        }
    }
}

/// Mink's Arrow Flight service (see `docs/flight.md` for the protocol).
#[derive(Clone, Debug)]
pub struct MinkFlight {
    pub(crate) node: Node,
    pub(crate) config: Arc<ServerConfig>,
}

type FlightStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

impl MinkFlight {
    pub fn new(node: Node, config: ServerConfig) -> Self {
        // Requests for buckets other nodes lead go there over Flight.
        node.set_forwarder(Arc::new(forward::FlightForwarder::new(
            config.max_message_bytes,
        )));
        MinkFlight {
            node,
            config: Arc::new(config),
        }
    }

    /// The tonic service, with the message size limits applied.
    pub fn into_server(self) -> FlightServiceServer<Self> {
        let max = self.config.max_message_bytes;
        FlightServiceServer::new(self)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max)
    }

    /// Honours `mink-min-applied-index`.
    async fn catch_up(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let Some(value) = metadata.get(protocol::MIN_APPLIED_INDEX_HEADER) else {
            return Ok(());
        };
        let index: u64 = value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                self.status(
                    ErrorCode::Invalid,
                    format!(
                        "{} must be an unsigned integer",
                        protocol::MIN_APPLIED_INDEX_HEADER
                    ),
                )
            })?;
        self.node
            .wait_applied(index, self.config.max_applied_wait)
            .await
            .map(|_| ())
            .map_err(|e| self.error(e))
    }

    fn applied_index(&self) -> MetadataValue<tonic::metadata::Ascii> {
        MetadataValue::from(self.node.view().applied_index)
    }

    /// Runs a streaming call's work on its own task and counts the call when the work ends. A
    /// panic ends the stream with `bug` as an error status, so that a stream cut short never
    /// looks complete to the client.
    fn spawn_call<T, W>(
        &self,
        call: &'static str,
        started: std::time::Instant,
        span: tracing::Span,
        tx: mpsc::Sender<Result<T, Status>>,
        work: W,
        bug: &'static str,
    ) where
        T: Send + 'static,
        W: Future<Output = tonic::Code> + Send + 'static,
    {
        let this = self.clone();
        tokio::spawn(
            async move {
                let outcome =
                    futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(work)).await;
                crate::metrics::finished(
                    call,
                    *outcome.as_ref().unwrap_or(&tonic::Code::Internal),
                    started,
                );
                if outcome.is_err() {
                    let _ = tx
                        .send(Err(this.status(ErrorCode::Failed, bug.into())))
                        .await;
                }
            }
            .instrument(span),
        );
    }

    fn respond<T>(&self, body: T) -> Response<T> {
        let mut response = Response::new(body);
        response
            .metadata_mut()
            .insert(protocol::APPLIED_INDEX_HEADER, self.applied_index());
        response
    }

    pub(crate) fn status(&self, code: ErrorCode, message: String) -> Status {
        let grpc = match code {
            ErrorCode::NotFound => tonic::Code::NotFound,
            ErrorCode::AlreadyExists => tonic::Code::AlreadyExists,
            ErrorCode::Invalid => tonic::Code::InvalidArgument,
            ErrorCode::NotLeader | ErrorCode::OutOfOrderSequence | ErrorCode::WriterFenced => {
                tonic::Code::FailedPrecondition
            }
            ErrorCode::OffsetOutOfRange => tonic::Code::OutOfRange,
            ErrorCode::UnknownWriter => tonic::Code::InvalidArgument,
            ErrorCode::TooLarge => tonic::Code::ResourceExhausted,
            ErrorCode::Unavailable => tonic::Code::Unavailable,
            ErrorCode::Failed => tonic::Code::Internal,
        };
        let mut status = Status::new(grpc, protocol::cap_message(message));
        let m = status.metadata_mut();
        m.insert(protocol::APPLIED_INDEX_HEADER, self.applied_index());
        m.insert(
            protocol::ERROR_CODE_HEADER,
            MetadataValue::from_static(code.as_str()),
        );
        status
    }

    // By value: it reads best as `.map_err(|e| self.error(e))`.
    #[allow(clippy::needless_pass_by_value)]
    pub(crate) fn error(&self, e: NodeError) -> Status {
        let body = error_body(&e);
        let mut status = self.status(body.code, body.message);
        let m = status.metadata_mut();
        let mut number = |name: &'static str, value: Option<u64>| {
            if let Some(v) = value {
                m.insert(name, MetadataValue::from(v));
            }
        };
        number(protocol::LEADER_NODE_HEADER, body.leader_node_id);
        number(protocol::LEADER_EPOCH_HEADER, body.leader_epoch);
        number(protocol::START_OFFSET_HEADER, body.start_offset);
        number(protocol::END_OFFSET_HEADER, body.end_offset);
        number(protocol::EXPECTED_SEQUENCE_HEADER, body.expected_sequence);
        number(protocol::WRITER_EPOCH_HEADER, body.writer_epoch);
        if let Some(a) = body.leader_address.and_then(|a| a.parse().ok()) {
            m.insert(protocol::LEADER_ADDRESS_HEADER, a);
        }
        status
    }

    pub(crate) fn invalid(&self, message: impl Into<String>) -> Status {
        self.status(ErrorCode::Invalid, message.into())
    }

    /// `[database, table]` from a path descriptor.
    fn table_path(&self, descriptor: &FlightDescriptor) -> Result<(String, String), Status> {
        match (descriptor.r#type(), descriptor.path.as_slice()) {
            (DescriptorType::Path, [database, table]) => Ok((database.clone(), table.clone())),
            _ => Err(self.invalid("expected a path descriptor [database, table]".to_string())),
        }
    }

    /// `GetFlightInfo` of a table: its schema, its description, and the endpoints that read
    /// it (see docs/flight.md, "GetFlightInfo").
    fn flight_info(&self, info: &TableInfo) -> Result<FlightInfo, Status> {
        let description = describe(info).map_err(|e| self.invalid(e.0))?;
        let primary = !info.primary_key.is_empty();
        let endpoint = |b: &mink_node::BucketInfo,
                        offset: Option<u64>,
                        end_offset: Option<u64>,
                        source: Option<&str>,
                        at_leader: bool| {
            let ticket = protocol::Ticket {
                database: info.database.clone(),
                table: info.name.clone(),
                partition: b.partition.clone(),
                bucket: Some(b.bucket),
                offset,
                end_offset,
                source: source.map(str::to_string),
                ..Default::default()
            };
            let mut e = FlightEndpoint::new()
                .with_ticket(arrow_flight::Ticket::new(protocol::to_json(&ticket)));
            if at_leader && !b.leader_address.is_empty() {
                e = e.with_location(format!("grpc://{}", b.leader_address));
            }
            e
        };
        let mut endpoints = Vec::new();
        for b in &info.buckets {
            if primary {
                // A primary-key table's bucket as a snapshot of its current rows (its offsets
                // number the changelog), at its leader.
                endpoints.push(endpoint(b, None, None, None, true));
                continue;
            }
            // A log table's bucket up to its high watermark now. History below the log's
            // start is in the lake: one endpoint per split of it, readable on any node in
            // parallel, then the log's part at the leader.
            let mut from = b.readable_offset;
            while from < b.start_offset {
                let to = from.saturating_add(LAKE_SPLIT_ROWS).min(b.start_offset);
                endpoints.push(endpoint(b, Some(from), Some(to), Some("lake"), false));
                from = to;
            }
            // A union read: should retention trim past `from` before it runs, the lake still
            // serves what the log lost.
            if from < b.end_offset || from == b.readable_offset {
                endpoints.push(endpoint(b, Some(from), Some(b.end_offset), None, true));
            }
        }
        // Rows of a log table (one offset per row); unknown (-1) for a primary-key table,
        // whose offsets count changes, not rows.
        let records: i64 = if primary {
            -1
        } else {
            let rows: u64 = info
                .buckets
                .iter()
                .map(|b| b.end_offset - b.readable_offset)
                .sum();
            i64::try_from(rows).unwrap_or(i64::MAX)
        };
        FlightInfo::new()
            .try_with_schema(&info.schema)
            .map_err(|e| self.status(ErrorCode::Failed, e.to_string()))
            .map(|f| {
                f.with_descriptor(FlightDescriptor::new_path(vec![
                    info.database.clone(),
                    info.name.clone(),
                ]))
                .with_endpoints(endpoints)
                .with_total_records(records)
                .with_total_bytes(-1)
                .with_app_metadata(protocol::to_json(&description))
            })
    }
}

/// Rows of a lake-history endpoint at most: a client reads a bucket's history in parallel
/// splits of this size.
const LAKE_SPLIT_ROWS: u64 = 1 << 20;

/// The per-bucket error body of a node error.
pub(crate) fn error_body(e: &NodeError) -> ErrorBody {
    let code = match e {
        NodeError::TableNotFound { .. } | NodeError::NotFound(_) => ErrorCode::NotFound,
        NodeError::AlreadyExists(_) => ErrorCode::AlreadyExists,
        NodeError::Invalid(_) | NodeError::WrongBucket { .. } | NodeError::TooLarge { .. } => {
            ErrorCode::Invalid
        }
        NodeError::NotLeader { .. } => ErrorCode::NotLeader,
        NodeError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
        NodeError::OutOfOrderSequence { .. } => ErrorCode::OutOfOrderSequence,
        NodeError::WriterFenced { .. } => ErrorCode::WriterFenced,
        NodeError::UnknownWriter { .. } => ErrorCode::UnknownWriter,
        NodeError::Unavailable(_) => ErrorCode::Unavailable,
        _ => ErrorCode::Failed,
    };
    let mut body = ErrorBody::new(code, protocol::cap_message(e.to_string()));
    match e {
        NodeError::NotLeader {
            leader,
            address,
            leader_epoch,
            ..
        } => {
            body.leader_node_id = Some(*leader);
            body.leader_address = Some(address.clone());
            body.leader_epoch = Some(*leader_epoch);
        }
        NodeError::OffsetOutOfRange { start, end, .. } => {
            body.start_offset = Some(*start);
            body.end_offset = Some(*end);
        }
        NodeError::OutOfOrderSequence { expected, .. } => {
            body.expected_sequence = Some(*expected);
        }
        NodeError::WriterFenced { current, .. } => body.writer_epoch = Some(*current),
        _ => {}
    }
    body
}

#[tonic::async_trait]
impl FlightService for MinkFlight {
    type HandshakeStream = FlightStream<HandshakeResponse>;
    type ListFlightsStream = FlightStream<FlightInfo>;
    type DoGetStream = FlightStream<FlightData>;
    type DoPutStream = FlightStream<PutResult>;
    type DoExchangeStream = FlightStream<FlightData>;
    type DoActionStream = FlightStream<arrow_flight::Result>;
    type ListActionsStream = FlightStream<ActionType>;

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        // No authentication yet: an empty handshake succeeds.
        let reply = HandshakeResponse::default();
        Ok(self
            .respond(Box::pin(futures::stream::once(async { Ok(reply) })) as Self::HandshakeStream))
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let started = std::time::Instant::now();
        let result: Result<Response<Self::ListFlightsStream>, Status> = async {
            self.catch_up(request.metadata()).await?;
            let database =
                String::from_utf8(request.get_ref().expression.to_vec()).map_err(|_| {
                    self.invalid("the criteria must be a database name (UTF-8) or empty")
                })?;
            let databases = if database.is_empty() {
                self.node.list_databases()
            } else {
                vec![database]
            };
            let mut infos = Vec::new();
            for db in databases {
                for table in self.node.list_tables(&db).map_err(|e| self.error(e))? {
                    let info = self
                        .node
                        .describe_table(&db, &table)
                        .map_err(|e| self.error(e))?;
                    infos.push(self.flight_info(&info));
                }
            }
            Ok(self.respond(Box::pin(futures::stream::iter(infos)) as Self::ListFlightsStream))
        }
        .await;
        crate::metrics::finished(
            "list_flights",
            result.as_ref().err().map_or(tonic::Code::Ok, Status::code),
            started,
        );
        result
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let started = std::time::Instant::now();
        let result: Result<Response<FlightInfo>, Status> = async {
            let span = tracing::info_span!("flight.get_flight_info");
            async {
                self.catch_up(request.metadata()).await?;
                let (database, table) = self.table_path(request.get_ref())?;
                let info = self
                    .node
                    .describe_table(&database, &table)
                    .map_err(|e| self.error(e))?;
                Ok(self.respond(self.flight_info(&info)?))
            }
            .instrument(span)
            .await
        }
        .await;
        crate::metrics::finished(
            "get_flight_info",
            result.as_ref().err().map_or(tonic::Code::Ok, Status::code),
            started,
        );
        result
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("PollFlightInfo: use GetFlightInfo"))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let started = std::time::Instant::now();
        let result: Result<Response<SchemaResult>, Status> = async {
            self.catch_up(request.metadata()).await?;
            let (database, table) = self.table_path(request.get_ref())?;
            let info = self
                .node
                .describe_table(&database, &table)
                .map_err(|e| self.error(e))?;
            let result: SchemaResult = SchemaAsIpc::new(&info.schema, &IpcWriteOptions::default())
                .try_into()
                .map_err(|e: arrow::error::ArrowError| {
                    self.status(ErrorCode::Failed, e.to_string())
                })?;
            Ok(self.respond(result))
        }
        .await;
        crate::metrics::finished(
            "get_schema",
            result.as_ref().err().map_or(tonic::Code::Ok, Status::code),
            started,
        );
        result
    }

    async fn do_get(
        &self,
        request: Request<arrow_flight::Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let started = std::time::Instant::now();
        let result = self.get(request, started).await;
        if let Err(status) = &result {
            crate::metrics::finished("do_get", status.code(), started);
        }
        result
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let started = std::time::Instant::now();
        let result: Result<Response<Self::DoPutStream>, Status> = async {
        self.catch_up(request.metadata()).await?;
        let mut stream = request.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| self.invalid("an empty DoPut stream: send the schema first"))?;
        let descriptor = first
            .flight_descriptor
            .clone()
            .ok_or_else(|| self.invalid("the first DoPut message needs a flight descriptor"))?;
        let write: protocol::WriteDescriptor = match descriptor.r#type() {
            DescriptorType::Cmd => protocol::parse("DoPut descriptor command", &descriptor.cmd)
                .map_err(|e| self.invalid(e.0))?,
            _ => {
                let (database, table) = self.table_path(&descriptor)?;
                protocol::WriteDescriptor {
                    database,
                    table,
                    ..Default::default()
                }
            }
        };
        // The table must exist before anything is read.
        self.node
            .describe_table(&write.database, &write.table)
            .map_err(|e| self.error(e))?;
        if write.writer_epoch.is_some() && write.writer_id.is_none() {
            return Err(self.invalid("writer_epoch without writer_id"));
        }
        let span = tracing::info_span!(
            "flight.do_put",
            database = %write.database,
            table = %write.table,
            writer = ?write.writer_id
        );
        let input: BoxStream<'static, Result<FlightData, FlightError>> =
            futures::stream::once(async { Ok(first) })
                .chain(stream.map_err(|s| FlightError::Tonic(Box::new(s))))
                .and_then(|data| async move {
                    crate::metrics::transferred("in", data.data_header.len() + data.data_body.len(), 0);
                    crate::encode::checked(data)
                })
                .boxed();
        let mut decoder = crate::encode::StreamDecoder::default();
        let decoder = input
            .try_filter_map(move |data| futures::future::ready(decoder.decode(data)))
            .boxed();
        let (tx, rx) = mpsc::channel(self.config.put_pipeline_depth.max(1));
        let work = self.clone().put(write, decoder, tx.clone());
        self.spawn_call(
            "do_put",
            started,
            span,
            tx,
            work,
            "the write failed inside the node (a bug); batches not answered may or may not be stored",
        );
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(self.respond(Box::pin(stream) as Self::DoPutStream))
    }
        .await;
        if let Err(status) = &result {
            crate::metrics::finished("do_put", status.code(), started);
        }
        result
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented(
            "DoExchange is not part of Mink's protocol",
        ))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let started = std::time::Instant::now();
        let result: Result<Response<Self::DoActionStream>, Status> = async {
            let span = tracing::info_span!("flight.do_action", action = %request.get_ref().r#type);
            async {
                self.catch_up(request.metadata()).await?;
                let body = self.action(request.get_ref()).await?;
                let result = arrow_flight::Result { body };
                Ok(self
                    .respond(Box::pin(futures::stream::once(async { Ok(result) }))
                        as Self::DoActionStream))
            }
            .instrument(span)
            .await
        }
        .await;
        crate::metrics::finished(
            "do_action",
            result.as_ref().err().map_or(tonic::Code::Ok, Status::code),
            started,
        );
        result
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let actions = action::ALL.iter().map(|(name, description)| {
            Ok(ActionType {
                r#type: (*name).to_string(),
                description: (*description).to_string(),
            })
        });
        Ok(self.respond(Box::pin(futures::stream::iter(actions)) as Self::ListActionsStream))
    }
}

/// Serves Flight on `listener` until `shutdown` resolves.
pub async fn serve(
    node: Node,
    config: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    // HTTP/2's default 64 KiB windows make a sender of large batches wait for a window update
    // many times per batch; on a busy node each one waits for the connection task.
    tonic::transport::Server::builder()
        .initial_stream_window_size(crate::STREAM_WINDOW)
        .initial_connection_window_size(crate::CONNECTION_WINDOW)
        .add_service(MinkFlight::new(node, config).into_server())
        .serve_with_incoming_shutdown(
            // Small requests (lookups, tails, actions) must not wait out a delayed ACK.
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
