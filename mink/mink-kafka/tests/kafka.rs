//! The Kafka listener against real clients (kafka-python, confluent-kafka) and hostile frames.
#![allow(clippy::print_stderr)]

use std::path::PathBuf;
use std::time::Duration;

use arrow::array::AsArray as _;
use arrow::datatypes::{DataType, Field, Schema};
use bytes::{BufMut as _, Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use mink_node::{BucketRef, Node, NodeConfig, NodeError, TableSpec};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

struct Served {
    node: Node,
    kafka: String,
    /// Where the listener is bound (`kafka` unless clients are sent to a proxy).
    listening: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn serve(dir: &std::path::Path) -> Served {
    serve_node(dir, 1).await
}

/// Node `node_id` of the cluster whose metadata and objects are under `dir`.
async fn serve_node(dir: &std::path::Path, node_id: u64) -> Served {
    serve_with(dir, node_id, mink_kafka::KafkaConfig::default()).await
}

/// [`serve_node`] with a listener configured by `config` (its address filled in).
async fn serve_with(
    dir: &std::path::Path,
    node_id: u64,
    config: mink_kafka::KafkaConfig,
) -> Served {
    serve_faulty(dir, node_id, config, None).await
}

/// [`serve_node`] whose groups complete their first rebalance 10 ms after the first join
/// (3 s by default, for members starting together), for tests of one member at a time.
async fn serve_groups(dir: &std::path::Path, node_id: u64) -> Served {
    let config = mink_kafka::KafkaConfig {
        initial_rebalance_delay: Duration::from_millis(10),
        ..Default::default()
    };
    serve_with(dir, node_id, config).await
}

/// [`serve_with`] on an object store with `faults` injected.
async fn serve_faulty(
    dir: &std::path::Path,
    node_id: u64,
    config: mink_kafka::KafkaConfig,
    faults: Option<std::sync::Arc<s3stream::store::ObjectFaults>>,
) -> Served {
    serve_at(dir, node_id, config, faults, "127.0.0.1:0").await
}

/// [`serve_faulty`] with its Kafka listener bound to `address` (a restarted node's old one).
async fn serve_at(
    dir: &std::path::Path,
    node_id: u64,
    config: mink_kafka::KafkaConfig,
    faults: Option<std::sync::Arc<s3stream::store::ObjectFaults>>,
    address: &str,
) -> Served {
    serve_tuned(dir, node_id, config, faults, address, |_| {}).await
}

/// [`serve_at`] with the node's configuration changed by `tune`.
async fn serve_tuned(
    dir: &std::path::Path,
    node_id: u64,
    config: mink_kafka::KafkaConfig,
    faults: Option<std::sync::Arc<s3stream::store::ObjectFaults>>,
    address: &str,
    tune: impl FnOnce(&mut NodeConfig),
) -> Served {
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let listening = listener.local_addr().unwrap().to_string();
    // Clients are sent to `config.advertised` when set (a proxy in front), here otherwise.
    let kafka = config
        .advertised
        .clone()
        .unwrap_or_else(|| listener.local_addr().unwrap().to_string());
    let mut c = NodeConfig::new(
        node_id,
        &format!("sqlite://{}", dir.join("meta.db").display()),
        dir.join("objects").to_str().unwrap(),
    );
    c.engine.flush_delay = Duration::from_millis(5);
    c.leadership_interval = Duration::from_millis(20);
    c.listeners
        .insert(mink_kafka::LISTENER.to_string(), kafka.clone());
    c.lease_ttl = Duration::from_millis(1000);
    c.object_faults = faults;
    tune(&mut c);
    let node = Node::start(c).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn({
        let node = node.clone();
        let advertised = kafka.clone();
        async move {
            let config = mink_kafka::KafkaConfig {
                advertised: Some(advertised),
                ..config
            };
            mink_kafka::serve(node, config, listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        }
    });
    Served {
        node,
        kafka,
        listening,
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

    /// How many rows bucket `bucket` of `database.table` holds, read through the node.
    async fn row_count(&self, database: &str, table: &str, bucket: u32) -> usize {
        self.rows(database, table, bucket)
            .await
            .iter()
            .map(arrow::array::RecordBatch::num_rows)
            .sum()
    }

    /// Every row of bucket `bucket` of `database.table`, read through the node.
    async fn rows(
        &self,
        database: &str,
        table: &str,
        bucket: u32,
    ) -> Vec<arrow::array::RecordBatch> {
        let b = BucketRef::new(database, table, None, bucket);
        let (_, end) = self.node.bucket_offsets(&b).unwrap();
        let mut offset = 0;
        let mut out = Vec::new();
        while offset < end {
            let read = self
                .node
                .read_bucket(&b, offset, 1 << 20, &[])
                .await
                .unwrap();
            offset = read.last().unwrap().end_offset;
            out.extend(read.into_iter().map(|r| r.batch));
        }
        out
    }
}

/// The test virtualenv's Python with the Kafka clients (`scripts/test.sh` installs them).
fn python() -> Option<PathBuf> {
    let venv = std::env::var("MINK_VENV").map_or_else(
        |_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/mink/venv"),
        PathBuf::from,
    );
    let python = venv.join("bin/python");
    let ok = std::process::Command::new(&python)
        .args(["-c", "import kafka, confluent_kafka"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but kafka-python or confluent-kafka is not installed in {}",
        venv.display()
    );
    eprintln!("skipped: no Kafka clients in {}", venv.display());
    None
}

fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// kafka-python and confluent-kafka create a topic, produce (keys, headers, null values,
/// compressed batches), consume, list offsets; a typed table takes and gives JSON rows. The
/// rows they wrote are the table's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_produce_and_consume() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    s.node.create_database("kafka", false).await.unwrap();
    s.node
        .create_table(TableSpec {
            database: "kafka".into(),
            name: "people".into(),
            schema: Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("name", DataType::Utf8, true),
            ]),
            primary_key: vec![],
            options: [("bucket.num".to_string(), "1".to_string())].into(),
            partition_keys: vec![],
            comment: String::new(),
            if_not_exists: false,
        })
        .await
        .unwrap();
    run_script(python, "kafka_clients.py", &s.kafka).await;
    // What the producers wrote is the table's rows: raw records, and JSON as typed rows.
    let raw: usize = s
        .rows("kafka", "raw", 0)
        .await
        .iter()
        .chain(s.rows("kafka", "raw", 1).await.iter())
        .map(arrow::array::RecordBatch::num_rows)
        .sum();
    assert_eq!(raw, 148);
    let people = s.rows("kafka", "people", 0).await;
    let people = arrow::compute::concat_batches(&people[0].schema(), &people).unwrap();
    assert_eq!(people.num_rows(), 3);
    assert_eq!(
        people
            .column(1)
            .as_string::<i32>()
            .iter()
            .collect::<Vec<_>>(),
        [Some("ann"), None, Some("cid")]
    );
    s.stop().await;
}

/// Consumer groups with kafka-python and librdkafka: partitions shared and handed over on a
/// leave, offsets committed and resumed from, the group listed and described
/// (tests/kafka_groups.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_groups_share_hand_over_and_resume() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    run_script(python, "kafka_groups.py", &s.kafka).await;
    // The committed offsets are in the command log.
    let committed: u64 = s.node.group_offsets("g1").iter().map(|c| c.offset).sum();
    assert_eq!(committed, 52);
    s.stop().await;
}

/// A group of three kafka-python members over six partitions rebalances as they join and
/// leave, commits, and after a restart of the node resumes from its commits: nothing committed
/// is delivered again (tests/kafka_group_restart.py, run before and after the restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_resumes_from_its_commits_after_a_node_restart() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    run_script_with(
        python.clone(),
        "kafka_group_restart.py",
        &s.kafka,
        &["before"],
    )
    .await;
    let committed =
        |node: &Node| -> u64 { node.group_offsets("g6").iter().map(|c| c.offset).sum() };
    assert_eq!(committed(&s.node), 6 * 12);
    let address = s.kafka.clone();
    s.stop().await;
    let s = serve_at(
        dir.path(),
        1,
        mink_kafka::KafkaConfig::default(),
        None,
        &address,
    )
    .await;
    assert_eq!(
        committed(&s.node),
        6 * 12,
        "the commits did not survive the restart"
    );
    run_script_with(python, "kafka_group_restart.py", &s.kafka, &["after"]).await;
    assert_eq!(committed(&s.node), 6 * 13);
    s.stop().await;
}

/// An idempotent librdkafka producer whose acknowledgements are lost after the node stored
/// the writes (a proxy closes the connection instead of passing the first three Produce
/// answers on) retries them and stores each record once (tests/kafka_idempotent.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_whose_acknowledgements_are_lost_stores_each_record_once() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = proxy.local_addr().unwrap().to_string();
    let config = mink_kafka::KafkaConfig {
        advertised: Some(address.clone()),
        ..Default::default()
    };
    let s = serve_at(dir.path(), 1, config, None, "127.0.0.1:0").await;
    raw_topic(&s.node, "t", 2).await;
    let upstream = s.listening.clone();
    let lost = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(3));
    let proxying = tokio::spawn(lose_produce_answers(proxy, upstream, lost.clone()));
    run_script_with(python, "kafka_idempotent.py", &address, &[]).await;
    assert_eq!(
        lost.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "fewer than three Produce answers were lost"
    );
    let mut values = Vec::new();
    for bucket in 0..2 {
        for batch in s.rows("kafka", "t", bucket).await {
            let column = batch.column_by_name("value").unwrap().as_binary::<i32>();
            values.extend(column.iter().map(|v| v.unwrap().to_vec()));
        }
    }
    values.sort();
    let expected: Vec<Vec<u8>> = {
        let mut e: Vec<_> = (0..200).map(|i| format!("r{i:03}").into_bytes()).collect();
        e.sort();
        e
    };
    assert_eq!(
        values, expected,
        "stored records differ from the 200 produced once each"
    );
    proxying.abort();
    s.stop().await;
}

