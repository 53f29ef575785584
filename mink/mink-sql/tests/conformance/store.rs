//! The `LogStore` contract, checked directly on each backend.

use std::collections::BTreeSet;

use mink_sql::StoreError;

use crate::harness::*;

async fn append_computes_the_next_index(db: TestDb) {
    let store = db.store().await;
    assert_eq!(store.log_bounds().await.unwrap(), None);
    for expected in 1..=5 {
        assert_eq!(store.append(b"row").await.unwrap(), expected);
    }
    // Concurrent appends from separate connections: every index exactly once, no gaps.
    let writers = if db.multi_node() { 4 } else { 1 };
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = db.store().await;
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let mut conflicts = 0;
            for i in 0..25 {
                let payload = format!("{w}-{i}");
                loop {
                    match store.append(payload.as_bytes()).await {
                        Ok(index) => break got.push(index),
                        Err(StoreError::AppendConflict) => conflicts += 1,
                        Err(e) => panic!("append failed: {e}"),
                    }
                }
            }
            (got, conflicts)
        }));
    }
    let mut all = BTreeSet::new();
    for t in tasks {
        let (got, _) = t.await.unwrap();
        for index in got {
            assert!(all.insert(index), "index {index} handed out twice");
        }
    }
    let expected: BTreeSet<u64> = (6..6 + 25 * writers).collect();
    assert_eq!(all, expected);
    let rows = store.read_after(0, 10_000, u64::MAX).await.unwrap();
    let indexes: Vec<u64> = rows.iter().map(|r| r.index).collect();
    assert_eq!(indexes, (1..6 + 25 * writers).collect::<Vec<_>>());
    assert_eq!(store.read_after(10, 3, u64::MAX).await.unwrap().len(), 3);
    // Bounded in bytes too, but the first row always comes back.
    let big = vec![0u8; 1000];
    let first_big = store.append(&big).await.unwrap();
    store.append(&big).await.unwrap();
    store.append(&big).await.unwrap();
    let rows = store.read_after(first_big - 1, 100, 1500).await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.index).collect::<Vec<_>>(),
        vec![first_big, first_big + 1]
    );
    assert_eq!(
        store
            .read_after(first_big - 1, 100, 10)
            .await
            .unwrap()
            .len(),
        1
    );
}
conformance!(append_computes_the_next_index);

async fn snapshot_is_compare_and_set_on_a_rising_index(db: TestDb) {
    let store = db.store().await;
    assert_eq!(store.load_snapshot().await.unwrap(), None);
    assert!(store.store_snapshot(10, b"ten").await.unwrap());
    // A lagging node never overwrites a newer snapshot.
    assert!(!store.store_snapshot(5, b"five").await.unwrap());
    assert!(!store.store_snapshot(10, b"other ten").await.unwrap());
    let s = store.load_snapshot().await.unwrap().unwrap();
    assert_eq!((s.applied_index, s.payload.as_slice()), (10, &b"ten"[..]));
    assert!(store.store_snapshot(11, b"eleven").await.unwrap());
    assert_eq!(
        store.load_snapshot().await.unwrap().unwrap().applied_index,
        11
    );
}
conformance!(snapshot_is_compare_and_set_on_a_rising_index);

async fn truncate_keeps_the_newest_row_and_stays_below_the_snapshot(db: TestDb) {
    let store = db.store().await;
    for _ in 0..10 {
        store.append(b"row").await.unwrap();
    }
    assert_eq!(
        store.truncate(100).await.unwrap(),
        0,
        "no snapshot: nothing may go"
    );
    store.store_snapshot(6, b"s").await.unwrap();
    assert_eq!(store.truncate(100).await.unwrap(), 6);
    assert_eq!(store.log_bounds().await.unwrap(), Some((7, 10)));
    store.store_snapshot(10, b"s").await.unwrap();
    assert_eq!(store.truncate(10).await.unwrap(), 3, "the newest row stays");
    assert_eq!(store.log_bounds().await.unwrap(), Some((10, 10)));
    assert_eq!(
        store.append(b"next").await.unwrap(),
        11,
        "MAX(idx) survives truncation"
    );
}
conformance!(truncate_keeps_the_newest_row_and_stays_below_the_snapshot);

