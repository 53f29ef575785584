//! Versioned binary encoding of log rows and snapshots.
//!
//! Every encoded value starts with a format version byte, followed by a protobuf message. The
//! byte changes only if the framing itself changes; commands and records evolve inside the
//! protobuf by the rules in [`crate::command`].

use prost::Message;

use crate::command::Command;
use crate::record::*;
use crate::state::State;

/// Leading byte of every encoded row and snapshot this binary writes.
pub const FORMAT_VERSION: u8 = 1;

/// Identifies the process that proposed a row: `(node, node epoch, row sequence)`, plus the
/// process incarnation so that two processes claiming the same epoch are told apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
pub struct RowToken {
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    #[prost(uint64, tag = "2")]
    pub node_epoch: u64,
    #[prost(uint64, tag = "3")]
    pub incarnation: u64,
    #[prost(uint64, tag = "4")]
    pub sequence: u64,
}

/// One row of the command log: a group-committed batch of commands from one process.
#[derive(Clone, PartialEq, Eq)]
pub struct Row {
    pub token: RowToken,
    /// The proposer's wall clock when the row was sealed; the only time apply sees for
    /// commands that do not carry their own.
    pub proposed_at_ms: u64,
    pub commands: Vec<Command>,
}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row")
            .field("token", &self.token)
            .field("proposed_at_ms", &self.proposed_at_ms)
            .field("commands", &self.commands.len())
            .finish()
    }
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct CommandEnvelope {
    #[prost(
        oneof = "Command",
        tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 50, 51, 52, 53, 54, 55"
    )]
    command: Option<Command>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct RowProto {
    #[prost(message, optional, tag = "1")]
    token: Option<RowToken>,
    #[prost(uint64, tag = "2")]
    proposed_at_ms: u64,
    #[prost(message, repeated, tag = "3")]
    commands: Vec<CommandEnvelope>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct SnapshotProto {
    #[prost(uint64, tag = "1")]
    applied_index: u64,
    #[prost(uint32, tag = "2")]
    metadata_version: u32,
    #[prost(message, optional, tag = "3")]
    counters: Option<Counters>,
    #[prost(message, optional, tag = "4")]
    coordinator: Option<CoordinatorRecord>,
    #[prost(message, repeated, tag = "5")]
    nodes: Vec<NodeRecord>,
    #[prost(message, repeated, tag = "6")]
    row_tokens: Vec<RowTokenRecord>,
    #[prost(message, repeated, tag = "7")]
    streams: Vec<StreamRecord>,
    #[prost(message, repeated, tag = "8")]
    ranges: Vec<RangeRecord>,
    #[prost(message, repeated, tag = "9")]
    objects: Vec<ObjectRecord>,
    #[prost(message, repeated, tag = "10")]
    writers: Vec<WriterRecord>,
    #[prost(message, repeated, tag = "11")]
    kv: Vec<KvRecord>,
    #[prost(message, repeated, tag = "12")]
    databases: Vec<DatabaseRecord>,
    #[prost(message, repeated, tag = "13")]
    tables: Vec<TableRecord>,
    #[prost(message, repeated, tag = "14")]
    partitions: Vec<PartitionRecord>,
    #[prost(message, repeated, tag = "15")]
    buckets: Vec<BucketRecord>,
    #[prost(message, repeated, tag = "16")]
    kv_snapshots: Vec<KvSnapshotRecord>,
    #[prost(message, repeated, tag = "17")]
    lake_snapshots: Vec<LakeSnapshotRecord>,
    #[prost(message, repeated, tag = "18")]
    sequences: Vec<SequenceRecord>,
    #[prost(message, repeated, tag = "19")]
    producer_offsets: Vec<ProducerOffsetsRecord>,
    #[prost(message, repeated, tag = "20")]
    group_offsets: Vec<GroupOffsetRecord>,
}

/// Why bytes could not be decoded. A log row that fails to decode stops the sink.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("empty payload")]
    Empty,
    #[error("unknown format version {found} (this binary reads version {FORMAT_VERSION})")]
    UnknownFormat { found: u8 },
    #[error("malformed protobuf: {0}")]
    Malformed(String),
    #[error("row has no token")]
    MissingToken,
    #[error(
        "command #{position} is unknown to this binary (written by a newer version, or corrupt)"
    )]
    UnknownCommand { position: usize },
    #[error(
        "command #{position} ({name}) needs metadata_version {since}, this binary supports up to {supported}"
    )]
    CommandTooNew {
        position: usize,
        name: &'static str,
        since: u32,
        supported: u32,
    },
    #[error(
        "snapshot is at metadata_version {found}, this binary supports up to {supported}: upgrade this node"
    )]
    SnapshotTooNew { found: u32, supported: u32 },
}

fn strip_version(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    match bytes.split_first() {
        None => Err(DecodeError::Empty),
        Some((&FORMAT_VERSION, rest)) => Ok(rest),
        Some((&found, _)) => Err(DecodeError::UnknownFormat { found }),
    }
}

/// Encodes a row: version byte, then the protobuf.
pub fn encode_row(row: &Row) -> Vec<u8> {
    let proto = RowProto {
        token: Some(row.token),
        proposed_at_ms: row.proposed_at_ms,
        commands: row
            .commands
            .iter()
            .map(|c| CommandEnvelope {
                command: Some(c.clone()),
            })
            .collect(),
    };
    let mut out = Vec::with_capacity(1 + proto.encoded_len());
    out.push(FORMAT_VERSION);
    proto.encode(&mut out).expect("Vec grows as needed");
    out
}

