//! The engine's latency histograms, through the OpenTelemetry API: the binary installs a
//! meter provider (Prometheus, OTLP) before starting the engine; without one they cost nothing.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::metrics::Histogram;

pub(crate) struct Metrics {
    /// Object id + PUT of one flush.
    pub(crate) upload: Histogram<f64>,
    /// `CommitStreamSetObject` of one flush.
    pub(crate) commit: Histogram<f64>,
    pub(crate) flush_bytes: Histogram<u64>,
}

pub(crate) fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = opentelemetry::global::meter("s3stream");
        Metrics {
            upload: meter
                .f64_histogram("s3stream.flush.upload.duration")
                .with_unit("s")
                .with_description("Time to upload one stream-set object (id and PUT)")
                .build(),
            commit: meter
                .f64_histogram("s3stream.flush.commit.duration")
                .with_unit("s")
                .with_description("Time to commit one uploaded object in the metadata log")
                .build(),
            flush_bytes: meter
                .u64_histogram("s3stream.flush.size")
                .with_unit("By")
                .with_description("Bytes per stream-set object")
                .build(),
        }
    })
}

pub(crate) fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}
