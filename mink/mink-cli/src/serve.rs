//! `mink node` and `mink dev`: configuration (flags, `MINK_*` variables, a TOML file) and the
//! running node with its Flight and metrics listeners.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use mink_flight::ServerConfig;
use mink_node::{Node, NodeConfig, NodeError};
use mink_sql::redact_url;
use serde::Deserialize;

use crate::telemetry;

/// How long a stopping node waits for its clients' streams to end before it drops them.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Settings of a node. Every flag is also a `MINK_*` variable and a key of the TOML file given
/// by `--config` (flags win over variables, variables over the file).
#[derive(Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct NodeArgs {
    /// This node's id: unique in the cluster, stable across restarts.
    #[arg(long, env = "MINK_NODE_ID")]
    pub(crate) node_id: Option<u64>,
    /// Metadata database: `postgres://user@host/db`, or `sqlite://<path>` for one node.
    #[arg(long, env = "MINK_METADATA")]
    pub(crate) metadata: Option<String>,
    /// Object store: `s3://bucket/prefix?endpoint=...&region=...`, `file:///path` or a path.
    #[arg(long, env = "MINK_OBJECT_STORE")]
    pub(crate) object_store: Option<String>,
    /// Arrow Flight listen address.
    #[arg(long, env = "MINK_LISTEN")]
    pub(crate) listen: Option<String>,
    /// The address other nodes and clients reach this node's Flight service at (defaults to
    /// the listen address).
    #[arg(long, env = "MINK_ADVERTISED_ADDRESS")]
    pub(crate) advertised_address: Option<String>,
    /// Prometheus `/metrics` listen address (`none` to disable).
    #[arg(long, env = "MINK_METRICS_LISTEN")]
    pub(crate) metrics_listen: Option<String>,
    /// Flight SQL listen address (`none` to disable): SQL over the cluster from this
    /// process, as `mink-query serve` gives it. `mink dev` serves it on 127.0.0.1:7272.
    #[arg(long, env = "MINK_SQL_LISTEN")]
    pub(crate) sql_listen: Option<String>,
    /// Kafka protocol listen address (`none` to disable): Kafka clients produce to and fetch
    /// from the cluster's log tables here. `mink dev` serves it on 127.0.0.1:9092.
    #[arg(long, env = "MINK_KAFKA_LISTEN")]
    pub(crate) kafka_listen: Option<String>,
    /// The address Kafka clients reach this node's Kafka listener at, which Metadata answers
    /// (Kafka's advertised.listeners; defaults to the listen address, with the advertised
    /// Flight host for a wildcard one).
    #[arg(long, env = "MINK_KAFKA_ADVERTISED_ADDRESS")]
    pub(crate) kafka_advertised_address: Option<String>,
    /// Create a topic a Kafka client names (in a Metadata request) when it does not exist,
    /// with this many partitions (Kafka's auto.create.topics.enable); 0 is off. Off when unset
    /// under `mink node`; 1 under `mink dev`, as a Kafka broker's defaults.
    #[arg(long, env = "MINK_KAFKA_AUTO_CREATE_PARTITIONS")]
    pub(crate) kafka_auto_create_partitions: Option<u32>,
    /// OTLP/gRPC endpoint for traces and metrics (`http://collector:4317`).
    #[arg(long, env = "MINK_OTLP_ENDPOINT")]
    pub(crate) otlp_endpoint: Option<String>,
    /// Longest an append waits to share an object with others (the WAL flush delay).
    #[arg(long, env = "MINK_FLUSH_DELAY_MS")]
    pub(crate) flush_delay_ms: Option<u64>,
    /// Compaction's pace: its object reads and writes together move at most this many MiB
    /// per second, and 8 (or this, if lower) while the node's writes run faster than half of it
    /// (0: unpaced). Default 64.
    #[arg(long, env = "MINK_COMPACTION_MIB_PER_SEC")]
    pub(crate) compaction_mib_per_sec: Option<u64>,
    /// Object GETs of the read path in flight at once (at least 1); more wait their turn.
    /// Default 64; a store serving requests on a few cores (moto, a one-node MinIO) reads
    /// fastest with about 8.
    #[arg(long, env = "MINK_MAX_READS_IN_FLIGHT", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_reads_in_flight: Option<u32>,
    /// Lease and heartbeat time-to-live: how long a crashed node holds its role.
    #[arg(long, env = "MINK_LEASE_TTL_MS")]
    pub(crate) lease_ttl_ms: Option<u64>,
    /// Largest Flight message (one batch) accepted.
    #[arg(long, env = "MINK_MAX_MESSAGE_BYTES")]
    pub(crate) max_message_bytes: Option<usize>,
    /// Directory of the local working copies of primary-key buckets (a cache: rebuilt from
    /// object storage when lost).
    #[arg(long, env = "MINK_KV_DIR")]
    pub(crate) kv_dir: Option<std::path::PathBuf>,
    /// Seconds between KV snapshots of the primary-key buckets a node leads.
    #[arg(long, env = "MINK_KV_SNAPSHOT_INTERVAL_S")]
    pub(crate) kv_snapshot_interval_s: Option<u64>,
    /// Start although the object store holds objects past every id the metadata allocated,
    /// deleting them: once, after restoring the metadata database from a backup, when the
    /// newer one is gone for good. A flag only (no variable, no file key): it is not kept.
    #[arg(long)]
    #[serde(skip)]
    pub(crate) claim_object_store: bool,
}

