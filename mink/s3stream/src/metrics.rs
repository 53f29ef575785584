//! The engine's latency histograms, through the OpenTelemetry API: the binary installs a
//! meter provider (Prometheus, OTLP) before starting the engine; without one they cost nothing.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::metrics::{Histogram, Meter};

pub(crate) struct Metrics {
    /// Object id + PUT of one flush.
    pub(crate) upload: Histogram<f64>,
    /// `CommitStreamSetObject` of one flush.
    pub(crate) commit: Histogram<f64>,
    pub(crate) flush_bytes: Histogram<u64>,
}

/// Latency histogram buckets in seconds, 1 ms to 30 s (the SDK's defaults suit milliseconds,
/// not seconds).
const LATENCY_SECONDS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A histogram of durations in seconds, with the buckets every latency histogram of a node
/// uses.
pub fn latency_histogram(
    meter: &Meter,
    name: &'static str,
    description: &'static str,
) -> Histogram<f64> {
    meter
        .f64_histogram(name)
        .with_unit("s")
        .with_description(description)
        .with_boundaries(LATENCY_SECONDS.to_vec())
        .build()
}

pub(crate) fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = opentelemetry::global::meter("s3stream");
        Metrics {
            upload: latency_histogram(
                &meter,
                "s3stream.flush.upload.duration",
                "Time to upload one stream-set object (id and PUT)",
            ),
            commit: latency_histogram(
                &meter,
                "s3stream.flush.commit.duration",
                "Time to commit one uploaded object in the metadata log",
            ),
            flush_bytes: meter
                .u64_histogram("s3stream.flush.size")
                .with_unit("By")
                .with_description("Bytes per stream-set object")
                .with_boundaries(vec![
                    4096.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 8388608.0, 16777216.0,
                    67108864.0,
                ])
                .build(),
        }
    })
}

pub(crate) fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}
