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
//! ```

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
    #[serde(rename = "source", default)]
    pub(crate) sources: Vec<Source>,
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
        if self.sources.is_empty() {
            bail!("no [[source]]: nothing to consume");
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
        Ok(())
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
