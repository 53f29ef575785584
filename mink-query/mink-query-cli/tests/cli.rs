//! The `mink-query` binary against a node: `-c` and `-f` statements in each output format,
//! errors, and the prompt driven through a pseudo-terminal (tmux).
#![allow(clippy::print_stderr)]

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use futures::FutureExt as _;
use mink_client::{Client, protocol};
use mink_node::{Node, NodeConfig};

const MINK_QUERY: &str = env!("CARGO_BIN_EXE_mink-query");

struct Served {
    node: Node,
    address: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn serve(dir: &std::path::Path) -> Served {
    serve_with(dir, |_| {}).await
}

async fn serve_with(dir: &std::path::Path, tune: impl FnOnce(&mut NodeConfig)) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let mut c = NodeConfig::new(
        1,
        &format!("sqlite://{}", dir.join("meta.db").display()),
        dir.join("objects").to_str().unwrap(),
    );
    c.advertised_address = address.clone();
    c.engine.flush_delay = Duration::from_millis(5);
    c.leadership_interval = Duration::from_millis(20);
    tune(&mut c);
    let node = Node::start(c).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        mink_flight::serve(node.clone(), Default::default(), listener, async {
            let _ = stopped.await;
        })
        .map(|r| r.unwrap()),
    );
    let client = Client::connect(&address).await.unwrap();
    client.create_database("app", false).await.unwrap();
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]);
    client
        .create_table_with(&protocol::CreateTable {
            database: "app".into(),
            table: "people".into(),
            schema: protocol::encode_schema(&schema).unwrap(),
            options: [("bucket.num".to_string(), "2".to_string())].into(),
            partition_keys: vec![],
            primary_key: vec!["id".into()],
            comment: String::new(),
            if_not_exists: false,
        })
        .await
        .unwrap();
    let rows = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef),
        (
            "name",
            Arc::new(StringArray::from(vec![Some("ann"), None, Some("cid")])) as ArrayRef,
        ),
    ])
    .unwrap();
    client.writer("app", "people").write(&rows).await.unwrap();
    Served {
        node,
        address,
        stop,
        task,
    }
}

impl Served {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
        self.node.shutdown().await;
    }
}

