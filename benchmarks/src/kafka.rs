//! The Kafka frontend beside Arrow Flight on the same node, same bytes, same run: 1 KiB
//! records over 16 partitions, acks=all, produced by librdkafka (rdkafka) and by `mink-client`
//! writers for `--seconds`; then the Kafka path's topic (the same bytes both ways), after a
//! restart of the node for each path (cold caches, reads from object storage, no compaction
//! meanwhile), consumed from its start by librdkafka and by per-bucket DoGets. Each
//! Kafka figure is given as a ratio to Flight's (goal ≥ 0.8); the acknowledgement p99 beside
//! the 250 ms limit. On the durable local store, and on moto when an S3 endpoint is given.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use mink_node::NodeConfig;
use serde::Serialize;

use crate::load::{self, Figures, Mode};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Seconds each path produces.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 16)]
    partitions: u32,
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Concurrent producers per path.
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Concurrent consumers per path.
    #[arg(long, default_value_t = 4)]
    consumers: usize,
    /// Bytes each producer has in flight, MiB (a comma-separated sweep, in this order): a
    /// Kafka producer's unacknowledged records, a Flight writer's one write. The main table's
    /// produce figures are the last point's; the sweep finds where the node saturates.
    #[arg(long, value_delimiter = ',', default_values_t = [2, 4, 6, 8])]
    in_flight_mib: Vec<usize>,
    /// Also on an S3-compatible store (moto).
    #[arg(long, env = "MINK_BENCH_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    #[arg(long, env = "MINK_BENCH_S3_BUCKET", default_value = "mink-test")]
    s3_bucket: String,
    /// The node's `flush_bytes`, MiB (an object is PUT once this much is buffered): smaller
    /// objects put more PUTs in flight at once, for lower acknowledgement latency at more PUTs.
    #[arg(long, default_value_t = 8)]
    flush_mib: usize,
    /// The node's `flush_delay`, ms (an object is PUT at the latest this long after its first
    /// append): shorter puts more, smaller objects in flight, for lower latency at more PUTs.
    #[arg(long, default_value_t = 50)]
    flush_delay_ms: u64,
    /// The node's compaction pace, MiB/s of object GETs and PUTs together (0: unpaced).
    #[arg(long, default_value_t = 64)]
    compaction_mib_per_sec: u64,
    #[arg(long)]
    json: bool,
}

/// One path's produce at one in-flight bound.
#[derive(Debug, Serialize)]
struct ProducePoint {
    store: String,
    path: &'static str,
    in_flight_mib: usize,
    produce: Figures,
}

#[derive(Debug, Serialize)]
struct Row {
    store: String,
    path: &'static str,
    produce: Figures,
    consume: Figures,
    /// GETs the node made while this path consumed (object indexes and runs of blocks), per
    /// read of the topic.
    consume_gets: u64,
    /// Bytes the node's read-ahead loaded meanwhile, per read.
    read_ahead_bytes: u64,
    /// Whole-object GETs of every object holding the consumed topic, straight from the store,
    /// MB/s over three reads of them: the catch-up baseline.
    raw_mb_per_s: f64,
    /// CPU seconds per GB this path consumed: the benchmark's process (the node and the
    /// consumers) and the store's server.
    cpu_per_gb: Cpu,
    /// The same for the raw GETs, per GB read.
    raw_cpu_per_gb: Cpu,
}

/// A workload over `transport` at `address`, each producer with `in_flight_mib` in flight.
fn workload(
    a: &Args,
    transport: &str,
    address: &str,
    topic: &str,
    in_flight_mib: usize,
) -> load::Args {
    let in_flight_bytes = in_flight_mib << 20;
    load::Args {
        flight: (transport == "flight").then(|| address.to_string()),
        kafka: (transport == "kafka").then(|| address.to_string()),
        topic: topic.to_string(),
        database: "bench".into(),
        partitions: Some(a.partitions),
        record_size: a.record_size,
        producers: a.producers,
        consumers: a.consumers,
        // Flight writers are sequential (one write in flight each).
        batch_records: (in_flight_bytes / a.record_size).max(1),
        in_flight_bytes: (transport == "kafka").then_some(in_flight_bytes),
        rate: 0,
        duration: a.seconds,
        max_records: None,
        acks: "all".into(),
        kafka_config: Vec::new(),
        report: None,
        json: false,
    }
}