/// A proxy to `upstream` that, for the first `lose` Produce requests it passes, lets the node
/// store the write, reads its answer and closes the client's connection instead of passing the
/// answer on (a fault the producer sees as a connection lost mid-request).
async fn lose_produce_answers(
    listener: tokio::net::TcpListener,
    upstream: String,
    lose: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    loop {
        let (client, _) = listener.accept().await.unwrap();
        let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
        let lose = lose.clone();
        tokio::spawn(async move {
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            // The API key of each request passed on, in order (answers come in that order).
            let (keys, mut asked) = tokio::sync::mpsc::unbounded_channel::<i16>();
            let requests = tokio::spawn(async move {
                while let Ok(frame) = read_frame(&mut client_read).await {
                    let _ = keys.send(i16::from_be_bytes([frame[4], frame[5]]));
                    if server_write.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
            while let Ok(frame) = read_frame(&mut server_read).await {
                let key = asked.recv().await.unwrap();
                let losing = key == ApiKey::Produce as i16
                    && lose
                        .fetch_update(
                            std::sync::atomic::Ordering::SeqCst,
                            std::sync::atomic::Ordering::SeqCst,
                            |n| n.checked_sub(1),
                        )
                        .is_ok();
                if losing || client_write.write_all(&frame).await.is_err() {
                    break;
                }
            }
            requests.abort();
        });
    }
}

/// One size-prefixed frame, its size included.
async fn read_frame(socket: &mut tokio::net::tcp::OwnedReadHalf) -> std::io::Result<Vec<u8>> {
    let size = socket.read_i32().await?;
    let mut frame = size.to_be_bytes().to_vec();
    frame.resize(4 + usize::try_from(size).unwrap_or(0), 0);
    socket.read_exact(&mut frame[4..]).await?;
    Ok(frame)
}

/// kcat (librdkafka 2.0): metadata, producing keyed lines (with every codec and headers),
/// consuming them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_lists_produces_and_consumes() {
    if std::process::Command::new("kcat")
        .arg("-V")
        .output()
        .is_err()
    {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but kcat is not installed (scripts/test.sh installs it)"
        );
        eprintln!("skipped: no kcat");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    raw_topic(&s.node, "lines", 2).await;
    let kafka = s.kafka.clone();
    let (listed, consumed) = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let kcat = |args: &[&str], input: Option<&str>| {
            // kcat as installed: the test harness's library path (cargo adds the build
            // directories, among them a librdkafka built without zstd) is not its.
            let mut child = std::process::Command::new("kcat")
                .env_remove("LD_LIBRARY_PATH")
                .args(["-b", &kafka])
                .args(args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            if let Some(text) = input {
                stdin.write_all(text.as_bytes()).unwrap();
            }
            drop(stdin);
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "kcat {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let listed = kcat(&["-L", "-t", "lines"], None);
        kcat(
            &["-P", "-t", "lines", "-p", "1", "-K", ":"],
            Some("k1:one\nk2:two\n"),
        );
        // Every codec, with a header each.
        for codec in ["gzip", "snappy", "lz4", "zstd"] {
            let header = format!("codec={codec}");
            kcat(
                &[
                    "-P", "-t", "lines", "-p", "1", "-K", ":", "-z", codec, "-H", &header,
                ],
                Some(&format!("{codec}:{codec}-value\n")),
            );
        }
        let consumed = kcat(
            &[
                "-C",
                "-t",
                "lines",
                "-p",
                "1",
                "-o",
                "beginning",
                "-e",
                "-f",
                "%k=%s@%o %h\n",
            ],
            None,
        );
        (listed, consumed)
    })
    .await
    .unwrap();
    assert!(
        listed.contains("topic \"lines\" with 2 partitions"),
        "{listed}"
    );
    assert_eq!(
        consumed,
        "k1=one@0 \nk2=two@1 \ngzip=gzip-value@2 codec=gzip\nsnappy=snappy-value@3 codec=snappy\n\
         lz4=lz4-value@4 codec=lz4\nzstd=zstd-value@5 codec=zstd\n"
    );
    s.stop().await;
}

/// Committed offsets live in the command log until their retention runs out after the group's
/// last commit; the lease holder drops them then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_expire_after_their_retention() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    for name in ["a", "b"] {
        raw_topic(&s.node, name, 1).await;
    }
    let at = |t: &str| BucketRef::new("kafka", t, None, 0);
    s.node
        .commit_group_offsets("old", &[(at("a"), 5, -1, "m".into())], None)
        .await
        .unwrap();
    // A week's retention keeps them; none drops every group whose last commit is past it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match s
            .node
            .expire_group_offsets(Duration::from_secs(7 * 24 * 3600))
            .await
        {
            Ok(()) => break,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "waited for the lease to expire offsets: {e}"
                );
                next_change(&s.node).await;
            }
        }
    }
    assert_eq!(s.node.group_offsets("old").len(), 1);
    assert_eq!(s.node.group_offsets("old")[0].metadata, "m");
    s.node.expire_group_offsets(Duration::ZERO).await.unwrap();
    assert!(s.node.group_offsets("old").is_empty());
    // A commit naming a table that does not exist is refused, and stores nothing.
    assert!(
        s.node
            .commit_group_offsets(
                "g",
                &[
                    (at("a"), 1, -1, String::new()),
                    (at("nope"), 1, -1, String::new())
                ],
                None
            )
            .await
            .is_err()
    );
    assert!(s.node.group_offsets("g").is_empty());
    // A group coordinator's commit carries its coordinator epoch: one from an epoch that is not
    // the current one (a paused ex-coordinator's) is refused once the cluster fences them.
    until(
        &s.node,
        "metadata_version 5 (fenced group commits)",
        || async { s.node.view().state.metadata_version >= mink_metadata::GROUP_FENCING_VERSION },
    )
    .await;
    let epoch = s.node.group_coordinator_epoch().expect("the lease holder");
    let e = s
        .node
        .commit_group_offsets("g", &[(at("a"), 7, -1, String::new())], Some(epoch + 1))
        .await
        .unwrap_err();
    assert!(
        matches!(e, NodeError::NotCoordinator { current, .. } if current == epoch),
        "{e:?}"
    );
    assert!(s.node.group_offsets("g").is_empty());
    s.node
        .commit_group_offsets("g", &[(at("a"), 7, -1, String::new())], Some(epoch))
        .await
        .unwrap();
    assert_eq!(s.node.group_offsets("g")[0].offset, 7);
    s.stop().await;
}

/// The coordinator (on the lease holder, whatever its listeners) drops offsets past their
/// retention on its own, every `group_offsets_check_interval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_expires_offsets_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve_tuned(
        dir.path(),
        1,
        mink_kafka::KafkaConfig::default(),
        None,
        "127.0.0.1:0",
        |c| {
            c.group_offsets_retention = Duration::ZERO;
            c.group_offsets_check_interval = Duration::from_millis(50);
        },
    )
    .await;
    raw_topic(&s.node, "a", 1).await;
    let at = BucketRef::new("kafka", "a", None, 0);
    s.node
        .commit_group_offsets("gone", &[(at, 5, -1, String::new())], None)
        .await
        .unwrap();
    until(
        &s.node,
        "the coordinator to drop offsets past their retention",
        || async { s.node.group_offsets("gone").is_empty() },
    )
    .await;
    s.stop().await;
}

/// Offsets commit from the current generation of a group's member, or from outside any
/// group (generation -1); a stale generation gets ILLEGAL_GENERATION, an unknown member
/// UNKNOWN_MEMBER_ID, a generation of a group that does not exist ILLEGAL_GENERATION, and
/// none of them stores anything. As in Kafka, a member commits at its generation while the
/// group prepares a rebalance (kafka-python keeps its position when it gets the partition
/// back, so a refused commit there was a record never counted as read); between the joins
/// and the assignment a commit gets REBALANCE_IN_PROGRESS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_from_outside_the_current_generation_are_refused() {
    use kafka_protocol::ResponseError;
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{
        GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupResponse, SyncGroupRequest,
        SyncGroupResponse,
    };
    let dir = tempfile::tempdir().unwrap();
    let s = serve_groups(dir.path(), 1).await;
    raw_topic(&s.node, "t", 1).await;
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let group = || GroupId(StrBytes::from_static_str("g"));
    let joined: JoinGroupResponse = ask(&mut socket, ApiKey::JoinGroup, 2, &join_group("g")).await;
    assert_eq!(joined.error_code, 0, "{joined:?}");
    let (generation, member) = (joined.generation_id, joined.member_id.clone());
    let sync = SyncGroupRequest::default()
        .with_group_id(group())
        .with_generation_id(generation)
        .with_member_id(member.clone())
        .with_assignments(vec![
            SyncGroupRequestAssignment::default()
                .with_member_id(member.clone())
                .with_assignment(Bytes::new()),
        ]);
    let synced: SyncGroupResponse = ask(&mut socket, ApiKey::SyncGroup, 1, &sync).await;
    assert_eq!(synced.error_code, 0);
    let stranger = || StrBytes::from_static_str("stranger");
    assert_eq!(
        commit_at(&mut socket, "g", generation - 1, member.clone(), 1).await,
        ResponseError::IllegalGeneration.code()
    );
    assert_eq!(
        commit_at(&mut socket, "g", generation, stranger(), 2).await,
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(
        commit_at(&mut socket, "none", 1, stranger(), 3).await,
        ResponseError::IllegalGeneration.code()
    );
    let committed =
        |g: &str| -> Vec<u64> { s.node.group_offsets(g).iter().map(|c| c.offset).collect() };
    assert!(committed("g").is_empty() && committed("none").is_empty());
    assert_eq!(
        commit_at(&mut socket, "g", generation, member.clone(), 4).await,
        0
    );
    assert_eq!(committed("g"), [4]);
    assert_eq!(
        commit_at(&mut socket, "solo", -1, StrBytes::default(), 5).await,
        0
    );
    assert_eq!(committed("solo"), [5]);
    // A group that only commits is Empty, in DescribeGroups as in ListGroups (it was Dead);
    // ListGroups 4 lists only the states it is asked for.
    use kafka_protocol::messages::{
        DescribeGroupsRequest, DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse,
    };
    let described: DescribeGroupsResponse = ask(
        &mut socket,
        ApiKey::DescribeGroups,
        4,
        &DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(StrBytes::from_static_str("solo"))]),
    )
    .await;
    assert_eq!(described.groups[0].group_state.as_str(), "Empty");
    let listed = |states: &[&'static str]| {
        ListGroupsRequest::default().with_states_filter(
            states
                .iter()
                .map(|s| StrBytes::from_static_str(s))
                .collect(),
        )
    };
    let names = |r: ListGroupsResponse| -> Vec<String> {
        r.groups.iter().map(|g| g.group_id.to_string()).collect()
    };
    let empty: ListGroupsResponse =
        ask(&mut socket, ApiKey::ListGroups, 4, &listed(&["Empty"])).await;
    assert!(names(empty).contains(&"solo".to_string()));
    let stable: ListGroupsResponse =
        ask(&mut socket, ApiKey::ListGroups, 4, &listed(&["Stable"])).await;
    assert_eq!(names(stable), ["g"]);
    // A second member joins: the group prepares a rebalance, which the first member learns
    // from its heartbeat, and still commits at its generation.
    let mut second = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let joining = tokio::spawn(async move {
        let r: JoinGroupResponse = ask(&mut second, ApiKey::JoinGroup, 2, &join_group("g")).await;
        (second, r)
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let beat = HeartbeatRequest::default()
            .with_group_id(group())
            .with_generation_id(generation)
            .with_member_id(member.clone());
        let r: HeartbeatResponse = ask(&mut socket, ApiKey::Heartbeat, 1, &beat).await;
        if r.error_code == ResponseError::RebalanceInProgress.code() {
            break;
        }
        assert_eq!(r.error_code, 0, "{r:?}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second member's join never started a rebalance"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(
        commit_at(&mut socket, "g", generation, member.clone(), 6).await,
        0,
        "a commit while the group prepares a rebalance"
    );
    assert_eq!(committed("g"), [6]);
    let rejoin = join_group("g").with_member_id(member.clone());
    let rejoined: JoinGroupResponse = ask(&mut socket, ApiKey::JoinGroup, 2, &rejoin).await;
    assert_eq!(rejoined.error_code, 0, "{rejoined:?}");
    let (_second, joined) = joining.await.unwrap();
    assert_eq!(joined.error_code, 0, "{joined:?}");
    assert_eq!(
        commit_at(&mut socket, "g", rejoined.generation_id, member.clone(), 7).await,
        ResponseError::RebalanceInProgress.code(),
        "a commit before the new generation's assignment"
    );
    assert_eq!(committed("g"), [6]);
    s.stop().await;
}

/// Two nodes lead a topic's partitions; the one holding the lease (a leader of some partitions
/// and the group coordinator) stops. An idempotent producer finds the new leaders through
/// Metadata, a group consumer the new coordinator, and every record arrives once
/// (tests/kafka_failover.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_follow_leaders_and_the_coordinator_through_a_failover() {
    use std::io::{BufRead as _, Write as _};
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let a = serve_node(dir.path(), 1).await;
    let b = serve_node(dir.path(), 2).await;
    // Both live before the topic exists, so its partitions spread over them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = a.node.cluster_status().await.unwrap();
        if status.nodes.iter().filter(|n| n.live).count() == 2 && status.coordinator.is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited for two live nodes and a lease holder: {status:?}"
        );
        next_change(&a.node).await;
    }
    let holder = a.node.group_coordinator().unwrap();
    let bootstrap = format!("{},{}", a.kafka, b.kafka);
    let mut child = std::process::Command::new(python)
        .arg(manifest_dir().join("tests/kafka_failover.py"))
        .arg(bootstrap)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let line = tokio::task::block_in_place(|| {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line
    });
    if line.trim() != "ready" {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "the script stopped before the failover:\n{line}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The topic's partitions are led by both nodes.
    let info = a.node.describe_table("kafka", "moving").unwrap();
    let leaders: std::collections::BTreeSet<u64> =
        info.buckets.iter().map(|x| x.leader_node_id).collect();
    assert_eq!(leaders.len(), 2, "{info:?}");
    let (gone, _kept) = if holder == 1 { (a, b) } else { (b, a) };
    gone.stop().await;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let mut rest = String::new();
    tokio::task::block_in_place(|| {
        use std::io::Read as _;
        stdout.read_to_string(&mut rest).unwrap();
    });
    assert!(
        out.status.success() && rest.contains("ok"),
        "kafka_failover.py failed:\n{rest}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A produce to a partition another node leads answers NOT_LEADER_OR_FOLLOWER and stores
/// nothing there (a client finds the leader through Metadata); its leader takes it; and any
/// node serves the partition's records to a fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_to_a_node_not_leading_the_partition_is_refused_with_not_leader() {
    let dir = tempfile::tempdir().unwrap();
    let a = serve_node(dir.path(), 1).await;
    let b = serve_node(dir.path(), 2).await;
    until(&a.node, "two live nodes", || async {
        let status = a.node.cluster_status().await.unwrap();
        status.nodes.iter().filter(|n| n.live).count() == 2
    })
    .await;
    raw_topic(&a.node, "t", 2).await;
    let leaders = || {
        let info = a.node.describe_table("kafka", "t").unwrap();
        info.buckets
            .iter()
            .map(|x| x.leader_node_id)
            .collect::<Vec<_>>()
    };
    until(&a.node, "a leader for each partition", || async {
        leaders().iter().all(|l| *l == 1 || *l == 2)
    })
    .await;
    let leaders = leaders();
    let partition = 0;
    let (leader, other) = if leaders[0] == 1 { (&a, &b) } else { (&b, &a) };
    let mut socket = tokio::net::TcpStream::connect(&other.kafka).await.unwrap();
    assert_eq!(
        produced(&mut socket, &produce_frame_to(partition, encode_one())).await,
        kafka_protocol::ResponseError::NotLeaderOrFollower.code()
    );
    assert!(
        leader.rows("kafka", "t", 0).await.is_empty(),
        "a refused write was stored"
    );
    let mut socket = tokio::net::TcpStream::connect(&leader.kafka).await.unwrap();
    assert_eq!(
        produced(&mut socket, &produce_frame_to(partition, encode_one())).await,
        0
    );
    let mut socket = tokio::net::TcpStream::connect(&other.kafka).await.unwrap();
    let response = exchange(&mut socket, &fetch_frame(&[partition]))
        .await
        .unwrap();
    assert_eq!(fetched(response), [(partition, 0, 1)]);
    a.stop().await;
    b.stop().await;
}

/// A Metadata request naming a topic that does not exist creates it when the listener allows
/// it (and the request asks), and answers `UNKNOWN_TOPIC_OR_PARTITION` otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_creates_topics_when_the_listener_allows_it() {
    let unknown = kafka_protocol::ResponseError::UnknownTopicOrPartition.code();
    let dir = tempfile::tempdir().unwrap();
    let s = serve_with(
        dir.path(),
        1,
        mink_kafka::KafkaConfig {
            auto_create_topics: Some(3),
            ..Default::default()
        },
    )
    .await;
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    // Not asked: not created.
    assert_eq!(
        metadata_topic(&mut socket, "clicks", false).await,
        (unknown, 0)
    );
    assert_eq!(metadata_topic(&mut socket, "clicks", true).await, (0, 3));
    let info = s.node.describe_table("kafka", "clicks").unwrap();
    assert!(mink_kafka::records::is_raw(&info.schema));
    drop(socket);
    s.stop().await;
    // The default: never created.
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    assert_eq!(
        metadata_topic(&mut socket, "clicks", true).await,
        (unknown, 0)
    );
    assert!(s.node.describe_table("kafka", "clicks").is_err());
    drop(socket);
    s.stop().await;
}

