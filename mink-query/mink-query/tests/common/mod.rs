//! A node (SQLite metadata, local object store) serving Flight, and a Flight SQL server over
//! it, in the test's process.
#![allow(dead_code, unreachable_pub, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use futures::FutureExt as _;
use mink_client::{Client, protocol};
use mink_node::{Node, NodeConfig};
use mink_query::QueryEngine;
use mink_query::flight_sql::MinkFlightSql;

pub struct Cluster {
    pub node: Node,
    /// The node's Flight listener.
    pub address: String,
    /// The Flight SQL listener.
    pub sql_address: String,
    pub client: Client,
    pub engine: QueryEngine,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    pub async fn start(dir: &std::path::Path) -> Cluster {
        Self::start_with(dir, |_| {}).await
    }

    /// A cluster whose node's settings `tune` changes.
    pub async fn start_with(dir: &std::path::Path, tune: impl FnOnce(&mut NodeConfig)) -> Cluster {
        let Served {
            node,
            address,
            stop,
            task: flight,
        } = Served::start(dir, 1, tune).await;
        let client = Client::connect(&address).await.unwrap();
        // The engine reads lake snapshots itself, from the node's catalog and object store.
        let objects = dir.join("objects");
        let lake = mink_lake::Lake::open(
            &format!("sqlite://{}", dir.join("meta.db").display()),
            objects.to_str().unwrap(),
            s3stream::store::open(objects.to_str().unwrap()).unwrap(),
        )
        .await
        .unwrap();
        let engine = QueryEngine::with_lake(client.clone(), Some(Arc::new(lake)));
        let sql_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sql_address = sql_listener.local_addr().unwrap().to_string();
        let (sql_stop, sql_stopped) = tokio::sync::oneshot::channel::<()>();
        let sql = tokio::spawn(
            MinkFlightSql::new(engine.clone())
                .serve(sql_listener, async {
                    let _ = sql_stopped.await;
                })
                .map(|r| r.unwrap()),
        );
        Cluster {
            node,
            address,
            sql_address,
            client,
            engine,
            stops: vec![stop, sql_stop],
            tasks: vec![flight, sql],
        }
    }

    /// Another node of the cluster (same metadata and object store), serving Flight.
    pub async fn add_node(&self, dir: &std::path::Path, id: u64) -> Served {
        Served::start(dir, id, |_| {}).await
    }

    /// Stops the node's Flight server: the node cannot be reached; Flight SQL goes on.
    pub async fn stop_node_flight(&mut self) {
        let _ = self.stops.remove(0).send(());
        let _ = self.tasks.remove(0).await;
    }

    /// Stops the Flight SQL server (with what it holds: plans, prepared statements) and starts
    /// a new one on the same address, as a restarted `mink-query serve`.
    pub async fn restart_sql(&mut self) {
        let _ = self.stops.pop().expect("a Flight SQL server").send(());
        let _ = self.tasks.pop().expect("a Flight SQL server").await;
        let listener = tokio::net::TcpListener::bind(&self.sql_address)
            .await
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        self.tasks.push(tokio::spawn(
            MinkFlightSql::new(self.engine.clone())
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .map(|r| r.unwrap()),
        ));
        self.stops.push(stop);
    }

    pub async fn stop(mut self) {
        for s in self.stops.drain(..) {
            let _ = s.send(());
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        self.node.shutdown().await;
    }

    /// `SQL` → its rows, each as the text of its values (`NULL` for nulls), in order.
    pub async fn rows(&self, sql: &str) -> Vec<Vec<String>> {
        let batches = self
            .engine
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        text_rows(&batches)
    }

    /// The error `sql` fails with, when planned or when run.
    pub async fn error(&self, sql: &str) -> String {
        match self.engine.sql(sql).await {
            Ok(df) => match df.collect().await {
                Ok(_) => panic!("{sql} did not fail"),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        }
    }

    /// A Flight SQL client of the service.
    pub async fn flight_sql(
        &self,
    ) -> arrow_flight::sql::client::FlightSqlServiceClient<tonic::transport::Channel> {
        arrow_flight::sql::client::FlightSqlServiceClient::new(self.channel().await)
    }

    /// A connection to the Flight SQL service.
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.sql_address))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// The data the tests query: `app.events` (a log table, 3 buckets) and `app.users` (a
    /// primary-key table, 2 buckets, some rows updated and deleted).
    pub async fn load(&self) {
        let c = &self.client;
        c.create_database("app", true).await.unwrap();
        let events = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("kind", DataType::Utf8, true),
            Field::new("amount", DataType::Int64, true),
        ]);
        create(c, "events", &events, &[], 3).await;
        let ids: Vec<i64> = (0..100).collect();
        let kinds = ["view", "click", "buy"];
        let rows = RecordBatch::try_new(
            Arc::new(events),
            vec![
                Arc::new(Int64Array::from(ids.clone())),
                Arc::new(StringArray::from_iter(ids.iter().map(|i| {
                    (i % 10 != 9).then(|| kinds[usize::try_from(i % 3).unwrap()])
                }))),
                Arc::new(Int64Array::from_iter_values(ids.iter().map(|i| i * 10))),
            ],
        )
        .unwrap();
        c.writer("app", "events").write(&rows).await.unwrap();

        let users = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]);
        create(c, "users", &users, &["id"], 2).await;
        let change = |ids: &[i64], names: &[&str], kind: &str| {
            RecordBatch::try_from_iter(vec![
                ("id", Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef),
                (
                    "name",
                    Arc::new(StringArray::from(names.to_vec())) as ArrayRef,
                ),
                (
                    "_row_kind",
                    Arc::new(StringArray::from(vec![kind; ids.len()])) as ArrayRef,
                ),
            ])
            .unwrap()
        };
        let mut w = c.writer("app", "users");
        w.write(&change(
            &[1, 2, 3, 4],
            &["ann", "bob", "cid", "dan"],
            "upsert",
        ))
        .await
        .unwrap();
        w.write(&change(&[2], &["bo"], "upsert")).await.unwrap();
        w.write(&change(&[3], &["-"], "delete")).await.unwrap();
    }
}