impl NodeArgs {
    /// Flags and variables over the file's values.
    fn over(self, file: NodeArgs) -> NodeArgs {
        NodeArgs {
            node_id: self.node_id.or(file.node_id),
            claim_object_store: self.claim_object_store,
            metadata: self.metadata.or(file.metadata),
            object_store: self.object_store.or(file.object_store),
            listen: self.listen.or(file.listen),
            advertised_address: self.advertised_address.or(file.advertised_address),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            sql_listen: self.sql_listen.or(file.sql_listen),
            kafka_listen: self.kafka_listen.or(file.kafka_listen),
            kafka_advertised_address: self
                .kafka_advertised_address
                .or(file.kafka_advertised_address),
            kafka_auto_create_partitions: self
                .kafka_auto_create_partitions
                .or(file.kafka_auto_create_partitions),
            otlp_endpoint: self.otlp_endpoint.or(file.otlp_endpoint),
            flush_delay_ms: self.flush_delay_ms.or(file.flush_delay_ms),
            compaction_mib_per_sec: self.compaction_mib_per_sec.or(file.compaction_mib_per_sec),
            max_reads_in_flight: self.max_reads_in_flight.or(file.max_reads_in_flight),
            lease_ttl_ms: self.lease_ttl_ms.or(file.lease_ttl_ms),
            max_message_bytes: self.max_message_bytes.or(file.max_message_bytes),
            kv_dir: self.kv_dir.or(file.kv_dir),
            kv_snapshot_interval_s: self.kv_snapshot_interval_s.or(file.kv_snapshot_interval_s),
        }
    }
}

pub(crate) fn load(args: NodeArgs, config: Option<&Path>) -> anyhow::Result<NodeArgs> {
    let Some(path) = config else { return Ok(args) };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    let file: NodeArgs = toml::from_str(&text).with_context(|| {
        format!(
            "{} is not a valid mink config (keys are the flag names, e.g. node-id = 1)",
            path.display()
        )
    })?;
    Ok(args.over(file))
}

/// `mink dev`: one node on embedded defaults under a data directory.
pub(crate) fn dev_defaults(args: NodeArgs, data_dir: &Path) -> anyhow::Result<NodeArgs> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let data_dir = data_dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", data_dir.display()))?;
    Ok(NodeArgs {
        node_id: Some(args.node_id.unwrap_or(1)),
        metadata: Some(
            args.metadata
                .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("metadata.db").display())),
        ),
        object_store: Some(
            args.object_store
                .unwrap_or_else(|| path_url(&data_dir.join("objects"))),
        ),
        listen: Some(args.listen.unwrap_or_else(|| "127.0.0.1:7171".into())),
        metrics_listen: Some(
            args.metrics_listen
                .unwrap_or_else(|| "127.0.0.1:9464".into()),
        ),
        sql_listen: Some(args.sql_listen.unwrap_or_else(|| "127.0.0.1:7272".into())),
        kafka_listen: Some(args.kafka_listen.unwrap_or_else(|| "127.0.0.1:9092".into())),
        // A topic a producer first names is created, with one partition, as by a Kafka
        // broker's defaults (auto.create.topics.enable, num.partitions).
        kafka_auto_create_partitions: Some(args.kafka_auto_create_partitions.unwrap_or(1)),
        kv_dir: Some(args.kv_dir.unwrap_or_else(|| data_dir.join("kv"))),
        ..args
    })
}

