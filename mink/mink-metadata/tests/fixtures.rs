//! Committed encodings that every later binary must still read.
//!
//! `tests/fixtures/rows-1.bin` holds one row per command variant with every field set to a
//! distinct non-default value; `tests/fixtures/snapshot-1.bin` a state in which every map is
//! non-empty. The test decodes both on every run and compares them with the values built here,
//! so renumbering a field, reusing a tag, or changing the framing fails the suite.
//!
//! The files are append-only history: `MINK_BLESS=1` writes a fixture only when it is
//! missing, never over an existing one. `commands_1` and `scenario_1` are frozen: a new
//! field stays at its default in them (old rows do not carry it); a new command or field gets
//! `commands_2`/`rows-2.bin`, and so on.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::*;
use mink_metadata::*;

fn fixture(name: &str) -> PathBuf {
    // At run time: a shared target directory may hold a binary built from another checkout.
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("tests/fixtures")
        .join(name)
}

/// Reads a fixture, writing `fresh` first if it is missing and blessing was asked for.
fn read_or_bless(name: &str, fresh: &[u8]) -> Vec<u8> {
    let path = fixture(name);
    match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(_) if std::env::var("MINK_BLESS").is_ok() => {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, fresh).unwrap();
            fresh.to_vec()
        }
        Err(e) => panic!("{}: {e} (create it once with MINK_BLESS=1)", path.display()),
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One of every command of metadata_version 1 and 2, every field distinct and non-default.
fn commands_1() -> Vec<Command> {
    let writer = WriterRange {
        writer_id: 101,
        writer_epoch: 102,
        first_sequence: 103,
        last_sequence: 104,
        base_offset: 105,
        end_offset: 106,
    };
    let stream_range = StreamRange {
        stream_id: 111,
        stream_epoch: 112,
        start_offset: 113,
        end_offset: 114,
        writers: vec![writer],
    };
    vec![
        Command::RegisterNode(RegisterNode {
            node_id: 1,
            node_epoch: 2,
            incarnation: 3,
            address: "node-1:9123".into(),
            supported_metadata_version: 4,
            // Version 3's field: not in the version 1 fixture (see commands_3).
            listeners: BTreeMap::new(),
        }),
        Command::CreateStreams(CreateStreams { count: 5 }),
        Command::OpenStream(OpenStream {
            node_id: 6,
            node_epoch: 7,
            stream_id: 8,
            stream_epoch: 9,
        }),
        Command::CloseStream(CloseStream {
            node_id: 10,
            node_epoch: 11,
            stream_id: 12,
            stream_epoch: 13,
        }),
        Command::TrimStream(TrimStream {
            node_id: 14,
            node_epoch: 15,
            stream_id: 16,
            stream_epoch: 17,
            new_start_offset: 18,
        }),
        Command::DeleteStream(DeleteStream {
            node_id: 19,
            node_epoch: 20,
            stream_id: 21,
            stream_epoch: 22,
        }),
        Command::PlaceStream(PlaceStream {
            coordinator_epoch: 23,
            stream_id: 24,
            node_id: 25,
        }),
        Command::TransferStream(TransferStream {
            coordinator_epoch: 26,
            stream_id: 27,
            from_node_id: 28,
            to_node_id: 29,
        }),
        Command::CompleteTransfer(CompleteTransfer {
            node_id: 30,
            node_epoch: 31,
            stream_id: 32,
            stream_epoch: 33,
        }),
        Command::PrepareObject(PrepareObject {
            node_id: 34,
            node_epoch: 35,
            count: 36,
            expires_at_ms: 37,
        }),
        Command::CommitStreamSetObject(CommitStreamSetObject {
            node_id: 38,
            node_epoch: 39,
            object_id: 40,
            object_size: 41,
            ranges: vec![stream_range],
            compacted_object_ids: vec![42, 43],
        }),
        Command::CompactStreamObject(CompactStreamObject {
            node_id: 44,
            node_epoch: 45,
            object_id: 46,
            stream_id: 47,
            start_offset: 48,
            end_offset: 49,
            object_size: 50,
            source_object_ids: vec![51, 52],
        }),
        Command::ExpirePreparedObjects(ExpirePreparedObjects {
            coordinator_epoch: 53,
            now_ms: 54,
        }),
        Command::CleanDestroyedObjects(CleanDestroyedObjects {
            coordinator_epoch: 55,
            object_ids: vec![56, 57],
        }),
        Command::AllocateProducerIds(AllocateProducerIds { count: 58 }),
        Command::PutKv(PutKv {
            key: "key-59".into(),
            value: b"value-60".to_vec(),
        }),
        Command::PutKvIfAbsent(PutKvIfAbsent {
            key: "key-61".into(),
            value: b"value-62".to_vec(),
        }),
        Command::DeleteKv(DeleteKv {
            key: "key-63".into(),
        }),
        Command::DeleteKvIfMatches(DeleteKvIfMatches {
            key: "key-64".into(),
            expected: b"value-65".to_vec(),
        }),
        Command::CreateDatabase(CreateDatabase {
            name: "db-66".into(),
            properties: map(&[("owner", "67")]),
            comment: "comment-68".into(),
        }),
        Command::DropDatabase(DropDatabase {
            name: "db-69".into(),
            cascade: true,
        }),
        Command::CreateTable(CreateTable {
            database: "db-70".into(),
            name: "table-71".into(),
            schema: b"schema-72".to_vec(),
            primary_key: vec!["id".into(), "day".into()],
            bucket_key: vec!["id".into()],
            partition_keys: vec!["day".into()],
            bucket_count: 73,
            options: map(&[
                ("table.merge-engine", "first_row"),
                ("table.log.ttl", "74d"),
            ]),
            comment: "comment-75".into(),
        }),
        Command::DropTable(DropTable {
            database: "db-76".into(),
            name: "table-77".into(),
        }),
        Command::AlterTable(AlterTable {
            table_id: 78,
            set_options: map(&[("table.log.ttl", "79d")]),
            reset_options: vec!["option-80".into()],
            new_schema: b"schema-81".to_vec(),
            expected_schema_version: 82,
        }),
        Command::CreatePartition(CreatePartition {
            table_id: 83,
            name: "day=84".into(),
            values: map(&[("day", "84")]),
        }),
        Command::DropPartition(DropPartition {
            table_id: 85,
            name: "day=86".into(),
        }),
        Command::LeadBucket(LeadBucket {
            coordinator_epoch: 87,
            table_id: 88,
            partition_id: 89,
            bucket: 90,
            leader_node_id: 91,
        }),
        Command::CommitKvSnapshot(CommitKvSnapshot {
            node_id: 92,
            node_epoch: 93,
            table_id: 94,
            partition_id: 95,
            bucket: 96,
            leader_epoch: 97,
            snapshot_id: 98,
            log_offset: 99,
            location: "kv/100".into(),
            size_bytes: 101,
        }),
        Command::DropKvSnapshot(DropKvSnapshot {
            coordinator_epoch: 102,
            table_id: 103,
            partition_id: 104,
            bucket: 105,
            snapshot_id: 106,
        }),
        Command::CommitLakeSnapshot(CommitLakeSnapshot {
            coordinator_epoch: 107,
            table_id: 108,
            snapshot_id: -109,
            metadata_location: "s3://lake/110.json".into(),
            bucket_offsets: vec![BucketOffset {
                partition_id: 111,
                bucket: 112,
                offset: 113,
                ..Default::default()
            }],
        }),
        Command::Allocate(Allocate {
            sequence: "table/114/auto_increment/id".into(),
            count: 115,
        }),
        Command::RegisterCoordinator(RegisterCoordinator {
            node_id: 116,
            node_epoch: 117,
            lease_term: 118,
        }),
        Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
            coordinator_epoch: 119,
            version: 2,
        }),
        Command::RegisterProducerOffsets(RegisterProducerOffsets {
            producer_id: "producer-120".into(),
            offsets: vec![TableBucketOffset {
                table_id: 121,
                partition_id: 122,
                bucket: 123,
                offset: 124,
            }],
            ttl_ms: 125,
        }),
        Command::DeleteProducerOffsets(DeleteProducerOffsets {
            producer_id: "producer-126".into(),
        }),
        Command::ExpireProducerOffsets(ExpireProducerOffsets {
            coordinator_epoch: 127,
            now_ms: 128,
        }),
        Command::CommitGroupOffsets(CommitGroupOffsets {
            group_id: "group-129".into(),
            offsets: vec![GroupOffset {
                table_id: 130,
                partition_id: 131,
                bucket: 132,
                offset: 133,
                leader_epoch: -134,
                metadata: "meta-135".into(),
            }],
            coordinator_epoch: 0,
        }),
        Command::DeleteGroupOffsets(DeleteGroupOffsets {
            group_id: "group-136".into(),
            buckets: vec![TableBucket {
                table_id: 137,
                partition_id: 138,
                bucket: 139,
            }],
        }),
        Command::ExpireGroupOffsets(ExpireGroupOffsets {
            coordinator_epoch: 140,
            now_ms: 141,
            retention_ms: 142,
        }),
    ]
}

