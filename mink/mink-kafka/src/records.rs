//! Kafka record batches (format v2) and Mink rows: checking what a producer sends before
//! anything is decoded from it, raw rows from records, records from rows.

use arrow::array::{Array, AsArray as _, RecordBatch};
use arrow::datatypes::ArrowNativeType as _;
use arrow::datatypes::{Schema, SchemaRef, TimestampMicrosecondType};
use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, Record,
    RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
};

/// The bytes of a v2 batch header before its records; `batchLength` counts from byte 12.
const HEADER: usize = 61;
const LENGTH_BASE: usize = 12;
/// The fewest bytes an uncompressed record takes (length, attributes, timestamp and offset
/// deltas, key and value lengths, header count: a byte each).
const MIN_RECORD: usize = 7;
/// Records one batch may hold at most: bounds what the decoder allocates from the count on the
/// wire before it has read a record, compressed batches included.
pub const MAX_BATCH_RECORDS: i32 = 1 << 20;

/// Why a producer's records were refused (the batch's records are stored all or none).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record batch {index}: {reason}")]
    Corrupt { index: usize, reason: String },
    #[error("record {index}: {reason}")]
    Invalid { index: usize, reason: String },
    #[error("record {index}: {reason}")]
    InvalidTimestamp { index: usize, reason: String },
}

/// The batches of a produce request's `records`, checked: each batch's length within the
/// bytes, magic 2, its CRC-32C, and a record count the bytes (or the limit, when compressed)
/// can hold. Nothing is decoded before every batch passes.
pub fn check_batches(records: &Bytes) -> Result<Vec<Bytes>, RecordError> {
    let mut batches = Vec::new();
    let mut at = 0usize;
    while at < records.len() {
        let index = batches.len();
        let corrupt = |reason: String| RecordError::Corrupt { index, reason };
        let rest = &records[at..];
        if rest.len() < HEADER {
            return Err(corrupt(format!(
                "{} bytes left, a batch header takes {HEADER}",
                rest.len()
            )));
        }
        let length = i32::from_be_bytes(rest[8..12].try_into().expect("4 bytes"));
        let length = usize::try_from(length)
            .ok()
            .filter(|l| (HEADER - LENGTH_BASE..=rest.len() - LENGTH_BASE).contains(l))
            .ok_or_else(|| {
                corrupt(format!(
                    "batch length {length} outside [{}, {}]",
                    HEADER - LENGTH_BASE,
                    rest.len() - LENGTH_BASE
                ))
            })?;
        let batch = &rest[..LENGTH_BASE + length];
        if batch[16] != 2 {
            return Err(corrupt(format!(
                "magic {} (only record batch v2 is supported)",
                batch[16]
            )));
        }
        let crc = u32::from_be_bytes(batch[17..21].try_into().expect("4 bytes"));
        if crc32c::crc32c(&batch[21..]) != crc {
            return Err(corrupt("CRC mismatch".into()));
        }
        let attributes = i16::from_be_bytes(batch[21..23].try_into().expect("2 bytes"));
        let compressed = attributes & 0x7 != 0;
        let count = i32::from_be_bytes(batch[57..61].try_into().expect("4 bytes"));
        // As Kafka's log validator: a batch holds records, and its offset range is its count.
        let last_offset_delta = i32::from_be_bytes(batch[23..27].try_into().expect("4 bytes"));
        if count < 1 || i64::from(last_offset_delta) + 1 != i64::from(count) {
            return Err(corrupt(format!(
                "an offset range of {} for {count} records",
                i64::from(last_offset_delta) + 1
            )));
        }
        let room = (batch.len() - HEADER) / MIN_RECORD;
        let fits = (0..=MAX_BATCH_RECORDS).contains(&count)
            && (compressed || usize::try_from(count).is_ok_and(|c| c <= room));
        if !fits {
            return Err(corrupt(format!(
                "{count} records in {} bytes",
                batch.len() - HEADER
            )));
        }
        if attributes & 0x10 != 0 {
            return Err(corrupt(
                "transactional batches are not supported (transactions are out of scope)".into(),
            ));
        }
        if attributes & 0x20 != 0 {
            return Err(corrupt(
                "control batches are not accepted from producers".into(),
            ));
        }
        batches.push(records.slice(at..at + batch.len()));
        at += batch.len();
    }
    Ok(batches)
}

/// Whether a checked batch's records are compressed (any codec).
pub fn is_compressed(batch: &Bytes) -> bool {
    i16::from_be_bytes([batch[21], batch[22]]) & 0x7 != 0
}

