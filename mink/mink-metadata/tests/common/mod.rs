//! Shared helpers: concise command constructors and a row-at-a-time driver.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use mink_metadata::*;

pub const N1: NodeRef = NodeRef {
    node_id: 1,
    node_epoch: 1,
};
pub const N2: NodeRef = NodeRef {
    node_id: 2,
    node_epoch: 1,
};

/// Applies commands one row each, as node `token_node` would propose them.
pub struct Driver {
    pub state: State,
    pub index: u64,
    pub sequence: u64,
    pub supported: u32,
}

impl Default for Driver {
    fn default() -> Self {
        Driver {
            state: State::default(),
            index: 0,
            sequence: 0,
            supported: METADATA_VERSION,
        }
    }
}

impl Driver {
    pub fn row(
        &mut self,
        token_node: NodeRef,
        commands: Vec<Command>,
    ) -> Result<RowOutcome, Fatal> {
        self.sequence += 1;
        let row = Row {
            token: RowToken {
                node_id: token_node.node_id,
                node_epoch: token_node.node_epoch,
                incarnation: token_node.node_id * 1000 + token_node.node_epoch,
                sequence: self.sequence,
            },
            proposed_at_ms: 1_000 + self.index,
            commands,
        };
        self.apply(&row)
    }

    pub fn apply(&mut self, row: &Row) -> Result<RowOutcome, Fatal> {
        let index = self.index + 1;
        let ctx = ApplyContext {
            index,
            at_ms: row.proposed_at_ms,
            supported_version: self.supported,
        };
        let outcome = self.state.apply_row(&ctx, row)?;
        self.index = index;
        Ok(outcome)
    }

    /// Raises the cluster's `metadata_version` to `version` one step at a time, as the
    /// coordinator of epoch 1 does.
    pub fn upgrade_to(&mut self, version: u32) {
        for v in self.state.metadata_version + 1..=version {
            self.one(Command::UpgradeMetadataVersion(UpgradeMetadataVersion {
                coordinator_epoch: 1,
                version: v,
            }))
            .unwrap();
        }
    }

    /// Node 1 (supporting metadata_version `supported`) coordinating a cluster at `version`,
    /// with stream 1 open on it and `objects` object ids prepared for it (1 to `objects`).
    pub fn with_open_stream(supported: u32, version: u32, objects: u32) -> Driver {
        let mut d = Driver::default();
        d.one(register_supporting(N1, supported)).unwrap();
        d.one(coordinator(N1, 1)).unwrap();
        d.upgrade_to(version);
        d.one(Command::CreateStreams(CreateStreams { count: 1 }))
            .unwrap();
        d.one(open(N1, 1, 1)).unwrap();
        d.one(prepare(N1, objects)).unwrap();
        d
    }

    /// One command in its own row from node 1's first process.
    pub fn one(&mut self, command: Command) -> CommandResult {
        match self.row(N1, vec![command]).expect("not fatal") {
            RowOutcome::Applied(mut r) | RowOutcome::Fenced(mut r) => r.remove(0),
            RowOutcome::Duplicate(_) => panic!("unexpected duplicate"),
        }
    }
}

pub fn register(node: NodeRef) -> Command {
    register_supporting(node, METADATA_VERSION)
}

/// A registration by a binary that supports metadata_version `supported` (frozen fixtures
/// name theirs; they must not move with this binary's).
pub fn register_supporting(node: NodeRef, supported: u32) -> Command {
    Command::RegisterNode(RegisterNode {
        node_id: node.node_id,
        node_epoch: node.node_epoch,
        incarnation: node.node_id * 1000 + node.node_epoch,
        address: format!("10.0.0.{}:9123", node.node_id),
        supported_metadata_version: supported,
        listeners: BTreeMap::from([(
            "flight".to_string(),
            format!("10.0.0.{}:9123", node.node_id),
        )]),
    })
}

pub fn coordinator(node: NodeRef, term: u64) -> Command {
    Command::RegisterCoordinator(RegisterCoordinator {
        node_id: node.node_id,
        node_epoch: node.node_epoch,
        lease_term: term,
    })
}

pub fn open(node: NodeRef, stream_id: u64, stream_epoch: u64) -> Command {
    Command::OpenStream(OpenStream {
        node_id: node.node_id,
        node_epoch: node.node_epoch,
        stream_id,
        stream_epoch,
    })
}

pub fn prepare(node: NodeRef, count: u32) -> Command {
    Command::PrepareObject(PrepareObject {
        node_id: node.node_id,
        node_epoch: node.node_epoch,
        count,
        expires_at_ms: 60_000,
    })
}

pub fn range(stream_id: u64, stream_epoch: u64, start: u64, end: u64) -> StreamRange {
    StreamRange {
        stream_id,
        stream_epoch,
        start_offset: start,
        end_offset: end,
        writers: vec![],
    }
}

/// Node 1 (epoch 1) compacting stream 1's `[start, end)` from `sources` into stream object
/// `object_id` (2048 bytes).
pub fn stream_object(object_id: u64, start: u64, end: u64, sources: Vec<u64>) -> Command {
    Command::CompactStreamObject(CompactStreamObject {
        node_id: 1,
        node_epoch: 1,
        object_id,
        stream_id: 1,
        start_offset: start,
        end_offset: end,
        object_size: 2048,
        source_object_ids: sources,
    })
}

pub fn commit(node: NodeRef, object_id: u64, ranges: Vec<StreamRange>) -> Command {
    Command::CommitStreamSetObject(CommitStreamSetObject {
        node_id: node.node_id,
        node_epoch: node.node_epoch,
        object_id,
        object_size: 1024,
        ranges,
        compacted_object_ids: vec![],
    })
}

pub fn trim(node: NodeRef, stream_id: u64, stream_epoch: u64, to: u64) -> Command {
    Command::TrimStream(TrimStream {
        node_id: node.node_id,
        node_epoch: node.node_epoch,
        stream_id,
        stream_epoch,
        new_start_offset: to,
    })
}

pub fn database(name: &str) -> Command {
    Command::CreateDatabase(CreateDatabase {
        name: name.into(),
        ..Default::default()
    })
}

pub fn log_table(db: &str, name: &str, buckets: u32) -> Command {
    Command::CreateTable(CreateTable {
        database: db.into(),
        name: name.into(),
        schema: b"arrow-schema".to_vec(),
        bucket_count: buckets,
        options: BTreeMap::from([("table.log.ttl".into(), "7d".into())]),
        ..Default::default()
    })
}

pub fn pk_table(db: &str, name: &str, buckets: u32, options: &[(&str, &str)]) -> Command {
    Command::CreateTable(CreateTable {
        database: db.into(),
        name: name.into(),
        schema: b"arrow-schema".to_vec(),
        primary_key: vec!["id".into()],
        bucket_count: buckets,
        options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
}

pub fn lead(
    coordinator_epoch: u64,
    table_id: u64,
    partition_id: u64,
    bucket: u32,
    leader: u64,
) -> Command {
    Command::LeadBucket(LeadBucket {
        coordinator_epoch,
        table_id,
        partition_id,
        bucket,
        leader_node_id: leader,
    })
}

pub fn put(key: &str, value: &str) -> Command {
    Command::PutKv(PutKv {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    })
}
