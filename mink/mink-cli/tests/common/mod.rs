//! What the `mink` binary's test files share: a `mink dev` process, the test virtualenv's
//! Python, free ports.
#![allow(
    dead_code,
    unreachable_pub,
    clippy::print_stderr,
    clippy::cast_possible_truncation
)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use mink_client::{Client, ClientConfig};

pub const MINK: &str = env!("CARGO_BIN_EXE_mink");

/// A `mink dev` process.
pub struct Dev {
    pub child: Child,
    pub flight: String,
    pub metrics: String,
    /// The Flight SQL listener (`host:port`).
    pub sql: String,
    /// The Kafka listener (`host:port`).
    pub kafka: String,
}

impl Dev {
    pub fn start(data: &Path, listen: &str, extra: &[&str]) -> Dev {
        Dev::start_on(data, listen, "127.0.0.1:0", extra)
    }

    /// [`Dev::start`] with its Kafka listener on `kafka` (a restarted node's old address).
    pub fn start_on(data: &Path, listen: &str, kafka: &str, extra: &[&str]) -> Dev {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data.with_extension("log"))
            .unwrap();
        let mut child = Command::new(MINK)
            .args(["dev", "--data-dir"])
            .arg(data)
            .args(["--listen", listen, "--metrics-listen", "127.0.0.1:0"])
            .args(["--sql-listen", "127.0.0.1:0", "--kafka-listen", kafka])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut flight, mut metrics, mut sql, mut kafka) = (None, None, None, None);
        while flight.is_none() || metrics.is_none() || sql.is_none() || kafka.is_none() {
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
            if let Some(a) = line.trim().strip_prefix("Kafka:") {
                kafka = a.split_whitespace().next().map(str::to_string);
            }
            if let Some(a) = line.trim().strip_prefix("SQL:") {
                let a = a.trim().trim_start_matches("grpc://");
                sql = Some(a.split_whitespace().next().unwrap_or(a).to_string());
            }
        }
        // Keep draining stdout so the node never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Dev {
            child,
            flight: flight.unwrap(),
            metrics: metrics.unwrap(),
            sql: sql.unwrap(),
            kafka: kafka.unwrap(),
        }
    }

    /// Runs a client command against this node; returns stdout, panics with stderr on failure.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.try_run(args, stdin);
        assert!(out.0, "mink {args:?} failed:\n{}", out.2);
        out.1
    }

    pub fn try_run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
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

    pub fn kill(mut self) {
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

/// `mink --server <server> <args>` started (a `tail`, say), its stderr piped, and its standard
/// output's lines as they are printed.
pub fn spawn_printing(server: &str, args: &[&str]) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(MINK)
        .args(["--server", server])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, printed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    (child, printed)
}

/// Waits up to `seconds` for process `pid` (ours or not) to exit: a pidfd of it turns readable
/// when it does. `what` names it in the failure.
pub fn exits_within(pid: u32, seconds: i64, what: &str) {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let raw = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    let Ok(fd) = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) else {
        return; // gone already
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let ready = poll(
        &mut fds,
        Some(&Timespec {
            tv_sec: seconds,
            tv_nsec: 0,
        }),
    )
    .unwrap();
    assert_eq!(
        ready, 1,
        "waited {seconds} s for {what} (pid {pid}) to exit"
    );
}

pub fn http_get(url: &str) -> String {
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

pub fn python() -> Option<PathBuf> {
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

/// At run time: a shared target directory may hold a binary built from another checkout.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

pub fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A TCP relay to `upstream`. `forwarded` gets a message each time bytes from a client were
/// written to the upstream socket, where the kernel holds them even for a stopped process: the
/// event a test waits for before waking one.
pub struct Relay {
    pub address: String,
    pub forwarded: std::sync::mpsc::Receiver<()>,
}

impl Relay {
    pub fn start(upstream: &str) -> Relay {
        use std::io::{Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (sent, forwarded) = std::sync::mpsc::channel();
        let upstream = upstream.to_string();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let (Ok(mut client), Ok(mut server)) =
                    (client, std::net::TcpStream::connect(&upstream))
                else {
                    return;
                };
                let (mut back_to, mut back_from) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut back_from, &mut back_to);
                    let _ = back_to.shutdown(std::net::Shutdown::Write);
                });
                let sent = sent.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = client.read(&mut buf) {
                        if server.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        let _ = sent.send(());
                    }
                    let _ = server.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Relay { address, forwarded }
    }
}

/// Rows `first..first+n` of writer `w`: ids are unique across writers.
pub fn rows(w: i64, first: i64, n: i64) -> RecordBatch {
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
/// calling `acked` with each batch once it is acknowledged; each stops early, after the batch
/// it is writing, once `stop` is set. The task answers how many batches each writer had
/// acknowledged.
#[allow(clippy::too_many_arguments)]
pub fn spawn_load(
    runtime: &tokio::runtime::Runtime,
    address: &str,
    table: &'static str,
    writers: i64,
    batches: i64,
    batch: fn(i64, i64) -> RecordBatch,
    acked: impl Fn(&RecordBatch) + Send + Sync + 'static,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<i64>> {
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
                let stop = Arc::clone(&stop);
                tokio::spawn(async move {
                    let mut writer = client.writer("app", table);
                    let mut written = 0;
                    while written < batches && !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let rows = batch(w, written);
                        writer
                            .write(&rows)
                            .await
                            .unwrap_or_else(|e| panic!("writer {w} batch {written}: {e}"));
                        acked(&rows);
                        written += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    written
                })
            })
            .collect();
        let mut written = Vec::new();
        for t in tasks {
            written.push(t.await.unwrap());
        }
        written
    })
}

