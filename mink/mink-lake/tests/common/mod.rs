//! Helpers the lake tests share: log rows and rounds, the lake's rows, and the suite's
//! services (PostgreSQL, S3 on moto, the Python readers).

#![allow(dead_code, clippy::print_stderr)]

use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema as ArrowSchema};
use mink_lake::Lake;
use mink_lake::tier::{BucketRound, LogRows};

pub(crate) fn columns() -> ArrowSchema {
    ArrowSchema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
    ])
}

/// Log batches of `bucket` covering offsets `from..to`, 10 rows each; user ids are
/// `bucket * 1000 + offset`.
pub(crate) fn log(bucket: u32, from: u64, to: u64) -> Vec<LogRows> {
    (from..to)
        .step_by(10)
        .map(|base| {
            let ids: Vec<i64> = (base..(base + 10).min(to))
                .map(|o| i64::from(bucket) * 1000 + o as i64)
                .collect();
            let events: Vec<String> = ids.iter().map(|i| format!("e{i}")).collect();
            LogRows {
                base_offset: base,
                timestamp_us: 1_700_000_000_000_000 + base as i64,
                rows: RecordBatch::try_new(
                    Arc::new(columns()),
                    vec![
                        Arc::new(Int64Array::from(ids)),
                        Arc::new(StringArray::from(events)),
                    ],
                )
                .unwrap(),
            }
        })
        .collect()
}

pub(crate) fn round(bucket: u32, from: u64, to: u64) -> BucketRound {
    BucketRound {
        partition_id: 0,
        bucket,
        start_offset: from,
        end_offset: to,
        batches: log(bucket, from, to),
    }
}

/// `(bucket, offset, user_id)` of every lake row, sorted.
pub(crate) async fn lake_rows(lake: &Lake) -> Vec<(i32, i64, i64)> {
    let batches = lake.scan("app", "events").await.unwrap();
    let mut rows = Vec::new();
    for b in batches {
        let bucket = b
            .column_by_name("__bucket")
            .unwrap()
            .as_primitive::<Int32Type>();
        let offset = b
            .column_by_name("__offset")
            .unwrap()
            .as_primitive::<Int64Type>();
        let id = b
            .column_by_name("user_id")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert_eq!(b.column_by_name("__timestamp").unwrap().null_count(), 0);
        for i in 0..b.num_rows() {
            rows.push((bucket.value(i), offset.value(i), id.value(i)));
        }
    }
    rows.sort_unstable();
    rows
}

pub(crate) fn expected(ranges: &[(u32, u64, u64)]) -> Vec<(i32, i64, i64)> {
    let mut rows: Vec<_> = ranges
        .iter()
        .flat_map(|&(b, from, to)| {
            (from..to).map(move |o| (b as i32, o as i64, i64::from(b) * 1000 + o as i64))
        })
        .collect();
    rows.sort_unstable();
    rows
}

pub(crate) fn postgres_url() -> Option<String> {
    match std::env::var("MINK_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "CI=true but MINK_TEST_POSTGRES_URL is not set: run the suite with scripts/test.sh"
            )
        }
        _ => None,
    }
}

/// A fresh PostgreSQL database on the suite's server.
pub(crate) async fn fresh_postgres(base: &str, name: &str) -> String {
    use sqlx::Executor as _;
    let pool = sqlx::PgPool::connect(base).await.unwrap();
    let database = format!("lake_{name}_{}", std::process::id());
    pool.execute(format!("DROP DATABASE IF EXISTS {database}").as_str())
        .await
        .unwrap();
    pool.execute(format!("CREATE DATABASE {database}").as_str())
        .await
        .unwrap();
    let (server, _) = base.rsplit_once('/').unwrap();
    format!("{server}/{database}")
}

/// The test virtualenv's Python with pyiceberg (`scripts/test.sh` installs it).
pub(crate) fn python() -> Option<std::path::PathBuf> {
    let venv = std::env::var("MINK_VENV").map_or_else(
        |_| std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/mink/venv"),
        std::path::PathBuf::from,
    );
    let python = venv.join("bin/python");
    let ok = std::process::Command::new(&python)
        .args(["-c", "import pyiceberg.catalog.sql, duckdb"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but pyiceberg or duckdb is not installed in {} (scripts/test.sh installs them)",
        venv.display()
    );
    eprintln!("skipped: no pyiceberg in {}", venv.display());
    None
}

/// What pyiceberg sees of lake table `app.<table>` (tests/pyiceberg_read.py), through the SQL
/// catalog in the SQLite file `db`.
pub(crate) fn pyiceberg_read(
    interpreter: &std::path::Path,
    db: &std::path::Path,
    lake: &Lake,
    table: &str,
) -> serde_json::Value {
    let out = std::process::Command::new(interpreter)
        .arg(manifest_dir().join("tests/pyiceberg_read.py"))
        .arg(format!("sqlite:///{}", db.display()))
        .arg(lake.warehouse())
        .args(["app", table])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pyiceberg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The bucket and a fresh prefix's object store URL on the suite's S3 server (moto), or `None`
/// outside the suite.
pub(crate) fn s3_url() -> Option<(String, String)> {
    let (endpoint, bucket) = match (
        std::env::var("MINK_TEST_S3_ENDPOINT"),
        std::env::var("MINK_TEST_S3_BUCKET"),
    ) {
        (Ok(e), Ok(b)) if !e.is_empty() => (e, b),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but MINK_TEST_S3_ENDPOINT is not set: run scripts/test.sh")
        }
        _ => return None,
    };
    let url = format!(
        "s3://{bucket}/lake-{:016x}?endpoint={endpoint}&allow_http=true&region=us-east-1\
         &access_key_id=test&secret_access_key=test&virtual_hosted_style_request=false",
        rand::random::<u64>()
    );
    Some((bucket, url))
}

/// What DuckDB's iceberg extension sees of the table whose metadata file is at `metadata`
/// (tests/duckdb_read.py).
pub(crate) fn duckdb_read(interpreter: &std::path::Path, metadata: &str) -> serde_json::Value {
    let out = std::process::Command::new(interpreter)
        .arg(manifest_dir().join("tests/duckdb_read.py"))
        .arg(metadata.trim_start_matches("file://"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "duckdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// pyiceberg (through the catalog in the SQLite file `db`) and DuckDB (from the metadata file)
/// read exactly `offsets` (sorted) from lake table `app.<table>`; nothing outside the suite.
pub(crate) async fn outside_readers_see(
    l: &Lake,
    db: &std::path::Path,
    table: &str,
    offsets: &[i64],
) {
    let Some(interpreter) = python() else { return };
    let seen = pyiceberg_read(&interpreter, db, l, table);
    assert_eq!(
        seen["offsets"],
        serde_json::json!(offsets),
        "pyiceberg: {seen}"
    );
    let t = l.load_table("app", table).await.unwrap();
    let seen = duckdb_read(&interpreter, t.metadata_location().unwrap());
    assert_eq!(
        seen["offsets"],
        serde_json::json!(offsets),
        "duckdb: {seen}"
    );
}

/// This package's directory, at run time: a shared target directory may hold a binary built
/// from another checkout.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        std::path::PathBuf::from,
    )
}
