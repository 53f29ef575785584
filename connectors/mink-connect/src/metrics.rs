//! Progress and lag, served in the Prometheus text format on `/metrics` when the config names
//! an address: per source partition the next offset Mink holds, the partition's end in Kafka
//! (from librdkafka's statistics) and the records written; per sink bucket the changelog
//! position whose changes are all in Kafka, the bucket's end and the records produced.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;

/// What one source partition or sink bucket has done.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// Records written (source) or produced (sink).
    records: u64,
    /// The next offset to copy; `None` before it is known.
    position: Option<i64>,
    /// Where the other side ends; `None` before it is known.
    end: Option<i64>,
}

/// A metric family: its name's suffix, its type, its help, its value of a series.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Progress) -> Option<i64>,
);

/// Labels of a series, rendered in order.
type Labels = Vec<(&'static str, String)>;

/// The connector's metrics (cheap to share).
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    sources: Mutex<BTreeMap<(String, i32), Progress>>,
    sinks: Mutex<BTreeMap<(String, String, u32), Progress>>,
}

impl Metrics {
    /// A source partition wrote `records` and now resumes at `next`.
    pub(crate) fn source_written(&self, topic: &str, partition: i32, records: u64, next: i64) {
        let mut s = self.sources.lock().expect("metrics lock");
        let p = s.entry((topic.to_string(), partition)).or_default();
        p.records += records;
        p.position = Some(next);
    }

    /// A source partition resumes at `next` (read from Mink). Logged: from now on its lag is
    /// shown once its end is known.
    pub(crate) fn source_position(&self, topic: &str, partition: i32, next: i64) {
        tracing::info!(%topic, partition, position = next, "position read from Mink");
        let mut s = self.sources.lock().expect("metrics lock");
        s.entry((topic.to_string(), partition))
            .or_default()
            .position = Some(next);
    }

    /// Source partitions whose end is known and whose position is not.
    pub(crate) fn sources_without_position(&self) -> Vec<(String, i32)> {
        let s = self.sources.lock().expect("metrics lock");
        s.iter()
            .filter(|(_, p)| p.position.is_none() && p.end.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// A source partition's end in Kafka (its high watermark).
    pub(crate) fn source_end(&self, topic: &str, partition: i32, end: i64) {
        let mut s = self.sources.lock().expect("metrics lock");
        if s.entry((topic.to_string(), partition))
            .or_default()
            .end
            .replace(end)
            .is_none()
        {
            tracing::info!(%topic, partition, end, "end known");
        }
    }

    /// A sink bucket produced `records` and every change below `position` is in Kafka.
    pub(crate) fn sink_produced(
        &self,
        table: &str,
        partition: Option<&str>,
        bucket: u32,
        records: u64,
        position: i64,
    ) {
        let mut s = self.sinks.lock().expect("metrics lock");
        let p = s
            .entry((
                table.to_string(),
                partition.unwrap_or_default().to_string(),
                bucket,
            ))
            .or_default();
        p.records += records;
        p.position = Some(position);
    }

    /// A sink bucket's end (its high watermark).
    pub(crate) fn sink_end(&self, table: &str, partition: Option<&str>, bucket: u32, end: i64) {
        let mut s = self.sinks.lock().expect("metrics lock");
        s.entry((
            table.to_string(),
            partition.unwrap_or_default().to_string(),
            bucket,
        ))
        .or_default()
        .end = Some(end);
    }

    /// The metrics in the Prometheus text exposition format.
    pub(crate) fn render(&self) -> String {
        let sources: Vec<(Labels, Progress)> = self
            .sources
            .lock()
            .expect("metrics lock")
            .iter()
            .map(|((t, p), v)| (vec![("topic", t.clone()), ("partition", p.to_string())], *v))
            .collect();
        let sinks: Vec<(Labels, Progress)> = self
            .sinks
            .lock()
            .expect("metrics lock")
            .iter()
            .map(|((t, p, b), v)| {
                (
                    vec![
                        ("table", t.clone()),
                        ("partition", p.clone()),
                        ("bucket", b.to_string()),
                    ],
                    *v,
                )
            })
            .collect();
        let mut out = String::new();
        for (side, series, what) in [
            ("source", &sources, "records written into Mink"),
            ("sink", &sinks, "records produced to Kafka"),
        ] {
            let families: [Family; 4] = [
                ("records_total", "counter", what, |p| {
                    Some(i64::try_from(p.records).unwrap_or(i64::MAX))
                }),
                ("position", "gauge", "the next offset to copy", |p| {
                    p.position
                }),
                ("end_offset", "gauge", "where the copied log ends", |p| {
                    p.end
                }),
                (
                    "lag",
                    "gauge",
                    "records between the position and the end",
                    |p| Some((p.end? - p.position?).max(0)),
                ),
            ];
            for (name, kind, help, value) in families {
                let name = format!("mink_connect_{side}_{name}");
                let _ = writeln!(out, "# HELP {name} {side}: {help}");
                let _ = writeln!(out, "# TYPE {name} {kind}");
                for (labels, p) in series.iter() {
                    if let Some(v) = value(p) {
                        let labels: Vec<String> = labels
                            .iter()
                            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                            .collect();
                        let _ = writeln!(out, "{name}{{{}}} {v}", labels.join(","));
                    }
                }
            }
        }
        out
    }
}

/// A label value escaped as the text format requires.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves `/metrics` on `address` until the process ends.
pub(crate) async fn serve(address: String, metrics: Arc<Metrics>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("metrics: listening on {address}"))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    metrics.render(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .await
        .context("the metrics endpoint failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_renders_as_prometheus_text() {
        let m = Metrics::default();
        m.source_written("orders", 2, 100, 100);
        m.source_written("orders", 2, 50, 150);
        m.sink_end("shop.t", Some("2026\"x"), 0, 40);
        m.sink_produced("shop.t", Some("2026\"x"), 0, 7, 30);
        let text = m.render();
        for line in [
            "# TYPE mink_connect_source_records_total counter",
            "mink_connect_source_records_total{topic=\"orders\",partition=\"2\"} 150",
            "mink_connect_source_position{topic=\"orders\",partition=\"2\"} 150",
            "mink_connect_sink_lag{table=\"shop.t\",partition=\"2026\\\"x\",bucket=\"0\"} 10",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} in:\n{text}");
        }
        // No end known yet: no lag rather than a wrong one.
        assert!(!text.contains("mink_connect_source_lag{"), "{text}");
        // An end and no position (a partition not copied since a restart): no lag either.
        m.source_end("orders", 5, 7000);
        assert!(
            !m.render()
                .contains("mink_connect_source_lag{topic=\"orders\",partition=\"5\"}")
        );
        assert_eq!(m.sources_without_position(), [("orders".to_string(), 5)]);
        m.source_position("orders", 5, 7000);
        assert!(
            m.render()
                .contains("mink_connect_source_lag{topic=\"orders\",partition=\"5\"} 0\n")
        );
        m.source_end("orders", 2, 160);
        assert!(
            m.render()
                .contains("mink_connect_source_lag{topic=\"orders\",partition=\"2\"} 10\n")
        );
    }
}
