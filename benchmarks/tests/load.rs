//! The user-facing benchmark (`mink-bench produce|consume|e2e`) against a node serving Arrow
//! Flight and the Kafka protocol: every run's records land, the summary and the report say
//! what was measured, and what a run cannot do is refused before it starts.

use std::process::Output;

use mink_node::{BucketRef, Node};

/// Runs `mink-bench` with `args` (off the runtime's threads).
async fn bench(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_mink-bench"))
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The stdout of a run that must succeed.
async fn ok(args: &[&str]) -> String {
    let out = bench(args).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "mink-bench {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The `records` cell of the summary's row of `side`.
fn records(summary: &str, side: &str) -> u64 {
    let row = summary
        .lines()
        .find(|l| l.starts_with(&format!("| {side} |")))
        .unwrap_or_else(|| panic!("no {side} row in\n{summary}"));
    row.split('|').nth(2).unwrap().trim().parse().unwrap()
}

/// Rows stored in every bucket of `database.table`.
fn stored(node: &Node, database: &str, table: &str) -> u64 {
    let info = node.describe_table(database, table).unwrap();
    info.buckets
        .iter()
        .map(|b| {
            let (start, end) = node
                .bucket_offsets(&BucketRef::new(database, table, None, b.bucket))
                .unwrap();
            end - start
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_consume_and_e2e_over_flight_and_kafka() {
    let dir = tempfile::tempdir().unwrap();
    let s = mink_testkit::serve(dir.path(), mink_kafka::KafkaConfig::default()).await;
    let report = dir.path().join("flight.md");
    let common = [
        "--duration",
        "60",
        "--record-size",
        "100",
        "--partitions",
        "3",
    ];

    // Flight: a fixed number of records, a Markdown report with its plots beside it.
    let mut args = vec!["produce", "--flight", &s.flight, "--max-records", "3000"];
    args.extend(["--batch-records", "500", "--producers", "2"]);
    args.extend(common);
    args.extend(["--report", report.to_str().unwrap()]);
    let out = ok(&args).await;
    assert_eq!(records(&out, "produced"), 3000, "{out}");
    assert_eq!(stored(&s.node, "bench", "mink-bench"), 3000);
    let md = std::fs::read_to_string(&report).unwrap();
    assert!(md.contains("| produced | 3000 |") && md.contains("![latency](flight-latency.svg)"));
    for chart in ["flight-throughput.svg", "flight-latency.svg"] {
        let svg = std::fs::read_to_string(dir.path().join(chart)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{chart}: {svg}"
        );
    }
    let mut args = vec!["consume", "--flight", &s.flight, "--consumers", "2"];
    args.extend(common);
    assert_eq!(records(&ok(&args).await, "consumed"), 3000);

    // Kafka: the same workload through the Kafka listener, an HTML report, JSON figures.
    let html = dir.path().join("kafka.html");
    let mut args = vec!["produce", "--kafka", &s.kafka, "--max-records", "2000"];
    args.extend(["--acks", "1", "--json", "--report", html.to_str().unwrap()]);
    args.extend(common);
    let out = ok(&args).await;
    assert_eq!(records(&out, "produced"), 2000, "{out}");
    assert_eq!(stored(&s.node, "kafka", "mink-bench"), 2000);
    let json: serde_json::Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(json["figures"][0]["records"], 2000);
    assert!(
        json["figures"][0]["p99_ms"].as_f64().unwrap() > 0.0,
        "{json}"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<table>") && page.matches("<svg").count() == 2);
    let mut args = vec!["consume", "--kafka", &s.kafka];
    args.extend(common);
    assert_eq!(records(&ok(&args).await, "consumed"), 2000);

    // End to end, rate-limited: every record produced is consumed, with its latency. A count,
    // not a short duration, ends the run: a busy machine may take a second for the first write.
    for (transport, address) in [("--kafka", &s.kafka), ("--flight", &s.flight)] {
        let args = [
            "e2e",
            transport,
            address,
            "--duration",
            "60",
            "--max-records",
            "2000",
            "--rate",
            "2000",
            "--record-size",
            "64",
            "--batch-records",
            "200",
        ];
        let out = ok(&args).await;
        assert_eq!(records(&out, "produced"), 2000, "{out}");
        assert_eq!(records(&out, "consumed"), 2000, "{out}");
        assert!(out.contains("/ rate |"), "{out}");
    }

    // A paced run sends what falls due within --duration, never a batch ahead of time: at 100
    // records/s for a second, at most 100 (a whole batch of 1 000 went out at the start, and
    // the run waited ten seconds for the next one; one more was due at the deadline).
    for (transport, address, topic) in [
        ("--kafka", &s.kafka, "paced-kafka"),
        ("--flight", &s.flight, "paced-flight"),
    ] {
        let args = [
            "produce",
            transport,
            address,
            "--topic",
            topic,
            "--rate",
            "100",
            "--duration",
            "1",
            "--record-size",
            "64",
        ];
        let out = ok(&args).await;
        let sent = records(&out, "produced");
        assert!((1..=100).contains(&sent), "{transport}: {out}");
    }

    // Ctrl-C ends a run with the figures of what was acknowledged until then (it printed
    // nothing, and wrote no report).
    let report = dir.path().join("interrupted.md");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_mink-bench"))
        .args(["produce", "--flight", &s.flight, "--topic", "interrupted"])
        .args(["--duration", "600", "--record-size", "64", "--report"])
        .arg(&report)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Each metadata change (the table created, rows committed) wakes the wait. Until a second
    // write of its 1000 rows is stored: the one writer sends it once the first is acknowledged,
    // so the run has acknowledged rows to report (the first stored alone raced its ack).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while s
        .node
        .describe_table("bench", "interrupted")
        .map_or(0, |_| stored(&s.node, "bench", "interrupted"))
        <= 1000
    {
        let applied = s.node.view().applied_index;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            s.node.wait_applied(applied + 1, left).await.is_ok(),
            "waited 60 s for the run's first rows"
        );
    }
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let out = tokio::task::spawn_blocking(move || run.wait_with_output().unwrap())
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(records(&stdout, "produced") > 0, "{stdout}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(report.exists());

    // Refused before anything is sent.
    let missing = dir.path().join("missing").join("run.md");
    let missing = missing.to_str().unwrap();
    for (args, expected) in [
        (
            vec!["produce", "--flight", &s.flight, "--acks", "1"],
            "acknowledged once durable",
        ),
        (vec!["produce"], "<--flight <FLIGHT>|--kafka <KAFKA>>"),
        (
            vec!["produce", "--kafka", &s.kafka, "--in-flight-bytes", "0"],
            "--in-flight-bytes 0: at least one record's bytes (--record-size 1024)",
        ),
        // Before the run, not after it: no topic `unwritten` is created.
        (
            vec![
                "produce",
                "--kafka",
                &s.kafka,
                "--topic",
                "unwritten",
                "--report",
                missing,
            ],
            "missing does not exist",
        ),
        (
            vec!["produce", "--kafka", &s.kafka, "--report", "out.txt"],
            "name a .md or .html file",
        ),
        (
            vec!["produce", "--kafka", &s.kafka, "--record-size", "4"],
            "8-byte send time",
        ),
        // Options of the other side: ignored, they said nothing.
        (
            vec!["consume", "--flight", &s.flight, "--max-records", "10"],
            "--max-records applies to producers",
        ),
        (
            vec!["produce", "--flight", &s.flight, "--consumers", "3"],
            "--consumers applies to consume and e2e",
        ),
    ] {
        let out = bench(&args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
    }
    assert!(s.node.describe_table("kafka", "unwritten").is_err());
    s.stop().await;
}

/// `mink-bench sql` against Mink's Flight SQL server: every statement runs and reads its whole
/// result, the rows add up, and a statement the server refuses stops the run naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_statements_over_flight_sql() {
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let s = mink_testkit::serve(dir.path(), mink_kafka::KafkaConfig::default()).await;
    let client = mink_client::Client::connect(&s.flight).await.unwrap();
    client.create_database("bench", false).await.unwrap();
    let rows = arrow::array::RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(arrow::array::Int64Array::from_iter_values(0..100)) as arrow::array::ArrayRef,
        ),
        (
            "v",
            Arc::new(arrow::array::StringArray::from_iter_values(
                (0..100).map(|i| format!("row {i}")),
            )),
        ),
    ])
    .unwrap();
    client
        .create_table(
            "bench",
            "t",
            &rows.schema(),
            [("bucket.num", "2")],
            &[],
            false,
        )
        .await
        .unwrap();
    client.writer("bench", "t").write(&rows).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sql_address = listener.local_addr().unwrap().to_string();
    let engine = mink_query::QueryEngine::new(client.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(mink_query::flight_sql::MinkFlightSql::new(engine).serve(
        listener,
        async {
            let _ = stopped.await;
        },
    ));

    let html = dir.path().join("sql.html");
    let missing = dir.path().join("missing").join("sql.html");
    let missing = missing.to_str().unwrap().to_string();
    let out = ok(&[
        "sql",
        "--flight-sql",
        &sql_address,
        "--query",
        "SELECT count(*) FROM bench.t",
        "--query",
        "SELECT id, v FROM bench.t WHERE id < 10",
        "--clients",
        "2",
        "--max-queries",
        "10",
        "--duration",
        "60",
        "--json",
        "--report",
        html.to_str().unwrap(),
    ])
    .await;
    assert_eq!(records(&out, "statements"), 10, "{out}");
    let json: serde_json::Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    // Five of each statement: 5 × 1 + 5 × 10 rows.
    assert_eq!(json["rows"], 55, "{json}");
    assert!(json["figures"][0]["p50_ms"].as_f64().unwrap() > 0.0);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("mink-bench sql over flight-sql") && page.matches("<svg").count() == 2);

    // docs/benchmarks.md's statements, over the README quick start's `app.events`.
    client.create_database("app", false).await.unwrap();
    let events = arrow::array::RecordBatch::try_new(
        Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("user_id", arrow::datatypes::DataType::Int64, false),
            arrow::datatypes::Field::new("event", arrow::datatypes::DataType::Utf8, true),
        ])),
        vec![
            Arc::new(arrow::array::Int64Array::from(vec![1, 2])),
            Arc::new(arrow::array::StringArray::from(vec!["signup", "login"])),
        ],
    )
    .unwrap();
    client
        .create_table(
            "app",
            "events",
            &events.schema(),
            [("bucket.num", "4"), ("bucket.key", "user_id")],
            &[],
            false,
        )
        .await
        .unwrap();
    client.writer("app", "events").write(&events).await.unwrap();
    let out = ok(&[
        "sql",
        "--flight-sql",
        &sql_address,
        "--clients",
        "1",
        "--max-queries",
        "2",
        "--duration",
        "60",
        "--query",
        "SELECT count(*) FROM app.events",
        "--query",
        "SELECT event, count(*) FROM app.events GROUP BY event",
        "--json",
    ])
    .await;
    let json: serde_json::Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(json["rows"], 1 + 2, "{json}");

    for (args, expected) in [
        (
            vec![
                "sql",
                "--flight-sql",
                &sql_address,
                "--query",
                "SELECT nope FROM bench.t",
            ],
            "SELECT nope FROM bench.t",
        ),
        (
            vec![
                "sql",
                "--flight-sql",
                &sql_address,
                "--query",
                "SELECT 1",
                "--clients",
                "0",
            ],
            "--clients takes at least 1",
        ),
        (
            vec![
                "sql",
                "--flight-sql",
                &sql_address,
                "--query",
                "SELECT 1",
                "--report",
                &missing,
            ],
            "missing does not exist",
        ),
        // The node's Flight address, not its Flight SQL one.
        (
            vec!["sql", "--flight-sql", &s.flight, "--query", "SELECT 1"],
            &format!("{} serves Arrow Flight, not Flight SQL", s.flight),
        ),
    ] {
        let out = bench(&args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
    }
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    s.stop().await;
}

/// The summary states the topic as the run found it, not as asked: an existing topic or table
/// keeps its partitions (and the summary says `--partitions` was not applied), and a consume
/// run reports the mean size of the records it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_states_what_was_measured() {
    let dir = tempfile::tempdir().unwrap();
    let s = mink_testkit::serve(dir.path(), mink_kafka::KafkaConfig::default()).await;
    for (transport, address, name) in [
        ("--kafka", &s.kafka, "topic mink-bench"),
        ("--flight", &s.flight, "table bench.mink-bench"),
    ] {
        let produce = |partitions: &'static str| {
            vec![
                "produce",
                transport,
                address,
                "--partitions",
                partitions,
                "--record-size",
                "100",
                "--max-records",
                "300",
                "--batch-records",
                "100",
                "--duration",
                "60",
                "--json",
            ]
        };
        let out = ok(&produce("3")).await;
        assert!(
            out.contains(&format!("{name}, 3 partitions, 100 B records,")),
            "{out}"
        );
        let out = ok(&produce("8")).await;
        let kind = name.split(' ').next().unwrap();
        assert!(
            out.contains(&format!(
                "{name}, 3 partitions (the {kind} exists: --partitions 8 not applied), 100 B"
            )),
            "{out}"
        );
        let json: serde_json::Value =
            serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
        assert_eq!(json["partitions"], 3, "{json}");

        // Neither --partitions nor --record-size: the defaults (4, 1024) are not what was read.
        let out = ok(&["consume", transport, address, "--duration", "60", "--json"]).await;
        assert_eq!(records(&out, "consumed"), 600, "{out}");
        // Nothing about producers, acks or a rate: a consume run has none.
        assert!(
            out.contains(&format!(
                "{name}, 3 partitions, 100 B records (mean read), 1 consumers\n"
            )),
            "{out}"
        );
        let json: serde_json::Value =
            serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
        assert_eq!(json["record_size"], 100.0, "{json}");
    }
    s.stop().await;
}

/// A Kafka address nothing listens on fails the run within the reachability timeout, naming
/// the address and librdkafka's cause, before any topic is created or read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_kafka_address_is_named() {
    // A port that was free a moment ago: nothing listens on it once the listener is dropped.
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let run = |mode: &'static str| {
        let address = address.clone();
        async move {
            let started = std::time::Instant::now();
            let out = bench(&[mode, "--kafka", &address, "--duration", "3"]).await;
            (mode, out, started.elapsed())
        }
    };
    let (produce, consume) = tokio::join!(run("produce"), run("consume"));
    for (mode, out, took) in [produce, consume] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && stderr.contains(&format!("cannot reach a Kafka broker at {address}: "))
                && stderr.contains("Connection refused"),
            "{mode}: {stderr}"
        );
        // The reachability timeout (10 s), not CreateTopics' or the consumer's (30 s and more).
        assert!(
            took < std::time::Duration::from_secs(25),
            "{mode}: {took:?}"
        );
    }
}
