//! What tests of the tools built on Mink's frontends need: one node (SQLite metadata, local
//! object store in a directory) serving Arrow Flight and the Kafka protocol on loopback ports,
//! stopped cleanly.

use std::path::Path;
use std::time::Duration;

use mink_node::{Node, NodeConfig};

/// A node and its two listeners.
#[allow(missing_debug_implementations)] // a test's handle
pub struct Served {
    pub node: Node,
    /// The Arrow Flight address (`host:port`).
    pub flight: String,
    /// The Kafka bootstrap address (`host:port`).
    pub kafka: String,
    stop: tokio::sync::watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<()>>,
}

async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A node with data under `dir` (5 ms flushes, for tests), its Kafka listener configured by
/// `kafka` (its advertised address is set here).
pub async fn serve(dir: &Path, kafka: mink_kafka::KafkaConfig) -> Served {
    let mut c = NodeConfig::new(
        1,
        &format!("sqlite://{}", dir.join("meta.db").display()),
        dir.join("objects").to_str().unwrap(),
    );
    c.engine.flush_delay = Duration::from_millis(5);
    serve_node(c, kafka).await
}

/// A node of `config` serving Flight and the Kafka protocol on loopback ports (the
/// addresses it advertises are set here).
pub async fn serve_node(c: NodeConfig, kafka: mink_kafka::KafkaConfig) -> Served {
    serve_node_at(c, kafka, "127.0.0.1:0", "127.0.0.1:0").await
}

/// [`serve_node`] on the addresses `flight` and `kafka` (a restarted node's, to come back on
/// the same ones).
pub async fn serve_node_at(
    mut c: NodeConfig,
    kafka: mink_kafka::KafkaConfig,
    flight: &str,
    kafka_at: &str,
) -> Served {
    let flight_listener = tokio::net::TcpListener::bind(flight).await.unwrap();
    let kafka_listener = tokio::net::TcpListener::bind(kafka_at).await.unwrap();
    let flight = flight_listener.local_addr().unwrap().to_string();
    let kafka_address = kafka_listener.local_addr().unwrap().to_string();
    c.advertised_address = flight.clone();
    c.listeners
        .insert(mink_kafka::LISTENER.to_string(), kafka_address.clone());
    let node = Node::start(c).await.unwrap();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let flight_server = tokio::spawn({
        let (node, stopping) = (node.clone(), stopping.clone());
        async move {
            let config = mink_flight::ServerConfig::default();
            mink_flight::serve(node, config, flight_listener, stopped(stopping))
                .await
                .unwrap();
        }
    });
    let kafka_server = tokio::spawn({
        let (node, advertised) = (node.clone(), kafka_address.clone());
        async move {
            let config = mink_kafka::KafkaConfig {
                advertised: Some(advertised),
                ..kafka
            };
            mink_kafka::serve(node, config, kafka_listener, stopped(stopping))
                .await
                .unwrap();
        }
    });
    Served {
        node,
        flight,
        kafka: kafka_address,
        stop,
        servers: vec![flight_server, kafka_server],
    }
}

impl Served {
    /// Stops both listeners, then the node.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for s in self.servers {
            s.await.unwrap();
        }
        self.node.shutdown().await;
    }

    /// Stops the node, then its listeners: clients still connected (connectors running through
    /// a restart) see their connections break rather than keep the listeners open.
    pub async fn stop_under_clients(self) {
        let _ = self.stop.send(true);
        self.node.shutdown().await;
        for s in self.servers {
            tokio::time::timeout(Duration::from_secs(30), s)
                .await
                .expect("waited 30 s for a listener of the stopped node to end")
                .unwrap();
        }
    }
}