/// Position of a variant in `commands_1`. Exhaustive: a new variant does not compile until
/// it is covered by a fixture.
fn variant(command: &Command) -> usize {
    match command {
        Command::RegisterNode(_) => 0,
        Command::CreateStreams(_) => 1,
        Command::OpenStream(_) => 2,
        Command::CloseStream(_) => 3,
        Command::TrimStream(_) => 4,
        Command::DeleteStream(_) => 5,
        Command::PlaceStream(_) => 6,
        Command::TransferStream(_) => 7,
        Command::CompleteTransfer(_) => 8,
        Command::PrepareObject(_) => 9,
        Command::CommitStreamSetObject(_) => 10,
        Command::CompactStreamObject(_) => 11,
        Command::ExpirePreparedObjects(_) => 12,
        Command::CleanDestroyedObjects(_) => 13,
        Command::AllocateProducerIds(_) => 14,
        Command::PutKv(_) => 15,
        Command::PutKvIfAbsent(_) => 16,
        Command::DeleteKv(_) => 17,
        Command::DeleteKvIfMatches(_) => 18,
        Command::CreateDatabase(_) => 19,
        Command::DropDatabase(_) => 20,
        Command::CreateTable(_) => 21,
        Command::DropTable(_) => 22,
        Command::AlterTable(_) => 23,
        Command::CreatePartition(_) => 24,
        Command::DropPartition(_) => 25,
        Command::LeadBucket(_) => 26,
        Command::CommitKvSnapshot(_) => 27,
        Command::DropKvSnapshot(_) => 28,
        Command::CommitLakeSnapshot(_) => 29,
        Command::Allocate(_) => 30,
        Command::RegisterCoordinator(_) => 31,
        Command::UpgradeMetadataVersion(_) => 32,
        Command::RegisterProducerOffsets(_) => 33,
        Command::DeleteProducerOffsets(_) => 34,
        Command::ExpireProducerOffsets(_) => 35,
        Command::CommitGroupOffsets(_) => 36,
        Command::DeleteGroupOffsets(_) => 37,
        Command::ExpireGroupOffsets(_) => 38,
        Command::ResignCoordinator(_) => 39,
    }
}

