//! Arrow Flight benchmark: ingest (`DoPut`) and scan (`DoGet`) through a real node (SQLite
//! metadata, the durable local object store, default engine settings), each beside the same
//! client against a trivial Flight echo server in the same process and run: the loopback limit
//! of Flight itself.
//!
//! - DoPut: `streams` concurrent streams send pre-encoded batches (routed by a bucket key over
//!   `buckets` buckets) as fast as acknowledgements allow; the node acknowledges each batch once
//!   durable, the echo server as soon as it arrives. Beside them, the **engine** baseline: the
//!   same rows appended straight to the node's stream engine as the bytes the node stores for
//!   them (each batch split by bucket and encoded with the table's compression once, up
//!   front), with as many appends in flight as the DoPut streams allow, on the same node: what
//!   DoPut would reach if receiving, checking, routing and encoding cost nothing. The engine
//!   and both DoPut paths run in turn and then in reverse order (ABCCBA), half the time each.
//!   The **cpu bound** of client-routed DoPut: the engine's CPU per row (measured in its
//!   phases) plus one core's time per row to decode the client's messages alone (a node must
//!   decode a batch to check it), over the machine's cores, as a ratio to the engine's rate.
//! - DoGet: the table written above, read as one whole-table stream and as one stream per
//!   bucket; the echo server streams the same number of the same batches.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use futures::{Stream, StreamExt as _};
use mink_flight::encode::BatchEncoder;
use mink_node::{Node, NodeConfig, TableSpec};
use serde::Serialize;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Measured seconds per DoPut point.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrent DoPut streams to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4])]
    streams: Vec<usize>,
    #[arg(long, default_value_t = 8192)]
    rows_per_batch: usize,
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// The node's flush delay (the default is the product's).
    #[arg(long)]
    flush_delay_ms: Option<u64>,
    /// `table.log.arrow.compression.type` of the benchmark table: ZSTD (the default) or NONE.
    #[arg(long, default_value = "ZSTD")]
    compression: String,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Point {
    call: &'static str,
    streams: usize,
    mink_rows_per_s: f64,
    mink_mb_per_s: f64,
    echo_rows_per_s: f64,
    echo_mb_per_s: f64,
    ratio_to_echo: f64,
    /// DoPut: rows/s of the same rows appended straight to the stream engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    engine_rows_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_to_engine: Option<f64>,
    /// Client-routed DoPut: the most this machine's cores allow, as a ratio to the engine's
    /// rate: all of them spent on the engine's CPU per row plus the node decoding the batch
    /// alone (as a node must, to check it), nothing for receiving, checking or routing.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_bound: Option<f64>,
}

/// CPU seconds this process has used, user and system (`/proc/self/stat`, in clock ticks of
/// 1/100 s, as Linux counts them for user space).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Seconds of one core per row to decode `messages` (after `schema`) as a node's DoPut does,
/// and nothing else, measured for `seconds`.
fn decode_seconds_per_row(
    schema: &FlightData,
    messages: &[(FlightData, u64)],
    seconds: f64,
) -> anyhow::Result<f64> {
    let mut decoder = mink_flight::encode::StreamDecoder::default();
    decoder.decode(mink_flight::encode::checked(schema.clone())?)?;
    let started = Instant::now();
    let mut rows = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        for (message, n) in messages {
            let message = mink_flight::encode::checked(message.clone())?;
            decoder.decode(message)?.context("a decoded batch")?;
            rows += n;
        }
    }
    Ok(started.elapsed().as_secs_f64() / rows as f64)
}

/// The engine baseline: `streams` tasks, each appending `parts` (one stored payload per bucket,
/// with its row count) of one batch after another to `stream_ids`, with as many in flight
/// per task as a `DoPut` stream may have (`limits`: its count and bytes, here of the stored
/// payloads), for `seconds`. Returns (rows appended, elapsed).
async fn engine_load(
    engine: &s3stream::S3Stream,
    stream_ids: &[u64],
    parts: &[(u32, bytes::Bytes)],
    streams: usize,
    limits: (usize, usize),
    seconds: f64,
) -> anyhow::Result<(u64, Duration)> {
    let (depth, bytes_limit) = limits;
    let batch_bytes: usize = parts.iter().map(|(_, p)| p.len()).sum();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let rows_per_batch: u64 = parts.iter().map(|(n, _)| u64::from(*n)).sum();
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let engine = engine.clone();
        let ids = stream_ids.to_vec();
        let parts = parts.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut in_flight = futures::stream::FuturesOrdered::new();
            let mut batches = 0u64;
            while Instant::now() < deadline || !in_flight.is_empty() {
                if Instant::now() < deadline
                    && in_flight.len() * parts.len() < depth
                    && in_flight.len() * batch_bytes < bytes_limit
                {
                    let mut appends = Vec::with_capacity(parts.len());
                    for ((rows, payload), id) in parts.iter().zip(&ids) {
                        appends.push(engine.submit(*id, *rows, payload.clone(), None).await?);
                    }
                    in_flight.push_back(futures::future::try_join_all(appends));
                    continue;
                }
                if let Some(done) = in_flight.next().await {
                    done?;
                    batches += 1;
                }
            }
            Ok::<u64, anyhow::Error>(batches)
        }));
    }
    let mut batches = 0;
    for t in tasks {
        batches += t.await??;
    }
    Ok((batches * rows_per_batch, started.elapsed()))
}

type FlightStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The loopback limit: acknowledges every batch on arrival, streams pre-encoded batches back.
#[derive(Clone)]
struct Echo {
    /// Schema message, then one batch message.
    messages: Arc<(FlightData, FlightData)>,
}

#[tonic::async_trait]
impl FlightService for Echo {
    type HandshakeStream = FlightStream<HandshakeResponse>;
    type ListFlightsStream = FlightStream<FlightInfo>;
    type DoGetStream = FlightStream<FlightData>;
    type DoPutStream = FlightStream<PutResult>;
    type DoExchangeStream = FlightStream<FlightData>;
    type DoActionStream = FlightStream<arrow_flight::Result>;
    type ListActionsStream = FlightStream<ActionType>;

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("echo"))
    }
    async fn list_flights(
        &self,
        _: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented("echo"))
    }
    async fn get_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented("echo"))
    }
    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("echo"))
    }
    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented("echo"))
    }
    /// The ticket is the number of batches to send.
    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let n: usize = std::str::from_utf8(&request.get_ref().ticket)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Status::invalid_argument("ticket: a batch count"))?;
        let m = Arc::clone(&self.messages);
        let schema = futures::stream::once(futures::future::ready(Ok(m.0.clone())));
        let batches = futures::stream::iter((0..n).map(move |_| Ok(m.1.clone())));
        Ok(Response::new(Box::pin(schema.chain(batches))))
    }
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let acks = request.into_inner().filter_map(|m| async move {
            match m {
                Ok(d) if d.data_body.is_empty() => None,
                Ok(_) => Some(Ok(PutResult::default())),
                Err(e) => Some(Err(e)),
            }
        });
        Ok(Response::new(Box::pin(acks)))
    }
    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("echo"))
    }
    async fn do_action(
        &self,
        _: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        Err(Status::unimplemented("echo"))
    }
    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        Err(Status::unimplemented("echo"))
    }
}

fn batch(rows: usize) -> RecordBatch {
    let n = rows as i64;
    RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from_iter_values(
                (0..n).map(|i| (i * 7919) % 1_000_003),
            )) as ArrayRef,
        ),
        (
            "seq",
            Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
        ),
        (
            "event",
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| format!("page_view/{:08}/campaign-{}", i, i % 97)),
            )) as ArrayRef,
        ),
        (
            "score",
            Arc::new(Float64Array::from_iter_values(
                (0..n).map(|i| i as f64 * 0.5),
            )) as ArrayRef,
        ),
    ])
    .expect("batch")
}

async fn client(address: &str) -> anyhow::Result<FlightServiceClient<Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
        .tcp_nodelay(true)
        .initial_stream_window_size(mink_flight::STREAM_WINDOW)
        .initial_connection_window_size(mink_flight::CONNECTION_WINDOW)
        .connect()
        .await?;
    Ok(FlightServiceClient::new(channel)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20))
}

/// `streams` concurrent DoPut streams for `seconds`, each sending the `batches` (message, rows)
/// in turn after `schema`: (rows acknowledged, IPC bytes acknowledged, elapsed).
async fn put_load(
    address: &str,
    schema: &FlightData,
    batches: &[(FlightData, u64)],
    streams: usize,
    seconds: f64,
) -> anyhow::Result<(u64, u64, Duration)> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let mut flight = client(address).await?;
        let schema = schema.clone();
        let batches = Arc::new(batches.to_vec());
        tasks.push(tokio::spawn(async move {
            // Send until the deadline; gRPC flow control and the server's pipeline bound what
            // is in flight.
            let sent = Arc::clone(&batches);
            let input = futures::stream::once(futures::future::ready(schema)).chain(
                futures::stream::unfold(0usize, move |i| {
                    let data = sent[i % sent.len()].0.clone();
                    async move { (Instant::now() < deadline).then_some((data, i + 1)) }
                }),
            );
            let mut acks = flight.do_put(input).await?.into_inner();
            let (mut rows, mut bytes, mut i) = (0u64, 0u64, 0usize);
            while let Some(ack) = acks.message().await? {
                let _ = ack;
                let (data, n) = &batches[i % batches.len()];
                rows += n;
                bytes += (data.data_header.len() + data.data_body.len()) as u64;
                i += 1;
            }
            Ok::<(u64, u64), anyhow::Error>((rows, bytes))
        }));
    }
    let (mut rows, mut bytes) = (0, 0);
    for t in tasks {
        let (r, b) = t.await??;
        rows += r;
        bytes += b;
    }
    Ok((rows, bytes, started.elapsed()))
}

