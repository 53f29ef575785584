//! Properties of apply over random command sequences drawn from a small id universe (so
//! commands collide and interact): rejected and redundant commands change nothing, the
//! state's cross-references stay consistent, apply is deterministic, and snapshots round-trip.

mod common;

use std::collections::BTreeMap;

use common::*;
use mink_metadata::*;
use proptest::prelude::*;

fn node(b: u8) -> NodeRef {
    NodeRef {
        node_id: u64::from(b % 2) + 1,
        node_epoch: 1 + u64::from(b / 128),
    }
}

/// Maps eight random bytes to a command (and the node proposing it).
fn command(b: [u8; 8]) -> (NodeRef, Command) {
    let n = node(b[1]);
    let small = |x: u8, m: u8| u64::from(x % m);
    let c = match b[0] % 24 {
        0 => register(n),
        1 => coordinator(n, small(b[2], 4) + 1),
        2 => Command::CreateStreams(CreateStreams {
            count: u32::from(b[2] % 3) + 1,
        }),
        3 | 4 => open(n, small(b[2], 6) + 1, small(b[3], 3) + 1),
        5 => prepare(n, u32::from(b[2] % 4) + 1),
        6..=8 => {
            let stream = small(b[3], 6) + 1;
            let start = small(b[4], 4) * 10;
            let mut ranges = vec![range(stream, small(b[5], 3) + 1, start, start + 10)];
            if b[6].is_multiple_of(2) {
                let other = small(b[6], 6) + 1;
                if other != stream {
                    ranges.push(range(
                        other,
                        small(b[7], 3) + 1,
                        small(b[7], 3) * 10,
                        small(b[7], 3) * 10 + 10,
                    ));
                }
            }
            commit(n, small(b[2], 12) + 1, ranges)
        }
        9 => Command::CommitStreamSetObject(CommitStreamSetObject {
            node_id: n.node_id,
            node_epoch: n.node_epoch,
            object_id: small(b[2], 12) + 1,
            object_size: 10,
            ranges: vec![range(small(b[3], 6) + 1, 1, 0, small(b[4], 4) * 10 + 10)],
            compacted_object_ids: vec![small(b[5], 12) + 1, small(b[6], 12) + 1],
        }),
        10 => Command::CompactStreamObject(CompactStreamObject {
            node_id: n.node_id,
            node_epoch: n.node_epoch,
            object_id: small(b[2], 12) + 1,
            stream_id: small(b[3], 6) + 1,
            start_offset: small(b[4], 3) * 10,
            end_offset: small(b[4], 3) * 10 + small(b[5], 3) * 10 + 10,
            object_size: 10,
            source_object_ids: vec![small(b[6], 12) + 1, small(b[7], 12) + 1],
        }),
        11 => trim(
            n,
            small(b[2], 6) + 1,
            small(b[3], 3) + 1,
            small(b[4], 5) * 7,
        ),
        12 => Command::DeleteStream(DeleteStream {
            node_id: n.node_id,
            node_epoch: n.node_epoch,
            stream_id: small(b[2], 6) + 1,
            stream_epoch: small(b[3], 3) + 1,
        }),
        13 => Command::ExpirePreparedObjects(ExpirePreparedObjects {
            coordinator_epoch: small(b[2], 4) + 1,
            now_ms: small(b[3], 2) * 100_000,
        }),
        14 => Command::CleanDestroyedObjects(CleanDestroyedObjects {
            coordinator_epoch: small(b[2], 4) + 1,
            object_ids: vec![small(b[3], 12) + 1, small(b[4], 12) + 1],
        }),
        15 => database(["a", "b"][usize::from(b[2] % 2)]),
        16 => {
            let db = ["a", "b"][usize::from(b[2] % 2)];
            let name = format!("t{}", b[3] % 3);
            if b[4].is_multiple_of(2) {
                log_table(db, &name, u32::from(b[5] % 3) + 1)
            } else {
                pk_table(
                    db,
                    &name,
                    u32::from(b[5] % 3) + 1,
                    &[("table.datalake.enabled", "true")],
                )
            }
        }
        17 => Command::DropTable(DropTable {
            database: ["a", "b"][usize::from(b[2] % 2)].into(),
            name: format!("t{}", b[3] % 3),
        }),
        18 => Command::DropDatabase(DropDatabase {
            name: ["a", "b"][usize::from(b[2] % 2)].into(),
            cascade: b[3].is_multiple_of(2),
        }),
        19 => lead(
            small(b[2], 4) + 1,
            small(b[3], 4) + 1,
            0,
            u32::from(b[4] % 3),
            small(b[5], 2) + 1,
        ),
        20 => Command::CommitKvSnapshot(CommitKvSnapshot {
            node_id: n.node_id,
            node_epoch: n.node_epoch,
            table_id: small(b[2], 4) + 1,
            partition_id: 0,
            bucket: u32::from(b[3] % 3),
            leader_epoch: small(b[4], 3) + 1,
            snapshot_id: small(b[5], 5) + 1,
            log_offset: small(b[6], 4) * 10,
            location: "kv".into(),
            size_bytes: 1,
        }),
        21 => Command::CommitLakeSnapshot(CommitLakeSnapshot {
            coordinator_epoch: small(b[2], 4) + 1,
            table_id: small(b[3], 4) + 1,
            snapshot_id: i64::from(b[4] % 5),
            metadata_location: "lake".into(),
            bucket_offsets: vec![BucketOffset {
                partition_id: 0,
                bucket: u32::from(b[5] % 3),
                offset: small(b[6], 4) * 10,
                ..Default::default()
            }],
        }),
        22 => put(&format!("k{}", b[2] % 3), &format!("v{}", b[3] % 2)),
        _ => Command::CommitGroupOffsets(CommitGroupOffsets {
            group_id: "g".into(),
            offsets: vec![GroupOffset {
                table_id: small(b[2], 4) + 1,
                bucket: u32::from(b[3] % 3),
                offset: small(b[4], 50),
                ..Default::default()
            }],
            coordinator_epoch: small(b[5], 3),
        }),
    };
    (n, c)
}

