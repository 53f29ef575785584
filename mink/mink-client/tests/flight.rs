//! The Flight service on real nodes (SQLite metadata, local object store), through the Rust
//! client and through arrow-flight's plain client for what a careless or hostile client sends.
#![allow(clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightData, FlightDescriptor, Ticket};
use futures::{StreamExt, TryStreamExt};
use mink_client::{Client, ClientError, ErrorCode, Scan, protocol};
use mink_flight::encode::BatchEncoder;
use mink_flight::{ServerConfig, serve};
use mink_node::{Node, NodeConfig};

struct Server {
    node: Node,
    address: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(dir: &std::path::Path, node_id: u64) -> Server {
        Self::start_with(dir, node_id, ServerConfig::default()).await
    }

    async fn start_with(dir: &std::path::Path, node_id: u64, config: ServerConfig) -> Server {
        Self::start_advertising(dir, node_id, config, None).await
    }

    /// A node telling clients to reach it at `advertised` (a proxy), not its own address.
    async fn start_advertising(
        dir: &std::path::Path,
        node_id: u64,
        config: ServerConfig,
        advertised: Option<&str>,
    ) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let mut c = NodeConfig::new(
            node_id,
            &format!("sqlite://{}", dir.join("meta.db").display()),
            dir.join("objects").to_str().unwrap(),
        );
        c.advertised_address = advertised.unwrap_or(&address).to_string();
        c.lease_ttl = Duration::from_millis(1000);
        c.engine.flush_delay = Duration::from_millis(5);
        c.leadership_interval = Duration::from_millis(20);
        c.retention_interval = Duration::from_millis(100);
        let node = Node::start(c).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(
            serve(node.clone(), config, listener, async {
                let _ = stopped.await;
            })
            .map(|r| r.unwrap()),
        );
        Server {
            node,
            address,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = self.task.await;
        self.node.shutdown().await;
    }
}

use futures::FutureExt as _;

/// A primary-key table keyed by (user_id, event), bucketed by user_id.
async fn pk_table(client: &Client, name: &str, buckets: u32) -> protocol::TableDescription {
    client.create_database("app", true).await.unwrap();
    let schema = Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
        Field::new("n", DataType::Int64, true),
    ]);
    client
        .create_table_with(&protocol::CreateTable {
            database: "app".into(),
            table: name.into(),
            schema: protocol::encode_schema(&schema).unwrap(),
            options: [
                ("bucket.num".to_string(), buckets.to_string()),
                ("bucket.key".to_string(), "user_id".to_string()),
            ]
            .into(),
            partition_keys: vec![],
            primary_key: vec!["user_id".into(), "event".into()],
            comment: String::new(),
            if_not_exists: false,
        })
        .await
        .unwrap()
}

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
    ])
}

fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef,
        ),
        (
            "event",
            Arc::new(StringArray::from_iter_values(ids.map(|i| format!("e{i}")))) as ArrayRef,
        ),
    ])
    .unwrap()
}

fn ids(batches: &[mink_client::ReadBatch]) -> Vec<i64> {
    let mut out: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    out.sort_unstable();
    out
}

