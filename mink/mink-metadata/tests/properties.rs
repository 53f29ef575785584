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

/// An append to a stream the state holds open, by its owner, into a prepared object of the
/// owner: random commands rarely match a stream's owner, epoch and end. `b` picks the stream
/// and the object.
fn append_of(s: &State, b: [u8; 8]) -> Option<(NodeRef, Command)> {
    let open: Vec<&StreamRecord> = s
        .streams
        .values()
        .filter(|st| {
            st.state == StreamState::Open as i32
                && s.nodes
                    .get(&st.owner_node_id)
                    .is_some_and(|n| n.node_epoch == st.owner_node_epoch)
        })
        .collect();
    let stream = *open.get(usize::from(b[3]) % open.len().max(1))?;
    let prepared: Vec<u64> = s
        .objects
        .values()
        .filter(|o| o.state() == ObjectState::Prepared && o.node_id == stream.owner_node_id)
        .map(|o| o.object_id)
        .collect();
    let object_id = *prepared.get(usize::from(b[5]) % prepared.len().max(1))?;
    let node = NodeRef {
        node_id: stream.owner_node_id,
        node_epoch: stream.owner_node_epoch,
    };
    let end = stream.end_offset + u64::from(b[4] % 20) + 1;
    Some((
        node,
        commit(
            node,
            object_id,
            vec![range(
                stream.stream_id,
                stream.epoch,
                stream.end_offset,
                end,
            )],
        ),
    ))
}

/// A compaction of ranges the state holds, into a prepared object: random commands almost never
/// name a stream's actual sources. `b` picks the stream (one with two ranges or more), how many
/// of its first ranges, and the object; a stream-set compaction when `b[6]` is even.
fn compaction_of(s: &State, b: [u8; 8]) -> Option<(NodeRef, Command)> {
    let ranges_of = |id: u64| s.ranges.range((id, 0)..=(id, u64::MAX)).map(|(_, r)| r);
    let streams: Vec<u64> = s
        .streams
        .keys()
        .copied()
        .filter(|id| ranges_of(*id).nth(1).is_some())
        .collect();
    let stream_id = *streams.get(usize::from(b[3]) % streams.len().max(1))?;
    let ranges: Vec<&RangeRecord> = ranges_of(stream_id)
        .take(usize::from(b[4] % 3) + 2)
        .collect();
    let prepared: Vec<&ObjectRecord> = s
        .objects
        .values()
        .filter(|o| o.state() == ObjectState::Prepared)
        .collect();
    let object = *prepared.get(usize::from(b[5]) % prepared.len().max(1))?;
    let node = NodeRef {
        node_id: object.node_id,
        node_epoch: s.nodes.get(&object.node_id)?.node_epoch,
    };
    let (start_offset, end_offset) = (ranges[0].start_offset, ranges.last()?.end_offset);
    let sources: Vec<u64> = ranges.iter().map(|r| r.object_id).collect();
    let command = if b[6].is_multiple_of(2) {
        Command::CommitStreamSetObject(CommitStreamSetObject {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            object_id: object.object_id,
            object_size: 10,
            ranges: vec![range(stream_id, 1, start_offset, end_offset)],
            compacted_object_ids: sources,
        })
    } else {
        Command::CompactStreamObject(CompactStreamObject {
            node_id: node.node_id,
            node_epoch: node.node_epoch,
            object_id: object.object_id,
            stream_id,
            start_offset,
            end_offset,
            object_size: 10,
            source_object_ids: sources,
        })
    };
    Some((node, command))
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
        // Data times cover the range in ascending runs, the last ending where it ends.
        let mut run_start = r.start_offset;
        for t in &r.data_times {
            if t.end_offset <= run_start || t.end_offset > r.end_offset {
                return Err(format!("range {r:?}: data times out of order"));
            }
            run_start = t.end_offset;
        }
        if !r.data_times.is_empty() && run_start != r.end_offset || r.data_times.len() > 32 {
            return Err(format!("range {r:?}: data times do not cover it"));
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
    fn apply_keeps_the_state_consistent(
        seeds in prop::collection::vec(any::<[u8; 8]>(), 1..250),
        upgraded in any::<bool>(),
    ) {
        let mut driver = Driver::default();
        driver.one(register(N1)).unwrap();
        driver.row(N2, vec![register(N2)]).unwrap();
        driver.one(coordinator(N1, 1)).unwrap();
        // The rules of the first metadata_version, or of this binary's.
        if upgraded {
            for version in 2..=METADATA_VERSION {
                driver.one(Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
                    coordinator_epoch: 1,
                    version,
                })).unwrap();
            }
        }
        let mut twin = driver.state.clone();
        for (i, seed) in seeds.iter().enumerate() {
            let (node, command) = match seed[0] % 24 {
                5..=8 if seed[7] % 4 != 0 => {
                    append_of(&driver.state, *seed).unwrap_or_else(|| command(*seed))
                }
                9 | 10 if seed[7] % 4 != 0 => {
                    compaction_of(&driver.state, *seed).unwrap_or_else(|| command(*seed))
                }
                _ => command(*seed),
            };
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
