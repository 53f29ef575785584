//! Arrow IPC encoding of schemas and stored batches.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use bytes::Bytes;

use crate::{LogError, LogResult};

/// How batches are stored (`table.log.arrow.compression.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Zstd,
}

/// Checks the framing of an Arrow IPC stream before anything reads it: every message's metadata
/// and body lengths must fit in the bytes actually present. The IPC reader allocates what a
/// length prefix claims, so seven hostile bytes could otherwise cost gigabytes.
fn check_framing(mut bytes: &[u8]) -> LogResult<()> {
    let bad = |why: &str| LogError::Invalid(format!("malformed Arrow IPC stream: {why}"));
    let i32_at = |b: &[u8]| i32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
    loop {
        if bytes.is_empty() {
            return Ok(());
        }
        if bytes.len() < 4 {
            return Err(bad("truncated message length"));
        }
        let rest = if bytes[..4] == [0xff; 4] {
            &bytes[4..]
        } else {
            bytes
        };
        if rest.len() < 4 {
            return Err(bad("truncated message length"));
        }
        let meta_len = i32_at(rest);
        let rest = &rest[4..];
        if meta_len == 0 {
            return Ok(()); // end of stream
        }
        let meta_len = usize::try_from(meta_len).map_err(|_| bad("negative metadata length"))?;
        if meta_len > rest.len() {
            return Err(bad("metadata longer than the data"));
        }
        let message = arrow::ipc::root_as_message(&rest[..meta_len])
            .map_err(|e| bad(&format!("invalid message: {e}")))?;
        let body =
            usize::try_from(message.bodyLength()).map_err(|_| bad("negative body length"))?;
        if body > rest.len() - meta_len {
            return Err(bad("body longer than the data"));
        }
        check_message(&rest[..meta_len], &rest[meta_len..meta_len + body])?;
        bytes = &rest[meta_len + body..];
    }
}

/// Most bytes a batch may claim once decompressed, and most rows: what a hostile length
/// field could otherwise make the IPC reader allocate.
pub const MAX_DECODED_BYTES: u64 = 1 << 30;
pub const MAX_ROWS: i64 = 1 << 28;

/// Checks one IPC message (flatbuffer `header`, `body`) before the IPC reader sees it: the
/// reader slices the body by the header's buffer offsets without bounds checks (a truncated or
/// crafted batch would panic it) and allocates what compressed buffers claim.
pub fn check_message(header: &[u8], body: &[u8]) -> LogResult<()> {
    let bad = |why: String| LogError::Invalid(format!("malformed Arrow IPC message: {why}"));
    let message =
        arrow::ipc::root_as_message(header).map_err(|e| bad(format!("invalid header: {e}")))?;
    let declared = message.bodyLength();
    if declared < 0 || declared as u64 > body.len() as u64 {
        return Err(bad(format!(
            "the header declares a body of {declared} bytes, {} arrived",
            body.len()
        )));
    }
    let batch = match (
        message.header_as_record_batch(),
        message.header_as_dictionary_batch(),
    ) {
        (Some(b), _) => b,
        (None, Some(d)) => d
            .data()
            .ok_or_else(|| bad("a dictionary batch without data".into()))?,
        (None, None) => return Ok(()),
    };
    if !(0..=MAX_ROWS).contains(&batch.length()) {
        return Err(bad(format!("a batch of {} rows", batch.length())));
    }
    for node in batch.nodes().iter().flatten() {
        if !(0..=MAX_ROWS).contains(&node.length()) || node.null_count() < 0 {
            return Err(bad(format!(
                "a column of {} values with {} nulls",
                node.length(),
                node.null_count()
            )));
        }
    }
    let compressed = batch.compression().is_some();
    let mut decoded: u64 = 0;
    for buffer in batch.buffers().iter().flatten() {
        let (offset, length) = (buffer.offset(), buffer.length());
        let end = offset.checked_add(length);
        if offset < 0 || length < 0 || end.is_none_or(|e| e > declared) {
            return Err(bad(format!(
                "a buffer at {offset}+{length} outside the body of {declared} bytes"
            )));
        }
        // Both fit: they lie within the body, which is in memory.
        let (offset, length) = (
            usize::try_from(offset).unwrap_or(usize::MAX),
            usize::try_from(length).unwrap_or(usize::MAX),
        );
        decoded += if compressed && length > 0 {
            let prefix = body
                .get(offset..offset + 8)
                .ok_or_else(|| bad("a compressed buffer shorter than its length prefix".into()))?;
            let n = i64::from_le_bytes(prefix.try_into().expect("8 bytes"));
            if n == -1 {
                length as u64
            } else {
                u64::try_from(n)
                    .map_err(|_| bad(format!("a compressed buffer claiming {n} bytes")))?
            }
        } else {
            length as u64
        };
    }
    if decoded > MAX_DECODED_BYTES {
        return Err(bad(format!(
            "the batch would decode to {decoded} bytes, more than the limit of {MAX_DECODED_BYTES}"
        )));
    }
    Ok(())
}

