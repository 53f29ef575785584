//! The `mink` binary: `mink dev`, the admin and data commands, the metrics endpoint, a real
//! pyarrow.flight client, and a node killed with SIGKILL under a load of idempotent writers.
#![allow(clippy::print_stderr, clippy::cast_possible_truncation)]

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Int64Type;
use mink_client::{Client, ClientConfig, Scan};

const MINK: &str = env!("CARGO_BIN_EXE_mink");

/// A `mink dev` process.
struct Dev {
    child: Child,
    flight: String,
    metrics: String,
}

impl Dev {
    fn start(data: &Path, listen: &str, extra: &[&str]) -> Dev {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data.with_extension("log"))
            .unwrap();
        let mut child = Command::new(MINK)
            .args(["dev", "--data-dir"])
            .arg(data)
            .args(["--listen", listen, "--metrics-listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut flight, mut metrics) = (None, None);
        while flight.is_none() || metrics.is_none() {
            let Some(Ok(line)) = lines.next() else {
                panic!(
                    "mink dev exited before serving; see {}",
                    data.with_extension("log").display()
                )
            };
            if let Some(a) = line.trim().strip_prefix("Flight:") {
                flight = Some(a.trim().trim_start_matches("grpc://").to_string());
            }
            if let Some(a) = line.trim().strip_prefix("Metrics:") {
                metrics = Some(a.trim().to_string());
            }
        }
        // Keep draining stdout so the node never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Dev {
            child,
            flight: flight.unwrap(),
            metrics: metrics.unwrap(),
        }
    }

    /// Runs a client command against this node; returns stdout, panics with stderr on failure.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.try_run(args, stdin);
        assert!(out.0, "mink {args:?} failed:\n{}", out.2);
        out.1
    }

    fn try_run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut child = Command::new(MINK)
            .args(["--server", &self.flight])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn kill(mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get(url: &str) -> String {
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    std::io::Read::read_to_string(&mut stream, &mut body).unwrap();
    body
}

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
    // Errors say what is wrong and exit non-zero.
    let (ok, _, err) = dev.try_run(&["produce", "app.events"], Some("{\"msg\": \"no id\"}\n"));
    assert!(!ok && err.contains("not nullable"), "{err}");
    let (ok, _, err) = dev.try_run(&["scan", "app.nope"], None);
    assert!(!ok && err.contains("does not exist"), "{err}");
    let (ok, _, err) = dev.try_run(&["--server", "127.0.0.1:1", "database", "list"], None);
    assert!(!ok && err.contains("mink dev"), "{err}");
    // Metrics: Flight calls, s3stream latency, the applied index.
    let metrics = http_get(&dev.metrics);
    for name in [
        "mink_flight_requests_total",
        "s3stream_flush_commit_duration_seconds_bucket",
        "mink_metadata_applied_index",
        "s3stream_cache_lookups_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
}

fn python() -> Option<PathBuf> {
    let venv = std::env::var("MINK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/mink/venv"));
    let python = venv.join("bin/python");
    let has_pyarrow = Command::new(&python)
        .args(["-c", "import pyarrow.flight"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has_pyarrow {
        return Some(python);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but pyarrow is not installed in {} (scripts/test.sh installs it)",
        venv.display()
    );
    eprintln!(
        "skipping: no pyarrow in {} (run scripts/test.sh)",
        venv.display()
    );
    None
}

#[test]
fn pyarrow_flight_creates_writes_scans_tails_and_gets_precise_errors() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let script = manifest_dir().join("tests/pyarrow_flight.py");
    let out = Command::new(python)
        .arg(script)
        .arg(&dev.flight)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pyarrow_flight.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// At run time: a shared target directory may hold a binary built from another checkout.
fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
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
    dev.run(
        &["produce", "app.counts", "--delete"],
        Some("{\"id\": 2}\n"),
    );
    let out = dev.run(
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
    assert_eq!(out.lines().collect::<Vec<_>>(), ["id,n", "1,5"], "{out}");
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
}

#[test]
fn pyarrow_primary_key_tables_upsert_delete_look_up_and_scan() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let out = Command::new(python)
        .arg(manifest_dir().join("tests/pyarrow_pk.py"))
        .arg(&dev.flight)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pyarrow_pk.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Rows `first..first+n` of writer `w`: ids are unique across writers.
fn rows(w: i64, first: i64, n: i64) -> RecordBatch {
    let ids: Vec<i64> = (first..first + n).map(|i| w * 1_000_000 + i).collect();
    RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
        (
            "msg",
            Arc::new(StringArray::from(vec!["m"; n as usize])) as ArrayRef,
        ),
    ])
    .unwrap()
}

/// `writers` idempotent writers of `app.<table>` at `address`, each writing the batches
/// `batch(writer, n)` for n in `0..batches` (20 ms apart, retrying for up to a minute) and
/// calling `acked` with each batch once it is acknowledged.
fn spawn_load(
    runtime: &tokio::runtime::Runtime,
    address: &str,
    table: &'static str,
    writers: i64,
    batches: i64,
    batch: fn(i64, i64) -> RecordBatch,
    acked: impl Fn(&RecordBatch) + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let address = address.to_string();
    let acked = Arc::new(acked);
    runtime.spawn(async move {
        let config = ClientConfig {
            retry_deadline: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(1),
            ..Default::default()
        };
        let client = Client::connect_with(&address, config).await.unwrap();
        let tasks: Vec<_> = (0..writers)
            .map(|w| {
                let client = client.clone();
                let acked = Arc::clone(&acked);
                tokio::spawn(async move {
                    let mut writer = client.writer("app", table);
                    for b in 0..batches {
                        let rows = batch(w, b);
                        writer
                            .write(&rows)
                            .await
                            .unwrap_or_else(|e| panic!("writer {w} batch {b}: {e}"));
                        acked(&rows);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    })
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
    std::thread::sleep(Duration::from_millis(500));
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
    std::thread::sleep(Duration::from_millis(500));
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
