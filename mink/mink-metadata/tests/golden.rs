//! Golden tests for apply: each scenario is a command sequence; its transcript (every result)
//! and the final state are compared with `tests/golden/<scenario>.txt`. Key expectations are
//! also asserted in code, so a regenerated golden file cannot hide a broken rule.
//!
//! Regenerate after an intended change with `MINK_BLESS=1 cargo nextest run -p mink-metadata`
//! and review the diff.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use common::*;
use mink_metadata::*;

struct Transcript {
    driver: Driver,
    out: String,
}

/// What a step is expected to produce.
#[derive(Clone, Copy, Debug)]
enum Want {
    Done,
    Redundant,
    Rejected(RejectionKind),
}

fn describe(result: &CommandResult) -> String {
    match result {
        Ok(Outcome::Done(r)) => format!("Done {r:?}"),
        Ok(Outcome::Redundant(r)) => format!("Redundant {r:?}"),
        Err(e) => format!("Rejected {e}"),
    }
}

impl Transcript {
    fn new() -> Self {
        Transcript {
            driver: Driver::default(),
            out: String::new(),
        }
    }

    /// Applies one command in its own row from `node` and checks the expectation.
    fn step(&mut self, node: NodeRef, command: Command, want: Want) {
        let _ = self.apply(node, command, want);
    }

    fn apply(&mut self, node: NodeRef, command: Command, want: Want) -> CommandResult {
        let name = command.name();
        let shown = format!("{command:?}");
        let outcome = self.driver.row(node, vec![command]).expect("not fatal");
        let result = outcome.results().expect("row results")[0].clone();
        let _ = writeln!(
            self.out,
            "#{} node {}/{}: {shown}\n    => {}",
            self.driver.index,
            node.node_id,
            node.node_epoch,
            describe(&result)
        );
        let ok = match (want, &result) {
            (Done, Ok(Outcome::Done(_))) => true,
            (Redundant, Ok(Outcome::Redundant(_))) => true,
            (Rejected(kind), Err(e)) => e.kind() == kind,
            _ => false,
        };
        assert!(ok, "{name}: wanted {want:?}, got {}", describe(&result));
        result
    }

    fn done(&mut self, node: NodeRef, command: Command) -> Reply {
        self.apply(node, command, Done).unwrap().into_reply()
    }

    fn finish(mut self, name: &str) {
        let _ = write!(self.out, "--- state ---\n{}", self.driver.state.render());
        // The state must also survive a snapshot round trip unchanged.
        let bytes = encode_snapshot(self.driver.index, &self.driver.state);
        let (index, decoded) = decode_snapshot(&bytes, METADATA_VERSION).unwrap();
        assert_eq!((index, &decoded), (self.driver.index, &self.driver.state));
        // At run time: a shared target directory may hold a binary built from another checkout.
        let path = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
            .join("tests/golden")
            .join(format!("{name}.txt"));
        if std::env::var("MINK_BLESS").is_ok() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &self.out).unwrap();
            return;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("{} missing: run with MINK_BLESS=1", path.display()));
        if expected != self.out {
            let first = expected
                .lines()
                .zip(self.out.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(expected.lines().count().min(self.out.lines().count()));
            panic!(
                "golden {name} differs at line {}:\n expected: {:?}\n      got: {:?}\n(rerun with MINK_BLESS=1 if intended)",
                first + 1,
                expected.lines().nth(first),
                self.out.lines().nth(first)
            );
        }
    }
}

use Want::*;

