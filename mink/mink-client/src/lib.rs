//! The Rust client for Mink, over Arrow Flight.
//!
//! - Admin: databases, tables, partitions, cluster ([`Client::create_table`], ...).
//! - Writes: [`Client::writer`] returns a [`TableWriter`] that routes rows to buckets on the
//!   client (the same function as the server, `mink_log::routing`), sends each bucket's rows to
//!   its leader, and is idempotent by default: a writer id and per-bucket sequence numbers make
//!   a retry after any failure store each row exactly once.
//! - Reads: [`Client::scan`] reads a table, a partition or a bucket from an offset, with
//!   projection, and tails it.
//! - Redirects are followed, and the client remembers the highest metadata index any node has
//!   answered with and asks every node to have caught up with it (read-your-writes).

mod writer;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightDescriptor};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
pub use mink_flight::protocol::{
    self, BucketDescription, BucketResult, ClusterDescription, ErrorBody, ErrorCode, Filter, Op,
    PartitionDescription, Predicate, TableDescription, Ticket,
};
use protocol::action;
use serde_json::json;
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint};

pub use writer::{TableWriter, WriteSummary};

/// Errors of client calls.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server refused: `code` says who can act.
    #[error("{message}")]
    Server {
        code: ErrorCode,
        message: String,
        /// For `NOT_LEADER`: the leader's node id and address.
        leader: Option<(u64, String)>,
    },
    /// The connection failed or broke.
    #[error("cannot reach {address}: {message}")]
    Transport { address: String, message: String },
    /// Wrong input found before anything was sent.
    #[error("{0}")]
    Invalid(String),
    /// The server answered something this client does not understand.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A write's retry deadline passed while the client waited for `awaited` from the node at
    /// `address`: a node whose metadata database is down takes requests and never answers.
    #[error(
        "no {awaited} within {} s: the node at {address} did not answer (is its metadata database reachable?)",
        waited.as_secs_f64()
    )]
    Timeout {
        awaited: &'static str,
        address: String,
        waited: Duration,
    },
}

impl ClientError {
    /// The code of a server error (`None` for transport and client-side errors).
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether retrying (after a short wait, or at the leader) may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Server { code, .. } => code.is_retriable(),
            // The outcome is unknown, as after a dropped connection.
            ClientError::Transport { .. } | ClientError::Timeout { .. } => true,
            _ => false,
        }
    }
}

pub type ClientResult<T> = Result<T, ClientError>;

/// How a client behaves.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Largest gRPC message sent or accepted.
    pub max_message_bytes: usize,
    /// How long a write may take, its retries and the waits for answers included, before it
    /// fails.
    pub retry_deadline: Duration,
    pub connect_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_message_bytes: 64 << 20,
            retry_deadline: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Rows read from a bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadBatch {
    pub partition: Option<String>,
    pub bucket: u32,
    /// Offset of the first row.
    pub offset: u64,
    pub batch: RecordBatch,
}

/// What to read: a builder over the protocol's [`Ticket`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan(pub Ticket);

impl Scan {
    /// Every bucket of the table, from its start to its high watermark now.
    pub fn table(database: &str, table: &str) -> Self {
        Scan(Ticket {
            database: database.to_string(),
            table: table.to_string(),
            ..Default::default()
        })
    }

    pub fn partition(mut self, partition: &str) -> Self {
        self.0.partition = Some(partition.to_string());
        self
    }

    /// Primary-key tables: read the changelog (`_change_type`, `_log_offset`,
    /// `_commit_timestamp`, then the columns) instead of the current rows; offsets and tailing
    /// then apply as to a log table.
    pub fn changelog(mut self) -> Self {
        self.0.changelog = true;
        self
    }

    /// Tables tiered into the lake: `union` (the default), `lake` or `log` (see
    /// `protocol::Ticket::source`).
    pub fn source(mut self, source: &str) -> Self {
        self.0.source = Some(source.to_string());
        self
    }

    pub fn bucket(mut self, bucket: u32) -> Self {
        self.0.bucket = Some(bucket);
        self
    }

    /// With a bucket: start here.
    pub fn offset(mut self, offset: u64) -> Self {
        self.0.offset = Some(offset);
        self
    }

    /// With a bucket: start at the high watermark (new rows only).
    pub fn latest(mut self) -> Self {
        self.0.latest = true;
        self
    }