async fn events_table(client: &Client, buckets: u32) {
    client.create_database("app", true).await.unwrap();
    client
        .create_table(
            "app",
            "events",
            &schema(),
            [
                ("bucket.num", buckets.to_string()),
                ("bucket.key", "user_id".to_string()),
            ],
            &[],
            false,
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_write_scan_project_and_tail_through_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 1).await;
    let client = Client::connect(&format!("grpc://{}", server.address))
        .await
        .unwrap();
    events_table(&client, 4).await;
    assert_eq!(client.list_databases().await.unwrap(), ["app"]);
    assert_eq!(client.list_tables("app").await.unwrap(), ["events"]);
    let d = client.describe_table("app", "events").await.unwrap();
    assert_eq!((d.bucket_count, d.buckets.len()), (4, 4));
    assert_eq!(d.columns[0].r#type, "Int64");
    assert_eq!(d.arrow_schema().unwrap(), schema());
    assert!(client.applied_index() > 0);

    let mut writer = client.writer("app", "events");
    let summary = writer.write(&batch(0..100)).await.unwrap();
    assert_eq!(summary.rows, 100);
    assert!(
        summary
            .buckets
            .iter()
            .all(|b| !b.duplicate && b.error.is_none())
    );
    writer.write(&batch(100..150)).await.unwrap();

    // The whole table, every row once; then one bucket from an offset, projected.
    let all = client
        .scan_all(&Scan::table("app", "events"))
        .await
        .unwrap();
    assert_eq!(ids(&all), (0..150).collect::<Vec<_>>());
    let b0 = summary.buckets.iter().find(|b| b.bucket == 0).unwrap();
    let from = b0.base_offset.unwrap() + 1;
    let part = client
        .scan_all(
            &Scan::table("app", "events")
                .bucket(0)
                .offset(from)
                .columns(["event"]),
        )
        .await
        .unwrap();
    assert_eq!(part[0].offset, from);
    assert_eq!(part[0].batch.num_columns(), 1);
    assert_eq!(part[0].batch.schema().field(0).name(), "event");

    // A tail sees rows written after it started.
    let mut tail = client
        .scan(
            &Scan::table("app", "events")
                .bucket(0)
                .latest()
                .tail(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    let later: Vec<i64> = (1000..1100)
        .filter(|i| mink_log::routing::buckets_of(&batch(*i..*i + 1), &[0], 4).unwrap()[0] == 0)
        .collect();
    let rows = RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from(later.clone())) as ArrayRef,
        ),
        (
            "event",
            Arc::new(StringArray::from(vec!["late"; later.len()])) as ArrayRef,
        ),
    ])
    .unwrap();
    writer.write(&rows).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), tail.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        got.batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec(),
        later
    );

    // Alter and drop.
    let mut fields = schema().fields().to_vec();
    fields.push(Arc::new(Field::new("score", DataType::Float64, true)));
    let altered = client
        .alter_table(&protocol::AlterTable {
            database: "app".into(),
            table: "events".into(),
            set_options: BTreeMap::from([("table.log.ttl".into(), "2d".into())]),
            schema: Some(protocol::encode_schema(&Schema::new(fields.clone())).unwrap()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((altered.schema_version, altered.columns.len()), (2, 3));
    // Batches written before the change are read in the new schema (decoded, `score` null);
    // batches written after it go out as stored.
    let before = raw_get(
        &server.address,
        serde_json::json!({"database": "app", "table": "events"}),
    )
    .await;
    assert_eq!(before.num_columns(), 3);
    assert_eq!(before.column(2).null_count(), before.num_rows());
    let scored = RecordBatch::try_new(
        Arc::new(Schema::new(fields.clone())),
        vec![
            Arc::new(Int64Array::from(vec![9_000, 9_001])) as ArrayRef,
            Arc::new(StringArray::from(vec!["s0", "s1"])) as ArrayRef,
            Arc::new(arrow::array::Float64Array::from(vec![0.5, 1.5])) as ArrayRef,
        ],
    )
    .unwrap();
    client.writer("app", "events").write(&scored).await.unwrap();
    let after = raw_get(
        &server.address,
        serde_json::json!({"database": "app", "table": "events"}),
    )
    .await;
    assert_eq!(after.num_rows(), before.num_rows() + 2);
    assert_eq!(after.column(2).null_count(), before.num_rows());
    client.drop_table("app", "events", false).await.unwrap();
    let e = client.describe_table("app", "events").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    server.stop().await;
}

/// A raw DoPut of `batches` with `descriptor`, each batch with its app_metadata.
/// A plain Flight `DoGet` of a JSON ticket, collected.
async fn raw_get(address: &str, ticket: serde_json::Value) -> RecordBatch {
    let mut flight = plain(address).await;
    let response = flight
        .do_get(Ticket::new(serde_json::to_vec(&ticket).unwrap()))
        .await
        .unwrap();
    let batches: Vec<RecordBatch> =
        arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
            response
                .into_inner()
                .map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s))),
        )
        .try_collect()
        .await
        .unwrap();
    let schema = batches[0].schema();
    arrow::compute::concat_batches(&schema, &batches).unwrap()
}

async fn raw_put(
    address: &str,
    descriptor: FlightDescriptor,
    schema: &Schema,
    batches: Vec<(RecordBatch, Vec<u8>)>,
) -> Result<Vec<protocol::PutAck>, tonic::Status> {
    let mut flight = plain(address).await;
    let mut encoder = BatchEncoder::new();
    let mut messages = vec![encoder.schema(schema, Some(descriptor))];
    for (b, meta) in batches {
        messages.extend(encoder.batch(&b, meta.into()).unwrap());
    }
    put_messages(&mut flight, messages).await
}

async fn put_messages(
    flight: &mut FlightServiceClient<tonic::transport::Channel>,
    messages: Vec<FlightData>,
) -> Result<Vec<protocol::PutAck>, tonic::Status> {
    let mut stream = flight
        .do_put(futures::stream::iter(messages))
        .await?
        .into_inner();
    let mut acks = Vec::new();
    while let Some(r) = stream.message().await? {
        acks.push(protocol::parse("ack", &r.app_metadata).unwrap());
    }
    Ok(acks)
}

/// An idempotent writer id from `allocate_writer`, through a plain Flight client.
async fn allocate_writer(address: &str) -> protocol::Writer {
    let mut flight = plain(address).await;
    let mut results = flight
        .do_action(Action::new(protocol::action::ALLOCATE_WRITER, "{}"))
        .await
        .unwrap()
        .into_inner();
    let body = results.message().await.unwrap().unwrap().body;
    protocol::parse("allocate_writer", &body).unwrap()
}

fn writer_descriptor(table: &str, writer_id: u64, writer_epoch: u64) -> FlightDescriptor {
    FlightDescriptor::new_cmd(protocol::to_json(&protocol::WriteDescriptor {
        database: "app".into(),
        table: table.into(),
        bucket: Some(0),
        writer_id: Some(writer_id),
        writer_epoch: Some(writer_epoch),
        ..Default::default()
    }))
}

