//! Propose, group commit, apply, publish; resends, corrupt rows and holes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mink_metadata::*;
use mink_sql::*;

use crate::harness::*;

async fn a_proposal_is_visible_when_it_returns(db: TestDb) {
    let sink = start(&db, config(1)).await;
    let (index, outcome) = ok(&sink, put("k", "v")).await;
    assert!(matches!(outcome, Outcome::Done(_)));
    let view = sink.view();
    assert!(view.applied_index >= index);
    assert_eq!(kv(&view, "k").as_deref(), Some("v"));
    let (_, again) = ok(&sink, put("k", "v")).await;
    assert!(again.is_redundant(), "the same put again is redundant work");
    assert!(sink.wait_applied(index).await.unwrap().applied_index >= index);
    let node = sink.node();
    assert_eq!(view.state.nodes[&node.node_id].node_epoch, node.node_epoch);
    sink.shutdown().await;
    assert_eq!(sink.propose(put("x", "y")).await, Err(SinkError::Shutdown));
}
conformance!(a_proposal_is_visible_when_it_returns);

async fn group_commit_packs_concurrent_proposals(db: TestDb) {
    let mut cfg = config(1);
    cfg.max_row_bytes = 64 << 10;
    let sink = start(&db, cfg).await;
    let before = SinkStats::get(&sink.stats().rows_appended);
    let proposals: Vec<_> = (0..600)
        .map(|i| {
            let sink = sink.clone();
            tokio::spawn(async move { ok(&sink, put(&format!("key-{i}"), "v")).await })
        })
        .collect();
    for p in proposals {
        assert!(matches!(p.await.unwrap().1, Outcome::Done(_)));
    }
    let rows = SinkStats::get(&sink.stats().rows_appended) - before;
    assert!(rows < 100, "600 concurrent proposals took {rows} rows");
    // Rows are bounded in bytes too: 20 KiB values, 64 KiB rows.
    let big = "x".repeat(20 << 10);
    let proposals: Vec<_> = (0..30)
        .map(|i| {
            let sink = sink.clone();
            let value = big.clone();
            tokio::spawn(async move { ok(&sink, put(&format!("big-{i}"), &value)).await })
        })
        .collect();
    for p in proposals {
        p.await.unwrap();
    }
    let too_big = "x".repeat(70 << 10);
    assert!(matches!(
        sink.propose(put("huge", &too_big)).await,
        Err(SinkError::TooLarge { .. })
    ));
    let store = db.store().await;
    let mut max_commands = 0;
    for row in store.read_after(0, 100_000, u64::MAX).await.unwrap() {
        assert!(
            row.payload.len() <= (64 << 10) + 256,
            "row {} is {} bytes",
            row.index,
            row.payload.len()
        );
        let decoded = decode_row(&row.payload, METADATA_VERSION).unwrap();
        assert!(decoded.commands.len() <= 256);
        max_commands = max_commands.max(decoded.commands.len());
    }
    assert!(max_commands > 1, "no row held more than one command");
    sink.shutdown().await;
}
conformance!(group_commit_packs_concurrent_proposals);

