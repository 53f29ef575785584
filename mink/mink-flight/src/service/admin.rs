//! `DoAction`: admin, through the node's catalog and cluster operations.

use arrow_flight::Action;
use bytes::Bytes;
use mink_node::{NodeError, TableInfo, TableSpec};
use tonic::Status;

use super::MinkFlight;
use crate::protocol::{self, action};

impl MinkFlight {
    pub(super) async fn action(&self, action: &Action) -> Result<Bytes, Status> {
        let node = &self.node;
        let body = action.body.as_ref();
        let bad = |e: protocol::ProtocolError| self.invalid(e.0);
        let err = |e: NodeError| self.error(e);
        let empty = || protocol::to_json(&serde_json::json!({}));
        Ok(match action.r#type.as_str() {
            action::CREATE_DATABASE => {
                let a: protocol::CreateDatabase =
                    protocol::parse(action::CREATE_DATABASE, body).map_err(bad)?;
                node.create_database(&a.name, a.if_not_exists)
                    .await
                    .map_err(err)?;
                empty()
            }
            action::DROP_DATABASE => {
                let a: protocol::DropDatabase =
                    protocol::parse(action::DROP_DATABASE, body).map_err(bad)?;
                node.drop_database(&a.name, a.cascade, a.if_exists)
                    .await
                    .map_err(err)?;
                empty()
            }
            action::LIST_DATABASES => protocol::to_json(&protocol::Databases {
                databases: node.list_databases(),
            }),
            action::LIST_TABLES => {
                let a: protocol::ListTables =
                    protocol::parse(action::LIST_TABLES, body).map_err(bad)?;
                protocol::to_json(&protocol::Tables {
                    tables: node.list_tables(&a.database).map_err(err)?,
                })
            }
            action::CREATE_TABLE => {
                let a: protocol::CreateTable =
                    protocol::parse(action::CREATE_TABLE, body).map_err(bad)?;
                let schema = protocol::decode_schema(&a.schema).map_err(bad)?;
                let info = node
                    .create_table(TableSpec {
                        database: a.database,
                        name: a.table,
                        schema,
                        primary_key: a.primary_key,
                        options: a.options,
                        partition_keys: a.partition_keys,
                        comment: a.comment,
                        if_not_exists: a.if_not_exists,
                    })
                    .await
                    .map_err(err)?;
                protocol::to_json(&describe(&info).map_err(bad)?)
            }
            action::DROP_TABLE => {
                let a: protocol::DropTable =
                    protocol::parse(action::DROP_TABLE, body).map_err(bad)?;
                node.drop_table(&a.database, &a.table, a.if_exists)
                    .await
                    .map_err(err)?;
                empty()
            }
            action::ALTER_TABLE => {
                let a: protocol::AlterTable =
                    protocol::parse(action::ALTER_TABLE, body).map_err(bad)?;
                let schema = a
                    .schema
                    .as_deref()
                    .map(protocol::decode_schema)
                    .transpose()
                    .map_err(bad)?;
                let info = node
                    .alter_table(
                        &a.database,
                        &a.table,
                        mink_node::TableChange {
                            set_options: a.set_options,
                            reset_options: a.reset_options,
                            schema,
                        },
                    )
                    .await
                    .map_err(err)?;
                protocol::to_json(&describe(&info).map_err(bad)?)
            }
            action::DESCRIBE_TABLE => {
                let a: protocol::TableRef =
                    protocol::parse(action::DESCRIBE_TABLE, body).map_err(bad)?;
                let info = node.describe_table(&a.database, &a.table).map_err(err)?;
                protocol::to_json(&describe(&info).map_err(bad)?)
            }
            action::CREATE_PARTITION => {
                let a: protocol::PartitionRef =
                    protocol::parse(action::CREATE_PARTITION, body).map_err(bad)?;
                let p = node
                    .create_partition(&a.database, &a.table, &a.partition, a.if_not_exists)
                    .await
                    .map_err(err)?;
                protocol::to_json(&protocol::PartitionDescription {
                    partition_id: p.partition_id,
                    name: p.name,
                    values: p.values,
                    created_at_ms: p.created_at_ms,
                })
            }
            action::DROP_PARTITION => {
                let a: protocol::PartitionRef =
                    protocol::parse(action::DROP_PARTITION, body).map_err(bad)?;
                node.drop_partition(&a.database, &a.table, &a.partition, a.if_exists)
                    .await
                    .map_err(err)?;
                empty()
            }
            action::REPORT_TAIL_SCAN => {
                let a: protocol::TailScan =
                    protocol::parse(action::REPORT_TAIL_SCAN, body).map_err(bad)?;
                node.note_tail_scan(&a.database, &a.table, a.rows)
                    .map_err(err)?;
                empty()
            }
            action::WRITER_POSITIONS => {
                let a: protocol::WriterPositionsRequest =
                    protocol::parse(action::WRITER_POSITIONS, body).map_err(bad)?;
                let buckets = node
                    .writer_positions(&a.database, &a.table, a.writer_id)
                    .map_err(err)?
                    .into_iter()
                    .map(|p| protocol::WriterPosition {
                        partition: p.partition,
                        bucket: p.bucket,
                        writer_epoch: p.writer_epoch,
                        last_sequence: p.last_sequence,
                    })
                    .collect();
                protocol::to_json(&protocol::WriterPositions { buckets })
            }
            action::ALLOCATE_WRITER => {
                let w = node.allocate_writer().await.map_err(err)?;
                protocol::to_json(&protocol::Writer {
                    writer_id: w.writer_id,
                    writer_epoch: w.writer_epoch,
                })
            }
            action::DESCRIBE_CLUSTER => {
                let c = node.cluster_status().await.map_err(err)?;
                protocol::to_json(&protocol::ClusterDescription {
                    node_id: c.node_id,
                    applied_index: c.applied_index,
                    coordinator_node_id: c.coordinator.map(|(n, _)| n),
                    coordinator_epoch: c.coordinator.map(|(_, e)| e),
                    nodes: c
                        .nodes
                        .into_iter()
                        .map(|n| protocol::NodeDescription {
                            node_id: n.node_id,
                            node_epoch: n.node_epoch,
                            address: n.address,
                            live: n.live,
                            heartbeat_age_ms: n.heartbeat_age_ms,
                            buckets: n.buckets,
                            drained: n.drained,
                            listeners: n.listeners,
                        })
                        .collect(),
                    buckets_without_live_leader: c.buckets_without_live_leader,
                    lease_ttl_ms: Some(c.lease_ttl_ms),
                })
            }
            action::REBALANCE => {
                let a: protocol::Rebalance =
                    protocol::parse(action::REBALANCE, body).map_err(bad)?;
                protocol::to_json(&protocol::Rebalanced {
                    moves: node.rebalance(a.dry_run).await.map_err(err)?,
                })
            }
            action::DRAIN_NODE => {
                let a: protocol::DrainNode =
                    protocol::parse(action::DRAIN_NODE, body).map_err(bad)?;
                node.drain(a.node_id, !a.undo).await.map_err(err)?;
                empty()
            }
            other => {
                return Err(
                    self.invalid(format!("unknown action {other:?}; ListActions lists them"))
                );
            }
        })
    }
}