fn rows_1() -> Vec<Row> {
    commands_1()
        .into_iter()
        .enumerate()
        .map(|(i, command)| Row {
            token: RowToken {
                node_id: 1000 + i as u64,
                node_epoch: 2000 + i as u64,
                incarnation: 3000 + i as u64,
                sequence: 4000 + i as u64,
            },
            proposed_at_ms: 5000 + i as u64,
            commands: vec![command],
        })
        .collect()
}

/// Length-prefixed (u32 little-endian) concatenation of encoded rows.
fn frame(rows: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for row in rows {
        out.extend_from_slice(&u32::try_from(row.len()).unwrap().to_le_bytes());
        out.extend_from_slice(row);
    }
    out
}

fn unframe(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut rows = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes.split_at(4);
        let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
        rows.push(rest[..len].to_vec());
        bytes = &rest[len..];
    }
    rows
}

#[test]
fn every_command_is_in_the_fixture() {
    let covered: std::collections::BTreeSet<usize> = commands_1()
        .iter()
        .chain(&commands_7())
        .map(variant)
        .collect();
    assert_eq!(covered, (0..40).collect());
}

#[test]
fn rows_written_by_metadata_version_1_still_decode() {
    let expected = rows_1();
    let fresh: Vec<Vec<u8>> = expected.iter().map(encode_row).collect();
    let stored = unframe(&read_or_bless("rows-1.bin", &frame(&fresh)));
    assert_eq!(stored.len(), expected.len());
    for ((bytes, row), now) in stored.iter().zip(&expected).zip(&fresh) {
        assert_eq!(bytes[0], FORMAT_VERSION);
        let decoded = decode_row(bytes, METADATA_VERSION)
            .unwrap_or_else(|e| panic!("{}: {e}", row.commands[0].name()));
        assert_eq!(
            &decoded,
            row,
            "{} decodes differently",
            row.commands[0].name()
        );
        assert_eq!(bytes, now, "{} encodes differently", row.commands[0].name());
    }
}