/// Reads `tickets` concurrently: (rows, IPC bytes, elapsed).
async fn get_load(address: &str, tickets: Vec<Vec<u8>>) -> anyhow::Result<(u64, u64, Duration)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in tickets {
        let mut flight = client(address).await?;
        tasks.push(tokio::spawn(async move {
            let mut stream = flight.do_get(Ticket::new(t)).await?.into_inner();
            let (mut bytes, mut messages) = (0u64, 0u64);
            while let Some(d) = stream.message().await? {
                if !d.data_body.is_empty() {
                    messages += 1;
                }
                bytes += (d.data_header.len() + d.data_body.len()) as u64;
            }
            Ok::<(u64, u64), anyhow::Error>((bytes, messages))
        }));
    }
    let (mut bytes, mut messages) = (0, 0);
    for t in tasks {
        let (b, m) = t.await??;
        bytes += b;
        messages += m;
    }
    Ok((messages, bytes, started.elapsed()))
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // The node, as `mink dev` runs it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let mink_address = listener.local_addr()?.to_string();
    let mut config = NodeConfig::new(
        1,
        &format!("sqlite://{}", dir.path().join("metadata.db").display()),
        dir.path()
            .join("objects")
            .to_str()
            .context("utf-8 temp dir")?,
    );
    config.advertised_address = mink_address.clone();
    if let Some(ms) = args.flush_delay_ms {
        config.engine.flush_delay = Duration::from_millis(ms);
    }
    let node = Node::start(config).await?;
    tokio::spawn(mink_flight::serve(
        node.clone(),
        mink_flight::ServerConfig::default(),
        listener,
        std::future::pending(),
    ));
    // The echo server.
    let sample = batch(args.rows_per_batch);
    let mut encoder = BatchEncoder::new();
    let descriptor = FlightDescriptor::new_path(vec!["bench".into(), "events".into()]);
    let schema_message = encoder.schema(&sample.schema(), Some(descriptor));
    let mut batch_messages = encoder.batch(&sample, bytes::Bytes::new())?;
    anyhow::ensure!(
        batch_messages.len() == 1,
        "no dictionaries in the benchmark batch"
    );
    let messages = (schema_message, batch_messages.remove(0));
    let echo_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let echo_address = echo_listener.local_addr()?.to_string();
    let echo = Echo {
        messages: Arc::new(messages.clone()),
    };
    tokio::spawn(
        // The same HTTP/2 windows as the node's listener: the same transport, no storage.
        tonic::transport::Server::builder()
            .initial_stream_window_size(mink_flight::STREAM_WINDOW)
            .initial_connection_window_size(mink_flight::CONNECTION_WINDOW)
            .add_service(
                arrow_flight::flight_service_server::FlightServiceServer::new(echo)
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20),
            )
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(echo_listener).with_nodelay(Some(true)),
            ),
    );

    node.create_database("bench", false).await?;
    node.create_table(TableSpec {
        primary_key: vec![],
        database: "bench".into(),
        name: "events".into(),
        schema: sample.schema().as_ref().clone(),
        options: [
            ("bucket.num".to_string(), args.buckets.to_string()),
            ("bucket.key".to_string(), "user_id".to_string()),
            (
                "table.log.arrow.compression.type".to_string(),
                args.compression.clone(),
            ),
        ]
        .into(),
        partition_keys: vec![],
        comment: String::new(),
        if_not_exists: false,
    })
    .await?;

    // The engine baseline's streams and payloads: the benchmark batch split as the node
    // routes it, each part encoded as the log tablet stores it.
    let engine = node.streams().clone();
    let parts: Vec<(u32, bytes::Bytes)> =
        mink_log::routing::split_by_bucket(&sample, &[0], args.buckets)?
            .into_iter()
            .map(|(_, part)| {
                let compression = if args.compression.eq_ignore_ascii_case("none") {
                    mink_log::codec::Compression::None
                } else {
                    mink_log::codec::Compression::Zstd
                };
                Ok((
                    u32::try_from(part.num_rows())?,
                    mink_log::codec::encode_batch(&part, compression)?,
                ))
            })
            .collect::<anyhow::Result<_>>()?;
    let first = engine.create_streams(u32::try_from(parts.len())?).await?;
    let baseline_ids: Vec<u64> = (first..first + parts.len() as u64).collect();
    for id in &baseline_ids {
        engine.open(*id, 1).await?;
    }
    let server = mink_flight::ServerConfig::default();
    let limits = (server.put_pipeline_depth, server.put_pipeline_bytes);
    let whole = vec![(messages.1.clone(), args.rows_per_batch as u64)];
    // What mink-client sends for the same rows: one message per bucket, compressed as stored.
    let routed = {
        let zstd = !args.compression.eq_ignore_ascii_case("none");
        let mut encoder = if zstd {
            BatchEncoder::zstd()
        } else {
            BatchEncoder::new()
        };
        let schema = encoder.schema(
            &sample.schema(),
            Some(FlightDescriptor::new_path(vec![
                "bench".into(),
                "events".into(),
            ])),
        );
        let mut parts = Vec::new();
        for (bucket, part) in mink_log::routing::split_by_bucket(&sample, &[0], args.buckets)? {
            let meta = serde_json::to_vec(&serde_json::json!({ "bucket": bucket }))?;
            let mut m = encoder.batch(&part, meta.into())?;
            anyhow::ensure!(m.len() == 1, "no dictionaries in the benchmark batch");
            parts.push((m.remove(0), part.num_rows() as u64));
        }
        (schema, parts)
    };

    let decoding = decode_seconds_per_row(&routed.0, &routed.1, 1.0)?;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
    let mut points = Vec::new();
    let mb = |bytes: u64, d: Duration| bytes as f64 / 1e6 / d.as_secs_f64();
    let per_s = |n: u64, d: Duration| n as f64 / d.as_secs_f64();
    for &streams in &args.streams {
        // Warm both up, then measure, echo first.
        put_load(&echo_address, &messages.0, &whole, streams, 0.5).await?;
        let (er, eb, ed) =
            put_load(&echo_address, &messages.0, &whole, streams, args.seconds).await?;
        // The engine and the two DoPut paths in turn, then again in the reverse order, each
        // for half the time: what drifts over a point (the disk's writeback of what the
        // earlier phases wrote, the machine's other load) then falls on each alike. In one
        // order the engine, measured last, ranged 6.8-15.6M rows/s between runs.
        let half = args.seconds / 2.0;
        let (mut mr, mut mbytes, mut md) = (0, 0, Duration::ZERO);
        let (mut cr, mut cbytes, mut cd) = (0, 0, Duration::ZERO);
        let (mut engine_rows, mut engine_d, mut engine_cpu) = (0, Duration::ZERO, 0.0);
        for phase in ["engine", "mink", "routed", "routed", "mink", "engine"] {
            match phase {
                "engine" => {
                    let cpu = cpu_seconds().context("/proc/self/stat")?;
                    let (r, d) =
                        engine_load(&engine, &baseline_ids, &parts, streams, limits, half).await?;
                    engine_cpu += cpu_seconds().context("/proc/self/stat")? - cpu;
                    engine_rows += r;
                    engine_d += d;
                }
                "mink" => {
                    let (r, b, d) =
                        put_load(&mink_address, &messages.0, &whole, streams, half).await?;
                    (mr, mbytes, md) = (mr + r, mbytes + b, md + d);
                }
                _ => {
                    // The rows routed and compressed by the client (as mink-client sends
                    // them): each bucket's part in the table's compression, naming its bucket.
                    let (r, b, d) =
                        put_load(&mink_address, &routed.0, &routed.1, streams, half).await?;
                    (cr, cbytes, cd) = (cr + r, cbytes + b, cd + d);
                }
            }
        }
        let engine_per_row = engine_cpu / engine_rows as f64;
        let bound = cores / (engine_per_row + decoding) / per_s(engine_rows, engine_d);
        points.push(Point {
            call: "DoPut (client-routed)",
            streams,
            mink_rows_per_s: per_s(cr, cd),
            mink_mb_per_s: mb(cbytes, cd),
            echo_rows_per_s: per_s(er, ed),
            echo_mb_per_s: mb(eb, ed),
            ratio_to_echo: per_s(cr, cd) / per_s(er, ed),
            engine_rows_per_s: Some(per_s(engine_rows, engine_d)),
            ratio_to_engine: Some(per_s(cr, cd) / per_s(engine_rows, engine_d)),
            cpu_bound: Some(bound),
        });
        points.push(Point {
            call: "DoPut",
            streams,
            mink_rows_per_s: per_s(mr, md),
            mink_mb_per_s: mb(mbytes, md),
            echo_rows_per_s: per_s(er, ed),
            echo_mb_per_s: mb(eb, ed),
            ratio_to_echo: mb(mbytes, md) / mb(eb, ed),
            engine_rows_per_s: Some(per_s(engine_rows, engine_d)),
            ratio_to_engine: Some(per_s(mr, md) / per_s(engine_rows, engine_d)),
            cpu_bound: None,
        });
    }

    // Scan what was written: one whole-table stream, and one stream per bucket.
    let info = node.describe_table("bench", "events")?;
    let total_rows: u64 = info
        .buckets
        .iter()
        .map(|b| b.end_offset - b.start_offset)
        .sum();
    let echo_batches = usize::try_from(total_rows / args.rows_per_batch as u64)
        .unwrap_or(usize::MAX)
        .max(1);
    let whole = serde_json::to_vec(&serde_json::json!({"database": "bench", "table": "events"}))?;
    let per_bucket: Vec<Vec<u8>> = info
        .buckets
        .iter()
        .map(|b| {
            serde_json::to_vec(
                &serde_json::json!({"database": "bench", "table": "events", "bucket": b.bucket}),
            )
        })
        .collect::<Result<_, _>>()?;
    let n = per_bucket.len();
    for (streams, tickets, echo_tickets) in [
        (1, vec![whole], vec![echo_batches.to_string().into_bytes()]),
        (
            n,
            per_bucket,
            vec![(echo_batches / n).max(1).to_string().into_bytes(); n],
        ),
    ] {
        let (_, mbytes, md) = get_load(&mink_address, tickets).await?;
        let (_, ebytes, ed) = get_load(&echo_address, echo_tickets).await?;
        let rows_per_byte = args.rows_per_batch as f64
            / (messages.1.data_header.len() + messages.1.data_body.len()) as f64;
        points.push(Point {
            call: "DoGet",
            streams,
            mink_rows_per_s: total_rows as f64 / md.as_secs_f64(),
            mink_mb_per_s: mb(mbytes, md),
            echo_rows_per_s: ebytes as f64 * rows_per_byte / ed.as_secs_f64(),
            echo_mb_per_s: mb(ebytes, ed),
            // Rows: a node may send stored batches compressed, the echo sends them plain.
            ratio_to_echo: (total_rows as f64 / md.as_secs_f64())
                / (ebytes as f64 * rows_per_byte / ed.as_secs_f64()),
            engine_rows_per_s: None,
            ratio_to_engine: None,
            cpu_bound: None,
        });
    }
    node.shutdown().await;
    print(&points, args.json, total_rows, &sample, &args.compression)
}