async fn commands_submitted_together_share_rows_in_order(db: TestDb) {
    let mut cfg = config(1);
    cfg.max_row_bytes = 64 << 10;
    let sink = start(&db, cfg).await;
    // Puts of one key each: the rows holding them, as the values in each row.
    async fn rows_of(db: &TestDb, key: &str) -> Vec<Vec<String>> {
        let store = db.store().await;
        let mut rows = Vec::new();
        for row in store.read_after(0, 100_000, u64::MAX).await.unwrap() {
            let values: Vec<String> = decode_row(&row.payload, METADATA_VERSION)
                .unwrap()
                .commands
                .into_iter()
                .filter_map(|c| match c {
                    Command::PutKv(p) if p.key == key => Some(String::from_utf8(p.value).unwrap()),
                    _ => None,
                })
                .collect();
            if !values.is_empty() {
                rows.push(values);
            }
        }
        rows
    }
    let submitted = sink
        .submit_all((0..8).map(|i| put("k", &format!("v{i}"))).collect())
        .await
        .unwrap();
    let mut last = 0;
    for s in submitted {
        let proposed = s.applied().await.unwrap();
        assert!(proposed.result.is_ok());
        assert!(proposed.index >= last, "applied out of order");
        last = proposed.index;
    }
    let expected: Vec<String> = (0..8).map(|i| format!("v{i}")).collect();
    assert_eq!(rows_of(&db, "k").await, vec![expected], "one row, in order");
    assert_eq!(kv(&sink.view(), "k").as_deref(), Some("v7"));
    // A group larger than a row goes in several, still in order: 20 KiB values, 64 KiB rows.
    let big = "x".repeat(20 << 10);
    let submitted = sink
        .submit_all((0..6).map(|i| put("big", &format!("{i}{big}"))).collect())
        .await
        .unwrap();
    for s in submitted {
        assert!(s.applied().await.unwrap().result.is_ok());
    }
    let rows = rows_of(&db, "big").await;
    assert_eq!(rows.len(), 2, "three 20 KiB commands per 64 KiB row");
    let order: Vec<char> = rows
        .iter()
        .flatten()
        .map(|v| v.chars().next().unwrap())
        .collect();
    assert_eq!(order, vec!['0', '1', '2', '3', '4', '5']);
    // One refused command refuses the group: nothing of it is queued.
    let too_big = "x".repeat(70 << 10);
    assert!(matches!(
        sink.submit_all(vec![put("a", "1"), put("huge", &too_big)])
            .await,
        Err(SinkError::TooLarge { .. })
    ));
    assert_eq!(rows_of(&db, "a").await.len(), 0);
    sink.shutdown().await;
}
conformance!(commands_submitted_together_share_rows_in_order);

fn raw_row(node_id: u64, sequence: u64, command: Command) -> Vec<u8> {
    encode_row(&Row {
        token: RowToken {
            node_id,
            node_epoch: 1,
            incarnation: 7,
            sequence,
        },
        proposed_at_ms: 1,
        commands: vec![command],
    })
}

async fn a_resent_row_applies_once_with_its_real_result(db: TestDb) {
    // Through the sink: the connection drops after COMMIT; the proposer still gets the
    // result of the one copy that applied.
    let faults = Faults::new(1);
    let sink = Sink::start(db.faulty_store(&faults).await, config(1))
        .await
        .unwrap();
    faults
        .next_append_lost_after_commit
        .store(true, Ordering::Relaxed);
    let p = sink
        .propose(Command::PutKvIfAbsent(PutKvIfAbsent {
            key: "once".into(),
            value: b"v".to_vec(),
        }))
        .await
        .unwrap();
    assert_eq!(faults.injected(), 1);
    let outcome = p.result.expect("accepted");
    assert!(matches!(outcome, Outcome::Done(_)), "got {outcome:?}");
    sink.shutdown().await;

    // At the log level: the same row twice; the second copy is a no-op whose stored result is
    // the first copy's.
    let store = db.store().await;
    let row = raw_row(99, 1, put("dup", "first"));
    let first = store.append(&row).await.unwrap();
    let second = store.append(&row).await.unwrap();
    let view = load_view(store.as_ref(), METADATA_VERSION).await.unwrap();
    assert_eq!(view.applied_index, second);
    assert_eq!(
        view.state.kv["dup"].version, first,
        "applied at the first copy only"
    );
    let mut state = State::default();
    let ctx = |index| ApplyContext {
        index,
        at_ms: 1,
        supported_version: METADATA_VERSION,
    };
    let decoded = decode_row(&row, METADATA_VERSION).unwrap();
    let a = state.apply_row(&ctx(1), &decoded).unwrap();
    let b = state.apply_row(&ctx(2), &decoded).unwrap();
    assert!(matches!(a, RowOutcome::Applied(_)));
    assert_eq!(b, RowOutcome::Duplicate(a.results().map(<[_]>::to_vec)));
}
conformance!(a_resent_row_applies_once_with_its_real_result);