/// Every node names the same cluster and the same controller: the cluster's id from its
/// metadata (not a name every Mink cluster shares) and the lease holder (not itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_names_one_cluster_and_one_controller() {
    use kafka_protocol::messages::{
        DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse,
    };
    let dir = tempfile::tempdir().unwrap();
    let a = serve_node(dir.path(), 1).await;
    let b = serve_node(dir.path(), 2).await;
    until(&a.node, "two live nodes and a lease holder", || async {
        let status = a.node.cluster_status().await.unwrap();
        status.nodes.iter().filter(|n| n.live).count() == 2 && status.coordinator.is_some()
    })
    .await;
    let holder = a.node.group_coordinator().unwrap();
    // A fresh cluster records listeners from metadata_version 3 on: each node states its own
    // once the cluster is there.
    for served in [&a, &b] {
        until(
            &served.node,
            "both Kafka listeners and the lease holder",
            || async {
                let view = served.node.view();
                served.node.group_coordinator() == Some(holder)
                    && [1, 2].iter().all(|id| {
                        view.state
                            .nodes
                            .get(id)
                            .is_some_and(|n| n.listeners.contains_key(mink_kafka::LISTENER))
                    })
            },
        )
        .await;
    }
    let id = a
        .node
        .cluster_id()
        .expect("a started node has a cluster id");
    assert_eq!(b.node.cluster_id().as_deref(), Some(id.as_str()));
    for served in [&a, &b] {
        let mut socket = tokio::net::TcpStream::connect(&served.kafka).await.unwrap();
        let m: MetadataResponse = ask(
            &mut socket,
            ApiKey::Metadata,
            12,
            &MetadataRequest::default(),
        )
        .await;
        assert_eq!(m.cluster_id.as_deref(), Some(id.as_str()));
        assert_eq!(
            m.controller_id.0,
            i32::try_from(holder).unwrap(),
            "node {}: {m:?}",
            served.node.node_id()
        );
        let d: DescribeClusterResponse = ask(
            &mut socket,
            ApiKey::DescribeCluster,
            0,
            &DescribeClusterRequest::default(),
        )
        .await;
        assert_eq!(d.cluster_id.as_str(), id.as_str());
        assert_eq!(d.controller_id.0, i32::try_from(holder).unwrap());
    }
    a.stop().await;
    b.stop().await;
}

/// A Metadata v4 request for `topic` (`allow`: auto-creation asked): its error code and
/// partition count.
async fn metadata_topic(
    socket: &mut tokio::net::TcpStream,
    topic: &'static str,
    allow: bool,
) -> (i16, usize) {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let version = 4;
    let request = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_static_str(topic)))),
        ]))
        .with_allow_auto_topic_creation(allow);
    let r: MetadataResponse = ask(socket, ApiKey::Metadata, version, &request).await;
    (r.topics[0].error_code, r.topics[0].partitions.len())
}

/// Runs tests/`script` with `python` against the Kafka listener at `kafka`; fails with its
/// output unless it succeeds.
async fn run_script(python: PathBuf, script: &'static str, kafka: &str) {
    run_script_with(python, script, kafka, &[]).await;
}

/// [`run_script`] with `args` after the bootstrap address.
async fn run_script_with(python: PathBuf, script: &'static str, kafka: &str, args: &[&str]) {
    let path = manifest_dir().join("tests").join(script);
    let kafka = kafka.to_string();
    let args: Vec<String> = args.iter().map(ToString::to_string).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(path)
            .arg(kafka)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Returns once `done` holds, checked at each metadata change `node` applies (or every 200
/// ms); fails after 30 s naming `what` it waited for.
async fn until<F: Future<Output = bool>>(node: &Node, what: &str, mut done: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 30 s for {what}"
        );
        next_change(node).await;
    }
}

/// Returns once `node` applies its next metadata change, or after 200 ms: a wait between two
/// checks of a condition the caller bounds with its own deadline.
async fn next_change(node: &Node) {
    let index = node.view().applied_index;
    let _ = node
        .wait_applied(index + 1, Duration::from_millis(200))
        .await;
}

/// Sends one request frame and reads one response frame.
async fn exchange(socket: &mut tokio::net::TcpStream, frame: &[u8]) -> std::io::Result<Bytes> {
    socket.write_all(frame).await?;
    let size = socket.read_i32().await?;
    let mut buf = vec![0u8; usize::try_from(size).unwrap()];
    socket.read_exact(&mut buf).await?;
    Ok(Bytes::from(buf))
}

/// Sends `request` (API `key` at `version`, header versions by them) and decodes its answer.
async fn ask<A: Decodable>(
    socket: &mut tokio::net::TcpStream,
    key: ApiKey,
    version: i16,
    request: &impl Encodable,
) -> A {
    let frame = request_frame(key, version, 42, request);
    let mut response = exchange(socket, &frame).await.unwrap();
    ResponseHeader::decode(&mut response, key.response_header_version(version)).unwrap();
    A::decode(&mut response, version).unwrap()
}

fn produce_frame(records: Bytes) -> Vec<u8> {
    produce_frame_to(0, records)
}

/// A Produce request frame (version 7) of `records` to partition `partition` of topic `t`.
fn produce_frame_to(partition: i32, records: Bytes) -> Vec<u8> {
    request_frame(ApiKey::Produce, 7, 42, &produce_request(partition, records))
}

/// A Produce request (acks = all) of `records` to partition `partition` of topic `t`.
fn produce_request(partition: i32, records: Bytes) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(records)),
                ]),
        ])
}

/// A request frame: its size, a header, then `request` at `version`.
fn request_frame<R: Encodable>(
    key: ApiKey,
    version: i16,
    correlation: i32,
    request: &R,
) -> Vec<u8> {
    request_frame_with(key, version, correlation, |body| {
        request.encode(body, version).unwrap();
    })
}

/// A request frame: its size, a header, then what `encode` writes.
fn request_frame_with(
    key: ApiKey,
    version: i16,
    correlation: i32,
    encode: impl FnOnce(&mut BytesMut),
) -> Vec<u8> {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str("mink-test")));
    let mut body = BytesMut::new();
    header
        .encode(&mut body, key.request_header_version(version))
        .unwrap();
    encode(&mut body);
    let mut frame = BytesMut::new();
    frame.put_i32(i32::try_from(body.len()).unwrap());
    frame.extend_from_slice(&body);
    frame.to_vec()
}

/// Sends a produce request `frame` and returns its partition's error code.
async fn produced(socket: &mut tokio::net::TcpStream, frame: &[u8]) -> i16 {
    produce_error(exchange(socket, frame).await.unwrap())
}

/// The partition error code of a produce response frame.
fn produce_error(mut response: Bytes) -> i16 {
    let header = ResponseHeader::decode(&mut response, 0).unwrap();
    assert_eq!(header.correlation_id, 42);
    let r = ProduceResponse::decode(&mut response, 7).unwrap();
    r.responses[0].partition_responses[0].error_code
}