fn sequence(seq: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "sequence": seq })).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_batch_of_an_idempotent_writer_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 1).await;
    let client = Client::connect(&server.address).await.unwrap();
    events_table(&client, 1).await;
    client
        .create_table("app", "other", &schema(), [("bucket.num", "1")], &[], false)
        .await
        .unwrap();
    let writer = allocate_writer(&server.address).await;
    assert_eq!(writer.writer_epoch, 0);
    let descriptor = writer_descriptor("events", writer.writer_id, writer.writer_epoch);
    let first = raw_put(
        &server.address,
        descriptor.clone(),
        &schema(),
        vec![(batch(0..10), sequence(0)), (batch(10..20), sequence(1))],
    )
    .await
    .unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[1].buckets[0].base_offset, Some(10));
    // The same batch again (as after a lost acknowledgement): its original offsets, no copy.
    let again = raw_put(
        &server.address,
        descriptor.clone(),
        &schema(),
        vec![(batch(10..20), sequence(1))],
    )
    .await
    .unwrap();
    let r = &again[0].buckets[0];
    assert_eq!(
        (r.base_offset, r.end_offset, r.duplicate),
        (Some(10), Some(20), true)
    );
    // A skipped sequence is refused per bucket, precisely; so is a first batch in a bucket
    // that does not start at sequence 0.
    for (table, seq, expected) in [("events", 5, "expected 2"), ("other", 3, "expected 0")] {
        let refused = raw_put(
            &server.address,
            writer_descriptor(table, writer.writer_id, 0),
            &schema(),
            vec![(batch(20..21), sequence(seq))],
        )
        .await
        .unwrap();
        let e = refused[0].buckets[0].error.as_ref().unwrap();
        assert_eq!(e.code, ErrorCode::OutOfOrderSequence, "{e:?}");
        assert!(e.message.contains(expected), "{e:?}");
        let next = expected.trim_start_matches("expected ").parse().unwrap();
        assert_eq!(e.expected_sequence, Some(next), "{e:?}");
    }
    // Writer ids and epochs come from allocate_writer only: nobody can fence a writer by
    // sending its id at a higher epoch, nor make one up.
    for (id, epoch, needle, grpc, code_name) in [
        (
            writer.writer_id,
            1,
            "is at epoch 0, not 1",
            tonic::Code::FailedPrecondition,
            "WRITER_FENCED",
        ),
        (
            writer.writer_id + 1_000,
            0,
            "never allocated",
            tonic::Code::InvalidArgument,
            "UNKNOWN_WRITER",
        ),
        (
            0,
            0,
            "never allocated",
            tonic::Code::InvalidArgument,
            "UNKNOWN_WRITER",
        ),
    ] {
        let e = raw_put(
            &server.address,
            writer_descriptor("events", id, epoch),
            &schema(),
            vec![(batch(20..21), sequence(2))],
        )
        .await
        .unwrap_err();
        assert_eq!(code(&e), (grpc, code_name.into()), "{e}");
        assert!(e.message().contains(needle), "{e}");
    }
    // The writer was not harmed: its next batch is taken.
    let next = raw_put(
        &server.address,
        descriptor,
        &schema(),
        vec![(batch(20..30), sequence(2))],
    )
    .await
    .unwrap();
    assert_eq!(next[0].buckets[0].base_offset, Some(20));
    let all = client
        .scan_all(&Scan::table("app", "events"))
        .await
        .unwrap();
    assert_eq!(ids(&all), (0..30).collect::<Vec<_>>());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_follow_redirects_and_reads_see_them_on_any_node() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(dir.path(), 1).await;
    let b = Server::start(dir.path(), 2).await;
    let client = Client::connect(&a.address).await.unwrap();
    client.create_database("app", false).await.unwrap();
    // Both nodes live before the table exists, so buckets spread.
    until_live(&client, 2).await;
    events_table(&client, 4).await;
    let d = until_led(&client, "events").await;
    let leaders: std::collections::BTreeSet<u64> =
        d.buckets.iter().map(|x| x.leader_node_id).collect();
    assert_eq!(leaders.len(), 2, "{d:?}");
    // A raw routed DoPut to node 1: the rows of node 2's buckets are forwarded there.
    let acks = raw_put(
        &a.address,
        Client::descriptor("app", "events"),
        &schema(),
        vec![(batch(0..50), vec![])],
    )
    .await
    .unwrap();
    assert!(
        acks[0]
            .buckets
            .iter()
            .all(|r| r.error.is_none() && r.end_offset.is_some()),
        "{acks:?}"
    );
    assert_eq!(acks[0].buckets.iter().map(|r| r.rows).sum::<u64>(), 50);
    // The answer carries an index covering the rows' commits, at both leaders: node 2,
    // waiting for it, reads every row.
    b.node
        .wait_applied(acks[0].applied_index, Duration::from_secs(5))
        .await
        .unwrap();
    let seen = Client::connect(&b.address)
        .await
        .unwrap()
        .scan_all(&Scan::table("app", "events"))
        .await
        .unwrap();
    assert_eq!(ids(&seen), (0..50).collect::<Vec<_>>());
    // A DoPut naming a bucket node 1 does not lead is told where it lives (never forwarded).
    let far = d
        .buckets
        .iter()
        .find(|x| x.leader_node_id == 2)
        .unwrap()
        .bucket;
    let target = protocol::WriteDescriptor {
        database: "app".into(),
        table: "events".into(),
        bucket: Some(far),
        ..Default::default()
    };
    let rows_of_far: Vec<i64> = (0..400)
        .filter(|i| mink_log::routing::buckets_of(&batch(*i..*i + 1), &[0], 4).unwrap()[0] == far)
        .take(3)
        .collect();
    let acks = raw_put(
        &a.address,
        FlightDescriptor::new_cmd(protocol::to_json(&target)),
        &schema(),
        vec![(
            RecordBatch::try_from_iter(vec![
                (
                    "user_id",
                    Arc::new(Int64Array::from(rows_of_far.clone())) as ArrayRef,
                ),
                (
                    "event",
                    Arc::new(StringArray::from_iter_values(
                        rows_of_far.iter().map(|i| format!("e{i}")),
                    )) as ArrayRef,
                ),
            ])
            .unwrap(),
            vec![],
        )],
    )
    .await
    .unwrap();
    let e = acks[0].buckets[0].error.as_ref().unwrap();
    assert_eq!(
        (e.code, e.leader_address.as_deref()),
        (ErrorCode::NotLeader, Some(b.address.as_str()))
    );
    // The client routes and follows; a reader on the other node sees every row (once that
    // node has applied what the writer saw: a new client carries no read-your-writes index).
    client
        .writer("app", "events")
        .write(&batch(100..200))
        .await
        .unwrap();
    b.node
        .wait_applied(client.applied_index(), Duration::from_secs(5))
        .await
        .unwrap();
    let reader = Client::connect(&b.address).await.unwrap();
    let all = reader
        .scan_all(&Scan::table("app", "events"))
        .await
        .unwrap();
    let got: Vec<i64> = ids(&all);
    assert_eq!(got, (0..50).chain(100..200).collect::<Vec<_>>());
    a.stop().await;
    b.stop().await;
}

