//! `metadata_version` gating: a command newer than some live node's binary is never proposed,
//! so that node is never fed a row it cannot read.

use std::time::Duration;

use mink_metadata::*;
use mink_sql::*;

use crate::harness::*;

fn producer_offsets() -> Command {
    Command::RegisterProducerOffsets(RegisterProducerOffsets {
        producer_id: "flink-sink-1".into(),
        offsets: vec![],
        ttl_ms: 60_000,
    })
}

/// A node supporting only the base command set, as the previous release would.
fn old_binary(node_id: u64) -> SinkConfig {
    let mut c = config(node_id);
    c.supported_metadata_version = 1;
    c.lease_enabled = false;
    c
}

async fn a_single_node_raises_the_version_it_supports(db: TestDb) {
    let sink = start(&db, config(1)).await;
    let mut applied = sink.lease();
    tokio::time::timeout(
        Duration::from_secs(5),
        applied.wait_for(|s| s.coordinator_epoch().is_some()),
    )
    .await
    .unwrap()
    .unwrap();
    eventually(
        "metadata_version reaches the binary's",
        Duration::from_secs(5),
        || sink.view().state.metadata_version == METADATA_VERSION,
    )
    .await;
    ok(&sink, producer_offsets()).await;
    sink.shutdown().await;
}
conformance!(a_single_node_raises_the_version_it_supports);

async fn an_old_binary_is_never_fed_a_newer_command(db: TestDb) {
    // The old node joins first, so the cluster can never move past what it reads.
    let old = start(&db, old_binary(2)).await;
    let new = start(&db, config(1)).await;
    tokio::time::timeout(
        Duration::from_secs(5),
        new.lease().wait_for(|s| s.coordinator_epoch().is_some()),
    )
    .await
    .unwrap()
    .unwrap();
    // The holder has looked at the versions the nodes support twice.
    tokio::time::timeout(
        Duration::from_secs(30),
        new.stats().reaches(|s| &s.maintenance_steps, 2),
    )
    .await
    .expect("the lease holder did not run two maintenance steps within 30 s");
    assert_eq!(
        new.view().state.metadata_version,
        1,
        "held back by the old node"
    );
    assert_eq!(
        new.propose(producer_offsets()).await,
        Err(SinkError::NotEnabled {
            command: "RegisterProducerOffsets",
            since: 2,
            current: 1
        })
    );
    assert!(old.halted().is_none());

    // The old node leaves (a rolling upgrade takes it down); the version rises.
    old.shutdown().await;
    eventually(
        "metadata_version rises to the new binary's",
        Duration::from_secs(5),
        || new.view().state.metadata_version == METADATA_VERSION,
    )
    .await;
    let (index, _) = ok(&new, producer_offsets()).await;

    // The old binary cannot come back: it refuses to start instead of misreading the log.
    let refused = Sink::start(db.store().await, old_binary(2)).await;
    match refused {
        Err(SinkError::Start(message)) => assert!(message.contains("upgrade"), "{message}"),
        other => panic!("the old binary started: {other:?}"),
    }
    // And the row it would have met is one it cannot decode.
    let store = db.store().await;
    let row = store
        .read_after(index - 1, 1, u64::MAX)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert!(decode_row(&row.payload, METADATA_VERSION).is_ok());
    assert!(matches!(
        decode_row(&row.payload, 1),
        Err(DecodeError::CommandTooNew {
            since: 2,
            supported: 1,
            ..
        })
    ));
    new.shutdown().await;
}
conformance!(an_old_binary_is_never_fed_a_newer_command, multi_node);
