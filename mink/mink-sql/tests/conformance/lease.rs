//! Lease, coordinator epochs and node-epoch fencing.

use std::time::{Duration, Instant};

use mink_metadata::*;
use mink_sql::*;
use tokio::sync::watch;

use crate::harness::*;

async fn held(lease: &mut watch::Receiver<LeaseStatus>, limit: Duration) -> u64 {
    let status = tokio::time::timeout(limit, lease.wait_for(|s| s.coordinator_epoch().is_some()))
        .await
        .expect("lease acquired in time")
        .expect("lease watch open");
    status.coordinator_epoch().unwrap()
}

fn expire_prepared(coordinator_epoch: u64) -> Command {
    Command::ExpirePreparedObjects(ExpirePreparedObjects {
        coordinator_epoch,
        now_ms: 0,
    })
}

async fn the_lease_holder_registers_as_coordinator(db: TestDb) {
    let sink = start(&db, config(1)).await;
    let epoch = held(&mut sink.lease(), Duration::from_secs(5)).await;
    let coordinator = sink.view().state.coordinator.clone().unwrap();
    assert_eq!(
        (
            coordinator.node_id,
            coordinator.node_epoch,
            coordinator.epoch
        ),
        (1, sink.node().node_epoch, epoch)
    );
    let (_, outcome) = ok(&sink, expire_prepared(epoch)).await;
    assert!(outcome.is_redundant(), "nothing to expire");
    let wrong = sink.propose(expire_prepared(epoch + 1)).await.unwrap();
    assert_eq!(
        wrong.result.unwrap_err().kind(),
        RejectionKind::CoordinatorFenced
    );
    let live = sink.live_nodes().await.unwrap();
    assert_eq!(live.iter().map(|n| n.node_id).collect::<Vec<_>>(), vec![1]);
    // Heartbeats carry the applied index (the first one, written before registering, cannot).
    let deadline = Instant::now() + Duration::from_secs(3);
    while sink.live_nodes().await.unwrap()[0].applied_index == 0 {
        assert!(
            Instant::now() < deadline,
            "no heartbeat carried an applied index"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A clean shutdown releases the lease and expires the heartbeat at once.
    sink.shutdown().await;
    let store = db.store().await;
    let lease = store.read_lease().await.unwrap();
    assert!(lease.expires_at_ms <= lease.now_ms);
    let nodes = store.nodes().await.unwrap();
    assert!(nodes[0].age_ms > 1_000_000, "heartbeat expired on shutdown");
}
conformance!(the_lease_holder_registers_as_coordinator);

/// A holds the lease, then freezes. Returns (A, its faults, B, A's old epoch, B's epoch).
async fn freeze_the_holder(db: &TestDb) -> (Sink, std::sync::Arc<Faults>, Sink, u64, u64) {
    let faults = Faults::new(3);
    let a = Sink::start(db.faulty_store(&faults).await, config(1))
        .await
        .unwrap();
    let mut a_lease = a.lease();
    let a_epoch = held(&mut a_lease, Duration::from_secs(5)).await;
    let b = start(db, config(2)).await;
    let mut b_lease = b.lease();
    // B has tried for the lease a few times while A holds it.
    tokio::time::timeout(
        Duration::from_secs(30),
        b.stats().reaches(|s| &s.lease_attempts, 3),
    )
    .await
    .expect("B did not try for the lease three times within 30 s");
    assert_eq!(
        b_lease.borrow().coordinator_epoch(),
        None,
        "one holder at a time"
    );

    let paused_at = Instant::now();
    faults.pause();
    tokio::time::timeout(
        Duration::from_secs(2),
        a_lease.wait_for(|s| s.coordinator_epoch().is_none()),
    )
    .await
    .expect("the frozen holder gives the lease up locally within a TTL")
    .unwrap();
    assert!(paused_at.elapsed() <= a.config().lease_ttl + Duration::from_millis(300));
    let b_epoch = held(&mut b_lease, Duration::from_secs(5)).await;
    assert!(b_epoch > a_epoch);
    let view = b.view();
    let coordinator = view.state.coordinator.as_ref().unwrap();
    assert_eq!((coordinator.node_id, coordinator.epoch), (2, b_epoch));
    (a, faults, b, a_epoch, b_epoch)
}

async fn the_lease_fails_over_when_the_holder_stops_renewing(db: TestDb) {
    let (a, faults, b, _, b_epoch) = freeze_the_holder(&db).await;
    let (_, outcome) = ok(&b, expire_prepared(b_epoch)).await;
    assert!(outcome.is_redundant());
    faults.resume();
    a.shutdown().await;
    b.shutdown().await;
}
conformance!(
    the_lease_fails_over_when_the_holder_stops_renewing,
    multi_node
);

async fn a_paused_ex_holder_is_rejected(db: TestDb) {
    let (a, faults, b, a_epoch, _) = freeze_the_holder(&db).await;
    // A wakes up still believing in its epoch, and issues a coordinator command with it.
    faults.resume();
    let stale = a.propose(expire_prepared(a_epoch)).await.unwrap();
    let rejection = stale.result.unwrap_err();
    assert_eq!(
        rejection.kind(),
        RejectionKind::CoordinatorFenced,
        "{rejection}"
    );
    assert_eq!(a.lease().borrow().coordinator_epoch(), None);
    a.shutdown().await;
    b.shutdown().await;
}
conformance!(a_paused_ex_holder_is_rejected, multi_node);

async fn a_restarted_nodes_old_epoch_is_fenced(db: TestDb) {
    let old = start(&db, quiet(1)).await;
    let old_ref = old.node();
    ok(&old, put("k", "old")).await;
    // The node restarts (a new process with the same id) while the old one still runs.
    let new = start(&db, quiet(1)).await;
    let new_ref = new.node();
    assert!(new_ref.node_epoch > old_ref.node_epoch);
    // A command carrying the old identity is refused whoever sends it...
    let prepare = |node: NodeRef| {
        Command::PrepareObject(PrepareObject {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            count: 1,
            expires_at_ms: 1,
        })
    };
    let p = new.propose(prepare(old_ref)).await.unwrap();
    assert_eq!(p.result.unwrap_err().kind(), RejectionKind::NodeFenced);
    ok(&new, prepare(new_ref)).await;
    // ...and the old process writes nothing more: it halts as soon as it sees the newer
    // registration, and a row it had in flight is void (row-level fencing is covered by the
    // golden `rows_tokens_and_fencing`).
    match old.propose(put("k", "zombie")).await {
        Err(SinkError::Fenced { .. }) => {}
        Ok(p) => assert_eq!(p.result.unwrap_err().kind(), RejectionKind::NodeFenced),
        Err(e) => panic!("unexpected {e}"),
    }
    eventually("the old process halts", Duration::from_secs(5), || {
        matches!(old.halted(), Some(SinkError::Fenced { .. }))
    })
    .await;
    assert!(matches!(
        old.propose(put("k", "again")).await,
        Err(SinkError::Fenced { .. })
    ));
    ok(&new, put("k2", "new")).await;
    let view = new.view();
    assert_eq!(kv(&view, "k").as_deref(), Some("old"));
    assert_eq!(kv(&view, "k2").as_deref(), Some("new"));
    old.abort();
    new.shutdown().await;
}
conformance!(a_restarted_nodes_old_epoch_is_fenced, multi_node);

async fn a_superseded_holder_gives_up_the_lease(db: TestDb) {
    let old = start(&db, config(1)).await;
    let old_epoch = held(&mut old.lease(), Duration::from_secs(5)).await;
    let other = start(&db, config(2)).await;
    // The same node id starts again (its predecessor did not exit).
    let new = start(&db, config(1)).await;
    eventually(
        "the superseded process halts",
        Duration::from_secs(5),
        || matches!(old.halted(), Some(SinkError::Fenced { .. })),
    )
    .await;
    // The lease loop notices the halt on its next tick and gives the lease up.
    eventually(
        "the superseded process to give up the lease",
        Duration::from_secs(5),
        || old.lease().borrow().coordinator_epoch().is_none(),
    )
    .await;
    // The lease was released, not left to expire: another node takes it within a few ticks.
    let started = Instant::now();
    let mut leases = [new.lease(), other.lease()];
    let (a, b) = leases.split_at_mut(1);
    let epoch = tokio::select! {
        e = held(&mut a[0], Duration::from_secs(5)) => e,
        e = held(&mut b[0], Duration::from_secs(5)) => e,
    };
    assert!(epoch > old_epoch);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    old.abort();
    new.shutdown().await;
    other.shutdown().await;
}
conformance!(a_superseded_holder_gives_up_the_lease, multi_node);

/// A holder that crashes (no release) and restarts under the same node id holds the lease
/// again at its first tick, long before the TTL its previous life left on the lease.
async fn a_restarted_holder_takes_its_lease_back_at_once(db: TestDb) {
    let mut long = config(1);
    long.lease_ttl = Duration::from_secs(60);
    let crashed = start(&db, long.clone()).await;
    let old_epoch = held(&mut crashed.lease(), Duration::from_secs(5)).await;
    crashed.abort(); // a crash: the lease is neither released nor expired
    let restarted_at = Instant::now();
    let restarted = start(&db, long).await;
    let epoch = held(&mut restarted.lease(), Duration::from_secs(5)).await;
    assert!(epoch > old_epoch);
    assert!(
        restarted_at.elapsed() < Duration::from_secs(5),
        "took {:?} with a 60 s TTL",
        restarted_at.elapsed()
    );
    let coordinator = restarted.view().state.coordinator.clone().unwrap();
    assert_eq!(
        (coordinator.node_epoch, coordinator.epoch),
        (restarted.node().node_epoch, epoch)
    );
    restarted.shutdown().await;
}
conformance!(a_restarted_holder_takes_its_lease_back_at_once, multi_node);

/// A holder on its way out resigns through the log: another node takes the lease as soon as it
/// applies that, not at its next renewal (15 s apart here), while the resigned node goes on
/// heartbeating and never takes the lease again.
async fn a_stopping_holder_hands_the_lease_over_at_once(db: TestDb) {
    let long = |node_id| {
        let mut c = config(node_id);
        c.lease_ttl = Duration::from_secs(60);
        c
    };
    let a = start(&db, long(1)).await;
    let a_epoch = held(&mut a.lease(), Duration::from_secs(5)).await;
    eventually(
        "the cluster at the metadata_version that resigns",
        Duration::from_secs(10),
        || a.view().state.metadata_version >= RESIGN_VERSION,
    )
    .await;
    let b = start(&db, long(2)).await;
    // B has tried once (an attempt counts once answered), found the lease held, and now waits
    // out its 15 s interval.
    tokio::time::timeout(
        Duration::from_secs(5),
        b.stats().reaches(|s| &s.lease_attempts, 1),
    )
    .await
    .expect("B tried for the lease at start");
    assert_eq!(b.lease().borrow().coordinator_epoch(), None);

    let resigned_at = Instant::now();
    a.resign().await;
    assert_eq!(a.lease().borrow().coordinator_epoch(), None);
    let b_epoch = held(&mut b.lease(), Duration::from_secs(5)).await;
    let took = resigned_at.elapsed();
    eprintln!("the lease moved {took:?} after the holder resigned (renewals 15 s apart)");
    assert!(b_epoch > a_epoch);
    let view = b.view();
    let coordinator = view.state.coordinator.as_ref().unwrap();
    assert_eq!(
        (coordinator.active(), coordinator.epoch),
        (Some(2), b_epoch)
    );
    // The resigned node is alive (it heartbeats on) but holds nothing, and its old epoch is
    // fenced.
    assert!(
        b.live_nodes().await.unwrap().iter().any(|n| n.node_id == 1),
        "the resigned node still heartbeats"
    );
    let stale = a.propose(expire_prepared(a_epoch)).await.unwrap();
    assert_eq!(
        stale.result.unwrap_err().kind(),
        RejectionKind::CoordinatorFenced
    );
    a.shutdown().await;
    assert_eq!(b.lease().borrow().coordinator_epoch(), Some(b_epoch));
    b.shutdown().await;
}
conformance!(a_stopping_holder_hands_the_lease_over_at_once, multi_node);