fn path_url(p: &Path) -> String {
    format!("file://{}", p.display())
}

/// The smallest `--max-message-bytes` taken: a request or answer larger than the limit fails,
/// and admin requests alone are a few hundred bytes.
const MIN_MESSAGE_BYTES: usize = 1 << 20;

/// What a node needs to start, checked.
struct Checked {
    node_id: u64,
    metadata: String,
    objects: String,
    listen: String,
}

/// Checks a node's settings without connecting to anything: required values, the metadata
/// URL's kind, the object store URL (its client is built, not used), addresses and numbers.
fn check(args: &NodeArgs) -> anyhow::Result<Checked> {
    let node_id = args
        .node_id
        .context("--node-id (MINK_NODE_ID) is required: a unique, stable number per node")?;
    if node_id == 0 {
        bail!("--node-id must be at least 1");
    }
    let metadata = args
        .metadata
        .clone()
        .context("--metadata (MINK_METADATA) is required: postgres://... or sqlite://<path>")?;
    if !["postgres://", "postgresql://", "sqlite:"]
        .iter()
        .any(|p| metadata.starts_with(p))
    {
        bail!(
            "--metadata {:?}: expected postgres://user@host/db or sqlite://<path>",
            redact_url(&metadata)
        );
    }
    let objects = args.object_store.clone().context(
        "--object-store (MINK_OBJECT_STORE) is required: s3://bucket/prefix?endpoint=... or a path",
    )?;
    match objects.split_once("://").map(|(scheme, _)| scheme) {
        None | Some("file") => {}
        Some("s3" | "memory") => {
            s3stream::store::open(&objects)
                .with_context(|| format!("--object-store {:?}", redact_url(&objects)))?;
        }
        Some(other) => bail!(
            "--object-store {:?}: unsupported scheme {other:?}: use s3://, file:// or a path",
            redact_url(&objects)
        ),
    }
    let listen = args.listen.clone().unwrap_or_else(|| "0.0.0.0:7171".into());
    let address = |flag: &str, a: &str| -> anyhow::Result<std::net::SocketAddr> {
        a.parse()
            .with_context(|| format!("{flag} {a:?}: expected host:port with an IP address"))
    };
    let bound = address("--listen", &listen)?;
    if bound.ip().is_unspecified() && args.advertised_address.is_none() {
        bail!(
            "listening on {bound}: give --advertised-address (MINK_ADVERTISED_ADDRESS), the address clients reach this node at"
        );
    }
    if let Some(m) = args
        .metrics_listen
        .as_deref()
        .filter(|m| *m != "none" && !m.is_empty())
    {
        address("--metrics-listen", m)?;
    }
    // Listeners bound by name (`localhost:9092`) and addresses others dial: host and port.
    let host_port = |flag: &str, a: &str| -> anyhow::Result<()> {
        anyhow::ensure!(
            mink_client::is_host_port(a),
            "{flag} {a:?}: expected host:port"
        );
        Ok(())
    };
    for (flag, value) in [
        ("--sql-listen", &args.sql_listen),
        ("--kafka-listen", &args.kafka_listen),
    ] {
        if let Some(a) = value.as_deref().filter(|a| *a != "none" && !a.is_empty()) {
            host_port(flag, a)?;
        }
    }
    for (flag, value) in [
        ("--advertised-address", &args.advertised_address),
        ("--kafka-advertised-address", &args.kafka_advertised_address),
    ] {
        if let Some(a) = value.as_deref() {
            host_port(flag, a)?;
            // Others dial it: a wildcard is where a node listens, not an address to reach.
            if let Ok(a) = a.parse::<std::net::SocketAddr>()
                && a.ip().is_unspecified()
            {
                bail!(
                    "{flag} {a}: nobody can dial {}: give the address clients reach this node at",
                    a.ip()
                );
            }
        }
    }
    // Two listeners on one address: the second would fail to bind only once the node runs. A
    // wildcard (`0.0.0.0:P`, `[::]:P`) takes port P on every address.
    let clash = |a: &str, b: &str| {
        let split = |x: &str| {
            x.rsplit_once(':')
                .map(|(h, p)| (h.trim_matches(['[', ']']).to_string(), p.to_string()))
        };
        // `[::]` takes the port on both families (dual stack), `0.0.0.0` on IPv4 and names.
        let covers = |wild: &str, other: &str| match wild.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(w)) => w.is_unspecified(),
            Ok(std::net::IpAddr::V4(w)) => {
                w.is_unspecified()
                    && !matches!(
                        other.parse::<std::net::IpAddr>(),
                        Ok(std::net::IpAddr::V6(_))
                    )
            }
            Err(_) => false,
        };
        match (split(a), split(b)) {
            (Some((ha, pa)), Some((hb, pb))) => {
                pa == pb && pa != "0" && (ha == hb || covers(&ha, &hb) || covers(&hb, &ha))
            }
            _ => a == b,
        }
    };
    let mut listeners = vec![("--listen", listen.clone())];
    for (flag, value) in [
        ("--metrics-listen", &args.metrics_listen),
        ("--sql-listen", &args.sql_listen),
        ("--kafka-listen", &args.kafka_listen),
    ] {
        if let Some(a) = value.as_deref().filter(|a| *a != "none" && !a.is_empty()) {
            if let Some((other, _)) = listeners.iter().find(|(_, b)| clash(a, b)) {
                bail!("{flag} {a} is {other}'s address: give each listener its own port");
            }
            listeners.push((flag, a.to_string()));
        }
    }
    if let Some(m) = args.max_message_bytes
        && m < MIN_MESSAGE_BYTES
    {
        bail!(
            "--max-message-bytes {m}: at least {MIN_MESSAGE_BYTES} (1 MiB), or no request gets through (the default is 64 MiB)"
        );
    }
    if args.kv_snapshot_interval_s == Some(0) {
        bail!("--kv-snapshot-interval-s must be at least 1");
    }
    if let Some(e) = args.otlp_endpoint.as_deref()
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        bail!("--otlp-endpoint {e:?}: expected an OTLP/gRPC URL such as http://collector:4317");
    }
    if args.lease_ttl_ms.is_some_and(|t| t < 100) {
        bail!("--lease-ttl-ms must be at least 100");
    }
    // The flag's parser refuses 0; a config file's value arrives here unchecked.
    if args.max_reads_in_flight == Some(0) {
        bail!("--max-reads-in-flight must be at least 1");
    }
    if let Some(n) = args.kafka_auto_create_partitions
        && n > mink_node::MAX_BUCKETS
    {
        bail!(
            "--kafka-auto-create-partitions is {n}: a topic has at most {} partitions (a table's most buckets)",
            mink_node::MAX_BUCKETS
        );
    }
    Ok(Checked {
        node_id,
        metadata,
        objects,
        listen,
    })
}

