//! Table options, named as in Apache Fluss.
//!
//! | option | meaning | default |
//! |---|---|---|
//! | `bucket.num` | buckets per table (per partition when partitioned) | 1 |
//! | `bucket.key` | comma-separated columns whose hash picks a row's bucket; none: batches go round-robin | none (log tables) |
//! | `table.log.ttl` | how long log data is kept (`7d`, `12h`, `30min`, `45s`, `500ms`) | `7d` |
//! | `table.log.format` | `ARROW` (Arrow IPC record batches) | `ARROW` |
//! | `table.log.arrow.compression.type` | `ZSTD` or `NONE` | `ZSTD` |

use std::collections::BTreeMap;
use std::time::Duration;

use crate::codec::Compression;
use crate::{LogError, LogResult};

pub const BUCKET_NUM: &str = "bucket.num";
pub const BUCKET_KEY: &str = "bucket.key";
pub const LOG_TTL: &str = "table.log.ttl";
pub const LOG_FORMAT: &str = "table.log.format";
pub const LOG_COMPRESSION: &str = "table.log.arrow.compression.type";
/// Whether the table is tiered into the lake (`true`/`false`, as in Apache Fluss).
pub const DATALAKE_ENABLED: &str = mink_metadata::OPTION_DATALAKE_ENABLED;
/// The lake format: `iceberg`, the only one.
pub const DATALAKE_FORMAT: &str = "table.datalake.format";
/// How old the lake may get: a round is tiered once the last is this old (default `3min`).
pub const DATALAKE_FRESHNESS: &str = "table.datalake.freshness";

/// The options of a log table, parsed and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableOptions {
    pub bucket_count: u32,
    pub bucket_key: Vec<String>,
    /// `None`: kept forever (`table.log.ttl` = `-1` or `inf`).
    pub log_ttl: Option<Duration>,
    pub compression: Compression,
    /// `Some(freshness)` when the table is tiered into the lake.
    pub lake_freshness: Option<Duration>,
}

impl TableOptions {
    /// Parses `options`; every error names the option and what it accepts.
    pub fn parse(options: &BTreeMap<String, String>) -> LogResult<Self> {
        let invalid = |key: &str, value: &str, accepts: &str| {
            LogError::Invalid(format!("option {key} = {value:?}: expected {accepts}"))
        };
        let bucket_count = match options.get(BUCKET_NUM) {
            None => 1,
            Some(v) => v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=mink_metadata::MAX_BUCKETS).contains(n))
                .ok_or_else(|| {
                    invalid(
                        BUCKET_NUM,
                        v,
                        &format!("an integer from 1 to {}", mink_metadata::MAX_BUCKETS),
                    )
                })?,
        };
        let bucket_key = options
            .get(BUCKET_KEY)
            .map(|v| {
                v.split(',')
                    .map(|c| c.trim().to_string())
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let log_ttl = match options.get(LOG_TTL) {
            None => Some(Duration::from_secs(7 * 24 * 3600)),
            Some(v) => parse_ttl(v).ok_or_else(|| {
                invalid(
                    LOG_TTL,
                    v,
                    "a duration such as 7d, 12h, 30min, 45s or 500ms, or -1",
                )
            })?,
        };
        if let Some(v) = options.get(LOG_FORMAT)
            && !v.eq_ignore_ascii_case("arrow")
        {
            return Err(invalid(LOG_FORMAT, v, "ARROW"));
        }
        let compression = match options.get(LOG_COMPRESSION).map(|v| v.to_ascii_uppercase()) {
            None => Compression::Zstd,
            Some(v) if v == "ZSTD" => Compression::Zstd,
            Some(v) if v == "NONE" => Compression::None,
            Some(v) => return Err(invalid(LOG_COMPRESSION, &v, "ZSTD or NONE")),
        };
        let enabled = match options
            .get(DATALAKE_ENABLED)
            .map(|v| v.trim().to_ascii_lowercase())
        {
            None => false,
            Some(v) if v == "true" => true,
            Some(v) if v == "false" => false,
            Some(v) => return Err(invalid(DATALAKE_ENABLED, &v, "true or false")),
        };
        if let Some(v) = options.get(DATALAKE_FORMAT)
            && !v.trim().eq_ignore_ascii_case("iceberg")
        {
            return Err(invalid(DATALAKE_FORMAT, v, "iceberg"));
        }
        let freshness = match options.get(DATALAKE_FRESHNESS) {
            None => Duration::from_secs(180),
            Some(v) => parse_ttl(v)
                .flatten()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    invalid(DATALAKE_FRESHNESS, v, "a duration such as 3min, 30s or 1h")
                })?,
        };
        Ok(TableOptions {
            bucket_count,
            bucket_key,
            log_ttl,
            compression,
            lake_freshness: enabled.then_some(freshness),
        })
    }
}

/// A duration as Mink's options write them (`30s`, `3min`, `1h`, `7d`): `Some(None)` for
/// "forever" (`-1`, `inf`), `None` for unparsable.
pub fn parse_ttl(v: &str) -> Option<Option<Duration>> {
    let v = v.trim().to_ascii_lowercase();
    if v == "-1" || v == "inf" || v == "infinite" {
        return Some(None);
    }
    let split = v.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = v.split_at(split);
    let n: u64 = number.parse().ok()?;
    let unit_ms: u64 = match unit.trim() {
        "ms" => 1,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        _ => return None,
    };
    Some(Some(Duration::from_millis(n.checked_mul(unit_ms)?)))
}