/// A state in which every map is non-empty.
fn scenario_1() -> Driver {
    let mut d = Driver::default();
    let n2 = N2;
    let ok = |d: &mut Driver, node: NodeRef, c: Command| {
        let name = c.name();
        match d.row(node, vec![c]).unwrap().results().unwrap()[0].clone() {
            Ok(_) => {}
            Err(e) => panic!("{name}: {e}"),
        }
    };
    // Frozen: the binaries of version 2 registered; their listeners were not recorded.
    ok(&mut d, N1, register_supporting(N1, 2));
    ok(&mut d, n2, register_supporting(n2, 2));
    ok(&mut d, N1, coordinator(N1, 1));
    ok(
        &mut d,
        N1,
        Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
            coordinator_epoch: 1,
            version: 2,
        }),
    );
    ok(&mut d, N1, database("db"));
    ok(
        &mut d,
        N1,
        pk_table("db", "users", 2, &[("table.datalake.enabled", "true")]),
    );
    let partitioned = Command::CreateTable(CreateTable {
        database: "db".into(),
        name: "daily".into(),
        primary_key: vec!["id".into(), "day".into()],
        partition_keys: vec!["day".into()],
        bucket_count: 1,
        ..Default::default()
    });
    ok(&mut d, N1, partitioned);
    ok(
        &mut d,
        N1,
        Command::CreatePartition(CreatePartition {
            table_id: 2,
            name: "day=1".into(),
            values: map(&[("day", "1")]),
        }),
    );
    ok(&mut d, N1, lead(1, 1, 0, 0, 1));
    ok(&mut d, N1, open(N1, 1, 1));
    ok(&mut d, N1, prepare(N1, 3));
    let mut r = range(1, 1, 0, 10);
    r.writers.push(WriterRange {
        writer_id: 9,
        writer_epoch: 1,
        first_sequence: 0,
        last_sequence: 2,
        base_offset: 0,
        end_offset: 10,
    });
    ok(&mut d, N1, commit(N1, 1, vec![r]));
    ok(&mut d, N1, commit(N1, 2, vec![range(1, 1, 10, 12)]));
    ok(
        &mut d,
        N1,
        Command::CommitKvSnapshot(CommitKvSnapshot {
            node_id: 1,
            node_epoch: 1,
            table_id: 1,
            partition_id: 0,
            bucket: 0,
            leader_epoch: 1,
            snapshot_id: 1,
            log_offset: 10,
            location: "kv/1".into(),
            size_bytes: 100,
        }),
    );
    ok(
        &mut d,
        N1,
        Command::CommitLakeSnapshot(CommitLakeSnapshot {
            coordinator_epoch: 1,
            table_id: 1,
            snapshot_id: 77,
            metadata_location: "s3://lake/77.json".into(),
            bucket_offsets: vec![BucketOffset {
                partition_id: 0,
                bucket: 0,
                offset: 5,
                ..Default::default()
            }],
        }),
    );
    ok(&mut d, N1, put("config/a", "1"));
    ok(
        &mut d,
        N1,
        Command::Allocate(Allocate {
            sequence: "table/1/auto_increment/id".into(),
            count: 10,
        }),
    );
    ok(
        &mut d,
        N1,
        Command::RegisterProducerOffsets(RegisterProducerOffsets {
            producer_id: "p".into(),
            offsets: vec![TableBucketOffset {
                table_id: 1,
                partition_id: 0,
                bucket: 0,
                offset: 10,
            }],
            ttl_ms: 1_000,
        }),
    );
    ok(
        &mut d,
        N1,
        Command::CommitGroupOffsets(CommitGroupOffsets {
            group_id: "g".into(),
            offsets: vec![GroupOffset {
                table_id: 1,
                partition_id: 0,
                bucket: 1,
                offset: 3,
                leader_epoch: 1,
                metadata: "m".into(),
            }],
            coordinator_epoch: 0,
        }),
    );
    d
}