/// A table as the protocol describes it.
pub(crate) fn describe(
    info: &TableInfo,
) -> Result<protocol::TableDescription, protocol::ProtocolError> {
    Ok(protocol::TableDescription {
        table_id: info.table_id,
        database: info.database.clone(),
        table: info.name.clone(),
        schema: protocol::encode_schema(&info.schema)?,
        columns: info
            .schema
            .fields()
            .iter()
            .map(|f| protocol::ColumnDescription {
                name: f.name().clone(),
                r#type: f.data_type().to_string(),
                nullable: f.is_nullable(),
            })
            .collect(),
        schema_version: info.schema_version,
        options: info.options.clone(),
        partition_keys: info.partition_keys.clone(),
        bucket_count: info.bucket_count,
        bucket_key: info.bucket_key.clone(),
        primary_key: info.primary_key.clone(),
        comment: info.comment.clone(),
        created_at_ms: info.created_at_ms,
        partitions: info
            .partitions
            .iter()
            .map(|p| protocol::PartitionDescription {
                partition_id: p.partition_id,
                name: p.name.clone(),
                values: p.values.clone(),
                created_at_ms: p.created_at_ms,
            })
            .collect(),
        buckets: info
            .buckets
            .iter()
            .map(|b| protocol::BucketDescription {
                partition: b.partition.clone(),
                partition_id: b.partition_id,
                bucket: b.bucket,
                stream_id: b.stream_id,
                leader_node_id: b.leader_node_id,
                leader_address: b.leader_address.clone(),
                leader_epoch: b.leader_epoch,
                start_offset: b.start_offset,
                end_offset: b.end_offset,
                tiered_offset: b.tiered_offset,
            })
            .collect(),
        lake: info.lake.as_ref().map(|l| protocol::LakeDescription {
            snapshot_id: l.snapshot_id,
            committed_at_ms: l.committed_at_ms,
            lag_ms: l.lag_ms,
        }),
    })
}
