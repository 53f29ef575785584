//! The object format: round trips, block splitting, and corruption detection.
#![allow(clippy::cast_possible_truncation)] // small test values

use bytes::Bytes;
use proptest::prelude::*;
use s3stream::format::*;

fn batch(base: u64, count: u32, payload: &[u8]) -> RecordBatch {
    RecordBatch {
        base_offset: base,
        count,
        timestamp_ms: 1_700_000_000_000 + i64::try_from(base).unwrap(),
        payload: Bytes::copy_from_slice(payload),
    }
}

#[test]
fn an_object_round_trips_with_one_block_per_stream_range() {
    let mut b = ObjectBuilder::new(1 << 20);
    b.push(3, &batch(10, 2, b"a")).unwrap();
    b.push(3, &batch(12, 1, b"bb")).unwrap();
    b.push(7, &batch(0, 5, b"ccc")).unwrap();
    let (object, index) = b.finish();
    assert_eq!(index.len(), 2);
    assert_eq!(
        (
            index[0].stream_id,
            index[0].start_offset,
            index[0].end_offset
        ),
        (3, 10, 13)
    );
    assert_eq!(
        (
            index[1].stream_id,
            index[1].start_offset,
            index[1].end_offset
        ),
        (7, 0, 5)
    );
    let decoded = decode_object(&object).unwrap();
    assert_eq!(decoded[0].1, vec![batch(10, 2, b"a"), batch(12, 1, b"bb")]);
    assert_eq!(decoded[1].1, vec![batch(0, 5, b"ccc")]);
    // The footer alone locates the index.
    let footer = parse_footer(&object[object.len() - FOOTER_LEN..], object.len() as u64).unwrap();
    assert_eq!(footer.entries, 2);
}

#[test]
fn large_ranges_are_split_into_blocks_a_reader_can_fetch_alone() {
    let mut b = ObjectBuilder::new(100);
    for i in 0..10 {
        b.push(1, &batch(i * 4, 4, &[i as u8; 60])).unwrap();
    }
    let (object, index) = b.finish();
    assert!(index.len() >= 5, "{} blocks", index.len());
    for pair in index.windows(2) {
        assert_eq!(pair[0].end_offset, pair[1].start_offset);
    }
    // One block by itself decodes.
    let e = index[2];
    let block = object.slice(e.position as usize..(e.position + u64::from(e.size)) as usize);
    let batches = decode_block(&block, &e).unwrap();
    assert_eq!(batches[0].base_offset, e.start_offset);
}

#[test]
fn out_of_order_input_is_refused_and_gaps_start_a_block() {
    let mut b = ObjectBuilder::new(1 << 20);
    b.push(5, &batch(0, 1, b"x")).unwrap();
    assert!(
        b.push(5, &batch(0, 1, b"again")).is_err(),
        "offsets may not go back"
    );
    assert!(b.push(4, &batch(1, 1, b"lower stream")).is_err());
    assert!(b.push(6, &batch(0, 0, b"empty")).is_err());
    // A gap (a run of the stream held elsewhere) starts a new block.
    b.push(5, &batch(10, 2, b"after a gap")).unwrap();
    b.push(6, &batch(0, 1, b"ok")).unwrap();
    let (object, index) = b.finish();
    assert_eq!(
        index
            .iter()
            .map(|e| (e.stream_id, e.start_offset, e.end_offset))
            .collect::<Vec<_>>(),
        vec![(5, 0, 1), (5, 10, 12), (6, 0, 1)]
    );
    assert_eq!(decode_object(&object).unwrap().len(), 3);
}

#[test]
fn foreign_or_truncated_bytes_are_refused() {
    assert!(matches!(
        parse_footer(b"short", 5),
        Err(FormatError::TooShort { .. })
    ));
    let junk = [0u8; 64];
    assert_eq!(parse_footer(&junk, 64), Err(FormatError::BadMagic));
    let (object, _) = {
        let mut b = ObjectBuilder::new(1 << 20);
        b.push(1, &batch(0, 1, b"x")).unwrap();
        b.finish()
    };
    // The same footer does not fit a longer object.
    assert!(parse_footer(&object, object.len() as u64 + 1).is_err());
    assert!(decode_object(&object.slice(1..)).is_err());
}

#[test]
fn blocks_carry_the_latest_time_of_their_batches() {
    let mut b = ObjectBuilder::new(1 << 20);
    let mut late = batch(0, 1, b"late");
    late.timestamp_ms = 9_000;
    let mut early = batch(1, 1, b"early");
    early.timestamp_ms = 5_000;
    b.push(1, &late).unwrap();
    b.push(1, &early).unwrap();
    let (object, index) = b.finish();
    assert_eq!(index[0].max_timestamp_ms, 9_000, "times need not ascend");
    let decoded = decode_object(&object).unwrap();
    assert_eq!(decoded[0].0, index[0], "the index round trips");
    assert_eq!(decoded[0].1, vec![late, early]);
}