/// The records of one checked batch.
pub fn decode_batch(index: usize, batch: &Bytes) -> Result<Vec<Record>, RecordError> {
    let mut buf = batch.clone();
    let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| {
        // A header key that is not UTF-8 is a record the raw schema cannot hold (its header
        // keys are text), not a malformed batch: CORRUPT_MESSAGE is retried by clients.
        if e.chain().any(|c| c.is::<std::str::Utf8Error>()) {
            RecordError::Invalid {
                index,
                reason: format!("a header key is not UTF-8 ({e}): topics keep header keys as text"),
            }
        } else {
            RecordError::Corrupt {
                index,
                reason: e.to_string(),
            }
        }
    })?;
    if buf.has_remaining() {
        return Err(RecordError::Corrupt {
            index,
            reason: format!("{} bytes after its records", buf.remaining()),
        });
    }
    Ok(set.records)
}

/// The idempotent producer's batch `records` make (all of one producer and epoch, sequences
/// consecutive across the request's batches), `None` for records of no producer.
pub fn writer_batch(records: &[Record]) -> Result<Option<mink_node::WriterBatchId>, RecordError> {
    let Some(first) = records.first() else {
        return Ok(None);
    };
    let corrupt = |reason: String| RecordError::Corrupt { index: 0, reason };
    if first.producer_id < 0 {
        if let Some(r) = records.iter().find(|r| r.producer_id >= 0) {
            return Err(corrupt(format!(
                "records of producer {} after records of none",
                r.producer_id
            )));
        }
        return Ok(None);
    }
    for (i, r) in records.iter().enumerate() {
        let expected = i64::from(first.sequence) + i as i64;
        if r.producer_id != first.producer_id
            || r.producer_epoch != first.producer_epoch
            || i64::from(r.sequence) != expected
        {
            return Err(corrupt(format!(
                "record {i}: producer {} epoch {} sequence {}, expected producer {} epoch {} sequence {expected}",
                r.producer_id,
                r.producer_epoch,
                r.sequence,
                first.producer_id,
                first.producer_epoch
            )));
        }
    }
    let (Ok(writer_id), Ok(writer_epoch), Ok(first_sequence)) = (
        u64::try_from(first.producer_id),
        u64::try_from(first.producer_epoch),
        u64::try_from(first.sequence),
    ) else {
        return Err(corrupt(format!(
            "producer {} epoch {} sequence {}: negative",
            first.producer_id, first.producer_epoch, first.sequence
        )));
    };
    Ok(Some(mink_node::WriterBatchId {
        writer_id,
        writer_epoch,
        first_sequence,
        last_sequence: first_sequence + records.len() as u64 - 1,
        any_first_sequence: true,
    }))
}

/// The schema of a topic created over Kafka: a record as it is produced.
pub fn raw_schema() -> Schema {
    mink_log::raw::schema()
}

/// Whether `schema` is the raw schema (a topic's records stored as they are).
pub fn is_raw(schema: &Schema) -> bool {
    mink_log::raw::is_raw(schema)
}

/// Records as rows of the raw schema.
pub fn raw_rows(records: &[Record]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let headers: Vec<Vec<mink_log::raw::Header<'_>>> = records
        .iter()
        .map(|r| {
            r.headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_deref()))
                .collect()
        })
        .collect();
    mink_log::raw::rows(
        records
            .iter()
            .zip(&headers)
            .map(|(r, h)| mink_log::raw::Record {
                key: r.key.as_deref(),
                value: r.value.as_deref(),
                headers: h,
                timestamp_ms: r.timestamp,
            }),
    )
}

/// Raw rows stored from `base_offset` on, appended to `out` as one uncompressed v2 record
/// batch: each row a record at its offset, with its key, value, headers and time.
pub fn encode_raw(batch: &RecordBatch, base_offset: u64, out: &mut BytesMut) {
    let schema: SchemaRef = batch.schema();
    let column = |name: &str| schema.index_of(name).ok().map(|i| batch.column(i));
    let keys = column("key").map(|c| c.as_binary::<i32>());
    let values = column("value").map(|c| c.as_binary::<i32>());
    let headers = column("headers").map(|c| c.as_list::<i32>());
    let timestamps = column("timestamp").map(|c| c.as_primitive::<TimestampMicrosecondType>());
    // Header entries, when any row has some: (keys, values, each row's range of entries).
    let entries = headers.filter(|h| !h.values().is_empty()).map(|h| {
        let entries = h.values().as_struct();
        (
            entries.column(0).as_string::<i32>(),
            entries.column(1).as_binary::<i32>(),
            h,
        )
    });
    let mut row_headers: Vec<mink_log::raw::Header<'_>> = Vec::new();
    let mut header_at = Vec::with_capacity(batch.num_rows() + 1);
    header_at.push(0);
    for i in 0..batch.num_rows() {
        if let Some((k, v, h)) = entries.filter(|(_, _, h)| h.is_valid(i)) {
            let range = h.value_offsets()[i].as_usize()..h.value_offsets()[i + 1].as_usize();
            row_headers.extend(range.map(|j| (k.value(j), v.is_valid(j).then(|| v.value(j)))));
        }
        header_at.push(row_headers.len());
    }
    let records: Vec<mink_log::raw::Record<'_>> = (0..batch.num_rows())
        .map(|i| mink_log::raw::Record {
            key: binary(keys, i),
            value: binary(values, i),
            headers: &row_headers[header_at[i]..header_at[i + 1]],
            timestamp_ms: timestamps.map_or(-1, |t| t.value(i) / 1000),
        })
        .collect();
    encode_batch(&records, base_offset, out);
}

