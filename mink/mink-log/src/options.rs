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

/// Whether lake maintenance compacts small data files (`true`/`false`, as in Apache Fluss).
pub const DATALAKE_AUTO_COMPACTION: &str = "table.datalake.auto-compaction";
/// A partition's small data files are compacted once it has this many (at least 2).
pub const DATALAKE_COMPACTION_MIN_FILES: &str = "table.datalake.compaction.min-files";
/// Data files smaller than this are compacted (`32mb`, `512kb`, `1gb`, bytes).
pub const DATALAKE_COMPACTION_SMALL_FILE_SIZE: &str = "table.datalake.compaction.small-file-size";
/// Whether lake maintenance expires old snapshots and removes orphan files (as in Fluss).
pub const DATALAKE_AUTO_EXPIRE_SNAPSHOT: &str = "table.datalake.auto-expire-snapshot";
/// How long snapshots, and files no snapshot references, are kept.
pub const DATALAKE_SNAPSHOT_RETENTION: &str = "table.datalake.snapshot.retention";
/// Time between two maintenance runs of the table.
pub const DATALAKE_MAINTENANCE_INTERVAL: &str = "table.datalake.maintenance.interval";

/// How a lake table is maintained (options `table.datalake.auto-compaction`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LakeMaintenance {
    pub compaction: bool,
    pub min_files: usize,
    pub small_file_bytes: u64,
    /// Snapshot expiry and orphan file removal.
    pub expire_snapshots: bool,
    pub snapshot_retention: Duration,
    /// `None`: five freshness periods, at least a minute.
    pub interval: Option<Duration>,
}

impl Default for LakeMaintenance {
    fn default() -> Self {
        LakeMaintenance {
            compaction: true,
            min_files: 8,
            small_file_bytes: 32 << 20,
            expire_snapshots: true,
            snapshot_retention: Duration::from_secs(3600),
            interval: None,
        }
    }
}

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
    pub lake_maintenance: LakeMaintenance,
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
        let flag = |key: &str, default: bool| match options
            .get(key)
            .map(|v| v.trim().to_ascii_lowercase())
        {
            None => Ok(default),
            Some(v) if v == "true" => Ok(true),
            Some(v) if v == "false" => Ok(false),
            Some(v) => Err(invalid(key, &v, "true or false")),
        };
        let duration = |key: &str, default: Duration| match options.get(key) {
            None => Ok(default),
            Some(v) => parse_ttl(v)
                .flatten()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| invalid(key, v, "a duration such as 3min, 30s or 1h")),
        };
        let enabled = flag(DATALAKE_ENABLED, false)?;
        if let Some(v) = options.get(DATALAKE_FORMAT)
            && !v.trim().eq_ignore_ascii_case("iceberg")
        {
            return Err(invalid(DATALAKE_FORMAT, v, "iceberg"));
        }
        let freshness = duration(DATALAKE_FRESHNESS, Duration::from_secs(180))?;
        let defaults = LakeMaintenance::default();
        let lake_maintenance = LakeMaintenance {
            compaction: flag(DATALAKE_AUTO_COMPACTION, defaults.compaction)?,
            min_files: match options.get(DATALAKE_COMPACTION_MIN_FILES) {
                None => defaults.min_files,
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= 2)
                    .ok_or_else(|| {
                        invalid(DATALAKE_COMPACTION_MIN_FILES, v, "an integer of 2 or more")
                    })?,
            },
            small_file_bytes: match options.get(DATALAKE_COMPACTION_SMALL_FILE_SIZE) {
                None => defaults.small_file_bytes,
                Some(v) => parse_size(v).filter(|n| *n > 0).ok_or_else(|| {
                    invalid(
                        DATALAKE_COMPACTION_SMALL_FILE_SIZE,
                        v,
                        "a size such as 32mb, 512kb or 1gb",
                    )
                })?,
            },
            expire_snapshots: flag(DATALAKE_AUTO_EXPIRE_SNAPSHOT, defaults.expire_snapshots)?,
            snapshot_retention: duration(DATALAKE_SNAPSHOT_RETENTION, defaults.snapshot_retention)?,
            interval: match options.get(DATALAKE_MAINTENANCE_INTERVAL) {
                None => None,
                Some(_) => Some(duration(DATALAKE_MAINTENANCE_INTERVAL, Duration::ZERO)?),
            },
        };
        Ok(TableOptions {
            bucket_count,
            bucket_key,
            log_ttl,
            compression,
            lake_freshness: enabled.then_some(freshness),
            lake_maintenance,
        })
    }
}

/// A size as Mink's options write them (`32mb`, `512kb`, `1gb`, `4096`): bytes, `None` for
/// unparsable.
pub fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim().to_ascii_lowercase();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let n: u64 = number.parse().ok()?;
    let unit: u64 = match unit.trim() {
        "" | "b" | "bytes" => 1,
        "k" | "kb" => 1 << 10,
        "m" | "mb" => 1 << 20,
        "g" | "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> LogResult<TableOptions> {
        TableOptions::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn lake_maintenance_options() {
        assert_eq!(
            parse(&[]).unwrap().lake_maintenance,
            LakeMaintenance::default()
        );
        let m = parse(&[
            (DATALAKE_AUTO_COMPACTION, "false"),
            (DATALAKE_COMPACTION_MIN_FILES, "3"),
            (DATALAKE_COMPACTION_SMALL_FILE_SIZE, "512kb"),
            (DATALAKE_AUTO_EXPIRE_SNAPSHOT, "FALSE"),
            (DATALAKE_SNAPSHOT_RETENTION, "2d"),
            (DATALAKE_MAINTENANCE_INTERVAL, "10min"),
        ])
        .unwrap()
        .lake_maintenance;
        assert_eq!(
            m,
            LakeMaintenance {
                compaction: false,
                min_files: 3,
                small_file_bytes: 512 << 10,
                expire_snapshots: false,
                snapshot_retention: Duration::from_secs(2 * 86_400),
                interval: Some(Duration::from_secs(600)),
            }
        );
        for (key, value, says) in [
            (DATALAKE_AUTO_COMPACTION, "yes", "true or false"),
            (
                DATALAKE_COMPACTION_MIN_FILES,
                "1",
                "an integer of 2 or more",
            ),
            (DATALAKE_COMPACTION_SMALL_FILE_SIZE, "32 parsecs", "a size"),
            (DATALAKE_COMPACTION_SMALL_FILE_SIZE, "0", "a size"),
            (DATALAKE_SNAPSHOT_RETENTION, "-1", "a duration"),
            (DATALAKE_MAINTENANCE_INTERVAL, "0s", "a duration"),
        ] {
            let e = parse(&[(key, value)]).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(says), "{key} = {value}: {e}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size(" 32MB "), Some(32 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("mb"), None);
        assert_eq!(parse_size("99999999999999999999gb"), None);
    }
}