#[test]
fn nodes_and_streams() {
    let mut t = Transcript::new();
    t.done(N1, register(N1));
    t.step(N1, register(N1), Redundant);
    // Another process claiming node 1 at the same epoch (another incarnation) is refused.
    let mut impostor = register(N1);
    if let Command::RegisterNode(r) = &mut impostor {
        r.incarnation = 999;
    }
    t.step(N2, impostor, Rejected(RejectionKind::NodeFenced));
    t.done(N2, register(N2));
    let Reply::Range(streams) = t.done(N1, Command::CreateStreams(CreateStreams { count: 2 }))
    else {
        panic!()
    };
    assert_eq!((streams.start, streams.end), (1, 3));
    t.step(N1, open(N1, 1, 0), Rejected(RejectionKind::InvalidArgument));
    t.done(N1, open(N1, 1, 1));
    t.step(N1, open(N1, 1, 1), Redundant);
    t.step(N2, open(N2, 1, 1), Rejected(RejectionKind::StreamFenced));
    t.done(N1, open(N1, 2, 1));
    let Reply::Range(objects) = t.done(N1, prepare(N1, 3)) else {
        panic!()
    };
    assert_eq!((objects.start, objects.end), (1, 4));
    // Object 1: both streams commit.
    let writer = WriterRange {
        writer_id: 7,
        writer_epoch: 0,
        first_sequence: 0,
        last_sequence: 4,
        base_offset: 0,
        end_offset: 5,
    };
    let mut with_writer = range(1, 1, 0, 10);
    with_writer.writers.push(writer.clone());
    t.done(N1, commit(N1, 1, vec![with_writer, range(2, 1, 0, 4)]));
    t.step(N1, commit(N1, 1, vec![range(1, 1, 10, 12)]), Redundant);
    // N2 takes stream 2 over at epoch 2: object 2's range of stream 2 is dropped, stream 1's
    // commits.
    t.done(N2, open(N2, 2, 2));
    let Reply::Commit(reply) = t.done(
        N1,
        commit(N1, 2, vec![range(1, 1, 10, 20), range(2, 1, 4, 8)]),
    ) else {
        panic!()
    };
    assert!(reply.ranges[0].rejection.is_none());
    assert_eq!(
        reply.ranges[1].rejection.as_ref().unwrap().kind(),
        RejectionKind::StreamFenced
    );
    // A gap in offsets is refused per range; a repeated writer sequence too.
    t.done(N2, prepare(N2, 1));
    let mut dup = range(1, 1, 20, 25);
    dup.writers.push(WriterRange {
        first_sequence: 3,
        last_sequence: 5,
        base_offset: 20,
        end_offset: 25,
        ..writer
    });
    let Reply::Commit(reply) = t.done(N1, commit(N1, 3, vec![dup])) else {
        panic!()
    };
    assert_eq!(
        reply.ranges[0].rejection.as_ref().unwrap().kind(),
        RejectionKind::Conflict
    );
    let Reply::Commit(reply) = t.done(N2, commit(N2, 4, vec![range(2, 2, 5, 9)])) else {
        panic!()
    };
    assert_eq!(
        reply.ranges[0].rejection.as_ref().unwrap().kind(),
        RejectionKind::Conflict
    );
    t.step(
        N1,
        commit(N1, 4, vec![range(1, 1, 20, 21)]),
        Rejected(RejectionKind::InvalidArgument),
    );
    // Trims: never past the end; a trim past a whole range drops it.
    t.step(
        N1,
        trim(N1, 1, 1, 21),
        Rejected(RejectionKind::InvalidArgument),
    );
    t.done(N1, trim(N1, 1, 1, 12));
    t.step(N1, trim(N1, 1, 1, 5), Redundant);
    t.step(
        N2,
        trim(N2, 1, 1, 15),
        Rejected(RejectionKind::StreamFenced),
    );
    // Placement and transfer.
    let c = |epoch| coordinator(N1, epoch);
    t.done(N1, c(1));
    t.done(
        N1,
        Command::PlaceStream(PlaceStream {
            coordinator_epoch: 1,
            stream_id: 1,
            node_id: 1,
        }),
    );
    t.step(
        N1,
        Command::PlaceStream(PlaceStream {
            coordinator_epoch: 1,
            stream_id: 1,
            node_id: 1,
        }),
        Redundant,
    );
    t.step(
        N1,
        Command::PlaceStream(PlaceStream {
            coordinator_epoch: 9,
            stream_id: 1,
            node_id: 1,
        }),
        Rejected(RejectionKind::CoordinatorFenced),
    );
    t.done(
        N1,
        Command::TransferStream(TransferStream {
            coordinator_epoch: 1,
            stream_id: 1,
            from_node_id: 1,
            to_node_id: 2,
        }),
    );
    t.step(
        N2,
        Command::CompleteTransfer(CompleteTransfer {
            node_id: 2,
            node_epoch: 1,
            stream_id: 1,
            stream_epoch: 1,
        }),
        Rejected(RejectionKind::StreamFenced),
    );
    t.done(N2, open(N2, 1, 2));
    t.done(
        N2,
        Command::CompleteTransfer(CompleteTransfer {
            node_id: 2,
            node_epoch: 1,
            stream_id: 1,
            stream_epoch: 2,
        }),
    );
    t.step(
        N2,
        Command::CompleteTransfer(CompleteTransfer {
            node_id: 2,
            node_epoch: 1,
            stream_id: 1,
            stream_epoch: 2,
        }),
        Redundant,
    );
    // Close, then delete: objects only that stream referenced are destroyed.
    t.done(
        N2,
        Command::CloseStream(CloseStream {
            node_id: 2,
            node_epoch: 1,
            stream_id: 2,
            stream_epoch: 2,
        }),
    );
    t.step(
        N2,
        Command::CloseStream(CloseStream {
            node_id: 2,
            node_epoch: 1,
            stream_id: 2,
            stream_epoch: 2,
        }),
        Redundant,
    );
    t.done(
        N2,
        Command::DeleteStream(DeleteStream {
            node_id: 2,
            node_epoch: 1,
            stream_id: 2,
            stream_epoch: 2,
        }),
    );
    t.step(
        N2,
        Command::DeleteStream(DeleteStream {
            node_id: 2,
            node_epoch: 1,
            stream_id: 2,
            stream_epoch: 2,
        }),
        Redundant,
    );
    let state = &t.driver.state;
    assert_eq!(
        state.objects[&1].state(),
        ObjectState::Destroyed,
        "trimmed and deleted away"
    );
    assert_eq!(
        state.objects[&2].state(),
        ObjectState::Committed,
        "stream 1 still uses object 2"
    );
    assert_eq!(state.streams[&1].start_offset, 12);
    assert_eq!(state.streams[&1].end_offset, 20);
    t.finish("nodes_and_streams");
}

