//! Concurrent KV operations from proposers on different nodes, with connection faults
//! injected, form a linearizable history (checked per key with stateright's
//! `LinearizabilityTester`; linearizability is compositional over independent keys).

use std::sync::{Arc, Mutex};

use mink_metadata::*;
use mink_sql::*;
use rand::{Rng, SeedableRng};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use crate::harness::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Put(u8),
    PutIfAbsent(u8),
    DeleteIfMatches(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ret {
    Done(Option<u8>),
    Redundant(Option<u8>),
    Rejected(Option<u8>),
}

/// The sequential specification: one register holding an optional value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Register(Option<u8>);

impl SequentialSpec for Register {
    type Op = Op;
    type Ret = Ret;

    fn invoke(&mut self, op: &Op) -> Ret {
        match (*op, self.0) {
            (Op::Put(v), Some(cur)) if cur == v => Ret::Redundant(Some(cur)),
            (Op::Put(v), prev) => {
                self.0 = Some(v);
                Ret::Done(prev)
            }
            (Op::PutIfAbsent(v), None) => {
                self.0 = Some(v);
                Ret::Done(None)
            }
            (Op::PutIfAbsent(v), Some(cur)) if cur == v => Ret::Redundant(Some(cur)),
            (Op::PutIfAbsent(_), Some(cur)) => Ret::Rejected(Some(cur)),
            (Op::DeleteIfMatches(_), None) => Ret::Redundant(None),
            (Op::DeleteIfMatches(v), Some(cur)) if cur == v => {
                self.0 = None;
                Ret::Done(Some(cur))
            }
            (Op::DeleteIfMatches(_), Some(cur)) => Ret::Rejected(Some(cur)),
        }
    }
}

fn command(key: &str, op: Op) -> Command {
    match op {
        Op::Put(v) => Command::PutKv(PutKv {
            key: key.into(),
            value: vec![v],
        }),
        Op::PutIfAbsent(v) => Command::PutKvIfAbsent(PutKvIfAbsent {
            key: key.into(),
            value: vec![v],
        }),
        Op::DeleteIfMatches(v) => Command::DeleteKvIfMatches(DeleteKvIfMatches {
            key: key.into(),
            expected: vec![v],
        }),
    }
}

fn byte(v: &Option<Vec<u8>>) -> Option<u8> {
    v.as_ref().map(|v| v[0])
}

fn ret(result: &CommandResult) -> Ret {
    match result {
        Ok(Outcome::Done(Reply::Kv(r))) => Ret::Done(byte(&r.previous)),
        Ok(Outcome::Redundant(Reply::Kv(r))) => Ret::Redundant(byte(&r.previous)),
        Err(rejection) => Ret::Rejected(byte(&rejection.value)),
        other => panic!("unexpected KV result {other:?}"),
    }
}

type Tester = LinearizabilityTester<usize, Register>;

/// Rounds of small histories: the checker's search is exhaustive, so each history (one key,
/// one round) stays around a dozen operations.
async fn kv_operations_are_linearizable_under_faults(db: TestDb) {
    const ROUNDS: usize = 4;
    const KEYS: usize = 2;
    const CLIENTS: usize = 6;
    const OPS: usize = 4;
    let faults = Faults::new(42);
    let mut sinks = Vec::new();
    for node_id in 1..=3 {
        let store = db.faulty_store(&faults).await;
        sinks.push(Sink::start(store, config(node_id)).await.unwrap());
    }
    // Drops before and after COMMIT, statement errors on reads and writes.
    faults.set(60, 60, 30);
    for round in 0..ROUNDS {
        let testers: Arc<Vec<Mutex<Tester>>> = Arc::new(
            (0..KEYS)
                .map(|_| Mutex::new(LinearizabilityTester::new(Register::default())))
                .collect(),
        );
        let mut clients = Vec::new();
        for client in 0..CLIENTS {
            let sink = sinks[client % sinks.len()].clone();
            let testers = Arc::clone(&testers);
            clients.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64((round * 100 + client) as u64);
                for _ in 0..OPS {
                    let key = rng.random_range(0..KEYS);
                    let value = rng.random_range(0..3u8);
                    let op = match rng.random_range(0..3) {
                        0 => Op::Put(value),
                        1 => Op::PutIfAbsent(value),
                        _ => Op::DeleteIfMatches(value),
                    };
                    testers[key]
                        .lock()
                        .unwrap()
                        .on_invoke(client, op)
                        .expect("valid history");
                    let proposed = sink
                        .propose(command(&format!("lin-{round}-{key}"), op))
                        .await
                        .expect("retriable faults never fail a proposal");
                    testers[key]
                        .lock()
                        .unwrap()
                        .on_return(client, ret(&proposed.result))
                        .expect("valid history");
                }
            }));
        }
        for c in clients {
            c.await.unwrap();
        }
        for (key, tester) in testers.iter().enumerate() {
            let tester = tester.lock().unwrap();
            assert!(
                tester.is_consistent(),
                "round {round}, key {key}: history is not linearizable: {tester:?}"
            );
        }
    }
    faults.clear();
    assert!(faults.injected() > 0, "no fault was injected");
    for sink in &sinks {
        sink.shutdown().await;
    }
}
conformance!(kv_operations_are_linearizable_under_faults, multi_node);

/// The checker is not vacuous: a stale read-modify-write is caught.
#[test]
fn the_checker_rejects_a_lost_update() {
    let mut t: Tester = LinearizabilityTester::new(Register::default());
    t.on_invret(0, Op::PutIfAbsent(1), Ret::Done(None)).unwrap();
    // Strictly after: claims the register was empty.
    t.on_invret(1, Op::PutIfAbsent(2), Ret::Done(None)).unwrap();
    assert!(!t.is_consistent());
    let mut ok: Tester = LinearizabilityTester::new(Register::default());
    ok.on_invoke(0, Op::PutIfAbsent(1)).unwrap();
    ok.on_invret(1, Op::PutIfAbsent(2), Ret::Done(None))
        .unwrap();
    ok.on_return(0, Ret::Rejected(Some(2))).unwrap();
    assert!(
        ok.is_consistent(),
        "concurrent operations may order either way"
    );
}
