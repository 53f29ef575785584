//! The object format: data blocks, an index, a footer.
//!
//! ```text
//! object  := block* index footer
//! block   := batch* crc32c(batches)                   one stream, contiguous offsets
//!                                                     (one stream may have several blocks,
//!                                                     with gaps between them)
//! batch   := base_offset:u64 count:u32 len:u32 max_timestamp_ms:i64 payload[len]
//! index   := entry* crc32c(entries)                   sorted by (stream, start offset)
//! entry   := stream_id:u64 start:u64 end:u64 position:u64 size:u32 batches:u32
//!            max_timestamp_ms:i64                     the largest of its batches'
//! footer  := index_position:u64 index_len:u32 entries:u32 version:u8 reserved[3]
//!            magic[8] crc32c(previous 28 bytes)       32 bytes, at the very end
//! ```
//!
//! That is version 2. Version 1 objects lack both `max_timestamp_ms` fields (batch headers of
//! 16 bytes, index entries of 40); they stay readable, with every time unknown
//! ([`UNKNOWN_TIME`]). The block entries' times are the stream's time index: a search by time
//! skips every block whose maximum is earlier, using only the index every read fetches anyway.
//!
//! All integers are little-endian. A reader fetches the footer and index from the object's
//! tail, picks the blocks that overlap the offsets it wants, and fetches only those byte
//! ranges. Every part carries a checksum; a reader never trusts a length it has not checked
//! against the bytes it holds.

use bytes::{BufMut, Bytes, BytesMut};

/// Format version written in every footer.
pub const FORMAT_VERSION: u8 = 2;
pub const MAGIC: [u8; 8] = *b"mink.s3o";
pub const FOOTER_LEN: usize = 32;
/// The time of a batch written before objects carried one (format version 1).
pub const UNKNOWN_TIME: i64 = -1;

/// Index entry bytes in an object of `version`.
fn entry_len(version: u8) -> usize {
    if version == 1 { 40 } else { 48 }
}

/// Batch header bytes in an object of `version`.
fn batch_header_len(version: u8) -> usize {
    if version == 1 { 16 } else { 24 }
}

/// A record batch of one stream: `count` offsets from `base_offset`; the payload is opaque to
/// the engine (Arrow IPC for log tablets, a changelog for KV tablets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordBatch {
    pub base_offset: u64,
    pub count: u32,
    /// Milliseconds since the Unix epoch the writer gave the batch (the latest time of its
    /// rows), or [`UNKNOWN_TIME`].
    pub timestamp_ms: i64,
    pub payload: Bytes,
}

impl RecordBatch {
    pub fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.count)
    }

    /// Encoded size inside a block.
    pub fn encoded_len(&self) -> usize {
        batch_header_len(FORMAT_VERSION) + self.payload.len()
    }
}

/// Where one data block lives and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockIndex {
    pub stream_id: u64,
    pub start_offset: u64,
    pub end_offset: u64,
    pub position: u64,
    pub size: u32,
    pub batch_count: u32,
    /// The latest time of the block's batches ([`UNKNOWN_TIME`] when none is known).
    pub max_timestamp_ms: i64,
    /// The format version of the object holding the block (how to decode it).
    pub version: u8,
}

impl BlockIndex {
    pub fn range(&self) -> std::ops::Range<u64> {
        self.position..self.position + u64::from(self.size)
    }
}

/// The parsed footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footer {
    pub index_position: u64,
    pub index_len: u32,
    pub entries: u32,
    pub version: u8,
}

/// Why bytes are not a valid object (or part of one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("object is {len} bytes, shorter than its footer")]
    TooShort { len: usize },
    #[error("bad magic: not an s3stream object")]
    BadMagic,
    #[error("unknown object format version {0}")]
    UnknownVersion(u8),
    #[error("{what} checksum mismatch")]
    Checksum { what: &'static str },
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
}