#[test]
fn catalog_and_buckets() {
    let mut t = Transcript::new();
    t.done(N1, register(N1));
    t.done(N2, register(N2));
    t.done(N1, coordinator(N1, 1));
    t.step(
        N1,
        log_table("db", "events", 2),
        Rejected(RejectionKind::NotFound),
    );
    t.done(N1, database("db"));
    t.step(N1, database("db"), Redundant);
    t.step(
        N1,
        Command::CreateDatabase(CreateDatabase {
            name: "db".into(),
            comment: "other".into(),
            ..Default::default()
        }),
        Rejected(RejectionKind::AlreadyExists),
    );
    t.step(
        N1,
        database("bad/name"),
        Rejected(RejectionKind::InvalidArgument),
    );
    let Reply::Table(events) = t.done(N1, log_table("db", "events", 2)) else {
        panic!()
    };
    assert_eq!(
        (events.table_id, events.first_stream_id, events.stream_count),
        (1, 1, 2)
    );
    t.step(N1, log_table("db", "events", 2), Redundant);
    t.step(
        N1,
        log_table("db", "events", 3),
        Rejected(RejectionKind::AlreadyExists),
    );
    t.step(
        N1,
        log_table("db", "zero", 0),
        Rejected(RejectionKind::InvalidArgument),
    );
    // Primary-key tables: partition keys in the key, bucket key in the key without them.
    let bad_partition = Command::CreateTable(CreateTable {
        database: "db".into(),
        name: "p".into(),
        primary_key: vec!["id".into()],
        partition_keys: vec!["day".into()],
        bucket_count: 1,
        ..Default::default()
    });
    t.step(N1, bad_partition, Rejected(RejectionKind::InvalidArgument));
    let bad_bucket = Command::CreateTable(CreateTable {
        database: "db".into(),
        name: "p".into(),
        primary_key: vec!["id".into(), "day".into()],
        partition_keys: vec!["day".into()],
        bucket_key: vec!["day".into()],
        bucket_count: 1,
        ..Default::default()
    });
    t.step(N1, bad_bucket, Rejected(RejectionKind::InvalidArgument));
    let Reply::Table(users) = t.done(
        N1,
        pk_table("db", "users", 1, &[("table.datalake.enabled", "true")]),
    ) else {
        panic!()
    };
    let partitioned = Command::CreateTable(CreateTable {
        database: "db".into(),
        name: "daily".into(),
        primary_key: vec!["id".into(), "day".into()],
        partition_keys: vec!["day".into()],
        bucket_key: vec!["id".into()],
        bucket_count: 2,
        ..Default::default()
    });
    let Reply::Table(daily) = t.done(N1, partitioned) else {
        panic!()
    };
    assert_eq!(
        daily.stream_count, 0,
        "partitioned tables get buckets per partition"
    );
    let part = |name: &str, day: &str| {
        Command::CreatePartition(CreatePartition {
            table_id: daily.table_id,
            name: name.into(),
            values: BTreeMap::from([("day".into(), day.into())]),
        })
    };
    t.step(
        N1,
        Command::CreatePartition(CreatePartition {
            table_id: events.table_id,
            name: "x".into(),
            values: BTreeMap::new(),
        }),
        Rejected(RejectionKind::InvalidArgument),
    );
    let Reply::Table(p1) = t.done(N1, part("day=2026-11-29", "2026-11-29")) else {
        panic!()
    };
    assert_eq!(p1.stream_count, 2);
    t.step(N1, part("day=2026-11-29", "2026-11-29"), Redundant);
    t.step(
        N1,
        part("day=2026-11-29", "2026-11-30"),
        Rejected(RejectionKind::AlreadyExists),
    );
    // Leaders: the coordinator assigns, leader epochs rise, the leader opens at its epoch.
    let users_stream = users.first_stream_id;
    t.step(
        N1,
        open(N1, users_stream, 1),
        Rejected(RejectionKind::NotLeader),
    );
    let Reply::Epoch(e) = t.done(N1, lead(1, users.table_id, 0, 0, 1)) else {
        panic!()
    };
    assert_eq!(e, 1);
    t.step(N1, lead(1, users.table_id, 0, 0, 1), Redundant);
    t.step(
        N1,
        open(N1, users_stream, 2),
        Rejected(RejectionKind::LeaderFenced),
    );
    t.done(N1, open(N1, users_stream, 1));
    t.done(N1, prepare(N1, 4));
    t.done(N1, commit(N1, 1, vec![range(users_stream, 1, 0, 100)]));
    // KV snapshots: only the leader at its epoch, offsets within the committed end, rising.
    let snap = |node: NodeRef, epoch, id, offset| {
        Command::CommitKvSnapshot(CommitKvSnapshot {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            table_id: users.table_id,
            partition_id: 0,
            bucket: 0,
            leader_epoch: epoch,
            snapshot_id: id,
            log_offset: offset,
            location: format!("kv/{id}"),
            size_bytes: 10,
        })
    };
    t.step(
        N2,
        snap(N2, 1, 1, 50),
        Rejected(RejectionKind::LeaderFenced),
    );
    t.step(
        N1,
        snap(N1, 1, 1, 101),
        Rejected(RejectionKind::InvalidArgument),
    );
    t.done(N1, snap(N1, 1, 1, 40));
    t.step(N1, snap(N1, 1, 1, 40), Redundant);
    t.step(N1, snap(N1, 1, 2, 30), Rejected(RejectionKind::Conflict));
    t.done(N1, snap(N1, 1, 2, 60));
    // Trim floors: the KV snapshot (60) and the tiered offset (0 until the lake commits).
    t.step(
        N1,
        trim(N1, users_stream, 1, 30),
        Rejected(RejectionKind::BelowFloor),
    );
    let lake = |id, offset| {
        Command::CommitLakeSnapshot(CommitLakeSnapshot {
            coordinator_epoch: 1,
            table_id: users.table_id,
            snapshot_id: id,
            metadata_location: format!("s3://lake/{id}.json"),
            bucket_offsets: vec![BucketOffset {
                partition_id: 0,
                bucket: 0,
                offset,
                ..Default::default()
            }],
        })
    };
    t.step(N1, lake(1, 101), Rejected(RejectionKind::InvalidArgument));
    t.done(N1, lake(1, 50));
    t.step(N1, lake(1, 50), Redundant);
    t.step(N1, lake(2, 20), Rejected(RejectionKind::Conflict));
    t.done(N1, trim(N1, users_stream, 1, 50));
    t.step(
        N1,
        trim(N1, users_stream, 1, 55),
        Rejected(RejectionKind::BelowFloor),
    );
    t.done(N1, lake(2, 90));
    t.done(N1, trim(N1, users_stream, 1, 60));
    // Disabling the lake (a rule of metadata_version 4): its record goes, so reads and
    // retention are the log's; a round recorded late is refused; enabling again starts with
    // no record (the lake's own summary says where it resumes).
    t.done(
        N1,
        Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
            coordinator_epoch: 1,
            version: LAKE_DISABLE_VERSION,
        }),
    );
    let lake_enabled = |value: &str| {
        Command::AlterTable(AlterTable {
            table_id: users.table_id,
            set_options: [("table.datalake.enabled".to_string(), value.to_string())].into(),
            reset_options: vec![],
            new_schema: vec![],
            expected_schema_version: 0,
        })
    };
    t.done(N1, lake_enabled("false"));
    assert!(!t.driver.state.lake_snapshots.contains_key(&users.table_id));
    t.step(N1, lake(3, 95), Rejected(RejectionKind::InvalidArgument));
    t.done(N1, lake_enabled("true"));
    assert!(!t.driver.state.lake_snapshots.contains_key(&users.table_id));
    t.done(N1, lake(3, 95));
    let drop_snap = |id| {
        Command::DropKvSnapshot(DropKvSnapshot {
            coordinator_epoch: 1,
            table_id: users.table_id,
            partition_id: 0,
            bucket: 0,
            snapshot_id: id,
        })
    };
    t.step(N1, drop_snap(2), Rejected(RejectionKind::Conflict));
    t.done(N1, drop_snap(1));
    t.step(N1, drop_snap(1), Redundant);
    // A new leader: the old one is fenced from the stream and from snapshots.
    let Reply::Epoch(e2) = t.done(N1, lead(1, users.table_id, 0, 0, 2)) else {
        panic!()
    };
    assert_eq!(e2, 2);
    t.done(N2, open(N2, users_stream, 2));
    t.step(
        N1,
        snap(N1, 1, 3, 90),
        Rejected(RejectionKind::LeaderFenced),
    );
    // Alter: options and schema with an expected version; immutable options refused.
    let alter = |set: &[(&str, &str)], schema: &[u8], expected| {
        Command::AlterTable(AlterTable {
            table_id: events.table_id,
            set_options: set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            reset_options: vec![],
            new_schema: schema.to_vec(),
            expected_schema_version: expected,
        })
    };
    t.step(
        N1,
        alter(&[("bucket.num", "8")], b"", 0),
        Rejected(RejectionKind::InvalidArgument),
    );
    t.done(N1, alter(&[("table.log.ttl", "1d")], b"", 0));
    t.step(N1, alter(&[("table.log.ttl", "1d")], b"", 0), Redundant);
    t.step(
        N1,
        alter(&[], b"schema-v2", 7),
        Rejected(RejectionKind::Conflict),
    );
    t.done(N1, alter(&[], b"schema-v2", 1));
    assert_eq!(t.driver.state.tables[&events.table_id].schema_version, 2);
    // Drops.
    t.done(
        N1,
        Command::DropPartition(DropPartition {
            table_id: daily.table_id,
            name: "day=2026-11-29".into(),
        }),
    );
    t.step(
        N1,
        Command::DropPartition(DropPartition {
            table_id: daily.table_id,
            name: "day=2026-11-29".into(),
        }),
        Redundant,
    );
    t.step(
        N1,
        Command::DropDatabase(DropDatabase {
            name: "db".into(),
            cascade: false,
        }),
        Rejected(RejectionKind::NotEmpty),
    );
    t.done(
        N1,
        Command::DropTable(DropTable {
            database: "db".into(),
            name: "events".into(),
        }),
    );
    t.step(
        N1,
        Command::DropTable(DropTable {
            database: "db".into(),
            name: "events".into(),
        }),
        Redundant,
    );
    t.done(
        N1,
        Command::DropDatabase(DropDatabase {
            name: "db".into(),
            cascade: true,
        }),
    );
    let state = &t.driver.state;
    assert!(state.tables.is_empty() && state.buckets.is_empty() && state.streams.is_empty());
    assert!(state.kv_snapshots.is_empty() && state.lake_snapshots.is_empty());
    assert!(
        state
            .objects
            .values()
            .all(|o| o.state() != ObjectState::Committed),
        "nothing references the objects"
    );
    t.finish("catalog_and_buckets");
}