async fn plain(address: &str) -> FlightServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    FlightServiceClient::new(channel)
}

/// Waits until `client`'s node sees `n` live nodes (so a new table's buckets spread).
async fn until_live(client: &Client, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let c = client.describe_cluster().await.unwrap();
        if c.nodes.iter().filter(|x| x.live).count() >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} live nodes: {c:?}"
        );
        client
            .wait_for_change(Duration::from_millis(200))
            .await
            .unwrap();
    }
}

/// Waits until every bucket of `app.<table>` has a leader; its description then.
async fn until_led(client: &Client, table: &str) -> protocol::TableDescription {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = client.describe_table("app", table).await.unwrap();
        if d.buckets.iter().all(|x| x.leader_node_id != 0) {
            return d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a leader for every bucket of app.{table}: {d:?}"
        );
        client
            .wait_for_change(Duration::from_millis(200))
            .await
            .unwrap();
    }
}

fn code(e: &tonic::Status) -> (tonic::Code, String) {
    let mink = e
        .metadata()
        .get(protocol::ERROR_CODE_HEADER)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (e.code(), mink)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_a_precise_status_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        max_message_bytes: 1 << 20,
        max_applied_wait: Duration::from_millis(200),
        ..Default::default()
    };
    let server = Server::start_with(dir.path(), 1, config).await;
    let client = Client::connect(&server.address).await.unwrap();
    events_table(&client, 2).await;
    client
        .writer("app", "events")
        .write(&batch(0..10))
        .await
        .unwrap();
    let path = Client::descriptor("app", "events");
    let mut flight = plain(&server.address).await;

    // Schema mismatch: wrong types, missing column, null in a non-null column.
    let wrong = RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(StringArray::from(vec!["x"])) as ArrayRef,
        ),
        ("event", Arc::new(StringArray::from(vec!["y"])) as ArrayRef),
    ])
    .unwrap();
    let e = raw_put(
        &server.address,
        path.clone(),
        &wrong.schema(),
        vec![(wrong, vec![])],
    )
    .await
    .unwrap_err();
    assert_eq!(
        code(&e),
        (tonic::Code::InvalidArgument, "INVALID".into()),
        "{e}"
    );
    assert!(e.message().contains("user_id"), "{e}");
    let nulls = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("user_id", DataType::Int64, true),
            Field::new("event", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(StringArray::from(vec!["a", "b"])),
        ],
    )
    .unwrap();
    let e = raw_put(
        &server.address,
        path.clone(),
        &nulls.schema(),
        vec![(nulls, vec![])],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("not nullable"), "{e}");

    // Unknown table; garbage descriptors, tickets, actions and batch metadata.
    let unknown = FlightDescriptor::new_path(vec!["app".into(), "nope".into()]);
    let e = raw_put(
        &server.address,
        unknown,
        &schema(),
        vec![(batch(0..1), vec![])],
    )
    .await
    .unwrap_err();
    assert_eq!(code(&e), (tonic::Code::NotFound, "NOT_FOUND".into()), "{e}");
    let e = raw_put(
        &server.address,
        FlightDescriptor::new_cmd(b"{not json".to_vec()),
        &schema(),
        vec![],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = raw_put(
        &server.address,
        FlightDescriptor::new_path(vec!["one".into()]),
        &schema(),
        vec![],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = raw_put(
        &server.address,
        path.clone(),
        &schema(),
        vec![(batch(0..1), b"\xff\xfe".to_vec())],
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = flight.do_get(Ticket::new("garbage")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = flight
        .do_get(Ticket::new(
            r#"{"database":"app","table":"events","bucket":7}"#,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    // An offset past what the bucket holds names the valid range.
    let e = flight
        .do_get(Ticket::new(
            r#"{"database":"app","table":"events","bucket":0,"offset":1000}"#,
        ))
        .await
        .unwrap_err();
    assert_eq!(
        code(&e),
        (tonic::Code::OutOfRange, "OFFSET_OUT_OF_RANGE".into()),
        "{e}"
    );
    let header = |name: &str| {
        e.metadata()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    assert_eq!(
        header(protocol::START_OFFSET_HEADER).as_deref(),
        Some("0"),
        "{e:?}"
    );
    assert!(header(protocol::END_OFFSET_HEADER).is_some(), "{e:?}");
    let e = flight
        .do_action(Action::new("format_disk", "{}"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = flight
        .do_action(Action::new("create_table", "{\"database\":1}"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(
        e.message()
            .starts_with("create_table: field \"database\": invalid type: integer `1`"),
        "{e}"
    );
    // A bad field is named with what it takes, not a position in the JSON.
    let e = flight
        .do_get(Ticket::new(
            r#"{"database":"app","table":"events","bucket":-1}"#,
        ))
        .await
        .unwrap_err();
    assert_eq!(
        e.message(),
        "ticket: field \"bucket\": invalid value: integer `-1`, expected an integer from 0 to 4294967295",
    );
    // Echoed input is capped: a 20 KB name still gets its status through gRPC's header limit.
    let long = "x".repeat(20_000);
    let e = flight
        .do_get(Ticket::new(
            serde_json::json!({"database": "app", "table": long}).to_string(),
        ))
        .await
        .unwrap_err();
    assert_eq!(code(&e), (tonic::Code::NotFound, "NOT_FOUND".into()), "{e}");
    assert!(
        e.message().len() <= protocol::MAX_ERROR_MESSAGE_BYTES && e.message().contains("bytes cut"),
        "{e}"
    );

    // Truncated and corrupted batch bodies; an oversized message.
    let mut encoder = BatchEncoder::new();
    let mut truncated = encoder.batch(&batch(0..100), Default::default()).unwrap();
    let last = truncated.last_mut().unwrap();
    last.data_body = last.data_body.slice(0..last.data_body.len() / 2);
    let messages: Vec<FlightData> = std::iter::once(encoder.schema(&schema(), Some(path.clone())))
        .chain(truncated)
        .collect();
    let e = put_messages(&mut flight, messages).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let mut header = encoder.batch(&batch(0..3), Default::default()).unwrap();
    let last = header.last_mut().unwrap();
    last.data_header = bytes::Bytes::from_static(b"\x01\x02\x03garbage-flatbuffer");
    let messages: Vec<FlightData> = std::iter::once(encoder.schema(&schema(), Some(path.clone())))
        .chain(header)
        .collect();
    let e = put_messages(&mut flight, messages).await.unwrap_err();
    assert!(matches!(e.code(), tonic::Code::InvalidArgument), "{e}");
    let big: Vec<i64> = (0..300_000).collect();
    let huge = RecordBatch::try_from_iter(vec![
        ("user_id", Arc::new(Int64Array::from(big)) as ArrayRef),
        (
            "event",
            Arc::new(StringArray::from(vec!["x"; 300_000])) as ArrayRef,
        ),
    ])
    .unwrap();
    let e = raw_put(
        &server.address,
        path.clone(),
        &schema(),
        vec![(huge, vec![])],
    )
    .await
    .unwrap_err();
    assert_eq!(
        code(&e),
        (tonic::Code::ResourceExhausted, "TOO_LARGE".into()),
        "{e}"
    );
    assert!(
        e.message()
            .starts_with("batch 0: the message is over this node's limit"),
        "{e}"
    );

    // A client ahead of the node waits, bounded, then is told to retry.
    let mut request = tonic::Request::new(Action::new("list_databases", "{}"));
    request.metadata_mut().insert(
        protocol::MIN_APPLIED_INDEX_HEADER,
        "999999999".parse().unwrap(),
    );
    let e = flight.do_action(request).await.unwrap_err();
    assert_eq!(
        code(&e),
        (tonic::Code::Unavailable, "UNAVAILABLE".into()),
        "{e}"
    );

    // Nothing stored was harmed, and the node keeps serving.
    let all = client
        .scan_all(&Scan::table("app", "events"))
        .await
        .unwrap();
    assert_eq!(ids(&all), (0..10).collect::<Vec<_>>());
    client
        .writer("app", "events")
        .write(&batch(10..20))
        .await
        .unwrap();
    let all = client
        .scan_all(&Scan::table("app", "events"))
        .await
        .unwrap();
    assert_eq!(ids(&all), (0..20).collect::<Vec<_>>());
    let e = client.describe_table("app", "nope").await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Server {
                code: ErrorCode::NotFound,
                ..
            }
        ),
        "{e}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_key_tables_through_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 1).await;
    let client = Client::connect(&format!("grpc://{}", server.address))
        .await
        .unwrap();
    let d = pk_table(&client, "last", 3).await;
    assert_eq!(d.primary_key, ["user_id", "event"]);
    let rows = |ids: &[i64], events: &[&str], n: &[i64], kinds: Option<&[&str]>| {
        let mut columns: Vec<(&str, ArrayRef)> = vec![
            ("user_id", Arc::new(Int64Array::from(ids.to_vec()))),
            ("event", Arc::new(StringArray::from(events.to_vec()))),
            ("n", Arc::new(Int64Array::from(n.to_vec()))),
        ];
        if let Some(k) = kinds {
            columns.push(("_row_kind", Arc::new(StringArray::from(k.to_vec()))));
        }
        RecordBatch::try_from_iter(columns).unwrap()
    };
    let mut writer = client.writer("app", "last");
    writer
        .write(&rows(
            &[1, 1, 2, 3],
            &["a", "b", "a", "a"],
            &[1, 2, 3, 4],
            None,
        ))
        .await
        .unwrap();
    writer
        .write(&rows(
            &[1, 3],
            &["b", "a"],
            &[0, 40],
            Some(&["delete", "upsert"]),
        ))
        .await
        .unwrap();
    // A partial update of `n` alone.
    let partial = RecordBatch::try_from_iter(vec![
        ("user_id", Arc::new(Int64Array::from(vec![2])) as ArrayRef),
        ("event", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
    ])
    .unwrap();
    writer.write(&partial).await.unwrap();

    let key = |u: i64, e: &str| {
        serde_json::json!({"user_id": u, "event": e})
            .as_object()
            .unwrap()
            .clone()
    };
    let found = client
        .lookup(
            "app",
            "last",
            vec![key(3, "a"), key(1, "b"), key(2, "a"), key(1, "a")],
            &[],
        )
        .await
        .unwrap();
    let ids: Vec<i64> = found
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    let n = found.column(2).as_primitive::<Int64Type>();
    assert_eq!(ids, [3, 2, 1], "in key order, the deleted key left out");
    assert_eq!((n.value(0), n.value(2)), (40, 1));
    assert_eq!(
        n.value(1),
        3,
        "a partial update of no columns but the key changes nothing"
    );
    let prefix = client
        .prefix_lookup(
            "app",
            "last",
            vec![
                serde_json::json!({"user_id": 1})
                    .as_object()
                    .unwrap()
                    .clone(),
            ],
            &["event".to_string()],
        )
        .await
        .unwrap();
    assert_eq!(prefix.column(0).as_string::<i32>().value(0), "a");
    assert_eq!(prefix.num_rows(), 1);

    // The snapshot scan: the current rows; the changelog: every change with its offset.
    let current: usize = client
        .scan_all(&Scan::table("app", "last"))
        .await
        .unwrap()
        .iter()
        .map(|b| b.batch.num_rows())
        .sum();
    assert_eq!(current, 3);
    let mut changes = Vec::new();
    for b in 0..3 {
        for r in client
            .scan_all(&Scan::table("app", "last").changelog().bucket(b))
            .await
            .unwrap()
        {
            let t = r.batch.column(0).as_string::<i32>();
            let offsets = r.batch.column(1).as_primitive::<Int64Type>();
            for i in 0..r.batch.num_rows() {
                assert_eq!(offsets.value(i) as u64, r.offset + i as u64);
                changes.push(t.value(i).to_string());
            }
        }
    }
    changes.sort();
    assert_eq!(
        changes,
        [
            "delete",
            "insert",
            "insert",
            "insert",
            "insert",
            "update_after",
            "update_before"
        ]
    );
    // Log-table reads of a primary-key table are refused precisely.
    let e = client
        .lookup("app", "nope", vec![key(1, "a")], &[])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_go_to_each_buckets_leader_across_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(dir.path(), 1).await;
    let b = Server::start(dir.path(), 2).await;
    let client = Client::connect(&a.address).await.unwrap();
    client.create_database("app", false).await.unwrap();
    until_live(&client, 2).await;
    pk_table(&client, "kv", 4).await;
    let d = until_led(&client, "kv").await;
    let leaders: std::collections::BTreeSet<u64> =
        d.buckets.iter().map(|x| x.leader_node_id).collect();
    assert_eq!(leaders.len(), 2, "{d:?}");
    let ids: Vec<i64> = (0..40).collect();
    let rows = RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
        ),
        (
            "event",
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("e{}", i % 2)),
            )) as ArrayRef,
        ),
        ("n", Arc::new(Int64Array::from(ids.clone())) as ArrayRef),
    ])
    .unwrap();
    client.writer("app", "kv").write(&rows).await.unwrap();
    let key = |u: i64| {
        serde_json::json!({"user_id": u, "event": format!("e{}", u % 2)})
            .as_object()
            .unwrap()
            .clone()
    };
    // Keys of every bucket, asked of node 1, in a scrambled order, one missing.
    let asked: Vec<i64> = vec![31, 2, 17, 40, 8, 25, 0];
    let found = client
        .lookup(
            "app",
            "kv",
            asked.iter().map(|&u| key(u)).collect(),
            &["n".into()],
        )
        .await
        .unwrap();
    assert_eq!(
        found
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec(),
        [31, 2, 17, 8, 25, 0],
        "in the order asked, projected, the missing key left out"
    );
    // Keys that are nowhere, in buckets of both leaders: nothing, not an error (a leader
    // that finds no key answers with the schema alone).
    let none = client
        .lookup("app", "kv", (100..140).map(key).collect(), &["n".into()])
        .await
        .unwrap();
    assert_eq!(none.num_rows(), 0);
    assert_eq!(none.schema().field(0).name(), "n");
    let prefixes = client
        .prefix_lookup(
            "app",
            "kv",
            [5, 12, 33]
                .iter()
                .map(|u| {
                    serde_json::json!({"user_id": u})
                        .as_object()
                        .unwrap()
                        .clone()
                })
                .collect(),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        prefixes
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec(),
        [5, 12, 33]
    );
    // A snapshot scan through either node reads every bucket at its leader.
    let other = Client::connect(&b.address).await.unwrap();
    let rows: usize = other
        .scan_all(&Scan::table("app", "kv"))
        .await
        .unwrap()
        .iter()
        .map(|r| r.batch.num_rows())
        .sum();
    assert_eq!(rows, 40);
    // A plain Flight client asking one node: lookups and a snapshot scan of buckets led by the
    // other node are forwarded there and answered in full.
    for address in [&a.address, &b.address] {
        let found = raw_get(
            address,
            serde_json::json!({
                "database": "app", "table": "kv",
                "lookup": asked.iter().map(|&u| key(u)).collect::<Vec<_>>(),
                "columns": ["n"],
            }),
        )
        .await;
        assert_eq!(
            found
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec(),
            [31, 2, 17, 8, 25, 0],
            "via {address}"
        );
        let all = raw_get(
            address,
            serde_json::json!({"database": "app", "table": "kv"}),
        )
        .await;
        assert_eq!(all.num_rows(), 40, "via {address}");
        // Filtered on a column it does not return: each leader filters its buckets.
        let some = raw_get(
            address,
            serde_json::json!({
                "database": "app", "table": "kv", "columns": ["n"],
                "filter": [
                    {"column": "n", "op": ">=", "value": 30},
                    {"column": "event", "op": "=", "value": "e1"},
                ],
            }),
        )
        .await;
        let mut n = some.column(0).as_primitive::<Int64Type>().values().to_vec();
        n.sort_unstable();
        assert_eq!(n, [31, 33, 35, 37, 39], "via {address}");
    }
    // One bucket led by node 1, asked of node 2: forwarded (a snapshot at the leader's offset).
    let far = d.buckets.iter().find(|x| x.leader_node_id == 1).unwrap();
    let got = other
        .scan_all(&Scan::table("app", "kv").bucket(far.bucket))
        .await
        .unwrap();
    assert!(got.iter().all(|r| r.bucket == far.bucket && r.offset > 0));
    assert!(!got.is_empty());
    // A plain routed DoPut to node 1 of many pipelined batches, each upserting every key: the
    // rows of node 2's buckets are forwarded in order, so the last batch wins everywhere.
    let kv_schema = d.arrow_schema().unwrap();
    let round = |r: i64| {
        RecordBatch::try_new(
            Arc::new(kv_schema.clone()),
            vec![
                Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
                Arc::new(StringArray::from_iter_values(
                    ids.iter().map(|i| format!("e{}", i % 2)),
                )) as ArrayRef,
                Arc::new(Int64Array::from(vec![r; ids.len()])) as ArrayRef,
            ],
        )
        .unwrap()
    };
    let acks = raw_put(
        &a.address,
        Client::descriptor("app", "kv"),
        &kv_schema,
        (0..20).map(|r| (round(r), vec![])).collect(),
    )
    .await
    .unwrap();
    assert!(
        acks.iter()
            .flat_map(|a| &a.buckets)
            .all(|b| b.error.is_none()),
        "{acks:?}"
    );
    let last = client
        .lookup(
            "app",
            "kv",
            ids.iter().map(|&u| key(u)).collect(),
            &["n".into()],
        )
        .await
        .unwrap();
    assert!(
        last.column(0)
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .all(|&n| n == 19),
        "{last:?}"
    );
    a.stop().await;
    b.stop().await;
}

/// A log table whose logs retention trimmed below the tiered offsets: `GetFlightInfo` gives
/// each bucket a lake endpoint for its history (no location: any node) and one from the log's
/// start at its leader; reading every endpoint reads every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flight_info_gives_lake_history_its_own_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(dir.path(), 1).await;
    let client = Client::connect(&a.address).await.unwrap();
    client.create_database("app", true).await.unwrap();
    client
        .create_table(
            "app",
            "events",
            &schema(),
            [
                ("bucket.num", "2".to_string()),
                ("bucket.key", "user_id".to_string()),
                ("table.log.ttl", "1s".to_string()),
                ("table.datalake.enabled", "true".to_string()),
                ("table.datalake.freshness", "1s".to_string()),
            ],
            &[],
            false,
        )
        .await
        .unwrap();
    for chunk in 0..4 {
        client
            .writer("app", "events")
            .write(&batch(chunk * 25..chunk * 25 + 25))
            .await
            .unwrap();
    }
    // Every bucket's log trimmed (so its start is above 0) and tiered up to its end.
    // Checked on each metadata change (`Client::wait_for_change`), with a deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let d = client.describe_table("app", "events").await.unwrap();
        let ready = d
            .buckets
            .iter()
            .all(|b| b.start_offset > 0 && b.tiered_offset == Some(b.end_offset));
        if ready {
            break;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "buckets never trimmed and tiered: {:?}",
            d.buckets
        );
        client.wait_for_change(left).await.unwrap();
    }
    client
        .writer("app", "events")
        .write(&batch(100..110))
        .await
        .unwrap();
    let info = plain(&a.address)
        .await
        .get_flight_info(Client::descriptor("app", "events"))
        .await
        .unwrap()
        .into_inner();
    let mut lake = 0;
    let mut got = Vec::new();
    for e in &info.endpoint {
        let ticket: serde_json::Value =
            serde_json::from_slice(&e.ticket.as_ref().unwrap().ticket).unwrap();
        if ticket["source"] == "lake" {
            lake += 1;
            assert!(e.location.is_empty(), "{e:?}");
            assert_eq!(ticket["offset"], 0);
        } else {
            assert_eq!(e.location.len(), 1, "{e:?}");
        }
        let rows = raw_get(&a.address, ticket).await;
        got.extend(
            rows.column(0)
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .copied(),
        );
    }
    assert_eq!(lake, 2, "{:?}", info.endpoint);
    got.sort_unstable();
    assert_eq!(got, (0..110).collect::<Vec<_>>());
    a.stop().await;
}

/// A TCP proxy in front of a node that passes everything until [`SilencingProxy::silence`];
/// from then on it drops what the node sends back, so requests are taken and never answered,
/// as by a node whose metadata database is down.
struct SilencingProxy {
    silent: Arc<std::sync::atomic::AtomicBool>,
}

impl SilencingProxy {
    fn start(listener: tokio::net::TcpListener, upstream: String) -> SilencingProxy {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let silent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let quiet = Arc::clone(&silent);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let quiet = Arc::clone(&quiet);
                tokio::spawn(async move {
                    let mut buf = vec![0; 64 << 10];
                    while let Ok(n @ 1..) = server_read.read(&mut buf).await {
                        if quiet.load(std::sync::atomic::Ordering::SeqCst) {
                            continue;
                        }
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        SilencingProxy { silent }
    }

    fn silence(&self) {
        self.silent.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A write whose node takes its requests and never answers fails at the retry deadline with
/// an error naming what it waited for, whether the wait is for the table's description or for
/// the acknowledgement of its rows; it does not hang, and neither does an admin action.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_no_node_answers_fails_at_the_retry_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxied = listener.local_addr().unwrap().to_string();
    let server =
        Server::start_advertising(dir.path(), 1, ServerConfig::default(), Some(&proxied)).await;
    let proxy = SilencingProxy::start(listener, server.address.clone());
    let config = mink_client::ClientConfig {
        retry_deadline: Duration::from_millis(1500),
        ..Default::default()
    };
    let client = Client::connect_with(&proxied, config).await.unwrap();
    events_table(&client, 2).await;
    let d = until_led(&client, "events").await;
    assert!(
        d.buckets.iter().all(|b| b.leader_address == proxied),
        "{d:?}"
    );
    let mut writer = client.writer("app", "events");
    writer.write(&batch(0..10)).await.unwrap();

    proxy.silence();
    // Bounded here so that a write that hangs fails the test instead of stalling it.
    let bounded = |w: mink_client::TableWriter| async move {
        let mut w = w;
        let started = tokio::time::Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(30), w.write(&batch(10..20)))
            .await
            .expect("the write hung past its 1.5 s retry deadline");
        (outcome, started.elapsed())
    };
    let (outcome, took) = bounded(writer).await;
    let e = outcome.unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Timeout { awaited: "acknowledgement", address, .. } if *address == proxied
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "no acknowledgement within 1.5 s: the node at {proxied} did not answer (is its metadata database reachable?)"
        )
    );
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    // A new writer first asks for the table's description: that wait is bounded too.
    let (outcome, _) = bounded(client.writer("app", "events")).await;
    let e = outcome.unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Timeout {
                awaited: "table description",
                ..
            }
        ),
        "{e:?}"
    );
    // So is an admin action (it waited for as long as the node's metadata database was
    // down), saying that the change may still be made.
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        client.create_database("other", false),
    )
    .await
    .expect("the action hung past its 1.5 s retry deadline")
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "no answer (a change asked for may still be made) within 1.5 s: the node at {proxied} did not answer (is its metadata database reachable?)"
        )
    );
    // The node's graceful stop waits for connections the silenced proxy keeps open.
    drop(client);
    server.stop().await;
}
