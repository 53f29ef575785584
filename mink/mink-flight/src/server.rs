//! The Flight service on a node.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult,
};
use bytes::Bytes;
use futures::stream::{BoxStream, FuturesOrdered};
use futures::{Stream, StreamExt, TryStreamExt};
use mink_node::{Node, NodeError, TableInfo, TableSpec, WriteTarget};
use tokio::sync::mpsc;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use crate::encode::BatchEncoder;
use crate::protocol::{self, ErrorBody, ErrorCode, action};

/// Limits and timings of the Flight service.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Largest gRPC message accepted or sent (one Flight batch).
    pub max_message_bytes: usize,
    /// Longest wait for `mink-min-applied-index` before answering `UNAVAILABLE`.
    pub max_applied_wait: Duration,
    /// Batches of one `DoPut` stream in flight (submitted, not yet durable).
    pub put_pipeline_depth: usize,
    /// Stored bytes fetched per read step of a `DoGet`.
    pub read_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_message_bytes: 64 << 20,
            max_applied_wait: Duration::from_secs(10),
            put_pipeline_depth: 64,
            read_bytes: 4 << 20,
        }
    }
}

/// Mink's Arrow Flight service (see `docs/flight.md` for the protocol).
#[derive(Clone, Debug)]
pub struct MinkFlight {
    pub(crate) node: Node,
    pub(crate) config: Arc<ServerConfig>,
    /// Channels to other nodes, for reads forwarded to bucket leaders.
    pub(crate) peers: Arc<crate::forward::Peers>,
}

type FlightStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