fn node_config(a: &Args, dir: &std::path::Path, store: &str) -> NodeConfig {
    let mut c = NodeConfig::new(
        1,
        &format!("sqlite://{}", dir.join("metadata.db").display()),
        store,
    );
    c.engine.flush_bytes = a.flush_mib << 20;
    c.engine.flush_delay = Duration::from_millis(a.flush_delay_ms);
    c.compaction.max_bytes_per_sec = a.compaction_mib_per_sec << 20;
    // The topics of the bounds before the last are dropped once measured, and their objects
    // deleted soon after: nothing reads them, and the disk holds one bound at a time.
    c.compaction.destroyed_grace = Duration::from_secs(10);
    c
}

/// The node's listener for `path` ("kafka" or "flight").
fn address_of<'a>(served: &'a mink_testkit::Served, path: &str) -> &'a str {
    if path == "kafka" {
        &served.kafka
    } else {
        &served.flight
    }
}

async fn one_store(
    a: &Args,
    store_name: &str,
    store: &str,
) -> anyhow::Result<(Vec<Row>, Vec<ProducePoint>)> {
    let dir = tempfile::tempdir()?;
    let kafka_config = mink_kafka::KafkaConfig::default;
    // Produce on a fresh node, at each in-flight bound in turn, each into topics of its own.
    // The last bound's are consumed: what one bound wrote, as before the sweep (consuming the
    // small bounds' thinner objects too took moto's Flight consume from 220–290 MB/s to
    // 27–45).
    let served = mink_testkit::serve_node(node_config(a, dir.path(), store), kafka_config()).await;
    let last = a
        .in_flight_mib
        .last()
        .copied()
        .context("an in-flight bound")?;
    let mut points = Vec::new();
    let syncs = SyncProbe::start(dir.path());
    // Each produce second's ack p99, and the longest sync of the metadata disk then (ms).
    let mut slow: Vec<(f64, Option<f64>)> = Vec::new();
    for (i, &in_flight_mib) in a.in_flight_mib.iter().enumerate() {
        // Each path twice, Kafka, Flight, Flight, Kafka, into the same topic: a compaction
        // round, or the machine's other load, then falls on both paths alike.
        let mut runs: Vec<(&'static str, load::Measured)> = Vec::new();
        for path in ["kafka", "flight", "flight", "kafka"] {
            let address = address_of(&served, path);
            let topic = if i + 1 == a.in_flight_mib.len() {
                format!("bench-{path}")
            } else {
                format!("bench-{path}-{i}")
            };
            let w = workload(a, path, address, &topic, in_flight_mib);
            let m = load::measure(Mode::Produce, &w)
                .await
                .with_context(|| format!("producing over {path}"))?;
            slow.extend(eprintln_seconds(
                store_name,
                path,
                in_flight_mib,
                &m,
                &syncs,
            ));
            runs.push((path, m));
        }
        for path in ["kafka", "flight"] {
            let mine = runs.iter().filter(|r| r.0 == path).map(|r| &r.1);
            points.push(ProducePoint {
                store: store_name.to_string(),
                path,
                in_flight_mib,
                produce: Figures::over_runs(mine).context("produce figures")?,
            });
        }
        // Only the last bound's topic is read: at the default 10 s a bound writes 20 GB or more
        // on a fast machine, and the sweep's topics together filled this machine's disk.
        if i + 1 < a.in_flight_mib.len() {
            for (database, table) in [
                ("kafka", format!("bench-kafka-{i}")),
                ("bench", format!("bench-flight-{i}")),
            ] {
                served
                    .node
                    .drop_table(database, &table, false)
                    .await
                    .with_context(|| format!("dropping {database}.{table}"))?;
            }
        }
    }
    drop(syncs);
    eprintln_slow_seconds(store_name, &slow);
    eprintln_commits(store_name, &served.node);
    served.stop().await;
    // The same bytes both ways: the Kafka path's topic, read over Kafka and over Flight (it is
    // table `bench-kafka` of the `kafka` database), each from a node restarted for it (cold
    // caches, every byte from object storage) that does not compact while it is read (a round
    // 10 s after a restart fell in the first read and left the second a compacted layout).
    let quiet = || {
        let mut config = node_config(a, dir.path(), store);
        config.compaction.interval = Duration::from_secs(3600);
        config
    };
    // What the writes left in the operating system's page cache written out first: moto keeps
    // objects over 5 MiB in temporary files, and their writeback, due 30 s after the writes,
    // fell in whichever read came first (Flight read first got 302 MB/s, second 560–590).
    let _ = std::process::Command::new("sync").status();
    // Every object holding the topic read whole, straight from the store: the catch-up
    // baseline. Before the reads and after each round of four, as the machine's speed drifts
    // between them (one raw read takes 1-2 s; over a run they ranged 600-1 470 MB/s).
    let (raw_store, raw_objects) = {
        let served = mink_testkit::serve_node(quiet(), kafka_config()).await;
        let store = served.node.streams().object_store();
        let table = served
            .node
            .describe_table(&kafka_config().database, "bench-kafka")
            .context("the consumed topic")?;
        let view = served.node.view();
        let objects: std::collections::BTreeSet<u64> = table
            .buckets
            .iter()
            .flat_map(|b| view.state.stream_ranges(b.stream_id, 0, u64::MAX))
            .map(|r| r.object_id)
            .collect();
        eprintln_layout(&view.state, &objects);
        let prefix = quiet().engine.object_prefix;
        served.stop().await;
        let paths: Vec<_> = objects
            .into_iter()
            .map(|id| s3stream::object_path(&prefix, id))
            .collect();
        (store, paths)
    };
    // The store's server, when its process is known (moto's, from scripts/bench.sh): the CPU
    // it spends is measured beside the benchmark process's.
    let server = std::env::var("MINK_BENCH_MOTO_PID")
        .ok()
        .filter(|_| store_name == "moto");
    let cpu = || Cpu::now(server.as_deref());
    let mut raw_cpu = Vec::new();
    let mut raw_read = async || {
        let before = cpu();
        let started = std::time::Instant::now();
        let rate = crate::s3stream::raw_gets_of(
            &raw_store,
            raw_objects.clone(),
            crate::s3stream::RAW_GETS_IN_FLIGHT,
        )
        .await
        .context("raw GETs of the topic's objects")?;
        raw_cpu.push(cpu().per_gb_since(&before, rate * started.elapsed().as_secs_f64() / 1e3));
        anyhow::Ok(rate)
    };
    let mut raw_rates = vec![raw_read().await?];
    // Each path reads four times, in the order Kafka, Flight, Flight, Kafka twice over, so
    // that neither is favoured by where it comes (one read takes about a second, and this
    // machine drifts by that much); its figures are over all its reads. A read over Flight
    // goes first, unmeasured: the first read in the process grows its heap to the node's
    // caches, and the kernel zeroing those fresh pages was a third of that read's CPU (the
    // first Kafka read ran at 0.7 of the second). A node's process that has served for a
    // while has its heap grown.
    let mut reads: Vec<(&'static str, Figures, u64, u64, Cpu)> = Vec::new();
    let order = ["kafka", "flight", "flight", "kafka"];
    for (i, path) in std::iter::once("flight")
        .chain(order)
        .chain(order)
        .enumerate()
    {
        let served = mink_testkit::serve_node(quiet(), kafka_config()).await;
        let address = address_of(&served, path).to_string();
        let w = load::Args {
            // Everything produced, however long that takes to read.
            duration: 600.0,
            database: kafka_config().database,
            ..workload(a, path, &address, "bench-kafka", last)
        };
        let stats = || {
            let s = served.node.streams().stats();
            (
                s.object_reads.load(Ordering::Relaxed),
                s.read_ahead_bytes.load(Ordering::Relaxed),
            )
        };
        let before = stats();
        let cpu_before = cpu();
        let m = load::measure(Mode::Consume, &w)
            .await
            .with_context(|| format!("consuming over {path}"))?;
        let after = stats();
        let cpu_after = cpu();
        let label = if i == 0 { "flight, warm-up" } else { path };
        eprintln_read(store_name, label, &m);
        crate::s3stream::eprintln_gets(&format!("  {label}"), served.node.streams());
        served.stop().await;
        if i == 0 {
            continue;
        }
        let consume = m.figures.into_iter().next().context("consume figures")?;
        #[allow(clippy::cast_precision_loss)]
        let cpu_per_gb = cpu_after.per_gb_since(&cpu_before, consume.bytes as f64 / 1e9);
        reads.push((
            path,
            consume,
            after.0 - before.0,
            after.1 - before.1,
            cpu_per_gb,
        ));
        if i % order.len() == 0 {
            raw_rates.push(raw_read().await?);
        }
    }
    // The same bytes each time: their total over the total time.
    #[allow(clippy::cast_precision_loss)]
    let raw_mb_per_s = raw_rates.len() as f64 / raw_rates.iter().map(|r| 1.0 / r).sum::<f64>();
    let mut rows = Vec::new();
    for path in ["kafka", "flight"] {
        let mine: Vec<_> = reads.iter().filter(|r| r.0 == path).collect();
        let n = mine.len() as u64;
        let consume = Figures::over(mine.iter().map(|r| &r.1)).context("consume figures")?;
        let produce = points
            .iter()
            .rev()
            .find(|p| p.path == path)
            .context("produce figures")?
            .produce
            .clone();
        rows.push(Row {
            store: store_name.to_string(),
            path,
            produce,
            consume,
            consume_gets: mine.iter().map(|r| r.2).sum::<u64>() / n,
            read_ahead_bytes: mine.iter().map(|r| r.3).sum::<u64>() / n,
            raw_mb_per_s,
            cpu_per_gb: Cpu::mean(mine.iter().map(|r| &r.4)),
            raw_cpu_per_gb: Cpu::mean(raw_cpu.iter()),
        });
    }
    Ok((rows, points))
}

#[allow(clippy::print_stdout)] // the benchmark's output
pub(crate) async fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.in_flight_mib.is_empty() && a.in_flight_mib.iter().all(|m| *m > 0),
        "--in-flight-mib takes one or more positive sizes"
    );
    let (mut rows, mut points) = (Vec::new(), Vec::new());
    let local = tempfile::tempdir()?;
    let (r, p) = one_store(
        &a,
        "local",
        local.path().join("objects").to_str().context("utf-8")?,
    )
    .await?;
    rows.extend(r);
    points.extend(p);
    // The local store's objects go before moto's temporary files come.
    drop(local);
    if let Some(endpoint) = &a.s3_endpoint {
        let prefix = format!("kafka-bench-{}", std::process::id());
        // moto takes any credentials; the environment's win when set.
        let credentials = if std::env::var("AWS_ACCESS_KEY_ID").is_ok() {
            String::new()
        } else {
            "&access_key_id=test&secret_access_key=test".to_string()
        };
        let url = format!(
            "s3://{}/{prefix}?endpoint={endpoint}&region=us-east-1{credentials}",
            a.s3_bucket
        );
        let (r, p) = one_store(&a, "moto", &url).await?;
        rows.extend(r);
        points.extend(p);
    }
    println!(
        "Kafka (librdkafka) beside Arrow Flight (mink-client) on one node: {} B records, {} partitions, {} producers and {} consumers per path, acks=all, objects flushed at {} MiB or {} ms, each in-flight bound ({:?} MiB per producer) produced for {} s twice over each path (Kafka, Flight, Flight, Kafka; the table's produce figures are at {} MiB); the Kafka path's last-bound topic consumed from its start four times over each path (Kafka, Flight, Flight, Kafka, twice, after an unmeasured read), each after a restart (cold caches, no compaction meanwhile); raw GETs: every object holding the consumed topic read whole, 8 at a time, before the reads and after each four (over all three)\n",
        a.record_size,
        a.partitions,
        a.producers,
        a.consumers,
        a.flush_mib,
        a.flush_delay_ms,
        a.in_flight_mib,
        a.seconds,
        a.in_flight_mib.last().copied().unwrap_or_default(),
    );
    println!(
        "| store | path | produce MB/s | / flight | ack p50 ms | ack p99 ms | p99 / 250 ms | consume MB/s | / flight | / raw GETs | consume GETs | read ahead MB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let flight = rows
            .iter()
            .find(|f| f.store == r.store && f.path == "flight")
            .context("a flight row")?;
        println!(
            "| {} | {} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} | {:.2} | {} | {:.0} |",
            r.store,
            r.path,
            r.produce.mb_per_s,
            r.produce.mb_per_s / flight.produce.mb_per_s,
            r.produce.p50_ms,
            r.produce.p99_ms,
            r.produce.p99_ms / 250.0,
            r.consume.mb_per_s,
            r.consume.mb_per_s / flight.consume.mb_per_s,
            r.consume.mb_per_s / r.raw_mb_per_s,
            r.consume_gets,
            r.read_ahead_bytes as f64 / 1e6,
        );
    }
    print_catch_up_costs(&rows);
    print_sweep(&points);
    if a.json {
        println!("{}", serde_json::to_string(&(&rows, &points))?);
    }
    Ok(())
}

