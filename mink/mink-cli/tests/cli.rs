//! The `mink` binary: `mink dev`, the admin and data commands, the metrics endpoint, a real
//! pyarrow.flight client, and a node killed with SIGKILL under a load of idempotent writers.
#![allow(clippy::print_stderr, clippy::cast_possible_truncation)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::Int64Type;
use mink_client::{Client, ClientConfig, Scan};

use crate::common::{
    Dev, MINK, exits_within, free_port, http_get, manifest_dir, python, rows, spawn_load,
    spawn_printing,
};

#[test]
fn dev_serves_admin_produce_scan_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let out = dev.run(
        &[
            "table",
            "create",
            "app.events",
            "-c",
            "id Int64 not null",
            "-c",
            "msg:Utf8",
            "--bucket-num",
            "2",
            "--bucket-key",
            "id",
            "-o",
            "table.log.ttl=3d",
        ],
        None,
    );
    assert!(
        out.contains("created table app.events") && out.contains("table.log.ttl = 3d"),
        "{out}"
    );
    assert!(
        dev.run(
            &["produce", "app.events"],
            Some("{\"id\": 1, \"msg\": \"a\"}\n{\"id\": 2}\n")
        )
        .contains("wrote 2 rows")
    );
    let csv = dir.path().join("in.csv");
    std::fs::write(&csv, "id,msg\n3,c\n4,d\n").unwrap();
    assert!(
        dev.run(&["produce", "app.events", csv.to_str().unwrap()], None)
            .contains("wrote 2 rows")
    );
    let out = dev.run(&["scan", "app.events", "--format", "csv"], None);
    let mut lines: Vec<&str> = out.lines().skip(1).collect();
    lines.sort_unstable();
    assert_eq!(lines, ["1,a", "2,", "3,c", "4,d"], "{out}");
    // Parquet out and back in.
    let pq = dir.path().join("out.parquet");
    dev.run(
        &[
            "scan",
            "app.events",
            "-f",
            "parquet",
            "-o",
            pq.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        dev.run(&["produce", "app.events", pq.to_str().unwrap()], None)
            .contains("wrote 4 rows")
    );
    let filtered = dev.run(
        &[
            "scan",
            "app.events",
            "--columns",
            "msg",
            "--where",
            "id >= 2",
            "--where",
            "msg in ('a', 'c', 'd')",
            "-f",
            "csv",
        ],
        None,
    );
    let mut lines: Vec<&str> = filtered.lines().skip(1).collect();
    lines.sort_unstable();
    assert_eq!(lines, ["c", "c", "d", "d"], "{filtered}");
    let (ok, _, err) = dev.try_run(&["scan", "app.events", "--where", "nope > 1"], None);
    assert!(
        !ok && err.contains("filter on \"nope\": no such column"),
        "{err}"
    );
    let table = dev.run(
        &["scan", "app.events", "--columns", "msg", "--limit", "3"],
        None,
    );
    assert!(
        table.contains("| msg") && table.contains("3 rows"),
        "{table}"
    );
    let json = dev.run(&["table", "describe", "app.events", "--json"], None);
    let d: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        d["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["end_offset"].as_u64().unwrap())
            .sum::<u64>(),
        8
    );
    let status = dev.run(&["cluster", "status"], None);
    assert!(
        status.contains("lease holder: node 1 (coordinator epoch")
            && status.contains(": live, heartbeat")
            && status.contains("leads 2 buckets"),
        "{status}"
    );
    let plan = dev.run(&["cluster", "rebalance", "--dry-run"], None);
    assert_eq!(plan, "would move 0 buckets\n");
    // Errors say what is wrong and exit non-zero.
    let (ok, _, err) = dev.try_run(&["produce", "app.events"], Some("{\"msg\": \"no id\"}\n"));
    assert!(!ok && err.contains("not nullable"), "{err}");
    let (ok, _, err) = dev.try_run(&["scan", "app.nope"], None);
    assert!(!ok && err.contains("does not exist"), "{err}");
    // Input is taken by name, exactly, or refused: a CSV header in another order than the
    // table's, a header or JSON key that names no column, a fraction for an integer column.
    let swapped = dir.path().join("swapped.csv");
    std::fs::write(&swapped, "msg,id\ne,5\n").unwrap();
    dev.run(&["produce", "app.events", swapped.to_str().unwrap()], None);
    let out = dev.run(
        &["scan", "app.events", "--where", "id = 5", "-f", "csv"],
        None,
    );
    assert_eq!(out, "id,msg\n5,e\n");
    for (format, input, needle) in [
        ("csv", "id,body\n6,x\n", "the CSV header names \"body\""),
        ("json", "{\"id\": 6, \"body\": \"x\"}\n", "body"),
        (
            "json",
            "{\"id\": 6}\n{\"id\": 1.5}\n",
            "line 2: column \"id\": 1.5 is not exactly a value of its type Int64",
        ),
    ] {
        let (ok, _, err) = dev.try_run(&["produce", "app.events", "-f", format], Some(input));
        assert!(!ok && err.contains(needle), "{input}: {err}");
    }
    // A Parquet or CSV value the table's column cannot hold exactly is refused, not stored
    // as null (a value that does not fit) or truncated (1.9 into an integer).
    let wide = [
        "-c",
        "id Int64 not null",
        "-c",
        "v Float64",
        "-c",
        "big Int64",
    ];
    let narrow = [
        "-c",
        "id Int64 not null",
        "-c",
        "v Int32",
        "-c",
        "big Int32",
    ];
    dev.run(
        &[&["table", "create", "app.wide"][..], &wide].concat(),
        None,
    );
    dev.run(
        &[&["table", "create", "app.narrow"][..], &narrow].concat(),
        None,
    );
    let pq = dir.path().join("wide.parquet");
    for (row, needle) in [
        (
            "{\"id\": 1, \"v\": 1.9, \"big\": 7}\n",
            "column \"v\": 1.9 (row 0 of the batch) is not exactly a value of its type Int32",
        ),
        (
            "{\"id\": 2, \"v\": 2.0, \"big\": 30000000000}\n",
            "column \"big\": cannot cast Int64 to Int32",
        ),
    ] {
        dev.run(&["produce", "app.wide"], Some(row));
        let id = if row.contains("\"id\": 1") { "1" } else { "2" };
        let only = format!("id = {id}");
        dev.run(
            &[
                "scan",
                "app.wide",
                "--where",
                &only,
                "-f",
                "parquet",
                "-o",
                pq.to_str().unwrap(),
            ],
            None,
        );
        let (ok, _, err) = dev.try_run(&["produce", "app.narrow", pq.to_str().unwrap()], None);
        assert!(!ok && err.contains(needle), "{row}: {err}");
    }
    let (ok, _, err) = dev.try_run(
        &["produce", "app.narrow", "-f", "csv"],
        Some("id,v,big\n3,3,30000000000\n"),
    );
    assert!(!ok && err.contains("30000000000"), "{err}");
    let kept = dev.run(&["scan", "app.narrow", "-f", "csv"], None);
    assert_eq!(kept, "", "nothing of a refused input is stored");
    let (ok, _, err) = dev.try_run(
        &["produce", "app.events", "--delete"],
        Some("{\"id\": 1}\n"),
    );
    assert!(!ok && err.contains("app.events is a log table"), "{err}");
    // A short CSV record is an error each time (arrow-csv was read past its first error, and
    // aborted the process in 3 runs of 6).
    for _ in 0..6 {
        let (ok, _, err) =
            dev.try_run(&["produce", "app.events", "-f", "csv"], Some("id,msg\n7\n"));
        assert!(
            !ok && err.contains("incorrect number of fields") && !err.contains("panicked"),
            "{err}"
        );
    }
    let stored = dev.run(
        &["scan", "app.events", "--where", "id >= 6", "-f", "csv"],
        None,
    );
    assert_eq!(stored, "", "nothing of the refused input is stored");
    let (ok, _, err) = dev.try_run(&["--server", "127.0.0.1:1", "database", "list"], None);
    assert!(!ok && err.contains("mink dev"), "{err}");
    // Another of the node's ports: the error says which kind of port it might be.
    let metrics = dev
        .metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    for (port, needle) in [
        (dev.kafka.as_str(), "a node's Kafka port"),
        (dev.sql.as_str(), "Flight SQL's port?"),
        (metrics, "its metrics port?"),
    ] {
        let (ok, _, err) = dev.try_run(&["--server", port, "database", "list"], None);
        assert!(
            !ok && err.contains(needle) && err.contains("give the node's Flight address"),
            "{port}: {err}"
        );
    }
    // A Kafka request, as a client's first: ApiVersions v0 (header v1, no client id).
    {
        use std::io::{Read as _, Write as _};
        let mut kafka = std::net::TcpStream::connect(&dev.kafka).unwrap();
        let body: [u8; 10] = [0, 18, 0, 0, 0, 0, 0, 7, 0xff, 0xff];
        kafka.write_all(&10i32.to_be_bytes()).unwrap();
        kafka.write_all(&body).unwrap();
        let mut size = [0u8; 4];
        kafka.read_exact(&mut size).unwrap();
        let mut answer = vec![0u8; usize::try_from(i32::from_be_bytes(size)).unwrap()];
        kafka.read_exact(&mut answer).unwrap();
        assert_eq!(
            answer[..4],
            7i32.to_be_bytes(),
            "the correlation id comes back"
        );
    }
    // Metrics: Flight and Kafka calls, s3stream latency, the applied index.
    let metrics = http_get(&dev.metrics);
    // Its log goes to a file here: plain text, no terminal colour codes.
    let log = std::fs::read_to_string(dir.path().join("data.log")).unwrap();
    assert!(log.contains("node started"), "{log}");
    assert!(!log.contains('\x1b'), "colour codes in a log file:\n{log}");
    for name in [
        "mink_flight_requests_total",
        "mink_kafka_requests_total{api=\"ApiVersions\"",
        "mink_kafka_bytes_total{direction=\"in\"",
        "mink_kafka_connections_total",
        "s3stream_flush_commit_duration_seconds_bucket",
        "mink_metadata_applied_index",
        "s3stream_cache_lookups_total",
        "s3stream_cache_evicted_unread_total",
        "kind=\"grouped_commit\"",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
}

/// Runs `tests/<script>` with the test virtualenv's Python against a new `mink dev` node.
/// A client command whose stdout closes before it prints (`mink scan | true`) ends as `ls |
/// head` does: exit status 0, nothing on stderr, for each way the CLI prints.
#[test]
fn a_closed_stdout_ends_client_commands_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    dev.run(
        &[
            "table",
            "create",
            "app.kv",
            "-c",
            "id Int64 not null",
            "-c",
            "msg Utf8",
            "--primary-key",
            "id",
        ],
        None,
    );
    dev.run(
        &["produce", "app.kv"],
        Some("{\"id\": 1, \"msg\": \"a\"}\n"),
    );
    let commands: &[&[&str]] = &[
        &["scan", "app.kv"],
        &["scan", "app.kv", "--format", "csv"],
        &["scan", "app.kv", "--format", "json"],
        &["lookup", "app.kv", "{\"id\": 1}"],
        &["cluster", "status"],
        &["cluster", "rebalance", "--dry-run"],
        &["table", "describe", "app.kv"],
        &["table", "list", "app"],
        &["database", "list"],
    ];
    for args in commands {
        // The reading end is gone before the command starts: every write to stdout fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(MINK)
            .args(["--server", &dev.flight])
            .args(*args)
            .stdin(std::process::Stdio::null())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "mink {args:?} into a closed pipe: {:?}, stderr: {stderr}",
            out.status
        );
    }
    // A snapshot's rows have no offsets; the changelog's do.
    let (ok, _, err) = dev.try_run(&["scan", "app.kv", "--with-offsets"], None);
    assert!(!ok && err.contains("add --changelog"), "{err}");
    let out = dev.run(
        &[
            "scan",
            "app.kv",
            "--changelog",
            "--with-offsets",
            "-f",
            "csv",
        ],
        None,
    );
    assert!(out.contains("_offset") && out.contains(",0,"), "{out}");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(MINK)
        .args(["--server", &dev.flight, "produce", "app.kv"])
        .stdin(std::process::Stdio::piped())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"{\"id\": 2, \"msg\": \"b\"}\n")?;
            child.wait_with_output()
        })
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "produce: {stderr}"
    );
}

