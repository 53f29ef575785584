//! The cluster: failover time and node start time.
//!
//! - **Failover**: three nodes (in one process, sharing one metadata database and object
//!   store), a table whose buckets spread over them; one node that is not the lease holder is
//!   killed as a crash would (no lease release, no heartbeat expiry). Measured: from the kill
//!   to the first acknowledged write to a bucket it led, as a ratio of the lease TTL (the
//!   failure detector's limit: a node is dead once its heartbeat is a TTL old), per TTL.
//! - **Start**: the metadata grows to 1 000 and 10 000 streams (tables of 100 buckets); a new
//!   node starts against it. Measured: from start to serving (its view loaded, registered,
//!   able to answer), beside the size of the metadata snapshot it loads and the log rows after
//!   it.
//!
//! Metadata is on PostgreSQL when `MINK_BENCH_POSTGRES_URL` is set (`scripts/bench.sh` starts
//! one), else a SQLite file.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use mink_node::{Node, NodeConfig, NodeError, TableSpec, WriteTarget};
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Lease TTLs to measure failover at, in milliseconds.
    #[arg(long, value_delimiter = ',', default_values_t = [2000, 5000])]
    ttl_ms: Vec<u64>,
    /// Stream counts to measure node start at.
    #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000])]
    streams: Vec<u32>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Failover {
    ttl_ms: u64,
    kill_to_write_ms: f64,
    ratio_to_ttl: f64,
}

#[derive(Debug, Serialize)]
struct Start {
    streams: u32,
    start_to_serving_ms: f64,
    snapshot_bytes: usize,
    log_rows_after_snapshot: u64,
}

/// A fresh metadata database: a PostgreSQL schema, or a SQLite file in `dir`.
async fn metadata_url(dir: &std::path::Path, name: &str) -> anyhow::Result<String> {
    let Ok(pg) = std::env::var("MINK_BENCH_POSTGRES_URL") else {
        return Ok(format!(
            "sqlite://{}",
            dir.join(format!("{name}.db")).display()
        ));
    };
    let database = format!("bench_{name}_{}", std::process::id());
    let admin = sqlx::PgPool::connect(&pg).await?;
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&admin)
        .await?;
    let (base, _) = pg
        .rsplit_once('/')
        .context("a postgres URL with a database")?;
    Ok(format!("{base}/{database}"))
}

fn config(url: &str, dir: &std::path::Path, id: u64, ttl: Duration) -> NodeConfig {
    let mut c = NodeConfig::new(id, url, dir.join("objects").to_str().unwrap_or("objects"));
    c.advertised_address = format!("127.0.0.1:{}", 7000 + id);
    c.kv_dir = dir.join(format!("kv-{id}"));
    c.lease_ttl = ttl;
    c.leadership_interval = Duration::from_millis(50);
    c.engine.flush_delay = Duration::from_millis(5);
    c
}

fn schema() -> Schema {
    Schema::new(vec![Field::new("id", DataType::Int64, false)])
}

fn spec(name: &str, buckets: u32) -> TableSpec {
    TableSpec {
        database: "bench".into(),
        name: name.into(),
        schema: schema(),
        primary_key: vec![],
        options: BTreeMap::from([
            ("bucket.num".to_string(), buckets.to_string()),
            ("bucket.key".to_string(), "id".to_string()),
        ]),
        partition_keys: vec![],
        comment: String::new(),
        if_not_exists: false,
    }
}