/// Where catch-up on moto spends the machine: CPU seconds per GB read, of the benchmark's
/// process (the node and the consumers, or the raw GETs' receiving) and of moto, in the same
/// phase. With every core busy, a read's rate over the raw GETs' is about the inverse ratio of
/// their totals: a higher catch-up ratio needs a consume path that costs less, or more cores.
#[allow(clippy::print_stdout)] // the benchmark's output
fn print_catch_up_costs(rows: &[Row]) {
    let moto: Vec<_> = rows.iter().filter(|r| r.store == "moto").collect();
    let Some(first) = moto.first() else {
        return;
    };
    if !first.raw_cpu_per_gb.server.is_finite() {
        println!(
            "\nCatch-up costs on moto: not measured (moto's process is known only under scripts/bench.sh)"
        );
        return;
    }
    let raw = &first.raw_cpu_per_gb;
    println!(
        "\nCatch-up costs on moto, CPU seconds per GB (the benchmark's process + moto = total): raw GETs {:.2} + {:.2} = {:.2}",
        raw.process,
        raw.server,
        raw.total()
    );
    for r in moto {
        let c = &r.cpu_per_gb;
        println!(
            "- {}: {:.2} + {:.2} = {:.2}, {:.2} of the raw GETs' (catch-up {:.2})",
            r.path,
            c.process,
            c.server,
            c.total(),
            raw.total() / c.total(),
            r.consume.mb_per_s / r.raw_mb_per_s,
        );
    }
}