/// About the bytes [`encode_raw`] writes for `batch` (a capacity to reserve: exact for keys and
/// values, estimated for headers).
pub fn raw_size_bound(batch: &RecordBatch) -> usize {
    let data = |name: &str| {
        batch
            .column_by_name(name)
            .map_or(0, |c| match c.as_binary_opt::<i32>() {
                Some(b) => (b.value_offsets()[b.len()] - b.value_offsets()[0]).as_usize(),
                // Headers: their entries' keys and values, and their lengths.
                None => c.get_array_memory_size(),
            })
    };
    HEADER + 39 * batch.num_rows() + data("key") + data("value") + data("headers")
}

/// Row `i` of a nullable binary column (`None` when there is no such column).
fn binary(column: Option<&arrow::array::BinaryArray>, i: usize) -> Option<&[u8]> {
    column.filter(|a| a.is_valid(i)).map(|a| a.value(i))
}

/// `records` at consecutive offsets from `base_offset`, appended to `out` as one uncompressed
/// v2 record batch (what a broker returns for a batch its producer did not compress), with the
/// producer's times (CreateTime).
pub fn encode_batch(records: &[mink_log::raw::Record<'_>], base_offset: u64, out: &mut BytesMut) {
    encode_batch_as(records, base_offset, 0, out);
}

/// The attributes bit of a batch whose time is the broker's (LogAppendTime), not its
/// producer's.
const LOG_APPEND_TIME: i16 = 1 << 3;

fn encode_batch_as(
    records: &[mink_log::raw::Record<'_>],
    base_offset: u64,
    attributes: i16,
    out: &mut BytesMut,
) {
    let Some(first) = records.first() else {
        return;
    };
    let (min_time, max_time) = records
        .iter()
        .fold((first.timestamp_ms, first.timestamp_ms), |(lo, hi), r| {
            (lo.min(r.timestamp_ms), hi.max(r.timestamp_ms))
        });
    let start = out.len();
    // At most: a record's length, attributes, two deltas, two lengths and a count take 39
    // bytes; a header's two lengths 10.
    out.reserve(
        HEADER
            + records
                .iter()
                .map(|r| {
                    39 + r.key.map_or(0, <[u8]>::len)
                        + r.value.map_or(0, <[u8]>::len)
                        + r.headers
                            .iter()
                            .map(|(k, v)| 10 + k.len() + v.map_or(0, <[u8]>::len))
                            .sum::<usize>()
                })
                .sum::<usize>(),
    );
    out.put_i64(i64::try_from(base_offset).unwrap_or(i64::MAX));
    out.put_i32(0); // the batch's length, filled in below
    out.put_i32(NO_PARTITION_LEADER_EPOCH);
    out.put_i8(2);
    out.put_u32(0); // the CRC, filled in below
    out.put_i16(attributes); // uncompressed, not transactional
    out.put_i32(i32::try_from(records.len() - 1).unwrap_or(i32::MAX));
    out.put_i64(min_time);
    out.put_i64(max_time);
    out.put_i64(NO_PRODUCER_ID);
    out.put_i16(NO_PRODUCER_EPOCH);
    out.put_i32(NO_SEQUENCE);
    out.put_i32(i32::try_from(records.len()).unwrap_or(i32::MAX));
    let length = |b: Option<&[u8]>| b.map_or(-1, |b| i64::try_from(b.len()).unwrap_or(i64::MAX));
    for (delta, r) in records.iter().enumerate() {
        let delta = i64::try_from(delta).unwrap_or(i64::MAX);
        let time = r.timestamp_ms - min_time;
        let mut size = 1 + varint_len(time) + varint_len(delta);
        for part in [r.key, r.value] {
            size += varint_len(length(part)) + part.map_or(0, <[u8]>::len);
        }
        size += varint_len(r.headers.len() as i64);
        for (k, v) in r.headers {
            size += varint_len(k.len() as i64) + k.len() + varint_len(length(*v));
            size += v.map_or(0, <[u8]>::len);
        }
        put_varint(out, size as i64);
        out.put_i8(0);
        put_varint(out, time);
        put_varint(out, delta);
        for part in [r.key, r.value] {
            put_varint(out, length(part));
            out.put_slice(part.unwrap_or_default());
        }
        put_varint(out, r.headers.len() as i64);
        for (k, v) in r.headers {
            put_varint(out, k.len() as i64);
            out.put_slice(k.as_bytes());
            put_varint(out, length(*v));
            out.put_slice(v.unwrap_or_default());
        }
    }
    let batch_length = i32::try_from(out.len() - start - LENGTH_BASE).unwrap_or(i32::MAX);
    out[start + 8..start + 12].copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::crc32c(&out[start + 21..]);
    out[start + 17..start + 21].copy_from_slice(&crc.to_be_bytes());
}

/// A zigzag varint (Kafka's `varint` and `varlong`).
fn put_varint(out: &mut BytesMut, v: i64) {
    #[allow(clippy::cast_sign_loss)] // zigzag: the sign moves to the lowest bit
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// An unsigned varint (Kafka's `unsigned_varint`: compact lengths, tagged field counts).
pub(crate) fn put_uvarint(out: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        #[allow(clippy::cast_possible_truncation)] // the low 7 bits
        out.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)] // below 0x80
    out.put_u8(v as u8);
}

/// The bytes [`put_varint`] writes for `v`.
fn varint_len(v: i64) -> usize {
    #[allow(clippy::cast_sign_loss)]
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - z.leading_zeros() as usize).max(1).div_ceil(7)
}