#[allow(clippy::print_stdout)]
fn print(
    points: &[Point],
    json: bool,
    rows: u64,
    sample: &RecordBatch,
    compression: &str,
) -> anyhow::Result<()> {
    if json {
        for p in points {
            println!("{}", serde_json::to_string(p)?);
        }
        return Ok(());
    }
    println!(
        "Arrow Flight through a node (SQLite metadata, durable local object store) beside a Flight echo server, same client, same run; {} rows written, {} rows x {} columns per batch, stored with compression {}",
        rows,
        sample.num_rows(),
        sample.num_columns(),
        compression
    );
    println!(
        "{:<22} {:>7} {:>14} {:>10} {:>14} {:>10} {:>8} {:>14} {:>8} {:>10}",
        "call",
        "streams",
        "mink rows/s",
        "mink MB/s",
        "echo rows/s",
        "echo MB/s",
        "/echo",
        "engine rows/s",
        "/engine",
        "cpu bound"
    );
    for p in points {
        println!(
            "{:<22} {:>7} {:>14.0} {:>10.1} {:>14.0} {:>10.1} {:>8.2} {:>14} {:>8} {:>10}",
            p.call,
            p.streams,
            p.mink_rows_per_s,
            p.mink_mb_per_s,
            p.echo_rows_per_s,
            p.echo_mb_per_s,
            p.ratio_to_echo,
            p.engine_rows_per_s
                .map_or_else(|| "-".to_string(), |r| format!("{r:.0}")),
            p.ratio_to_engine
                .map_or_else(|| "-".to_string(), |r| format!("{r:.2}")),
            p.cpu_bound
                .map_or_else(|| "-".to_string(), |r| format!("{r:.2}")),
        );
    }
    Ok(())
}