/// `mink node --check-config`: the settings as the node would take them, or what is wrong.
pub(crate) fn check_config(args: &NodeArgs) -> anyhow::Result<()> {
    let c = check(args)?;
    let mut text = format!(
        "the configuration of node {} is valid\n  metadata: {}\n  objects:  {}\n  listen:   {}\n  advertised: {}\n",
        c.node_id,
        redact_url(&c.metadata),
        redact_url(&c.objects),
        c.listen,
        args.advertised_address.as_deref().unwrap_or(&c.listen)
    );
    // The other settings given (those not given take their defaults, see --help).
    let given: [(&str, Option<String>); 13] = [
        ("metrics-listen", args.metrics_listen.clone()),
        ("sql-listen", args.sql_listen.clone()),
        ("kafka-listen", args.kafka_listen.clone()),
        (
            "kafka-advertised-address",
            args.kafka_advertised_address.clone(),
        ),
        (
            "kafka-auto-create-partitions",
            args.kafka_auto_create_partitions.map(|n| n.to_string()),
        ),
        ("otlp-endpoint", args.otlp_endpoint.clone()),
        ("flush-delay-ms", args.flush_delay_ms.map(|n| n.to_string())),
        (
            "compaction-mib-per-sec",
            args.compaction_mib_per_sec.map(|n| n.to_string()),
        ),
        (
            "max-reads-in-flight",
            args.max_reads_in_flight.map(|n| n.to_string()),
        ),
        ("lease-ttl-ms", args.lease_ttl_ms.map(|n| n.to_string())),
        (
            "max-message-bytes",
            args.max_message_bytes.map(|n| n.to_string()),
        ),
        (
            "kv-dir",
            args.kv_dir.as_ref().map(|d| d.display().to_string()),
        ),
        (
            "kv-snapshot-interval-s",
            args.kv_snapshot_interval_s.map(|n| n.to_string()),
        ),
    ];
    for (name, value) in given {
        if let Some(v) = value {
            text.push_str(&format!("  {name}: {v}\n"));
        }
    }
    crate::say(&text);
    Ok(())
}