/// `records` (consecutive offsets) as one uncompressed v2 record batch.
pub fn encode_records(records: &[Record]) -> Result<Bytes, RecordError> {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| RecordError::Corrupt {
        index: 0,
        reason: e.to_string(),
    })?;
    Ok(buf.freeze())
}

/// Records whose values are JSON objects as rows of a typed table (`schema`): a value that is
/// not an object of the table's columns, with values of their types, fails its record.
pub fn json_rows(schema: &SchemaRef, records: &[Record]) -> Result<RecordBatch, RecordError> {
    let values: Vec<Option<&[u8]>> = records.iter().map(|r| r.value.as_deref()).collect();
    mink_log::json::rows(schema, &values).map_err(|e| RecordError::Invalid {
        index: e.index,
        reason: e.reason,
    })
}

/// Rows of a typed table stored from `base_offset` on, appended to `out` as one record batch
/// whose values are the rows as JSON objects (no key; nulls left out; durations as counts of
/// their unit and a float's NaN and infinities as "NaN", "inf" and "-inf", which a produce
/// takes back, as `mink scan -f json` writes them), each with its
/// stored batch's time (LogAppendTime).
pub fn encode_json(
    batch: &RecordBatch,
    base_offset: u64,
    timestamp_ms: i64,
    out: &mut BytesMut,
) -> Result<(), arrow::error::ArrowError> {
    let mut values = Vec::new();
    let mut w = mink_log::export::json_writer_builder()
        .build::<_, arrow::json::writer::LineDelimited>(&mut values);
    w.write(&mink_log::export::text_batch(batch)?)?;
    w.finish()?;
    let records: Vec<mink_log::raw::Record<'_>> = values
        .split(|b| *b == b'\n')
        .take(batch.num_rows())
        .map(|line| mink_log::raw::Record {
            key: None,
            value: Some(line),
            headers: &[],
            timestamp_ms,
        })
        .collect();
    // The batch's room at once: the JSON is only known here, after the response was sized.
    out.reserve(HEADER + 39 * records.len() + values.len());
    encode_batch_as(&records, base_offset, LOG_APPEND_TIME, out);
    Ok(())
}

/// The first row of a batch of raw `timestamp`s (microseconds) at or after `timestamp_ms`: its
/// index and its time in milliseconds.
pub fn first_at_or_after(batch: &RecordBatch, timestamp_ms: i64) -> Option<(usize, i64)> {
    let times = batch.column(0).as_primitive::<TimestampMicrosecondType>();
    let at = timestamp_ms.saturating_mul(1000);
    (0..times.len())
        .find(|&i| times.is_valid(i) && times.value(i) >= at)
        .map(|i| (i, times.value(i) / 1000))
}
