//! The command line as people and scripts meet it: `status` before any run and into a closed
//! pipe, `run` against brokers that cannot be reached, a wrong config, plain logs.

use std::time::Duration;

mod common;
use common::connect;

/// A free loopback address (nothing listens there).
fn free_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// A node with the raw log tables `tables` (database, table), and a client of it.
async fn serve_with_raw_tables(
    dir: &std::path::Path,
    tables: &[(&str, &str)],
) -> (mink_testkit::Served, mink_client::Client) {
    let s = mink_testkit::serve(dir, mink_kafka::KafkaConfig::default()).await;
    let client = mink_client::Client::connect(&s.flight).await.unwrap();
    for (database, table) in tables {
        client.create_database(database, true).await.unwrap();
        client
            .create_table(
                database,
                table,
                &mink_log::raw::schema(),
                Vec::<(String, String)>::new(),
                &[],
                false,
            )
            .await
            .unwrap();
    }
    (s, client)
}

fn write_config(dir: &std::path::Path, flight: &str, kafka: &str) -> String {
    let config = dir.join("connect.toml");
    std::fs::write(
        &config,
        format!(
            r#"
name = "fresh"
mink = "{flight}"

[kafka]
bootstrap = "{kafka}"

[[source]]
topic = "orders"
table = "shop.orders"
format = "raw"

[[sink]]
table = "shop.customers"
topic = "customers"
"#
        ),
    )
    .unwrap();
    config.to_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_before_a_run_and_into_a_closed_pipe() {
    let dir = tempfile::tempdir().unwrap();
    // Topic `orders` is the node's raw log table kafka.orders.
    let (s, _) =
        serve_with_raw_tables(dir.path(), &[("shop", "customers"), ("kafka", "orders")]).await;
    let config = write_config(dir.path(), &s.flight, &s.kafka);

    // No run has stored state: said, and the table shown from where a run would start.
    let out = connect(&["status", "--config", &config])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("no run of connector fresh has stored source state yet"),
        "{stdout}"
    );
    assert!(
        stdout.contains("no run of connector fresh has stored sink state yet"),
        "{stdout}"
    );
    assert!(stdout.contains("total lag: 0 records"), "{stdout}");
    assert!(!stderr.contains("does not exist"), "{stderr}");

    // `status | head` that has read enough: a quiet, successful end.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = connect(&["status", "--config", &config])
        .stdout(writer)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "{stderr}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_checks_kafka_before_it_creates_anything() {
    let dir = tempfile::tempdir().unwrap();
    let s = mink_testkit::serve(dir.path(), mink_kafka::KafkaConfig::default()).await;
    let nowhere = free_address();
    let config = write_config(dir.path(), &s.flight, &nowhere);
    let run = connect(&["run", "--config", &config])
        .env("RUST_LOG", "info")
        .env("RUST_BACKTRACE", "1")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("waited 60 s for run to give up on an unreachable Kafka")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("Error: cannot reach Kafka at {nowhere}")),
        "{stderr}"
    );
    // Logs to a pipe are plain text.
    assert!(!stderr.contains('\u{1b}'), "colour codes in {stderr:?}");
    // Status says it the same way (it printed librdkafka's every failed try).
    let out = connect(&["status", "--config", &config])
        .output()
        .await
        .unwrap();
    let status = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{status}");
    assert!(
        status.contains(&format!("Error: cannot reach Kafka at {nowhere}")),
        "{status}"
    );
    assert!(status.lines().count() < 20, "{status}");
    let client = mink_client::Client::connect(&s.flight).await.unwrap();
    let e = client.describe_table("shop", "orders").await.unwrap_err();
    assert_eq!(
        e.code(),
        Some(mink_client::ErrorCode::NotFound),
        "the raw table was created: {e}"
    );
    // A Kafka that answers but lacks a source's topic: the same, naming the topic (the
    // first fetch failed after the tables were made). Status says so too, not "lag 0".
    let config = write_config(dir.path(), &s.flight, &s.kafka);
    for command in ["run", "status"] {
        let out = connect(&[command, "--config", &config])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(1)
                && stderr.contains(&format!(
                    "Error: source orders: Kafka at {} has no topic \"orders\"",
                    s.kafka
                )),
            "{command}: {stderr}"
        );
    }
    let e = client.describe_table("shop", "orders").await.unwrap_err();
    assert_eq!(e.code(), Some(mink_client::ErrorCode::NotFound), "{e}");
    s.stop().await;
}

