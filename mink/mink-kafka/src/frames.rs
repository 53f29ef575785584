//! Responses as the chunks they are written from, so that a fetch response's records go to the
//! socket from the buffers they were encoded into instead of being copied into the response.
//!
//! kafka-protocol encodes a message into one `BufMut`, copying the records of each partition
//! into it: a fetch response is megabytes of records, and that copy was about 4 % of a catch-up
//! read's CPU. [`fetch_response`] frames Fetch responses itself, around the records.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, BufMut as _, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{
    EpochEndOffset, LeaderIdAndEpoch, PartitionData, SnapshotId,
};
use kafka_protocol::messages::{ApiKey, FetchResponse, RequestHeader};

use crate::records::put_uvarint;

/// A response frame (its size first) as a sequence of chunks; written with vectored writes.
/// An empty one is an answer that failed to encode: the connection is closed instead.
#[derive(Debug, Default)]
pub(crate) struct Frames {
    /// None empty.
    chunks: VecDeque<Bytes>,
}

impl Frames {
    /// An encoded answer as frames; an empty one (the connection closes) when it failed to
    /// encode.
    pub(crate) fn answer(encoded: Option<Bytes>) -> Option<Frames> {
        Some(encoded.map_or_else(Frames::default, Frames::from))
    }

    fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.chunks.push_back(chunk);
        }
    }
}

impl From<Bytes> for Frames {
    fn from(chunk: Bytes) -> Self {
        let mut frames = Frames::default();
        frames.push(chunk);
        frames
    }
}

impl Buf for Frames {
    fn remaining(&self) -> usize {
        self.chunks.iter().map(Bytes::len).sum()
    }

    fn has_remaining(&self) -> bool {
        !self.chunks.is_empty()
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |c| c.as_ref())
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let n = dst.len().min(self.chunks.len());
        for (slot, chunk) in dst.iter_mut().zip(&self.chunks) {
            *slot = IoSlice::new(chunk);
        }
        n
    }

    fn advance(&mut self, mut cnt: usize) {
        while cnt > 0 {
            let front = self
                .chunks
                .front_mut()
                .expect("advanced past the end of a response");
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.chunks.pop_front();
        }
    }
}

/// The Fetch versions [`fetch_response`] frames itself (topics by name; v12 is flexible).
const FRAMED: std::ops::RangeInclusive<i16> = 4..=12;

/// `response` framed as the answer to `header`: its records by reference, each partition's
/// `Bytes` a chunk of its own. A response holding what is not framed here (aborted
/// transactions, tagged fields: Mink sets none) or of another version is encoded by
/// kafka-protocol instead.
pub(crate) fn fetch_response(header: &RequestHeader, response: &FetchResponse) -> Option<Frames> {
    let version = header.request_api_version;
    if !FRAMED.contains(&version) || !plain(response) {
        return Frames::answer(crate::conn::respond(ApiKey::Fetch, header, response));
    }
    let flexible = version >= 12;
    let mut frames = Frames::default();
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(header.correlation_id);
    if flexible {
        put_uvarint(&mut buf, 0); // the response header's tagged fields
    }
    buf.put_i32(response.throttle_time_ms);
    if version >= 7 {
        buf.put_i16(response.error_code);
        buf.put_i32(response.session_id);
    }
    put_len(&mut buf, flexible, response.responses.len());
    for topic in &response.responses {
        let name = topic.topic.0.as_bytes();
        if flexible {
            put_len(&mut buf, true, name.len());
        } else {
            buf.put_i16(i16::try_from(name.len()).unwrap_or(i16::MAX));
        }
        buf.put_slice(name);
        put_len(&mut buf, flexible, topic.partitions.len());
        for p in &topic.partitions {
            buf.put_i32(p.partition_index);
            buf.put_i16(p.error_code);
            buf.put_i64(p.high_watermark);
            buf.put_i64(p.last_stable_offset);
            if version >= 5 {
                buf.put_i64(p.log_start_offset);
            }
            match &p.aborted_transactions {
                Some(_) => put_len(&mut buf, flexible, 0), // empty: `plain` checked
                None => put_null(&mut buf, flexible),
            }
            if version >= 11 {
                buf.put_i32(p.preferred_read_replica.0);
            }
            match &p.records {
                None => put_null(&mut buf, flexible),
                Some(records) => {
                    put_len(&mut buf, flexible, records.len());
                    if records.len() < INLINE_RECORDS {
                        buf.put_slice(records);
                    } else {
                        frames.push(buf.split().freeze());
                        frames.push(records.clone());
                    }
                }
            }
            if flexible {
                put_uvarint(&mut buf, 0); // the partition's tagged fields
            }
        }
        if flexible {
            put_uvarint(&mut buf, 0); // the topic's tagged fields
        }
    }
    if flexible {
        put_uvarint(&mut buf, 0); // the response's tagged fields
    }
    frames.push(buf.freeze());
    // The frame's size, once known, in front.
    let size = i32::try_from(frames.remaining()).ok()?;
    frames
        .chunks
        .push_front(Bytes::copy_from_slice(&size.to_be_bytes()));
    Some(frames)
}

/// Records shorter than this are copied into the framing: a chunk of their own would cost a
/// vectored write's slot for a few bytes.
const INLINE_RECORDS: usize = 4096;