/// Hostile frames: a corrupt batch (bad CRC, a record count its bytes cannot hold, a length
/// past the frame, a decompression bomb) gets CORRUPT_MESSAGE and stores nothing; an oversized
/// or garbage frame, or an array count past the frame, closes its connection; the listener keeps
/// serving others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_get_errors_and_harm_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    raw_topic(&s.node, "t", 1).await;
    // A good batch of three records, to corrupt.
    let records: Vec<_> = (0..3)
        .map(|i| record(i, -1, -1, -1, 1000 + i, None, Some(format!("v{i}"))))
        .collect();
    let good = mink_kafka::records::encode_records(&records).unwrap();
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let mut bad_crc = good.to_vec();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    let mut bad_count = good.to_vec();
    bad_count[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    let mut bad_length = good.to_vec();
    bad_length[8..12].copy_from_slice(&1_000_000i32.to_be_bytes());
    // A header whose count and offset range disagree with the records it holds (CRC
    // right): the third record was dropped and the batch acknowledged; and a batch of none.
    let recount = |count: i32, last_delta: i32| {
        let mut b = good.to_vec();
        b[57..61].copy_from_slice(&count.to_be_bytes());
        b[23..27].copy_from_slice(&last_delta.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    };
    for bad in [
        bad_crc,
        bad_count,
        bad_length,
        b"short".to_vec(),
        recount(2, 2),
        recount(2, 1),
        recount(0, -1),
    ] {
        assert_eq!(
            produced(&mut socket, &produce_frame(Bytes::from(bad))).await,
            kafka_protocol::ResponseError::CorruptMessage.code()
        );
    }
    // A time past what microseconds hold: it was clamped, acknowledged, and read back as
    // another time (or failed to read).
    let late = mink_kafka::records::encode_records(&[record(0, -1, -1, -1, i64::MAX, None, None)])
        .unwrap();
    assert_eq!(
        produced(&mut socket, &produce_frame(late)).await,
        kafka_protocol::ResponseError::InvalidTimestamp.code()
    );
    // A header key that is not UTF-8 (the CRC right): a record the raw schema cannot hold,
    // INVALID_RECORD (not retried, as CORRUPT_MESSAGE is), and nothing of its batch stored.
    let mut keyed = kafka_protocol::records::Record {
        headers: [(StrBytes::from_static_str("kx"), None)]
            .into_iter()
            .collect(),
        ..records[0].clone()
    };
    keyed.offset = 0;
    let mut bad_header = mink_kafka::records::encode_records(&[keyed])
        .unwrap()
        .to_vec();
    let at = bad_header.windows(2).position(|w| w == b"kx").unwrap();
    bad_header[at + 1] = 0xff;
    let crc = crc32c::crc32c(&bad_header[21..]);
    bad_header[17..21].copy_from_slice(&crc.to_be_bytes());
    let mut answer = exchange(&mut socket, &produce_frame(Bytes::from(bad_header)))
        .await
        .unwrap();
    ResponseHeader::decode(&mut answer, 0).unwrap();
    let answer = ProduceResponse::decode(&mut answer, 7).unwrap();
    let p = &answer.responses[0].partition_responses[0];
    assert_eq!(
        p.error_code,
        kafka_protocol::ResponseError::InvalidRecord.code(),
        "{p:?}"
    );
    assert!(
        s.rows("kafka", "t", 0).await.is_empty(),
        "a corrupt batch was stored"
    );
    // The good batch on the same connection.
    assert_eq!(produced(&mut socket, &produce_frame(good)).await, 0);
    // A frame claiming 2 GiB closes its connection, nothing read from it.
    let mut huge = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    huge.write_all(&i32::MAX.to_be_bytes()).await.unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        huge.read(&mut buf).await.unwrap(),
        0,
        "the connection stays open"
    );
    // Garbage after a plausible size: an unknown API key closes the connection.
    let mut garbage = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    garbage
        .write_all(&[0, 0, 0, 8, 0x7f, 0x7f, 0, 0, 0, 0, 0, 1])
        .await
        .unwrap();
    assert_eq!(garbage.read(&mut buf).await.unwrap(), 0);
    // A request whose array count claims two billion topics in a few bytes: refused before
    // anything is sized from the count (the process would abort on the allocation).
    let mut counted = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let mut frame = BytesMut::new();
    frame.put_i32(14);
    frame.put_i16(ApiKey::Metadata as i16);
    frame.put_i16(0);
    frame.put_i32(9); // correlation id
    frame.put_i16(-1); // no client id
    frame.put_i32(i32::MAX); // the topics array
    counted.write_all(&frame).await.unwrap();
    assert_eq!(counted.read(&mut buf).await.unwrap(), 0);
    // A batch that decompresses past the limit (a few KiB of zstd for 260 MiB of zeros).
    let bomb = kafka_protocol::records::Record {
        value: Some(Bytes::from(vec![0u8; 260 << 20])),
        ..records[0].clone()
    };
    let mut compressed = BytesMut::new();
    kafka_protocol::records::RecordBatchEncoder::encode(
        &mut compressed,
        [&bomb],
        &kafka_protocol::records::RecordEncodeOptions {
            version: 2,
            compression: kafka_protocol::records::Compression::Zstd,
        },
    )
    .unwrap();
    drop(bomb);
    assert!(compressed.len() < 1 << 20, "{}", compressed.len());
    assert_eq!(
        produced(&mut socket, &produce_frame(compressed.freeze())).await,
        kafka_protocol::ResponseError::CorruptMessage.code()
    );
    // A known API at a version it is not served at closes the connection; ApiVersions at
    // one is answered in version 0 with UNSUPPORTED_VERSION and the versions served, so the
    // client can pick one.
    for (key, answered) in [(ApiKey::Metadata, false), (ApiKey::ApiVersions, true)] {
        let mut versioned = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
        let mut frame = BytesMut::new();
        frame.put_i32(10);
        frame.put_i16(key as i16);
        frame.put_i16(99);
        frame.put_i32(11); // correlation id
        frame.put_i16(-1); // no client id
        versioned.write_all(&frame).await.unwrap();
        if answered {
            let mut response = exchange(&mut versioned, &[]).await.unwrap();
            let header = ResponseHeader::decode(&mut response, 0).unwrap();
            assert_eq!(header.correlation_id, 11);
            let r =
                kafka_protocol::messages::ApiVersionsResponse::decode(&mut response, 0).unwrap();
            assert_eq!(
                r.error_code,
                kafka_protocol::ResponseError::UnsupportedVersion.code()
            );
            assert!(
                r.api_keys
                    .iter()
                    .any(|k| k.api_key == ApiKey::Metadata as i16)
            );
        } else {
            assert_eq!(versioned.read(&mut buf).await.unwrap(), 0, "{key:?} v99");
        }
    }
    // Others are still served; the good rows are there, once.
    assert_eq!(produced(&mut socket, &produce_frame(encode_one())).await, 0);
    let stored = s.row_count("kafka", "t", 0).await;
    assert_eq!(stored, 4);
    s.stop().await;
}

/// However much a fetch asks for, it gets about `max_fetch_bytes` of records; past the end,
/// OFFSET_OUT_OF_RANGE. A client that stops reading its answers stops being read once
/// `max_unsent_bytes` of them wait (a produce it sent after 50 fetches is never taken, where
/// 64 answers of any size used to wait), and is closed after `connections_max_idle`, as is one
/// that sends part of a frame and stalls; others are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stall_hold_bounded_memory_and_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let config = mink_kafka::KafkaConfig {
        max_fetch_bytes: 1 << 20,
        max_unsent_bytes: 1 << 20,
        connections_max_idle: Duration::from_millis(300),
        ..Default::default()
    };
    let s = serve_with(dir.path(), 1, config).await;
    raw_topic(&s.node, "t", 1).await;
    // 8 MiB: 16 batches of 8 records of 64 KiB.
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let value = "x".repeat(64 << 10);
    for batch in 0..16 {
        let records: Vec<_> = (0..8)
            .map(|i| record(i, -1, -1, -1, 1000 + batch, None, Some(value.clone())))
            .collect();
        let frame = produce_frame(mink_kafka::records::encode_records(&records).unwrap());
        assert_eq!(produced(&mut socket, &frame).await, 0);
    }
    let response = exchange(&mut socket, &fetch_at(0, i32::MAX)).await.unwrap();
    assert!(
        response.len() < 2 << 20,
        "a fetch answered {} bytes",
        response.len()
    );
    let partitions = fetched(response);
    assert_eq!(partitions[0].1, 0);
    assert!(partitions[0].2 >= 16, "{partitions:?}");
    let response = exchange(&mut socket, &fetch_at(1 << 30, i32::MAX))
        .await
        .unwrap();
    assert_eq!(
        fetched(response)[0].1,
        kafka_protocol::ResponseError::OffsetOutOfRange.code()
    );
    // 50 fetches of 1 MiB or more each, then a produce, and nothing read.
    let mut stalled = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let mut frames: Vec<u8> = (0..50).flat_map(|_| fetch_at(0, i32::MAX)).collect();
    frames.extend(produce_frame(encode_one()));
    stalled.write_all(&frames).await.unwrap();
    // Part of a frame, then nothing.
    let mut partial = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    partial
        .write_all(&[0, 0, 3, 232, 0, 1, 0, 0])
        .await
        .unwrap();
    // Another client is served meanwhile.
    let mut other = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    assert_eq!(produced(&mut other, &produce_frame(encode_one())).await, 0);
    // Both stalled clients are closed.
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), partial.read(&mut buf))
        .await
        .expect("the client that sent part of a frame was not closed within 30 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // The one not reading learns it when a write fails: the node reads nothing more from it,
    // so a large write fills the socket buffers and waits until the close resets it.
    let written = tokio::time::timeout(
        Duration::from_secs(30),
        stalled.write_all(&vec![0u8; 64 << 20]),
    )
    .await
    .expect("the client that read nothing was not closed within 30 s");
    assert!(
        written.is_err(),
        "a 64 MiB write to a closed connection went through"
    );
    // Its produce was never taken: the 128 records and the other client's one.
    let stored = s.row_count("kafka", "t", 0).await;
    assert_eq!(stored, 16 * 8 + 1);
    s.stop().await;
}

/// What Kafka offers and Mink does not map is refused with Kafka's codes: a partitioned or a
/// primary-key table is not a topic (Metadata and Produce answer UNKNOWN_TOPIC_OR_PARTITION,
/// and listing every topic leaves them out); a transactional id gets
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED from InitProducerId, Produce and FindCoordinator (a
/// code clients take as fatal, not one they retry), a transactional batch CORRUPT_MESSAGE, each storing
/// nothing. A produce with acks = 0 is stored and answered with nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_kafka_offers_and_mink_does_not_map_is_refused_with_its_codes() {
    use kafka_protocol::ResponseError;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{
        FindCoordinatorRequest, FindCoordinatorResponse, InitProducerIdRequest,
        InitProducerIdResponse, MetadataRequest, MetadataResponse,
    };
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    raw_topic(&s.node, "t", 1).await;
    let fields = vec![
        Field::new("region", DataType::Utf8, false),
        Field::new("id", DataType::Int64, false),
    ];
    for (name, primary_key, partition_keys) in [
        ("partitioned", vec![], vec!["region".to_string()]),
        ("keyed", vec!["id".to_string()], vec![]),
    ] {
        s.node
            .create_table(TableSpec {
                database: "kafka".into(),
                name: name.into(),
                schema: Schema::new(fields.clone()),
                primary_key,
                options: [("bucket.num".to_string(), "1".to_string())].into(),
                partition_keys,
                comment: String::new(),
                if_not_exists: false,
            })
            .await
            .unwrap();
    }
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let topics = |names: &[&str]| {
        names
            .iter()
            .map(|n| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string((*n).to_string()))))
            })
            .collect::<Vec<_>>()
    };
    let named_request =
        MetadataRequest::default().with_topics(Some(topics(&["partitioned", "keyed", "t"])));
    let named: MetadataResponse = ask(&mut socket, ApiKey::Metadata, 4, &named_request).await;
    let codes: Vec<(String, i16)> = named
        .topics
        .iter()
        .map(|t| (t.name.as_ref().unwrap().0.to_string(), t.error_code))
        .collect();
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    assert_eq!(
        codes,
        [
            ("partitioned".to_string(), unknown),
            ("keyed".to_string(), unknown),
            ("t".to_string(), 0)
        ]
    );
    // No topics named (null): every topic.
    let every = MetadataRequest::default().with_topics(None);
    let all: MetadataResponse = ask(&mut socket, ApiKey::Metadata, 4, &every).await;
    let listed: Vec<String> = all
        .topics
        .iter()
        .map(|t| t.name.as_ref().unwrap().0.to_string())
        .collect();
    assert_eq!(listed, ["t"]);
    let produce_to = |topic: &'static str, transactional: Option<&'static str>, acks: i16| {
        let request =
            ProduceRequest::default()
                .with_acks(acks)
                .with_timeout_ms(5000)
                .with_transactional_id(transactional.map(|t| {
                    kafka_protocol::messages::TransactionalId(StrBytes::from_static_str(t))
                }))
                .with_topic_data(vec![
                    TopicProduceData::default()
                        .with_name(TopicName(StrBytes::from_static_str(topic)))
                        .with_partition_data(vec![
                            PartitionProduceData::default()
                                .with_index(0)
                                .with_records(Some(encode_one())),
                        ]),
                ]);
        request_frame(ApiKey::Produce, 7, 42, &request)
    };
    for topic in ["partitioned", "keyed"] {
        assert_eq!(
            produced(&mut socket, &produce_to(topic, None, -1)).await,
            unknown,
            "{topic}"
        );
    }
    // Transactions.
    let response = exchange(&mut socket, &produce_to("t", Some("tx"), -1))
        .await
        .unwrap();
    let refused = ResponseError::TransactionalIdAuthorizationFailed.code();
    assert_eq!(produce_error(response), refused);
    let request = InitProducerIdRequest::default()
        .with_transactional_id(Some(kafka_protocol::messages::TransactionalId(
            StrBytes::from_static_str("tx"),
        )))
        .with_transaction_timeout_ms(60_000);
    let init: InitProducerIdResponse = ask(&mut socket, ApiKey::InitProducerId, 1, &request).await;
    assert_eq!(init.error_code, refused);
    let request = FindCoordinatorRequest::default()
        .with_key(StrBytes::from_static_str("tx"))
        .with_key_type(1);
    let found: FindCoordinatorResponse =
        ask(&mut socket, ApiKey::FindCoordinator, 1, &request).await;
    assert_eq!(found.error_code, refused);
    assert!(
        found
            .error_message
            .as_ref()
            .is_some_and(|m| m.contains("transactions")),
        "{found:?}"
    );
    let transactional = kafka_protocol::records::Record {
        transactional: true,
        producer_id: 7,
        producer_epoch: 0,
        sequence: 0,
        ..record(0, 7, 0, 0, 5, None, Some("tx".into()))
    };
    let batch = mink_kafka::records::encode_records(&[transactional]).unwrap();
    assert_eq!(
        produced(&mut socket, &produce_frame(batch)).await,
        ResponseError::CorruptMessage.code()
    );
    assert!(
        s.rows("kafka", "t", 0).await.is_empty(),
        "a refused write was stored"
    );
    // acks = 0: stored, and the next request's answer is the next thing on the wire.
    socket.write_all(&produce_to("t", None, 0)).await.unwrap();
    let request = FindCoordinatorRequest::default()
        .with_key(StrBytes::from_static_str("g"))
        .with_key_type(0);
    let mut response = exchange(
        &mut socket,
        &request_frame(ApiKey::FindCoordinator, 1, 43, &request),
    )
    .await
    .unwrap();
    let header = ResponseHeader::decode(&mut response, 0).unwrap();
    assert_eq!(header.correlation_id, 43, "acks = 0 was answered");
    until(&s.node, "the acks = 0 record to be stored", || async {
        !s.rows("kafka", "t", 0).await.is_empty()
    })
    .await;
    s.stop().await;
}