/// Runs a node until SIGINT/SIGTERM, printing its endpoints once serving (`dev`: and how to
/// start using it).
pub(crate) async fn run(args: NodeArgs, dev: bool) -> anyhow::Result<()> {
    let Checked {
        node_id,
        metadata,
        objects,
        listen,
    } = check(&args)?;
    let telemetry = telemetry::init_node(args.otlp_endpoint.as_deref(), node_id)?;

    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {listen} (is another mink running? pick another with --listen)"
            )
        })?;
    let bound = listener.local_addr()?;
    let advertised = args
        .advertised_address
        .clone()
        .unwrap_or_else(|| bound.to_string());
    let mut config = NodeConfig::new(node_id, &metadata, &objects);
    config.advertised_address = advertised.clone();
    if let Some(ms) = args.flush_delay_ms {
        config.engine.flush_delay = Duration::from_millis(ms);
    }
    if let Some(mib) = args.compaction_mib_per_sec {
        config.compaction.max_bytes_per_sec = mib.saturating_mul(1 << 20);
    }
    if let Some(n) = args.max_reads_in_flight {
        config.engine.max_reads_in_flight = n as usize;
    }
    if let Some(ms) = args.lease_ttl_ms {
        config.lease_ttl = Duration::from_millis(ms);
    }
    if let Some(dir) = &args.kv_dir {
        config.kv_dir.clone_from(dir);
    }
    if let Some(s) = args.kv_snapshot_interval_s {
        config.kv_snapshot_interval = Duration::from_secs(s.max(1));
    }
    config.claim_object_store = args.claim_object_store;
    // The Kafka listener is bound before the node starts: its address is registered with it.
    let kafka = match args.kafka_listen.as_deref() {
        None | Some("none" | "") => None,
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a).await.with_context(|| {
                format!("cannot listen for Kafka on {a} (use --kafka-listen none to disable)")
            })?;
            let bound = l.local_addr()?;
            // A wildcard address is reached at the advertised Flight host.
            let address = if let Some(a) = &args.kafka_advertised_address {
                a.clone()
            } else if bound.ip().is_unspecified() {
                let host = advertised
                    .rsplit_once(':')
                    .map_or(advertised.as_str(), |(h, _)| h);
                format!("{host}:{}", bound.port())
            } else {
                bound.to_string()
            };
            config
                .listeners
                .insert(mink_kafka::LISTENER.to_string(), address.clone());
            Some((l, address))
        }
    };
    // Every listener is bound before the node registers: a start that fails on a port in use
    // must not have fenced the process serving this node id meanwhile.
    let metrics_listener = match args.metrics_listen.as_deref() {
        None | Some("none" | "") => None,
        Some(a) => Some(tokio::net::TcpListener::bind(a).await.with_context(|| {
            format!("cannot listen for metrics on {a} (use --metrics-listen none to disable)")
        })?),
    };
    let sql_listener = match args.sql_listen.as_deref() {
        None | Some("none" | "") => None,
        Some(a) => Some(tokio::net::TcpListener::bind(a).await.with_context(|| {
            format!("cannot listen for Flight SQL on {a} (use --sql-listen none to disable)")
        })?),
    };
    let node = Node::start(config).await.with_context(|| {
        format!(
            "node {node_id} could not start (metadata {}, objects {})",
            redact_url(&metadata),
            redact_url(&objects)
        )
    })?;
    telemetry::observe_node(&node);

    let metrics_address = match metrics_listener {
        None => None,
        Some(l) => {
            let address = l.local_addr()?;
            let scrape = telemetry.scrape.clone();
            tokio::spawn(async move {
                if let Err(e) = telemetry::serve_metrics(l, scrape).await {
                    tracing::error!(error = %e, "metrics endpoint stopped");
                }
            });
            Some(address)
        }
    };

    let sql_address = match sql_listener {
        None => None,
        Some(l) => {
            let address = l.local_addr()?;
            // Statements run on threads of their own (mink_query's executor): a heavy query
            // does not hold up the node's writes, reads and heartbeats.
            let stopping = node.clone();
            tokio::spawn(serve_sql(
                l,
                advertised.clone(),
                (metadata.clone(), objects.clone()),
                async move { stopping.until_stopping().await },
            ));
            Some(address)
        }
    };

    let kafka_address = kafka.map(|(l, address)| {
        let node = node.clone();
        let advertised = address.clone();
        let auto_create_topics = args.kafka_auto_create_partitions.filter(|n| *n > 0);
        tokio::spawn(async move {
            let config = mink_kafka::KafkaConfig {
                advertised: Some(advertised),
                auto_create_topics,
                ..Default::default()
            };
            // Closed with the signal, as Flight is: no writes taken during the drain, and the
            // port free for the next process.
            let stopping = node.clone();
            let served =
                mink_kafka::serve(
                    node,
                    config,
                    l,
                    async move { stopping.until_stopping().await },
                )
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the Kafka listener stopped");
            }
        });
        address
    });

    let mut server = ServerConfig::default();
    if let Some(m) = args.max_message_bytes {
        server.max_message_bytes = m;
    }
    let mut out = format!(
        "mink node {node_id} is serving\n  Flight:   grpc://{advertised}\n  Metadata: {}\n  Objects:  {}\n",
        redact_url(&metadata),
        redact_url(&objects)
    );
    if let Some(q) = sql_address {
        out.push_str(&format!(
            "  SQL:      grpc://{q} (Flight SQL, for BI tools and ADBC; mink-query takes the Flight address)\n"
        ));
    }
    if let Some(k) = &kafka_address {
        out.push_str(&format!(
            "  Kafka:    {k} (topics are the log tables of database kafka)\n"
        ));
    }
    if let Some(m) = metrics_address {
        out.push_str(&format!("  Metrics:  http://{m}/metrics\n"));
    }
    if dev {
        // Client commands talk to 127.0.0.1:7171 unless told otherwise.
        let server = if advertised == "127.0.0.1:7171" {
            String::new()
        } else {
            format!(" --server {advertised}")
        };
        out.push_str(&format!("Stop it with Ctrl-C. Try: mink{server} table create app.events --column 'id Int64 not null' --column 'msg Utf8'\n"));
    }
    crate::say(&out);
    tracing::info!(%advertised, node_id, "serving Arrow Flight");
    // A node whose metadata sink halted (another process registered its id, or the log is
    // damaged) can serve nothing that needs the metadata: it stops, and says why, instead of
    // answering on as a zombie that readiness probes keep in service.
    let halted: std::sync::Mutex<Option<NodeError>> = std::sync::Mutex::new(None);
    let shutdown = async {
        tokio::select! {
            () = stop_signal() => tracing::info!(
                "shutting down: requests in flight have up to {} s to end (signal again to stop at once)",
                DRAIN_LIMIT.as_secs()
            ),
            e = node.until_halted() => {
                tracing::error!(error = %e, "this node can serve no more: stopping");
                *halted.lock().expect("halted lock") = Some(e);
            }
        }
        // Tails and waits end now, and the Kafka and Flight SQL listeners close: the Flight
        // server's drain would otherwise wait on them.
        node.begin_shutdown();
    };
    let served = mink_flight::serve(node.clone(), server, listener, shutdown);
    tokio::pin!(served);
    // A client holding a stream open (a write stream it never finishes) cannot hold the stop
    // for longer than DRAIN_LIMIT: its connection is dropped, and what it wrote but was not
    // acknowledged it writes again elsewhere.
    let served = tokio::select! {
        served = &mut served => served,
        () = async {
            node.until_stopping().await;
            tokio::time::sleep(DRAIN_LIMIT).await;
        } => {
            tracing::warn!(limit = ?DRAIN_LIMIT, "clients still had streams open; closing their connections");
            Ok(())
        }
        () = async {
            node.until_stopping().await;
            stop_signal().await;
        } => {
            tracing::warn!("signalled again: closing clients' connections now");
            Ok(())
        }
    };
    node.shutdown().await;
    telemetry.shutdown();
    if let Some(e) = halted.lock().expect("halted lock").take() {
        anyhow::bail!("node {node_id} stopped: {e}");
    }
    served.context("the Flight server failed")
}

