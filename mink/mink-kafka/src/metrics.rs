//! Kafka listener metrics, through the OpenTelemetry API (the binary installs the provider),
//! beside the Flight service's: requests and their time by API, bytes each way, and
//! connections by how they ended.

use std::sync::OnceLock;
use std::time::Instant;

use kafka_protocol::messages::ApiKey;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};

use crate::conn::ConnError;

struct Metrics {
    requests: Counter<u64>,
    duration: Histogram<f64>,
    bytes: Counter<u64>,
    opened: Counter<u64>,
    closed: Counter<u64>,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = opentelemetry::global::meter("mink-kafka");
        Metrics {
            requests: meter
                .u64_counter("mink.kafka.requests")
                .with_description("Kafka requests by API")
                .build(),
            duration: mink_node::latency_histogram(
                &meter,
                "mink.kafka.request.duration",
                "Kafka request time by API, from its frame read to its answer written \
                 (a produce's wait for durability and a fetch's long-poll included)",
            ),
            bytes: meter
                .u64_counter("mink.kafka.bytes")
                .with_unit("By")
                .with_description("Kafka frame bytes read (in) and written (out)")
                .build(),
            opened: meter
                .u64_counter("mink.kafka.connections")
                .with_description("Kafka connections accepted")
                .build(),
            closed: meter
                .u64_counter("mink.kafka.connections.closed")
                .with_description(
                    "Kafka connections ended, by reason: the client closed it, idle, \
                     an oversized or malformed request, or a socket error",
                )
                .build(),
        }
    })
}

/// A request frame of `bytes` (its size field included) read for `api_key`; its label, which
/// [`answered`] takes back.
pub(crate) fn requested(api_key: ApiKey, bytes: usize) -> KeyValue {
    let m = metrics();
    let api = KeyValue::new("api", format!("{api_key:?}"));
    m.requests.add(1, std::slice::from_ref(&api));
    m.bytes
        .add(bytes as u64, &[KeyValue::new("direction", "in")]);
    api
}

/// The answer to the request labelled `api`, read at `started`, is written (`bytes` of it:
/// none for acks = 0).
pub(crate) fn answered(api: KeyValue, started: Instant, bytes: usize) {
    let m = metrics();
    m.duration.record(started.elapsed().as_secs_f64(), &[api]);
    if bytes > 0 {
        m.bytes
            .add(bytes as u64, &[KeyValue::new("direction", "out")]);
    }
}

pub(crate) fn connected() {
    metrics().opened.add(1, &[]);
}

/// A connection ended, with `result`.
pub(crate) fn closed(result: &Result<(), ConnError>) {
    let reason = match result {
        Ok(()) => "client",
        Err(ConnError::Idle(_)) => "idle",
        Err(ConnError::FrameSize(..)) => "frame_size",
        Err(ConnError::Malformed(_)) => "malformed",
        Err(ConnError::Io(_)) => "io",
    };
    metrics().closed.add(1, &[KeyValue::new("reason", reason)]);
}