    pub fn end_offset(mut self, end: u64) -> Self {
        self.0.end_offset = Some(end);
        self
    }

    pub fn columns<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.0.columns = columns.into_iter().map(Into::into).collect();
        self
    }

    /// With a bucket: keep reading new rows; end after `idle` without any (never if `None`).
    pub fn tail(mut self, idle: Option<Duration>) -> Self {
        self.0.tail = true;
        self.0.tail_idle_ms = idle.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self
    }

    pub fn max_rows(mut self, rows: u64) -> Self {
        self.0.max_rows = Some(rows);
        self
    }

    /// Only rows that meet `predicate` too (see `protocol::Ticket::filter`). Batches then hold
    /// the rows that met it: a batch's `offset` is where its rows start, not each row's.
    pub fn filter(mut self, predicate: Predicate) -> Self {
        self.0.filter.0.push(predicate);
        self
    }
}

struct Inner {
    /// The node this client talks to, and the others it may go on at. Shared by forks.
    home: Arc<Home>,
    config: ClientConfig,
    /// Shared by forks ([`Client::fork`]).
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// Highest `mink-applied-index` seen from any node.
    applied: AtomicU64,
}

/// Where a client's requests go: the node it talks to now (the one it was pointed at, until
/// that one cannot be reached) and the Flight addresses of the cluster's nodes
/// ([`Client::learn_peers`]).
#[derive(Default)]
struct Home {
    current: std::sync::RwLock<String>,
    peers: std::sync::RwLock<Vec<String>>,
}

/// A connection to a Mink cluster through one node (and, for writes, to bucket leaders).
/// Cheap to clone; clones share connections and the read-your-writes position.
///
/// Reads (scans, lookups, catalog and cluster descriptions) that cannot reach the node go on
/// at another node of the cluster, which becomes the one this client and its forks talk to
/// from then on; any node serves them. Writes and admin actions are not sent again elsewhere
/// (their outcome may be unknown), but the next ones go to the new node.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("address", &self.address())
            .field("applied_index", &self.applied_index())
            .finish()
    }
}

/// How long [`Client::connect`]'s background [`Client::learn_peers`] may take.
const PEERS_LIMIT: Duration = Duration::from_secs(10);

/// The node the command-line tools reach when `--server` and `MINK_SERVER` are unset, or set
/// empty (as shells and env files leave it).
pub const DEFAULT_SERVER: &str = "127.0.0.1:7171";

/// Checks a node's address as the command-line tools take it: `host:port`, optionally after
/// `grpc://`, `grpc+tcp://` or `http://`. A host alone is refused (the client would fail later,
/// on a connection to port 80), and so is TLS (a node serves plain gRPC).
pub fn check_address(text: &str) -> Result<(), String> {
    if ["https://", "grpc+tls://"]
        .iter()
        .any(|tls| text.trim().starts_with(tls))
    {
        return Err(format!(
            "a node serves plain gRPC, not TLS: give HOST:PORT or grpc://HOST:PORT (got {text:?})"
        ));
    }
    let address = normalize(text);
    let port = address
        .rsplit_once(':')
        .filter(|(host, _)| !host.is_empty() && !address.contains("://"))
        .and_then(|(_, port)| port.parse::<u64>().ok());
    match port {
        Some(1..=65535) => Ok(()),
        Some(port) => Err(format!(
            "port {port} is out of range: a port is 1 to 65535 (got {text:?})"
        )),
        None => Err(format!(
            "expected HOST:PORT, such as 127.0.0.1:7171 or grpc://node1:7171 (got {text:?})"
        )),
    }
}

/// Whether `a` is `host:port` (a non-empty host, a port that is a number).
pub fn is_host_port(a: &str) -> bool {
    a.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// `grpc://host:port`, `http://host:port` or `host:port` → `host:port`.
pub fn normalize(address: &str) -> String {
    let a = address.trim();
    for scheme in ["grpc+tcp://", "grpc://", "http://"] {
        if let Some(rest) = a.strip_prefix(scheme) {
            return rest.trim_end_matches('/').to_string();
        }
    }
    a.trim_end_matches('/').to_string()
}

/// The host of `address` (in any form [`normalize`] takes): what comes before its port.
pub fn host(address: &str) -> String {
    let address = normalize(address);
    match address.rsplit_once(':') {
        Some((host, _)) => host.to_string(),
        None => address,
    }
}

/// What to do about a node not reached at `address`, for a client's error: start one with
/// `mink dev` when the address is this machine's, otherwise point at a live one.
pub fn unreached_hint(address: &str) -> &'static str {
    if is_loopback(address) {
        "Start one with `mink dev`, or point at one with --server (MINK_SERVER)"
    } else {
        "Point at a live one with --server (MINK_SERVER)"
    }
}