/// The next SIGINT (Ctrl-C) or SIGTERM.
async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        } => {}
    }
}

/// Serves Flight SQL on `listener` over the cluster, reached through this node (`node`, its
/// Flight address), until `stop`; lake snapshots are read straight from the node's catalog and
/// object store (`metadata`, `objects`).
async fn serve_sql(
    listener: tokio::net::TcpListener,
    node: String,
    (metadata, objects): (String, String),
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let client = match mink_client::Client::connect(&node).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "Flight SQL cannot reach its node");
            return;
        }
    };
    let lake = match mink_query::open_lake(&metadata, &objects).await {
        Ok(l) => Some(std::sync::Arc::new(l)),
        Err(e) => {
            tracing::warn!(error = %e, "Flight SQL reads the lake through the node");
            None
        }
    };
    let service = mink_query::flight_sql::MinkFlightSql::new(mink_query::QueryEngine::with_lake(
        client, lake,
    ));
    if let Err(e) = service.serve(listener, stop).await {
        tracing::error!(error = %e, "the Flight SQL server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::{NodeArgs, check};

    /// `--check-config` refuses what the node would refuse when starting.
    #[test]
    fn the_check_refuses_what_the_node_would() {
        let valid = NodeArgs {
            node_id: Some(1),
            metadata: Some("sqlite:///tmp/m.db".into()),
            object_store: Some("/tmp/objects".into()),
            listen: Some("127.0.0.1:7171".into()),
            ..NodeArgs::default()
        };
        assert!(check(&valid).is_ok());
        let refused = |args: NodeArgs, flag: &str| {
            let e = format!("{:#}", check(&args).err().expect(flag));
            assert!(e.contains(flag), "{e}");
        };
        refused(
            NodeArgs {
                object_store: Some("gs://b/p".into()),
                ..valid.clone()
            },
            "--object-store",
        );
        refused(
            NodeArgs {
                sql_listen: Some("1.2.3.4:99999".into()),
                ..valid.clone()
            },
            "--sql-listen",
        );
        refused(
            NodeArgs {
                advertised_address: Some("nohost".into()),
                ..valid.clone()
            },
            "--advertised-address",
        );
        refused(
            NodeArgs {
                kafka_auto_create_partitions: Some(5000),
                ..valid.clone()
            },
            "--kafka-auto-create-partitions",
        );
        refused(
            NodeArgs {
                max_reads_in_flight: Some(0),
                ..valid.clone()
            },
            "--max-reads-in-flight",
        );
        // The object store's own error names the URL too, without its secrets.
        let e = format!(
            "{:#}",
            check(&NodeArgs {
                object_store: Some("s3://b/p?secret_access_key=hunter2&no_such_key=1".into()),
                ..valid
            })
            .err()
            .expect("an unknown S3 setting")
        );
        assert!(
            e.contains("no_such_key") && e.contains("***") && !e.contains("hunter2"),
            "{e}"
        );
    }
}