async fn a_corrupt_row_halts_the_sink(db: TestDb) {
    let sink = start(&db, quiet(1)).await;
    ok(&sink, put("before", "1")).await;
    let store = db.store().await;
    let (_, max) = store.log_bounds().await.unwrap().unwrap();
    sink.wait_applied(max).await.unwrap();
    // An unknown format byte, then a valid row after it.
    store.insert_raw(max + 1, b"\x09not a row").await.unwrap();
    store
        .insert_raw(max + 2, &raw_row(99, 1, put("after", "2")))
        .await
        .unwrap();
    let err = sink.wait_applied(max + 2).await.unwrap_err();
    let SinkError::Halted { index, reason } = &err else {
        panic!("expected a halt, got {err:?}");
    };
    assert_eq!(*index, max + 1);
    assert!(reason.contains("unknown format version 9"), "{reason}");
    assert_eq!(sink.view().applied_index, max, "nothing was skipped");
    assert_eq!(kv(&sink.view(), "after"), None);
    assert_eq!(sink.propose(put("later", "3")).await.unwrap_err(), err);
    // A new node on the same log refuses to start rather than skip the row.
    if db.multi_node() {
        let started = Sink::start(db.store().await, quiet(2)).await;
        assert!(
            matches!(started, Err(SinkError::Start(m)) if m.contains("unknown format version"))
        );
    }
    sink.shutdown().await;
}
conformance!(a_corrupt_row_halts_the_sink);

async fn a_hole_is_waited_for_and_never_skipped(db: TestDb) {
    let sink = start(&db, quiet(1)).await;
    ok(&sink, put("before", "1")).await;
    let store = db.store().await;
    let (_, max) = store.log_bounds().await.unwrap().unwrap();
    sink.wait_applied(max).await.unwrap();
    store
        .insert_raw(max + 2, &raw_row(99, 2, put("second", "2")))
        .await
        .unwrap();
    eventually(
        "the tailer notices the hole",
        Duration::from_secs(5),
        || SinkStats::get(&sink.stats().holes) > 0,
    )
    .await;
    assert_eq!(sink.view().applied_index, max, "waits at the hole");
    store
        .insert_raw(max + 1, &raw_row(99, 1, put("first", "1")))
        .await
        .unwrap();
    let view = sink.wait_applied(max + 2).await.unwrap();
    assert_eq!(kv(&view, "first").as_deref(), Some("1"));
    assert_eq!(kv(&view, "second").as_deref(), Some("2"));
    assert!(sink.halted().is_none());
    sink.shutdown().await;
}
conformance!(a_hole_is_waited_for_and_never_skipped);

async fn proposals_survive_connection_faults(db: TestDb) {
    let faults = Faults::new(7);
    let sink = Sink::start(db.faulty_store(&faults).await, config(1))
        .await
        .unwrap();
    faults.set(100, 100, 50);
    faults.latency_us.store(300, Ordering::Relaxed);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let sink = sink.clone();
            tokio::spawn(async move {
                for i in 0..15 {
                    let p = sink
                        .propose(Command::Allocate(Allocate {
                            sequence: "ids".into(),
                            count: 1,
                        }))
                        .await
                        .expect("no proposal fails under retriable faults");
                    let Ok(Outcome::Done(Reply::Range(r))) = p.result else {
                        panic!("task {t} op {i}: {:?}", p.result);
                    };
                    assert_eq!(r.end, r.start + 1);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    faults.clear();
    assert!(faults.injected() > 0, "no fault was injected");
    // 120 allocations, each exactly once: the sequence is at 121.
    let view = sink.view();
    assert_eq!(view.state.sequences["ids"].next, 121);
    assert_same_as_cold_start(&db, &sink).await;
    sink.shutdown().await;
}
conformance!(proposals_survive_connection_faults);