/// CPU seconds of the benchmark's process and of the store's server (NaN when unknown), or
/// such seconds per GB.
#[derive(Debug, Clone, Serialize)]
struct Cpu {
    process: f64,
    server: f64,
}

impl Cpu {
    fn now(server: Option<&str>) -> Cpu {
        Cpu {
            process: cpu_seconds("self").unwrap_or(f64::NAN),
            server: server.and_then(cpu_seconds).unwrap_or(f64::NAN),
        }
    }

    /// The CPU spent since `before`, per GB of `gb`.
    fn per_gb_since(&self, before: &Cpu, gb: f64) -> Cpu {
        Cpu {
            process: (self.process - before.process) / gb,
            server: (self.server - before.server) / gb,
        }
    }

    fn total(&self) -> f64 {
        self.process + self.server
    }

    fn mean<'a>(all: impl Iterator<Item = &'a Cpu>) -> Cpu {
        let (mut sum, mut n) = (
            Cpu {
                process: 0.0,
                server: 0.0,
            },
            0.0,
        );
        for c in all {
            sum.process += c.process;
            sum.server += c.server;
            n += 1.0;
        }
        Cpu {
            process: sum.process / n,
            server: sum.server / n,
        }
    }
}

/// CPU seconds (user and system) process `pid` (or `self`) has used, from `/proc`; `None`
/// where there is no such process or no `/proc`.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis come fields 3 on: utime and stime are 14 and 15,
    // in ticks of USER_HZ (100 on Linux).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    #[allow(clippy::cast_precision_loss)]
    Some(ticks as f64 / 100.0)
}