/// Encodes a schema as an Arrow IPC stream holding only the schema (what `CreateTable` stores).
pub fn encode_schema(schema: &Schema) -> LogResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, schema)?;
    writer.finish()?;
    drop(writer);
    Ok(out)
}

/// Decodes a schema sent by a client: an Arrow IPC stream (as [`encode_schema`] writes), or a
/// single encapsulated schema message (as pyarrow's `Schema.serialize()` writes).
pub fn decode_schema(bytes: &[u8]) -> LogResult<Schema> {
    check_framing(bytes)?;
    if let Ok(reader) = StreamReader::try_new(Cursor::new(bytes), None) {
        return Ok(reader.schema().as_ref().clone());
    }
    arrow::ipc::convert::try_schema_from_ipc_buffer(bytes)
        .map_err(|e| LogError::Invalid(format!("not an Arrow IPC schema: {e}")))
}

/// Encodes one batch as it is stored: a self-describing IPC stream.
pub fn encode_batch(batch: &RecordBatch, compression: Compression) -> LogResult<Bytes> {
    let options = match compression {
        Compression::None => IpcWriteOptions::default(),
        Compression::Zstd => {
            IpcWriteOptions::default().try_with_compression(Some(CompressionType::ZSTD))?
        }
    };
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new_with_options(&mut out, &batch.schema(), options)?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(Bytes::from(out))
}

/// One record batch as its Arrow IPC messages, as a frontend received it: the stream's schema
/// message and the batch message (flatbuffers, with or without padding) and its body. A log
/// tablet can store it as received ([`stored_as_received`]) instead of encoding it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcBatch {
    pub schema_header: Bytes,
    pub header: Bytes,
    pub body: Bytes,
}

/// The stored form of `ipc` (an IPC stream: its schema, its batch, the end marker), when it is
/// exactly what [`encode_batch`] would store for it under `schema` and `compression`: its
/// schema message is the table's current one, it holds one batch with no dictionaries, and
/// its buffers are compressed as the table's are. `None` otherwise (encode it instead).
/// The caller has checked the decoded batch (framing, types, nulls).
pub fn stored_as_received(
    ipc: &IpcBatch,
    schema: &Schema,
    compression: Compression,
) -> Option<Bytes> {
    // A dictionary batch travels in messages of its own: never stored from one message.
    if schema
        .fields()
        .iter()
        .any(|f| has_dictionary(f.data_type()))
    {
        return None;
    }
    let current = schema_header(schema);
    let trimmed = |b: &[u8]| -> usize { b.iter().rposition(|x| *x != 0).map_or(0, |i| i + 1) };
    if ipc.schema_header[..trimmed(&ipc.schema_header)] != current[..trimmed(&current)] {
        return None;
    }
    let message = arrow::ipc::root_as_message(&ipc.header).ok()?;
    let batch = message.header_as_record_batch()?;
    let codec = batch.compression().map(|c| c.codec());
    let matches = match compression {
        Compression::None => codec.is_none(),
        Compression::Zstd => codec == Some(CompressionType::ZSTD),
    };
    if !matches || usize::try_from(message.bodyLength()).ok()? != ipc.body.len() {
        return None;
    }
    // As arrow's stream writer frames it: prefix and metadata padded to 64 bytes.
    let padded = |header: &[u8]| (8 + header.len()).div_ceil(64) * 64 - 8;
    // Sized exactly: growing a buffer of a whole batch would copy it again.
    let mut out = Vec::with_capacity(
        8 + padded(&ipc.schema_header) + 8 + padded(&ipc.header) + ipc.body.len() + 8,
    );
    for (header, body) in [
        (&ipc.schema_header[..], &b""[..]),
        (&ipc.header[..], &ipc.body[..]),
    ] {
        let padded = padded(header);
        out.extend_from_slice(&[0xff; 4]);
        out.extend_from_slice(&i32::try_from(padded).ok()?.to_le_bytes());
        out.extend_from_slice(header);
        out.resize(out.len() + padded - header.len(), 0);
        out.extend_from_slice(body);
    }
    out.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    debug_assert_eq!(out.len(), out.capacity());
    Some(Bytes::from(out))
}

