//! Logs, traces and metrics of a `mink` process.
//!
//! - Logs: `tracing` to stderr, filtered by `MINK_LOG` (or `RUST_LOG`).
//! - Traces: every Flight call is a span; exported over OTLP when an endpoint is configured.
//! - Metrics: instruments record through the OpenTelemetry API (the libraries' own and the
//!   node gauges registered here); they are exported over OTLP when configured and served in
//!   the Prometheus text format on `/metrics`, rendered from a pull reader at scrape time.

use std::fmt::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{
    InstrumentKind, ManualReader, Pipeline, SdkMeterProvider, Temporality,
};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The pull reader behind `/metrics`, shared between the meter provider and the HTTP handler.
#[derive(Clone, Debug)]
pub(crate) struct Scrape(Arc<ManualReader>);

impl MetricReader for Scrape {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

impl Scrape {
    /// The current metrics in the Prometheus text exposition format.
    pub(crate) fn render(&self) -> String {
        let mut rm = ResourceMetrics::default();
        if let Err(e) = self.0.collect(&mut rm) {
            return format!("# collection failed: {e}\n");
        }
        let mut out = String::new();
        for scope in rm.scope_metrics() {
            for metric in scope.metrics() {
                render_metric(&mut out, metric);
            }
        }
        out
    }
}

/// Prometheus names: `[a-zA-Z_:][a-zA-Z0-9_:]*`, with the unit as a suffix.
fn prometheus_name(name: &str, unit: &str) -> String {
    let mut n: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let suffix = match unit {
        "s" => "_seconds",
        "By" => "_bytes",
        _ => "",
    };
    if !suffix.is_empty() && !n.ends_with(suffix) {
        n.push_str(suffix);
    }
    n
}

fn labels<'a>(
    attributes: impl Iterator<Item = &'a KeyValue>,
    extra: Option<(&str, String)>,
) -> String {
    let mut parts: Vec<String> = attributes
        .map(|kv| {
            let value = kv
                .value
                .to_string()
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{}=\"{value}\"", prometheus_name(kv.key.as_str(), ""))
        })
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn render_metric(out: &mut String, metric: &opentelemetry_sdk::metrics::data::Metric) {
    let base = prometheus_name(metric.name(), metric.unit());
    let help = metric.description().replace('\n', " ");
    macro_rules! render {
        ($data:expr) => {
            match $data {
                MetricData::Gauge(g) => {
                    let _ = writeln!(out, "# HELP {base} {help}\n# TYPE {base} gauge");
                    for p in g.data_points() {
                        let _ =
                            writeln!(out, "{base}{} {}", labels(p.attributes(), None), p.value());
                    }
                }
                MetricData::Sum(s) => {
                    let (name, kind) = if s.is_monotonic() {
                        (format!("{base}_total"), "counter")
                    } else {
                        (base.clone(), "gauge")
                    };
                    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                    for p in s.data_points() {
                        let _ =
                            writeln!(out, "{name}{} {}", labels(p.attributes(), None), p.value());
                    }
                }
                MetricData::Histogram(h) => {
                    let _ = writeln!(out, "# HELP {base} {help}\n# TYPE {base} histogram");
                    for p in h.data_points() {
                        let mut cumulative = 0u64;
                        let counts: Vec<u64> = p.bucket_counts().collect();
                        for (bound, count) in p.bounds().zip(&counts) {
                            cumulative += count;
                            let l = labels(p.attributes(), Some(("le", bound.to_string())));
                            let _ = writeln!(out, "{base}_bucket{l} {cumulative}");
                        }
                        let l = labels(p.attributes(), Some(("le", "+Inf".to_string())));
                        let _ = writeln!(out, "{base}_bucket{l} {}", p.count());
                        let l = labels(p.attributes(), None);
                        let _ = writeln!(out, "{base}_sum{l} {}", p.sum());
                        let _ = writeln!(out, "{base}_count{l} {}", p.count());
                    }
                }
                MetricData::ExponentialHistogram(_) => {}
            }
        };
    }
    match metric.data() {
        AggregatedMetrics::F64(d) => render!(d),
        AggregatedMetrics::U64(d) => render!(d),
        AggregatedMetrics::I64(d) => render!(d),
    }
}

/// What `init` set up; keep it alive, and `shutdown` it to flush exports.
pub(crate) struct Telemetry {
    pub(crate) scrape: Scrape,
    meters: SdkMeterProvider,
    tracer: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub(crate) fn shutdown(&self) {
        let _ = self.meters.shutdown();
        if let Some(t) = &self.tracer {
            let _ = t.shutdown();
        }
    }
}

/// Logging for client commands: warnings and errors only, unless `MINK_LOG` says otherwise.
pub(crate) fn init_client_logging() {
    let (filter, refused) = log_filter(&["MINK_LOG"], "warn");
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(log_layer())
        .try_init();
    refused.warn();
}

/// The log filter of the first of `variables` that is set, or `default`; a value that is no
/// filter is said (once logging runs), not ignored.
fn log_filter(variables: &[&str], default: &str) -> (EnvFilter, Refused) {
    for v in variables {
        let Ok(value) = std::env::var(v) else {
            continue;
        };
        return match EnvFilter::try_new(&value) {
            Ok(f) => (f, Refused(None)),
            Err(e) => (
                EnvFilter::new(default),
                Refused(Some(format!(
                    "{v}={value:?} is not a log filter ({e}): logging at {default:?}"
                ))),
            ),
        };
    }
    (EnvFilter::new(default), Refused(None))
}

/// A log filter variable that was refused, to say so once logging runs.
struct Refused(Option<String>);

