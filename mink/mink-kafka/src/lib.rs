//! The Kafka protocol frontend: Kafka clients produce to and fetch from Mink's log tables.
//!
//! A topic is a log table, a partition one of its buckets, a Kafka offset the log offset: the
//! rows a producer writes here are the rows Flight, the union read and SQL see. Topic `t` is
//! table `t` of database [`KafkaConfig::database`] (`kafka` by default); topic `db.t`, when
//! database `db` exists, is table `t` of `db`. Topics created over Kafka are log tables with the
//! raw schema ([`records::raw_schema`]: key, value, headers, timestamp). Primary-key tables and
//! partitioned log tables are not topics.
//!
//! This adapter decodes requests, calls the node service ([`mink_node::Node`]: writes, bucket
//! reads, long polls, the catalog) and encodes responses; it holds no state of its own beyond a
//! connection. Requests of one connection are answered in order; a produce request takes its
//! offsets before the next request is read, and its durability wait overlaps with the next ones.

mod api;
mod conn;
mod frames;
mod groups;
mod metrics;
pub mod records;

use std::sync::Arc;

use kafka_protocol::ResponseError;
use mink_node::{Node, NodeError};

/// What a Kafka listener accepts.
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    /// The database of topics named without one (`kafka`); created on the first CreateTopics.
    pub database: String,
    /// The largest request frame read; a larger one closes the connection (Kafka's
    /// `socket.request.max.bytes`).
    pub max_request_bytes: usize,
    /// The longest a fetch waits for data, whatever the client asks (`max_wait_ms`).
    pub max_fetch_wait: std::time::Duration,
    /// The most record bytes one fetch answers with, whatever the client asks, for the whole
    /// response and for each partition (Kafka's broker `fetch.max.bytes`, 55 MiB); the first
    /// batch goes whole even when it is larger.
    pub max_fetch_bytes: usize,
    /// Bytes of answers a connection holds that its client has not read yet: past them the
    /// connection reads no more requests until the client reads (one answer always fits).
    pub max_unsent_bytes: usize,
    /// A connection is closed when, for this long, no request arrived whole, nothing was
    /// answered or written, and no answer was pending (Kafka's `connections.max.idle.ms`,
    /// 10 min); a client that stops reading its answers is closed after as long.
    pub connections_max_idle: std::time::Duration,
    /// The address this listener is reached at (the one registered as this node's
    /// [`LISTENER`]): Metadata names it for this node until the registration is applied.
    pub advertised: Option<String>,
    /// Create a topic a client's Metadata request names, with this many partitions, when it
    /// does not exist (Kafka's `auto.create.topics.enable` with `num.partitions`); `None`
    /// (the default) answers `UNKNOWN_TOPIC_OR_PARTITION` instead.
    pub auto_create_topics: Option<u32>,
    /// How long the first rebalance of an empty group waits for more members before it
    /// completes (Kafka's `group.initial.rebalance.delay.ms`, 3 s): consumers starting together
    /// join one generation instead of rebalancing once per member.
    pub initial_rebalance_delay: std::time::Duration,
    /// How long a group whose members all left is kept, Empty (ListGroups and DescribeGroups
    /// show it, DeleteGroups deletes it), before it is forgotten: Kafka drops one at its next
    /// cleanup (`offsets.retention.check.interval.ms`, 10 minutes). Committed offsets keep
    /// a group listed either way.
    pub empty_group_retention: std::time::Duration,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            database: "kafka".to_string(),
            max_request_bytes: 100 << 20,
            max_fetch_wait: std::time::Duration::from_secs(30),
            max_fetch_bytes: 55 << 20,
            max_unsent_bytes: 64 << 20,
            connections_max_idle: std::time::Duration::from_secs(600),
            advertised: None,
            auto_create_topics: None,
            initial_rebalance_delay: std::time::Duration::from_secs(3),
            empty_group_retention: std::time::Duration::from_secs(600),
        }
    }
}

/// The listener name a node registers its Kafka address under (`NodeConfig::listeners`):
/// Metadata answers with each node's address for it.
pub const LISTENER: &str = "kafka";