/// A server address without a port is a usage error that names the expected form; nothing
/// is connected to.
#[test]
fn a_server_without_a_port_is_a_usage_error() {
    for server in [
        "localhost",
        "grpc://localhost",
        "localhost:port",
        "ftp://127.0.0.1:7171",
        "https://127.0.0.1:7171",
    ] {
        let out = Command::new(MINK)
            .args(["--server", server, "database", "list"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(2)
                && stderr.contains(&format!("invalid value '{server}' for '--server <SERVER>'"))
                && (stderr.contains("expected HOST:PORT") || stderr.contains("not TLS")),
            "{server}: {:?} {stderr}",
            out.status
        );
    }
    // A port past 65535 is said to be out of range; an empty --server (a variable that
    // expanded to nothing) is a usage error, not the default address.
    for (server, says) in [
        (
            "127.0.0.1:99999",
            "port 99999 is out of range: a port is 1 to 65535",
        ),
        (
            "",
            "invalid value '' for '--server <SERVER>': expected HOST:PORT",
        ),
    ] {
        let out = Command::new(MINK)
            .args(["--server", server, "database", "list"])
            .env("MINK_SERVER", "127.0.0.1:1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(2) && stderr.contains(says),
            "{server:?}: {:?} {stderr}",
            out.status
        );
    }
    // A name that does not resolve is said to be one, and a node elsewhere than this machine
    // is not one `mink dev` would start.
    let out = Command::new(MINK)
        .args(["--server", "nosuchhost.invalid:7171", "database", "list"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1)
            && stderr.contains("The host name \"nosuchhost.invalid\" does not resolve"),
        "{:?} {stderr}",
        out.status
    );
    // A log filter that is no filter is said, not ignored.
    let out = Command::new(MINK)
        .args(["--server", "127.0.0.1:1", "database", "list"])
        .env("MINK_LOG", "nonsense=[[")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("MINK_LOG=\"nonsense=[[\" is not a log filter"),
        "{stderr}"
    );
    // Set and empty reads as unset: the default node, not a usage error.
    let out = Command::new(MINK)
        .args(["database", "list"])
        .env("MINK_SERVER", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || (out.status.code() == Some(1) && stderr.contains("127.0.0.1:7171")),
        "MINK_SERVER='': {:?} {stderr}",
        out.status
    );
}