#[test]
fn snapshots_written_by_metadata_version_1_still_decode() {
    let d = scenario_1();
    let s = &d.state;
    let sizes = [
        s.nodes.len(),
        s.row_tokens.len(),
        s.streams.len(),
        s.ranges.len(),
        s.objects.len(),
        s.writers.len(),
        s.kv.len(),
        s.databases.len(),
        s.tables.len(),
        s.table_names.len(),
        s.partitions.len(),
        s.partition_names.len(),
        s.buckets.len(),
        s.kv_snapshots.len(),
        s.lake_snapshots.len(),
        s.sequences.len(),
        s.producer_offsets.len(),
        s.group_offsets.len(),
    ];
    assert!(
        sizes.iter().all(|&n| n > 0),
        "every map is exercised: {sizes:?}"
    );
    assert!(s.coordinator.is_some());
    let fresh = encode_snapshot(d.index, s);
    let stored = read_or_bless("snapshot-1.bin", &fresh);
    assert_eq!(stored[0], FORMAT_VERSION);
    let (index, decoded) = decode_snapshot(&stored, METADATA_VERSION).unwrap();
    assert_eq!(index, d.index);
    assert_eq!(&decoded, s, "the stored snapshot decodes to another state");
    assert_eq!(stored, fresh, "the state encodes differently than it did");
}

/// What metadata_version 3 added: `RegisterNode.listeners` (and `NodeRecord.listeners`).
fn commands_3() -> Vec<Command> {
    vec![Command::RegisterNode(RegisterNode {
        node_id: 301,
        node_epoch: 302,
        incarnation: 303,
        address: "node-301:7171".into(),
        supported_metadata_version: 3,
        listeners: map(&[
            ("flight", "node-301:7171"),
            ("kafka", "node-301:9092"),
            ("flight-sql", "node-301:50051"),
        ]),
    })]
}

