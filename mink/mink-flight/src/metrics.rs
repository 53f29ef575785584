//! Flight service metrics, through the OpenTelemetry API (the binary installs the provider).

use std::sync::OnceLock;
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};

pub(crate) struct Metrics {
    pub(crate) requests: Counter<u64>,
    pub(crate) duration: Histogram<f64>,
    pub(crate) bytes: Counter<u64>,
    pub(crate) rows: Counter<u64>,
    /// `DoPut`: from a batch's arrival to its acknowledgement (durable).
    pub(crate) ack: Histogram<f64>,
}

pub(crate) fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = opentelemetry::global::meter("mink-flight");
        Metrics {
            requests: meter
                .u64_counter("mink.flight.requests")
                .with_description("Flight calls by method and outcome")
                .build(),
            duration: mink_node::latency_histogram(
                &meter,
                "mink.flight.request.duration",
                "Flight call duration (whole stream for DoGet and DoPut)",
            ),
            bytes: meter
                .u64_counter("mink.flight.bytes")
                .with_unit("By")
                .with_description("Arrow IPC bytes received (in) and sent (out)")
                .build(),
            rows: meter
                .u64_counter("mink.flight.rows")
                .with_description("Rows written (in) and read (out)")
                .build(),
            ack: mink_node::latency_histogram(
                &meter,
                "mink.write.ack.duration",
                "DoPut batch latency: arrival to durable acknowledgement",
            ),
        }
    })
}

/// Counts a finished call and its duration.
pub(crate) fn finished(method: &'static str, code: tonic::Code, started: Instant) {
    let m = metrics();
    let code = format!("{code:?}");
    m.requests.add(
        1,
        &[KeyValue::new("method", method), KeyValue::new("code", code)],
    );
    m.duration.record(
        started.elapsed().as_secs_f64(),
        &[KeyValue::new("method", method)],
    );
}

pub(crate) fn transferred(direction: &'static str, bytes: usize, rows: usize) {
    let m = metrics();
    let attrs = [KeyValue::new("direction", direction)];
    m.bytes.add(bytes as u64, &attrs);
    if rows > 0 {
        m.rows.add(rows as u64, &attrs);
    }
}