fn mink_query(address: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(MINK_QUERY)
        .args(["--server", address])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `mink_query` off the runtime's threads (it blocks on the child process).
async fn query(address: &str, args: &[&str]) -> (bool, String, String) {
    let address = address.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        mink_query(&address, &args)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_from_the_command_line_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let (ok, out, err) = query(
        &s.address,
        &["-c", "SELECT id, name FROM app.people ORDER BY id"],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "+----+------+\n| id | name |\n+----+------+\n| 1  | ann  |\n| 2  |      |\n| 3  | cid  |\n+----+------+\n"
    );
    let file = dir.path().join("q.sql");
    std::fs::write(
        &file,
        "-- two statements\nSELECT count(*) AS n\n  FROM app.people;\nSELECT name FROM app.people WHERE id = 3;\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let (ok, out, err) = query(&s.address, &["--format", "csv", "-f", f]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "n\n3\nname\ncid\n");
    let (ok, out, _) = query(
        &s.address,
        &[
            "--format",
            "json",
            "-c",
            "SELECT id FROM app.people WHERE name IS NULL",
        ],
    )
    .await;
    assert!(ok);
    assert_eq!(out, "{\"id\":2}\n");
    // As `mink scan -f json` writes rows (and `mink produce` reads them): every null, and a
    // duration as its count (it was "PT1.5S", which nothing reads back).
    let (ok, out, err) = query(
        &s.address,
        &[
            "--format",
            "json",
            "-c",
            "SELECT arrow_cast(1500, 'Duration(Millisecond)') AS d, map(['k'], [NULL]) AS m",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "{\"d\":1500,\"m\":{\"k\":null}}\n");
    // The table format shows the first --max-rows rows and counts the rest; CSV writes all.
    let (ok, out, err) = query(
        &s.address,
        &["--max-rows", "2", "-c", "SELECT value FROM range(1000000)"],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "+-------+\n| value |\n+-------+\n| 0     |\n| 1     |\n+-------+\n\
         (2 of 1000000 rows shown: --max-rows N shows more, 0 all; --format csv writes every row as it arrives)\n"
    );
    let (ok, out, err) = query(
        &s.address,
        &[
            "--format",
            "csv",
            "--max-rows",
            "2",
            "-c",
            "SELECT value FROM range(100000)",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 100_001);
    // No rows: the header line still, as psql and DuckDB write it.
    let (ok, out, err) = query(
        &s.address,
        &[
            "--format",
            "csv",
            "-c",
            "SELECT id, name FROM app.people WHERE id < 0",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "id,name\n");
    // Statements piped in write their rows alone: no banner (it landed in a CSV file).
    let address = s.address.clone();
    let piped = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let mut child = Command::new(MINK_QUERY)
            .args(["--server", &address, "--format", "csv"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"SELECT 1 AS a;\n")
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&piped.stdout),
        "a\n1\n",
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    // A nested column is refused before anything is written (it failed after the header).
    let (ok, out, err) = query(
        &s.address,
        &[
            "--format",
            "csv",
            "-c",
            "SELECT 1 AS id, make_array(1, 2) AS xs",
        ],
    )
    .await;
    assert!(
        !ok && out.is_empty()
            && err.contains("CSV holds flat columns only, and column \"xs\" is List("),
        "{out}{err}"
    );
    // The prompt's catalog commands work from -c too, as psql's do; the others are refused.
    let (ok, out, err) = query(&s.address, &["-c", "\\d app.people", "-c", "\\dt peo*"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("| name   | Utf8  | YES") && out.contains("| app      | people |"),
        "{out}"
    );
    // A mixed-case name: read as SQL reads it, or as written when that finds none.
    let create = "CREATE TABLE app.\"Events\" (id BIGINT NOT NULL)";
    let (ok, _, err) = query(&s.address, &["-c", create]).await;
    assert!(ok, "{err}");
    for name in ["app.\"Events\"", "app.Events"] {
        let (ok, out, err) = query(&s.address, &["-c", &format!("\\d {name}")]).await;
        assert!(
            ok && out.contains("| id     | Int64 | NO"),
            "{name}: {out}{err}"
        );
    }
    let (ok, _, err) = query(&s.address, &["-c", "\\timing"]).await;
    assert!(!ok && err.contains("works at the prompt only"), "{err}");
    // Errors: DataFusion's message, a non-zero exit.
    let (ok, _, err) = query(&s.address, &["-c", "SELECT * FROM app.nope"]).await;
    assert!(
        !ok && err.contains("table 'mink.app.nope' not found"),
        "{err}"
    );
    // Said once: DataFusion's message holds its source's already.
    let (ok, _, err) = query(&s.address, &["-c", "SELECT nosuch FROM app.people"]).await;
    assert!(
        !ok && err.matches("No field named nosuch").count() == 1,
        "{err}"
    );
    // DDL and SET answer no rows: nothing is printed, in any text format.
    for (format, table) in [("table", "t1"), ("csv", "t2"), ("json", "t3")] {
        let create = format!("CREATE TABLE app.{table} (id BIGINT NOT NULL)");
        let (ok, out, err) = query(
            &s.address,
            &[
                "--format",
                format,
                "-c",
                &create,
                "-c",
                "SET mink.freshness = 'lake'",
            ],
        )
        .await;
        assert!(ok, "{err}");
        assert_eq!(out, "", "{format}");
    }
    let (ok, _, err) = query("127.0.0.1:1", &["-c", "SELECT 1"]).await;
    assert!(!ok && err.contains("mink dev"), "{err}");
    s.stop().await;
}

/// A lake that cannot be opened is named, without the passwords and keys of its URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_that_cannot_be_opened_is_named_without_its_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let (ok, _, err) = query(
        &s.address,
        &[
            "--metadata",
            "postgres://mink:hunter2@127.0.0.1:1/mink",
            "--object-store",
            "s3://b/p?endpoint=http://127.0.0.1:1&secret_access_key=hunter3",
            "-c",
            "SELECT 1",
        ],
    )
    .await;
    assert!(
        !ok && err.contains("postgres://mink:***@127.0.0.1:1/mink")
            && err.contains("secret_access_key=***")
            && !err.contains("hunter"),
        "{err}"
    );
    s.stop().await;
}

/// Parquet output: into a file with --output, or into a pipe; one statement only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_as_parquet() {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let file = dir.path().join("people.parquet");
    let (a, f) = (s.address.clone(), file.to_str().unwrap().to_string());
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        mink_query(
            &a,
            &[
                "--format",
                "parquet",
                "-o",
                &f,
                "-c",
                "SELECT id, name FROM app.people ORDER BY id",
            ],
        )
    })
    .await
    .unwrap();
    assert!(ok && out.is_empty(), "{err}");
    let read = |bytes: bytes::Bytes| {
        let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
    };
    let rows = read(std::fs::read(&file).unwrap().into());
    assert_eq!(rows.num_rows(), 3);
    assert_eq!(
        rows.column(0).as_ref(),
        &Int64Array::from(vec![1, 2, 3]) as &dyn arrow::array::Array
    );
    assert_eq!(
        rows.column(1).as_ref(),
        &StringArray::from(vec![Some("ann"), None, Some("cid")]) as &dyn arrow::array::Array
    );
    // Standard output is a pipe here: the file goes there.
    let a = s.address.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(MINK_QUERY)
            .args(["--server", &a, "--format", "parquet", "-c"])
            .arg("SELECT count(*) AS n FROM app.people")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success());
    assert!(out.stdout.starts_with(b"PAR1") && out.stdout.ends_with(b"PAR1"));
    assert_eq!(read(out.stdout.into()).num_rows(), 1);
    // Seconds and millisecond dates, which Parquet cannot name, are written as milliseconds
    // and days, so readers without Arrow's schema see a timestamp and a date, not integers.
    let a = s.address.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(MINK_QUERY)
            .args(["--server", &a, "--format", "parquet", "-c"])
            .arg("SELECT to_timestamp_seconds(1700000000) AS ts, arrow_cast(DATE '2024-01-02', 'Date64') AS d")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success());
    let reader =
        parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(out.stdout.clone()))
            .unwrap();
    let types: Vec<String> = {
        use parquet::file::reader::FileReader as _;
        let schema = reader.metadata().file_metadata().schema_descr();
        (0..schema.num_columns())
            .map(|i| format!("{:?}", schema.column(i).logical_type_ref()))
            .collect()
    };
    assert!(
        types[0].contains("Timestamp") && types[0].contains("MILLIS") && types[1].contains("Date"),
        "{types:?}"
    );
    let rows = read(out.stdout.into());
    assert_eq!(
        arrow::util::display::array_value_to_string(rows.column(0), 0).unwrap(),
        "2023-11-14T22:13:20Z"
    );
    assert_eq!(
        arrow::util::display::array_value_to_string(rows.column(1), 0).unwrap(),
        "2024-01-02"
    );
    // One file holds one statement's rows; the prompt writes no Parquet.
    let (ok, _, err) = query(
        &s.address,
        &["--format", "parquet", "-c", "SELECT 1", "-c", "SELECT 2"],
    )
    .await;
    assert!(!ok && err.contains("one statement's rows"), "{err}");
    let (ok, _, err) = query(&s.address, &["--format", "parquet"]).await;
    assert!(!ok && err.contains("not to the prompt"), "{err}");
    s.stop().await;
}