fn has_dictionary(t: &arrow::datatypes::DataType) -> bool {
    use arrow::datatypes::DataType as D;
    match t {
        D::Dictionary(..) => true,
        D::List(f)
        | D::LargeList(f)
        | D::FixedSizeList(f, _)
        | D::ListView(f)
        | D::LargeListView(f)
        | D::Map(f, _) => has_dictionary(f.data_type()),
        D::Struct(fields) => fields.iter().any(|f| has_dictionary(f.data_type())),
        D::Union(fields, _) => fields.iter().any(|(_, f)| has_dictionary(f.data_type())),
        D::RunEndEncoded(_, v) => has_dictionary(v.data_type()),
        _ => false,
    }
}

/// A stored batch's messages as they go on the wire, sliced from the stored bytes (no copy).
#[derive(Clone, Debug)]
pub struct WireBatch {
    /// The flatbuffer of the stream's schema message.
    pub schema_header: Bytes,
    /// The flatbuffer and body of its one record batch message (compressed as stored).
    pub header: Bytes,
    pub body: Bytes,
}

/// The messages of a stored batch, when it is a schema and one record batch (no dictionary
/// messages): what a reader can send as is, without decoding and encoding it again.
pub fn wire_batch(bytes: &Bytes) -> Option<WireBatch> {
    let mut at = 0usize;
    let mut schema_header = None;
    let mut batch = None;
    loop {
        let rest = bytes.get(at..)?;
        if rest.is_empty() {
            break;
        }
        let skip = if rest.len() >= 4 && rest[..4] == [0xff; 4] {
            4
        } else {
            0
        };
        let len_bytes: [u8; 4] = rest.get(skip..skip + 4)?.try_into().ok()?;
        let meta_len = usize::try_from(i32::from_le_bytes(len_bytes)).ok()?;
        if meta_len == 0 {
            break; // end of stream
        }
        let start = at + skip + 4;
        let header = bytes.get(start..start + meta_len)?;
        let message = arrow::ipc::root_as_message(header).ok()?;
        let body_len = usize::try_from(message.bodyLength()).ok()?;
        let body = bytes.get(start + meta_len..start + meta_len + body_len)?;
        if message.header_as_schema().is_some() && schema_header.is_none() {
            schema_header = Some(bytes.slice(start..start + meta_len));
        } else if message.header_as_record_batch().is_some() && batch.is_none() {
            check_message(header, body).ok()?;
            batch = Some((
                bytes.slice(start..start + meta_len),
                bytes.slice(start + meta_len..start + meta_len + body_len),
            ));
        } else {
            return None; // dictionaries, or more than one batch
        }
        at = start + meta_len + body_len;
    }
    let (header, body) = batch?;
    Some(WireBatch {
        schema_header: schema_header?,
        header,
        body,
    })
}