impl Refused {
    fn warn(self) {
        if let Some(why) = self.0 {
            tracing::warn!("{why}");
        }
    }
}

/// Log lines on standard error, coloured only when it is a terminal (and `NO_COLOR` is unset):
/// a log written to a file or a pipe carries no escape codes.
fn log_layer<S>() -> tracing_subscriber::fmt::Layer<
    S,
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format,
    fn() -> std::io::Stderr,
> {
    use std::io::IsTerminal as _;
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr as fn() -> std::io::Stderr)
        .with_ansi(colour)
}

/// Logs, traces and metrics for a node. `otlp` is an OTLP/gRPC endpoint (`http://host:4317`).
pub(crate) fn init_node(otlp: Option<&str>, node_id: u64) -> anyhow::Result<Telemetry> {
    let resource = Resource::builder()
        .with_service_name("mink")
        .with_attribute(KeyValue::new(
            "mink.node_id",
            i64::try_from(node_id).unwrap_or(i64::MAX),
        ))
        .build();
    let scrape = Scrape(Arc::new(ManualReader::builder().build()));
    let mut meters = SdkMeterProvider::builder()
        .with_resource(resource.clone())
        .with_reader(scrape.clone());
    let mut tracer = None;
    if let Some(endpoint) = otlp {
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .with_context(|| format!("OTLP metrics exporter for {endpoint}"))?;
        meters = meters.with_periodic_exporter(metrics);
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .with_context(|| format!("OTLP span exporter for {endpoint}"))?;
        tracer = Some(
            SdkTracerProvider::builder()
                .with_resource(resource)
                .with_batch_exporter(spans)
                .build(),
        );
    }
    let meters = meters.build();
    opentelemetry::global::set_meter_provider(meters.clone());
    // sqlx logs PostgreSQL's notices at INFO: "relation _sqlx_migrations already exists,
    // skipping" on every start.
    let (filter, refused) = log_filter(
        &["MINK_LOG", "RUST_LOG"],
        "info,sqlx::postgres::notice=warn",
    );
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(log_layer());
    match &tracer {
        Some(t) => {
            let layer = tracing_opentelemetry::layer().with_tracer(t.tracer("mink"));
            let _ = registry.with(layer).try_init();
        }
        None => {
            let _ = registry.try_init();
        }
    }
    refused.warn();
    Ok(Telemetry {
        scrape,
        meters,
        tracer,
    })
}

/// Gauges and counters read from a running node when metrics are collected.
pub(crate) fn observe_node(node: &mink_node::Node) {
    let meter = opentelemetry::global::meter_provider().meter("mink-node");
    let n = node.clone();
    let _applied = meter
        .u64_observable_gauge("mink.metadata.applied_index")
        .with_description("The metadata log index this node has applied")
        .with_callback(move |o| o.observe(n.view().applied_index, &[]))
        .build();
    let n = node.clone();
    let _cache = meter
        .u64_observable_counter("s3stream.cache.lookups")
        .with_description("Read cache lookups by cache and result (hit or miss)")
        .with_callback(move |o| {
            for (cache, stats) in n.streams().cache_stats() {
                let hits = stats.hits.load(std::sync::atomic::Ordering::Relaxed);
                let misses = stats.misses.load(std::sync::atomic::Ordering::Relaxed);
                o.observe(
                    hits,
                    &[
                        KeyValue::new("cache", cache),
                        KeyValue::new("result", "hit"),
                    ],
                );
                o.observe(
                    misses,
                    &[
                        KeyValue::new("cache", cache),
                        KeyValue::new("result", "miss"),
                    ],
                );
            }
        })
        .build();
    let n = node.clone();
    let _evicted = meter
        .u64_observable_counter("s3stream.cache.evicted_unread")
        .with_description(
            "Cache entries loaded ahead of their use and evicted before anyone read them",
        )
        .with_callback(move |o| {
            for (cache, stats) in n.streams().cache_stats() {
                let evicted = stats
                    .evicted_unread
                    .load(std::sync::atomic::Ordering::Relaxed);
                o.observe(evicted, &[KeyValue::new("cache", cache)]);
            }
        })
        .build();
    let n = node.clone();
    let _engine = meter
        .u64_observable_counter("s3stream.operations")
        .with_description("Stream engine operations by kind")
        .with_callback(move |o| {
            let s = n.streams().stats();
            let load =
                |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            for (kind, value) in [
                ("append", load(&s.appends)),
                ("flush", load(&s.flushes)),
                ("put", load(&s.puts)),
                ("put_retry", load(&s.put_retries)),
                ("hedged_put", load(&s.hedged_puts)),
                ("commit", load(&s.commits)),
                ("grouped_commit", load(&s.grouped_commits)),
                ("object_read", load(&s.object_reads)),
            ] {
                o.observe(value, &[KeyValue::new("kind", kind)]);
            }
        })
        .build();
    let n = node.clone();
    let _bytes = meter
        .u64_observable_counter("s3stream.appended")
        .with_unit("By")
        .with_description("Bytes appended to streams")
        .with_callback(move |o| {
            o.observe(
                n.streams()
                    .stats()
                    .appended_bytes
                    .load(std::sync::atomic::Ordering::Relaxed),
                &[],
            );
        })
        .build();
}

/// Serves `/metrics` (Prometheus text format) until the process ends.
pub(crate) async fn serve_metrics(
    listener: tokio::net::TcpListener,
    scrape: Scrape,
) -> anyhow::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let scrape = scrape.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    scrape.render(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .await
        .context("the metrics endpoint failed")
}