/// A run whose json source or sink names a table that does not exist fails before it creates
/// anything: it left its state table (and the source's database) behind, listed and moved by
/// rebalances from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_fails_the_run_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let (s, client) = serve_with_raw_tables(dir.path(), &[("kafka", "orders")]).await;
    for (name, section, error) in [
        (
            "src",
            "[[source]]\ntopic = \"orders\"\ntable = \"typo.orders\"\nformat = \"json\"\n",
            "Error: source orders: table typo.orders",
        ),
        (
            "snk",
            "[[sink]]\ntable = \"typo.customers\"\ntopic = \"customers\"\n",
            "Error: sink table typo.customers",
        ),
    ] {
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "name = \"{name}\"\nmink = \"{}\"\n\n[kafka]\nbootstrap = \"{}\"\n\n{section}",
                s.flight, s.kafka
            ),
        )
        .unwrap();
        let out = connect(&["run", "--config", config.to_str().unwrap()])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(error), "{stderr}");
        let databases = client.list_databases().await.unwrap();
        assert!(
            !databases.iter().any(|d| d == "typo" || d == "mink_connect"),
            "{name}: created {databases:?}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn a_config_error_is_printed_without_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("connect.toml");
    std::fs::write(&config, "name = \"x\"\nmink = \"n:1\"\nbogus = 1\n").unwrap();
    let out = connect(&["run", "--config", config.to_str().unwrap()])
        .env("RUST_BACKTRACE", "1")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("Error: parsing "), "{stderr}");
    assert!(stderr.contains("bogus"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert!(
        !stderr.contains("Caused by"),
        "the causes on the error's line: {stderr}"
    );
}

/// SIGTERM stops a running connector with a line saying so and a success status (it was 143,
/// unlogged, which systemd counts as a failure); a restart resumes from what Mink records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_running_connector_cleanly() {
    use tokio::io::AsyncBufReadExt as _;
    let dir = tempfile::tempdir().unwrap();
    // The source's topic is a raw log table of the Kafka database.
    let (s, _) =
        serve_with_raw_tables(dir.path(), &[("shop", "customers"), ("kafka", "orders")]).await;
    let config = write_config(dir.path(), &s.flight, &s.kafka);
    let mut run = connect(&["run", "--config", &config])
        .env("RUST_LOG", "info")
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(run.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    // Running once its sink has made its topic.
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let started = line.contains("created the sink's topic");
            seen.push(line);
            if started {
                return;
            }
        }
        panic!("the connector ended before it ran: {seen:#?}");
    })
    .await
    .expect("the connector did not start its sink within 60 s");
    let pid = run.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-s", "TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(30), run.wait())
        .await
        .expect("the connector did not stop within 30 s of SIGTERM")
        .unwrap();
    let mut rest = Vec::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        rest.push(line);
    }
    assert!(status.success(), "{status:?}: {rest:#?}");
    assert!(
        rest.iter()
            .any(|l| l.contains("stopped; a restart goes on from the positions recorded in Mink")),
        "{rest:#?}"
    );
    s.stop().await;
}

/// A raw source's table that exists with other columns (a typed table named by mistake) is
/// refused at start, naming the table: it failed the first write, naming none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_source_into_a_typed_table_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (s, client) =
        serve_with_raw_tables(dir.path(), &[("kafka", "orders"), ("shop", "customers")]).await;
    client
        .create_table(
            "shop",
            "orders",
            &arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
                "id",
                arrow::datatypes::DataType::Int64,
                false,
            )]),
            Vec::<(String, String)>::new(),
            &[],
            false,
        )
        .await
        .unwrap();
    let config = write_config(dir.path(), &s.flight, &s.kafka);
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        connect(&["run", "--config", &config]).output(),
    )
    .await
    .expect("run gave up within 60 s")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1)
            && stderr.contains(
                "Error: source orders: a raw source's table: shop.orders exists with other columns (id Int64)"
            ),
        "{stderr}"
    );
    s.stop().await;
}
