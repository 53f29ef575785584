//! Several nodes proposing concurrently reach the same state at the same index, byte for byte;
//! so does a second OS process that replays the same log.

use std::collections::BTreeMap;
use std::time::Duration;

use mink_metadata::*;
use mink_sql::*;
use rand::{Rng, SeedableRng};

use crate::harness::*;

const CHILD_LOCATOR: &str = "MINK_REPLAY_LOCATOR";
const CHILD_OUT: &str = "MINK_REPLAY_OUT";

fn random_command(rng: &mut impl Rng, node: NodeRef) -> Command {
    let table = format!("t{}", rng.random_range(0..6));
    match rng.random_range(0..9) {
        0 | 1 => put(
            &format!("k{}", rng.random_range(0..20)),
            &format!("v{}", rng.random_range(0..5)),
        ),
        2 => Command::DeleteKv(DeleteKv {
            key: format!("k{}", rng.random_range(0..20)),
        }),
        3 => Command::Allocate(Allocate {
            sequence: format!("seq{}", rng.random_range(0..3)),
            count: rng.random_range(1..100),
        }),
        4 => Command::CreateTable(CreateTable {
            database: "db".into(),
            name: table,
            bucket_count: rng.random_range(1..4),
            options: BTreeMap::from([("table.log.ttl".to_string(), "7d".to_string())]),
            ..Default::default()
        }),
        5 => Command::DropTable(DropTable {
            database: "db".into(),
            name: table,
        }),
        6 => Command::CreateStreams(CreateStreams {
            count: rng.random_range(1..3),
        }),
        7 => Command::PrepareObject(PrepareObject {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            count: rng.random_range(1..4),
            expires_at_ms: 1_000,
        }),
        _ => Command::AllocateProducerIds(AllocateProducerIds {
            count: rng.random_range(1..10),
        }),
    }
}

async fn nodes_converge_byte_for_byte(db: TestDb) {
    // Child mode: this same test, re-executed in a second process, replays the log.
    if let Ok(locator) = std::env::var(CHILD_LOCATOR) {
        let store = open_locator(&locator).await;
        let view = load_view(store.as_ref(), METADATA_VERSION).await.unwrap();
        let bytes = encode_snapshot(view.applied_index, &view.state);
        std::fs::write(std::env::var(CHILD_OUT).unwrap(), bytes).unwrap();
        return;
    }

    let mut sinks = Vec::new();
    for node_id in 1..=3 {
        let mut cfg = config(node_id);
        cfg.snapshot_interval = 64;
        sinks.push(start(&db, cfg).await);
    }
    ok(
        &sinks[0],
        Command::CreateDatabase(CreateDatabase {
            name: "db".into(),
            ..Default::default()
        }),
    )
    .await;
    let mut tasks = Vec::new();
    for (n, sink) in sinks.iter().enumerate() {
        for t in 0..6 {
            let sink = sink.clone();
            tasks.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64((n * 100 + t) as u64);
                let node = sink.node();
                let mut max = 0;
                for _ in 0..40 {
                    let p = sink
                        .propose(random_command(&mut rng, node))
                        .await
                        .expect("propose");
                    max = max.max(p.index);
                }
                max
            }));
        }
    }
    let mut max = 0;
    for t in tasks {
        max = max.max(t.await.unwrap());
    }
    // Let every node reach one index and compare their states' encodings.
    let store = db.store().await;
    let mut compared = false;
    for _ in 0..50 {
        let (_, end) = store.log_bounds().await.unwrap().unwrap();
        assert!(end >= max);
        let mut views = Vec::new();
        for sink in &sinks {
            views.push(sink.wait_applied(end).await.unwrap());
        }
        if views.iter().all(|v| v.applied_index == end) {
            let first = encode_snapshot(end, &views[0].state);
            for v in &views[1..] {
                assert_eq!(
                    encode_snapshot(end, &v.state),
                    first,
                    "nodes differ at {end}"
                );
            }
            compared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(compared, "nodes never stood at one index");
    for sink in &sinks {
        sink.shutdown().await;
    }
    let view = load_view(store.as_ref(), METADATA_VERSION).await.unwrap();
    let here = encode_snapshot(view.applied_index, &view.state);
    assert_eq!(
        view.state.row_tokens.len(),
        3,
        "every node's rows were tracked"
    );

    // A second process applies the same log.
    let test_name = std::thread::current()
        .name()
        .expect("libtest names the test thread")
        .to_string();
    let out = tempfile::NamedTempFile::new().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test_name, "--nocapture", "--test-threads", "1"])
        .env(CHILD_LOCATOR, &db.locator)
        .env(CHILD_OUT, out.path())
        .status()
        .unwrap();
    assert!(status.success(), "the replaying process failed");
    let there = std::fs::read(out.path()).unwrap();
    assert!(!there.is_empty(), "the replaying process wrote nothing");
    assert_eq!(
        here, there,
        "two processes computed different states from one log"
    );
}
conformance!(nodes_converge_byte_for_byte, multi_node);
