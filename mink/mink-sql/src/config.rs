use std::time::Duration;

/// How a sink runs. Defaults are the production values; tests shorten the intervals.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// This node's id (positive, unique in the cluster).
    pub node_id: u64,
    /// Where peers and clients reach this node (its Flight listener); recorded by
    /// `RegisterNode`.
    pub address: String,
    /// Where clients reach each listener, by protocol (`flight`, `kafka`, `flight-sql`);
    /// recorded by `RegisterNode` once the cluster is at metadata_version 3.
    pub listeners: std::collections::BTreeMap<String, String>,
    /// Highest `metadata_version` this node accepts. Defaults to what the binary supports;
    /// lowering it makes the node behave as an older binary would.
    pub supported_metadata_version: u32,
    /// Most commands group-committed into one row.
    pub max_commands_per_row: usize,
    /// Most encoded bytes in one row. A single command above it is refused.
    pub max_row_bytes: usize,
    /// How often the tailer polls for rows appended by other nodes.
    pub tail_poll_interval: Duration,
    /// Rows fetched per tail query.
    pub read_batch: u32,
    /// Bytes fetched per tail query (at least one row is always fetched).
    pub read_max_bytes: u64,
    /// The lease holder snapshots the state every this many applied rows.
    pub snapshot_interval: u64,
    /// Lease and heartbeat TTL; both are renewed every `lease_ttl / 4`.
    pub lease_ttl: Duration,
    /// Whether this node competes for the lease (and so runs snapshots and the coordinator).
    pub lease_enabled: bool,
    /// Longest wait between retries of a failing store call.
    pub max_backoff: Duration,
    /// Capacity of the proposal queue; proposers wait when it is full.
    pub queue_capacity: usize,
    /// Stamps rows (`proposed_at_ms`, the time apply rules see).
    pub clock: std::sync::Arc<dyn mink_metadata::Clock>,
    /// Run on the caught-up state before the node registers; an `Err` fails the start with
    /// it, and the cluster never lists the node.
    pub before_register: Option<BeforeRegister>,
}

/// A check of the metadata a starting node caught up with, before it registers (a node
/// with another cluster's object store must not join this one, even as a node that is down).
#[derive(Clone)]
pub struct BeforeRegister(pub std::sync::Arc<BeforeRegisterFn>);

/// What [`BeforeRegister`] runs: the state caught up with, to why the start is refused.
pub type BeforeRegisterFn = dyn Fn(
        std::sync::Arc<mink_metadata::State>,
    ) -> futures::future::BoxFuture<'static, Result<(), Refusal>>
    + Send
    + Sync;

/// Why a [`BeforeRegister`] check refused a start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub message: String,
    /// Whether starting again may succeed unchanged (a store that could not be reached),
    /// rather than only with other settings.
    pub retriable: bool,
}

impl std::fmt::Debug for BeforeRegister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeRegister")
    }
}

impl SinkConfig {
    pub fn new(node_id: u64) -> Self {
        SinkConfig {
            node_id,
            address: String::new(),
            listeners: std::collections::BTreeMap::new(),
            supported_metadata_version: mink_metadata::METADATA_VERSION,
            max_commands_per_row: 256,
            max_row_bytes: 4 << 20,
            tail_poll_interval: Duration::from_millis(20),
            read_batch: 512,
            read_max_bytes: 16 << 20,
            snapshot_interval: 1024,
            lease_ttl: Duration::from_secs(30),
            lease_enabled: true,
            max_backoff: Duration::from_secs(1),
            queue_capacity: 16_384,
            clock: mink_metadata::system_clock(),
            before_register: None,
        }
    }

    pub(crate) fn heartbeat_interval(&self) -> Duration {
        self.lease_ttl / 4
    }

    pub(crate) fn lease_ttl_ms(&self) -> i64 {
        i64::try_from(self.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }
}