/// A fetch with nothing to answer waits its `max_wait_ms` and answers empty; one waiting when
/// records arrive answers with them at once, not at its `max_wait_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_waits_for_records_up_to_its_max_wait() {
    let dir = tempfile::tempdir().unwrap();
    let (s, mut socket) = serve_topic(dir.path()).await;
    let started = tokio::time::Instant::now();
    let response = exchange(&mut socket, &fetch_waiting(0, 300)).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "an empty fetch answered after {:?}, before its max_wait",
        started.elapsed()
    );
    assert_eq!(fetched(response), [(0, 0, 0)]);
    // A fetch that may wait 60 s, then a record produced from another connection.
    socket.write_all(&fetch_waiting(0, 60_000)).await.unwrap();
    let mut producer = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    assert_eq!(
        produced(&mut producer, &produce_frame(encode_one())).await,
        0
    );
    let response = tokio::time::timeout(Duration::from_secs(30), exchange(&mut socket, &[]))
        .await
        .expect("the waiting fetch was not answered within 30 s of the record")
        .unwrap();
    assert_eq!(fetched(response), [(0, 0, 1)]);
    s.stop().await;
}

/// A JoinGroup (v2) of a new consumer to `group`, subscribing to topic `t` (range).
/// An OffsetCommit (v2) of `offset` for partition 0 of topic `t` by `member` of `group_id` at
/// `generation`: its error code.
async fn commit_at(
    socket: &mut tokio::net::TcpStream,
    group_id: &'static str,
    generation: i32,
    member: StrBytes,
    offset: i64,
) -> i16 {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{GroupId, OffsetCommitRequest, OffsetCommitResponse};
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str(group_id)))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(member)
        .with_retention_time_ms(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(offset),
                ]),
        ]);
    let r: OffsetCommitResponse = ask(socket, ApiKey::OffsetCommit, 2, &request).await;
    r.topics[0].partitions[0].error_code
}

fn join_group(group: &'static str) -> kafka_protocol::messages::JoinGroupRequest {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    kafka_protocol::messages::JoinGroupRequest::default()
        .with_group_id(kafka_protocol::messages::GroupId(
            StrBytes::from_static_str(group),
        ))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_protocol_type(StrBytes::from_static_str("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(Bytes::from_static(&[
                    0, 0, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 0,
                ])),
        ])
}

/// A group's generations go on past a coordinator's end: the next coordinator starts the
/// group at a generation after the last one the previous completed, so a member of the old
/// generation cannot commit at the new coordinator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_generation_outlives_its_coordinator() {
    use kafka_protocol::messages::JoinGroupResponse;
    let dir = tempfile::tempdir().unwrap();
    let a = serve_groups(dir.path(), 1).await;
    let b = serve_groups(dir.path(), 2).await;
    raw_topic(&a.node, "t", 1).await;
    until(&a.node, "a group coordinator", || async {
        a.node.group_coordinator().is_some()
    })
    .await;
    let (first, next) = if a.node.group_coordinator() == Some(1) {
        (a, b)
    } else {
        (b, a)
    };
    let mut socket = tokio::net::TcpStream::connect(&first.kafka).await.unwrap();
    let joined: JoinGroupResponse = ask(&mut socket, ApiKey::JoinGroup, 2, &join_group("g")).await;
    assert_eq!(joined.error_code, 0, "{joined:?}");
    let (before, member) = (joined.generation_id, joined.member_id.clone());
    until(&first.node, "the generation to be recorded", || async {
        first.node.group_generation("g") == before
    })
    .await;
    // Admin clients ask every broker for its groups: the coordinator lists the group, the
    // other node none, without an error (kafka-python's list_groups raised NOT_COORDINATOR).
    use kafka_protocol::messages::{ListGroupsRequest, ListGroupsResponse};
    let listed = |r: &ListGroupsResponse| {
        assert_eq!(r.error_code, 0, "{r:?}");
        r.groups
            .iter()
            .map(|g| g.group_id.to_string())
            .collect::<Vec<_>>()
    };
    let at_first: ListGroupsResponse = ask(
        &mut socket,
        ApiKey::ListGroups,
        4,
        &ListGroupsRequest::default(),
    )
    .await;
    assert_eq!(listed(&at_first), ["g"]);
    let mut other = tokio::net::TcpStream::connect(&next.kafka).await.unwrap();
    let at_next: ListGroupsResponse = ask(
        &mut other,
        ApiKey::ListGroups,
        4,
        &ListGroupsRequest::default(),
    )
    .await;
    assert!(listed(&at_next).is_empty(), "{at_next:?}");
    drop(other);
    drop(socket);
    first.stop().await;
    let id = next.node.node_id();
    until(
        &next.node,
        "the other node to coordinate the group",
        || async { next.node.group_coordinator() == Some(id) },
    )
    .await;
    let mut socket = tokio::net::TcpStream::connect(&next.kafka).await.unwrap();
    // Until the group rebalances here, its members commit at the generation the old
    // coordinator recorded (consumers commit what they read before they rejoin: refused, it
    // would be read again); an older generation is refused.
    use kafka_protocol::ResponseError;
    assert_eq!(
        commit_at(&mut socket, "g", before - 1, member.clone(), 1).await,
        ResponseError::IllegalGeneration.code()
    );
    assert_eq!(
        commit_at(&mut socket, "g", before, member.clone(), 2).await,
        0
    );
    assert_eq!(
        next.node
            .group_offsets("g")
            .iter()
            .map(|c| c.offset)
            .collect::<Vec<_>>(),
        [2]
    );
    let joined: JoinGroupResponse = ask(&mut socket, ApiKey::JoinGroup, 2, &join_group("g")).await;
    assert_eq!(joined.error_code, 0, "{joined:?}");
    assert!(
        joined.generation_id > before,
        "generation {} at the new coordinator, {before} at the old",
        joined.generation_id
    );
    // Once the group has rebalanced here, the old generation's members are fenced.
    assert_eq!(
        commit_at(&mut socket, "g", before, member, 3).await,
        ResponseError::UnknownMemberId.code()
    );
    next.stop().await;
}

/// A member of a stable group that joins again as it was gets its generation back at once,
/// as from Kafka, and the other members go on undisturbed: a new round each time made
/// kafka-python consumers polling in turn rebalance forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_rejoining_unchanged_keeps_its_generation() {
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{
        GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupResponse, SyncGroupRequest,
        SyncGroupResponse,
    };
    let dir = tempfile::tempdir().unwrap();
    let s = serve_groups(dir.path(), 1).await;
    raw_topic(&s.node, "t", 1).await;
    let group = || GroupId(StrBytes::from_static_str("g"));
    let connect = || tokio::net::TcpStream::connect(s.kafka.clone());
    let (mut a, mut b) = (connect().await.unwrap(), connect().await.unwrap());
    let join = |socket: tokio::net::TcpStream, member: StrBytes| {
        tokio::spawn(async move {
            let mut socket = socket;
            let r: JoinGroupResponse = ask(
                &mut socket,
                ApiKey::JoinGroup,
                2,
                &join_group("g").with_member_id(member),
            )
            .await;
            (socket, r)
        })
    };
    let sync = |generation: i32, member: &StrBytes, assignments: Vec<StrBytes>| {
        SyncGroupRequest::default()
            .with_group_id(group())
            .with_generation_id(generation)
            .with_member_id(member.clone())
            .with_assignments(
                assignments
                    .into_iter()
                    .map(|m| {
                        SyncGroupRequestAssignment::default()
                            .with_member_id(m)
                            .with_assignment(Bytes::new())
                    })
                    .collect(),
            )
    };
    // A alone, then B: A rejoins the round B's join started.
    let (socket, first) = join(a, StrBytes::default()).await.unwrap();
    a = socket;
    let id_a = first.member_id.clone();
    let pending_b = join(b, StrBytes::default());
    // A's heartbeats (each a round trip: no sleep between them) tell it when B's join has
    // started a round, as they tell a client.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (socket, again) = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 30 s for B's join to start a round"
        );
        let beat: HeartbeatResponse = ask(
            &mut a,
            ApiKey::Heartbeat,
            1,
            &HeartbeatRequest::default()
                .with_group_id(group())
                .with_generation_id(first.generation_id)
                .with_member_id(id_a.clone()),
        )
        .await;
        if beat.error_code != 0 {
            break join(a, id_a.clone()).await.unwrap();
        }
    };
    a = socket;
    let (socket, joined_b) = pending_b.await.unwrap();
    b = socket;
    let generation = again.generation_id;
    assert_eq!(joined_b.generation_id, generation);
    let (leader, follower) = if again.leader == id_a {
        ((&mut a, id_a.clone()), (&mut b, joined_b.member_id.clone()))
    } else {
        ((&mut b, joined_b.member_id.clone()), (&mut a, id_a.clone()))
    };
    let (follower_socket, follower_id) = follower;
    let (leader_socket, leader_id) = leader;
    let everyone = vec![leader_id.clone(), follower_id.clone()];
    let f = sync(generation, &follower_id, vec![]);
    let l = sync(generation, &leader_id, everyone);
    let (synced_f, synced_l) = tokio::join!(
        ask::<SyncGroupResponse>(follower_socket, ApiKey::SyncGroup, 1, &f),
        ask::<SyncGroupResponse>(leader_socket, ApiKey::SyncGroup, 1, &l),
    );
    assert_eq!((synced_f.error_code, synced_l.error_code), (0, 0));
    // The follower joins again, unchanged: answered at once, at the same generation.
    let rejoined: JoinGroupResponse = tokio::time::timeout(
        Duration::from_secs(10),
        ask(
            follower_socket,
            ApiKey::JoinGroup,
            2,
            &join_group("g").with_member_id(follower_id.clone()),
        ),
    )
    .await
    .expect("an unchanged member's JoinGroup waited for a new round");
    assert_eq!(
        (rejoined.error_code, rejoined.generation_id),
        (0, generation)
    );
    let beat: HeartbeatResponse = ask(
        leader_socket,
        ApiKey::Heartbeat,
        1,
        &HeartbeatRequest::default()
            .with_group_id(group())
            .with_generation_id(generation)
            .with_member_id(leader_id),
    )
    .await;
    assert_eq!(beat.error_code, 0, "the leader was sent to rejoin");
    drop((a, b));
    s.stop().await;
}

