//! What the `mink` binary's test files share: a `mink dev` process, the test virtualenv's
//! Python, free ports.
#![allow(dead_code, unreachable_pub, clippy::print_stderr)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const MINK: &str = env!("CARGO_BIN_EXE_mink");

/// A `mink dev` process.
pub struct Dev {
    pub child: Child,
    pub flight: String,
    pub metrics: String,
}

impl Dev {
    pub fn start(data: &Path, listen: &str, extra: &[&str]) -> Dev {
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