#[test]
fn rows_written_by_metadata_version_3_still_decode() {
    let expected: Vec<Row> = commands_3()
        .into_iter()
        .map(|command| Row {
            token: RowToken {
                node_id: 304,
                node_epoch: 305,
                incarnation: 306,
                sequence: 307,
            },
            proposed_at_ms: 308,
            commands: vec![command],
        })
        .collect();
    let fresh: Vec<Vec<u8>> = expected.iter().map(encode_row).collect();
    let stored = unframe(&read_or_bless("rows-3.bin", &frame(&fresh)));
    assert_eq!(stored.len(), expected.len());
    for ((bytes, row), now) in stored.iter().zip(&expected).zip(&fresh) {
        assert_eq!(&decode_row(bytes, METADATA_VERSION).unwrap(), row);
        assert_eq!(bytes, now);
    }
}

/// What metadata_version 5 added: `CommitGroupOffsets.coordinator_epoch`.
fn commands_5() -> Vec<Command> {
    vec![Command::CommitGroupOffsets(CommitGroupOffsets {
        group_id: "group-501".into(),
        offsets: vec![GroupOffset {
            table_id: 502,
            partition_id: 503,
            bucket: 504,
            offset: 505,
            leader_epoch: -506,
            metadata: "meta-507".into(),
        }],
        coordinator_epoch: 508,
    })]
}

#[test]
fn rows_written_by_metadata_version_5_still_decode() {
    let expected: Vec<Row> = commands_5()
        .into_iter()
        .map(|command| Row {
            token: RowToken {
                node_id: 509,
                node_epoch: 510,
                incarnation: 511,
                sequence: 512,
            },
            proposed_at_ms: 513,
            commands: vec![command],
        })
        .collect();
    let fresh: Vec<Vec<u8>> = expected.iter().map(encode_row).collect();
    let stored = unframe(&read_or_bless("rows-5.bin", &frame(&fresh)));
    assert_eq!(stored.len(), expected.len());
    for ((bytes, row), now) in stored.iter().zip(&expected).zip(&fresh) {
        assert_eq!(&decode_row(bytes, METADATA_VERSION).unwrap(), row);
        assert_eq!(bytes, now);
    }
}

#[test]
fn snapshots_written_by_metadata_version_3_still_decode() {
    let mut d = Driver::default();
    d.one(register_supporting(N1, 3)).unwrap();
    d.one(coordinator(N1, 1)).unwrap();
    for version in [2, 3] {
        d.one(Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
            coordinator_epoch: 1,
            version,
        }))
        .unwrap();
    }
    for c in commands_3() {
        d.one(c).unwrap();
    }
    assert_eq!(d.state.nodes[&301].listeners.len(), 3);
    let fresh = encode_snapshot(d.index, &d.state);
    let stored = read_or_bless("snapshot-3.bin", &fresh);
    let (index, decoded) = decode_snapshot(&stored, METADATA_VERSION).unwrap();
    assert_eq!(index, d.index);
    assert_eq!(decoded, d.state);
    assert_eq!(stored, fresh, "the state encodes differently than it did");
}

/// What metadata_version 6 added: `RangeRecord.data_times`, set when compaction moves data.
#[test]
fn snapshots_written_by_metadata_version_6_still_decode() {
    let mut d = Driver::with_open_stream(6, 6, 3);
    d.one(commit(N1, 1, vec![range(1, 1, 0, 10)])).unwrap();
    d.one(commit(N1, 2, vec![range(1, 1, 10, 20)])).unwrap();
    d.one(stream_object(3, 0, 20, vec![1, 2])).unwrap();
    assert_eq!(d.state.ranges[&(1, 0)].data_times.len(), 2);
    let fresh = encode_snapshot(d.index, &d.state);
    let stored = read_or_bless("snapshot-6.bin", &fresh);
    let (index, decoded) = decode_snapshot(&stored, METADATA_VERSION).unwrap();
    assert_eq!(index, d.index);
    assert_eq!(decoded, d.state);
    assert_eq!(stored, fresh, "the state encodes differently than it did");
}