fn corrupt(what: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::Corrupt {
        what,
        detail: detail.into(),
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

struct OpenBlock {
    stream_id: u64,
    start_offset: u64,
    end_offset: u64,
    position: usize,
    batches: u32,
    max_timestamp_ms: i64,
}

/// Builds one object from record batches, stream by stream.
pub struct ObjectBuilder {
    buf: BytesMut,
    index: Vec<BlockIndex>,
    open: Option<OpenBlock>,
    block_target: usize,
}

impl std::fmt::Debug for ObjectBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectBuilder")
            .field("bytes", &self.buf.len())
            .field("blocks", &self.index.len())
            .finish_non_exhaustive()
    }
}

impl ObjectBuilder {
    /// Blocks are closed once they reach `block_target` bytes (a batch is never split), so a
    /// reader of a few offsets fetches about that much.
    pub fn new(block_target: usize) -> Self {
        Self::with_capacity(block_target, 0)
    }

    /// [`ObjectBuilder::new`] with room for `capacity` bytes up front: an object built from
    /// batches whose sizes are known grows without copying itself.
    pub fn with_capacity(block_target: usize, capacity: usize) -> Self {
        Self::with_buffer(block_target, BytesMut::with_capacity(capacity))
    }

    /// [`ObjectBuilder::new`] building in `buf` (cleared first): a buffer whose pages were
    /// written before costs no page faults.
    pub fn with_buffer(block_target: usize, mut buf: BytesMut) -> Self {
        buf.clear();
        ObjectBuilder {
            buf,
            index: Vec::new(),
            open: None,
            block_target: block_target.max(1),
        }
    }

    /// Appends a batch of `stream_id`. Streams come in ascending id order and the batches of
    /// one stream in ascending offset order; a gap between two batches starts a new block.
    pub fn push(&mut self, stream_id: u64, batch: &RecordBatch) -> Result<(), FormatError> {
        if batch.count == 0 {
            return Err(corrupt("batch", "a batch spans at least one offset"));
        }
        let len = u32::try_from(batch.payload.len())
            .map_err(|_| corrupt("batch", "payload over 4 GiB"))?;
        let continues = self.open.as_ref().is_some_and(|b| {
            b.stream_id == stream_id
                && b.end_offset == batch.base_offset
                && self.buf.len() - b.position < self.block_target
        });
        if !continues {
            // The most recent block is the open one, if any.
            let last = self
                .open
                .as_ref()
                .map(|b| (b.stream_id, b.end_offset))
                .or(self.index.last().map(|e| (e.stream_id, e.end_offset)));
            // Streams ascend; within a stream offsets ascend (a gap starts a new block).
            if let Some(last) = last
                && (stream_id < last.0 || (stream_id == last.0 && batch.base_offset < last.1))
            {
                return Err(corrupt(
                    "batch",
                    format!(
                        "stream {stream_id} offset {} does not follow stream {} offset {}",
                        batch.base_offset, last.0, last.1
                    ),
                ));
            }
            self.close_block();
            self.open = Some(OpenBlock {
                stream_id,
                start_offset: batch.base_offset,
                end_offset: batch.base_offset,
                position: self.buf.len(),
                batches: 0,
                max_timestamp_ms: UNKNOWN_TIME,
            });
        }
        self.buf.put_u64_le(batch.base_offset);
        self.buf.put_u32_le(batch.count);
        self.buf.put_u32_le(len);
        self.buf.put_i64_le(batch.timestamp_ms);
        self.buf.put_slice(&batch.payload);
        let open = self.open.as_mut().expect("a block is open");
        open.end_offset = batch.end_offset();
        open.batches += 1;
        open.max_timestamp_ms = open.max_timestamp_ms.max(batch.timestamp_ms);
        Ok(())
    }

    fn close_block(&mut self) {
        if let Some(b) = self.open.take() {
            let crc = crc32c::crc32c(&self.buf[b.position..]);
            self.buf.put_u32_le(crc);
            self.index.push(BlockIndex {
                stream_id: b.stream_id,
                start_offset: b.start_offset,
                end_offset: b.end_offset,
                position: b.position as u64,
                size: u32::try_from(self.buf.len() - b.position).expect("blocks stay small"),
                batch_count: b.batches,
                max_timestamp_ms: b.max_timestamp_ms,
                version: FORMAT_VERSION,
            });
        }
    }