fn run_pyarrow_script(script: &str) {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let out = Command::new(python)
        .arg(manifest_dir().join("tests").join(script))
        .arg(&dev.flight)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mink dev` serves SQL: DDL, writes, the system tables, and a lake table whose snapshot the
/// engine reads from object storage itself (ADBC Flight SQL driver).
#[test]
fn dev_serves_sql_over_its_tables_and_lake() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let ready = Command::new(&python)
        .args(["-c", "import adbc_driver_flightsql"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but the ADBC Flight SQL driver is not installed (scripts/test.sh installs it)"
        );
        return;
    }
    let out = Command::new(python)
        .arg(manifest_dir().join("tests").join("adbc_dev_sql.py"))
        .arg(format!("grpc://{}", dev.sql))
        .arg(&dev.flight)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "adbc_dev_sql.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mink dev` serves Kafka: a kafka-python producer's records are rows of table
/// `kafka.<topic>`, which the CLI scans over Flight; and rows the CLI writes over Flight to a
/// typed table are fetched by a Kafka consumer as JSON objects. A topic a producer first names
/// is created with one partition, as by a Kafka broker's defaults, unless
/// `--kafka-auto-create-partitions 0` turns that off.
#[test]
fn dev_serves_kafka_into_the_same_tables() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let script = r#"
import sys
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
admin = KafkaAdminClient(bootstrap_servers=sys.argv[1])
admin.create_topics([NewTopic("events", num_partitions=1, replication_factor=1)])
p = KafkaProducer(bootstrap_servers=sys.argv[1], enable_idempotence=False)
for i in range(3):
    p.send("events", key=b"k", value=f"hello-{i}".encode()).get(timeout=30)
p.send("first-use", value=b"x").get(timeout=30)
p.close()
print("ok")
"#;
    let out = Command::new(&python)
        .args(["-c", script, &dev.kafka])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Kafka producer failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let described = dev.run(&["table", "describe", "kafka.events"], None);
    assert!(described.contains("timestamp"), "{described}");
    let described = dev.run(&["table", "describe", "kafka.first-use"], None);
    assert!(described.contains("buckets: 1"), "{described}");
    // Binary columns print as hex in CSV: "hello-0" is 68656c6c6f2d30.
    let scanned = dev.run(
        &[
            "scan",
            "kafka.events",
            "--columns",
            "value",
            "--format",
            "csv",
        ],
        None,
    );
    // "hello-0".. "hello-2" in hex.
    let mut values: Vec<&str> = scanned.lines().skip(1).collect();
    values.sort_unstable();
    assert_eq!(
        values,
        ["68656c6c6f2d30", "68656c6c6f2d31", "68656c6c6f2d32"],
        "{scanned}"
    );
    // Flight writes to a typed table, fetched over Kafka as JSON.
    dev.run(
        &[
            "table",
            "create",
            "kafka.people",
            "-c",
            "id Int64 not null",
            "-c",
            "name Utf8",
        ],
        None,
    );
    let wrote = dev.run(
        &["produce", "kafka.people"],
        Some("{\"id\": 1, \"name\": \"ada\"}\n{\"id\": 2}\n"),
    );
    assert!(wrote.contains("wrote 2 rows"), "{wrote}");
    let script = r#"
import json, sys
from kafka import KafkaConsumer, TopicPartition
c = KafkaConsumer(bootstrap_servers=sys.argv[1], enable_auto_commit=False, consumer_timeout_ms=30000)
tp = TopicPartition("people", 0)
c.assign([tp])
c.seek_to_beginning(tp)
rows = []
for m in c:
    rows.append(json.loads(m.value))
    if len(rows) == 2:
        break
assert rows == [{"id": 1, "name": "ada"}, {"id": 2}], rows  # nulls left out (docs/kafka.md)
print("ok")
"#;
    let out = Command::new(python)
        .args(["-c", script, &dev.kafka])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Kafka consumer failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--kafka-auto-create-partitions 0` turns `mink dev`'s topic creation on first use off: a
/// producer naming a topic that does not exist gets no metadata for it, and no table appears.
#[test]
fn dev_creates_no_topics_when_told_not_to() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--kafka-auto-create-partitions", "0"],
    );
    let script = r#"
import sys
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError
p = KafkaProducer(bootstrap_servers=sys.argv[1], enable_idempotence=False, max_block_ms=2000)
try:
    p.send("nope", value=b"x").get(timeout=5)
    print("stored")
except KafkaTimeoutError:
    print("no topic")
"#;
    let out = Command::new(&python)
        .args(["-c", script, &dev.kafka])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("no topic"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, _, err) = dev.try_run(&["table", "describe", "kafka.nope"], None);
    assert!(!ok && err.contains("does not exist"), "{err}");
}

/// An idempotent librdkafka producer across a SIGKILL of the node and its restart on the same
/// address (tests/kafka_crash_producer.py), its retry forced: a proxy in front of the listener
/// (advertised with `--kafka-advertised-address`) holds back the answer to a Produce the node
/// stored, the node is killed and restarted, and then the proxy closes the producer's
/// connection. The producer retries that batch with the same sequence numbers; the restarted
/// node knows it from the producer state committed with the data, and answers with its offsets
/// instead of storing it again. Every record is acknowledged, and each is stored once.
#[test]
fn an_idempotent_producer_stores_each_record_once_across_a_sigkill() {
    use std::io::BufRead as _;
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let kafka = free_port();
    let proxy = HoldingProxy::start(&kafka);
    let advertised = ["--kafka-advertised-address", proxy.address.as_str()];
    let dev = Dev::start_on(&data, "127.0.0.1:0", &kafka, &advertised);
    let n = 3000;
    let mut producer = Command::new(python)
        .arg(manifest_dir().join("tests/kafka_crash_producer.py"))
        .args([&proxy.address, &n.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = producer.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map(Result::unwrap_or_default)
            .collect::<Vec<_>>()
    });
    proxy.wait_held(Duration::from_secs(60));
    dev.kill();
    let dev = Dev::start_on(&data, "127.0.0.1:0", &kafka, &advertised);
    proxy.release();
    let out = producer.wait_with_output().unwrap();
    let lines = lines.join().unwrap();
    assert!(
        out.status.success() && lines.last().is_some_and(|l| l == "done"),
        "the producer failed across the kill:\n{}\n{}",
        lines.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    // Binary columns print as hex in CSV.
    let scanned = dev.run(
        &["scan", "kafka.t", "--columns", "value", "--format", "csv"],
        None,
    );
    let mut values: Vec<&str> = scanned.lines().skip(1).collect();
    values.sort_unstable();
    let stored = values.len();
    values.dedup();
    assert_eq!(
        (stored, values.len()),
        (n, n),
        "(rows stored, distinct) against the {n} records produced"
    );
}

/// A proxy to a Kafka listener that holds back the first answer to a Produce request: it reads
/// it from the node and passes nothing more on that connection until [`HoldingProxy::release`]
/// closes it. Other answers pass; a connection whose node went away is closed.
struct HoldingProxy {
    address: String,
    /// (a Produce answer is held, released)
    hold: Arc<(Mutex<(bool, bool)>, std::sync::Condvar)>,
}

impl HoldingProxy {
    fn start(upstream: &str) -> HoldingProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let hold = Arc::new((Mutex::new((false, false)), std::sync::Condvar::new()));
        let upstream = upstream.to_string();
        let held = Arc::clone(&hold);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                match std::net::TcpStream::connect(&upstream) {
                    Ok(server) => proxy_connection(client, server, Arc::clone(&held)),
                    Err(_) => drop(client), // the node is down: the client reconnects
                }
            }
        });
        HoldingProxy { address, hold }
    }

    /// Returns once a Produce answer is held back; panics after `timeout`.
    fn wait_held(&self, timeout: Duration) {
        let (lock, changed) = &*self.hold;
        let state = lock.lock().unwrap();
        let (state, waited) = changed
            .wait_timeout_while(state, timeout, |s| !s.0)
            .unwrap();
        assert!(
            state.0 && !waited.timed_out(),
            "no Produce answer passed the proxy within {timeout:?}"
        );
    }

    /// Closes the connection whose answer is held.
    fn release(&self) {
        let (lock, changed) = &*self.hold;
        lock.lock().unwrap().1 = true;
        changed.notify_all();
    }
}

/// Passes frames between `client` and `server` (see [`HoldingProxy`]).
fn proxy_connection(
    client: std::net::TcpStream,
    server: std::net::TcpStream,
    hold: Arc<(Mutex<(bool, bool)>, std::sync::Condvar)>,
) {
    use std::io::{Read as _, Write as _};
    fn frame(from: &mut std::net::TcpStream) -> std::io::Result<Vec<u8>> {
        let mut size = [0u8; 4];
        from.read_exact(&mut size)?;
        let mut frame = size.to_vec();
        frame.resize(
            4 + usize::try_from(i32::from_be_bytes(size)).unwrap_or(0),
            0,
        );
        from.read_exact(&mut frame[4..])?;
        Ok(frame)
    }
    // The API key of each request passed on, in order (answers come in that order).
    let (keys, asked) = std::sync::mpsc::channel::<i16>();
    let (mut from_client, mut to_server) =
        (client.try_clone().unwrap(), server.try_clone().unwrap());
    std::thread::spawn(move || {
        while let Ok(f) = frame(&mut from_client) {
            let _ = keys.send(i16::from_be_bytes([f[4], f[5]]));
            if to_server.write_all(&f).is_err() {
                break;
            }
        }
    });
    let (mut from_server, mut to_client) = (server, client);
    std::thread::spawn(move || {
        while let Ok(f) = frame(&mut from_server) {
            let Ok(key) = asked.recv() else { break };
            let (lock, changed) = &*hold;
            let mut state = lock.lock().unwrap();
            if key == 0 && !state.0 {
                // The first Produce answer: held until released, then the connection closed.
                state.0 = true;
                changed.notify_all();
                let _released = changed.wait_while(state, |s| !s.1).unwrap();
                break;
            }
            drop(state);
            if to_client.write_all(&f).is_err() {
                break;
            }
        }
        let _ = to_client.shutdown(std::net::Shutdown::Both);
        let _ = from_server.shutdown(std::net::Shutdown::Both);
    });
}

/// More auto-created partitions than a table's buckets (every auto-create would fail,
/// unlogged) are refused with why, before the node starts.
#[test]
fn too_many_auto_created_partitions_are_refused() {
    refused_auto_create("5000", "a topic has at most 4096 partitions");
}

fn refused_auto_create(partitions: &str, why: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(MINK)
        .args(["dev", "--data-dir"])
        .arg(dir.path())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "none",
            "--sql-listen",
            "none",
        ])
        .args([
            "--kafka-listen",
            "127.0.0.1:0",
            "--kafka-auto-create-partitions",
            partitions,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(why), "{err}");
}

/// The notebooks under notebooks/ run against `mink dev` without an error (nbclient executes
/// every cell; the notebooks assert on what they show).
#[test]
fn the_notebooks_run_against_mink_dev() {
    let Some(python) = python() else { return };
    let ready = Command::new(&python)
        .args([
            "-c",
            "import nbclient, ipykernel, matplotlib, polars, adbc_driver_flightsql",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but the notebook packages are not installed (scripts/test.sh installs them)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let notebooks = manifest_dir().join("../../notebooks");
    let out = Command::new(python)
        .arg(notebooks.join("run.py"))
        .env("MINK_FLIGHT", format!("grpc://{}", dev.flight))
        .env("MINK_SQL", format!("grpc://{}", dev.sql))
        // The kernels' runtime files (connection files) stay in the test's directory.
        .env("JUPYTER_RUNTIME_DIR", dir.path().join("jupyter"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.matches(": ok").count() == 3,
        "the notebooks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn pyarrow_flight_creates_writes_scans_tails_and_gets_precise_errors() {
    run_pyarrow_script("pyarrow_flight.py");
}

#[test]
fn pyarrow_reads_every_flight_info_endpoint_of_every_kind_of_table() {
    run_pyarrow_script("pyarrow_endpoints.py");
}

#[test]
fn primary_key_tables_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let out = dev.run(
        &[
            "table",
            "create",
            "app.counts",
            "-c",
            "id Int64",
            "-c",
            "n Int64",
            "--primary-key",
            "id",
            "-o",
            "table.merge-engine=aggregation",
            "-o",
            "fields.n.agg=sum",
            "-o",
            "table.delete.behavior=allow",
        ],
        None,
    );
    assert!(out.contains("primary key: id"), "{out}");
    let rows = "{\"id\": 1, \"n\": 2}\n{\"id\": 2, \"n\": 5}\n{\"id\": 1, \"n\": 3}\n";
    assert!(
        dev.run(&["produce", "app.counts"], Some(rows))
            .contains("wrote 3 rows")
    );
    let deleted = dev.run(
        &["produce", "app.counts", "--delete"],
        Some("{\"id\": 2}\n"),
    );
    assert!(
        deleted.contains("deleted 1 key from app.counts"),
        "{deleted}"
    );
    let (ok, out, err) = dev.try_run(
        &[
            "lookup",
            "app.counts",
            "{\"id\": 1}",
            "{\"id\": 2}",
            "-f",
            "csv",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["id,n", "1,5"], "{out}");
    assert_eq!(err.trim(), "1 of 2 keys has no row", "{err}");
    let (ok, out, err) = dev.try_run(&["lookup", "app.counts", "{\"id\": 2}"], None);
    assert!(ok, "{err}");
    assert!(!out.contains('5'), "{out}");
    assert_eq!(err.trim(), "no row has the key {\"id\": 2}", "{err}");
    let out = dev.run(
        &[
            "scan",
            "app.counts",
            "--changelog",
            "-f",
            "csv",
            "--columns",
            "_change_type,id,n",
        ],
        None,
    );
    let mut lines: Vec<&str> = out.lines().skip(1).collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "delete,2,5",
            "insert,1,2",
            "insert,2,5",
            "update_after,1,5",
            "update_before,1,2"
        ],
        "{out}"
    );
    let (ok, _, err) = dev.try_run(&["lookup", "app.counts", "id=1"], None);
    assert!(!ok && err.contains("not a JSON object"), "{err}");
    // Its log holds changes (and markers), not rows: counted as offsets.
    let described = dev.run(&["table", "describe", "app.counts"], None);
    assert!(described.contains("changelog offsets: 5\n"), "{described}");
    // An option given twice, or by a flag and -o, is refused (one of them was dropped);
    // lookups print, so Parquet is not offered.
    let (ok, _, err) = dev.try_run(
        &[
            "table",
            "create",
            "app.sums",
            "-c",
            "k Int64",
            "-c",
            "n Int64",
            "--primary-key",
            "k",
            "-o",
            "table.merge-engine=aggregation",
            "-o",
            "fields.n.aggregate-function=sum",
        ],
        None,
    );
    assert!(
        !ok && err.contains("fields.n.aggregate-function: unknown option"),
        "{err}"
    );
    for args in [
        &["-c", "k Int64", "--bucket-num", "4", "-o", "bucket.num=8"][..],
        &[
            "-c",
            "k Int64",
            "-o",
            "table.log.ttl=1h",
            "-o",
            "table.log.ttl=2h",
        ][..],
    ] {
        let mut create = vec!["table", "create", "app.twice"];
        create.extend_from_slice(args);
        let (ok, _, err) = dev.try_run(&create, None);
        assert!(!ok && err.contains("give it once"), "{args:?}: {err}");
    }
    let (ok, _, err) = dev.try_run(
        &["lookup", "app.counts", "{\"id\": 1}", "-f", "parquet"],
        None,
    );
    assert!(!ok && err.contains("invalid value 'parquet'"), "{err}");
    // A delete may leave out non-key columns (CSV named every column), and sends the rows
    // read back from a scan (their generated column too); an upsert leaves the generated
    // column out, from CSV as from JSON, and giving it is refused.
    dev.run(
        &[
            "table",
            "create",
            "app.stock",
            "-c",
            "id Int64",
            "-c",
            "qty Int64 not null",
            "-c",
            "note Utf8",
            "-c",
            "uid Int64 not null",
            "--primary-key",
            "id",
            "-o",
            "auto-increment.fields=uid",
        ],
        None,
    );
    dev.run(
        &["produce", "app.stock", "-f", "csv"],
        Some("id,qty,note\n1,5,a\n2,6,b\n"),
    );
    let (ok, _, err) = dev.try_run(
        &["produce", "app.stock"],
        Some("{\"id\": 3, \"qty\": 1, \"uid\": 9}\n"),
    );
    assert!(!ok && err.contains("\"uid\" is auto-increment"), "{err}");
    let row = dev.run(&["lookup", "app.stock", "{\"id\": 1}", "-f", "json"], None);
    dev.run(&["produce", "app.stock", "--delete"], Some(&row));
    dev.run(
        &["produce", "app.stock", "--delete", "-f", "csv"],
        Some("id,qty\n2,6\n"),
    );
    let out = dev.run(&["scan", "app.stock", "-f", "csv"], None);
    assert!(out.lines().count() <= 1, "{out}");
}

#[test]
fn pyarrow_primary_key_tables_upsert_delete_look_up_and_scan() {
    run_pyarrow_script("pyarrow_pk.py");
}

#[test]
fn pyarrow_reads_lake_tables_as_union_lake_and_log() {
    run_pyarrow_script("pyarrow_lake.py");
}

/// Every batch adds 1 to ten keys of its writer in an aggregation table: after a SIGKILL in
/// the middle and the writers' retries, every key counts each batch exactly once.
#[test]
fn acknowledged_upserts_survive_sigkill_and_count_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let listen = free_port();
    let fast = ["--lease-ttl-ms", "1500", "--flush-delay-ms", "10"];
    let dev = Dev::start(&data, &listen, &fast);
    dev.run(
        &[
            "table",
            "create",
            "app.counts",
            "-c",
            "id Int64",
            "-c",
            "n Int64",
            "--primary-key",
            "id",
            "--bucket-num",
            "4",
            "-o",
            "table.merge-engine=aggregation",
            "-o",
            "fields.n.agg=sum",
        ],
        None,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    const WRITERS: i64 = 4;
    const BATCHES: i64 = 40;
    let acked = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let load = {
        let acked = Arc::clone(&acked);
        spawn_load(
            &runtime,
            &listen,
            "counts",
            WRITERS,
            BATCHES,
            |w, _| {
                RecordBatch::try_from_iter(vec![
                    (
                        "id",
                        Arc::new(Int64Array::from_iter_values(w * 10..w * 10 + 10)) as ArrayRef,
                    ),
                    ("n", Arc::new(Int64Array::from(vec![1; 10])) as ArrayRef),
                ])
                .unwrap()
            },
            move |_| {
                acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            },
            Arc::default(),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while acked.load(std::sync::atomic::Ordering::Relaxed) < WRITERS * 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "the load never got going"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = acked.load(std::sync::atomic::Ordering::Relaxed);
    dev.kill();
    let dev = Dev::start(&data, &listen, &fast);
    runtime.block_on(load).unwrap();
    assert!(
        before < WRITERS * BATCHES,
        "the kill happened after the load"
    );
    let counts = runtime.block_on(async {
        let client = Client::connect(&dev.flight).await.unwrap();
        let keys = (0..WRITERS * 10)
            .map(|id| serde_json::json!({ "id": id }).as_object().unwrap().clone())
            .collect();
        client.lookup("app", "counts", keys, &[]).await.unwrap()
    });
    let ids = counts.column(0).as_primitive::<Int64Type>();
    let n = counts.column(1).as_primitive::<Int64Type>();
    assert_eq!(counts.num_rows(), (WRITERS * 10) as usize);
    for i in 0..counts.num_rows() {
        assert_eq!(
            n.value(i),
            BATCHES,
            "key {} counted {} times for {BATCHES} acknowledged batches",
            ids.value(i),
            n.value(i)
        );
    }
}

#[test]
fn acknowledged_rows_survive_sigkill_exactly_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let listen = free_port();
    let fast = ["--lease-ttl-ms", "1500", "--flush-delay-ms", "10"];
    let dev = Dev::start(&data, &listen, &fast);
    dev.run(
        &[
            "table",
            "create",
            "app.events",
            "-c",
            "id Int64 not null",
            "-c",
            "msg Utf8",
            "--bucket-num",
            "4",
            "--bucket-key",
            "id",
        ],
        None,
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let acked: Arc<Mutex<Vec<i64>>> = Arc::default();
    const WRITERS: i64 = 4;
    const BATCHES: i64 = 60;
    const ROWS: i64 = 25;
    let load = {
        let acked = Arc::clone(&acked);
        spawn_load(
            &runtime,
            &listen,
            "events",
            WRITERS,
            BATCHES,
            |w, b| rows(w, b * ROWS, ROWS),
            move |batch| {
                acked
                    .lock()
                    .unwrap()
                    .extend(batch.column(0).as_primitive::<Int64Type>().values());
            },
            Arc::default(),
        )
    };
    // Kill the node mid-load, then bring it back on the same address and data.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < (WRITERS * ROWS * 10) as usize {
        assert!(
            std::time::Instant::now() < deadline,
            "the load never got going"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = acked.lock().unwrap().len();
    dev.kill();
    let dev = Dev::start(&data, &listen, &fast);
    runtime.block_on(load).unwrap();
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), (WRITERS * BATCHES * ROWS) as usize);
    assert!(before < acked.len(), "the kill happened after the load");

    // Every acknowledged row once; offsets contiguous per bucket; each writer's rows in order.
    let stored = runtime.block_on(async {
        let client = Client::connect(&dev.flight).await.unwrap();
        client
            .scan_all(&Scan::table("app", "events"))
            .await
            .unwrap()
    });
    let mut next_offset: BTreeMap<u32, u64> = BTreeMap::new();
    let mut last_of_writer: BTreeMap<(u32, i64), i64> = BTreeMap::new();
    let mut seen = Vec::new();
    for r in &stored {
        let expected = next_offset.entry(r.bucket).or_insert(0);
        assert_eq!(
            r.offset, *expected,
            "a gap or overlap in bucket {}",
            r.bucket
        );
        *expected += r.batch.num_rows() as u64;
        for id in r.batch.column(0).as_primitive::<Int64Type>().values() {
            let key = (r.bucket, id / 1_000_000);
            if let Some(last) = last_of_writer.insert(key, *id) {
                assert!(
                    last < *id,
                    "writer {} out of order in bucket {}: {last} then {id}",
                    key.1,
                    r.bucket
                );
            }
            seen.push(*id);
        }
    }
    let distinct: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!(distinct.len(), seen.len(), "a row was stored twice");
    let expected: HashSet<i64> = acked.iter().copied().collect();
    assert_eq!(
        distinct, expected,
        "acknowledged rows missing, or unacknowledged rows stored"
    );
}

/// A node killed with SIGKILL and started again (default 30 s lease TTL) serves writes and
/// lookups of its buckets within seconds: its new life takes its lease and buckets back at
/// once instead of waiting for its previous life's lease to expire.
#[test]
fn a_restarted_node_serves_its_buckets_within_seconds_of_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let listen = free_port();
    let dev = Dev::start(&data, &listen, &[]);
    dev.run(
        &[
            "table",
            "create",
            "app.events",
            "-c",
            "id Int64",
            "-c",
            "msg Utf8",
            "--bucket-num",
            "4",
            "--bucket-key",
            "id",
        ],
        None,
    );
    dev.run(
        &[
            "table",
            "create",
            "app.counts",
            "-c",
            "id Int64",
            "-c",
            "n Int64",
            "--primary-key",
            "id",
            "--bucket-num",
            "4",
        ],
        None,
    );
    let counts = |n: i64| {
        RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..8)) as ArrayRef,
            ),
            ("n", Arc::new(Int64Array::from(vec![n; 8])) as ArrayRef),
        ])
        .unwrap()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = ClientConfig {
        retry_deadline: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    runtime.block_on(async {
        let client = Client::connect_with(&dev.flight, config.clone())
            .await
            .unwrap();
        client
            .writer("app", "events")
            .write(&rows(0, 0, 8))
            .await
            .unwrap();
        client
            .writer("app", "counts")
            .write(&counts(1))
            .await
            .unwrap();
    });
    dev.kill();

    let started = std::time::Instant::now();
    let dev = Dev::start(&data, &listen, &[]);
    let serving = started.elapsed();
    // Every bucket of both tables takes a write, and every key of the primary-key table reads
    // back what was written before and after the kill.
    let (all_served, found) = runtime.block_on(async {
        let deadline = started + Duration::from_secs(25);
        loop {
            let attempt = async {
                let client = Client::connect_with(&dev.flight, config.clone()).await?;
                client
                    .writer("app", "events")
                    .write(&rows(0, 100, 8))
                    .await?;
                client.writer("app", "counts").write(&counts(2)).await?;
                let keys = (0..8)
                    .map(|id| serde_json::json!({ "id": id }).as_object().unwrap().clone())
                    .collect();
                client.lookup("app", "counts", keys, &[]).await
            };
            match attempt.await {
                Ok(found) => break (started.elapsed(), found),
                Err(e) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the restarted node did not serve its buckets within 25 s: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    let n = found.column(1).as_primitive::<Int64Type>();
    assert_eq!(found.num_rows(), 8);
    assert!(n.values().iter().all(|v| *v == 2), "{found:?}");
    eprintln!(
        "restart after SIGKILL (30 s lease TTL): serving after {serving:?}, writes to every \
         bucket and lookups answered after {all_served:?}"
    );
    assert!(
        all_served < Duration::from_secs(10),
        "took {all_served:?}: a restarted node must not wait out its previous life's lease"
    );
}

/// Flat columns of every kind the docs list (CSV holds these), zoned timestamps included.
const FLAT_COLUMNS: &[&str] = &[
    "i8 Int8",
    "i16 Int16",
    "i32 Int32",
    "i64 Int64",
    "u8 UInt8",
    "u16 UInt16",
    "u32 UInt32",
    "u64 UInt64",
    "f16 Float16",
    "f32 Float32",
    "f64 Float64",
    "b Boolean",
    "s Utf8",
    "ls LargeUtf8",
    "bin Binary",
    "lbin LargeBinary",
    "dec Decimal128(10, 2)",
    "dec256 Decimal256(40, 5)",
    "d32 Date32",
    "d64 Date64",
    "t32 Time32(ms)",
    "t64 Time64(ns)",
    "ts Timestamp(µs)",
    "ts_utc Timestamp(ms, \"UTC\")",
    "ts_berlin Timestamp(ns, \"Europe/Berlin\")",
    "ts_offset Timestamp(s, \"+01:00\")",
    "dur Duration(ms)",
    "dict Dictionary(Int32, Utf8)",
];

/// A row of [`FLAT_COLUMNS`] as `scan --format json` writes it (and `produce` reads it).
const FLAT_ROW: &str = r#"{"i8":-5,"i16":-300,"i32":70000,"i64":-9000000000,"u8":255,"u16":65535,"u32":4294967295,"u64":18446744073709551615,"f16":0.5,"f32":1.5,"f64":2.25,"b":true,"s":"héllo, \"world\"","ls":"large","bin":"00ff","lbin":"cafe","dec":12.34,"dec256":123456789012345678901234567890.12345,"d32":"2026-11-30","d64":"2026-11-30T00:00:00","t32":"12:34:56.789","t64":"12:34:56.123456789","ts":"2026-11-30T12:34:56.789012","ts_utc":"2026-11-30T12:34:56.789Z","ts_berlin":"2026-11-30T12:34:56.123456789+01:00","ts_offset":"2026-11-30T12:34:56+01:00","dur":1500,"dict":"red"}"#;

const NESTED_COLUMNS: &[&str] = &[
    "id Int64",
    "l List(Int64)",
    "ll LargeList(Utf8)",
    "fsl FixedSizeList(2 x Int32)",
    "st Struct(\"a\": Int32, \"b\": Utf8, \"at\": Timestamp(ms, \"UTC\"))",
    "m Map(\"entries\": non-null Struct(\"keys\": non-null Utf8, \"values\": Int64), unsorted)",
];

const NESTED_ROW: &str = r#"{"id":1,"l":[1,null,3],"ll":["a","b"],"fsl":[1,2],"st":{"a":7,"b":"x","at":"2026-11-30T12:34:56.789Z"},"m":{"k1":1,"k2":null}}"#;

/// Every Arrow type the docs list is written with `produce` and read back with `scan` in
/// every output format; each file `scan` writes is produced back, and all copies read the same.
#[test]
fn every_arrow_type_round_trips_through_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    for (table, columns, row, csv) in [
        ("types.flat", FLAT_COLUMNS, FLAT_ROW, true),
        ("types.nested", NESTED_COLUMNS, NESTED_ROW, false),
    ] {
        let mut create = vec!["table", "create", table];
        for c in columns {
            create.extend(["-c", c]);
        }
        dev.run(&create, None);
        // A full row and an all-null one.
        let nulls = format!(
            "{{{}}}",
            columns
                .iter()
                .map(|c| format!("\"{}\":null", c.split(' ').next().unwrap()))
                .collect::<Vec<_>>()
                .join(",")
        );
        let rows = format!("{row}\n{nulls}\n");
        let out = dev.run(&["produce", table], Some(&rows));
        assert!(out.contains("wrote 2 rows"), "{out}");
        let json = dev.run(&["scan", table, "-f", "json"], None);
        assert_eq!(json, rows, "{table}: JSON lines out are JSON lines in");
        let pretty = dev.run(&["scan", table], None);
        for needle in ["2 rows", "2026-11-30T12:34:56"] {
            assert!(
                pretty.contains(needle),
                "{table}: {needle} missing:\n{pretty}"
            );
        }
        let mut files = vec![("json", dir.path().join(format!("{table}.json")))];
        std::fs::write(&files[0].1, &json).unwrap();
        let csv_out = dev.try_run(&["scan", table, "-f", "csv"], None);
        if csv {
            assert!(csv_out.0, "{}", csv_out.2);
            let path = dir.path().join(format!("{table}.csv"));
            std::fs::write(&path, &csv_out.1).unwrap();
            files.push(("csv", path));
        } else {
            assert!(
                !csv_out.0 && csv_out.2.contains("CSV holds flat columns only"),
                "{csv_out:?}"
            );
        }
        let parquet = dir.path().join(format!("{table}.parquet"));
        dev.run(
            &[
                "scan",
                table,
                "-f",
                "parquet",
                "-o",
                parquet.to_str().unwrap(),
            ],
            None,
        );
        files.push(("parquet", parquet));
        for (format, path) in &files {
            let out = dev.run(&["produce", table, path.to_str().unwrap()], None);
            assert!(out.contains("wrote 2 rows"), "{table} from {format}: {out}");
        }
        let mut read: Vec<String> = dev
            .run(&["scan", table, "-f", "json"], None)
            .lines()
            .map(str::to_string)
            .collect();
        read.sort();
        let mut expected: Vec<String> =
            std::iter::repeat_n([row.to_string(), nulls], files.len() + 1)
                .flatten()
                .collect();
        expected.sort();
        assert_eq!(read, expected, "{table}: a copy read back differently");
        // Following the table prints zoned timestamps too.
        let tail = dev.run(
            &["tail", table, "--from-beginning", "--idle-timeout", "1s"],
            None,
        );
        assert_eq!(tail.lines().count(), expected.len(), "{tail}");
    }
}

/// SIGTERM stops a node at once though a client tails one of its tables and another keeps a
/// write stream open (the drain used to wait on both, so the node never stopped): the write
/// stream ends with an error saying its next batch was not written, and the tail, told the node
/// is shutting down, reads on from where it was once the node is back.
#[test]
fn a_node_stops_on_sigterm_though_clients_keep_streams_open() {
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use futures::StreamExt as _;

    let dir = tempfile::tempdir().unwrap();
    let (data, listen) = (dir.path().join("data"), free_port());
    let mut dev = Dev::start(&data, &listen, &[]);
    dev.run(
        &[
            "table",
            "create",
            "app.t",
            "--column",
            "id Int64 not null",
            "--column",
            "msg Utf8",
        ],
        None,
    );
    let (mut tail, printed) = spawn_printing(&dev.flight, &["tail", "app.t", "-f", "json"]);
    // The tail is attached once it prints a row written after it started.
    dev.run(&["produce", "app.t"], Some("{\"id\": 1, \"msg\": \"a\"}\n"));
    let first = printed
        .recv_timeout(Duration::from_secs(30))
        .expect("the tail printed no row within 30 s");
    assert_eq!(first, r#"{"id":1,"msg":"a"}"#);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let pid = dev.child.id();
    let put_error = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", dev.flight))
            .unwrap()
            .connect()
            .await
            .unwrap();
        // A request waiting for metadata the node will never apply (as connectors' waits for
        // a change do), on the same connection, so it is in before the write below.
        let mut waiting = arrow_flight::FlightClient::new(channel.clone());
        waiting
            .add_header("mink-min-applied-index", "999999999")
            .unwrap();
        let wait = tokio::spawn(async move {
            let action = arrow_flight::Action::new("describe_cluster", "{}");
            match waiting.do_action(action).await {
                Ok(_) => "answered".to_string(),
                Err(e) => e.to_string(),
            }
        });
        let mut client = arrow_flight::FlightClient::new(channel);
        let (batches, queued) = futures::channel::mpsc::unbounded();
        let input = FlightDataEncoderBuilder::new()
            .with_flight_descriptor(Some(Client::descriptor("app", "t")))
            .build(queued.map(Ok));
        // Queued before the call: the encoder sends the schema (and the server answers the
        // call) only with the first batch.
        batches.unbounded_send(rows(9, 0, 3)).unwrap();
        let mut acks = client.do_put(input).await.unwrap();
        acks.next()
            .await
            .expect("an ack")
            .expect("the first batch is written");
        // The stream stays open (`batches` is held) while the node is told to stop.
        let status = Command::new("kill")
            .args(["-s", "TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let error = acks.next().await.expect("an answer").unwrap_err();
        drop(batches);
        let waited = wait.await.unwrap();
        assert!(waited.contains("node 1 is shutting down"), "{waited}");
        error.to_string()
    });
    assert!(
        put_error.contains("node 1 is shutting down: batch 1 and after were not written"),
        "{put_error}"
    );
    exits_within(pid, 30, "the node after SIGTERM, with clients attached");
    assert!(dev.child.wait().unwrap().success());
    // The tail reads on once the node is back: every row after the first once, the rows
    // the write stream stored included, then a new one.
    let dev = Dev::start(&data, &listen, &[]);
    dev.run(&["produce", "app.t"], Some("{\"id\": 2, \"msg\": \"b\"}\n"));
    let mut after = Vec::new();
    while after
        .last()
        .is_none_or(|l: &String| !l.contains("\"id\":2"))
    {
        after.push(
            printed
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("the tail printed no more within 60 s: {after:?}")),
        );
    }
    assert_eq!(
        after,
        [
            r#"{"id":9000000,"msg":"m"}"#,
            r#"{"id":9000001,"msg":"m"}"#,
            r#"{"id":9000002,"msg":"m"}"#,
            r#"{"id":2,"msg":"b"}"#,
        ]
    );
    tail.kill().unwrap();
    let out = tail.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("node 1 is shutting down")
            && stderr.contains("the tail broke off; reading again from offset"),
        "{stderr}"
    );
}

/// The node tiering a lake table is SIGKILLed three times at pseudo-random moments after a
/// round was recorded (during the next round's reads, Parquet upload, Iceberg commit or
/// metadata record) while writers keep writing: once everything is tiered, the lake holds
/// every acknowledged row exactly once, at contiguous offsets per bucket, and the union read
/// returns the same rows.
#[test]
fn tiering_survives_sigkill_at_random_moments() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let listen = free_port();
    let fast = ["--lease-ttl-ms", "1500", "--flush-delay-ms", "10"];
    let mut dev = Dev::start(&data, &listen, &fast);
    dev.run(
        &[
            "table",
            "create",
            "app.events",
            "-c",
            "id Int64 not null",
            "-c",
            "msg Utf8",
            "--bucket-num",
            "4",
            "--bucket-key",
            "id",
            "-o",
            "table.datalake.enabled=true",
            "-o",
            "table.datalake.freshness=1s",
        ],
        None,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // Acknowledged ids, and a signal on every acknowledgement.
    let acked: Arc<(Mutex<Vec<i64>>, std::sync::Condvar)> = Arc::default();
    const WRITERS: i64 = 4;
    const BATCHES: i64 = 120;
    const ROWS: i64 = 25;
    let load = {
        let acked = Arc::clone(&acked);
        spawn_load(
            &runtime,
            &listen,
            "events",
            WRITERS,
            BATCHES,
            |w, b| rows(w, b * ROWS, ROWS),
            move |batch| {
                let (ids, signal) = &*acked;
                ids.lock()
                    .unwrap()
                    .extend(batch.column(0).as_primitive::<Int64Type>().values());
                signal.notify_all();
            },
            Arc::default(),
        )
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut seen = None;
    let mut at_kill = 0;
    for kill in 0..3 {
        // A round recorded since the last restart...
        let d = until_described(&runtime, &dev.flight, "a new lake snapshot", |d| {
            d.lake
                .as_ref()
                .and_then(|l| l.snapshot_id)
                .is_some_and(|s| Some(s) != seen)
        });
        seen = d.lake.and_then(|l| l.snapshot_id);
        // ...then a pseudo-random number of acknowledged batches into the next one.
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let (ids, signal) = &*acked;
        let target = ids.lock().unwrap().len() + ((seed >> 33) % 12) as usize * ROWS as usize;
        let (ids, waited) = signal
            .wait_timeout_while(ids.lock().unwrap(), Duration::from_secs(30), |ids| {
                ids.len() < target
            })
            .unwrap();
        assert!(
            !waited.timed_out(),
            "kill {kill}: {} of {target} rows acknowledged",
            ids.len()
        );
        at_kill = ids.len();
        drop(ids);
        dev.kill();
        dev = Dev::start(&data, &listen, &fast);
    }
    runtime.block_on(load).unwrap();
    let acked = acked.0.lock().unwrap().clone();
    assert_eq!(acked.len(), (WRITERS * BATCHES * ROWS) as usize);
    assert!(at_kill < acked.len(), "the last kill came after the load");

    until_described(
        &runtime,
        &dev.flight,
        "every bucket tiered to its end",
        |d| {
            d.buckets
                .iter()
                .all(|b| b.tiered_offset == Some(b.end_offset))
        },
    );
    let client = runtime.block_on(Client::connect(&dev.flight)).unwrap();
    for source in ["lake", "union"] {
        let stored = runtime
            .block_on(client.scan_all(&Scan::table("app", "events").source(source)))
            .unwrap();
        let mut next_offset: BTreeMap<u32, u64> = BTreeMap::new();
        let mut ids: Vec<i64> = Vec::new();
        for r in &stored {
            let expected = next_offset.entry(r.bucket).or_insert(0);
            assert_eq!(
                r.offset, *expected,
                "{source}: a gap or overlap in bucket {}",
                r.bucket
            );
            *expected += r.batch.num_rows() as u64;
            ids.extend(r.batch.column(0).as_primitive::<Int64Type>().values());
        }
        ids.sort_unstable();
        let mut want = acked.clone();
        want.sort_unstable();
        assert_eq!(ids, want, "{source}: every acknowledged row once");
    }
}

/// Waits, on each metadata change of the node at `flight` (`Client::wait_for_change`), until
/// `done` holds for the description of `app.events`; fails after 60 s with `what` and the
/// last description.
fn until_described(
    runtime: &tokio::runtime::Runtime,
    flight: &str,
    what: &str,
    mut done: impl FnMut(&mink_client::protocol::TableDescription) -> bool,
) -> mink_client::protocol::TableDescription {
    runtime.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let client = Client::connect(flight).await.unwrap();
        loop {
            let d = client.describe_table("app", "events").await.unwrap();
            if done(&d) {
                return d;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(
                !left.is_zero(),
                "{what} never happened (last seen: {:?})",
                d
            );
            client.wait_for_change(left).await.unwrap();
        }
    })
}

/// One node id runs in one process. A second process with the id of a live node is refused
/// before it registers (it fenced the live one, which then answered on as a zombie), and so is
/// one that fails on a port in use; a node fenced by a newer registration of its id stops,
/// saying so, instead of serving on.
#[test]
fn a_node_id_serves_from_one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let ttl = ["--lease-ttl-ms", "2000"];
    let first = Dev::start(&data, &free_port(), &ttl);
    first.run(&["table", "create", "app.t", "-c", "id Int64"], None);
    assert!(
        first
            .run(&["node", "ready"], None)
            .starts_with(&format!("the node at {} serves", first.flight))
    );
    let second = |extra: &[&str]| {
        let out = Command::new(MINK)
            .args(["dev", "--data-dir"])
            .arg(&data)
            .args(["--sql-listen", "none", "--kafka-listen", "none"])
            .args(ttl)
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let write = |dev: &Dev, id: i64| {
        dev.run(&["produce", "app.t"], Some(&format!("{{\"id\": {id}}}\n")));
    };
    // A port in use fails the start before it registers: the first node goes on.
    let metrics = first
        .metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let (ok, err) = second(&["--listen", &free_port(), "--metrics-listen", metrics]);
    assert!(!ok && err.contains("cannot listen for metrics"), "{err}");
    write(&first, 1);
    // Another address while the first heartbeats: refused, naming where the id runs.
    let (ok, err) = second(&["--listen", &free_port(), "--metrics-listen", "none"]);
    assert!(
        !ok && err.contains("another process has this node id")
            && err.contains(&format!("node 1 is running at {}", first.flight)),
        "{err}"
    );
    write(&first, 2);
    // A registration the check cannot tell apart (the same advertised address) fences the
    // first process, which stops with why.
    let listen = free_port();
    let third = Command::new(MINK)
        .args(["dev", "--data-dir"])
        .arg(&data)
        .args(["--listen", &listen, "--advertised-address", &first.flight])
        .args([
            "--metrics-listen",
            "none",
            "--sql-listen",
            "none",
            "--kafka-listen",
            "none",
        ])
        .args(ttl)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = first;
    exits_within(first.child.id(), 30, "the fenced node");
    let status = first.child.wait().unwrap();
    assert!(!status.success(), "{status}");
    let (ok, _, _) = first.try_run(&["node", "ready"], None);
    assert!(!ok, "a stopped node is not ready");
    let log = std::fs::read_to_string(data.with_extension("log")).unwrap();
    assert!(
        log.contains("node 1 stopped") && log.contains("fenced by a newer registration"),
        "{log}"
    );
    let mut third = third;
    let _ = third.kill();
    let _ = third.wait();
}