/// Serves the Kafka protocol on `listener` until `shutdown` resolves; each connection runs on
/// its own task and ends with the listener.
pub async fn serve(
    node: Node,
    config: KafkaConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let config = Arc::new(config);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let groups = Arc::new(groups::Groups::new(
        node.clone(),
        config.initial_rebalance_delay,
        config.empty_group_retention,
    ));
    // Group sessions and rebalance deadlines. (Committed offsets past their retention are
    // the coordinator's to drop: mink_coordinator::CoordinatorConfig.)
    let ticking = {
        let groups = Arc::clone(&groups);
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(groups::TICK);
            loop {
                tokio::select! {
                    _ = tick.tick() => groups.tick().await,
                    _ = stopped.changed() => return,
                }
            }
        })
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a Kafka connection failed");
                        continue;
                    }
                };
                let _ = socket.set_nodelay(true);
                metrics::connected();
                let node = node.clone();
                let config = Arc::clone(&config);
                let groups = Arc::clone(&groups);
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        r = conn::run(node, config, groups, socket) => {
                            metrics::closed(&r);
                            if let Err(e) = r {
                                tracing::debug!(%peer, error = %e, "Kafka connection closed");
                            }
                        }
                        _ = stopped.wait_for(|s| *s) => {}
                    }
                });
            }
        }
    }
    let _ = stop.send(true);
    let _ = ticking.await;
    Ok(())
}

/// The Kafka error code of a node error (the frontend's mapping; see docs/kafka.md).
pub(crate) fn error_code(e: &NodeError) -> ResponseError {
    match e {
        NodeError::TableNotFound { .. } | NodeError::NotFound(_) => {
            ResponseError::UnknownTopicOrPartition
        }
        NodeError::NotLeader { .. } => ResponseError::NotLeaderOrFollower,
        NodeError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        NodeError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
        NodeError::Invalid(_) => ResponseError::InvalidRequest,
        NodeError::TooLarge { .. } => ResponseError::MessageTooLarge,
        NodeError::WrongBucket { .. } => ResponseError::InvalidRecord,
        NodeError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        // An idempotent (not transactional) producer at an old epoch.
        NodeError::WriterFenced { .. } => ResponseError::InvalidProducerEpoch,
        NodeError::UnknownWriter { .. } => ResponseError::UnknownProducerId,
        NodeError::Unavailable(_) => ResponseError::RequestTimedOut,
        NodeError::NotCoordinator { .. } => ResponseError::NotCoordinator,
        _ => ResponseError::UnknownServerError,
    }
}

/// The table a topic names, the inverse of [`topic_of`]: `t` in the Kafka database when that
/// table exists (a topic created as `com.acme.orders` stays reachable whatever databases come
/// later), else `t` of database `db` for `db.t` when `db` is another existing database, else
/// `t` in the Kafka database (where a new topic is created).
pub(crate) fn table_of(node: &Node, config: &KafkaConfig, topic: &str) -> (String, String) {
    let view = node.view();
    if view.state.table_by_name(&config.database, topic).is_none()
        && let Some((db, table)) = topic.split_once('.')
        && db != config.database
        && view.state.databases.contains_key(db)
    {
        return (db.to_string(), table.to_string());
    }
    (config.database.clone(), topic.to_string())
}

/// Why `topic` is not a name Kafka allows (ASCII letters, digits, `.`, `_` and `-`, at most
/// 249 of them, not `.` or `..`), if it is not.
pub(crate) fn invalid_topic_name(topic: &str) -> Option<String> {
    if topic.is_empty() || topic == "." || topic == ".." {
        Some(format!("{topic:?} is not a topic name"))
    } else if topic.len() > 249 {
        Some(format!(
            "a topic name has at most 249 characters; this one has {}",
            topic.len()
        ))
    } else {
        topic
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
            .map(|c| {
                format!(
                    "topic {topic:?} holds {c:?}: a topic name is ASCII letters, digits, '.', '_' and '-'"
                )
            })
    }
}

/// A table's topic name: plain in the Kafka database, `db.t` elsewhere.
pub(crate) fn topic_of(config: &KafkaConfig, database: &str, table: &str) -> String {
    if database == config.database {
        table.to_string()
    } else {
        format!("{database}.{table}")
    }
}