#[test]
fn kv_allocation_and_offsets() {
    let mut t = Transcript::new();
    t.done(N1, register(N1));
    t.done(N1, put("a", "1"));
    t.step(N1, put("a", "1"), Redundant);
    t.done(N1, put("a", "2"));
    let if_absent = |k: &str, v: &str| {
        Command::PutKvIfAbsent(PutKvIfAbsent {
            key: k.into(),
            value: v.as_bytes().to_vec(),
        })
    };
    let if_matches = |k: &str, v: &str| {
        Command::DeleteKvIfMatches(DeleteKvIfMatches {
            key: k.into(),
            expected: v.as_bytes().to_vec(),
        })
    };
    let e = t
        .apply(
            N1,
            if_absent("a", "3"),
            Rejected(RejectionKind::AlreadyExists),
        )
        .unwrap_err();
    assert_eq!(e.value.as_deref(), Some(&b"2"[..]));
    t.step(N1, if_absent("a", "2"), Redundant);
    t.done(N1, if_absent("b", "1"));
    t.step(N1, if_matches("a", "1"), Rejected(RejectionKind::Conflict));
    t.done(N1, if_matches("a", "2"));
    t.step(N1, if_matches("a", "2"), Redundant);
    t.done(N1, Command::DeleteKv(DeleteKv { key: "b".into() }));
    t.step(
        N1,
        Command::DeleteKv(DeleteKv { key: "b".into() }),
        Redundant,
    );
    // Allocation: ids and auto-increment ranges.
    let alloc = |s: &str, n| {
        Command::Allocate(Allocate {
            sequence: s.into(),
            count: n,
        })
    };
    let Reply::Range(r) = t.done(N1, alloc("table/1/auto_increment/id", 100)) else {
        panic!()
    };
    assert_eq!((r.start, r.end), (1, 101));
    let Reply::Range(r) = t.done(N1, alloc("table/1/auto_increment/id", 5)) else {
        panic!()
    };
    assert_eq!((r.start, r.end), (101, 106));
    t.step(N1, alloc("x", 0), Rejected(RejectionKind::InvalidArgument));
    let Reply::Range(r) = t.done(
        N1,
        Command::AllocateProducerIds(AllocateProducerIds { count: 3 }),
    ) else {
        panic!()
    };
    assert_eq!((r.start, r.end), (1, 4));
    // Group offsets (need a table).
    t.done(N1, coordinator(N1, 1));
    t.done(N1, database("db"));
    t.done(N1, log_table("db", "events", 2));
    let commit_offsets = |group: &str, offset| {
        Command::CommitGroupOffsets(CommitGroupOffsets {
            group_id: group.into(),
            offsets: vec![
                GroupOffset {
                    table_id: 1,
                    partition_id: 0,
                    bucket: 0,
                    offset,
                    leader_epoch: -1,
                    metadata: String::new(),
                },
                GroupOffset {
                    table_id: 1,
                    partition_id: 0,
                    bucket: 1,
                    offset,
                    leader_epoch: -1,
                    metadata: "m".into(),
                },
            ],
            coordinator_epoch: 0,
        })
    };
    t.done(N1, commit_offsets("g1", 10));
    t.done(N1, commit_offsets("g2", 20));
    t.step(
        N1,
        Command::CommitGroupOffsets(CommitGroupOffsets {
            group_id: "g1".into(),
            offsets: vec![GroupOffset {
                table_id: 9,
                ..Default::default()
            }],
            coordinator_epoch: 0,
        }),
        Rejected(RejectionKind::NotFound),
    );
    t.done(
        N1,
        Command::DeleteGroupOffsets(DeleteGroupOffsets {
            group_id: "g2".into(),
            buckets: vec![TableBucket {
                table_id: 1,
                partition_id: 0,
                bucket: 1,
            }],
        }),
    );
    t.step(
        N1,
        Command::DeleteGroupOffsets(DeleteGroupOffsets {
            group_id: "nobody".into(),
            buckets: vec![],
        }),
        Redundant,
    );
    let expire_groups = |epoch, now| {
        Command::ExpireGroupOffsets(ExpireGroupOffsets {
            coordinator_epoch: epoch,
            now_ms: now,
            retention_ms: 1_000,
        })
    };
    t.step(
        N1,
        expire_groups(2, 1_000_000),
        Rejected(RejectionKind::CoordinatorFenced),
    );
    t.step(N1, expire_groups(1, 1_000), Redundant);
    let Reply::Count(n) = t.done(N1, expire_groups(1, 1_000_000)) else {
        panic!()
    };
    assert_eq!(n, 3);
    // Producer offsets are gated by metadata_version 2.
    let register_offsets = |id: &str, ttl| {
        Command::RegisterProducerOffsets(RegisterProducerOffsets {
            producer_id: id.into(),
            offsets: vec![TableBucketOffset {
                table_id: 1,
                partition_id: 0,
                bucket: 0,
                offset: 5,
            }],
            ttl_ms: ttl,
        })
    };
    t.step(
        N1,
        register_offsets("p", 100),
        Rejected(RejectionKind::NotEnabled),
    );
    t.done(
        N1,
        Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
            coordinator_epoch: 1,
            version: 2,
        }),
    );
    t.step(
        N1,
        Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
            coordinator_epoch: 1,
            version: 1,
        }),
        Redundant,
    );
    t.done(N1, register_offsets("p", 100));
    t.step(N1, register_offsets("p", 100), Redundant);
    t.step(
        N1,
        register_offsets("p", 200),
        Rejected(RejectionKind::AlreadyExists),
    );
    t.done(N1, register_offsets("q", 1_000_000));
    t.done(
        N1,
        Command::DeleteProducerOffsets(DeleteProducerOffsets {
            producer_id: "q".into(),
        }),
    );
    t.step(
        N1,
        Command::DeleteProducerOffsets(DeleteProducerOffsets {
            producer_id: "q".into(),
        }),
        Redundant,
    );
    let Reply::Count(n) = t.done(
        N1,
        Command::ExpireProducerOffsets(ExpireProducerOffsets {
            coordinator_epoch: 1,
            now_ms: 1_000_000,
        }),
    ) else {
        panic!()
    };
    assert_eq!(n, 1);
    t.finish("kv_allocation_and_offsets");
}