/// The produce sweep: throughput and acknowledgement latency per in-flight bound. A path
/// saturates at the smallest bound that reaches 0.9 of its best throughput in the sweep: past
/// it, more bytes in flight only wait longer in the node's queue (Little's law), so its p99
/// there is the one to hold against the 250 ms limit.
#[allow(clippy::print_stdout)] // the benchmark's output
fn print_sweep(points: &[ProducePoint]) {
    println!(
        "\nProduce by bytes in flight per producer (`*`: where the path saturates, the smallest bound with 0.9 of its best MB/s):\n"
    );
    println!(
        "| store | path | in flight MiB | produce MB/s | / best | / flight | ack p50 ms | ack p99 ms | p99 / 250 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for p in points {
        let same = |q: &&ProducePoint| q.store == p.store && q.path == p.path;
        let best = points
            .iter()
            .filter(same)
            .map(|q| q.produce.mb_per_s)
            .fold(0.0, f64::max);
        let saturates = points
            .iter()
            .filter(same)
            .filter(|q| q.produce.mb_per_s >= 0.9 * best)
            .map(|q| q.in_flight_mib)
            .min()
            == Some(p.in_flight_mib);
        let flight = points
            .iter()
            .find(|q| {
                q.store == p.store && q.path == "flight" && q.in_flight_mib == p.in_flight_mib
            })
            .map_or(f64::NAN, |q| q.produce.mb_per_s);
        println!(
            "| {} | {} | {}{} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} |",
            p.store,
            p.path,
            p.in_flight_mib,
            if saturates { " *" } else { "" },
            p.produce.mb_per_s,
            p.produce.mb_per_s / best,
            p.produce.mb_per_s / flight,
            p.produce.p50_ms,
            p.produce.p99_ms,
            p.produce.p99_ms / 250.0,
        );
    }
}