/// The flatbuffer of the schema message stored batches of `schema` carry (to recognise batches
/// written under the current schema).
pub fn schema_header(schema: &Schema) -> Bytes {
    let encoded = arrow::ipc::writer::IpcDataGenerator::default()
        .schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut arrow::ipc::writer::DictionaryTracker::new(false),
            &IpcWriteOptions::default(),
        );
    Bytes::from(encoded.ipc_message)
}

/// Whether a stored schema message (padded to the stream's alignment) is `current`'s.
pub fn same_schema_header(stored: &[u8], current: &[u8]) -> bool {
    stored.len() >= current.len()
        && stored[..current.len()] == *current
        && stored[current.len()..].iter().all(|b| *b == 0)
}

/// How many columns a stored batch was written with (its schema message's): more than a
/// reader's schema when the table grew after the reader started.
pub fn stored_columns(bytes: &Bytes) -> LogResult<usize> {
    check_framing(bytes)?;
    Ok(StreamReader::try_new(Cursor::new(&bytes[..]), None)?
        .schema()
        .fields()
        .len())
}

/// Decodes a stored batch. The bytes come from storage, so anything malformed is an error,
/// never a panic.
pub fn decode_batch(bytes: &[u8]) -> LogResult<RecordBatch> {
    decode_in_place(&Bytes::copy_from_slice(bytes), |_| None)
}

/// Decodes a stored batch, keeping the columns `projection` picks from the schema it was
/// stored under (all of them for `None`). A batch of one schema message and one record batch
/// message (what [`encode_batch`] and [`stored_as_received`] store) is decoded in place: its
/// arrays share `bytes` (a block read from storage or the log cache) instead of being copied
/// into fresh buffers, but for buffers not aligned for their type. Anything else (dictionaries,
/// or bytes the framing checks refuse) goes through the stream reader, which reports it.
fn decode_in_place(
    bytes: &Bytes,
    projection: impl FnOnce(&Schema) -> Option<Vec<usize>>,
) -> LogResult<RecordBatch> {
    let bad = |why: &str| LogError::Invalid(format!("malformed Arrow IPC stream: {why}"));
    let Some(wire) = wire_batch(bytes) else {
        check_framing(bytes)?;
        let stored = StreamReader::try_new(Cursor::new(&bytes[..]), None)?.schema();
        let mut reader =
            StreamReader::try_new(Cursor::new(&bytes[..]), projection(stored.as_ref()))?;
        return reader
            .next()
            .ok_or_else(|| LogError::Invalid("a stored batch holds no records".into()))?
            .map_err(Into::into);
    };
    let schema = arrow::ipc::root_as_message(&wire.schema_header)
        .ok()
        .and_then(|m| m.header_as_schema())
        .ok_or_else(|| bad("no schema message"))?;
    let schema = Arc::new(arrow::ipc::convert::fb_to_schema(schema));
    let message = arrow::ipc::root_as_message(&wire.header)
        .map_err(|e| bad(&format!("invalid header: {e}")))?;
    let batch = message
        .header_as_record_batch()
        .ok_or_else(|| bad("no record batch message"))?;
    let no_dictionaries = HashMap::new();
    Ok(match projection(&schema) {
        None => read_batch(
            &wire.body,
            batch,
            schema,
            &no_dictionaries,
            &message.version(),
        )?,
        // A narrow read decompresses only the columns it keeps.
        Some(projection) => arrow::ipc::reader::read_record_batch(
            &arrow::buffer::Buffer::from(wire.body.clone()),
            batch,
            schema,
            &no_dictionaries,
            Some(&projection),
            &message.version(),
        )?,
    })
}