/// Whether `response` holds only what [`fetch_response`] frames.
fn plain(response: &FetchResponse) -> bool {
    let plain_partition = |p: &PartitionData| {
        p.aborted_transactions.as_ref().is_none_or(Vec::is_empty)
            && p.diverging_epoch == EpochEndOffset::default()
            && p.current_leader == LeaderIdAndEpoch::default()
            && p.snapshot_id == SnapshotId::default()
            && p.unknown_tagged_fields.is_empty()
    };
    response.unknown_tagged_fields.is_empty()
        && response.node_endpoints.is_empty()
        && response
            .responses
            .iter()
            .all(|t| t.unknown_tagged_fields.is_empty() && t.partitions.iter().all(plain_partition))
}

/// An array's or bytes' length: compact (`len + 1` as an unsigned varint) or an `i32`.
fn put_len(buf: &mut BytesMut, flexible: bool, len: usize) {
    if flexible {
        put_uvarint(
            buf,
            u64::try_from(len).unwrap_or(u64::MAX).saturating_add(1),
        );
    } else {
        buf.put_i32(i32::try_from(len).unwrap_or(i32::MAX));
    }
}

/// A null array or bytes.
fn put_null(buf: &mut BytesMut, flexible: bool) {
    if flexible {
        put_uvarint(buf, 0);
    } else {
        buf.put_i32(-1);
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse};
    use kafka_protocol::messages::{BrokerId, TopicName};
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    fn header(version: i16) -> RequestHeader {
        RequestHeader::default()
            .with_request_api_key(ApiKey::Fetch as i16)
            .with_request_api_version(version)
            .with_correlation_id(0x0102_0304)
    }

    fn partition(index: i32, records: Option<Bytes>) -> PartitionData {
        PartitionData::default()
            .with_partition_index(index)
            .with_error_code(if records.is_none() { 1 } else { 0 })
            .with_high_watermark(1 << 40)
            .with_last_stable_offset(1 << 40)
            .with_log_start_offset(7)
            .with_aborted_transactions(records.as_ref().map(|_| vec![]))
            .with_preferred_read_replica(BrokerId(-1))
            .with_records(records)
    }

    fn collect(mut frames: Frames) -> (Vec<u8>, usize) {
        let chunks = frames.chunks.len();
        let mut out = Vec::new();
        while frames.has_remaining() {
            let n = frames.chunk().len();
            out.extend_from_slice(frames.chunk());
            frames.advance(n);
        }
        (out, chunks)
    }

    /// Every framed version writes the bytes kafka-protocol writes, with large records in
    /// chunks of their own (the same allocation, not a copy).
    #[test]
    fn fetch_responses_frame_as_kafka_protocol_encodes_them() {
        let big = Bytes::from(vec![0xab; 100_000]);
        let response = FetchResponse::default()
            .with_throttle_time_ms(3)
            .with_responses(vec![
                FetchableTopicResponse::default()
                    .with_topic(TopicName(StrBytes::from_static_str("events")))
                    .with_partitions(vec![
                        partition(0, Some(big.clone())),
                        partition(1, Some(Bytes::from_static(b"small"))),
                        partition(2, None),
                        partition(3, Some(Bytes::new())),
                    ]),
                FetchableTopicResponse::default()
                    .with_topic(TopicName(StrBytes::from_static_str("other")))
                    .with_partitions(vec![partition(9, Some(big.clone()))]),
            ]);
        for version in FRAMED {
            let framed = fetch_response(&header(version), &response).expect("framed");
            let shares = framed.chunks.iter().any(|c| c.as_ptr() == big.as_ptr());
            let (bytes, chunks) = collect(framed);
            let expected =
                crate::conn::respond(ApiKey::Fetch, &header(version), &response).expect("encoded");
            assert_eq!(bytes, expected.as_ref(), "Fetch v{version}");
            assert!(
                shares,
                "v{version}: the records are sent from their own buffer"
            );
            // Size, head, records, middle, records, and a tail of tagged fields in v12.
            let expected = if version >= 12 { 6 } else { 5 };
            assert_eq!(chunks, expected, "Fetch v{version}: chunks");
        }
    }

    /// What is not framed here is encoded by kafka-protocol, whole.
    #[test]
    fn other_fetch_responses_are_encoded_whole() {
        let aborted = FetchResponse::default().with_responses(vec![
            FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![
                    partition(0, Some(Bytes::from(vec![1; 10_000])))
                        .with_aborted_transactions(Some(vec![AbortedTransaction::default()])),
                ]),
        ]);
        for version in [4, 12, 13] {
            let response = if version == 13 {
                FetchResponse::default()
            } else {
                aborted.clone()
            };
            let (bytes, chunks) = collect(fetch_response(&header(version), &response).unwrap());
            let expected = crate::conn::respond(ApiKey::Fetch, &header(version), &response);
            assert_eq!(bytes, expected.unwrap().as_ref(), "Fetch v{version}");
            assert_eq!(chunks, 1);
        }
    }

    #[test]
    fn a_partly_written_response_goes_on_from_where_it_stopped() {
        let mut frames = Frames::default();
        for chunk in [&b"ab"[..], b"", b"cde", b"f"] {
            frames.push(Bytes::copy_from_slice(chunk));
        }
        let mut slots = [IoSlice::new(&[]); 2];
        assert_eq!(frames.chunks_vectored(&mut slots), 2);
        assert_eq!(&*slots[1], b"cde");
        frames.advance(3);
        assert_eq!((frames.remaining(), frames.chunk()), (3, &b"de"[..]));
        frames.advance(3);
        assert!(!frames.has_remaining());
    }
}
