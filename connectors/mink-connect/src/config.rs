//! The connector's one TOML file.
//!
//! ```toml
//! name = "orders-in"            # the connector: its consumer group and its state in Mink
//! mink = "127.0.0.1:7171"       # a Mink node (Arrow Flight)
//! batch_records = 5000          # records per write at most (per source partition)
//! batch_ms = 100                # and at most this old
//!
//! [kafka]
//! bootstrap = "broker:9092"
//! config = { "security.protocol" = "plaintext" }   # more librdkafka settings
//!
//! [[source]]
//! topic = "orders"
//! table = "shop.orders"         # database.table; a raw table is created when missing
//! format = "raw"                # raw (key, value, headers, timestamp) or json (a typed table)
//!
//! [[source]]
//! topic = "payments"
//! table = "shop.payments"
//! format = "json"
//! dead_letter = "shop.payments_rejected"   # records that are not rows, with the reason
//!
//! [[sink]]
//! table = "shop.customers"      # a primary-key table's changelog, or a log table's rows
//! topic = "shop.customers"      # created when missing, with `partitions` (default: buckets)
//! tombstones = true             # a null-valued record after each delete (the default)
//! ```
//!
//! `metrics = "127.0.0.1:9464"` serves progress and lag in the Prometheus text format on
//! `/metrics`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, bail};
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    pub(crate) name: String,
    pub(crate) mink: String,
    #[serde(default = "default_batch_records")]
    pub(crate) batch_records: usize,
    #[serde(default = "default_batch_ms")]
    pub(crate) batch_ms: u64,
    pub(crate) kafka: Kafka,
    /// Where `/metrics` is served, if anywhere.
    #[serde(default)]
    pub(crate) metrics: Option<String>,
    #[serde(rename = "source", default)]
    pub(crate) sources: Vec<Source>,
    #[serde(rename = "sink", default)]
    pub(crate) sinks: Vec<Sink>,
}

fn default_batch_records() -> usize {
    5000
}

fn default_batch_ms() -> u64 {
    100
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Kafka {
    pub(crate) bootstrap: String,
    #[serde(default)]
    pub(crate) config: BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Format {
    Raw,
    Json,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Source {
    pub(crate) topic: String,
    pub(crate) table: String,
    pub(crate) format: Format,
    #[serde(default)]
    pub(crate) dead_letter: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Sink {
    pub(crate) table: String,
    pub(crate) topic: String,
    /// Partitions of the topic when the sink creates it (default: the table's bucket count).
    #[serde(default)]
    pub(crate) partitions: Option<i32>,
    /// A record with the key and no value after each delete, so a compacted topic drops the
    /// key (Debezium's `tombstones.on.delete`).
    #[serde(default = "default_tombstones")]
    pub(crate) tombstones: bool,
}

fn default_tombstones() -> bool {
    true
}

/// `database.table` split.
pub(crate) fn table_name(name: &str) -> anyhow::Result<(String, String)> {
    match name.split_once('.') {
        Some((d, t)) if !d.is_empty() && !t.is_empty() && !t.contains('.') => {
            Ok((d.to_string(), t.to_string()))
        }
        _ => bail!("table {name:?}: expected database.table"),
    }
}

impl Config {
    pub(crate) fn load(path: &Path) -> anyhow::Result<Config> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let config: Config =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> anyhow::Result<()> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            bail!(
                "name {:?}: letters, digits, `_` and `-` (it names the consumer group and the state table)",
                self.name
            );
        }
        if self.sources.is_empty() && self.sinks.is_empty() {
            bail!("no [[source]] and no [[sink]]: nothing to do");
        }
        if self.batch_records == 0 {
            bail!("batch_records takes at least 1");
        }
        let mut topics = std::collections::BTreeSet::new();
        for s in &self.sources {
            table_name(&s.table)?;
            if let Some(d) = &s.dead_letter {
                table_name(d)?;
                if s.format == Format::Raw {
                    bail!(
                        "source {}: a raw source stores every record; dead_letter applies to json",
                        s.topic
                    );
                }
            }
            if !topics.insert(&s.topic) {
                bail!("topic {} is named by two sources", s.topic);
            }
        }
        let mut tables = std::collections::BTreeSet::new();
        for s in &self.sinks {
            table_name(&s.table)?;
            if s.topic.is_empty() {
                bail!("sink {}: an empty topic name", s.table);
            }
            if s.partitions.is_some_and(|p| p < 1) {
                bail!("sink {}: partitions takes at least 1", s.table);
            }
            if !tables.insert(&s.table) {
                bail!("table {} is named by two sinks", s.table);
            }
        }
        if let Some(m) = &self.metrics {
            m.parse::<std::net::SocketAddr>()
                .with_context(|| format!("metrics {m:?}: expected host:port"))?;
        }
        Ok(())
    }

    /// The sink state table: each sink bucket's position (the changelog offset up to which
    /// every change is in Kafka).
    pub(crate) fn sink_state_table(&self) -> (String, String) {
        (
            "mink_connect".to_string(),
            format!("{}_sink", self.name.replace('-', "_")),
        )
    }

    /// The state table: each source partition's writer and where its last acknowledged batch
    /// ended.
    pub(crate) fn state_table(&self) -> (String, String) {
        (
            "mink_connect".to_string(),
            format!("{}_state", self.name.replace('-', "_")),
        )
    }

    pub(crate) fn group_id(&self) -> String {
        format!("mink-connect-{}", self.name)
    }

    pub(crate) fn source(&self, topic: &str) -> Option<&Source> {
        self.sources.iter().find(|s| s.topic == topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<Config> {
        let c: Config = toml::from_str(text)?;
        c.check()?;
        Ok(c)
    }

    const HEAD: &str = "name = \"c\"\nmink = \"n:1\"\n[kafka]\nbootstrap = \"b:9092\"\n";

    #[test]
    fn sinks_alone_are_a_connector() {
        let c = parse(&format!(
            "{HEAD}[[sink]]\ntable = \"shop.customers\"\ntopic = \"cdc\"\n"
        ))
        .unwrap();
        assert!(c.sources.is_empty());
        assert!(c.sinks[0].tombstones, "Debezium's default");
        assert_eq!(c.sinks[0].partitions, None);
    }

    #[test]
    fn what_is_refused() {
        for (extra, why) in [
            ("", "nothing to do"),
            (
                "[[sink]]\ntable = \"customers\"\ntopic = \"t\"\n",
                "expected database.table",
            ),
            (
                "[[sink]]\ntable = \"a.b\"\ntopic = \"t\"\npartitions = 0\n",
                "at least 1",
            ),
            (
                "[[sink]]\ntable = \"a.b\"\ntopic = \"t\"\n[[sink]]\ntable = \"a.b\"\ntopic = \"u\"\n",
                "named by two sinks",
            ),
            (
                "metrics = \"nowhere\"\n[[sink]]\ntable = \"a.b\"\ntopic = \"t\"\n",
                "host:port",
            ),
        ] {
            // `metrics` belongs before the tables.
            let text = match extra.strip_prefix("metrics = \"nowhere\"\n") {
                Some(rest) => format!("metrics = \"nowhere\"\n{HEAD}{rest}"),
                None => format!("{HEAD}{extra}"),
            };
            let err = format!("{:#}", parse(&text).err().unwrap());
            assert!(err.contains(why), "{extra}: {err}");
        }
    }
}