/// The prompt in a tmux pane: a multi-line statement, `\d`, `\d table`, `\timing`, an error
/// that does not end the session, history (the up arrow), `\q`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_in_a_terminal() {
    let has_tmux = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_tmux {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but tmux is not installed"
        );
        eprintln!("skipping: no tmux");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let session = format!("mink-query-{}", std::process::id());
    let socket = dir.path().join("tmux.sock");
    let address = s.address.clone();
    let home = dir.path().to_path_buf();
    // A failed check must not leave the tmux server and its prompt running.
    struct KillServer(std::path::PathBuf);
    impl Drop for KillServer {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .arg("-S")
                .arg(&self.0)
                .arg("kill-server")
                .output();
        }
    }
    let _server = KillServer(socket.clone());
    tokio::task::spawn_blocking(move || {
        let tmux = |args: &[&str]| {
            let out = Command::new("tmux")
                .arg("-S")
                .arg(&socket)
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "tmux {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        // The prompt starts once the pane's output is piped to us (`read` holds it till then).
        // The progress spinner shows at once, so every statement draws it.
        let command = format!(
            "read _; HOME={} MINK_QUERY_PROGRESS_AFTER_MS=0 exec {MINK_QUERY} --server {address}",
            home.display()
        );
        tmux(&[
            "new-session",
            "-d",
            "-s",
            &session,
            "-x",
            "160",
            "-y",
            "50",
            &command,
        ]);
        // Every output of the pane is an event (through a FIFO); the end of the pane closes it.
        let fifo = home.join("pane.fifo");
        assert!(
            Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let (output, events) = std::sync::mpsc::channel::<()>();
        // Everything the pane printed, including what was drawn and cleared since.
        let printed = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let reader = {
            let fifo = fifo.clone();
            let printed = Arc::clone(&printed);
            std::thread::spawn(move || {
                use std::io::Read as _;
                let mut pipe = std::fs::File::open(&fifo).unwrap();
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf)
                    && n > 0
                {
                    printed.lock().unwrap().extend_from_slice(&buf[..n]);
                    if output.send(()).is_err() {
                        return;
                    }
                }
            })
        };
        tmux(&[
            "pipe-pane",
            "-t",
            &session,
            "-o",
            &format!("cat >> {}", fifo.display()),
        ]);
        tmux(&["send-keys", "-t", &session, "Enter"]);
        let screen = || tmux(&["capture-pane", "-p", "-t", &session, "-S", "-200"]);
        // Checks the screen on each output until `seen` holds, failing at the deadline with
        // what it waited for and the screen.
        let until = |what: &str, seen: &dyn Fn(&str) -> bool| {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let s = screen();
                if seen(&s) {
                    return s;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if events.recv_timeout(left).is_err() {
                    panic!("waited for {what}; the screen:\n{}", screen());
                }
            }
        };
        // Text goes literally (`-l`); a trailing `;` is escaped, as tmux takes it for its own
        // command separator.
        let typed = |text: &str| {
            let text = match text.strip_suffix(';') {
                Some(t) => format!("{t}\\;"),
                None => text.to_string(),
            };
            tmux(&["send-keys", "-t", &session, "-l", &text]);
            tmux(&["send-keys", "-t", &session, "Enter"]);
        };
        let key = |name: &str| {
            tmux(&["send-keys", "-t", &session, name]);
        };
        until("the prompt", &|s| s.contains("mink>"));
        typed("SELECT name");
        until("the continuation prompt", &|s| s.contains("->"));
        typed("FROM app.people WHERE id = 1;");
        until("the row", &|s| s.contains("| ann "));
        typed("\\d");
        until("the table list", &|s| s.contains("| app      | people |"));
        typed("\\dt peo*");
        until("the tables matching peo*", &|s| {
            s.matches("| app      | people |").count() >= 2
        });
        typed("\\dt nomatch?");
        until("an empty table list", &|s| {
            s.contains("| database | table |\n+----------+-------+\n+")
        });
        typed("\\d app.people");
        until("the columns", &|s| s.contains("| name   | Utf8  | YES"));
        // A virtual table, which the information schema does not list.
        typed("\\d app.people$changelog");
        until("the changelog's columns", &|s| {
            s.contains("| _change_type ")
        });
        typed("\\timing");
        until("timing on", &|s| s.contains("Timing is on."));
        typed("SELECT nope FROM app.people;");
        until("the error", &|s| s.contains("error:") && s.contains("nope"));
        // The up arrow brings back the last statement; the session is still alive.
        key("Up");
        until("the recalled statement", &|s| {
            s.matches("SELECT nope FROM app.people;").count() >= 2
        });
        key("C-u");
        typed("SELECT count(*) FROM app.people;");
        let shown = until("the count and its time", &|s| {
            s.contains("| 3 ") && s.contains("Time: ")
        });
        // The spinner was drawn while the statement ran, and cleared before its rows.
        let drawn = String::from_utf8_lossy(&printed.lock().unwrap()).into_owned();
        assert!(drawn.contains("running"), "no progress was drawn:\n{drawn}");
        assert!(!shown.contains("running"), "the spinner stayed:\n{shown}");
        // Ctrl-C cancels a running statement and the prompt goes on (it ended the process).
        typed("SELECT count(*) AS n FROM range(1000000000000);");
        until("the long statement to run", &|s| {
            s.lines().last().is_some_and(|l| l.contains("running")) || s.contains("running")
        });
        key("C-c");
        until("the cancel", &|s| s.contains("cancelled"));
        typed("SELECT 41 + 1 AS answer;");
        until("the next statement's row", &|s| s.contains("| 42 "));
        typed("\\q");
        // The prompt ends, its pane with it, and the pipe closes.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match events.recv_timeout(left) {
                Ok(()) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("\\q did not end the prompt; the screen:\n{}", screen())
                }
            }
        }
        reader.join().unwrap();
        assert!(
            home.join(".mink_query_history").exists(),
            "the history was saved"
        );
    })
    .await
    .unwrap();
    s.stop().await;
}