/// Each second of a produce run on stderr (MB/s, ack p50 and p99, and the longest sync of the
/// metadata disk): where a run's figures come from, such as a slow first second while
/// streams open. Returns each second's p99 with the longest sync of that second and the one
/// before it (an acknowledgement counted in a second was mostly waited for in the one
/// before), both in ms.
#[allow(clippy::print_stderr)]
fn eprintln_seconds(
    store: &str,
    path: &str,
    in_flight_mib: usize,
    m: &load::Measured,
    syncs: &SyncProbe,
) -> Vec<(f64, Option<f64>)> {
    let mut out = Vec::new();
    for (_, seconds) in &m.timelines {
        let each: Vec<String> = seconds
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let ms = |q| s.latency.value_at_quantile(q) as f64 / 1000.0;
                let at = |k: u32| m.start + Duration::from_secs(u64::from(k));
                let k = u32::try_from(i).unwrap_or(u32::MAX);
                let sync = syncs.worst_ms(at(k), at(k + 1));
                let before = k.checked_sub(1).and_then(|b| syncs.worst_ms(at(b), at(k)));
                out.push((
                    ms(0.99),
                    [sync, before].into_iter().flatten().reduce(f64::max),
                ));
                format!(
                    "{:.0} MB/s p50 {:.0} p99 {:.0}{}",
                    s.bytes as f64 / 1e6,
                    ms(0.5),
                    ms(0.99),
                    sync.map_or(String::new(), |ms| format!(" sync {ms:.0}"))
                )
            })
            .collect();
        eprintln!(
            "{store} {path} {in_flight_mib} MiB, by second: {}",
            each.join(" | ")
        );
    }
    out
}

/// The node's object commits over the produce runs, how many shared an earlier one's metadata
/// transaction (queued while it was in flight), and the metadata rows written.
#[allow(clippy::print_stderr)]
fn eprintln_commits(store: &str, node: &mink_node::Node) {
    let engine = node.streams().stats();
    let sink = node.streams().sink().stats();
    eprintln!(
        "{store}: {} object commits, {} of them in an earlier one's transaction; {} metadata rows \
         for {} commands",
        engine.commits.load(Ordering::Relaxed),
        engine.grouped_commits.load(Ordering::Relaxed),
        sink.rows_appended.load(Ordering::Relaxed),
        sink.commands_appended.load(Ordering::Relaxed),
    );
}