    /// Bytes written so far (data blocks only).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty() && self.open.is_none()
    }

    /// Writes the index and footer; returns the object and its index.
    pub fn finish(mut self) -> (Bytes, Vec<BlockIndex>) {
        self.close_block();
        let index_position = self.buf.len() as u64;
        let index_start = self.buf.len();
        for e in &self.index {
            self.buf.put_u64_le(e.stream_id);
            self.buf.put_u64_le(e.start_offset);
            self.buf.put_u64_le(e.end_offset);
            self.buf.put_u64_le(e.position);
            self.buf.put_u32_le(e.size);
            self.buf.put_u32_le(e.batch_count);
            self.buf.put_i64_le(e.max_timestamp_ms);
        }
        let crc = crc32c::crc32c(&self.buf[index_start..]);
        self.buf.put_u32_le(crc);
        let index_len = u32::try_from(self.buf.len() - index_start).expect("index stays small");
        let footer_start = self.buf.len();
        self.buf.put_u64_le(index_position);
        self.buf.put_u32_le(index_len);
        self.buf
            .put_u32_le(u32::try_from(self.index.len()).expect("block count fits"));
        self.buf.put_u8(FORMAT_VERSION);
        self.buf.put_slice(&[0; 3]);
        self.buf.put_slice(&MAGIC);
        let crc = crc32c::crc32c(&self.buf[footer_start..]);
        self.buf.put_u32_le(crc);
        (self.buf.freeze(), self.index)
    }
}

/// Parses the footer from the object's last [`FOOTER_LEN`] bytes; `object_len` bounds it.
pub fn parse_footer(tail: &[u8], object_len: u64) -> Result<Footer, FormatError> {
    if tail.len() < FOOTER_LEN {
        return Err(FormatError::TooShort { len: tail.len() });
    }
    let f = &tail[tail.len() - FOOTER_LEN..];
    if f[20..28] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    if crc32c::crc32c(&f[..28]) != u32_at(f, 28) {
        return Err(FormatError::Checksum { what: "footer" });
    }
    let version = f[16];
    if !(1..=FORMAT_VERSION).contains(&version) {
        return Err(FormatError::UnknownVersion(version));
    }
    let footer = Footer {
        index_position: u64_at(f, 0),
        index_len: u32_at(f, 8),
        entries: u32_at(f, 12),
        version,
    };
    let index_end = footer
        .index_position
        .checked_add(u64::from(footer.index_len))
        .ok_or_else(|| corrupt("footer", "index position overflows"))?;
    if index_end + FOOTER_LEN as u64 != object_len
        || u64::from(footer.entries) * entry_len(version) as u64 + 4 != u64::from(footer.index_len)
    {
        return Err(corrupt(
            "footer",
            format!(
                "index at {}+{} with {} entries does not fit an object of {object_len} bytes",
                footer.index_position, footer.index_len, footer.entries
            ),
        ));
    }
    Ok(footer)
}