/// Cross-references the apply rules must keep consistent.
fn check_invariants(s: &State) -> Result<(), String> {
    let mut refs: BTreeMap<u64, u64> = BTreeMap::new();
    for ((stream_id, start), r) in s.ranges.iter() {
        let stream = s
            .streams
            .get(stream_id)
            .ok_or(format!("range of missing stream {stream_id}"))?;
        if r.start_offset != *start || r.stream_id != *stream_id || r.end_offset <= r.start_offset {
            return Err(format!("malformed range {r:?}"));
        }
        if r.end_offset > stream.end_offset || r.end_offset <= stream.start_offset {
            return Err(format!("range {r:?} outside stream {stream:?}"));
        }
        *refs.entry(r.object_id).or_default() += 1;
        let object = s
            .objects
            .get(&r.object_id)
            .ok_or(format!("range {r:?} points nowhere"))?;
        if object.state() != ObjectState::Committed {
            return Err(format!("range {r:?} points at {:?} object", object.state()));
        }
    }
    for (id, stream) in s.streams.iter() {
        // Ranges tile [first range start, end) without gaps or overlaps.
        let mut cursor: Option<u64> = None;
        for r in s.ranges.range((*id, 0)..=(*id, u64::MAX)).map(|(_, r)| r) {
            if let Some(c) = cursor
                && c != r.start_offset
            {
                return Err(format!("stream {id}: gap or overlap at {c}"));
            }
            cursor = Some(r.end_offset);
        }
        if let Some(c) = cursor
            && c != stream.end_offset
        {
            return Err(format!(
                "stream {id}: ranges end at {c}, stream at {}",
                stream.end_offset
            ));
        }
        if stream.start_offset > stream.end_offset {
            return Err(format!("stream {id}: start past end"));
        }
        if stream.table_id != 0 {
            let bucket = s
                .buckets
                .get(&(stream.table_id, stream.partition_id, stream.bucket))
                .ok_or(format!("stream {id} of a missing bucket"))?;
            if bucket.stream_id != *id {
                return Err(format!(
                    "bucket of stream {id} points at {}",
                    bucket.stream_id
                ));
            }
        }
    }
    for (id, o) in s.objects.iter() {
        let n = refs.get(id).copied().unwrap_or(0);
        if o.live_ranges != n {
            return Err(format!(
                "object {id}: live_ranges {} but {n} ranges",
                o.live_ranges
            ));
        }
        if o.state() == ObjectState::Committed && n == 0 {
            return Err(format!("object {id} committed but unreferenced"));
        }
    }
    for (key, b) in s.buckets.iter() {
        if !s.tables.contains_key(&key.0) || !s.streams.contains_key(&b.stream_id) {
            return Err(format!("dangling bucket {key:?}"));
        }
    }
    for ((db, name), id) in s.table_names.iter() {
        let t = s
            .tables
            .get(id)
            .ok_or(format!("name {db}.{name} of missing table"))?;
        if &t.database != db || &t.name != name || !s.databases.contains_key(db) {
            return Err(format!("table name {db}.{name} inconsistent"));
        }
    }
    if s.table_names.len() != s.tables.len() {
        return Err("tables and names differ in count".into());
    }
    Ok(())
}

fn without_tokens(s: &State) -> State {
    let mut s = s.clone();
    s.row_tokens = Default::default();
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn apply_keeps_the_state_consistent(seeds in prop::collection::vec(any::<[u8; 8]>(), 1..250)) {
        let mut driver = Driver::default();
        driver.one(register(N1)).unwrap();
        driver.row(N2, vec![register(N2)]).unwrap();
        driver.one(coordinator(N1, 1)).unwrap();
        let mut twin = driver.state.clone();
        for (i, seed) in seeds.iter().enumerate() {
            let (node, command) = command(*seed);
            let before = without_tokens(&driver.state);
            let outcome = driver.row(node, vec![command.clone()]).unwrap();
            let result = &outcome.results().unwrap()[0];
            match result {
                Ok(Outcome::Done(_)) => {}
                _ => prop_assert_eq!(
                    &without_tokens(&driver.state), &before,
                    "{} ({:?}) changed the state: {:?}", command.name(), command, result
                ),
            }
            if let Err(e) = check_invariants(&driver.state) {
                prop_assert!(false, "after #{i} {command:?} => {result:?}: {e}");
            }
            // Determinism: an independent replica computes the same outcome.
            let ctx = ApplyContext { index: driver.index, at_ms: 1_000 + driver.index - 1, supported_version: METADATA_VERSION };
            let row = Row {
                token: RowToken { node_id: node.node_id, node_epoch: node.node_epoch, incarnation: node.node_id * 1000 + node.node_epoch, sequence: driver.sequence },
                proposed_at_ms: ctx.at_ms,
                commands: vec![command],
            };
            let twin_outcome = twin.apply_row(&ctx, &row).unwrap();
            prop_assert_eq!(&twin_outcome, &outcome);
        }
        prop_assert_eq!(&twin, &driver.state);
        let bytes = encode_snapshot(driver.index, &driver.state);
        prop_assert_eq!(&bytes, &encode_snapshot(driver.index, &twin));
        let (index, decoded) = decode_snapshot(&bytes, METADATA_VERSION).unwrap();
        prop_assert_eq!(index, driver.index);
        prop_assert_eq!(&decoded, &driver.state);
    }
}