/// What metadata_version 7 added: `ResignCoordinator`.
fn commands_7() -> Vec<Command> {
    vec![Command::ResignCoordinator(ResignCoordinator {
        node_id: 701,
        node_epoch: 702,
        coordinator_epoch: 703,
    })]
}

#[test]
fn rows_written_by_metadata_version_7_still_decode() {
    let expected: Vec<Row> = commands_7()
        .into_iter()
        .map(|command| Row {
            token: RowToken {
                node_id: 704,
                node_epoch: 705,
                incarnation: 706,
                sequence: 707,
            },
            proposed_at_ms: 708,
            commands: vec![command],
        })
        .collect();
    let fresh: Vec<Vec<u8>> = expected.iter().map(encode_row).collect();
    let stored = unframe(&read_or_bless("rows-7.bin", &frame(&fresh)));
    assert_eq!(stored.len(), expected.len());
    for ((bytes, row), now) in stored.iter().zip(&expected).zip(&fresh) {
        assert_eq!(&decode_row(bytes, METADATA_VERSION).unwrap(), row);
        assert_eq!(bytes, now);
        // A binary of version 6 cannot read it, and says so.
        assert!(matches!(
            decode_row(bytes, 6),
            Err(DecodeError::CommandTooNew { since: 7, .. })
        ));
    }
}

/// What metadata_version 7 added to the state: `CoordinatorRecord.resigned`.
#[test]
fn snapshots_written_by_metadata_version_7_still_decode() {
    let mut d = Driver::default();
    d.one(register_supporting(N1, 7)).unwrap();
    d.one(coordinator(N1, 1)).unwrap();
    d.upgrade_to(7);
    d.one(Command::ResignCoordinator(ResignCoordinator {
        node_id: N1.node_id,
        node_epoch: N1.node_epoch,
        coordinator_epoch: 1,
    }))
    .unwrap();
    assert!(d.state.coordinator.as_ref().unwrap().resigned);
    let fresh = encode_snapshot(d.index, &d.state);
    let stored = read_or_bless("snapshot-7.bin", &fresh);
    let (index, decoded) = decode_snapshot(&stored, METADATA_VERSION).unwrap();
    assert_eq!(index, d.index);
    assert_eq!(decoded, d.state);
    assert_eq!(stored, fresh, "the state encodes differently than it did");
}

#[test]
fn framing_errors_are_precise() {
    assert_eq!(decode_row(&[], 2), Err(DecodeError::Empty));
    assert_eq!(
        decode_row(&[7, 1, 2], 2),
        Err(DecodeError::UnknownFormat { found: 7 })
    );
    assert!(matches!(
        decode_row(&[FORMAT_VERSION, 0xff, 0xff], 2),
        Err(DecodeError::Malformed(_))
    ));
    let row = &rows_1()[33]; // RegisterProducerOffsets: metadata_version 2
    let bytes = encode_row(row);
    assert!(matches!(
        decode_row(&bytes, 1),
        Err(DecodeError::CommandTooNew {
            since: 2,
            supported: 1,
            ..
        })
    ));
    let (_, state) = (0, scenario_1().state);
    let snapshot = encode_snapshot(1, &state);
    assert!(matches!(
        decode_snapshot(&snapshot, 1),
        Err(DecodeError::SnapshotTooNew {
            found: 2,
            supported: 1
        })
    ));
    // A row whose command tag this binary does not know (a newer binary wrote it).
    let mut unknown = vec![FORMAT_VERSION];
    // RowProto { token: RowToken { node_id: 1 }, commands: [ envelope { field 99: varint 1 } ] }
    unknown.extend_from_slice(&[0x0a, 0x02, 0x08, 0x01, 0x1a, 0x03, 0x98, 0x06, 0x01]);
    assert_eq!(
        decode_row(&unknown, 2),
        Err(DecodeError::UnknownCommand { position: 0 })
    );
}