/// A cluster started by `deploy/local-cluster` (its own throwaway PostgreSQL; objects on the
/// test S3 server when there is one): the node processes can be signalled and restarted.
pub struct LocalCluster {
    child: Child,
    pub dir: tempfile::TempDir,
    /// Node id to (pid, Flight address).
    pub nodes: std::collections::BTreeMap<u64, (u32, String)>,
    /// Node id to its Kafka address.
    pub kafka: std::collections::BTreeMap<u64, String>,
    restarted: Vec<Child>,
}

fn postgres_installed() -> bool {
    Command::new("bash")
        .args([
            "-c",
            "command -v initdb || ls /usr/lib/postgresql/*/bin/initdb /usr/local/pgsql/bin/initdb",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

impl LocalCluster {
    /// `nodes` nodes with `extra` arguments of `deploy/local-cluster`; `None` (a skip) when
    /// PostgreSQL is not installed outside CI.
    pub fn start(nodes: u64, extra: &[&str]) -> Option<LocalCluster> {
        LocalCluster::start_in(tempfile::tempdir().unwrap(), nodes, extra)
    }

    /// [`LocalCluster::start`] with `dir` as its `--dir` (which may hold an earlier run's).
    pub fn start_in(dir: tempfile::TempDir, nodes: u64, extra: &[&str]) -> Option<LocalCluster> {
        let ci = std::env::var("CI").as_deref() == Ok("true");
        if !postgres_installed() {
            assert!(!ci, "CI=true but the PostgreSQL server is not installed");
            eprintln!("skipping: no PostgreSQL server to run a cluster on");
            return None;
        }
        let mut args: Vec<String> = vec![
            "--nodes".into(),
            nodes.to_string(),
            "--dir".into(),
            dir.path().display().to_string(),
        ];
        match std::env::var("MINK_TEST_S3_ENDPOINT") {
            Ok(endpoint) if !endpoint.is_empty() => {
                let bucket = std::env::var("MINK_TEST_S3_BUCKET").unwrap();
                let unique = format!(
                    "{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_nanos()
                );
                args.push("--object-store".into());
                args.push(format!(
                    "s3://{bucket}/cluster-{unique}?endpoint={endpoint}&allow_http=true\
                     &region=us-east-1&access_key_id=test&secret_access_key=test"
                ));
            }
            _ => assert!(!ci, "CI=true but MINK_TEST_S3_ENDPOINT is not set"),
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let script = manifest_dir().join("../../deploy/local-cluster");
        let mut child = Command::new(&script)
            .args(&args)
            .env("MINK_BIN", MINK)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut found = std::collections::BTreeMap::new();
        let mut kafka = std::collections::BTreeMap::new();
        loop {
            let Some(Ok(line)) = lines.next() else {
                panic!(
                    "deploy/local-cluster exited before it was ready; logs in {}",
                    dir.path().display()
                )
            };
            // node 1: grpc://127.0.0.1:39293 (pid 5187, log /tmp/lc/node-1.log, kafka 127.0.0.1:40001)
            if let Some(rest) = line.strip_prefix("node ") {
                let (id, rest) = rest.split_once(": grpc://").unwrap();
                let (address, rest) = rest.split_once(" (pid ").unwrap();
                let pid = rest.split(',').next().unwrap();
                let id: u64 = id.parse().unwrap();
                found.insert(id, (pid.parse().unwrap(), address.to_string()));
                if let Some((_, k)) = rest.split_once(", kafka ") {
                    kafka.insert(id, k.trim_end_matches(')').to_string());
                }
            }
            if line.starts_with("ready:") {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Some(LocalCluster {
            child,
            dir,
            nodes: found,
            kafka,
            restarted: Vec::new(),
        })
    }

    pub fn address(&self, id: u64) -> String {
        self.nodes[&id].1.clone()
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to node `id`'s process.
    pub fn signal(&self, id: u64, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.nodes[&id].0.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -s {signal} node {id}");
    }

    /// Waits for node `id`'s process to exit (after a signal that stops it).
    pub fn exited(&self, id: u64) {
        exits_within(self.nodes[&id].0, 30, &format!("node {id}"));
    }

    /// Starts node `id` again with its settings (`deploy/local-cluster node`), once serving.
    pub fn restart(&mut self, id: u64) {
        let script = manifest_dir().join("../../deploy/local-cluster");
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.path().join(format!("node-{id}.log")))
            .unwrap();
        let mut child = Command::new(&script)
            .args(["node", &id.to_string(), "--dir"])
            .arg(self.dir.path())
            .env("MINK_BIN", MINK)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            let Some(Ok(line)) = lines.next() else {
                panic!(
                    "node {id} did not start again; see its log in {}",
                    self.dir.path().display()
                )
            };
            if line.trim().starts_with("Flight:") {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        self.nodes.get_mut(&id).unwrap().0 = child.id();
        self.restarted.push(child);
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // A stopped process takes no TERM until it runs again.
        for (pid, _) in self.nodes.values() {
            let _ = Command::new("kill")
                .args(["-s", "CONT", &pid.to_string()])
                .status();
        }
        for c in &mut self.restarted {
            let _ = Command::new("kill")
                .args(["-s", "TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
        // The script stops its nodes and its PostgreSQL on TERM.
        let _ = Command::new("kill")
            .args(["-s", "TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}