#[test]
fn compaction_and_object_lifecycle() {
    let mut t = Transcript::new();
    t.done(N1, register(N1));
    t.done(N1, coordinator(N1, 1));
    t.done(N1, Command::CreateStreams(CreateStreams { count: 2 }));
    t.done(N1, open(N1, 1, 1));
    t.done(N1, open(N1, 2, 1));
    t.done(N1, prepare(N1, 6));
    t.done(
        N1,
        commit(N1, 1, vec![range(1, 1, 0, 10), range(2, 1, 0, 5)]),
    );
    t.done(
        N1,
        commit(N1, 2, vec![range(1, 1, 10, 20), range(2, 1, 5, 8)]),
    );
    // Merge objects 1 and 2 into object 3.
    let compact = |object_id, ranges, sources: Vec<u64>| {
        Command::CommitStreamSetObject(CommitStreamSetObject {
            node_id: 1,
            node_epoch: 1,
            object_id,
            object_size: 4096,
            ranges,
            compacted_object_ids: sources,
        })
    };
    t.step(
        N1,
        compact(3, vec![range(1, 1, 0, 15)], vec![1, 2]),
        Rejected(RejectionKind::Conflict),
    );
    t.step(
        N1,
        compact(3, vec![range(1, 1, 0, 20)], vec![1]),
        Rejected(RejectionKind::Conflict),
    );
    // Starting inside a range would credit object 3 with offsets it does not hold.
    t.step(
        N1,
        compact(3, vec![range(1, 1, 5, 20)], vec![1, 2]),
        Rejected(RejectionKind::Conflict),
    );
    t.done(
        N1,
        compact(3, vec![range(1, 1, 0, 20), range(2, 1, 0, 8)], vec![1, 2]),
    );
    let objects = &t.driver.state.objects;
    assert_eq!(objects[&1].state(), ObjectState::Destroyed);
    assert_eq!(objects[&2].state(), ObjectState::Destroyed);
    assert_eq!(objects[&3].live_ranges, 2);
    // Split stream 1 out into a stream object.
    t.done(N1, stream_object(4, 0, 20, vec![3]));
    t.step(N1, stream_object(4, 0, 20, vec![3]), Redundant);
    assert_eq!(
        t.driver.state.objects[&3].live_ranges, 1,
        "stream 2 still lives in 3"
    );
    assert_eq!(t.driver.state.objects[&4].kind(), ObjectKind::Stream);
    // Trimming into the middle of a range keeps it; past its end drops it.
    t.done(N1, trim(N1, 2, 1, 6));
    assert_eq!(t.driver.state.objects[&3].state(), ObjectState::Committed);
    t.done(N1, trim(N1, 2, 1, 8));
    assert_eq!(t.driver.state.objects[&3].state(), ObjectState::Destroyed);
    // Prepared ids expire; an expired id cannot be committed.
    let expire = |now| {
        Command::ExpirePreparedObjects(ExpirePreparedObjects {
            coordinator_epoch: 1,
            now_ms: now,
        })
    };
    t.step(N1, expire(1), Redundant);
    let Reply::Count(n) = t.done(N1, expire(60_000)) else {
        panic!()
    };
    assert_eq!(n, 2, "objects 5 and 6");
    t.step(
        N1,
        commit(N1, 5, vec![range(1, 1, 20, 30)]),
        Rejected(RejectionKind::Expired),
    );
    // Cleaning forgets destroyed objects only.
    let clean = |ids: Vec<u64>| {
        Command::CleanDestroyedObjects(CleanDestroyedObjects {
            coordinator_epoch: 1,
            object_ids: ids,
        })
    };
    t.step(N1, clean(vec![1, 4]), Rejected(RejectionKind::Conflict));
    let Reply::Count(n) = t.done(N1, clean(vec![1, 2, 3, 5, 6])) else {
        panic!()
    };
    assert_eq!(n, 5);
    t.step(N1, clean(vec![1, 2]), Redundant);
    t.finish("compaction_and_object_lifecycle");
}

