//! Snapshots, truncation, restarts, and nodes that fall behind a truncated log.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mink_metadata::*;
use mink_sql::*;

use crate::harness::*;

fn small_snapshots(node_id: u64, interval: u64) -> SinkConfig {
    let mut c = config(node_id);
    c.snapshot_interval = interval;
    c
}

async fn wait_truncated_past(db: &TestDb, index: u64) {
    let store = db.store().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (min, _) = store.log_bounds().await.unwrap().unwrap();
        if min > index + 1 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "log not truncated past {index} (starts at {min})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_restart_from_snapshot_and_tail_gives_the_same_state(db: TestDb) {
    let sink = start(&db, small_snapshots(1, 16)).await;
    for i in 0..60 {
        ok(&sink, put(&format!("k{i}"), &format!("v{i}"))).await;
    }
    eventually("a snapshot is written", Duration::from_secs(10), || {
        SinkStats::get(&sink.stats().snapshots_written) > 0
    })
    .await;
    wait_truncated_past(&db, 16).await;
    for i in 60..70 {
        ok(&sink, put(&format!("k{i}"), &format!("v{i}"))).await;
    }
    let store = db.store().await;
    let snapshot = store.load_snapshot().await.unwrap().unwrap();
    assert!(snapshot.applied_index >= 16);
    assert_same_as_cold_start(&db, &sink).await;
    let before = sink.view();
    sink.shutdown().await;

    let restarted = start(&db, small_snapshots(1, 16)).await;
    let after = restarted.view();
    assert!(restarted.node().node_epoch > before.state.nodes[&1].node_epoch);
    for i in 0..70 {
        assert_eq!(kv(&after, &format!("k{i}")), Some(format!("v{i}")));
    }
    assert_eq!(after.state.kv, before.state.kv);
    restarted.shutdown().await;
}
conformance!(a_restart_from_snapshot_and_tail_gives_the_same_state);