/// Decodes the record batch message `batch` (its body `body`, checked by [`check_message`])
/// under `schema`, as arrow's `read_record_batch` does. ZSTD buffers are decompressed here,
/// with one decompression context per thread, into one body that the arrays then share:
/// arrow's reader creates a context for every batch, and creating one (a `cpuid`, which
/// traps on a virtual machine) was 4-6 % of a node's time taking client-routed ZSTD batches.
pub fn read_batch(
    body: &Bytes,
    batch: arrow::ipc::RecordBatch<'_>,
    schema: SchemaRef,
    dictionaries: &HashMap<i64, ArrayRef>,
    version: &arrow::ipc::MetadataVersion,
) -> Result<RecordBatch, ArrowError> {
    let codec = batch.compression().map(|c| c.codec());
    if codec != Some(CompressionType::ZSTD) {
        return arrow::ipc::reader::read_record_batch(
            &arrow::buffer::Buffer::from(body.clone()),
            batch,
            schema,
            dictionaries,
            None,
            version,
        );
    }
    let (layout, plain) = decompress_zstd(batch, body)?;
    let mut fbb = flatbuffers::FlatBufferBuilder::with_capacity(256);
    let nodes: Vec<arrow::ipc::FieldNode> = batch
        .nodes()
        .map(|n| n.iter().copied().collect())
        .unwrap_or_default();
    let nodes = fbb.create_vector(&nodes);
    let buffers = fbb.create_vector(&layout);
    let variadic = batch
        .variadicBufferCounts()
        .map(|v| fbb.create_vector_from_iter(v.iter()));
    let mut builder = arrow::ipc::RecordBatchBuilder::new(&mut fbb);
    builder.add_length(batch.length());
    builder.add_nodes(nodes);
    builder.add_buffers(buffers);
    if let Some(v) = variadic {
        builder.add_variadicBufferCounts(v);
    }
    let root = builder.finish();
    fbb.finish(root, None);
    let uncompressed = flatbuffers::root::<arrow::ipc::RecordBatch<'_>>(fbb.finished_data())
        .map_err(|e| ArrowError::IpcError(format!("re-encoding a decompressed batch: {e}")))?;
    arrow::ipc::reader::read_record_batch(&plain, uncompressed, schema, dictionaries, None, version)
}