#[test]
fn rows_tokens_and_fencing() {
    let mut t = Transcript::new();
    t.done(N1, register(N1));
    // A resend of the same row (same token) is a duplicate answered with the first results.
    let row = Row {
        token: RowToken {
            node_id: 1,
            node_epoch: 1,
            incarnation: 1001,
            sequence: 50,
        },
        proposed_at_ms: 5,
        commands: vec![put("k", "v"), put("k", "w")],
    };
    let first = t.driver.apply(&row).unwrap();
    let second = t.driver.apply(&row).unwrap();
    assert!(matches!(first, RowOutcome::Applied(_)));
    assert_eq!(
        second,
        RowOutcome::Duplicate(first.results().map(<[_]>::to_vec))
    );
    let older = Row {
        token: RowToken {
            sequence: 49,
            ..row.token
        },
        ..row.clone()
    };
    assert_eq!(t.driver.apply(&older).unwrap(), RowOutcome::Duplicate(None));
    // Node 1 restarts at epoch 2: rows of epoch 1 are fenced whole; so are rows of another
    // incarnation claiming epoch 2.
    let n1e2 = NodeRef {
        node_id: 1,
        node_epoch: 2,
    };
    t.done(n1e2, register(n1e2));
    let stale = Row {
        token: RowToken {
            sequence: 51,
            ..row.token
        },
        ..row.clone()
    };
    let fenced = t.driver.apply(&stale).unwrap();
    assert!(
        matches!(fenced, RowOutcome::Fenced(ref r) if r.iter().all(|r| r.as_ref().unwrap_err().kind() == RejectionKind::NodeFenced))
    );
    let impostor = Row {
        token: RowToken {
            node_id: 1,
            node_epoch: 2,
            incarnation: 77,
            sequence: 1,
        },
        ..row.clone()
    };
    assert!(matches!(
        t.driver.apply(&impostor).unwrap(),
        RowOutcome::Fenced(_)
    ));
    assert_eq!(
        t.driver.state.kv["k"].value, b"w",
        "fenced rows changed nothing"
    );
    // Commands carrying the old identity are refused even in a valid row.
    t.step(n1e2, prepare(N1, 1), Rejected(RejectionKind::NodeFenced));
    t.step(
        n1e2,
        prepare(
            NodeRef {
                node_id: 1,
                node_epoch: 3,
            },
            1,
        ),
        Rejected(RejectionKind::InvalidArgument),
    );
    t.step(
        n1e2,
        prepare(
            NodeRef {
                node_id: 9,
                node_epoch: 1,
            },
            1,
        ),
        Rejected(RejectionKind::NotFound),
    );
    // Coordinator registration: terms rise; a lower term is refused; a restarted holder's
    // epoch is void.
    t.done(n1e2, coordinator(n1e2, 3));
    t.step(n1e2, coordinator(n1e2, 3), Redundant);
    t.step(N2, register(N2), Done);
    t.step(
        N2,
        coordinator(N2, 2),
        Rejected(RejectionKind::CoordinatorFenced),
    );
    t.done(N2, coordinator(N2, 4));
    let n1e3 = NodeRef {
        node_id: 1,
        node_epoch: 3,
    };
    t.done(n1e3, register(n1e3));
    t.done(n1e3, coordinator(n1e3, 5));
    let n1e4 = NodeRef {
        node_id: 1,
        node_epoch: 4,
    };
    t.done(n1e4, register(n1e4));
    t.step(
        n1e4,
        Command::ExpirePreparedObjects(ExpirePreparedObjects {
            coordinator_epoch: 5,
            now_ms: 0,
        }),
        Rejected(RejectionKind::CoordinatorFenced),
    );
    t.finish("rows_tokens_and_fencing");
}

#[test]
fn metadata_version_gate_and_fatal_rows() {
    let mut driver = Driver::default();
    driver.one(register(N1)).unwrap();
    driver.one(coordinator(N1, 1)).unwrap();
    // An old binary (supports 1) meets an upgrade to 2 that is refused anyway (stale
    // coordinator epoch): there is nothing to follow, so it carries on.
    driver.supported = 1;
    let stale = Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
        coordinator_epoch: 7,
        version: 2,
    });
    let e = driver.one(stale).unwrap_err();
    assert_eq!(e.kind(), RejectionKind::CoordinatorFenced);
    // One that applies: it must stop, not diverge.
    let upgrade = Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
        coordinator_epoch: 1,
        version: 2,
    });
    let before = driver.state.clone();
    let fatal = driver
        .row(N1, vec![put("x", "1"), upgrade.clone()])
        .unwrap_err();
    assert_eq!(
        fatal,
        Fatal::UnsupportedVersion {
            version: 2,
            supported: 1
        }
    );
    assert_eq!(driver.state, before, "a fatal row changes nothing");
    driver.supported = METADATA_VERSION;
    driver.one(upgrade).unwrap();
    assert_eq!(driver.state.metadata_version, 2);
    // A node whose binary is older than the cluster cannot register.
    let mut old = RegisterNode {
        node_id: 5,
        node_epoch: 1,
        incarnation: 1,
        address: String::new(),
        supported_metadata_version: 1,
        listeners: BTreeMap::from([("kafka".to_string(), "10.0.0.5:9092".to_string())]),
    };
    let e = driver.one(Command::RegisterNode(old.clone())).unwrap_err();
    assert_eq!(e.kind(), RejectionKind::NotEnabled);
    old.supported_metadata_version = 2;
    assert!(driver.one(Command::RegisterNode(old.clone())).is_ok());
    // Listener addresses are a rule of version 3: before it, every node (old binaries
    // included) builds the same state without them.
    assert!(driver.state.nodes[&5].listeners.is_empty());
    driver
        .one(Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
            coordinator_epoch: 1,
            version: 3,
        }))
        .unwrap();
    old.node_epoch = 2;
    old.supported_metadata_version = 3;
    driver.one(Command::RegisterNode(old.clone())).unwrap();
    assert_eq!(
        driver.state.nodes[&5]
            .listeners
            .get("kafka")
            .map(String::as_str),
        Some("10.0.0.5:9092")
    );
    // The same process may restate them (a node registered before the upgrade does).
    old.listeners
        .insert("flight".to_string(), "10.0.0.5:7171".to_string());
    let restated = driver.one(Command::RegisterNode(old.clone())).unwrap();
    assert!(!restated.is_redundant(), "{restated:?}");
    assert_eq!(driver.state.nodes[&5].listeners.len(), 2);
    assert!(
        driver
            .one(Command::RegisterNode(old))
            .unwrap()
            .is_redundant()
    );
}