async fn create(c: &Client, name: &str, schema: &Schema, key: &[&str], buckets: u32) {
    c.create_table_with(&protocol::CreateTable {
        database: "app".into(),
        table: name.into(),
        schema: protocol::encode_schema(schema).unwrap(),
        options: [
            ("bucket.num".to_string(), buckets.to_string()),
            ("bucket.key".to_string(), "id".to_string()),
        ]
        .into(),
        partition_keys: vec![],
        primary_key: key.iter().map(ToString::to_string).collect(),
        comment: String::new(),
        if_not_exists: false,
    })
    .await
    .unwrap();
}

/// A node serving Flight on a loopback port.
pub struct Served {
    pub node: Node,
    pub address: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    /// Node `id` on the metadata and objects under `dir`, its settings changed by `tune`.
    async fn start(dir: &std::path::Path, id: u64, tune: impl FnOnce(&mut NodeConfig)) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let mut c = NodeConfig::new(
            id,
            &format!("sqlite://{}", dir.join("meta.db").display()),
            dir.join("objects").to_str().unwrap(),
        );
        c.advertised_address = address.clone();
        c.lease_ttl = Duration::from_millis(1000);
        c.engine.flush_delay = Duration::from_millis(5);
        c.leadership_interval = Duration::from_millis(20);
        tune(&mut c);
        let node = Node::start(c).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(
            mink_flight::serve(node.clone(), server_config(), listener, async {
                let _ = stopped.await;
            })
            .map(|r| r.unwrap()),
        );
        Served {
            node,
            address,
            stop,
            task,
        }
    }

    /// Stops serving Flight; the node goes on (it still leads its buckets).
    pub async fn stop_flight(self) -> Node {
        let _ = self.stop.send(());
        let _ = self.task.await;
        self.node
    }
}

/// The node's Flight settings: a request for a metadata index the node has not applied fails
/// after a short wait.
fn server_config() -> mink_flight::ServerConfig {
    mink_flight::ServerConfig {
        max_applied_wait: Duration::from_millis(300),
        ..Default::default()
    }
}

/// Each row of `batches` as the text of its values (`NULL` for nulls).
pub fn text_rows(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let options = arrow::util::display::FormatOptions::default().with_null("NULL");
    for b in batches {
        let formatters: Vec<_> = b
            .columns()
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            rows.push(formatters.iter().map(|f| f.value(r).to_string()).collect());
        }
    }
    rows
}

/// The test virtualenv's Python with the ADBC Flight SQL driver and Polars; `None` (skip)
/// outside CI when they are missing.
pub fn python() -> Option<PathBuf> {
    let venv = std::env::var("MINK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/mink/venv"));
    let python = venv.join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", "import adbc_driver_flightsql.dbapi, polars"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ready {
        return Some(python);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but the ADBC Flight SQL driver or polars is not installed in {} (scripts/test.sh installs them)",
        venv.display()
    );
    eprintln!(
        "skipping: no ADBC driver in {} (run scripts/test.sh)",
        venv.display()
    );
    None
}

/// The engine as a sqllogictest database: every value as text, `NULL` for nulls.
pub struct Slt(pub QueryEngine);

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for Slt {
    type Error = datafusion::error::DataFusionError;
    type ColumnType = sqllogictest::DefaultColumnType;

    async fn run(
        &mut self,
        sql: &str,
    ) -> Result<sqllogictest::DBOutput<Self::ColumnType>, Self::Error> {
        let df = self.0.sql(sql).await?;
        let columns = df.schema().fields().len();
        let batches = df.collect().await?;
        // sqllogictest's convention for an empty string.
        let rows = text_rows(&batches)
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|v| if v.is_empty() { "(empty)".into() } else { v })
                    .collect()
            })
            .collect();
        Ok(sqllogictest::DBOutput::Rows {
            types: vec![sqllogictest::DefaultColumnType::Any; columns],
            rows,
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "mink-query"
    }
}
