//! The README is a test: its set-up command `./scripts/mink dev` and every command of its quick
//! start run verbatim (through `scripts/mink`, with `MINK_BIN` pointing at the binary under
//! test and `MINK_SERVER` at the node it started), and each one's output is checked. A command
//! added to the quick start without an expectation here fails the test.
#![allow(clippy::print_stderr)]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{MINK, manifest_dir, python};

fn repo_root() -> PathBuf {
    manifest_dir().join("../..").canonicalize().unwrap()
}

/// The fenced code blocks `(language, body)` of the README section headed `## {title}`.
fn blocks(readme: &str, title: &str) -> Vec<(String, String)> {
    let start = readme
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("README.md has no section \"## {title}\""));
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut out = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let newline = after.find('\n').unwrap();
        let language = after[..newline].trim().to_string();
        let body_and_rest = &after[newline + 1..];
        let close = body_and_rest.find("```").expect("a closed code block");
        out.push((language, body_and_rest[..close].to_string()));
        rest = &body_and_rest[close + 3..];
    }
    out
}

/// The shell commands of a block: lines joined at a trailing backslash.
fn commands(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in body.lines() {
        if let Some(continued) = line.strip_suffix('\\') {
            current.push_str(continued);
            current.push(' ');
        } else {
            current.push_str(line);
            if !current.trim().is_empty() {
                out.push(current.trim().to_string());
            }
            current.clear();
        }
    }
    out
}

/// The `mink-query` binary of this build (built with its package's tests).
fn mink_query() -> PathBuf {
    let path = Path::new(MINK).with_file_name("mink-query");
    assert!(
        path.exists(),
        "{} is not built: run the suite (cargo nextest run --workspace) or cargo build -p mink-query-cli",
        path.display()
    );
    path
}

/// `bash -c <command>` in the clone, against the node at `server`.
fn shell(command: &str, server: &str) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(command)
        .current_dir(repo_root())
        .env("MINK_BIN", MINK)
        .env("MINK_QUERY_BIN", mink_query())
        .env("MINK_SERVER", server)
        .env_remove("MINK_CONFIG")
        .stdin(Stdio::null());
    c
}