/// A group whose members have all left, and which committed nothing, is forgotten after its
/// retention (it was listed, Empty, until the node restarted); one with committed offsets
/// stays listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_left_nothing_is_forgotten() {
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::messages::{
        GroupId, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
        ListGroupsResponse,
    };
    let dir = tempfile::tempdir().unwrap();
    let config = mink_kafka::KafkaConfig {
        initial_rebalance_delay: Duration::from_millis(10),
        empty_group_retention: Duration::from_millis(200),
        ..Default::default()
    };
    let s = serve_with(dir.path(), 1, config).await;
    raw_topic(&s.node, "t", 1).await;
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let mut gone = None;
    for group in ["gone", "kept"] {
        let joined: JoinGroupResponse =
            ask(&mut socket, ApiKey::JoinGroup, 2, &join_group(group)).await;
        assert_eq!(joined.error_code, 0, "{joined:?}");
        if group == "gone" {
            gone = Some((joined.generation_id, joined.member_id.clone()));
        }
        if group == "kept" {
            assert_eq!(
                commit_at(&mut socket, group, -1, StrBytes::default(), 1).await,
                0
            );
        }
        let left: LeaveGroupResponse = ask(
            &mut socket,
            ApiKey::LeaveGroup,
            3,
            &LeaveGroupRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str(group)))
                .with_members(vec![
                    MemberIdentity::default().with_member_id(joined.member_id),
                ]),
        )
        .await;
        assert_eq!(left.error_code, 0, "{left:?}");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let listed: ListGroupsResponse = ask(
            &mut socket,
            ApiKey::ListGroups,
            4,
            &ListGroupsRequest::default(),
        )
        .await;
        let ids: Vec<String> = listed
            .groups
            .iter()
            .map(|g| g.group_id.to_string())
            .collect();
        if ids == ["kept"] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 30 s for only the group with offsets to be listed: {ids:?}"
        );
        next_change(&s.node).await;
    }
    // A member of the forgotten group is no member of any generation here: its commit is
    // refused, as a commit to a group Kafka does not know is.
    let (generation, member) = gone.unwrap();
    assert_eq!(
        commit_at(&mut socket, "gone", generation, member, 1).await,
        kafka_protocol::ResponseError::IllegalGeneration.code()
    );
    drop(socket);
    s.stop().await;
}

/// A Fetch (v11) of partition 0 of topic `t` from `offset`, waiting up to `max_wait_ms` for a
/// byte.
fn fetch_waiting(offset: i64, max_wait_ms: i32) -> Vec<u8> {
    fetch_from(offset, max_wait_ms, 1 << 20)
}

/// A Fetch (v11) of partition 0 of topic `t` from `offset`, asking for `max_bytes` at most
/// (the response's and the partition's) and waiting for nothing.
fn fetch_at(offset: i64, max_bytes: i32) -> Vec<u8> {
    fetch_from(offset, 0, max_bytes)
}

/// A Fetch (v11) of partition 0 of topic `t` from `offset`: `max_bytes` for the response and
/// the partition, waiting up to `max_wait_ms` for a byte.
fn fetch_from(offset: i64, max_wait_ms: i32, max_bytes: i32) -> Vec<u8> {
    use kafka_protocol::messages::FetchRequest;
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    let request = FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(0)
                        .with_fetch_offset(offset)
                        .with_partition_max_bytes(max_bytes),
                ]),
        ]);
    request_frame(ApiKey::Fetch, 11, 43, &request)
}

/// A Produce with acks other than all (-1), none (0) or the leader (1) is refused with
/// INVALID_REQUIRED_ACKS and stores nothing (acks = 2 was taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_with_acks_kafka_does_not_know_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (s, mut socket) = serve_topic(dir.path()).await;
    let frame = request_frame(
        ApiKey::Produce,
        7,
        42,
        &produce_request(0, encode_one()).with_acks(2),
    );
    let mut answer = exchange(&mut socket, &frame).await.unwrap();
    ResponseHeader::decode(&mut answer, 0).unwrap();
    let answer = ProduceResponse::decode(&mut answer, 7).unwrap();
    let p = &answer.responses[0].partition_responses[0];
    // Nothing stored, so no offset (librdkafka reported the message at offset 0).
    assert_eq!(
        (p.error_code, p.base_offset),
        (
            kafka_protocol::ResponseError::InvalidRequiredAcks.code(),
            -1
        ),
        "{p:?}"
    );
    assert_eq!(produced(&mut socket, &produce_frame(encode_one())).await, 0);
    assert_eq!(s.row_count("kafka", "t", 0).await, 1);
    s.stop().await;
}

/// A batch larger than a bucket's stream takes whole is MESSAGE_TOO_LARGE (it was
/// INVALID_REQUEST, which librdkafka shows as "Broker: Invalid request"); smaller ones go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_streams_limit_is_message_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve_tuned(
        dir.path(),
        1,
        mink_kafka::KafkaConfig::default(),
        None,
        "127.0.0.1:0",
        |c| c.engine.max_buffered_bytes = 64 << 10,
    )
    .await;
    raw_topic(&s.node, "t", 1).await;
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let big = record(0, -1, -1, -1, 5, None, Some("x".repeat(100 << 10)));
    let frame = produce_frame(mink_kafka::records::encode_records(&[big]).unwrap());
    assert_eq!(
        produced(&mut socket, &frame).await,
        kafka_protocol::ResponseError::MessageTooLarge.code()
    );
    assert_eq!(produced(&mut socket, &produce_frame(encode_one())).await, 0);
    s.stop().await;
}

/// A raw topic's columns cannot change: with one more it would be a typed table, and the
/// records stored before would fetch as JSON rows instead of their keys and values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_topic_keeps_its_columns() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    raw_topic(&s.node, "t", 1).await;
    let mut fields: Vec<Field> = mink_log::raw::schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("note", DataType::Utf8, true));
    let change = mink_node::TableChange {
        schema: Some(Schema::new(fields)),
        ..Default::default()
    };
    let refused = s.node.alter_table("kafka", "t", change).await.unwrap_err();
    assert!(
        matches!(&refused, NodeError::Invalid(m) if m.contains("raw Kafka records")),
        "{refused}"
    );
    s.stop().await;
}

/// An idempotent producer at the protocol level: InitProducerId hands out a producer id; a
/// retried batch (the last, or one before it) is answered with its first offsets and stored
/// once, also after a restart; a gap in the sequence and an unknown producer id are refused
/// with Kafka's codes; a producer that raises its epoch starts again at 0 and its old epoch
/// is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producers_store_a_retried_batch_once() {
    use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};
    let dir = tempfile::tempdir().unwrap();
    let (s, mut socket) = serve_topic(dir.path()).await;
    let version = 1;
    let request = InitProducerIdRequest::default().with_transaction_timeout_ms(60_000);
    let init: InitProducerIdResponse =
        ask(&mut socket, ApiKey::InitProducerId, version, &request).await;
    assert_eq!(init.error_code, 0);
    let producer = init.producer_id.0;
    assert!(producer > 0, "{producer}");
    let batch = |producer: i64, first_sequence: i32, n: i32| {
        let records: Vec<_> = (0..n)
            .map(|i| {
                record(
                    i64::from(i),
                    producer,
                    init.producer_epoch,
                    first_sequence + i,
                    1,
                    None,
                    Some(format!("s{}", first_sequence + i)),
                )
            })
            .collect();
        mink_kafka::records::encode_records(&records).unwrap()
    };
    let base = |mut response: Bytes| {
        ResponseHeader::decode(&mut response, 0).unwrap();
        let r = ProduceResponse::decode(&mut response, 7).unwrap();
        let p = &r.responses[0].partition_responses[0];
        (p.error_code, p.base_offset)
    };
    let first = produce_frame(batch(producer, 0, 3));
    assert_eq!(base(exchange(&mut socket, &first).await.unwrap()), (0, 0));
    // The producer retries the batch (its answer was lost): the same offsets, stored once.
    assert_eq!(base(exchange(&mut socket, &first).await.unwrap()), (0, 0));
    // The producer state is stored with the rows: after a restart of the node, the retry is
    // still recognised.
    drop(socket);
    s.stop().await;
    let s = serve(dir.path()).await;
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    assert_eq!(base(exchange(&mut socket, &first).await.unwrap()), (0, 0));
    let next = produce_frame(batch(producer, 3, 2));
    assert_eq!(base(exchange(&mut socket, &next).await.unwrap()), (0, 3));
    // A retry of a batch before the last (one of the last five) is answered too.
    assert_eq!(base(exchange(&mut socket, &first).await.unwrap()), (0, 0));
    let at_epoch = |epoch: i16, first_sequence: i32| {
        let r = record(
            0,
            producer,
            epoch,
            first_sequence,
            1,
            None,
            Some(format!("e{epoch}")),
        );
        produce_frame(mink_kafka::records::encode_records(&[r]).unwrap())
    };
    // A gap, and a producer id nobody handed out.
    let gap = produce_frame(batch(producer, 9, 1));
    assert_eq!(
        base(exchange(&mut socket, &gap).await.unwrap()).0,
        kafka_protocol::ResponseError::OutOfOrderSequenceNumber.code()
    );
    let unknown = produce_frame(batch(producer + 1000, 0, 1));
    assert_eq!(
        base(exchange(&mut socket, &unknown).await.unwrap()).0,
        kafka_protocol::ResponseError::UnknownProducerId.code()
    );
    // A producer that raises its own epoch (KIP-360: librdkafka does after a failed batch,
    // without asking for a new id) starts again at sequence 0; from then on its old epoch is
    // fenced. Refusing the new epoch failed every later batch of a librdkafka producer.
    assert_eq!(init.producer_epoch, 0);
    assert_eq!(
        base(exchange(&mut socket, &at_epoch(1, 3)).await.unwrap()).0,
        kafka_protocol::ResponseError::OutOfOrderSequenceNumber.code(),
        "a new epoch starts at sequence 0"
    );
    assert_eq!(
        base(exchange(&mut socket, &at_epoch(1, 0)).await.unwrap()),
        (0, 5)
    );
    assert_eq!(
        base(exchange(&mut socket, &at_epoch(0, 5)).await.unwrap()),
        (
            kafka_protocol::ResponseError::InvalidProducerEpoch.code(),
            -1
        )
    );
    // A producer the partition holds no state for may start at any sequence, as in Kafka: its
    // state goes with a topic deleted and created again, and refusing it (Mink wanted 0) was
    // fatal for a librdkafka producer. From there it keeps its order.
    let other: InitProducerIdResponse =
        ask(&mut socket, ApiKey::InitProducerId, version, &request).await;
    let from = |first_sequence: i32| {
        let r = record(
            0,
            other.producer_id.0,
            other.producer_epoch,
            first_sequence,
            1,
            None,
            Some("o".into()),
        );
        produce_frame(mink_kafka::records::encode_records(&[r]).unwrap())
    };
    assert_eq!(base(exchange(&mut socket, &from(7)).await.unwrap()), (0, 6));
    assert_eq!(
        base(exchange(&mut socket, &from(9)).await.unwrap()).0,
        kafka_protocol::ResponseError::OutOfOrderSequenceNumber.code()
    );
    assert_eq!(base(exchange(&mut socket, &from(8)).await.unwrap()), (0, 7));
    let stored = s.row_count("kafka", "t", 0).await;
    assert_eq!(stored, 8);
    s.stop().await;
}

/// A Fetch (v11) of topic `t` from offset 0 of each of `partitions`, waiting up to five
/// seconds for a byte.
fn fetch_frame(partitions: &[i32]) -> Vec<u8> {
    use kafka_protocol::messages::FetchRequest;
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    let request = FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(5_000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(
                    partitions
                        .iter()
                        .map(|&p| {
                            FetchPartition::default()
                                .with_partition(p)
                                .with_partition_max_bytes(1 << 20)
                        })
                        .collect(),
                ),
        ]);
    request_frame(ApiKey::Fetch, 11, 43, &request)
}