impl MinkFlight {
    pub fn new(node: Node, config: ServerConfig) -> Self {
        MinkFlight {
            node,
            config: Arc::new(config),
            peers: Arc::default(),
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
            ErrorCode::NotLeader => tonic::Code::FailedPrecondition,
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
        if let (Some(node), Some(address)) = (body.leader_node_id, body.leader_address) {
            let m = status.metadata_mut();
            m.insert(protocol::LEADER_NODE_HEADER, MetadataValue::from(node));
            if let Ok(a) = address.parse() {
                m.insert(protocol::LEADER_ADDRESS_HEADER, a);
            }
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

    fn flight_info(&self, info: &TableInfo) -> Result<FlightInfo, Status> {
        let description = describe(info).map_err(|e| self.invalid(e.0))?;
        let primary = !info.primary_key.is_empty();
        let endpoints = info
            .buckets
            .iter()
            .map(|b| {
                // A log table's bucket up to its high watermark now; a primary-key table's
                // bucket as a snapshot of its current rows (its offsets number the changelog).
                let (offset, end_offset) = if primary {
                    (None, None)
                } else {
                    (Some(b.start_offset), Some(b.end_offset))
                };
                let ticket = protocol::Ticket {
                    database: info.database.clone(),
                    table: info.name.clone(),
                    partition: b.partition.clone(),
                    bucket: Some(b.bucket),
                    offset,
                    end_offset,
                    ..Default::default()
                };
                let mut e = FlightEndpoint::new()
                    .with_ticket(arrow_flight::Ticket::new(protocol::to_json(&ticket)));
                if !b.leader_address.is_empty() {
                    e = e.with_location(format!("grpc://{}", b.leader_address));
                }
                e
            })
            .collect();
        // Rows of a log table (one offset per row); unknown (-1) for a primary-key table,
        // whose offsets count changes, not rows.
        let records: i64 = if primary {
            -1
        } else {
            let rows: u64 = info
                .buckets
                .iter()
                .map(|b| b.end_offset - b.start_offset)
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

    async fn action(&self, action: &Action) -> Result<Bytes, Status> {
        let node = &self.node;
        let body = action.body.as_ref();
        let bad = |e: protocol::ProtocolError| self.invalid(e.0);
        let err = |e: NodeError| self.error(e);
        let empty = || protocol::to_json(&serde_json::json!({}));
        Ok(match action.r#type.as_str() {
            action::CREATE_DATABASE => {
                let a: protocol::CreateDatabase =
                    protocol::parse(action::CREATE_DATABASE, body).map_err(bad)?;
                node.create_database(&a.name, a.if_not_exists)
                    .await
                    .map_err(err)?;
                empty()
            }
            action::DROP_DATABASE => {
                let a: protocol::DropDatabase =
                    protocol::parse(action::DROP_DATABASE, body).map_err(bad)?;
                node.drop_database(&a.name, a.cascade, a.if_exists)
                    .await
                    .map_err(err)?;
                empty()
            }
            action::LIST_DATABASES => protocol::to_json(&protocol::Databases {
                databases: node.list_databases(),
            }),
            action::LIST_TABLES => {
                let a: protocol::ListTables =
                    protocol::parse(action::LIST_TABLES, body).map_err(bad)?;
                protocol::to_json(&protocol::Tables {
                    tables: node.list_tables(&a.database).map_err(err)?,
                })
            }
            action::CREATE_TABLE => {
                let a: protocol::CreateTable =
                    protocol::parse(action::CREATE_TABLE, body).map_err(bad)?;
                let schema = protocol::decode_schema(&a.schema).map_err(bad)?;
                let info = node
                    .create_table(TableSpec {
                        database: a.database,
                        name: a.table,
                        schema,
                        primary_key: a.primary_key,
                        options: a.options,
                        partition_keys: a.partition_keys,
                        comment: a.comment,
                        if_not_exists: a.if_not_exists,
                    })
                    .await
                    .map_err(err)?;
                protocol::to_json(&describe(&info).map_err(bad)?)
            }
            action::DROP_TABLE => {
                let a: protocol::DropTable =
                    protocol::parse(action::DROP_TABLE, body).map_err(bad)?;
                node.drop_table(&a.database, &a.table, a.if_exists)
                    .await
                    .map_err(err)?;
                empty()
            }
            action::ALTER_TABLE => {
                let a: protocol::AlterTable =
                    protocol::parse(action::ALTER_TABLE, body).map_err(bad)?;
                let schema = a
                    .schema
                    .as_deref()
                    .map(protocol::decode_schema)
                    .transpose()
                    .map_err(bad)?;
                let info = node
                    .alter_table(
                        &a.database,
                        &a.table,
                        mink_node::TableChange {
                            set_options: a.set_options,
                            reset_options: a.reset_options,
                            schema,
                        },
                    )
                    .await
                    .map_err(err)?;
                protocol::to_json(&describe(&info).map_err(bad)?)
            }
            action::DESCRIBE_TABLE => {
                let a: protocol::TableRef =
                    protocol::parse(action::DESCRIBE_TABLE, body).map_err(bad)?;
                let info = node.describe_table(&a.database, &a.table).map_err(err)?;
                protocol::to_json(&describe(&info).map_err(bad)?)
            }
            action::CREATE_PARTITION => {
                let a: protocol::PartitionRef =
                    protocol::parse(action::CREATE_PARTITION, body).map_err(bad)?;
                let p = node
                    .create_partition(&a.database, &a.table, &a.partition, a.if_not_exists)
                    .await
                    .map_err(err)?;
                protocol::to_json(&protocol::PartitionDescription {
                    partition_id: p.partition_id,
                    name: p.name,
                    values: p.values,
                    created_at_ms: p.created_at_ms,
                })
            }
            action::DROP_PARTITION => {
                let a: protocol::PartitionRef =
                    protocol::parse(action::DROP_PARTITION, body).map_err(bad)?;
                node.drop_partition(&a.database, &a.table, &a.partition, a.if_exists)
                    .await
                    .map_err(err)?;
                empty()
            }
            action::ALLOCATE_WRITER => {
                let w = node.allocate_writer().await.map_err(err)?;
                protocol::to_json(&protocol::Writer {
                    writer_id: w.writer_id,
                    writer_epoch: w.writer_epoch,
                })
            }
            action::DESCRIBE_CLUSTER => {
                let c = node.cluster_status().await.map_err(err)?;
                protocol::to_json(&protocol::ClusterDescription {
                    node_id: c.node_id,
                    applied_index: c.applied_index,
                    coordinator_node_id: c.coordinator.map(|(n, _)| n),
                    coordinator_epoch: c.coordinator.map(|(_, e)| e),
                    nodes: c
                        .nodes
                        .into_iter()
                        .map(|n| protocol::NodeDescription {
                            node_id: n.node_id,
                            node_epoch: n.node_epoch,
                            address: n.address,
                            live: n.live,
                            heartbeat_age_ms: n.heartbeat_age_ms,
                            buckets: n.buckets,
                            drained: n.drained,
                        })
                        .collect(),
                    buckets_without_live_leader: c.buckets_without_live_leader,
                })
            }
            action::REBALANCE => {
                let a: protocol::Rebalance =
                    protocol::parse(action::REBALANCE, body).map_err(bad)?;
                protocol::to_json(&protocol::Rebalanced {
                    moves: node.rebalance(a.dry_run).await.map_err(err)?,
                })
            }
            action::DRAIN_NODE => {
                let a: protocol::DrainNode =
                    protocol::parse(action::DRAIN_NODE, body).map_err(bad)?;
                node.drain(a.node_id, !a.undo).await.map_err(err)?;
                empty()
            }
            other => {
                return Err(
                    self.invalid(format!("unknown action {other:?}; ListActions lists them"))
                );
            }
        })
    }
}

/// The per-bucket error body of a node error.
pub(crate) fn error_body(e: &NodeError) -> ErrorBody {
    let (code, leader) = match e {
        NodeError::NotFound(_) => (ErrorCode::NotFound, None),
        NodeError::AlreadyExists(_) => (ErrorCode::AlreadyExists, None),
        NodeError::Invalid(_) => (ErrorCode::Invalid, None),
        NodeError::NotLeader {
            leader, address, ..
        } => (ErrorCode::NotLeader, Some((*leader, address.clone()))),
        NodeError::Unavailable(_) => (ErrorCode::Unavailable, None),
        _ => (ErrorCode::Failed, None),
    };
    ErrorBody {
        code,
        message: protocol::cap_message(e.to_string()),
        leader_node_id: leader.as_ref().map(|l| l.0),
        leader_address: leader.map(|l| l.1),
    }
}

/// A table as the protocol describes it.
pub(crate) fn describe(
    info: &TableInfo,
) -> Result<protocol::TableDescription, protocol::ProtocolError> {
    Ok(protocol::TableDescription {
        table_id: info.table_id,
        database: info.database.clone(),
        table: info.name.clone(),
        schema: protocol::encode_schema(&info.schema)?,
        columns: info
            .schema
            .fields()
            .iter()
            .map(|f| protocol::ColumnDescription {
                name: f.name().clone(),
                r#type: f.data_type().to_string(),
                nullable: f.is_nullable(),
            })
            .collect(),
        schema_version: info.schema_version,
        options: info.options.clone(),
        partition_keys: info.partition_keys.clone(),
        bucket_count: info.bucket_count,
        bucket_key: info.bucket_key.clone(),
        primary_key: info.primary_key.clone(),
        comment: info.comment.clone(),
        created_at_ms: info.created_at_ms,
        partitions: info
            .partitions
            .iter()
            .map(|p| protocol::PartitionDescription {
                partition_id: p.partition_id,
                name: p.name.clone(),
                values: p.values.clone(),
                created_at_ms: p.created_at_ms,
            })
            .collect(),
        buckets: info
            .buckets
            .iter()
            .map(|b| protocol::BucketDescription {
                partition: b.partition.clone(),
                partition_id: b.partition_id,
                bucket: b.bucket,
                stream_id: b.stream_id,
                leader_node_id: b.leader_node_id,
                leader_address: b.leader_address.clone(),
                leader_epoch: b.leader_epoch,
                start_offset: b.start_offset,
                end_offset: b.end_offset,
            })
            .collect(),
    })
}

/// One bucket to read in a `DoGet`.
struct ReadPlan {
    partition: Option<String>,
    bucket: u32,
    from: u64,
    /// Exclusive; `None` while tailing.
    to: Option<u64>,
}

impl MinkFlight {
    fn plan_read(
        &self,
        t: &protocol::Ticket,
        info: &TableInfo,
    ) -> Result<Vec<ReadPlan>, NodeError> {
        if let Some(p) = &t.partition
            && !info.partitions.iter().any(|x| &x.name == p)
        {
            return Err(NodeError::NotFound(format!(
                "partition {p:?} of {}.{} does not exist",
                t.database, t.table
            )));
        }
        let Some(bucket) = t.bucket else {
            if t.offset.is_some() || t.end_offset.is_some() || t.latest || t.tail {
                return Err(NodeError::Invalid(
                    "offset, end_offset, latest and tail apply to one bucket: name it".into(),
                ));
            }
            return Ok(info
                .buckets
                .iter()
                .filter(|b| t.partition.is_none() || b.partition == t.partition)
                .map(|b| ReadPlan {
                    partition: b.partition.clone(),
                    bucket: b.bucket,
                    from: b.start_offset,
                    to: Some(b.end_offset),
                })
                .collect());
        };
        let (start, end) =
            self.node
                .bucket_offsets(&t.database, &t.table, t.partition.as_deref(), bucket)?;
        let from = match (t.offset, t.latest) {
            (Some(_), true) => {
                return Err(NodeError::Invalid("give offset or latest, not both".into()));
            }
            (Some(o), false) => o,
            (None, true) => end,
            (None, false) => start,
        };
        if from < start {
            return Err(NodeError::Invalid(format!(
                "offset {from} is before the start of bucket {bucket} ({start}): retention removed it"
            )));
        }
        let to = match (t.tail, t.end_offset) {
            (true, Some(_)) => {
                return Err(NodeError::Invalid("a tail has no end_offset".into()));
            }
            (true, None) => None,
            (false, Some(e)) => Some(e.min(end)),
            (false, None) => Some(end),
        };
        Ok(vec![ReadPlan {
            partition: t.partition.clone(),
            bucket,
            from,
            to,
        }])
    }

    /// `schema` narrowed to the ticket's columns, in their order.
    fn projected(&self, schema: &SchemaRef, t: &protocol::Ticket) -> Result<SchemaRef, Status> {
        if t.columns.is_empty() {
            return Ok(Arc::clone(schema));
        }
        let indices = t
            .columns
            .iter()
            .map(|c| {
                schema.index_of(c).map_err(|_| {
                    self.invalid(format!("no column {c:?} in {}.{}", t.database, t.table))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(
            schema
                .project(&indices)
                .map_err(|e| self.invalid(e.to_string()))?,
        ))
    }

    /// `DoGet` of a primary-key table's current rows: a lookup, a prefix lookup, or a
    /// snapshot scan (per bucket, each consistent at one offset, on the bucket's leader).
    async fn kv_get(
        &self,
        t: protocol::Ticket,
        info: &TableInfo,
        started: std::time::Instant,
        span: tracing::Span,
        forwarded: bool,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        if t.offset.is_some() || t.latest || t.tail || t.end_offset.is_some() {
            return Err(self.invalid(
                "offset, latest, end_offset and tail read the changelog of a primary-key table: set changelog: true",
            ));
        }
        let schema = self.projected(&info.schema, &t)?;
        let keys = match (&t.lookup, &t.prefix_lookup) {
            (Some(_), Some(_)) => {
                return Err(self.invalid("give lookup or prefix_lookup, not both"));
            }
            (Some(rows), None) => Some((rows, false)),
            (None, Some(rows)) => Some((rows, true)),
            (None, None) => None,
        };
        if let Some((rows, prefix)) = keys {
            let found = self
                .lookup_rows(&t, info, rows, prefix, forwarded)
                .instrument(span)
                .await?;
            let found = mink_log::codec::project(&found, &t.columns)
                .map_err(|e| self.invalid(e.to_string()))?;
            let mut encoder = BatchEncoder::new();
            let mut messages = vec![Ok(encoder.schema(&schema, None))];
            if found.num_rows() > 0 {
                let data = encoder
                    .batch(&found, Bytes::new())
                    .map_err(|e| self.status(ErrorCode::Failed, e.to_string()))?;
                count_out(&data, found.num_rows());
                messages.extend(data.into_iter().map(Ok));
            }
            crate::metrics::finished("do_get", tonic::Code::Ok, started);
            let stream = futures::stream::iter(messages);
            return Ok(self.respond(Box::pin(stream) as <Self as FlightService>::DoGetStream));
        }
        if let Some(p) = &t.partition
            && !info.partitions.iter().any(|x| &x.name == p)
        {
            return Err(self.error(NodeError::NotFound(format!(
                "partition {p:?} of {}.{} does not exist",
                t.database, t.table
            ))));
        }
        let buckets: Vec<(Option<String>, u32)> = info
            .buckets
            .iter()
            .filter(|b| t.partition.is_none() || b.partition == t.partition)
            .filter(|b| t.bucket.is_none_or(|x| x == b.bucket))
            .map(|b| (b.partition.clone(), b.bucket))
            .collect();
        if let Some(b) = t.bucket
            && buckets.is_empty()
        {
            return Err(self.error(NodeError::NotFound(format!(
                "bucket {b} of {}.{} does not exist",
                t.database, t.table
            ))));
        }
        let (tx, rx) = mpsc::channel(8);
        let work =
            self.clone()
                .produce_snapshot(t, info.clone(), buckets, schema, tx.clone(), forwarded);
        self.spawn_call(
            "do_get",
            started,
            span,
            tx,
            work,
            "the scan failed inside the node (a bug)",
        );
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(self.respond(Box::pin(stream) as <Self as FlightService>::DoGetStream))
    }

    /// Produces a snapshot scan of the current rows of `buckets` into `tx`.
    async fn produce_snapshot(
        self,
        t: protocol::Ticket,
        info: TableInfo,
        buckets: Vec<(Option<String>, u32)>,
        schema: SchemaRef,
        tx: mpsc::Sender<Result<FlightData, Status>>,
        forwarded: bool,
    ) -> tonic::Code {
        let mut encoder = BatchEncoder::new();
        if tx.send(Ok(encoder.schema(&schema, None))).await.is_err() {
            return tonic::Code::Cancelled;
        }
        let mut rows_sent = 0u64;
        for (partition, bucket) in buckets {
            if t.max_rows.is_some_and(|m| rows_sent >= m) {
                return tonic::Code::Ok;
            }
            if let crate::forward::Place::Leader(address) =
                self.place(&info, partition.as_ref(), bucket, forwarded)
            {
                let ticket = protocol::Ticket {
                    database: t.database.clone(),
                    table: t.table.clone(),
                    partition: partition.clone(),
                    bucket: Some(bucket),
                    columns: t.columns.clone(),
                    max_rows: t.max_rows.map(|m| m - rows_sent),
                    ..Default::default()
                };
                match self.relay(&address, &ticket, &mut encoder, &tx).await {
                    Ok(rows) => rows_sent += rows,
                    Err(code) => return code,
                }
                continue;
            }
            let mut scan = match self
                .node
                .kv_scan(&t.database, &t.table, partition.as_deref(), bucket)
                .await
            {
                Ok(s) => s,
                Err(e) => return fail(&tx, self.error(e)).await,
            };
            loop {
                if t.max_rows.is_some_and(|m| rows_sent >= m) {
                    return tonic::Code::Ok;
                }
                let batch = match scan.next_batch(SNAPSHOT_PAGE_ROWS) {
                    Ok(Some(b)) => b,
                    Ok(None) => break,
                    Err(e) => return fail(&tx, self.error(e.into())).await,
                };
                let batch = match mink_log::codec::project(&batch, &t.columns) {
                    Ok(b) => b,
                    Err(e) => return fail(&tx, self.invalid(e.to_string())).await,
                };
                rows_sent += batch.num_rows() as u64;
                let meta = protocol::to_json(&protocol::ReadMetadata {
                    partition: partition.clone(),
                    bucket,
                    offset: scan.offset(),
                });
                let data = match encoder.batch(&batch, meta) {
                    Ok(d) => d,
                    Err(e) => {
                        return fail(&tx, self.status(ErrorCode::Failed, e.to_string())).await;
                    }
                };
                count_out(&data, batch.num_rows());
                for d in data {
                    if tx.send(Ok(d)).await.is_err() {
                        return tonic::Code::Cancelled;
                    }
                }
            }
        }
        tonic::Code::Ok
    }

    /// Produces the batches of a read into `tx`, stopping when the client goes away.
    async fn produce(
        self,
        t: protocol::Ticket,
        plans: Vec<ReadPlan>,
        schema: SchemaRef,
        wire_header: Option<Bytes>,
        tx: mpsc::Sender<Result<FlightData, Status>>,
    ) -> tonic::Code {
        let mut encoder = BatchEncoder::new();
        if tx.send(Ok(encoder.schema(&schema, None))).await.is_err() {
            return tonic::Code::Cancelled;
        }
        let idle = t.tail_idle_ms.map(Duration::from_millis);
        let mut rows_sent = 0u64;
        for plan in plans {
            let mut offset = plan.from;
            let mut idle_since = tokio::time::Instant::now();
            loop {
                if plan.to.is_some_and(|to| offset >= to)
                    || t.max_rows.is_some_and(|m| rows_sent >= m)
                {
                    break;
                }
                let batches = match self
                    .read_pieces(&t, &plan, offset, wire_header.as_ref())
                    .await
                {
                    Ok(b) => b,
                    Err(e) => {
                        return fail(&tx, self.error(e)).await;
                    }
                };
                if batches.is_empty() {
                    if plan.to.is_some() {
                        break;
                    }
                    // Tailing: wait for rows, a second at a time so a gone client is noticed.
                    if idle.is_some_and(|i| idle_since.elapsed() >= i) || tx.is_closed() {
                        break;
                    }
                    let step = idle.map_or(Duration::from_secs(1), |i| {
                        i.saturating_sub(idle_since.elapsed())
                            .min(Duration::from_secs(1))
                    });
                    if let Err(e) = self
                        .node
                        .wait_for_data(
                            &t.database,
                            &t.table,
                            plan.partition.as_deref(),
                            plan.bucket,
                            offset,
                            step,
                        )
                        .await
                    {
                        return fail(&tx, self.error(e)).await;
                    }
                    continue;
                }
                idle_since = tokio::time::Instant::now();
                for piece in batches {
                    let b = match piece {
                        Piece::Wire {
                            header,
                            body,
                            base,
                            end,
                        } => {
                            // A stored batch sent as it is stored.
                            offset = end;
                            let rows = end - base;
                            rows_sent += rows;
                            let data = FlightData {
                                data_header: header,
                                data_body: body,
                                app_metadata: protocol::to_json(&protocol::ReadMetadata {
                                    partition: plan.partition.clone(),
                                    bucket: plan.bucket,
                                    offset: base,
                                }),
                                ..Default::default()
                            };
                            count_out(
                                std::slice::from_ref(&data),
                                usize::try_from(rows).unwrap_or(usize::MAX),
                            );
                            if tx.send(Ok(data)).await.is_err() {
                                return tonic::Code::Cancelled;
                            }
                            if t.max_rows.is_some_and(|m| rows_sent >= m) {
                                break;
                            }
                            continue;
                        }
                        Piece::Decoded(b) => b,
                    };
                    let mut batch = b.batch;
                    offset = b.end_offset;
                    if let Some(to) = plan.to {
                        let keep =
                            usize::try_from(to.saturating_sub(b.base_offset)).unwrap_or(usize::MAX);
                        if keep < batch.num_rows() {
                            batch = batch.slice(0, keep);
                            offset = b.base_offset + keep as u64;
                        }
                    }
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    rows_sent += batch.num_rows() as u64;
                    let meta = protocol::to_json(&protocol::ReadMetadata {
                        partition: plan.partition.clone(),
                        bucket: plan.bucket,
                        offset: b.base_offset,
                    });
                    let data = match encoder.batch(&batch, meta) {
                        Ok(d) => d,
                        Err(e) => {
                            return fail(&tx, self.status(ErrorCode::Failed, e.to_string())).await;
                        }
                    };
                    count_out(&data, batch.num_rows());
                    for d in data {
                        if tx.send(Ok(d)).await.is_err() {
                            return tonic::Code::Cancelled;
                        }
                    }
                    if t.max_rows.is_some_and(|m| rows_sent >= m) {
                        break;
                    }
                }
            }
        }
        tonic::Code::Ok
    }

    /// One read step of a plan from `offset`: stored batches that can go out as stored (with a
    /// `wire_header`, the schema message they must carry), the others decoded.
    async fn read_pieces(
        &self,
        t: &protocol::Ticket,
        plan: &ReadPlan,
        offset: u64,
        wire_header: Option<&Bytes>,
    ) -> Result<Vec<Piece>, NodeError> {
        let Some(wire_header) = wire_header else {
            return Ok(self
                .node
                .read(
                    &t.database,
                    &t.table,
                    plan.partition.as_deref(),
                    plan.bucket,
                    offset,
                    self.config.read_bytes,
                    &t.columns,
                )
                .await?
                .into_iter()
                .map(Piece::Decoded)
                .collect());
        };
        let (tablet, stored) = self
            .node
            .read_stored(
                &t.database,
                &t.table,
                plan.partition.as_deref(),
                plan.bucket,
                offset,
                self.config.read_bytes,
            )
            .await?;
        let mut pieces = Vec::with_capacity(stored.len());
        for s in stored {
            let whole = s.base_offset >= offset && plan.to.is_none_or(|to| s.end_offset <= to);
            let wire = whole
                .then(|| mink_log::codec::wire_batch(&s.payload))
                .flatten()
                .filter(|w| mink_log::codec::same_schema_header(&w.schema_header, wire_header));
            match wire {
                Some(w) => pieces.push(Piece::Wire {
                    header: w.header,
                    body: w.body,
                    base: s.base_offset,
                    end: s.end_offset,
                }),
                None => {
                    if let Some(b) = tablet.decode_stored(&s, offset, &t.columns)? {
                        pieces.push(Piece::Decoded(b));
                    }
                }
            }
        }
        Ok(pieces)
    }

    /// Runs one `DoPut` stream: submits batches in order (pipelined up to the configured
    /// depth) and answers each once durable, in order.
    async fn put(
        self,
        descriptor: protocol::WriteDescriptor,
        mut input: FlightDataDecoder,
        tx: mpsc::Sender<Result<PutResult, Status>>,
    ) -> tonic::Code {
        let writer = descriptor.writer_id;
        let writer_epoch = descriptor.writer_epoch.unwrap_or(0);
        let mut in_flight = FuturesOrdered::new();
        let mut next = 0u64;
        let mut failure: Option<Status> = None;
        let mut input_done = false;
        loop {
            let can_read = !input_done
                && failure.is_none()
                && in_flight.len() < self.config.put_pipeline_depth;
            if !can_read && in_flight.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                Some((index, writes, arrived)) = in_flight.next(), if !in_flight.is_empty() => {
                    // Answered in order; rows of a routed write whose bucket another node
                    // leads are written there first, one batch after another, so the leader
                    // stores them in the order they came (one hop: the forwarded write names
                    // its bucket).
                    let (writes, arrived): (Vec<mink_node::BucketWrite>, std::time::Instant) =
                        (writes, arrived);
                    let mut buckets = Vec::new();
                    for w in writes {
                        buckets.push(match (&w.result, &w.unsent) {
                            (Err(NodeError::NotLeader { address, .. }), Some(rows))
                                if !address.is_empty() =>
                            {
                                self.forward_put(&descriptor.database, &descriptor.table, &w, rows, address)
                                    .await
                            }
                            _ => bucket_result(&w),
                        });
                    }
                    crate::metrics::metrics().ack.record(arrived.elapsed().as_secs_f64(), &[]);
                    let ack = PutResult {
                        app_metadata: protocol::to_json(&protocol::PutAck { batch: index, buckets }),
                    };
                    if tx.send(Ok(ack)).await.is_err() {
                        return tonic::Code::Cancelled;
                    }
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
                        DecodedPayload::Schema(_) | DecodedPayload::None => continue,
                    };
                    let index = next;
                    next += 1;
                    let arrived = std::time::Instant::now();
                    match self.submit(&descriptor, writer, writer_epoch, &batch, &app_metadata).await {
                        Ok(pending) => in_flight.push_back(async move {
                            (index, pending.await, arrived)
                        }),
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

    async fn submit(
        &self,
        d: &protocol::WriteDescriptor,
        writer: Option<u64>,
        writer_epoch: u64,
        batch: &RecordBatch,
        app_metadata: &Bytes,
    ) -> Result<mink_node::PendingWrite, Status> {
        let meta: protocol::BatchMetadata = if app_metadata.is_empty() {
            protocol::BatchMetadata::default()
        } else {
            protocol::parse("batch app_metadata", app_metadata).map_err(|e| self.invalid(e.0))?
        };
        let bucket = meta.bucket.or(d.bucket);
        let writer = match (writer, meta.sequence) {
            (Some(id), Some(seq)) => Some(s3stream_writer(id, writer_epoch, seq)),
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
        };
        let pending = self
            .node
            .submit_write(&d.database, &d.table, batch, &target)
            .await
            .map_err(|e| self.error(e))?;
        crate::metrics::metrics().rows.add(
            batch.num_rows() as u64,
            &[opentelemetry::KeyValue::new("direction", "in")],
        );
        Ok(pending)
    }
}

/// Ends a stream with an error; its code for the metrics.
/// Counts the bytes and rows of encoded messages going out.
fn count_out(data: &[FlightData], rows: usize) {
    let bytes = data
        .iter()
        .map(|d| d.data_header.len() + d.data_body.len())
        .sum();
    crate::metrics::transferred("out", bytes, rows);
}

/// A read step's batch: as stored (its IPC record batch message) or decoded.
enum Piece {
    Wire {
        header: Bytes,
        body: Bytes,
        base: u64,
        end: u64,
    },
    Decoded(mink_log::ReadBatch),
}

/// Rows per batch of a snapshot scan.
const SNAPSHOT_PAGE_ROWS: usize = 8192;

pub(crate) async fn fail<T>(tx: &mpsc::Sender<Result<T, Status>>, status: Status) -> tonic::Code {
    let code = status.code();
    let _ = tx.send(Err(status)).await;
    code
}

fn s3stream_writer(writer_id: u64, writer_epoch: u64, sequence: u64) -> mink_node::WriterBatchId {
    mink_node::WriterBatchId {
        writer_id,
        writer_epoch,
        first_sequence: sequence,
        last_sequence: sequence,
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
        let result: Result<Response<Self::DoGetStream>, Status> = async {
            self.catch_up(request.metadata()).await?;
            let ticket: protocol::Ticket = protocol::parse("ticket", &request.get_ref().ticket)
                .map_err(|e| self.invalid(e.0))?;
            let span = tracing::info_span!(
                "flight.do_get",
                database = %ticket.database,
                table = %ticket.table,
                bucket = ?ticket.bucket,
                tail = ticket.tail
            );
            let info = self
                .node
                .describe_table(&ticket.database, &ticket.table)
                .map_err(|e| self.error(e))?;
            let primary = !info.primary_key.is_empty();
            if !primary
                && (ticket.changelog || ticket.lookup.is_some() || ticket.prefix_lookup.is_some())
            {
                return Err(self.invalid(format!(
                    "{}.{} is a log table: changelog, lookup and prefix_lookup read primary-key tables",
                    ticket.database, ticket.table
                )));
            }
            if primary && !ticket.changelog {
                let forwarded = request
                    .metadata()
                    .get(protocol::FORWARDED_HEADER)
                    .is_some();
                return self
                    .kv_get(ticket, &info, started, span, forwarded)
                    .await;
            }
            let plans = self.plan_read(&ticket, &info).map_err(|e| self.error(e))?;
            let full = if primary {
                mink_kv::changelog::view_schema(&info.schema)
            } else {
                Arc::clone(&info.schema)
            };
            let schema = self.projected(&full, &ticket)?;
            let (tx, rx) = mpsc::channel(8);
            // Whole stored batches of a log table, unprojected, go out as stored when written
            // under the current schema.
            let wire_header = (!primary && ticket.columns.is_empty())
                .then(|| mink_log::codec::schema_header(&schema));
            let work = self
                .clone()
                .produce(ticket, plans, schema, wire_header, tx.clone());
            // Never let a cut-short read look like a complete one.
            self.spawn_call(
                "do_get",
                started,
                span,
                tx,
                work,
                "the read failed inside the node (a bug)",
            );
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
            Ok(self.respond(Box::pin(stream) as Self::DoGetStream))
        }
        .await;
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
        let decoder = FlightDataDecoder::new(input);
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
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await
}