#[test]
fn hostile_writer_sequences_are_rejected_not_a_panic() {
    let mut d = Driver::default();
    d.one(register(N1)).unwrap();
    d.one(Command::CreateStreams(CreateStreams { count: 1 }))
        .unwrap();
    d.one(open(N1, 1, 1)).unwrap();
    d.one(prepare(N1, 2)).unwrap();
    let batch = |first, last, base, end| WriterRange {
        writer_id: 1,
        writer_epoch: 1,
        first_sequence: first,
        last_sequence: last,
        base_offset: base,
        end_offset: end,
    };
    let mut r = range(1, 1, 0, 1);
    r.writers.push(batch(u64::MAX, u64::MAX, 0, 1));
    d.one(commit(N1, 1, vec![r])).unwrap();
    let mut r = range(1, 1, 1, 2);
    r.writers.push(batch(0, 0, 1, 2));
    let Ok(Outcome::Done(Reply::Commit(reply))) = d.one(commit(N1, 2, vec![r])) else {
        panic!("commit answered");
    };
    assert_eq!(
        reply.ranges[0].rejection.as_ref().unwrap().kind(),
        RejectionKind::Conflict
    );
}

#[test]
fn a_writer_may_have_several_batches_in_one_commit() {
    let mut d = Driver::default();
    d.one(register(N1)).unwrap();
    d.one(Command::CreateStreams(CreateStreams { count: 1 }))
        .unwrap();
    d.one(open(N1, 1, 1)).unwrap();
    d.one(prepare(N1, 2)).unwrap();
    let batch = |first, last, base, end| WriterRange {
        writer_id: 3,
        writer_epoch: 1,
        first_sequence: first,
        last_sequence: last,
        base_offset: base,
        end_offset: end,
    };
    let mut r = range(1, 1, 0, 3);
    r.writers = vec![batch(0, 0, 0, 1), batch(1, 2, 1, 3)];
    let Ok(Outcome::Done(Reply::Commit(reply))) = d.one(commit(N1, 1, vec![r])) else {
        panic!("commit answered");
    };
    assert!(reply.ranges[0].rejection.is_none(), "{reply:?}");
    // Still checked in order: a gap inside one commit is refused.
    let mut r = range(1, 1, 3, 5);
    r.writers = vec![batch(3, 3, 3, 4), batch(5, 5, 4, 5)];
    let Ok(Outcome::Done(Reply::Commit(reply))) = d.one(commit(N1, 2, vec![r])) else {
        panic!("commit answered");
    };
    assert_eq!(
        reply.ranges[0].rejection.as_ref().unwrap().kind(),
        RejectionKind::Conflict
    );
    assert_eq!(
        d.state.writers[&(1, 3)]
            .batches
            .last()
            .unwrap()
            .last_sequence,
        2
    );
}

/// From metadata_version 5 a group commit carrying a coordinator epoch that is not the current
/// one (a paused ex-coordinator's) is refused; before it the field is not read, so old and new
/// binaries apply the same log alike. 0 (no coordinator) is never refused.
#[test]
fn group_commits_are_fenced_by_coordinator_epoch_from_version_5() {
    let mut driver = Driver::default();
    driver
        .one(register_supporting(N1, METADATA_VERSION))
        .unwrap();
    driver.one(coordinator(N1, 1)).unwrap();
    driver.one(database("db")).unwrap();
    driver.one(log_table("db", "events", 1)).unwrap();
    let commit = |offset, coordinator_epoch| {
        Command::CommitGroupOffsets(CommitGroupOffsets {
            group_id: "g".into(),
            offsets: vec![GroupOffset {
                table_id: 1,
                offset,
                ..Default::default()
            }],
            coordinator_epoch,
        })
    };
    let committed = |driver: &Driver| driver.state.group_offsets.values().next().unwrap().offset;
    driver.one(commit(5, 9)).unwrap();
    assert_eq!(committed(&driver), 5);
    for version in 2..=GROUP_FENCING_VERSION {
        driver
            .one(Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
                coordinator_epoch: 1,
                version,
            }))
            .unwrap();
    }
    let e = driver.one(commit(6, 9)).unwrap_err();
    assert_eq!(e.kind(), RejectionKind::CoordinatorFenced);
    assert_eq!(committed(&driver), 5, "a refused commit changes nothing");
    driver.one(commit(7, 1)).unwrap();
    assert_eq!(committed(&driver), 7);
    driver.one(commit(8, 0)).unwrap();
    assert_eq!(committed(&driver), 8);
}