/// Each partition of a Fetch (v11) response: its error code and how many records it carries.
fn fetched(mut response: Bytes) -> Vec<(i32, i16, usize)> {
    use kafka_protocol::messages::FetchResponse;
    use kafka_protocol::records::RecordBatchDecoder;
    let header = ResponseHeader::decode(&mut response, 0).unwrap();
    assert_eq!(header.correlation_id, 43);
    let r = FetchResponse::decode(&mut response, 11).unwrap();
    r.responses[0]
        .partitions
        .iter()
        .map(|p| {
            let mut records = p.records.clone().unwrap_or_default();
            let mut n = 0;
            while !records.is_empty() {
                n += RecordBatchDecoder::decode(&mut records)
                    .unwrap()
                    .records
                    .len();
            }
            (p.partition_index, p.error_code, n)
        })
        .collect()
}

/// A fetch that has records to answer with does not wait for a partition still reading from
/// the object store: that one is answered without records, its read goes on, and a later fetch
/// gets them. (A consumer has one fetch in flight per node; one cold partition would hold back
/// every other's records.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_does_not_wait_for_a_partition_reading_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let faults = s3stream::store::ObjectFaults::new(1);
    let faulty = |dir| {
        serve_faulty(
            dir,
            1,
            mink_kafka::KafkaConfig::default(),
            Some(std::sync::Arc::clone(&faults)),
        )
    };
    let s = faulty(dir.path()).await;
    raw_topic(&s.node, "t", 2).await;
    let three: Vec<_> = (0..3)
        .map(|i| record(i, -1, -1, -1, 1, None, Some(format!("cold {i}"))))
        .collect();
    let three = mink_kafka::records::encode_records(&three).unwrap();
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let produced = exchange(&mut socket, &produce_frame_to(1, three)).await;
    assert_eq!(produce_error(produced.unwrap()), 0);
    // Restarted, the node has partition 1 only in the object store; partition 0 is written now
    // and read from memory.
    drop(socket);
    s.stop().await;
    let s = faulty(dir.path()).await;
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let produced = exchange(&mut socket, &produce_frame_to(0, encode_one())).await;
    assert_eq!(produce_error(produced.unwrap()), 0);
    faults.pause();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        exchange(&mut socket, &fetch_frame(&[0, 1])),
    )
    .await
    .expect("the fetch waited for partition 1's read from the paused object store")
    .unwrap();
    assert_eq!(fetched(answer), vec![(0, 0, 1), (1, 0, 0)]);
    assert!(
        faults.gets_in_flight() >= 1,
        "partition 1 was read from the store"
    );
    faults.resume();
    let answer = exchange(&mut socket, &fetch_frame(&[1])).await.unwrap();
    assert_eq!(fetched(answer), vec![(1, 0, 3)]);
    drop(socket);
    s.stop().await;
}

/// A topic created with Kafka's defaults (`compression.type=producer`) stores what a producer
/// compressed compressed (ZSTD, Arrow's codec) and what it did not uncompressed; fetched, both
/// are the records produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_stored_compressed_as_their_producer_sent_them() {
    use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
    let dir = tempfile::tempdir().unwrap();
    let (s, mut socket) = serve_topic(dir.path()).await;
    // 50 records of 1 000 identical bytes: 50 000 bytes uncompressed, a few hundred compressed.
    let records: Vec<_> = (0..50)
        .map(|i| record(i, -1, -1, -1, 1_000 + i, None, Some("a".repeat(1_000))))
        .collect();
    for compression in [Compression::None, Compression::Gzip] {
        let mut batch = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut batch,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        let frame = produce_frame(batch.freeze());
        assert_eq!(
            produce_error(exchange(&mut socket, &frame).await.unwrap()),
            0
        );
    }
    let stream_id = s
        .node
        .view()
        .state
        .buckets
        .values()
        .map(|b| b.stream_id)
        .next()
        .unwrap();
    let stored = s.node.streams().fetch(stream_id, 0, 1 << 24).await.unwrap();
    let sizes: Vec<usize> = stored.iter().map(|b| b.payload.len()).collect();
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert!(sizes[0] > 50_000, "stored uncompressed: {sizes:?}");
    assert!(sizes[1] < 5_000, "stored compressed: {sizes:?}");
    let rows = s.rows("kafka", "t", 0).await;
    let values: Vec<usize> = rows
        .iter()
        .flat_map(|b| {
            let v = b.column_by_name("value").unwrap().as_binary::<i32>();
            (0..arrow::array::Array::len(v))
                .map(|i| v.value(i).len())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(values, vec![1_000; 100]);
    s.stop().await;
}

/// Stored raw rows fetched as one record batch (not one per record, as kafka-protocol's encoder
/// splits records without a producer): every record's offset, time, key, value and headers,
/// null keys, values and header values included, decoded by kafka-protocol's decoder; two
/// batches back to back decode one after the other.
/// A typed table's rows fetch as JSON objects as `mink scan -f json` writes them: a duration
/// as its count (it was "PT1.5S", which a produce refuses), a NaN as "NaN" (it was null),
/// nulls left out.
#[test]
fn typed_rows_fetch_durations_as_counts() {
    use kafka_protocol::records::RecordBatchDecoder;
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "dur",
            DataType::Duration(arrow::datatypes::TimeUnit::Millisecond),
            true,
        ),
        Field::new("f", DataType::Float64, true),
    ]));
    let rows = arrow::array::RecordBatch::try_new(
        schema,
        vec![
            std::sync::Arc::new(arrow::array::Int64Array::from(vec![1, 2])),
            std::sync::Arc::new(arrow::array::DurationMillisecondArray::from(vec![
                Some(1500),
                None,
            ])),
            std::sync::Arc::new(arrow::array::Float64Array::from(vec![None, Some(f64::NAN)])),
        ],
    )
    .unwrap();
    let mut out = BytesMut::new();
    mink_kafka::records::encode_json(&rows, 0, 1_000, &mut out).unwrap();
    let mut buf = out.freeze();
    let values: Vec<String> = RecordBatchDecoder::decode(&mut buf)
        .unwrap()
        .records
        .iter()
        .map(|r| String::from_utf8(r.value.as_deref().unwrap().to_vec()).unwrap())
        .collect();
    assert_eq!(values, [r#"{"id":1,"dur":1500}"#, r#"{"id":2,"f":"NaN"}"#]);
}

#[test]
fn raw_rows_encode_as_one_record_batch() {
    use kafka_protocol::records::RecordBatchDecoder;
    use mink_log::raw;
    let header_sets: Vec<Vec<raw::Header<'_>>> = vec![
        vec![],
        vec![("h", Some(b"v".as_slice())), ("n", None)],
        vec![("only", Some(b"".as_slice()))],
    ];
    let written: Vec<raw::Record<'_>> = (0..3)
        .map(|i| raw::Record {
            key: (i != 1).then_some(b"key".as_slice()),
            value: (i != 2).then_some(b"value".as_slice()),
            headers: &header_sets[i],
            // Not in order: the batch's base time is the least.
            timestamp_ms: [5_000, 1_000, 300_000_000][i],
        })
        .collect();
    let rows = raw::rows(written.iter().copied()).unwrap();
    let mut out = BytesMut::new();
    mink_kafka::records::encode_raw(&rows, 100, &mut out);
    mink_kafka::records::encode_raw(&rows.slice(2, 1), 103, &mut out);
    let mut buf = out.freeze();
    assert_eq!(mink_kafka::records::check_batches(&buf).unwrap().len(), 2);
    let first = RecordBatchDecoder::decode(&mut buf).unwrap().records;
    let second = RecordBatchDecoder::decode(&mut buf).unwrap().records;
    assert!(buf.is_empty());
    let read: Vec<_> = first.iter().chain(&second).collect();
    assert_eq!(read.len(), 4);
    for (r, (offset, w)) in read
        .iter()
        .zip([(100, 0), (101, 1), (102, 2), (103, 2)].map(|(o, i)| (o, &written[i])))
    {
        assert_eq!(r.offset, offset);
        assert_eq!(r.timestamp, w.timestamp_ms);
        assert_eq!(r.key.as_deref(), w.key);
        assert_eq!(r.value.as_deref(), w.value);
        let headers: Vec<(&str, Option<&[u8]>)> = r
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        assert_eq!(headers, w.headers);
        assert_eq!(r.producer_id, -1);
    }
}

fn encode_one() -> Bytes {
    let r = record(0, -1, -1, -1, 5, Some("k".to_string()), None);
    mink_kafka::records::encode_records(&[r]).unwrap()
}

/// A record as a producer sends it (`producer` -1: no idempotent producer).
fn record(
    offset: i64,
    producer: i64,
    epoch: i16,
    sequence: i32,
    timestamp: i64,
    key: Option<String>,
    value: Option<String>,
) -> kafka_protocol::records::Record {
    kafka_protocol::records::Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: producer,
        producer_epoch: epoch,
        timestamp_type: kafka_protocol::records::TimestampType::Creation,
        offset,
        sequence,
        timestamp,
        key: key.map(Bytes::from),
        value: value.map(Bytes::from),
        headers: Default::default(),
    }
}

/// A node serving Kafka from `dir` with topic `t` (raw, one partition), and a connection to it.
async fn serve_topic(dir: &std::path::Path) -> (Served, tokio::net::TcpStream) {
    let s = serve(dir).await;
    raw_topic(&s.node, "t", 1).await;
    let socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    (s, socket)
}

/// Creates topic `name` (a raw log table of database `kafka`) with `partitions` buckets.
async fn raw_topic(node: &Node, name: &str, partitions: u32) {
    raw_table(node, "kafka", name, partitions).await;
}

/// Creates `database` if need be, and in it a raw log table `name` of `partitions` buckets.
async fn raw_table(node: &Node, database: &str, name: &str, partitions: u32) {
    node.create_database(database, true).await.unwrap();
    node.create_table(TableSpec {
        database: database.into(),
        name: name.into(),
        schema: mink_kafka::records::raw_schema(),
        primary_key: vec![],
        options: [("bucket.num".to_string(), partitions.to_string())].into(),
        partition_keys: vec![],
        comment: String::new(),
        if_not_exists: false,
    })
    .await
    .unwrap();
}

/// Writes a request at a version.
type Encode = Box<dyn Fn(&mut BytesMut, i16)>;

/// A request of some API, and how to decode its answer.
struct Exchange {
    encode: Encode,
    decode: fn(&mut Bytes, i16) -> anyhow::Result<()>,
}

impl Exchange {
    fn of<R: Encodable + 'static, A: Decodable>(request: R) -> Exchange {
        Exchange {
            encode: Box::new(move |body, version| request.encode(body, version).unwrap()),
            decode: |response, version| A::decode(response, version).map(|_| ()),
        }
    }
}