/// Waits until `node` sees `n` live nodes.
async fn until_live(node: &Node, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while node.live_nodes().await?.len() < n {
        anyhow::ensure!(Instant::now() < deadline, "{n} live nodes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

async fn failover(ttl: Duration) -> anyhow::Result<Failover> {
    let dir = tempfile::tempdir()?;
    let url = metadata_url(dir.path(), &format!("failover{}", ttl.as_millis())).await?;
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(Node::start(config(&url, dir.path(), id, ttl)).await?);
    }
    until_live(&nodes[0], 3).await?;
    nodes[0].create_database("bench", false).await?;
    nodes[0].create_table(spec("events", 6)).await?;
    // Every bucket led, spread over the three.
    let deadline = Instant::now() + Duration::from_secs(60);
    let info = loop {
        let info = nodes[0].describe_table("bench", "events")?;
        if info.buckets.iter().all(|b| b.leader_node_id != 0) {
            break info;
        }
        anyhow::ensure!(Instant::now() < deadline, "buckets led");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let holder = nodes[0]
        .view()
        .state
        .coordinator
        .as_ref()
        .map_or(1, |c| c.node_id);
    let victim = info
        .buckets
        .iter()
        .map(|b| b.leader_node_id)
        .find(|n| *n != holder)
        .context("a bucket led by a node that is not the lease holder")?;
    let bucket = info
        .buckets
        .iter()
        .find(|b| b.leader_node_id == victim)
        .context("the victim's bucket")?
        .bucket;
    // A row of that bucket.
    let row = (0..100_000i64)
        .map(|i| {
            RecordBatch::try_from_iter(vec![(
                "id",
                Arc::new(Int64Array::from(vec![i])) as ArrayRef,
            )])
        })
        .find(|b| {
            b.as_ref().is_ok_and(|b| {
                mink_log::routing::buckets_of(b, &[0], 6).is_ok_and(|x| x[0] == bucket)
            })
        })
        .context("a row of the bucket")??;
    let survivor = nodes
        .iter()
        .find(|n| n.node_id() != victim)
        .context("a survivor")?
        .clone();
    let killed = Instant::now();
    nodes[usize::try_from(victim)? - 1].abort().await;
    loop {
        // Write through a survivor, and at the leader it names once the bucket has moved.
        let at_survivor = survivor
            .write("bench", "events", &row, &WriteTarget::default())
            .await;
        let done = match at_survivor.as_ref().map(|w| &w[0].result) {
            Ok(Ok(_)) => true,
            Ok(Err(NodeError::NotLeader { leader, .. })) if *leader != victim => {
                match nodes.iter().find(|n| n.node_id() == *leader) {
                    Some(n) => n
                        .write("bench", "events", &row, &WriteTarget::default())
                        .await
                        .is_ok_and(|w| w.iter().all(|b| b.result.is_ok())),
                    None => false,
                }
            }
            _ => false,
        };
        if done {
            break;
        }
        anyhow::ensure!(killed.elapsed() < ttl * 10, "no failover within 10 TTLs");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = killed.elapsed();
    for n in nodes.iter().filter(|n| n.node_id() != victim) {
        n.shutdown().await;
    }
    Ok(Failover {
        ttl_ms: u64::try_from(ttl.as_millis())?,
        kill_to_write_ms: took.as_secs_f64() * 1000.0,
        ratio_to_ttl: took.as_secs_f64() / ttl.as_secs_f64(),
    })
}

async fn start(streams: u32) -> anyhow::Result<Start> {
    let dir = tempfile::tempdir()?;
    let url = metadata_url(dir.path(), &format!("start{streams}")).await?;
    let ttl = Duration::from_secs(5);
    let first = Node::start(config(&url, dir.path(), 1, ttl)).await?;
    first.create_database("bench", false).await?;
    for t in 0..streams.div_ceil(100) {
        first
            .create_table(spec(&format!("t{t}"), 100.min(streams - t * 100)))
            .await?;
    }
    // Let the lease holder snapshot what it has (every 1024 rows).
    let store = mink_sql::connect(&url).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let snapshot = loop {
        if let Some(s) = store.load_snapshot().await?
            && s.applied_index + 1024 > first.view().applied_index
        {
            break s;
        }
        anyhow::ensure!(Instant::now() < deadline, "a metadata snapshot");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = first.view().applied_index - snapshot.applied_index;
    // A second node starts: it loads the snapshot, replays the rest, registers, serves.
    let started = Instant::now();
    let second = Node::start(config(&url, dir.path(), 2, ttl)).await?;
    second
        .wait_applied(first.view().applied_index, Duration::from_secs(60))
        .await?;
    second.describe_table("bench", "t0")?;
    let took = started.elapsed();
    second.shutdown().await;
    first.shutdown().await;
    Ok(Start {
        streams,
        start_to_serving_ms: took.as_secs_f64() * 1000.0,
        snapshot_bytes: snapshot.payload.len(),
        log_rows_after_snapshot: after,
    })
}

#[allow(clippy::print_stdout)]
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let mut failovers = Vec::new();
    for &ms in &args.ttl_ms {
        failovers.push(failover(Duration::from_millis(ms)).await?);
    }
    let mut starts = Vec::new();
    for &n in &args.streams {
        starts.push(start(n).await?);
    }
    if args.json {
        for f in &failovers {
            println!("{}", serde_json::to_string(f)?);
        }
        for s in &starts {
            println!("{}", serde_json::to_string(s)?);
        }
        return Ok(());
    }
    let backend = if std::env::var("MINK_BENCH_POSTGRES_URL").is_ok() {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    println!(
        "Failover: three nodes ({backend} metadata, local objects); a node that is not the lease holder crashes; from the kill to the first acknowledged write to one of its buckets"
    );
    println!("{:>8} {:>16} {:>10}", "TTL ms", "kill->write ms", "/ TTL");
    for f in &failovers {
        println!(
            "{:>8} {:>16.0} {:>10.2}",
            f.ttl_ms, f.kill_to_write_ms, f.ratio_to_ttl
        );
    }
    println!("\nNode start as the metadata grows ({backend}): from start to serving");
    println!(
        "{:>8} {:>14} {:>16} {:>12}",
        "streams", "start ms", "snapshot bytes", "log rows"
    );
    for s in &starts {
        println!(
            "{:>8} {:>14.0} {:>16} {:>12}",
            s.streams, s.start_to_serving_ms, s.snapshot_bytes, s.log_rows_after_snapshot
        );
    }
    Ok(())
}