/// From metadata_version 6 a compaction keeps the commit times of the data it moves, so
/// retention ages rows by when they were written, not by when they were last compacted. Before
/// it a moved range is as old as its new object, as old binaries apply it.
#[test]
fn compaction_keeps_the_data_times_from_version_6() {
    let mut d = Driver::with_open_stream(METADATA_VERSION, 1, 8);
    // The time of the driver's next row.
    let next_at = |d: &Driver| 1_000 + d.index;
    let run = |end_offset, at_ms| DataTime { end_offset, at_ms };
    d.one(commit(N1, 1, vec![range(1, 1, 0, 10)])).unwrap();
    d.one(commit(N1, 2, vec![range(1, 1, 10, 20)])).unwrap();
    let compacted_at = next_at(&d);
    d.one(stream_object(3, 0, 20, vec![1, 2])).unwrap();
    let moved = d.state.ranges[&(1, 0)].clone();
    assert!(moved.data_times.is_empty(), "version 1 keeps no times");
    assert_eq!(d.state.data_times(&moved), [run(20, compacted_at)]);

    d.upgrade_to(DATA_TIME_VERSION);
    let first = next_at(&d);
    d.one(commit(N1, 4, vec![range(1, 1, 20, 30)])).unwrap();
    let second = next_at(&d);
    d.one(commit(N1, 5, vec![range(1, 1, 30, 40)])).unwrap();
    d.one(Command::CommitStreamSetObject(CommitStreamSetObject {
        node_id: 1,
        node_epoch: 1,
        object_id: 6,
        object_size: 4096,
        ranges: vec![range(1, 1, 20, 40)],
        compacted_object_ids: vec![4, 5],
    }))
    .unwrap();
    assert_eq!(
        d.state.ranges[&(1, 20)].data_times,
        [run(30, first), run(40, second)]
    );
    // A range moved before the upgrade joins at its object's time.
    d.one(stream_object(7, 0, 40, vec![3, 6])).unwrap();
    assert_eq!(
        d.state.ranges[&(1, 0)].data_times,
        [run(20, compacted_at), run(30, first), run(40, second)]
    );
}

/// A compaction of many commits keeps at most 32 data times per range, in runs of about the
/// same number of commits, each with its newest time.
#[test]
fn many_moved_commits_keep_at_most_32_data_times() {
    let mut d = Driver::with_open_stream(METADATA_VERSION, DATA_TIME_VERSION, 100);
    let first_at = 1_000 + d.index;
    let mut last_at = 0;
    for i in 0..99 {
        last_at = 1_000 + d.index;
        d.one(commit(N1, i + 1, vec![range(1, 1, i * 10, i * 10 + 10)]))
            .unwrap();
    }
    d.one(stream_object(100, 0, 990, (1..=99).collect()))
        .unwrap();
    let times = &d.state.ranges[&(1, 0)].data_times;
    assert_eq!(times.len(), 32);
    assert!(
        times
            .windows(2)
            .all(|w| w[0].end_offset < w[1].end_offset && w[0].at_ms <= w[1].at_ms)
    );
    assert_eq!(
        times.last(),
        Some(&DataTime {
            end_offset: 990,
            at_ms: last_at
        })
    );
    // Even runs of a few commits: the oldest stays about as old as it is.
    assert!(
        times[0].at_ms <= first_at + 4,
        "the oldest run was restamped: {times:?}"
    );
}

/// From metadata_version 7 a lease holder on its way out resigns: nothing at its epoch is
/// accepted afterwards, nobody coordinates until the next registration, and that registration
/// must still bring a higher term (so a paused ex-holder cannot come back at its old one).
#[test]
fn a_resigned_coordinator_is_fenced_until_the_next_registration_from_version_7() {
    let mut d = Driver::default();
    d.one(register_supporting(N1, METADATA_VERSION)).unwrap();
    d.one(register_supporting(N2, METADATA_VERSION)).unwrap();
    d.one(coordinator(N1, 1)).unwrap();
    let resign = |node: NodeRef, coordinator_epoch| {
        Command::ResignCoordinator(ResignCoordinator {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            coordinator_epoch,
        })
    };
    let kind = |r: CommandResult| r.unwrap_err().kind();
    assert_eq!(kind(d.one(resign(N1, 1))), RejectionKind::NotEnabled);
    d.upgrade_to(RESIGN_VERSION);
    assert_eq!(kind(d.one(resign(N2, 1))), RejectionKind::CoordinatorFenced);
    assert_eq!(kind(d.one(resign(N1, 2))), RejectionKind::CoordinatorFenced);
    assert!(!d.one(resign(N1, 1)).unwrap().is_redundant());
    let c = d.state.coordinator.clone().unwrap();
    assert!(c.resigned && c.epoch == 1 && c.active().is_none());
    assert!(d.one(resign(N1, 1)).unwrap().is_redundant());

    // Nothing at the resigned epoch is accepted: coordinator commands, group commits, and
    // the holder registering again at its old term.
    let expire = Command::ExpirePreparedObjects(ExpirePreparedObjects {
        coordinator_epoch: 1,
        now_ms: 0,
    });
    assert_eq!(kind(d.one(expire)), RejectionKind::CoordinatorFenced);
    d.one(database("db")).unwrap();
    d.one(log_table("db", "events", 1)).unwrap();
    let group_commit = Command::CommitGroupOffsets(CommitGroupOffsets {
        group_id: "g".into(),
        offsets: vec![GroupOffset {
            table_id: 1,
            offset: 5,
            ..Default::default()
        }],
        coordinator_epoch: 1,
    });
    assert_eq!(kind(d.one(group_commit)), RejectionKind::CoordinatorFenced);
    assert!(d.state.group_offsets.is_empty());
    assert_eq!(
        kind(d.one(coordinator(N1, 1))),
        RejectionKind::CoordinatorFenced
    );
    assert_eq!(
        kind(d.one(coordinator(N2, 1))),
        RejectionKind::CoordinatorFenced
    );

    // The next holder registers at a higher term and coordinates.
    assert!(!d.one(coordinator(N2, 2)).unwrap().is_redundant());
    let c = d.state.coordinator.clone().unwrap();
    assert_eq!((c.active(), c.epoch, c.resigned), (Some(2), 2, false));
    // The resigned holder's late resignation at its old epoch changes nothing.
    assert_eq!(kind(d.one(resign(N1, 1))), RejectionKind::CoordinatorFenced);
    assert_eq!(d.state.coordinator.as_ref().unwrap().active(), Some(2));
}