/// A version 1 object, as written before batches carried a time: 16-byte batch headers,
/// 40-byte index entries.
fn version_1_object(stream_id: u64, batches: &[(u64, u32, &[u8])]) -> Bytes {
    let mut block = Vec::new();
    for (base, count, payload) in batches {
        block.extend_from_slice(&base.to_le_bytes());
        block.extend_from_slice(&count.to_le_bytes());
        block.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        block.extend_from_slice(payload);
    }
    block.extend_from_slice(&crc32c::crc32c(&block).to_le_bytes());
    let (start, end) = (
        batches[0].0,
        batches.last().map(|b| b.0 + u64::from(b.1)).unwrap(),
    );
    let mut object = block.clone();
    let index_position = object.len() as u64;
    let mut entry = Vec::new();
    for v in [stream_id, start, end, 0] {
        entry.extend_from_slice(&v.to_le_bytes());
    }
    entry.extend_from_slice(&(block.len() as u32).to_le_bytes());
    entry.extend_from_slice(&(batches.len() as u32).to_le_bytes());
    entry.extend_from_slice(&crc32c::crc32c(&entry).to_le_bytes());
    object.extend_from_slice(&entry);
    let mut footer = Vec::new();
    footer.extend_from_slice(&index_position.to_le_bytes());
    footer.extend_from_slice(&(entry.len() as u32).to_le_bytes());
    footer.extend_from_slice(&1u32.to_le_bytes());
    footer.extend_from_slice(&[1, 0, 0, 0]);
    footer.extend_from_slice(&MAGIC);
    footer.extend_from_slice(&crc32c::crc32c(&footer).to_le_bytes());
    object.extend_from_slice(&footer);
    Bytes::from(object)
}

#[test]
fn version_1_objects_stay_readable_with_unknown_times() {
    let object = version_1_object(4, &[(10, 2, b"ab"), (12, 1, b"c")]);
    let decoded = decode_object(&object).unwrap();
    let (entry, batches) = &decoded[0];
    assert_eq!((entry.version, entry.max_timestamp_ms), (1, UNKNOWN_TIME));
    assert_eq!(
        batches
            .iter()
            .map(|b| (b.base_offset, b.count, b.timestamp_ms, &b.payload[..]))
            .collect::<Vec<_>>(),
        vec![
            (10, 2, UNKNOWN_TIME, &b"ab"[..]),
            (12, 1, UNKNOWN_TIME, &b"c"[..])
        ]
    );
    // A later version is refused, not guessed at.
    let mut future = object.to_vec();
    let at = future.len() - FOOTER_LEN + 16;
    future[at] = FORMAT_VERSION + 1;
    let crc_at = future.len() - 4;
    let crc = crc32c::crc32c(&future[crc_at - 28..crc_at]);
    future[crc_at..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        decode_object(&Bytes::from(future)).unwrap_err(),
        FormatError::UnknownVersion(FORMAT_VERSION + 1)
    );
}

proptest! {
    /// Any single flipped byte anywhere in an object is detected, never silently accepted.
    #[test]
    fn any_corruption_is_detected(
        streams in prop::collection::vec((1u64..5, prop::collection::vec((1u32..4, 0usize..40), 1..6)), 1..4),
        flip_at in any::<prop::sample::Index>(),
        flip_bit in 0u8..8,
    ) {
        let mut b = ObjectBuilder::new(64);
        let mut expected = Vec::new();
        let mut stream_ids: Vec<u64> = streams.iter().map(|(s, _)| *s).collect();
        stream_ids.sort_unstable();
        stream_ids.dedup();
        for (i, stream_id) in stream_ids.iter().enumerate() {
            let mut offset = 100;
            for (count, len) in &streams[i % streams.len()].1 {
                let bt = batch(offset, *count, &vec![*count as u8; *len]);
                b.push(*stream_id, &bt).unwrap();
                expected.push((*stream_id, bt));
                offset += u64::from(*count);
            }
        }
        let (object, _) = b.finish();
        let decoded: Vec<(u64, RecordBatch)> = decode_object(&object)
            .unwrap()
            .into_iter()
            .flat_map(|(e, batches)| batches.into_iter().map(move |bt| (e.stream_id, bt)))
            .collect();
        prop_assert_eq!(&decoded, &expected);
        let mut bad = object.to_vec();
        let i = flip_at.index(bad.len());
        bad[i] ^= 1 << flip_bit;
        prop_assert!(decode_object(&Bytes::from(bad)).is_err(), "flip at {} of {} accepted", i, object.len());
    }
}