/// Whether `address` (in any form [`normalize`] takes) names this machine.
fn is_loopback(address: &str) -> bool {
    let host = host(address);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Client {
    /// Connects to a node (`host:port` or `grpc://host:port`).
    pub async fn connect(address: &str) -> ClientResult<Client> {
        Self::connect_with(address, ClientConfig::default()).await
    }

    pub async fn connect_with(address: &str, config: ClientConfig) -> ClientResult<Client> {
        let address = normalize(address);
        let client = Client {
            inner: Arc::new(Inner {
                home: Arc::new(Home {
                    current: std::sync::RwLock::new(address.clone()),
                    peers: std::sync::RwLock::default(),
                }),
                config,
                channels: Arc::default(),
                applied: AtomicU64::new(0),
            }),
        };
        client.channel(&address).await?;
        // Learned in the background, so that a node whose metadata database is slow to answer
        // does not hold up the connect.
        let learner = client.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(PEERS_LIMIT, learner.learn_peers()).await;
        });
        Ok(client)
    }

    /// Asks the node for the cluster's nodes and keeps their Flight addresses: where reads
    /// go on when the node cannot be reached. [`Client::connect`] starts this in the
    /// background; call it to know it is done.
    pub async fn learn_peers(&self) -> ClientResult<()> {
        let cluster = self.describe_cluster().await?;
        let peers = cluster
            .nodes
            .into_iter()
            .map(|n| normalize(&n.address))
            .filter(|a| !a.is_empty())
            .collect();
        *self.inner.home.peers.write().expect("peers") = peers;
        Ok(())
    }

    /// The Flight addresses of the cluster's nodes, as last learned ([`Client::learn_peers`]).
    pub fn peers(&self) -> Vec<String> {
        self.inner.home.peers.read().expect("peers").clone()
    }

    /// Runs `call` at the node this client talks to and, when that cannot be reached
    /// ([`ClientError::Transport`]), at each other node of the cluster in turn. The first node
    /// that answers becomes the one this client talks to. Only for calls any node may answer
    /// and that change nothing.
    async fn at_any_node<T, F, Fut>(&self, call: F) -> ClientResult<T>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = ClientResult<T>>,
    {
        let first = self.address();
        let mut last = match call(first.clone()).await {
            Err(e @ ClientError::Transport { .. }) => e,
            answered => return answered,
        };
        for peer in self.peers().into_iter().filter(|p| *p != first) {
            match call(peer.clone()).await {
                Err(e @ ClientError::Transport { .. }) => last = e,
                answered => {
                    let mut current = self.inner.home.current.write().expect("current");
                    if *current == first {
                        tracing::warn!(
                            "the node at {first} cannot be reached ({last}): going on at {peer}"
                        );
                        *current = peer;
                    }
                    return answered;
                }
            }
        }
        Err(last)
    }

    /// A client on this one's connections with a read-your-writes position of its own,
    /// starting at this one's: what one request (a SQL statement) raises with
    /// [`Client::observe_index`] holds only for it.
    pub fn fork(&self) -> Client {
        Client {
            inner: Arc::new(Inner {
                home: Arc::clone(&self.inner.home),
                config: self.inner.config.clone(),
                channels: Arc::clone(&self.inner.channels),
                applied: AtomicU64::new(self.applied_index()),
            }),
        }
    }

    /// The node this client talks to for everything but writes.
    pub fn address(&self) -> String {
        self.inner.home.current.read().expect("current").clone()
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The highest metadata index any node has answered with.
    pub fn applied_index(&self) -> u64 {
        self.inner.applied.load(Ordering::Relaxed)
    }

    pub(crate) async fn channel(
        &self,
        address: &str,
    ) -> ClientResult<FlightServiceClient<Channel>> {
        let address = normalize(address);
        let cached = self
            .inner
            .channels
            .lock()
            .expect("channels")
            .get(&address)
            .cloned();
        let channel = match cached {
            Some(c) => c,
            None => {
                let transport = |e: &dyn std::fmt::Display| ClientError::Transport {
                    address: address.clone(),
                    message: e.to_string(),
                };
                let channel = Endpoint::from_shared(format!("http://{address}"))
                    .map_err(|e| transport(&e))?
                    .connect_timeout(self.inner.config.connect_timeout)
                    .tcp_nodelay(true)
                    .initial_stream_window_size(mink_flight::STREAM_WINDOW)
                    .initial_connection_window_size(mink_flight::CONNECTION_WINDOW)
                    .connect()
                    .await
                    .map_err(|e| transport(&source_chain(&e)))?;
                self.inner
                    .channels
                    .lock()
                    .expect("channels")
                    .insert(address.clone(), channel.clone());
                channel
            }
        };
        let max = self.inner.config.max_message_bytes;
        Ok(FlightServiceClient::new(channel)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max))
    }

    /// A request carrying `mink-min-applied-index`.
    pub(crate) fn request<T>(&self, body: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(body);
        let index = self.applied_index();
        if index > 0 {
            request
                .metadata_mut()
                .insert(protocol::MIN_APPLIED_INDEX_HEADER, index.into());
        }
        request
    }

    /// Remembers a metadata index (one a node reported, or one a caller of this client must
    /// see): every later request waits for a node to have applied it (read-your-writes).
    pub fn observe_index(&self, index: u64) {
        self.inner.applied.fetch_max(index, Ordering::Relaxed);
    }

    /// Remembers the `mink-applied-index` of a response.
    pub(crate) fn observe(&self, metadata: &MetadataMap) {
        if let Some(index) = metadata
            .get(protocol::APPLIED_INDEX_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            self.inner.applied.fetch_max(index, Ordering::Relaxed);
        }
    }

    pub(crate) fn status_error(&self, address: &str, status: &tonic::Status) -> ClientError {
        self.observe(status.metadata());
        let header = |name: &str| {
            status
                .metadata()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let code = header(protocol::ERROR_CODE_HEADER).and_then(|c| ErrorCode::parse(&c));
        let code = match (code, status.code()) {
            (Some(c), _) => c,
            // Not from Mink's service (it names every error it sends): the connection or the
            // transport failed, for example a stream reset by a node shutting down ("h2
            // protocol error", INTERNAL). The outcome is unknown; retrying is safe for an
            // idempotent writer.
            (
                None,
                tonic::Code::Unavailable
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
                | tonic::Code::Internal
                | tonic::Code::Aborted,
            ) => {
                return ClientError::Transport {
                    address: address.to_string(),
                    message: status.message().to_string(),
                };
            }
            (None, tonic::Code::NotFound) => ErrorCode::NotFound,
            (None, tonic::Code::AlreadyExists) => ErrorCode::AlreadyExists,
            (None, tonic::Code::InvalidArgument | tonic::Code::OutOfRange) => ErrorCode::Invalid,
            (None, tonic::Code::ResourceExhausted) => ErrorCode::TooLarge,
            (None, tonic::Code::DeadlineExceeded) => ErrorCode::Unavailable,
            (None, _) => ErrorCode::Failed,
        };
        let leader = header(protocol::LEADER_NODE_HEADER)
            .and_then(|n| n.parse().ok())
            .zip(header(protocol::LEADER_ADDRESS_HEADER));
        ClientError::Server {
            code,
            message: status.message().to_string(),
            leader,
        }
    }

    /// Runs an admin action on the connected node.
    async fn action<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        body: &impl serde::Serialize,
    ) -> ClientResult<T> {
        self.action_at(&self.address(), kind, body).await
    }

    /// [`Client::action`] for an action that changes nothing: at another node when the
    /// connected one cannot be reached.
    async fn read_action<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        body: &impl serde::Serialize,
    ) -> ClientResult<T> {
        self.at_any_node(|address| async move { self.action_at(&address, kind, body).await })
            .await
    }

    /// An action at the node at `address`.
    async fn action_at<T: serde::de::DeserializeOwned>(
        &self,
        address: &str,
        kind: &str,
        body: &impl serde::Serialize,
    ) -> ClientResult<T> {
        let address = address.to_string();
        let mut flight = self.channel(&address).await?;
        let request = self.request(Action::new(kind, protocol::to_json(body)));
        // Bounded as writes are: a node whose metadata database is down takes the action
        // and answers once the database is back, however long that is.
        let waited = self.inner.config.retry_deadline;
        let answered = tokio::time::timeout(waited, async {
            let response = flight
                .do_action(request)
                .await
                .map_err(|s| self.status_error(&address, &s))?;
            self.observe(response.metadata());
            let mut results = response.into_inner();
            results
                .message()
                .await
                .map_err(|s| self.status_error(&address, &s))?
                .ok_or_else(|| ClientError::Protocol(format!("{kind} returned no result")))
        })
        .await
        .map_err(|_| ClientError::Timeout {
            awaited: "answer (a change asked for may still be made)",
            address: address.clone(),
            waited,
        })??;
        protocol::parse(kind, &answered.body).map_err(|e| ClientError::Protocol(e.0))
    }

    /// Tells the node at `address` (the one tiering `database.table`: the leader of its first
    /// bucket) that a query's scan read `rows` rows of the table's log tail, so that it tiers
    /// the table sooner.
    pub async fn report_tail_scan_at(
        &self,
        address: &str,
        database: &str,
        table: &str,
        rows: u64,
    ) -> ClientResult<()> {
        let _: serde_json::Value = self
            .action_at(
                address,
                action::REPORT_TAIL_SCAN,
                &protocol::TailScan {
                    database: database.to_string(),
                    table: table.to_string(),
                    rows,
                },
            )
            .await?;
        Ok(())
    }

    pub async fn create_database(&self, name: &str, if_not_exists: bool) -> ClientResult<()> {
        let _: serde_json::Value = self
            .action(
                action::CREATE_DATABASE,
                &protocol::CreateDatabase {
                    name: name.to_string(),
                    if_not_exists,
                },
            )
            .await?;
        Ok(())
    }

    pub async fn drop_database(
        &self,
        name: &str,
        cascade: bool,
        if_exists: bool,
    ) -> ClientResult<()> {
        let _: serde_json::Value = self
            .action(
                action::DROP_DATABASE,
                &protocol::DropDatabase {
                    name: name.to_string(),
                    cascade,
                    if_exists,
                },
            )
            .await?;
        Ok(())
    }

    /// Whether the connected node serves: one action answered from its view of the metadata,
    /// at that node only (no other node answers for it, and its metadata database is not
    /// read, so a node keeps serving reads through an outage of it). Returns the metadata
    /// index the node has applied. For readiness probes.
    pub async fn ping(&self) -> ClientResult<u64> {
        let _: protocol::Databases = self.action(action::LIST_DATABASES, &json!({})).await?;
        Ok(self.applied_index())
    }

    pub async fn list_databases(&self) -> ClientResult<Vec<String>> {
        let d: protocol::Databases = self.read_action(action::LIST_DATABASES, &json!({})).await?;
        Ok(d.databases)
    }

    pub async fn list_tables(&self, database: &str) -> ClientResult<Vec<String>> {
        let t: protocol::Tables = self
            .read_action(
                action::LIST_TABLES,
                &protocol::ListTables {
                    database: database.to_string(),
                },
            )
            .await?;
        Ok(t.tables)
    }

    /// Creates a log table. `options` use Fluss's names (`bucket.num`, `bucket.key`,
    /// `table.log.ttl`, ...).
    pub async fn create_table(
        &self,
        database: &str,
        table: &str,
        schema: &Schema,
        options: impl IntoIterator<Item = (impl Into<String>, impl Into<String>)>,
        partition_keys: &[&str],
        if_not_exists: bool,
    ) -> ClientResult<TableDescription> {
        let schema = protocol::encode_schema(schema).map_err(|e| ClientError::Invalid(e.0))?;
        self.action(
            action::CREATE_TABLE,
            &protocol::CreateTable {
                database: database.to_string(),
                table: table.to_string(),
                schema,
                options: options
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect(),
                partition_keys: partition_keys.iter().map(|s| (*s).to_string()).collect(),
                primary_key: Vec::new(),
                comment: String::new(),
                if_not_exists,
            },
        )
        .await
    }

    /// Creates a table from a full request (comment, if-not-exists, schema already encoded).
    pub async fn create_table_with(
        &self,
        request: &protocol::CreateTable,
    ) -> ClientResult<TableDescription> {
        self.action(action::CREATE_TABLE, request).await
    }

    pub async fn drop_table(
        &self,
        database: &str,
        table: &str,
        if_exists: bool,
    ) -> ClientResult<()> {
        let _: serde_json::Value = self
            .action(
                action::DROP_TABLE,
                &protocol::DropTable {
                    database: database.to_string(),
                    table: table.to_string(),
                    if_exists,
                },
            )
            .await?;
        Ok(())
    }

    pub async fn alter_table(
        &self,
        change: &protocol::AlterTable,
    ) -> ClientResult<TableDescription> {
        self.action(action::ALTER_TABLE, change).await
    }

    pub async fn describe_table(
        &self,
        database: &str,
        table: &str,
    ) -> ClientResult<TableDescription> {
        self.read_action(
            action::DESCRIBE_TABLE,
            &protocol::TableRef {
                database: database.to_string(),
                table: table.to_string(),
            },
        )
        .await
    }

    pub async fn create_partition(
        &self,
        database: &str,
        table: &str,
        partition: &str,
        if_not_exists: bool,
    ) -> ClientResult<PartitionDescription> {
        self.action(
            action::CREATE_PARTITION,
            &protocol::PartitionRef {
                database: database.to_string(),
                table: table.to_string(),
                partition: partition.to_string(),
                if_not_exists,
                if_exists: false,
            },
        )
        .await
    }

    pub async fn drop_partition(
        &self,
        database: &str,
        table: &str,
        partition: &str,
        if_exists: bool,
    ) -> ClientResult<()> {
        let _: serde_json::Value = self
            .action(
                action::DROP_PARTITION,
                &protocol::PartitionRef {
                    database: database.to_string(),
                    table: table.to_string(),
                    partition: partition.to_string(),
                    if_not_exists: false,
                    if_exists,
                },
            )
            .await?;
        Ok(())
    }

    /// Waits, at most `limit`, until the node has applied a metadata change past every index
    /// this client has seen (`mink-min-applied-index` one past it): for waiting until cluster
    /// state (leaders, offsets, lake snapshots) moves, without polling on a timer. `Ok(false)`
    /// when nothing changed in time or the node could not be reached.
    pub async fn wait_for_change(&self, limit: Duration) -> ClientResult<bool> {
        let address = self.address();
        let Ok(mut flight) = self.channel(&address).await else {
            return Ok(false);
        };
        let mut request = tonic::Request::new(Action::new(
            action::DESCRIBE_CLUSTER,
            protocol::to_json(&json!({})),
        ));
        request.metadata_mut().insert(
            protocol::MIN_APPLIED_INDEX_HEADER,
            (self.applied_index() + 1).into(),
        );
        request.set_timeout(limit);
        match flight.do_action(request).await {
            Ok(response) => {
                self.observe(response.metadata());
                Ok(true)
            }
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                ) =>
            {
                Ok(false)
            }
            Err(s) => Err(self.status_error(&address, &s)),
        }
    }

    pub async fn describe_cluster(&self) -> ClientResult<ClusterDescription> {
        self.read_action(action::DESCRIBE_CLUSTER, &json!({})).await
    }

    /// Evens out the buckets per node (`dry_run`: only the moves it would make); returns the
    /// moves, one line each.
    pub async fn rebalance(&self, dry_run: bool) -> ClientResult<Vec<String>> {
        let r: protocol::Rebalanced = self
            .action(action::REBALANCE, &protocol::Rebalance { dry_run })
            .await?;
        Ok(r.moves)
    }

    /// Drains a node (its buckets move to the others) or, with `undo`, gives it buckets again.
    pub async fn drain_node(&self, node_id: u64, undo: bool) -> ClientResult<()> {
        let _: serde_json::Value = self
            .action(action::DRAIN_NODE, &protocol::DrainNode { node_id, undo })
            .await?;
        Ok(())
    }

    /// A new idempotent writer id (epoch 0), from the cluster.
    pub async fn allocate_writer(&self) -> ClientResult<protocol::Writer> {
        self.action(action::ALLOCATE_WRITER, &json!({})).await
    }

    /// Where writer `writer_id`'s committed batches end in each bucket of `database.table`
    /// (buckets it never wrote to are left out): what [`TableWriter::following`] resumes from.
    pub async fn writer_positions(
        &self,
        database: &str,
        table: &str,
        writer_id: u64,
    ) -> ClientResult<Vec<protocol::WriterPosition>> {
        let p: protocol::WriterPositions = self
            .read_action(
                action::WRITER_POSITIONS,
                &protocol::WriterPositionsRequest {
                    database: database.to_string(),
                    table: table.to_string(),
                    writer_id,
                },
            )
            .await?;
        Ok(p.buckets)
    }

    /// The table's schema (`GetSchema`).
    pub async fn schema(&self, database: &str, table: &str) -> ClientResult<Schema> {
        self.describe_table(database, table)
            .await?
            .arrow_schema()
            .map_err(|e| ClientError::Protocol(e.0))
    }

    /// An idempotent writer for a table (see [`TableWriter`]).
    pub fn writer(&self, database: &str, table: &str) -> TableWriter {
        TableWriter::new(self.clone(), database, table, true)
    }

    /// A writer without a writer id: a retry after an unknown outcome may store rows twice,
    /// so it retries only what was certainly not stored.
    pub fn plain_writer(&self, database: &str, table: &str) -> TableWriter {
        TableWriter::new(self.clone(), database, table, false)
    }

    /// Reads rows (`DoGet`) from the connected node: a stream of batches with their bucket and
    /// offsets, ending at the high watermark (or never, when tailing).
    ///
    /// The current rows of a primary-key table live with each bucket's leader; the connected
    /// node asks the leaders of the buckets it does not lead.
    pub async fn scan(
        &self,
        scan: &Scan,
    ) -> ClientResult<BoxStream<'static, ClientResult<ReadBatch>>> {
        self.at_any_node(|address| async move { self.scan_at(&address, &scan.0).await })
            .await
    }

    /// [`Client::scan`] of one bucket's log at `leader`, the node that leads it: its log
    /// cache holds the recent appends, so a tail is read there without object-store GETs.
    /// Any node serves a log read, so when `leader` cannot be reached (or is `None`), the
    /// connected node reads it instead.
    pub async fn scan_at_leader(
        &self,
        scan: &Scan,
        leader: Option<&str>,
    ) -> ClientResult<BoxStream<'static, ClientResult<ReadBatch>>> {
        if let Some(leader) = leader.filter(|l| normalize(l) != self.address()) {
            match self.scan_at(leader, &scan.0).await {
                Err(ClientError::Transport { address, message }) => {
                    tracing::debug!(%address, %message, "leader unreachable: reading at the connected node");
                }
                other => return other,
            }
        }
        self.scan(scan).await
    }

    /// A `DoGet` of `ticket` at `address`.
    async fn scan_at(
        &self,
        address: &str,
        ticket: &Ticket,
    ) -> ClientResult<BoxStream<'static, ClientResult<ReadBatch>>> {
        let address = address.to_string();
        let mut flight = self.channel(&address).await?;
        let ticket = arrow_flight::Ticket::new(protocol::to_json(ticket));
        let response = flight
            .do_get(self.request(ticket))
            .await
            .map_err(|s| self.status_error(&address, &s))?;
        self.observe(response.metadata());
        let this = self.clone();
        let decoder = FlightDataDecoder::new(
            response
                .into_inner()
                .map_err(|s| FlightError::Tonic(Box::new(s)))
                .and_then(|data| async move { mink_flight::encode::checked(data) }),
        );
        let stream = decoder
            .map(move |item| {
                let decoded = item.map_err(|e| match e {
                    FlightError::Tonic(s) => this.status_error(&address, &s),
                    other => ClientError::Protocol(other.to_string()),
                })?;
                let DecodedPayload::RecordBatch(batch) = decoded.payload else {
                    return Ok(None);
                };
                let meta: protocol::ReadMetadata =
                    protocol::parse("batch app_metadata", &decoded.inner.app_metadata)
                        .map_err(|e| ClientError::Protocol(e.0))?;
                Ok(Some(ReadBatch {
                    partition: meta.partition,
                    bucket: meta.bucket,
                    offset: meta.offset,
                    batch,
                }))
            })
            .filter_map(|r| async move { r.transpose() })
            .boxed();
        Ok(stream)
    }

    /// Primary-key tables: the rows of `keys` (JSON objects holding every primary-key column),
    /// in the order of the keys; missing keys are left out (the connected node asks the
    /// leaders of buckets it does not lead).
    pub async fn lookup(
        &self,
        database: &str,
        table: &str,
        keys: Vec<serde_json::Map<String, serde_json::Value>>,
        columns: &[String],
    ) -> ClientResult<RecordBatch> {
        self.get_rows(Ticket {
            database: database.to_string(),
            table: table.to_string(),
            lookup: Some(keys),
            columns: columns.to_vec(),
            ..Default::default()
        })
        .await
    }

    /// Primary-key tables: every row under each bucket-key value of `prefixes` (JSON objects
    /// with the bucket-key columns, and the partition columns of a partitioned table), prefix
    /// by prefix in key order.
    pub async fn prefix_lookup(
        &self,
        database: &str,
        table: &str,
        prefixes: Vec<serde_json::Map<String, serde_json::Value>>,
        columns: &[String],
    ) -> ClientResult<RecordBatch> {
        self.get_rows(Ticket {
            database: database.to_string(),
            table: table.to_string(),
            prefix_lookup: Some(prefixes),
            columns: columns.to_vec(),
            ..Default::default()
        })
        .await
    }

    /// A `DoGet` whose batches carry no read metadata (lookups), as one batch.
    async fn get_rows(&self, ticket: Ticket) -> ClientResult<RecordBatch> {
        self.at_any_node(|address| {
            let ticket = &ticket;
            async move { self.get_rows_at(address, ticket).await }
        })
        .await
    }

    async fn get_rows_at(&self, address: String, ticket: &Ticket) -> ClientResult<RecordBatch> {
        let mut flight = self.channel(&address).await?;
        let response = flight
            .do_get(self.request(arrow_flight::Ticket::new(protocol::to_json(ticket))))
            .await
            .map_err(|s| self.status_error(&address, &s))?;
        self.observe(response.metadata());
        let mut decoder = FlightDataDecoder::new(
            response
                .into_inner()
                .map_err(|s| FlightError::Tonic(Box::new(s)))
                .and_then(|data| async move { mink_flight::encode::checked(data) }),
        );
        let mut schema = None;
        let mut batches = Vec::new();
        while let Some(item) = decoder.next().await {
            let decoded = item.map_err(|e| match e {
                FlightError::Tonic(s) => self.status_error(&address, &s),
                other => ClientError::Protocol(other.to_string()),
            })?;
            match decoded.payload {
                DecodedPayload::Schema(s) => schema = Some(s),
                DecodedPayload::RecordBatch(b) => batches.push(b),
                DecodedPayload::None => {}
            }
        }
        let schema =
            schema.ok_or_else(|| ClientError::Protocol("no schema in the answer".into()))?;
        arrow::compute::concat_batches(&schema, &batches)
            .map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// [`Client::scan`], collected.
    pub async fn scan_all(&self, scan: &Scan) -> ClientResult<Vec<ReadBatch>> {
        self.scan(scan).await?.try_collect().await
    }

    /// The `FlightDescriptor` of a table, for plain Flight calls.
    pub fn descriptor(database: &str, table: &str) -> FlightDescriptor {
        FlightDescriptor::new_path(vec![database.to_string(), table.to_string()])
    }
}