/// Every version of every API the listener advertises is answered with a response that decodes
/// at that version (a field a version lacks, set in an answer, fails its encoding: LeaveGroup
/// v0-2 once went unanswered, and every consumer's close waited out its timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_advertised_version_of_every_api_is_answered() {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::messages::*;
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    raw_topic(&s.node, "t", 1).await;
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let versions: ApiVersionsResponse = ask(
        &mut socket,
        ApiKey::ApiVersions,
        3,
        &ApiVersionsRequest::default(),
    )
    .await;
    let group = || GroupId(StrBytes::from_static_str("nobody"));
    let member = || StrBytes::from_static_str("m");
    let mut answered = 0;
    for api in &versions.api_keys {
        let key = ApiKey::try_from(api.api_key).unwrap();
        for version in api.min_version..=api.max_version {
            let request = match key {
                ApiKey::Produce => Exchange::of::<_, ProduceResponse>(
                    ProduceRequest::default()
                        .with_acks(-1)
                        .with_timeout_ms(1000),
                ),
                ApiKey::Fetch => {
                    Exchange::of::<_, FetchResponse>(FetchRequest::default().with_max_wait_ms(0))
                }
                ApiKey::ListOffsets => {
                    Exchange::of::<_, ListOffsetsResponse>(ListOffsetsRequest::default())
                }
                ApiKey::Metadata => Exchange::of::<_, MetadataResponse>(MetadataRequest::default()),
                ApiKey::ApiVersions => {
                    Exchange::of::<_, ApiVersionsResponse>(ApiVersionsRequest::default())
                }
                ApiKey::CreateTopics => Exchange::of::<_, CreateTopicsResponse>(
                    CreateTopicsRequest::default().with_topics(vec![
                        CreatableTopic::default()
                            .with_name(TopicName(StrBytes::from_static_str("t")))
                            .with_num_partitions(1)
                            .with_replication_factor(1),
                    ]),
                ),
                ApiKey::InitProducerId => {
                    Exchange::of::<_, InitProducerIdResponse>(InitProducerIdRequest::default())
                }
                ApiKey::FindCoordinator => Exchange::of::<_, FindCoordinatorResponse>(
                    FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("g")),
                ),
                // An unknown member of a group with none: refused at once, in every version.
                ApiKey::JoinGroup => Exchange::of::<_, JoinGroupResponse>(
                    JoinGroupRequest::default()
                        .with_group_id(group())
                        .with_member_id(member())
                        .with_session_timeout_ms(10_000)
                        .with_rebalance_timeout_ms(10_000)
                        .with_protocol_type(StrBytes::from_static_str("consumer"))
                        .with_protocols(vec![
                            JoinGroupRequestProtocol::default()
                                .with_name(StrBytes::from_static_str("range")),
                        ]),
                ),
                ApiKey::SyncGroup => Exchange::of::<_, SyncGroupResponse>(
                    SyncGroupRequest::default()
                        .with_group_id(group())
                        .with_member_id(member()),
                ),
                ApiKey::Heartbeat => Exchange::of::<_, HeartbeatResponse>(
                    HeartbeatRequest::default()
                        .with_group_id(group())
                        .with_member_id(member()),
                ),
                ApiKey::LeaveGroup => Exchange::of::<_, LeaveGroupResponse>(if version < 3 {
                    LeaveGroupRequest::default()
                        .with_group_id(group())
                        .with_member_id(member())
                } else {
                    LeaveGroupRequest::default()
                        .with_group_id(group())
                        .with_members(vec![MemberIdentity::default().with_member_id(member())])
                }),
                ApiKey::OffsetCommit => Exchange::of::<_, OffsetCommitResponse>(
                    OffsetCommitRequest::default()
                        .with_group_id(group())
                        .with_member_id(member()),
                ),
                ApiKey::OffsetFetch => Exchange::of::<_, OffsetFetchResponse>(
                    OffsetFetchRequest::default().with_group_id(group()),
                ),
                ApiKey::ListGroups => {
                    Exchange::of::<_, ListGroupsResponse>(ListGroupsRequest::default())
                }
                ApiKey::DescribeGroups => Exchange::of::<_, DescribeGroupsResponse>(
                    DescribeGroupsRequest::default().with_groups(vec![group()]),
                ),
                ApiKey::DeleteGroups => Exchange::of::<_, DeleteGroupsResponse>(
                    DeleteGroupsRequest::default().with_groups_names(vec![group()]),
                ),
                ApiKey::DeleteTopics => {
                    Exchange::of::<_, DeleteTopicsResponse>(DeleteTopicsRequest::default())
                }
                ApiKey::CreatePartitions => {
                    Exchange::of::<_, CreatePartitionsResponse>(CreatePartitionsRequest::default())
                }
                ApiKey::DescribeConfigs => {
                    Exchange::of::<_, DescribeConfigsResponse>(DescribeConfigsRequest::default())
                }
                ApiKey::DescribeCluster => {
                    Exchange::of::<_, DescribeClusterResponse>(DescribeClusterRequest::default())
                }
                other => panic!("{other:?} is advertised and has no request in this test"),
            };
            let correlation = i32::from(api.api_key) * 100 + i32::from(version);
            let frame = request_frame_with(key, version, correlation, |body| {
                (request.encode)(body, version);
            });
            let mut response =
                tokio::time::timeout(Duration::from_secs(30), exchange(&mut socket, &frame))
                    .await
                    .unwrap_or_else(|_| panic!("{key:?} v{version} was not answered in 30 s"))
                    .unwrap_or_else(|e| panic!("{key:?} v{version} closed the connection: {e}"));
            let header =
                ResponseHeader::decode(&mut response, key.response_header_version(version))
                    .unwrap();
            assert_eq!(header.correlation_id, correlation, "{key:?} v{version}");
            (request.decode)(&mut response, version)
                .unwrap_or_else(|e| panic!("{key:?} v{version}: {e}"));
            assert!(response.is_empty(), "{key:?} v{version}: bytes left over");
            answered += 1;
        }
    }
    assert!(answered > 80, "{answered} versions answered");
    s.stop().await;
}

/// A topic's name maps to one table and back: `com.acme.orders` created over Kafka stays that
/// topic when a database `com` appears later; a table of another database is `db.t`, unless a
/// topic of the same name shadows it; `kafka.t` is no name of topic `t`. Names Kafka refuses
/// are refused. Metadata (version 12) gives each topic an id, and answers a topic asked by id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_names_map_to_tables_one_to_one() {
    use kafka_protocol::ResponseError;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{
        CreateTopicsRequest, CreateTopicsResponse, MetadataRequest, MetadataResponse,
    };
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    s.node.create_database("kafka", true).await.unwrap();
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let create = |names: &[&str]| {
        CreateTopicsRequest::default().with_topics(
            names
                .iter()
                .map(|n| {
                    CreatableTopic::default()
                        .with_name(TopicName(StrBytes::from_string((*n).to_string())))
                        .with_num_partitions(1)
                        .with_replication_factor(1)
                })
                .collect(),
        )
    };
    let created: CreateTopicsResponse = ask(
        &mut socket,
        ApiKey::CreateTopics,
        7,
        &create(&["com.acme.orders", "sp ace", "t"]),
    )
    .await;
    let codes: Vec<i16> = created.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(
        codes,
        [0, ResponseError::InvalidTopicException.code(), 0],
        "{created:?}"
    );
    assert!(s.node.describe_table("kafka", "com.acme.orders").is_ok());
    // More partitions than a table's buckets: INVALID_PARTITIONS (it was INVALID_REQUEST),
    // and a validate-only request checks what a create would (an existing topic, the count).
    let mut too_many = create(&["huge"]);
    too_many.topics[0].num_partitions = 5000;
    let mut validate = create(&["t", "fresh"]);
    validate.validate_only = true;
    validate.topics[1].num_partitions = 5000;
    for (request, expected) in [
        (too_many, vec![ResponseError::InvalidPartitions.code()]),
        (
            validate,
            vec![
                ResponseError::TopicAlreadyExists.code(),
                ResponseError::InvalidPartitions.code(),
            ],
        ),
    ] {
        let answered: CreateTopicsResponse =
            ask(&mut socket, ApiKey::CreateTopics, 7, &request).await;
        let codes: Vec<i16> = answered.topics.iter().map(|t| t.error_code).collect();
        assert_eq!(codes, expected, "{answered:?}");
    }
    assert!(s.node.describe_table("kafka", "huge").is_err());
    raw_table(&s.node, "com", "acme.orders", 1).await;
    raw_table(&s.node, "db", "x", 1).await;
    let every: MetadataResponse = ask(
        &mut socket,
        ApiKey::Metadata,
        12,
        &MetadataRequest::default().with_topics(None),
    )
    .await;
    let mut listed: Vec<(String, uuid::Uuid)> = every
        .topics
        .iter()
        .map(|t| (t.name.as_ref().unwrap().0.to_string(), t.topic_id))
        .collect();
    listed.sort();
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    // `com.acme.orders` once: the Kafka database's table shadows com's.
    assert_eq!(names, ["com.acme.orders", "db.x", "t"]);
    assert!(listed.iter().all(|(_, id)| !id.is_nil()), "{listed:?}");
    let named = |names: &[&str]| {
        MetadataRequest::default().with_topics(Some(
            names
                .iter()
                .map(|n| {
                    MetadataRequestTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string((*n).to_string()))))
                })
                .collect(),
        ))
    };
    let asked: MetadataResponse = ask(
        &mut socket,
        ApiKey::Metadata,
        12,
        &named(&["com.acme.orders", "kafka.t", "db.x"]),
    )
    .await;
    let codes: Vec<i16> = asked.topics.iter().map(|t| t.error_code).collect();
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    assert_eq!(codes, [0, unknown, 0], "{asked:?}");
    assert_eq!(asked.topics[0].topic_id, listed[0].1);
    // By id: the name comes back; an id of no topic is UNKNOWN_TOPIC_ID.
    let by_id = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default()
            .with_name(None)
            .with_topic_id(listed[1].1),
        MetadataRequestTopic::default()
            .with_name(None)
            .with_topic_id(uuid::Uuid::from_u128(7)),
    ]));
    let found: MetadataResponse = ask(&mut socket, ApiKey::Metadata, 12, &by_id).await;
    assert_eq!(found.topics[0].name.as_ref().unwrap().0.as_str(), "db.x");
    assert_eq!(found.topics[0].partitions.len(), 1);
    assert_eq!(
        found.topics[1].error_code,
        ResponseError::UnknownTopicId.code()
    );
    s.stop().await;
}

/// A typed table with a bucket key routes rows by Mink's hash, which a Kafka partitioner does
/// not compute: a record produced to a partition its key does not route to fails its batch with
/// INVALID_RECORD naming the partition it belongs to, and nothing of the batch is stored; a
/// batch of rows of the partition is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_keyed_topic_takes_only_the_rows_of_the_partition() {
    use kafka_protocol::messages::ProduceResponse;
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path()).await;
    s.node.create_database("kafka", true).await.unwrap();
    let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
    s.node
        .create_table(TableSpec {
            database: "kafka".into(),
            name: "t".into(),
            schema: schema.clone(),
            primary_key: vec![],
            options: [
                ("bucket.num".to_string(), "4".to_string()),
                ("bucket.key".to_string(), "id".to_string()),
            ]
            .into(),
            partition_keys: vec![],
            comment: String::new(),
            if_not_exists: false,
        })
        .await
        .unwrap();
    let ids: Vec<i64> = (0..16).collect();
    let batch = arrow::array::RecordBatch::try_new(
        std::sync::Arc::new(schema),
        vec![std::sync::Arc::new(arrow::array::Int64Array::from(
            ids.clone(),
        ))],
    )
    .unwrap();
    let buckets = mink_log::routing::buckets_of(&batch, &[0], 4).unwrap();
    let of = |b: u32| -> Vec<i64> {
        ids.iter()
            .zip(&buckets)
            .filter(|(_, x)| **x == b)
            .map(|(id, _)| *id)
            .collect()
    };
    let (home, away) = (
        of(0),
        ids.iter().find(|id| !of(0).contains(id)).copied().unwrap(),
    );
    let away_bucket = buckets[usize::try_from(away).unwrap()];
    let records = |values: &[i64]| {
        let records: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, id)| {
                record(
                    i64::try_from(i).unwrap(),
                    -1,
                    -1,
                    -1,
                    5,
                    None,
                    Some(format!("{{\"id\": {id}}}")),
                )
            })
            .collect();
        mink_kafka::records::encode_records(&records).unwrap()
    };
    let mut socket = tokio::net::TcpStream::connect(&s.kafka).await.unwrap();
    let mut mixed = home.clone();
    mixed.insert(1, away);
    // Version 8 on, an answer names the records that failed.
    let request = produce_request(0, records(&mixed));
    let answer: ProduceResponse = ask(&mut socket, ApiKey::Produce, 8, &request).await;
    let p = &answer.responses[0].partition_responses[0];
    assert_eq!(
        p.error_code,
        kafka_protocol::ResponseError::InvalidRecord.code()
    );
    assert_eq!(p.record_errors.len(), 1, "{p:?}");
    assert_eq!(p.record_errors[0].batch_index, 1);
    let message = p.record_errors[0]
        .batch_index_error_message
        .as_ref()
        .unwrap()
        .to_string();
    assert!(
        message.contains(&format!("belongs to partition {away_bucket}")) && message.contains("id"),
        "{message}"
    );
    assert!(
        s.rows("kafka", "t", 0).await.is_empty(),
        "a refused batch was stored"
    );
    assert_eq!(
        produced(&mut socket, &produce_frame_to(0, records(&home))).await,
        0
    );
    let stored: usize = s
        .rows("kafka", "t", 0)
        .await
        .iter()
        .map(arrow::array::RecordBatch::num_rows)
        .sum();
    assert_eq!(stored, home.len());
    s.stop().await;
}