/// `mink-query -c ... | head`: a standard output whose reader is gone ends the output quietly,
/// in every format (each writer wraps the broken pipe its own way), as `mink scan` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_the_output_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let a = s.address.clone();
    tokio::task::spawn_blocking(move || {
        for format in ["table", "csv", "json", "parquet"] {
            // The reading end is gone before the command starts: every write to stdout fails.
            let (reader, writer) = std::io::pipe().unwrap();
            drop(reader);
            let out = Command::new(MINK_QUERY)
                .args(["--server", &a, "--format", format])
                .args(["-c", "SELECT id, name FROM app.people"])
                .stdout(writer)
                .stderr(std::process::Stdio::piped())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stderr.is_empty(),
                "--format {format} into a closed pipe: {:?}, stderr: {stderr}",
                out.status
            );
        }
    })
    .await
    .unwrap();
    s.stop().await;
}

/// A one-shot `mink-query -c` delivers its scan's tail report before it exits, so its query of
/// a long log tail brings the table's next tiering round forward (the process used to exit
/// before the report was sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_query_reports_the_tail_it_read_before_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve_with(dir.path(), |c| c.tail_rows_for_a_round = 20).await;
    let metadata = format!("sqlite://{}", dir.path().join("meta.db").display());
    let objects = dir.path().join("objects").display().to_string();
    let sql = |statement: &str| {
        let (ok, out, err) = mink_query(
            &s.address,
            &[
                "--metadata",
                &metadata,
                "--object-store",
                &objects,
                "-c",
                statement,
            ],
        );
        assert!(ok, "{statement}: {err}");
        out
    };
    let values = |ids: std::ops::Range<i64>| {
        let rows: Vec<String> = ids.map(|i| format!("({i})")).collect();
        format!("INSERT INTO app.hot VALUES {}", rows.join(", "))
    };
    // Freshness 60 s: without reports, a round every 30 s.
    sql(
        "CREATE TABLE app.hot (id BIGINT NOT NULL) WITH ('bucket.num' = '1', \
         'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '60s')",
    );
    sql(&values(0..50));
    s.node.tier_now("app", "hot").await.unwrap();
    sql(&values(50..80));
    // 30 tail rows, more than 20 (`max` reads them; `count(*)` alone reads nothing).
    assert_eq!(
        sql("SELECT count(*), max(id) FROM app.hot").lines().nth(3),
        Some("| 80       | 79              |")
    );
    let table_id = s
        .node
        .view()
        .state
        .table_by_name("app", "hot")
        .unwrap()
        .table_id;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = s.node.view();
        let tiered = view
            .state
            .lake_snapshots
            .get(&table_id)
            .and_then(|l| l.tiered_offset(0, 0));
        if tiered == Some(80) {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the reported tail brought no round within 20 s (tiered to {tiered:?})"
        );
        let _ = s.node.wait_applied(view.applied_index + 1, left).await;
    }
    s.stop().await;
}