/// How many produce seconds had an ack p99 over 300 ms, and how many of them fell in or right
/// after a second in which a sync of the metadata disk took 100 ms or more.
#[allow(clippy::print_stderr)]
fn eprintln_slow_seconds(store: &str, seconds: &[(f64, Option<f64>)]) {
    let slow: Vec<_> = seconds.iter().filter(|(p99, _)| *p99 > 300.0).collect();
    let synced = slow
        .iter()
        .filter(|(_, sync)| sync.is_some_and(|ms| ms >= 100.0))
        .count();
    eprintln!(
        "{store}: {} of {} produce seconds with an ack p99 over 300 ms, {synced} of them in or \
         right after a second with a sync of the metadata disk of 100 ms or more",
        slow.len(),
        seconds.len()
    );
}

/// What a sync of the node's metadata disk took, sampled: a thread of its own writes 4 KiB to
/// a file beside the node's SQLite log and syncs it every 100 ms, until dropped. On this
/// two-core machine the benchmark's object store (moto) keeps objects over 5 MiB in
/// temporary files on the same disk, and their writeback held syncs (so the node's commits)
/// for 100–400 ms at a time.
struct SyncProbe {
    /// When each sync started, and how long it took.
    samples: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, Duration)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SyncProbe {
    fn start(dir: &std::path::Path) -> Self {
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        if let Ok(mut file) = std::fs::File::create(dir.join("sync-probe")) {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::spawn(move || {
                use std::io::Write as _;
                let page = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    let started = std::time::Instant::now();
                    if file
                        .write_all(&page)
                        .and_then(|()| file.sync_data())
                        .is_err()
                    {
                        return;
                    }
                    samples
                        .lock()
                        .expect("sync samples lock")
                        .push((started, started.elapsed()));
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
        SyncProbe { samples, stop }
    }

    /// The longest sync started in `[from, to)`, ms (None without one).
    fn worst_ms(&self, from: std::time::Instant, to: std::time::Instant) -> Option<f64> {
        self.samples
            .lock()
            .expect("sync samples lock")
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, d)| d.as_secs_f64() * 1000.0)
            .reduce(f64::max)
    }
}

impl Drop for SyncProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One read of the topic on stderr: its MB/s and MB in each second (its GETs follow).
#[allow(clippy::print_stderr)]
fn eprintln_read(store: &str, path: &str, m: &load::Measured) {
    let Some(f) = m.figures.first() else { return };
    let seconds: Vec<String> = m
        .timelines
        .iter()
        .flat_map(|(_, s)| s.iter().map(|s| format!("{:.0}", s.bytes as f64 / 1e6)))
        .collect();
    eprintln!(
        "{store} {path} read: {:.1} MB/s in {:.2} s; MB by second: {}",
        f.mb_per_s,
        f.seconds,
        seconds.join(" ")
    );
}

/// What the consumed topic's objects are (stream-set or stream objects, and how many are over
/// the size a catch-up reader reads whole), on stderr: what its GETs per object follow.
#[allow(clippy::print_stderr, clippy::cast_precision_loss)]
fn eprintln_layout(state: &mink_metadata::State, objects: &std::collections::BTreeSet<u64>) {
    let mut line = String::from("consumed topic's objects:");
    for kind in [
        mink_metadata::ObjectKind::StreamSet,
        mink_metadata::ObjectKind::Stream,
    ] {
        let of_kind: Vec<_> = objects
            .iter()
            .filter_map(|id| state.objects.get(id))
            .filter(|o| o.kind() == kind)
            .collect();
        let bytes: u64 = of_kind.iter().map(|o| o.size).sum();
        let large = of_kind
            .iter()
            .filter(|o| o.size > s3stream::COALESCE_BYTES)
            .count();
        let ranges: u64 = of_kind.iter().map(|o| o.live_ranges).sum();
        let _ = std::fmt::Write::write_fmt(
            &mut line,
            format_args!(
                " {} {kind:?} ({:.1} MB, {large} over {} MiB, {:.1} streams each);",
                of_kind.len(),
                bytes as f64 / 1e6,
                s3stream::COALESCE_BYTES >> 20,
                ranges as f64 / of_kind.len().max(1) as f64,
            ),
        );
    }
    eprintln!("{line}");
}