fn run(command: &str, server: &str) -> String {
    let out = shell(command, server).output().unwrap();
    assert!(
        out.status.success(),
        "README command failed: {command}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A running command whose output lines arrive on a channel.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn spawn(mut command: Command) -> Running {
        // Its own process group: the shell and whatever it started stop together.
        let mut child = command
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Running { child, lines }
    }

    /// The first line holding `needle`, waiting at most until `deadline`.
    fn wait_for(&self, needle: &str, deadline: Instant) -> Option<String> {
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rows of a pretty table, as trimmed cells.
fn table_rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn the_readme_set_up_and_quick_start_run_verbatim() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();

    // Set up: exactly two commands, one runs Mink, one runs the suite (what CI runs too).
    let setup: Vec<String> = blocks(&readme, "Set up")
        .iter()
        .flat_map(|(_, body)| commands(body))
        .collect();
    assert_eq!(
        setup,
        ["./scripts/mink dev", "./scripts/test.sh"],
        "{setup:?}"
    );
    let ci = std::fs::read_to_string(repo_root().join(".ci/run")).unwrap();
    assert!(ci.contains("exec ./scripts/test.sh"), "{ci}");

    let data = tempfile::tempdir().unwrap();
    let mut dev = shell(&setup[0], "");
    dev.env("MINK_DATA_DIR", data.path())
        .env("MINK_LISTEN", "127.0.0.1:0")
        .env("MINK_METRICS_LISTEN", "127.0.0.1:0")
        .env("MINK_SQL_LISTEN", "127.0.0.1:0");
    let dev = Running::spawn(dev);
    let deadline = Instant::now() + Duration::from_secs(60);
    let flight = dev
        .wait_for("Flight:", deadline)
        .expect("`./scripts/mink dev` printed its Flight endpoint");
    let address = flight
        .trim()
        .trim_start_matches("Flight:")
        .trim()
        .trim_start_matches("grpc://")
        .to_string();
    dev.wait_for("Metrics:", deadline)
        .expect("`./scripts/mink dev` printed its metrics endpoint");

    let quick = blocks(&readme, "Quick start");
    assert!(
        quick.iter().any(|(l, _)| l == "python"),
        "the quick start shows a Flight client"
    );
    let mut tail: Option<Running> = None;
    let mut produce_events: Option<String> = None;
    let mut checked = 0;
    for (language, body) in &quick {
        if language == "python" {
            let Some(python) = python() else { continue };
            // The recipe as written, pointed at this test's node.
            let script = body.replace("127.0.0.1:7171", &address);
            let out = Command::new(python)
                .arg("-c")
                .arg(&script)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success()
                    && stdout.contains("pyarrow.Table")
                    && stdout.contains("user_id: int64 not null"),
                "the README's pyarrow recipe failed:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Every bucket's rows (the first endpoint alone held one of two).
            let counts: Vec<&str> = stdout
                .lines()
                .next()
                .unwrap_or_default()
                .split(" rows of ")
                .collect();
            assert!(
                counts.len() == 2 && counts[0] == counts[1] && counts[0] != "0",
                "the README's pyarrow recipe read a part of the table:\n{stdout}"
            );
            checked += 1;
            continue;
        }
        assert_eq!(language, "sh", "a quick-start block in {language}");
        for command in commands(body) {
            if command.contains("mink tail app.events") {
                // Runs until stopped; rows written after it started show up as JSON lines.
                tail = Some(Running::spawn(shell(&command, &address)));
                let writer = produce_events
                    .clone()
                    .expect("the quick start writes rows before it tails");
                let tail = tail.as_ref().unwrap();
                let deadline = Instant::now() + Duration::from_secs(30);
                let seen = loop {
                    run(&writer, &address);
                    if let Some(line) =
                        tail.wait_for("signup", Instant::now() + Duration::from_secs(2))
                    {
                        break line;
                    }
                    assert!(Instant::now() < deadline, "`{command}` showed no new rows");
                };
                assert_eq!(seen, r#"{"user_id":1,"event":"signup"}"#);
                checked += 1;
                continue;
            }
            let out = run(&command, &address);
            if command.contains("table create app.events") {
                assert!(
                    out.contains("created table app.events"),
                    "{command}:\n{out}"
                );
            } else if command.contains("produce app.events") {
                produce_events = Some(command.clone());
                assert!(
                    out.contains("wrote 2 rows to app.events"),
                    "{command}:\n{out}"
                );
            } else if command.contains("scan app.events") {
                let mut rows = table_rows(&out);
                rows.sort();
                assert_eq!(
                    rows,
                    [["1", "signup"], ["2", "login"], ["user_id", "event"]],
                    "{command}:\n{out}"
                );
            } else if command.contains("table create app.visits") {
                assert!(
                    out.contains("created table app.visits"),
                    "{command}:\n{out}"
                );
            } else if command.contains("produce app.visits") {
                assert!(
                    out.contains("wrote 2 rows to app.visits"),
                    "{command}:\n{out}"
                );
            } else if command.contains("lookup app.visits") {
                assert!(command.ends_with("# visits = 5"), "{command}");
                assert_eq!(
                    table_rows(&out),
                    [["user_id", "visits"], ["1", "5"]],
                    "{command}:\n{out}"
                );
            } else if command.contains("mink-query -c") {
                assert_eq!(
                    table_rows(&out),
                    [["event", "visits"], ["signup", "5"]],
                    "{command}:\n{out}"
                );
            } else if command.contains("scan app.visits --changelog") {
                let kinds: Vec<String> = table_rows(&out)
                    .into_iter()
                    .skip(1)
                    .map(|r| r[0].clone())
                    .collect();
                assert_eq!(
                    kinds,
                    ["insert", "update_before", "update_after"],
                    "{command}:\n{out}"
                );
            } else {
                panic!(
                    "README quick-start command without an expected output in tests/readme.rs: {command}"
                );
            }
            checked += 1;
        }
    }
    drop(tail);
    eprintln!("{checked} README commands ran and matched");
    assert!(checked >= 8, "only {checked} quick-start commands found");
}