async fn lease_is_compare_and_set(db: TestDb) {
    let store = db.store().await;
    let minute = 60_000;
    let first = store.acquire_lease(1, 1, minute).await.unwrap().unwrap();
    assert_eq!(first.term, 1);
    assert_eq!(store.acquire_lease(2, 1, minute).await.unwrap(), None);
    let renewed = store.acquire_lease(1, 1, minute).await.unwrap().unwrap();
    assert_eq!(renewed.term, 1, "a renew keeps the term");
    assert!(renewed.expires_at_ms >= first.expires_at_ms);
    // A restarted node 1 (a new epoch: it has fenced its previous life) takes the lease back
    // at once, under a new term; the previous life can no longer renew it.
    let restarted = store.acquire_lease(1, 2, minute).await.unwrap().unwrap();
    assert_eq!(
        restarted.term, 2,
        "a new life of the holder gets a new term"
    );
    assert_eq!(store.acquire_lease(1, 1, minute).await.unwrap(), None);
    store.release_lease(2, 1).await.unwrap(); // not the holder: no effect
    store.release_lease(1, 1).await.unwrap(); // an earlier life: no effect
    assert_eq!(store.acquire_lease(2, 1, minute).await.unwrap(), None);
    // The holder's expiry, by the database's clock, is ahead of it.
    let row = store.read_lease().await.unwrap();
    assert_eq!((row.node_id, row.node_epoch, row.term), (1, 2, 2));
    assert!(row.expires_at_ms > row.now_ms);
    store.release_lease(1, 2).await.unwrap();
    // A lease of 0 ms lapses at once (the database's clock decides, and it only moves on):
    // the next node takes it over without waiting.
    let second = store.acquire_lease(2, 1, 0).await.unwrap().unwrap();
    assert_eq!(second.term, 3, "a new holder gets a new term");
    let row = store.read_lease().await.unwrap();
    assert_eq!((row.node_id, row.node_epoch, row.term), (2, 1, 3));
    assert!(row.expires_at_ms <= row.now_ms);
    let third = store.acquire_lease(3, 1, minute).await.unwrap().unwrap();
    assert_eq!(third.term, 4, "an expired lease can be taken");
}
conformance!(lease_is_compare_and_set);

async fn heartbeats_use_the_database_clock_and_never_regress(db: TestDb) {
    let store = db.store().await;
    let now = store.now_ms().await.unwrap();
    let wall = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    assert!(
        (now - wall).abs() < 60_000,
        "database clock {now} vs wall clock {wall}"
    );
    let hb = |epoch, applied| mink_sql::Heartbeat {
        node_id: 1,
        node_epoch: epoch,
        applied_index: applied,
        supported_version: 2,
    };
    store.heartbeat(&hb(2, 10)).await.unwrap();
    store.heartbeat(&hb(1, 99)).await.unwrap(); // an older process: ignored
    let nodes = store.nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!((nodes[0].node_epoch, nodes[0].applied_index), (2, 10));
    assert!(
        (0..5_000).contains(&nodes[0].age_ms),
        "age {}",
        nodes[0].age_ms
    );
    store.expire_heartbeat(1, 1).await.unwrap(); // wrong epoch: no effect
    assert!(store.nodes().await.unwrap()[0].age_ms < 5_000);
    store.expire_heartbeat(1, 2).await.unwrap();
    assert!(store.nodes().await.unwrap()[0].age_ms > 1_000_000_000);
}
conformance!(heartbeats_use_the_database_clock_and_never_regress);

/// SQLite files run in WAL mode (persisted in the file) with synchronous=FULL.
#[tokio::test]
async fn sqlite_files_use_wal_and_full_sync() {
    let Some(db) = TestDb::new(Backend::SqliteFile).await else {
        return;
    };
    let store = db.store().await;
    store.append(b"row").await.unwrap();
    let mut conn: sqlx::SqliteConnection = sqlx::Connection::connect(&db.locator).await.unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let store = mink_sql::SqliteStore::connect(&db.locator).await.unwrap();
    assert_eq!(store.synchronous().await.unwrap(), 2, "2 = FULL");
}