async fn a_lagging_node_never_overwrites_a_newer_snapshot(db: TestDb) {
    let sink = start(&db, small_snapshots(1, 8)).await;
    let old_view = sink.view();
    let store = db.store().await;
    let mut i = 0;
    while SinkStats::get(&sink.stats().snapshots_written) < 2 {
        ok(&sink, put(&format!("k{i}"), "v")).await;
        i += 1;
        assert!(i < 2_000, "no second snapshot after {i} rows");
        if i % 8 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let newest = store.load_snapshot().await.unwrap().unwrap();
    assert!(newest.applied_index > old_view.applied_index);
    // A node that lags behind offers its older state.
    let stale = encode_snapshot(old_view.applied_index, &old_view.state);
    assert!(
        !store
            .store_snapshot(old_view.applied_index, &stale)
            .await
            .unwrap()
    );
    let kept = store.load_snapshot().await.unwrap().unwrap();
    assert!(kept.applied_index >= newest.applied_index);
    let (index, state) = decode_snapshot(&kept.payload, METADATA_VERSION).unwrap();
    assert_eq!(index, kept.applied_index);
    assert!(state.kv.contains_key("k0"));
    sink.shutdown().await;
}
conformance!(a_lagging_node_never_overwrites_a_newer_snapshot, multi_node);

/// B holds the lease and snapshots every 16 rows; A does not compete for it.
async fn two_nodes(db: &TestDb) -> (Sink, std::sync::Arc<Faults>, Sink) {
    let b = start(db, small_snapshots(2, 16)).await;
    tokio::time::timeout(
        Duration::from_secs(5),
        b.lease().wait_for(|s| s.coordinator_epoch().is_some()),
    )
    .await
    .unwrap()
    .unwrap();
    let faults = Faults::new(5);
    let mut cfg = small_snapshots(1, 16);
    cfg.lease_enabled = false;
    let a = Sink::start(db.faulty_store(&faults).await, cfg)
        .await
        .unwrap();
    (a, faults, b)
}

async fn a_paused_node_resumes_past_two_snapshot_intervals(db: TestDb) {
    let (a, faults, b) = two_nodes(&db).await;
    let paused_at = a.view().applied_index;
    faults.pause();
    let begun = faults.appends_begun();
    let queued = {
        let a = a.clone();
        tokio::spawn(async move {
            a.propose(Command::PutKvIfAbsent(PutKvIfAbsent {
                key: "race".into(),
                value: b"from-a".to_vec(),
            }))
            .await
        })
    };
    // A's row waits at its paused database while B writes.
    tokio::time::timeout(
        Duration::from_secs(30),
        faults.appends_begun_reach(begun + 1),
    )
    .await
    .expect("A's proposal did not reach its database within 30 s");
    ok(&b, put("race", "from-b")).await;
    let mut acknowledged = Vec::new();
    for i in 0..48 {
        let key = format!("b{i}");
        ok(&b, put(&key, "x")).await;
        acknowledged.push(key);
    }
    // A is dead to the others (no heartbeat for a TTL), so truncation passes it by.
    wait_truncated_past(&db, paused_at + 32).await;
    faults.resume();
    let proposed = queued
        .await
        .unwrap()
        .expect("the queued proposal completes");
    let rejection = proposed
        .result
        .expect_err("validated against the current state");
    assert_eq!(rejection.kind(), RejectionKind::AlreadyExists);
    assert_eq!(rejection.value.as_deref(), Some(&b"from-b"[..]));
    assert!(
        SinkStats::get(&a.stats().reinstalls) >= 1,
        "A reinstalled from the snapshot"
    );
    let view = a.wait_applied(proposed.index).await.unwrap();
    for key in &acknowledged {
        assert!(view.state.kv.contains_key(key), "acknowledged {key} lost");
    }
    assert_same_as_cold_start(&db, &a).await;
    a.shutdown().await;
    b.shutdown().await;
}
conformance!(
    a_paused_node_resumes_past_two_snapshot_intervals,
    multi_node
);

async fn a_row_truncated_before_its_node_read_it_still_gets_its_result(db: TestDb) {
    let (a, faults, b) = two_nodes(&db).await;
    // A's row commits, then A freezes before it learns the outcome.
    faults
        .pause_after_next_append
        .store(true, Ordering::Relaxed);
    let queued = {
        let a = a.clone();
        tokio::spawn(async move {
            a.propose(Command::PutKvIfAbsent(PutKvIfAbsent {
                key: "late".into(),
                value: b"from-a".to_vec(),
            }))
            .await
        })
    };
    let store = db.store().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let row_index = loop {
        let rows = store.read_after(0, 100_000, u64::MAX).await.unwrap();
        let found = rows.iter().find(|r| {
            decode_row(&r.payload, METADATA_VERSION).is_ok_and(|row| {
                row.token.node_id == 1
                    && row.commands.len() == 1
                    && matches!(&row.commands[0], Command::PutKvIfAbsent(c) if c.key == "late")
            })
        });
        if let Some(r) = found {
            break r.index;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "A's row never landed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for i in 0..48 {
        ok(&b, put(&format!("b{i}"), "x")).await;
    }
    wait_truncated_past(&db, row_index).await;
    faults.resume();
    let proposed = queued.await.unwrap().expect("completes");
    let outcome = proposed
        .result
        .expect("the real result of the committed row");
    assert!(matches!(outcome, Outcome::Done(_)), "got {outcome:?}");
    let view = a.wait_applied(proposed.index).await.unwrap();
    assert_eq!(
        view.state.kv["late"].version, row_index,
        "applied once, at its first copy"
    );
    assert_same_as_cold_start(&db, &a).await;
    a.shutdown().await;
    b.shutdown().await;
}
conformance!(
    a_row_truncated_before_its_node_read_it_still_gets_its_result,
    multi_node
);