/// `--server` as `mink` takes it: `MINK_SERVER=` (set, empty) is the default address, and a
/// host without a port is refused before anything is tried (it was tried, and the empty one
/// failed as "cannot reach : invalid URI").
#[test]
fn the_server_address_is_checked_as_mink_checks_it() {
    let run = |env: Option<&str>, args: &[&str]| {
        let mut command = Command::new(MINK_QUERY);
        command.env_remove("MINK_SERVER");
        if let Some(v) = env {
            command.env("MINK_SERVER", v);
        }
        let out = command
            .args(args)
            .args(["-c", "SELECT 1"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(None, &["--server", "127.0.0.1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("expected HOST:PORT, such as 127.0.0.1:7171"),
        "{err}"
    );
    // The default address: reached (another test's `mink dev` may serve on it), or named.
    let (code, err) = run(Some(""), &[]);
    assert!(
        code == Some(0)
            || err.contains("is a node running at 127.0.0.1:7171? Start one with `mink dev`"),
        "{err}"
    );
}

/// Pointed at a Flight SQL port (which `mink dev` prints beside the node's), `mink-query` says
/// what it looks like and which address to give: the error was `unknown action
/// "list_databases"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pointed_at_a_flight_sql_port_it_says_which_address_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sql_address = listener.local_addr().unwrap().to_string();
    let engine = mink_query::QueryEngine::new(Client::connect(&s.address).await.unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sql = tokio::spawn(mink_query::flight_sql::MinkFlightSql::new(engine).serve(
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let (ok, _, err) = mink_query(&sql_address, &["-c", "SELECT 1"]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "{sql_address} serves Arrow Flight but is not a Mink node (a Flight SQL port"
        )) && err.contains("mink-query talks to a node's Flight address"),
        "{err}"
    );
    let _ = stop.send(());
    sql.await.unwrap().unwrap();
    s.stop().await;
}