/// Parses the index block (exactly `footer.index_len` bytes).
pub fn parse_index(bytes: &[u8], footer: &Footer) -> Result<Vec<BlockIndex>, FormatError> {
    if bytes.len() != footer.index_len as usize {
        return Err(corrupt("index", "length differs from the footer's"));
    }
    let (entries, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(entries) != u32_at(crc, 0) {
        return Err(FormatError::Checksum { what: "index" });
    }
    let mut index = Vec::with_capacity(footer.entries as usize);
    let mut previous: Option<BlockIndex> = None;
    let version = footer.version;
    for chunk in entries.chunks_exact(entry_len(version)) {
        let e = BlockIndex {
            stream_id: u64_at(chunk, 0),
            start_offset: u64_at(chunk, 8),
            end_offset: u64_at(chunk, 16),
            position: u64_at(chunk, 24),
            size: u32_at(chunk, 32),
            batch_count: u32_at(chunk, 36),
            max_timestamp_ms: if version == 1 {
                UNKNOWN_TIME
            } else {
                i64_at(chunk, 40)
            },
            version,
        };
        let fits = e
            .position
            .checked_add(u64::from(e.size))
            .is_some_and(|end| end <= footer.index_position);
        let ordered = previous.is_none_or(|p| {
            (p.stream_id, p.end_offset) <= (e.stream_id, e.start_offset)
                && p.position + u64::from(p.size) <= e.position
        });
        if e.start_offset >= e.end_offset || !fits || !ordered || e.batch_count == 0 {
            return Err(corrupt("index", format!("entry {e:?} is inconsistent")));
        }
        previous = Some(e);
        index.push(e);
    }
    Ok(index)
}

/// Decodes one data block (exactly `entry.size` bytes): [`verify_block`], then
/// [`decode_verified_block`].
pub fn decode_block(bytes: &Bytes, entry: &BlockIndex) -> Result<Vec<RecordBatch>, FormatError> {
    verify_block(bytes, entry)?;
    decode_verified_block(bytes, entry)
}

/// Checks a data block's length and checksum against its index entry. A reader checks a block
/// once, as it comes from storage, and decodes it with [`decode_verified_block`] as often as
/// reads need it (fetches that start within a block decode it again).
pub fn verify_block(bytes: &[u8], entry: &BlockIndex) -> Result<(), FormatError> {
    let body_len = block_body_len(bytes, entry)?;
    if crc32c::crc32c(&bytes[..body_len]) != u32_at(bytes, body_len) {
        return Err(FormatError::Checksum { what: "block" });
    }
    Ok(())
}

/// The length of a block's batches (all but its trailing checksum), if the block is as long
/// as its index entry says.
fn block_body_len(bytes: &[u8], entry: &BlockIndex) -> Result<usize, FormatError> {
    if bytes.len() != entry.size as usize || bytes.len() < 4 {
        return Err(corrupt("block", "length differs from the index's"));
    }
    Ok(bytes.len() - 4)
}

/// Decodes a data block that passed [`verify_block`]: its batch headers are still checked
/// against the index entry, its checksum is not computed again.
pub fn decode_verified_block(
    bytes: &Bytes,
    entry: &BlockIndex,
) -> Result<Vec<RecordBatch>, FormatError> {
    let body_len = block_body_len(bytes, entry)?;
    let mut batches = Vec::with_capacity(entry.batch_count as usize);
    let mut at = 0;
    let mut next = entry.start_offset;
    let header_len = batch_header_len(entry.version);
    while at < body_len {
        if body_len - at < header_len {
            return Err(corrupt("block", "truncated batch header"));
        }
        let base_offset = u64_at(bytes, at);
        let count = u32_at(bytes, at + 8);
        let len = u32_at(bytes, at + 12) as usize;
        let timestamp_ms = if entry.version == 1 {
            UNKNOWN_TIME
        } else {
            i64_at(bytes, at + 16)
        };
        at += header_len;
        if len > body_len - at || base_offset != next || count == 0 {
            return Err(corrupt(
                "block",
                format!("batch at offset {base_offset} (expected {next}) is inconsistent"),
            ));
        }
        if timestamp_ms > entry.max_timestamp_ms {
            return Err(corrupt(
                "block",
                format!("batch at offset {base_offset} is later than its block"),
            ));
        }
        batches.push(RecordBatch {
            base_offset,
            count,
            timestamp_ms,
            payload: bytes.slice(at..at + len),
        });
        at += len;
        next = base_offset + u64::from(count);
    }
    if next != entry.end_offset || batches.len() != entry.batch_count as usize {
        return Err(corrupt("block", "batches do not match the index entry"));
    }
    Ok(batches)
}

/// Parses a whole object held in memory: its index and every block.
pub fn decode_object(object: &Bytes) -> Result<Vec<(BlockIndex, Vec<RecordBatch>)>, FormatError> {
    // Positions below were checked against the object's length, which is a usize.
    let at = |v: u64| usize::try_from(v).map_err(|_| corrupt("object", "position overflows"));
    let footer = parse_footer(object, object.len() as u64)?;
    let start = at(footer.index_position)?;
    let index = parse_index(&object[start..start + footer.index_len as usize], &footer)?;
    index
        .into_iter()
        .map(|e| {
            let range = e.range();
            let block = object.slice(at(range.start)?..at(range.end)?);
            Ok((e, decode_block(&block, &e)?))
        })
        .collect()
}