/// The error and its causes on one line (tonic's transport errors hide the useful part).
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut last = out.clone();
    let mut source = e.source();
    while let Some(s) = source {
        // Some errors repeat their source's text, or wrap one that says the same
        // ("tcp connect error: tcp connect error: ..."): each text once.
        let text = s.to_string();
        if text != last && !last.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        last = text;
        source = s.source();
    }
    out
}

#[cfg(test)]
mod source_chain_tests {
    /// An error whose source says what it says.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn each_text_of_an_error_chain_is_said_once() {
        let e = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error",
                Some(Box::new(Layer(
                    "tcp connect error",
                    Some(Box::new(Layer("Connection refused (os error 111)", None))),
                ))),
            ))),
        );
        assert_eq!(
            super::source_chain(&e),
            "transport error: tcp connect error: Connection refused (os error 111)"
        );
    }
}

#[cfg(test)]
mod address_tests {
    #[test]
    fn loopback_addresses_are_told_apart_in_every_form() {
        for local in [
            "127.0.0.1:7171",
            "grpc://localhost:7171/",
            "http://[::1]:1",
            "127.0.0.2:1",
        ] {
            assert!(super::is_loopback(local), "{local}");
        }
        for remote in ["node1:7171", "grpc://10.0.0.7:7171", "[::2]:1"] {
            assert!(!super::is_loopback(remote), "{remote}");
        }
    }
}