thread_local! {
    static ZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// The buffers of a ZSTD-compressed batch decompressed into one body (each buffer 64-byte
/// aligned, as arrow's writer lays them out), with where each now lies.
fn decompress_zstd(
    batch: arrow::ipc::RecordBatch<'_>,
    body: &[u8],
) -> Result<(Vec<arrow::ipc::Buffer>, arrow::buffer::Buffer), ArrowError> {
    let bad = |why: String| ArrowError::IpcError(format!("a compressed batch: {why}"));
    let buffers = batch.buffers().ok_or_else(|| bad("no buffers".into()))?;
    // (start in the new body, length, the bytes as sent, whether they are stored raw)
    let mut parts = Vec::with_capacity(buffers.len());
    let mut total = 0usize;
    for b in buffers.iter() {
        let at = usize::try_from(b.offset()).map_err(|_| bad("a negative offset".into()))?;
        let len = usize::try_from(b.length()).map_err(|_| bad("a negative length".into()))?;
        let sent = at
            .checked_add(len)
            .and_then(|end| body.get(at..end))
            .ok_or_else(|| bad(format!("a buffer at {at}+{len} outside the body")))?;
        let (n, raw) = match sent.split_first_chunk::<8>() {
            None if sent.is_empty() => (0, true),
            None => return Err(bad("a buffer shorter than its length prefix".into())),
            Some((prefix, rest)) => match i64::from_le_bytes(*prefix) {
                -1 => (rest.len(), true),
                n => (
                    usize::try_from(n).map_err(|_| bad(format!("a buffer claiming {n} bytes")))?,
                    false,
                ),
            },
        };
        parts.push((total, n, sent.get(8..).unwrap_or_default(), raw));
        total = total
            .checked_add(n)
            .and_then(|t| t.checked_next_multiple_of(64))
            .filter(|t| *t as u64 <= MAX_DECODED_BYTES + 64 * parts.len() as u64)
            .ok_or_else(|| bad(format!("more than {MAX_DECODED_BYTES} bytes decompressed")))?;
    }
    let mut out = arrow::buffer::MutableBuffer::from_len_zeroed(total);
    ZSTD.with(|cell| {
        let mut cell = cell.borrow_mut();
        let zstd = match &mut *cell {
            Some(z) => z,
            empty => empty.insert(
                zstd::bulk::Decompressor::new().map_err(|e| bad(format!("a zstd context: {e}")))?,
            ),
        };
        for &(start, n, sent, raw) in &parts {
            let into = &mut out.as_slice_mut()[start..start + n];
            if raw {
                into.copy_from_slice(sent);
                continue;
            }
            let written = zstd
                .decompress_to_buffer(sent, into)
                .map_err(|e| bad(format!("zstd: {e}")))?;
            if written != n {
                return Err(bad(format!("{written} bytes decompressed, {n} declared")));
            }
        }
        Ok(())
    })?;
    let layout = parts
        .iter()
        .map(|&(start, n, ..)| arrow::ipc::Buffer::new(start as i64, n as i64))
        .collect();
    Ok((layout, out.into()))
}

/// The named `columns` of a stored batch (every column when empty), in the order given, as
/// the table's current `schema` has them: a column added after the batch was written reads as
/// nulls (see [`evolve`]). Only the named columns' buffers are decompressed and decoded, so a
/// narrow read of a wide table costs what its columns hold. Unknown names are an error.
pub fn decode_columns(
    bytes: &Bytes,
    schema: &SchemaRef,
    columns: &[String],
) -> LogResult<RecordBatch> {
    if columns.is_empty() {
        return evolve(schema, &decode_in_place(bytes, |_| None)?);
    }
    let indices = column_indices(schema, columns)?;
    // Stored columns are a prefix of the table's (evolution appends), so a column's stored
    // index is its index in the table, if the batch has it.
    let mut stored = 0;
    let batch = decode_in_place(bytes, |schema| {
        stored = schema.fields().len();
        let mut wanted: Vec<usize> = indices.iter().copied().filter(|&i| i < stored).collect();
        wanted.sort_unstable();
        wanted.dedup();
        if wanted.is_empty() && stored > 0 {
            wanted.push(0); // for the row count
        }
        Some(wanted)
    })?;
    let read = batch.schema();
    let arrays = indices
        .iter()
        .map(|&i| {
            let name = schema.field(i).name();
            match read.index_of(name) {
                Ok(at) if i < stored => Arc::clone(batch.column(at)),
                _ => arrow::array::new_null_array(schema.field(i).data_type(), batch.num_rows()),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(schema.project(&indices)?),
        arrays,
    )?)
}

/// The indices of the named columns in `schema`; an unknown name is an error.
fn column_indices(schema: &Schema, columns: &[String]) -> LogResult<Vec<usize>> {
    columns
        .iter()
        .map(|c| {
            schema.index_of(c).map_err(|_| {
                LogError::Invalid(format!(
                    "no column {c:?} (the columns: {})",
                    columns_of(schema)
                ))
            })
        })
        .collect()
}

/// Keeps the named columns, in the order given. Unknown names are an error.
pub fn project(batch: &RecordBatch, columns: &[String]) -> LogResult<RecordBatch> {
    if columns.is_empty() {
        return Ok(batch.clone());
    }
    let indices = column_indices(&batch.schema(), columns)?;
    Ok(batch.project(&indices)?)
}

/// Brings a stored batch to the table's current `schema`: columns added since it was written
/// (always nullable, see [`check_evolution`]) read as nulls.
pub fn evolve(schema: &SchemaRef, batch: &RecordBatch) -> LogResult<RecordBatch> {
    if batch.schema().fields().len() == schema.fields().len() {
        return Ok(batch.clone());
    }
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, field)| match batch.columns().get(i) {
            Some(c) => Arc::clone(c),
            None => arrow::array::new_null_array(field.data_type(), batch.num_rows()),
        })
        .collect();
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// The columns a log table's `t$log`, `t$lake` and Iceberg table add after its own: no column
/// of a table may take these names.
pub const SYSTEM_COLUMNS: [&str; 3] = ["__bucket", "__offset", "__timestamp"];

/// The column names of a new table, or of a grown one: each once, none of [`SYSTEM_COLUMNS`].
pub fn check_column_names(schema: &Schema) -> LogResult<()> {
    let mut names = std::collections::BTreeSet::new();
    for f in schema.fields() {
        if SYSTEM_COLUMNS.contains(&f.name().as_str()) {
            return Err(LogError::Invalid(format!(
                "column {:?}: the name is reserved for the system columns of t$log and the lake",
                f.name()
            )));
        }
        if !names.insert(f.name().as_str()) {
            return Err(LogError::Invalid(format!(
                "column {:?} appears twice",
                f.name()
            )));
        }
    }
    Ok(())
}

/// Schema evolution a log table allows: the same columns in the same order with the same types
/// and nullability, followed by new nullable columns (rows written before read them as null)
/// whose names are new ([`check_column_names`]).
pub fn check_evolution(old: &Schema, new: &Schema) -> LogResult<()> {
    if new.fields().len() < old.fields().len() {
        return Err(LogError::Invalid(
            "a column cannot be dropped from a log table".into(),
        ));
    }
    for (o, n) in old.fields().iter().zip(new.fields()) {
        if o.name() != n.name()
            || o.data_type() != n.data_type()
            || o.is_nullable() != n.is_nullable()
        {
            return Err(LogError::Invalid(format!(
                "column {:?} ({}) cannot change to {:?} ({}): only new nullable columns may be added at the end",
                o.name(),
                o.data_type(),
                n.name(),
                n.data_type()
            )));
        }
    }
    for n in &new.fields()[old.fields().len()..] {
        if !n.is_nullable() {
            return Err(LogError::Invalid(format!(
                "new column {:?} must be nullable: rows already written have no value for it",
                n.name()
            )));
        }
    }
    check_column_names(new)
}

/// `batch` with `column` (described by `field`) appended: a row kind for a primary-key table's
/// write, a column its input left out.
pub fn with_column(
    batch: &RecordBatch,
    field: Field,
    column: ArrayRef,
) -> Result<RecordBatch, ArrowError> {
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(field);
    let mut columns = batch.columns().to_vec();
    columns.push(column);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// `schema` with every column nullable: what a writer builds a batch as before the node checks
/// its nulls with messages naming the column (Arrow's own check names none).
pub fn all_nullable(schema: &Schema) -> Schema {
    Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    )
}

/// `schema`'s columns as a user writes them: `id Int64, name Utf8`.
pub fn columns_of(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks that `batch` can be stored in a table of `schema`: same column names and types in
/// order, and no null in a non-null column. Field metadata and nullability flags of the batch
/// itself do not matter.
pub fn check_batch(schema: &SchemaRef, batch: &RecordBatch) -> LogResult<RecordBatch> {
    let got = batch.schema();
    if got.fields().len() != schema.fields().len() {
        return Err(LogError::Invalid(format!(
            "the batch has {} columns, the table {}: expected {}",
            got.fields().len(),
            schema.fields().len(),
            columns_of(schema)
        )));
    }
    for (i, (want, have)) in schema.fields().iter().zip(got.fields()).enumerate() {
        if want.name() == have.name() && want.data_type() == have.data_type() {
            continue;
        }
        let mut ours: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let mut theirs: Vec<&str> = got.fields().iter().map(|f| f.name().as_str()).collect();
        ours.sort_unstable();
        theirs.sort_unstable();
        return Err(LogError::Invalid(
            if want.name() != have.name() && ours == theirs {
                format!(
                    "the batch has the table's columns in another order: {}; the table's is {}",
                    columns_of(&got),
                    columns_of(schema)
                )
            } else if want.name() != have.name() {
                format!(
                    "column {} is named {:?}, the table's is {:?} (names are case-sensitive): expected {}",
                    i + 1,
                    have.name(),
                    want.name(),
                    columns_of(schema)
                )
            } else {
                format!(
                    "column {:?} of type {} does not match the table's type {}",
                    have.name(),
                    have.data_type(),
                    want.data_type()
                )
            },
        ));
    }
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(LogError::Invalid(format!(
                "column {:?} is not nullable but holds {} null(s)",
                field.name(),
                column.null_count()
            )));
        }
    }
    // Stored with the table's own schema (its nullability and metadata).
    Ok(RecordBatch::try_new(
        Arc::clone(schema),
        batch.columns().to_vec(),
    )?)
}