/// Encoded size of one command inside a row (for group-commit byte bounds).
pub fn encoded_command_len(command: &Command) -> usize {
    let envelope = CommandEnvelope {
        command: Some(command.clone()),
    };
    prost::length_delimiter_len(envelope.encoded_len()) + envelope.encoded_len() + 1
}

/// Decodes a row. `supported_version` is the highest `metadata_version` this binary supports:
/// a command introduced after it is refused exactly as an older binary, which lacks the
/// variant, would refuse it.
pub fn decode_row(bytes: &[u8], supported_version: u32) -> Result<Row, DecodeError> {
    let proto = RowProto::decode(strip_version(bytes)?)
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let token = proto.token.ok_or(DecodeError::MissingToken)?;
    let mut commands = Vec::with_capacity(proto.commands.len());
    for (position, envelope) in proto.commands.into_iter().enumerate() {
        let command = envelope
            .command
            .ok_or(DecodeError::UnknownCommand { position })?;
        if command.since() > supported_version {
            return Err(DecodeError::CommandTooNew {
                position,
                name: command.name(),
                since: command.since(),
                supported: supported_version,
            });
        }
        commands.push(command);
    }
    Ok(Row {
        token,
        proposed_at_ms: proto.proposed_at_ms,
        commands,
    })
}

/// Encodes the whole state at `applied_index`. Deterministic: the same state gives the same
/// bytes in every process.
pub fn encode_snapshot(applied_index: u64, state: &State) -> Vec<u8> {
    fn all<K: Ord + Clone, V: Clone>(map: &imbl::OrdMap<K, V>) -> Vec<V> {
        map.values().cloned().collect()
    }
    let proto = SnapshotProto {
        applied_index,
        metadata_version: state.metadata_version,
        counters: Some(state.counters.clone()),
        coordinator: state.coordinator.clone(),
        nodes: all(&state.nodes),
        row_tokens: all(&state.row_tokens),
        streams: all(&state.streams),
        ranges: all(&state.ranges),
        objects: all(&state.objects),
        writers: all(&state.writers),
        kv: all(&state.kv),
        databases: all(&state.databases),
        tables: all(&state.tables),
        partitions: all(&state.partitions),
        buckets: all(&state.buckets),
        kv_snapshots: all(&state.kv_snapshots),
        lake_snapshots: all(&state.lake_snapshots),
        sequences: all(&state.sequences),
        producer_offsets: all(&state.producer_offsets),
        group_offsets: all(&state.group_offsets),
    };
    let mut out = Vec::with_capacity(1 + proto.encoded_len());
    out.push(FORMAT_VERSION);
    proto.encode(&mut out).expect("Vec grows as needed");
    out
}

/// Decodes a snapshot into `(applied_index, state)`.
pub fn decode_snapshot(bytes: &[u8], supported_version: u32) -> Result<(u64, State), DecodeError> {
    let p = SnapshotProto::decode(strip_version(bytes)?)
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if p.metadata_version > supported_version {
        return Err(DecodeError::SnapshotTooNew {
            found: p.metadata_version,
            supported: supported_version,
        });
    }
    let state = State {
        metadata_version: p.metadata_version,
        counters: p.counters.unwrap_or_else(Counters::initial),
        coordinator: p.coordinator,
        nodes: p.nodes.into_iter().map(|r| (r.node_id, r)).collect(),
        row_tokens: p.row_tokens.into_iter().map(|r| (r.node_id, r)).collect(),
        streams: p.streams.into_iter().map(|r| (r.stream_id, r)).collect(),
        ranges: p
            .ranges
            .into_iter()
            .map(|r| ((r.stream_id, r.start_offset), r))
            .collect(),
        objects: p.objects.into_iter().map(|r| (r.object_id, r)).collect(),
        writers: p
            .writers
            .into_iter()
            .map(|r| ((r.stream_id, r.writer_id), r))
            .collect(),
        kv: p.kv.into_iter().map(|r| (r.key.clone(), r)).collect(),
        databases: p
            .databases
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect(),
        table_names: p
            .tables
            .iter()
            .map(|t| ((t.database.clone(), t.name.clone()), t.table_id))
            .collect(),
        tables: p.tables.into_iter().map(|r| (r.table_id, r)).collect(),
        partition_names: p
            .partitions
            .iter()
            .map(|r| ((r.table_id, r.name.clone()), r.partition_id))
            .collect(),
        partitions: p
            .partitions
            .into_iter()
            .map(|r| ((r.table_id, r.partition_id), r))
            .collect(),
        buckets: p
            .buckets
            .into_iter()
            .map(|r| ((r.table_id, r.partition_id, r.bucket), r))
            .collect(),
        kv_snapshots: p
            .kv_snapshots
            .into_iter()
            .map(|r| ((r.table_id, r.partition_id, r.bucket, r.snapshot_id), r))
            .collect(),
        lake_snapshots: p
            .lake_snapshots
            .into_iter()
            .map(|r| (r.table_id, r))
            .collect(),
        sequences: p
            .sequences
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect(),
        producer_offsets: p
            .producer_offsets
            .into_iter()
            .map(|r| (r.producer_id.clone(), r))
            .collect(),
        group_offsets: p
            .group_offsets
            .into_iter()
            .map(|r| {
                (
                    (r.group_id.clone(), r.table_id, r.partition_id, r.bucket),
                    r,
                )
            })
            .collect(),
    };
    Ok((p.applied_index, state))
}
