//! Tiering driven by queries: a lake table under a steady write load, queried in a loop by
//! `mink-query`'s engine, once with the engine reporting the log tail its scans read (the
//! feedback that tiers a queried table sooner) and once without, each on a fresh node. Per
//! query: the log tail it had to read (rows past the lake snapshot) and its time. The ratio
//! is with over without (lower is better: the feedback keeps the tail short).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// How long each run writes and queries, in seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// The table's `table.datalake.freshness`, in seconds (a round every half of it without
    /// queries).
    #[arg(long, default_value_t = 60)]
    freshness: u64,
    /// Rows per second written.
    #[arg(long, default_value_t = 20_000)]
    rows_per_s: u64,
    /// Milliseconds between queries.
    #[arg(long, default_value_t = 200)]
    query_every_ms: u64,
    /// Tail rows that bring a round forward (the node's `tail_rows_for_a_round`).
    #[arg(long, default_value_t = 100_000)]
    tail_rows_for_a_round: u64,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Run {
    feedback: bool,
    queries: usize,
    tail_rows_mean: f64,
    tail_rows_p99: u64,
    query_ms_mean: f64,
    query_ms_p99: f64,
    rounds: u64,
}

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
    ])
}

async fn run_one(args: &Args, feedback: bool) -> anyhow::Result<Run> {
    use mink_node::{Node, NodeConfig, TableSpec};
    let dir = tempfile::tempdir()?;
    let objects = dir.path().join("objects");
    let objects = objects.to_str().context("utf-8 temp dir")?.to_string();
    let metadata = format!("sqlite://{}", dir.path().join("meta.db").display());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?.to_string();
    let mut c = NodeConfig::new(1, &metadata, &objects);
    c.advertised_address = address.clone();
    c.kv_dir = dir.path().join("kv");
    c.engine.flush_delay = Duration::from_millis(5);
    c.tail_rows_for_a_round = args.tail_rows_for_a_round;
    let node = Node::start(c).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(mink_flight::serve(
        node.clone(),
        mink_flight::ServerConfig::default(),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    node.create_database("bench", false).await?;
    let schema: SchemaRef = Arc::new(schema());
    node.create_table(TableSpec {
        database: "bench".into(),
        name: "t".into(),
        schema: schema.as_ref().clone(),
        primary_key: vec![],
        options: crate::options(&[
            ("bucket.num", "4".to_string()),
            ("bucket.key", "id".to_string()),
            ("table.datalake.enabled", "true".to_string()),
            ("table.datalake.freshness", format!("{}s", args.freshness)),
        ]),
        partition_keys: vec![],
        comment: String::new(),
        if_not_exists: false,
    })
    .await?;
    let client = mink_client::Client::connect(&address).await?;
    let lake = mink_query::open_lake(&metadata, &objects).await?;
    let engine = mink_query::QueryEngine::with_lake(client.clone(), Some(Arc::new(lake)));
    engine.report_tail_scans(feedback);
    // Writes every 100 ms, a tenth of the rate each time.
    let writer = {
        let client = client.clone();
        let schema = Arc::clone(&schema);
        let per_tick = i64::try_from((args.rows_per_s / 10).max(1))?;
        tokio::spawn(async move {
            let mut w = client.writer("bench", "t");
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut next = 0i64;
            loop {
                tick.tick().await;
                let ids = next..next + per_tick;
                let batch = RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(Int64Array::from_iter_values(ids.clone())),
                        Arc::new(StringArray::from_iter_values(
                            ids.map(|i| format!("e{}", i % 7)),
                        )),
                    ],
                )?;
                w.write(&batch).await?;
                next += per_tick;
            }
            #[allow(unreachable_code)]
            Ok::<(), anyhow::Error>(())
        })
    };
    let rounds_before = node.lake_rounds();
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let mut tails = Vec::new();
    let mut times = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(args.query_every_ms));
    while Instant::now() < until {
        tick.tick().await;
        anyhow::ensure!(!writer.is_finished(), "the writer stopped: {:?}", writer);
        // The tail this query reads: rows past the lake snapshot at its cut.
        let info = client.describe_table("bench", "t").await?;
        if info.lake.as_ref().and_then(|l| l.snapshot_id).is_none() {
            continue; // no lake yet: every row is tail either way
        }
        let tail: u64 = info
            .buckets
            .iter()
            .map(|b| b.end_offset - b.tiered_offset.unwrap_or(0))
            .sum();
        let started = Instant::now();
        let rows = engine
            .sql("SELECT count(*), max(id) FROM bench.t WHERE event <> 'e3'")
            .await?
            .collect()
            .await?;
        anyhow::ensure!(rows.iter().map(RecordBatch::num_rows).sum::<usize>() == 1);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        tails.push(tail);
    }
    let rounds = node.lake_rounds() - rounds_before;
    writer.abort();
    let _ = stop.send(());
    let _ = server.await;
    node.shutdown().await;
    anyhow::ensure!(!tails.is_empty(), "no query ran after the first round");
    tails.sort_unstable();
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = |n: usize| (n - 1) * 99 / 100;
    Ok(Run {
        feedback,
        queries: tails.len(),
        tail_rows_mean: tails.iter().sum::<u64>() as f64 / tails.len() as f64,
        tail_rows_p99: tails[p99(tails.len())],
        query_ms_mean: times.iter().sum::<f64>() / times.len() as f64,
        query_ms_p99: sorted[p99(sorted.len())],
        rounds,
    })
}

#[allow(clippy::print_stdout)]
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let without = run_one(&args, false).await?;
    let with = run_one(&args, true).await?;
    if args.json {
        println!("{}", serde_json::to_string(&[&without, &with])?);
        return Ok(());
    }
    println!(
        "Queries every {} ms on a lake table written at {} rows/s, freshness {} s, {} s each:",
        args.query_every_ms, args.rows_per_s, args.freshness, args.seconds
    );
    println!(
        "| feedback | queries | tiering rounds | tail rows mean | tail rows p99 | query ms mean | query ms p99 |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in [&without, &with] {
        println!(
            "| {} | {} | {} | {:.0} | {} | {:.1} | {:.1} |",
            if r.feedback { "on" } else { "off" },
            r.queries,
            r.rounds,
            r.tail_rows_mean,
            r.tail_rows_p99,
            r.query_ms_mean,
            r.query_ms_p99
        );
    }
    println!(
        "with/without: tail rows mean {:.2}, query time mean {:.2}",
        with.tail_rows_mean / without.tail_rows_mean.max(1.0),
        with.query_ms_mean / without.query_ms_mean.max(f64::MIN_POSITIVE)
    );
    Ok(())
}
