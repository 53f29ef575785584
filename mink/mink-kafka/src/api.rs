//! The Kafka APIs this listener answers, each a thin adapter over the node service.

use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt as _, StreamExt as _};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreatePartitionsRequest,
    CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteGroupsRequest,
    DeleteGroupsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeClusterRequest,
    DescribeClusterResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    DescribeGroupsRequest, DescribeGroupsResponse, FetchRequest, FetchResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse,
    InitProducerIdRequest, InitProducerIdResponse, JoinGroupRequest, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, ProduceRequest, ProduceResponse,
    ProducerId, RequestHeader, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use mink_node::{BucketRef, Node, NodeError, TableInfo, TableSpec, WriteTarget, WriterBatchId};

use crate::conn::{Answer, Context};
use crate::records::{self, RecordError};
use crate::{error_code, invalid_topic_name, table_of, topic_of};

/// The versions advertised, per API: within what `kafka-protocol` speaks, and what librdkafka,
/// kafka-python and aiokafka negotiate (see ../shared/FACTS.md). Metadata goes to 12, with
/// topic ids: librdkafka sizes its parse buffer at four times an answer's bytes, and without
/// the ids' 16 bytes a topic an answer of a dozen topics overflows it. Fetch stops at 12 and
/// Produce at 9 (before topic ids), ListOffsets at 6 (7 adds the max-timestamp query).
const VERSIONS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 6),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::FindCoordinator, 0, 3),
    (ApiKey::JoinGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 3),
    (ApiKey::Heartbeat, 0, 3),
    (ApiKey::LeaveGroup, 0, 3),
    (ApiKey::OffsetCommit, 2, 7),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 4),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::DescribeCluster, 0, 1),
];

/// Whether `version` of `key` is answered here.
pub(crate) fn supported(key: ApiKey, version: i16) -> bool {
    VERSIONS
        .iter()
        .any(|(k, min, max)| *k == key && (*min..=*max).contains(&version))
}

type Result<T> = std::result::Result<T, anyhow::Error>;

fn decode<T: Decodable>(body: &mut Bytes, version: i16) -> Result<T> {
    T::decode(body, version)
}

pub(crate) async fn handle(cx: Context, mut body: Bytes) -> Result<Answer> {
    let version = cx.header.request_api_version;
    Ok(match cx.api_key {
        ApiKey::ApiVersions => {
            let _: ApiVersionsRequest = decode(&mut body, version)?;
            Answer::Now(cx.respond(&api_versions()))
        }
        ApiKey::Metadata => {
            let request: MetadataRequest = decode(&mut body, version)?;
            auto_create(&cx, &request).await;
            Answer::Now(cx.respond(&metadata(&cx, &request)))
        }
        ApiKey::CreateTopics => {
            let request: CreateTopicsRequest = decode(&mut body, version)?;
            let response = create_topics(&cx, request).await;
            Answer::Now(cx.respond(&response))
        }
        ApiKey::Produce => produce(cx, decode(&mut body, version)?).await?,
        ApiKey::Fetch => {
            let request: FetchRequest = decode(&mut body, version)?;
            let response = fetch(&cx, &request).await;
            Answer::Now(crate::frames::fetch_response(&cx.header, &response))
        }
        ApiKey::InitProducerId => {
            let request: InitProducerIdRequest = decode(&mut body, version)?;
            let response = init_producer_id(&cx, &request).await;
            Answer::Now(cx.respond(&response))
        }
        ApiKey::FindCoordinator => {
            let request: FindCoordinatorRequest = decode(&mut body, version)?;
            Answer::Now(cx.respond(&find_coordinator(&cx, &request)))
        }
        ApiKey::JoinGroup => join_group(cx, &decode(&mut body, version)?),
        ApiKey::SyncGroup => sync_group(cx, decode(&mut body, version)?),
        ApiKey::Heartbeat => {
            let request: HeartbeatRequest = decode(&mut body, version)?;
            let code = if cx.groups.coordinating() {
                cx.groups.heartbeat(
                    request.group_id.0.as_str(),
                    request.member_id.as_str(),
                    request.generation_id,
                )
            } else {
                ResponseError::NotCoordinator
            };
            Answer::Now(cx.respond(&HeartbeatResponse::default().with_error_code(code.code())))
        }
        ApiKey::LeaveGroup => leave_group(cx, decode(&mut body, version)?),
        ApiKey::OffsetCommit => offset_commit(cx, &decode(&mut body, version)?),
        ApiKey::OffsetFetch => {
            let request: OffsetFetchRequest = decode(&mut body, version)?;
            Answer::Now(cx.respond(&offset_fetch(&cx, &request)))
        }
        ApiKey::ListGroups => {
            let request: ListGroupsRequest = decode(&mut body, version)?;
            Answer::Now(cx.respond(&list_groups(&cx, &request)))
        }
        ApiKey::DescribeGroups => {
            let request: DescribeGroupsRequest = decode(&mut body, version)?;
            Answer::Now(cx.respond(&describe_groups(&cx, &request)))
        }
        ApiKey::DeleteGroups => {
            let request: DeleteGroupsRequest = decode(&mut body, version)?;
            let response = delete_groups(&cx, &request).await;
            Answer::Now(cx.respond(&response))
        }
        ApiKey::DeleteTopics => {
            let request: DeleteTopicsRequest = decode(&mut body, version)?;
            let response = delete_topics(&cx, &request).await;
            Answer::Now(cx.respond(&response))
        }
        ApiKey::CreatePartitions => {
            let request: CreatePartitionsRequest = decode(&mut body, version)?;
            Answer::Now(cx.respond(&create_partitions(&cx, &request)))
        }
        ApiKey::DescribeConfigs => {
            let request: DescribeConfigsRequest = decode(&mut body, version)?;
            Answer::Now(cx.respond(&describe_configs(&cx, &request)))
        }
        ApiKey::DescribeCluster => {
            let _: DescribeClusterRequest = decode(&mut body, version)?;
            Answer::Now(cx.respond(&describe_cluster(&cx)))
        }
        ApiKey::ListOffsets => {
            let request: ListOffsetsRequest = decode(&mut body, version)?;
            let response = list_offsets(&cx, &request).await;
            Answer::Now(cx.respond(&response))
        }
        other => anyhow::bail!("{other:?} is not answered here"),
    })
}

fn api_versions() -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(
        VERSIONS
            .iter()
            .map(|(k, min, max)| {
                ApiVersion::default()
                    .with_api_key(*k as i16)
                    .with_min_version(*min)
                    .with_max_version(*max)
            })
            .collect(),
    )
}

/// The answer to an ApiVersions request in a version we do not speak: the error and our list,
/// in version 0.
pub(crate) fn api_versions_unsupported(header: &RequestHeader) -> Option<Bytes> {
    let mut header = header.clone();
    header.request_api_version = 0;
    crate::conn::respond(
        ApiKey::ApiVersions,
        &header,
        &api_versions().with_error_code(ResponseError::UnsupportedVersion.code()),
    )
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// `address` (`host:port`) as Kafka's host and port.
fn host_port(address: &str) -> Option<(String, i32)> {
    let (host, port) = address.rsplit_once(':')?;
    Some((
        host.trim_matches(['[', ']']).to_string(),
        port.parse().ok()?,
    ))
}

/// Why a table is not a topic, if it is not: primary-key and partitioned tables are not.
fn not_a_topic(info: &TableInfo) -> Option<&'static str> {
    if !info.primary_key.is_empty() {
        Some("a primary-key table is not a topic")
    } else if !info.partition_keys.is_empty() {
        Some("a partitioned table is not a topic")
    } else {
        None
    }
}

/// The log table a topic names, if it is one.
fn topic_table(cx: &Context, topic: &str) -> std::result::Result<TableInfo, ResponseError> {
    let (database, table) = table_of(&cx.node, &cx.config, topic);
    let info = cx
        .node
        .describe_table(&database, &table)
        .map_err(|e| error_code(&e))?;
    match not_a_topic(&info) {
        Some(_) => Err(ResponseError::UnknownTopicOrPartition),
        None => Ok(info),
    }
}

/// Every node with a Kafka listener: its host and port.
fn kafka_nodes(cx: &Context) -> std::collections::BTreeMap<u64, (String, i32)> {
    let view = cx.node.view();
    let mut nodes: std::collections::BTreeMap<u64, (String, i32)> = view
        .state
        .nodes
        .values()
        .filter_map(|n| {
            let address = n.listeners.get(crate::LISTENER)?;
            Some((n.node_id, host_port(address)?))
        })
        .collect();
    // This node, before its registration with the listener is applied (a fresh cluster).
    if let Some(me) = cx.config.advertised.as_deref().and_then(host_port) {
        nodes.entry(cx.node.node_id()).or_insert(me);
    }
    nodes
}

/// The cluster's id as Kafka clients see it: the one in the metadata, the same from every
/// node (two clusters named alike confuse tools that tell clusters apart by it).
fn cluster_id(cx: &Context) -> StrBytes {
    cx.node
        .cluster_id()
        .map_or_else(|| StrBytes::from_static_str("mink"), StrBytes::from_string)
}

/// The controller Kafka clients are told of: the lease holder, the same from every node, when
/// it has a Kafka listener; this node otherwise. Every node answers the controller's requests
/// (CreateTopics and the like), so the choice only keeps the cluster's picture consistent.
fn controller(
    cx: &Context,
    kafka_nodes: &std::collections::BTreeMap<u64, (String, i32)>,
) -> BrokerId {
    broker(
        cx.node
            .group_coordinator()
            .filter(|id| kafka_nodes.contains_key(id))
            .unwrap_or_else(|| cx.node.node_id()),
    )
}

fn metadata(cx: &Context, request: &MetadataRequest) -> MetadataResponse {
    let view = cx.node.view();
    let kafka_nodes = kafka_nodes(cx);
    let brokers = kafka_nodes
        .iter()
        .map(|(id, (host, port))| {
            MetadataResponseBroker::default()
                .with_node_id(broker(*id))
                .with_host(StrBytes::from_string(host.clone()))
                .with_port(*port)
        })
        .collect();
    let version = cx.header.request_api_version;
    // Named topics, or by id (version 10 on, with no name); none named lists every topic (an
    // empty list too in version 0).
    let asked: Vec<std::result::Result<String, uuid::Uuid>> = match &request.topics {
        Some(topics) if !(topics.is_empty() && version == 0) => topics
            .iter()
            .map(|t| match &t.name {
                Some(n) if !n.0.is_empty() || t.topic_id.is_nil() => Ok(n.0.to_string()),
                _ => Err(t.topic_id),
            })
            .collect(),
        _ => view
            .state
            .tables
            .values()
            .filter(|t| t.primary_key.is_empty() && t.partition_keys.is_empty())
            .filter_map(|t| {
                let topic = topic_of(&cx.config, &t.database, &t.name);
                // A table another one shadows (see `table_of`) is not a topic.
                (table_of(&cx.node, &cx.config, &topic) == (t.database.clone(), t.name.clone()))
                    .then_some(Ok(topic))
            })
            .collect(),
    };
    let topics = asked
        .into_iter()
        .map(|asked| {
            let name = match asked {
                Ok(name) => name,
                Err(id) => match view
                    .state
                    .tables
                    .values()
                    .find(|t| topic_id(t.table_id) == id)
                {
                    Some(t) => topic_of(&cx.config, &t.database, &t.name),
                    None => {
                        return MetadataResponseTopic::default()
                            .with_topic_id(id)
                            .with_error_code(ResponseError::UnknownTopicId.code());
                    }
                },
            };
            let topic = MetadataResponseTopic::default().with_name(Some(topic_name(&name)));
            match topic_table(cx, &name) {
                Err(code) => topic.with_error_code(code.code()),
                Ok(info) => topic
                    .with_topic_id(topic_id(info.table_id))
                    .with_partitions(
                        info.buckets
                            .iter()
                            .map(|b| {
                                let p = MetadataResponsePartition::default()
                                    .with_partition_index(
                                        i32::try_from(b.bucket).unwrap_or(i32::MAX),
                                    )
                                    .with_leader_epoch(
                                        i32::try_from(b.leader_epoch).unwrap_or(i32::MAX),
                                    );
                                if kafka_nodes.contains_key(&b.leader_node_id) {
                                    let leader = broker(b.leader_node_id);
                                    p.with_leader_id(leader)
                                        .with_replica_nodes(vec![leader])
                                        .with_isr_nodes(vec![leader])
                                } else {
                                    p.with_error_code(ResponseError::LeaderNotAvailable.code())
                                        .with_leader_id(BrokerId(-1))
                                }
                            })
                            .collect(),
                    ),
            }
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(cluster_id(cx)))
        .with_controller_id(controller(cx, &kafka_nodes))
        .with_topics(topics)
}

/// A topic's id (Metadata 10 on): its table's id under a prefix of Mink's own, so a topic
/// dropped and created again gets a new one, as in Kafka.
pub(crate) fn topic_id(table_id: u64) -> uuid::Uuid {
    uuid::Uuid::from_u64_pair(u64::from_be_bytes(*b"mink\0tid"), table_id)
}

fn broker(node_id: u64) -> BrokerId {
    BrokerId(i32::try_from(node_id).unwrap_or(i32::MAX))
}

/// Most partitions a topic takes: Mink's most buckets per table.
const MAX_PARTITIONS: u32 = mink_node::MAX_BUCKETS;

async fn create_topics(cx: &Context, request: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let name = t.name.0.as_str().to_string();
        let result = CreatableTopicResult::default().with_name(t.name.clone());
        let (database, table) = table_of(&cx.node, &cx.config, &name);
        let partitions = if t.num_partitions == -1 {
            1
        } else {
            t.num_partitions
        };
        let refused = if let Some(why) = invalid_topic_name(&name) {
            Some((ResponseError::InvalidTopicException, why))
        } else if partitions < 1 {
            Some((
                ResponseError::InvalidPartitions,
                format!("{partitions} partitions: a topic needs at least one"),
            ))
        } else if u64::try_from(partitions).is_ok_and(|p| p > u64::from(MAX_PARTITIONS)) {
            Some((
                ResponseError::InvalidPartitions,
                format!("{partitions} partitions: a topic has at most {MAX_PARTITIONS}"),
            ))
        } else if !t.assignments.is_empty() {
            Some((
                ResponseError::InvalidReplicaAssignment,
                "replica assignments are not taken: the cluster places buckets".to_string(),
            ))
        } else {
            topic_options(&t.configs).err()
        };
        if let Some((code, message)) = refused {
            results.push(
                result
                    .with_error_code(code.code())
                    .with_error_message(Some(StrBytes::from_string(message))),
            );
            continue;
        }
        if request.validate_only {
            // As Kafka validates: a topic that exists already would not be created.
            if topic_table(cx, &name).is_ok() {
                results.push(
                    result
                        .with_error_code(ResponseError::TopicAlreadyExists.code())
                        .with_error_message(Some(StrBytes::from_string(format!(
                            "topic {name} exists already"
                        )))),
                );
                continue;
            }
            results.push(
                result
                    .with_num_partitions(partitions)
                    .with_replication_factor(1),
            );
            continue;
        }
        let options = topic_options(&t.configs).unwrap_or_default();
        let created = create_raw_topic(cx, &database, &table, partitions, options, false).await;
        results.push(match created {
            Ok(_) => result
                .with_num_partitions(partitions)
                .with_replication_factor(1),
            Err(e) => result
                .with_error_code(error_code(&e).code())
                .with_error_message(Some(StrBytes::from_string(e.to_string()))),
        });
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// Kafka's `compression.type` of a topic: how its records are stored.
const COMPRESSION_TYPE: &str = "compression.type";

/// The `compression.type`s a topic takes and the `table.log.arrow.compression.type` each sets
/// (`producer`, Kafka's default, sets none: each produce is stored as its producer sent it).
const COMPRESSION_TYPES: [(&str, Option<&str>); 3] = [
    ("producer", None),
    ("zstd", Some("ZSTD")),
    ("uncompressed", Some("NONE")),
];

/// The Mink options a CreateTopics request's configs make: `compression.type` (see
/// [`COMPRESSION_TYPES`]), `retention.ms` (`table.log.ttl`) and `cleanup.policy` `delete` (what
/// every topic does) are taken, the configs DescribeConfigs reports; any other is refused.
fn topic_options(
    configs: &[kafka_protocol::messages::create_topics_request::CreatableTopicConfig],
) -> std::result::Result<Vec<(String, String)>, (ResponseError, String)> {
    let mut options = Vec::new();
    for c in configs {
        let value = c.value.as_ref().map_or("", |v| v.as_str());
        if c.name.as_str() == "retention.ms" {
            let ttl = match value.parse::<i64>() {
                Ok(-1) => "-1".to_string(),
                Ok(ms) if ms > 0 => format!("{ms}ms"),
                _ => {
                    return Err((
                        ResponseError::InvalidConfig,
                        format!(
                            "retention.ms {value:?}: milliseconds above 0, or -1 to keep records until they are tiered or forever"
                        ),
                    ));
                }
            };
            options.push((mink_log::options::LOG_TTL.to_string(), ttl));
            continue;
        }
        if c.name.as_str() == "cleanup.policy" {
            if value != "delete" {
                return Err((
                    ResponseError::InvalidConfig,
                    format!(
                        "cleanup.policy {value:?}: a topic is an append-only log whose records are deleted after retention.ms (delete); for the latest record per key, create a primary-key table"
                    ),
                ));
            }
            continue;
        }
        if c.name.as_str() != COMPRESSION_TYPE {
            return Err((
                ResponseError::InvalidConfig,
                format!(
                    "topic config {} is not supported yet: create the table with its Mink options instead",
                    c.name.as_str()
                ),
            ));
        }
        match COMPRESSION_TYPES.iter().find(|(kafka, _)| *kafka == value) {
            Some((_, option)) => options.extend(option.map(|o| {
                (
                    mink_log::options::LOG_COMPRESSION.to_string(),
                    o.to_string(),
                )
            })),
            None => {
                return Err((
                    ResponseError::InvalidConfig,
                    format!(
                        "compression.type {value:?}: a topic stores Arrow record batches, so producer, zstd or uncompressed"
                    ),
                ));
            }
        }
    }
    Ok(options)
}

/// How a topic of the raw schema stores a producer's batches: as its table's
/// `table.log.arrow.compression.type` says when that is set (a topic created with
/// `compression.type` `zstd` or `uncompressed`), otherwise as Kafka's `compression.type`
/// `producer`: ZSTD (Arrow's codec) when the producer compressed them, uncompressed when it did
/// not, so a node spends no CPU compressing what a producer chose not to. `None` (the table's
/// compression) for other tables.
fn stored_compression(
    info: &TableInfo,
    producer_compressed: bool,
) -> Option<mink_log::codec::Compression> {
    if !records::is_raw(&info.schema)
        || info
            .options
            .contains_key(mink_log::options::LOG_COMPRESSION)
    {
        return None;
    }
    Some(if producer_compressed {
        mink_log::codec::Compression::Zstd
    } else {
        mink_log::codec::Compression::None
    })
}

/// One partition's produce outcome, before it is durable.
struct Produced {
    index: i32,
    outcome: std::result::Result<mink_node::PendingWrite, (ResponseError, String)>,
    batch_errors: Vec<BatchIndexAndErrorMessage>,
    start: i64,
}

/// Stores each partition's records in request order (they take their offsets before the next
/// request is read) and answers once they are durable; acks = 0 answers nothing.
async fn produce(cx: Context, request: ProduceRequest) -> Result<Answer> {
    let refusal = if request
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.0.is_empty())
    {
        // Transactions are out of scope; a transactional producer learns it here.
        Some(ResponseError::TransactionalIdAuthorizationFailed)
    } else if !matches!(request.acks, -1..=1) {
        // Kafka's acks are all (-1), none (0) and the leader (1); anything else stored nothing.
        Some(ResponseError::InvalidRequiredAcks)
    } else {
        None
    };
    if let Some(code) = refusal {
        let responses = request
            .topic_data
            .iter()
            .map(|t| {
                TopicProduceResponse::default()
                    .with_name(t.name.clone())
                    .with_partition_responses(
                        t.partition_data
                            .iter()
                            .map(|p| {
                                // Nothing stored: no offset (a client reports the
                                // record at its base offset).
                                PartitionProduceResponse::default()
                                    .with_index(p.index)
                                    .with_error_code(code.code())
                                    .with_base_offset(-1)
                            })
                            .collect(),
                    )
            })
            .collect();
        return Ok(Answer::Now(
            cx.respond(&ProduceResponse::default().with_responses(responses)),
        ));
    }
    let mut topics = Vec::with_capacity(request.topic_data.len());
    for t in &request.topic_data {
        let name = t.name.0.as_str();
        let table = topic_table(&cx, name);
        let mut partitions = Vec::with_capacity(t.partition_data.len());
        for p in &t.partition_data {
            let mut produced = Produced {
                index: p.index,
                outcome: Err((ResponseError::UnknownServerError, String::new())),
                batch_errors: Vec::new(),
                start: -1,
            };
            produced.outcome = match &table {
                Err(code) => Err((*code, format!("no topic {name}"))),
                Ok(info) => {
                    let bucket = u32::try_from(p.index)
                        .ok()
                        .filter(|b| *b < info.bucket_count);
                    match bucket {
                        None => Err((
                            ResponseError::UnknownTopicOrPartition,
                            format!("{name} has no partition {}", p.index),
                        )),
                        Some(bucket) => {
                            if let Some(b) = info.buckets.iter().find(|b| b.bucket == bucket) {
                                produced.start = i64::try_from(b.start_offset).unwrap_or(-1);
                            }
                            match rows_of(info, p.records.as_ref()) {
                                Err(e) => Err(refused(&mut produced.batch_errors, &e)),
                                Ok((rows, writer, timestamp_ms, compressed)) => match cx
                                    .node
                                    .submit_write(
                                        &info.database,
                                        &info.name,
                                        &rows,
                                        &WriteTarget {
                                            bucket: Some(bucket),
                                            writer,
                                            timestamp_ms,
                                            compression: stored_compression(info, compressed),
                                            epoch_may_rise: true,
                                            ..Default::default()
                                        },
                                    )
                                    .await
                                {
                                    // A producer's partitioner cannot route by Mink's hash:
                                    // the record is the producer's to send elsewhere.
                                    Err(NodeError::WrongBucket { row, belongs, .. }) => {
                                        let reason = format!(
                                            "record {row} belongs to partition {belongs}, not {bucket}: table {}.{} routes rows by its bucket key ({}) with Mink's hash, which a Kafka partitioner does not compute; produce it over Flight, or create the table without a bucket key",
                                            info.database,
                                            info.name,
                                            info.bucket_key.join(", ")
                                        );
                                        let e = RecordError::Invalid { index: row, reason };
                                        Err(refused(&mut produced.batch_errors, &e))
                                    }
                                    written => written.map_err(|e| (error_code(&e), e.to_string())),
                                },
                            }
                        }
                    }
                }
            };
            partitions.push(produced);
        }
        topics.push((t.name.clone(), partitions));
    }
    if request.acks == 0 {
        // Nothing is sent back; the writes still complete.
        tokio::spawn(async move {
            for (_, partitions) in topics {
                for p in partitions {
                    if let Ok(pending) = p.outcome {
                        let _ = pending.await;
                    }
                }
            }
        });
        return Ok(Answer::Now(None));
    }
    // acks = 1 and acks = all both mean durable on object storage.
    Ok(Answer::Later(
        async move {
            let mut responses = Vec::with_capacity(topics.len());
            for (name, partitions) in topics {
                let mut out = Vec::with_capacity(partitions.len());
                for p in partitions {
                    let response = PartitionProduceResponse::default()
                        .with_index(p.index)
                        .with_log_append_time_ms(-1)
                        .with_log_start_offset(p.start)
                        .with_base_offset(-1)
                        .with_record_errors(p.batch_errors);
                    let result = match p.outcome {
                        Err(e) => Err(e),
                        Ok(pending) => written(pending.await),
                    };
                    out.push(match result {
                        Ok(base) => response.with_base_offset(base),
                        Err((code, message)) => response
                            .with_error_code(code.code())
                            .with_error_message(Some(StrBytes::from_string(message))),
                    });
                }
                responses.push(
                    TopicProduceResponse::default()
                        .with_name(name)
                        .with_partition_responses(out),
                );
            }
            cx.respond(&ProduceResponse::default().with_responses(responses))
        }
        .boxed(),
    ))
}

/// The base offset of a one-bucket write, or its error.
fn written(
    results: Vec<mink_node::BucketWrite>,
) -> std::result::Result<i64, (ResponseError, String)> {
    let mut base = None;
    for w in results {
        match w.result {
            Ok(ack) => base = Some(base.map_or(ack.base_offset, |b: u64| b.min(ack.base_offset))),
            Err(e) => return Err((error_code(&e), e.to_string())),
        }
    }
    Ok(base.map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)))
}

/// The rows a partition's records become in `table` (raw rows of a topic with the raw schema,
/// the JSON values as rows of any other log table), and the idempotent producer's batch, if
/// one sent them: the records' producer id and epoch and their sequence range, which the
/// stream checks as Kafka does (start at 0, no gaps, duplicates answered with their offsets),
/// and the rows' time: the latest record time of a raw topic (Kafka's CreateTime, which its
/// time index keeps), none for a typed table (stamped at append, LogAppendTime); and whether
/// the producer compressed any of its batches.
#[allow(clippy::type_complexity)]
fn rows_of(
    table: &TableInfo,
    records: Option<&Bytes>,
) -> std::result::Result<
    (
        arrow::array::RecordBatch,
        Option<WriterBatchId>,
        Option<i64>,
        bool,
    ),
    RecordError,
> {
    let Some(records) = records else {
        return Err(RecordError::Corrupt {
            index: 0,
            reason: "no records".into(),
        });
    };
    let batches = records::check_batches(records)?;
    let compressed = batches.iter().any(records::is_compressed);
    let mut all = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        all.extend(records::decode_batch(i, b)?);
    }
    let writer = records::writer_batch(&all)?;
    if records::is_raw(&table.schema) {
        // A topic keeps microseconds: a time past what they hold was clamped to another.
        if let Some((index, r)) = all
            .iter()
            .enumerate()
            .find(|(_, r)| r.timestamp.checked_mul(1000).is_none())
        {
            return Err(RecordError::InvalidTimestamp {
                index,
                reason: format!(
                    "timestamp {} ms is outside what a topic keeps (microseconds: within {} ms of 1970)",
                    r.timestamp,
                    i64::MAX / 1000
                ),
            });
        }
        let rows = records::raw_rows(&all).map_err(|e| RecordError::Invalid {
            index: 0,
            reason: e.to_string(),
        })?;
        let time = all.iter().map(|r| r.timestamp).max().filter(|t| *t >= 0);
        Ok((rows, writer, time, compressed))
    } else {
        Ok((
            records::json_rows(&table.schema, &all)?,
            writer,
            None,
            compressed,
        ))
    }
}

/// The answer to a partition's records refused: its code and message, and for a record the
/// table refuses, the record named in `batch_errors` (INVALID_RECORD's list).
fn refused(
    batch_errors: &mut Vec<BatchIndexAndErrorMessage>,
    e: &RecordError,
) -> (ResponseError, String) {
    if let RecordError::Invalid { index, reason }
    | RecordError::InvalidTimestamp { index, reason } = e
    {
        batch_errors.push(
            BatchIndexAndErrorMessage::default()
                .with_batch_index(i32::try_from(*index).unwrap_or(i32::MAX))
                .with_batch_index_error_message(Some(StrBytes::from_string(reason.clone()))),
        );
    }
    let code = match e {
        RecordError::Corrupt { .. } => ResponseError::CorruptMessage,
        RecordError::Invalid { .. } => ResponseError::InvalidRecord,
        RecordError::InvalidTimestamp { .. } => ResponseError::InvalidTimestamp,
    };
    (code, e.to_string())
}

/// A producer id for an idempotent producer: a Mink writer id (at the epoch writers start
/// at). A transactional id is refused: transactions are out of scope.
async fn init_producer_id(cx: &Context, request: &InitProducerIdRequest) -> InitProducerIdResponse {
    let response = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if request
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.0.is_empty())
    {
        return response.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    match cx.node.allocate_writer().await {
        Ok(w) => match (i64::try_from(w.writer_id), i16::try_from(w.writer_epoch)) {
            (Ok(id), Ok(epoch)) => response
                .with_producer_id(ProducerId(id))
                .with_producer_epoch(epoch),
            _ => response.with_error_code(ResponseError::UnknownServerError.code()),
        },
        Err(e) => response.with_error_code(error_code(&e).code()),
    }
}

/// One partition's fetch up to its read: the answer without records, and what to read (its
/// bucket, from where) unless that is the whole answer (an error, or nothing past the end).
fn fetch_head(
    node: &Node,
    info: &TableInfo,
    partition: i32,
    offset: i64,
) -> (PartitionData, Option<(BucketRef, u64)>) {
    let data = PartitionData::default()
        .with_partition_index(partition)
        .with_aborted_transactions(Some(vec![]))
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(Bytes::new()));
    let Some(bucket) = u32::try_from(partition)
        .ok()
        .filter(|b| *b < info.bucket_count)
    else {
        let code = ResponseError::UnknownTopicOrPartition.code();
        return (data.with_error_code(code), None);
    };
    let b = BucketRef::new(&info.database, &info.name, None, bucket);
    let (start, end) = match node.bucket_offsets(&b) {
        Ok(o) => o,
        Err(e) => return (data.with_error_code(error_code(&e).code()), None),
    };
    let data = data
        .with_high_watermark(i64::try_from(end).unwrap_or(i64::MAX))
        .with_last_stable_offset(i64::try_from(end).unwrap_or(i64::MAX))
        .with_log_start_offset(i64::try_from(start).unwrap_or(i64::MAX));
    let Some(offset) = u64::try_from(offset)
        .ok()
        .filter(|o| (start..=end).contains(o))
    else {
        return (
            data.with_error_code(ResponseError::OffsetOutOfRange.code()),
            None,
        );
    };
    let read = (offset < end).then_some((b, offset));
    (data, read)
}

/// One partition's records from `offset`, about `max_bytes` (at least one batch), or the
/// error code to answer with.
async fn fetch_records(
    node: Node,
    raw: bool,
    b: BucketRef,
    offset: u64,
    max_bytes: usize,
) -> std::result::Result<Bytes, i16> {
    let read = node
        .read_bucket(&b, offset, max_bytes.max(1), &[])
        .await
        .map_err(|e| error_code(&e).code())?;
    // Room for every batch at once: growing the buffer batch by batch would copy what is
    // encoded again and again.
    let mut out = bytes::BytesMut::with_capacity(if raw {
        read.iter().map(|r| records::raw_size_bound(&r.batch)).sum()
    } else {
        0
    });
    for r in read {
        if raw {
            records::encode_raw(&r.batch, r.base_offset, &mut out);
        } else if let Err(e) =
            records::encode_json(&r.batch, r.base_offset, r.timestamp_ms, &mut out)
        {
            tracing::warn!(error = %e, "encoding rows as JSON failed");
            return Err(ResponseError::UnknownServerError.code());
        }
        if out.len() >= max_bytes {
            break;
        }
    }
    Ok(out.freeze())
}

/// Partitions of one fetch read at once, at most.
const PARALLEL_PARTITION_READS: usize = 16;

/// How long a fetch that has enough to answer waits for its partitions still reading (from
/// object storage, as a rule: a read from the caches takes a millisecond or two). Those are
/// answered without records, and their reads go on: the next fetch finds the blocks loaded or
/// loading. One cold partition then does not hold back a consumer's others, as it would with
/// one fetch in flight per consumer (librdkafka's).
const FETCH_STRAGGLER_WAIT: Duration = Duration::from_millis(10);

async fn fetch(cx: &Context, request: &FetchRequest) -> FetchResponse {
    let wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0))
        .min(cx.config.max_fetch_wait);
    let deadline = tokio::time::Instant::now() + wait;
    let min_bytes = usize::try_from(request.min_bytes.max(1)).unwrap_or(1);
    let max_bytes = usize::try_from(request.max_bytes)
        .unwrap_or(usize::MAX)
        .min(cx.config.max_fetch_bytes);
    loop {
        let tables: Vec<_> = request
            .topics
            .iter()
            .map(|t| topic_table(cx, t.topic.0.as_str()))
            .collect();
        // Each partition's answer without records, then its records from a read in a task of
        // its own, side by side (a cold read of one, from object storage, does not wait behind
        // another's).
        let mut answers: Vec<PartitionData> = Vec::new();
        let mut reads = Vec::new();
        for (t, table) in request.topics.iter().zip(&tables) {
            for p in &t.partitions {
                let (data, read) = match table {
                    Err(code) => (
                        PartitionData::default()
                            .with_partition_index(p.partition)
                            .with_error_code(code.code()),
                        None,
                    ),
                    Ok(info) => fetch_head(&cx.node, info, p.partition, p.fetch_offset),
                };
                if let (Ok(info), Some((b, offset))) = (table, read) {
                    let max = usize::try_from(p.partition_max_bytes)
                        .unwrap_or(0)
                        .min(cx.config.max_fetch_bytes);
                    let raw = records::is_raw(&info.schema);
                    let read = fetch_records(cx.node.clone(), raw, b, offset, max);
                    reads.push((answers.len(), read));
                }
                answers.push(data);
            }
        }
        let mut reading = futures::stream::iter(reads.into_iter().map(|(i, read)| {
            let task = tokio::spawn(read);
            async move { (i, task.await) }
        }))
        .buffer_unordered(PARALLEL_PARTITION_READS);
        let mut read_bytes = 0usize;
        let mut stragglers_until = None;
        loop {
            let next = match stragglers_until {
                None => reading.next().await,
                Some(until) => tokio::time::timeout_at(until, reading.next())
                    .await
                    .unwrap_or_default(),
            };
            let Some((i, read)) = next else { break };
            let head = std::mem::take(&mut answers[i]);
            answers[i] = match read {
                Ok(Ok(records)) => {
                    read_bytes += records.len();
                    head.with_records(Some(records))
                }
                Ok(Err(code)) => head.with_error_code(code),
                Err(e) => {
                    tracing::warn!(error = %e, "a partition read failed");
                    head.with_error_code(ResponseError::UnknownServerError.code())
                }
            };
            if stragglers_until.is_none() && read_bytes >= min_bytes {
                stragglers_until = Some(tokio::time::Instant::now() + FETCH_STRAGGLER_WAIT);
            }
        }
        // Reads not answered in time (or not started) keep answering without records.
        drop(reading);
        let mut read = answers.into_iter();
        let mut responses = Vec::with_capacity(request.topics.len());
        let mut bytes = 0usize;
        // Partitions to wait on: read to their end.
        let mut idle = Vec::new();
        for (t, table) in request.topics.iter().zip(&tables) {
            let mut partitions = Vec::with_capacity(t.partitions.len());
            for p in &t.partitions {
                let mut d = read.next().expect("a read per partition");
                let got = d.records.as_ref().map_or(0, Bytes::len);
                if bytes > 0 && bytes + got > max_bytes {
                    // Over the response's limit (the first records always go): fetched again
                    // from the same offset next time, from the cache.
                    d = d.with_records(Some(Bytes::new()));
                } else {
                    bytes += got;
                }
                if got == 0
                    && d.error_code == 0
                    && let (Ok(info), Ok(b)) = (table, u32::try_from(p.partition))
                {
                    idle.push((
                        BucketRef::new(&info.database, &info.name, None, b),
                        u64::try_from(p.fetch_offset).unwrap_or(0),
                    ));
                }
                partitions.push(d);
            }
            responses.push(
                FetchableTopicResponse::default()
                    .with_topic(t.topic.clone())
                    .with_partitions(partitions),
            );
        }
        let enough = bytes >= min_bytes;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if enough || idle.is_empty() || left.is_zero() {
            return FetchResponse::default().with_responses(responses);
        }
        // Long poll: until any idle partition has data, or the deadline.
        let waits = idle.iter().map(|(b, offset)| {
            let node = cx.node.clone();
            async move { node.wait_for_data(b, *offset, left).await }.boxed()
        });
        let (_, _, _) = futures::future::select_all(waits).await;
    }
}

async fn list_offsets(cx: &Context, request: &ListOffsetsRequest) -> ListOffsetsResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for t in &request.topics {
        let table = topic_table(cx, t.name.0.as_str());
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let response = ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_timestamp(-1)
                .with_offset(-1);
            let result = match &table {
                Err(code) => Err(*code),
                Ok(info) => offset_for(cx, info, p.partition_index, p.timestamp)
                    .await
                    .map_err(|e| error_code(&e)),
            };
            partitions.push(match result {
                Ok((offset, timestamp)) => response.with_offset(offset).with_timestamp(timestamp),
                Err(code) => response.with_error_code(code.code()),
            });
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name.clone())
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// Kafka's special timestamps: the log start, the end.
const EARLIEST: i64 = -2;
const LATEST: i64 = -1;

/// The offset (and its timestamp) ListOffsets answers for `timestamp`: the start, the end, or
/// the first record at or after a time. By time, the bucket's time index finds the first
/// stored batch that late without reading rows; a raw topic's records carry their own times
/// (the batch's is their latest), so its `timestamp` column picks the record in the batch.
async fn offset_for(
    cx: &Context,
    info: &TableInfo,
    partition: i32,
    timestamp: i64,
) -> std::result::Result<(i64, i64), NodeError> {
    let bucket = u32::try_from(partition)
        .ok()
        .filter(|b| *b < info.bucket_count)
        .ok_or_else(|| NodeError::NotFound(format!("no partition {partition}")))?;
    let b = BucketRef::new(&info.database, &info.name, None, bucket);
    let (start, end) = cx.node.bucket_offsets(&b)?;
    let as_i64 = |o: u64| i64::try_from(o).unwrap_or(i64::MAX);
    match timestamp {
        EARLIEST => Ok((as_i64(start), -1)),
        LATEST => Ok((as_i64(end), -1)),
        t if t >= 0 => {
            let raw = records::is_raw(&info.schema);
            let column = vec!["timestamp".to_string()];
            let mut from = start;
            while let Some(found) = cx.node.first_batch_at_time(&b, from, t).await? {
                if !raw {
                    return Ok((as_i64(found.base_offset), found.timestamp_ms));
                }
                // The batch's time is its latest record's: find that record. (Rows written
                // to a raw table over Flight are stamped at append: look further if none is.)
                let read = cx
                    .node
                    .read_bucket(&b, found.base_offset, 1, &column)
                    .await?;
                if let Some(r) = read.first()
                    && let Some((i, ts)) = records::first_at_or_after(&r.batch, t)
                {
                    return Ok((as_i64(r.base_offset + i as u64), ts));
                }
                from = found.end_offset;
            }
            Ok((-1, -1))
        }
        other => Err(NodeError::Invalid(format!(
            "timestamp {other}: expected -2 (earliest), -1 (latest) or a time"
        ))),
    }
}

/// The node coordinating groups and its Kafka address, if it has one.
fn group_coordinator(cx: &Context) -> Option<(u64, String, i32)> {
    let id = cx.node.group_coordinator()?;
    let view = cx.node.view();
    let address = view
        .state
        .nodes
        .get(&id)
        .and_then(|n| n.listeners.get(crate::LISTENER).cloned())
        .or_else(|| {
            (id == cx.node.node_id())
                .then(|| cx.config.advertised.clone())
                .flatten()
        })?;
    let (host, port) = host_port(&address)?;
    Some((id, host, port))
}

fn find_coordinator(cx: &Context, request: &FindCoordinatorRequest) -> FindCoordinatorResponse {
    let response = FindCoordinatorResponse::default().with_node_id(BrokerId(-1));
    if request.key_type != 0 {
        // A transaction coordinator. Clients retry COORDINATOR_NOT_AVAILABLE for as long as
        // their transaction timeout; this code fails `init_transactions` at once.
        return response
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            .with_error_message(Some(StrBytes::from_static_str(
                "Mink does not support Kafka transactions: use an idempotent producer",
            )));
    }
    match group_coordinator(cx) {
        Some((id, host, port)) => response
            .with_node_id(broker(id))
            .with_host(StrBytes::from_string(host))
            .with_port(port),
        None => response
            .with_error_code(ResponseError::CoordinatorNotAvailable.code())
            .with_error_message(Some(StrBytes::from_static_str(
                "no node holds the lease yet, or it has no Kafka listener",
            ))),
    }
}

fn millis(ms: i32) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn join_group(cx: Context, request: &JoinGroupRequest) -> Answer {
    let version = cx.header.request_api_version;
    if !cx.groups.coordinating() {
        let response = kafka_protocol::messages::JoinGroupResponse::default()
            .with_error_code(ResponseError::NotCoordinator.code())
            .with_generation_id(-1);
        return Answer::Now(cx.respond(&response));
    }
    let join = crate::groups::Join {
        group: request.group_id.0.as_str().to_string(),
        member_id: request.member_id.as_str().to_string(),
        client_id: cx
            .header
            .client_id
            .as_ref()
            .map_or_else(String::new, |c| c.as_str().to_string()),
        client_host: cx.peer.clone(),
        instance_id: request
            .group_instance_id
            .as_ref()
            .filter(|i| !i.is_empty())
            .map(|i| i.as_str().to_string()),
        session_timeout: millis(request.session_timeout_ms),
        // Version 0 has one timeout for both.
        rebalance_timeout: millis(if version == 0 {
            request.session_timeout_ms
        } else {
            request.rebalance_timeout_ms
        }),
        protocol_type: request.protocol_type.as_str().to_string(),
        protocols: request
            .protocols
            .iter()
            .map(|p| (p.name.as_str().to_string(), p.metadata.clone()))
            .collect(),
        version,
    };
    Answer::Later(
        async move {
            let response = cx.groups.join(join).await;
            cx.respond(&response)
        }
        .boxed(),
    )
}

fn sync_group(cx: Context, request: SyncGroupRequest) -> Answer {
    if !cx.groups.coordinating() {
        let response = kafka_protocol::messages::SyncGroupResponse::default()
            .with_error_code(ResponseError::NotCoordinator.code());
        return Answer::Now(cx.respond(&response));
    }
    Answer::Later(
        async move {
            let response = cx
                .groups
                .sync(
                    request.group_id.0.as_str(),
                    request.member_id.as_str(),
                    request.generation_id,
                    request
                        .assignments
                        .iter()
                        .map(|a| (a.member_id.as_str().to_string(), a.assignment.clone()))
                        .collect(),
                )
                .await;
            cx.respond(&response)
        }
        .boxed(),
    )
}

fn leave_group(cx: Context, request: LeaveGroupRequest) -> Answer {
    if !cx.groups.coordinating() {
        let response =
            LeaveGroupResponse::default().with_error_code(ResponseError::NotCoordinator.code());
        return Answer::Now(cx.respond(&response));
    }
    // Versions 0-2 name one member; 3 and later a list.
    let members: Vec<String> = if cx.header.request_api_version < 3 {
        vec![request.member_id.as_str().to_string()]
    } else {
        request
            .members
            .iter()
            .map(|m| m.member_id.as_str().to_string())
            .collect()
    };
    Answer::Later(
        async move {
            let codes = cx.groups.leave(request.group_id.0.as_str(), &members).await;
            // Versions 0-2 answer with one code and have no member list to set.
            let response = if cx.header.request_api_version < 3 {
                LeaveGroupResponse::default().with_error_code(codes[0].code())
            } else {
                LeaveGroupResponse::default().with_members(
                    members
                        .iter()
                        .zip(&codes)
                        .map(|(m, c)| {
                            MemberResponse::default()
                                .with_member_id(StrBytes::from_string(m.clone()))
                                .with_error_code(c.code())
                        })
                        .collect(),
                )
            };
            cx.respond(&response)
        }
        .boxed(),
    )
}

fn offset_commit(cx: Context, request: &OffsetCommitRequest) -> Answer {
    let group = request.group_id.0.as_str().to_string();
    // The epoch the membership checks below were made under: the commit is refused if the
    // lease has moved on by the time it is applied.
    let coordinator_epoch = cx.node.group_coordinator_epoch();
    let refused = if cx.groups.coordinating() {
        cx.groups.may_commit(
            &group,
            request.member_id.as_str(),
            request.generation_id_or_member_epoch,
        )
    } else {
        ResponseError::NotCoordinator
    };
    // Per partition: its bucket, or why it cannot be committed.
    let mut entries = Vec::new();
    let mut topics = Vec::new();
    for t in &request.topics {
        let name = t.name.0.as_str();
        let table = topic_table(&cx, name);
        let mut partitions = Vec::new();
        for p in &t.partitions {
            let code = if refused != crate::groups::NO_ERROR {
                refused
            } else {
                match &table {
                    Err(code) => *code,
                    Ok(info) => match (
                        u32::try_from(p.partition_index)
                            .ok()
                            .filter(|b| *b < info.bucket_count),
                        u64::try_from(p.committed_offset),
                    ) {
                        (None, _) => ResponseError::UnknownTopicOrPartition,
                        (Some(_), Err(_)) => ResponseError::InvalidRequest,
                        (Some(bucket), Ok(offset)) => {
                            entries.push((
                                BucketRef::new(&info.database, &info.name, None, bucket),
                                offset,
                                p.committed_leader_epoch,
                                p.committed_metadata
                                    .as_ref()
                                    .map_or_else(String::new, |m| m.as_str().to_string()),
                            ));
                            crate::groups::NO_ERROR
                        }
                    },
                }
            };
            partitions.push((p.partition_index, code));
        }
        topics.push((t.name.clone(), partitions));
    }
    Answer::Later(
        async move {
            // All of the request's offsets in one command: they are stored together or not.
            let stored = if entries.is_empty() {
                Ok(())
            } else {
                cx.node
                    .commit_group_offsets(&group, &entries, coordinator_epoch)
                    .await
            };
            let failed = stored.err().map(|e| error_code(&e));
            let response = OffsetCommitResponse::default().with_topics(
                topics
                    .into_iter()
                    .map(|(name, partitions)| {
                        OffsetCommitResponseTopic::default()
                            .with_name(name)
                            .with_partitions(
                                partitions
                                    .into_iter()
                                    .map(|(index, code)| {
                                        let code = match (code, failed) {
                                            (crate::groups::NO_ERROR, Some(f)) => f,
                                            (c, _) => c,
                                        };
                                        OffsetCommitResponsePartition::default()
                                            .with_partition_index(index)
                                            .with_error_code(code.code())
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
            cx.respond(&response)
        }
        .boxed(),
    )
}

fn offset_fetch(cx: &Context, request: &OffsetFetchRequest) -> OffsetFetchResponse {
    if !cx.groups.coordinating() {
        return OffsetFetchResponse::default()
            .with_error_code(ResponseError::NotCoordinator.code());
    }
    let committed: std::collections::BTreeMap<(String, u32), (u64, i32, String)> = cx
        .node
        .group_offsets(request.group_id.0.as_str())
        .into_iter()
        .filter(|c| c.bucket.partition.is_none())
        .map(|c| {
            (
                (
                    topic_of(&cx.config, &c.bucket.database, &c.bucket.table),
                    c.bucket.bucket,
                ),
                (c.offset, c.leader_epoch, c.metadata),
            )
        })
        .collect();
    let partition = |topic: &str, index: i32| {
        let found = u32::try_from(index)
            .ok()
            .and_then(|b| committed.get(&(topic.to_string(), b)));
        let p = OffsetFetchResponsePartition::default().with_partition_index(index);
        match found {
            Some((offset, epoch, metadata)) => p
                .with_committed_offset(i64::try_from(*offset).unwrap_or(i64::MAX))
                .with_committed_leader_epoch(*epoch)
                .with_metadata(Some(StrBytes::from_string(metadata.clone()))),
            None => p
                .with_committed_offset(-1)
                .with_committed_leader_epoch(-1)
                .with_metadata(Some(StrBytes::default())),
        }
    };
    let topics = match &request.topics {
        Some(topics) => topics
            .iter()
            .map(|t| {
                OffsetFetchResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(
                        t.partition_indexes
                            .iter()
                            .map(|i| partition(t.name.0.as_str(), *i))
                            .collect(),
                    )
            })
            .collect(),
        None => {
            let mut by_topic: std::collections::BTreeMap<&String, Vec<i32>> = Default::default();
            for (topic, bucket) in committed.keys() {
                by_topic
                    .entry(topic)
                    .or_default()
                    .push(i32::try_from(*bucket).unwrap_or(i32::MAX));
            }
            by_topic
                .into_iter()
                .map(|(topic, indexes)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(topic_name(topic))
                        .with_partitions(indexes.into_iter().map(|i| partition(topic, i)).collect())
                })
                .collect()
        }
    };
    OffsetFetchResponse::default().with_topics(topics)
}

/// DeleteGroups (`kafka-consumer-groups --delete`): a group with no members loses its committed
/// offsets; one with members is refused (NON_EMPTY_GROUP), one unknown is GROUP_ID_NOT_FOUND.
async fn delete_groups(cx: &Context, request: &DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(request.groups_names.len());
    for id in &request.groups_names {
        let group = id.0.as_str();
        let code = if !cx.groups.coordinating() {
            ResponseError::NotCoordinator
        } else {
            let known = {
                let mut groups = cx.groups.groups.lock().expect("groups");
                match groups.get(group) {
                    Some(g) if !g.members.is_empty() => Err(ResponseError::NonEmptyGroup),
                    Some(_) => {
                        cx.groups.forget(&mut groups, group);
                        Ok(true)
                    }
                    None => {
                        cx.groups.forget(&mut groups, group);
                        Ok(false)
                    }
                }
            };
            match known {
                Err(code) => code,
                Ok(known) if !known && cx.node.group_offsets(group).is_empty() => {
                    ResponseError::GroupIdNotFound
                }
                Ok(_) => match cx.node.delete_group_offsets(group).await {
                    Ok(()) => crate::groups::NO_ERROR,
                    Err(e) => error_code(&e),
                },
            }
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(id.clone())
                .with_error_code(code.code()),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

fn list_groups(cx: &Context, request: &ListGroupsRequest) -> ListGroupsResponse {
    // Admin clients ask every broker and merge the answers, as Kafka's brokers each list the
    // groups they coordinate: a node coordinating none answers an empty list, not an error.
    if !cx.groups.coordinating() {
        return ListGroupsResponse::default();
    }
    let mut listed: std::collections::BTreeMap<String, (String, &'static str)> = cx
        .node
        .groups_with_offsets()
        .into_iter()
        .map(|g| (g, ("consumer".to_string(), "Empty")))
        .collect();
    for (id, g) in cx.groups.groups.lock().expect("groups").iter() {
        listed.insert(id.clone(), (g.protocol_type.clone(), g.phase.name()));
    }
    // ListGroups 4 on: only the groups in the states asked for (none named: every group).
    let wanted = |state: &str| {
        request.states_filter.is_empty()
            || request
                .states_filter
                .iter()
                .any(|s| s.as_str().eq_ignore_ascii_case(state))
    };
    ListGroupsResponse::default().with_groups(
        listed
            .into_iter()
            .filter(|(_, (_, state))| wanted(state))
            .map(|(id, (protocol_type, state))| {
                ListedGroup::default()
                    .with_group_id(GroupId(StrBytes::from_string(id)))
                    .with_protocol_type(StrBytes::from_string(protocol_type))
                    .with_group_state(StrBytes::from_static_str(state))
            })
            .collect(),
    )
}

fn describe_groups(cx: &Context, request: &DescribeGroupsRequest) -> DescribeGroupsResponse {
    let coordinating = cx.groups.coordinating();
    let groups = cx.groups.groups.lock().expect("groups");
    DescribeGroupsResponse::default().with_groups(
        request
            .groups
            .iter()
            .map(|id| {
                let described = DescribedGroup::default().with_group_id(id.clone());
                if !coordinating {
                    return described.with_error_code(ResponseError::NotCoordinator.code());
                }
                let Some(g) = groups.get(id.0.as_str()) else {
                    // A group with committed offsets but no members (new to this coordinator,
                    // or one that only commits) is Empty, as ListGroups says; Dead is a group
                    // Kafka knows nothing of.
                    if cx.node.group_offsets(id.0.as_str()).is_empty() {
                        return described.with_group_state(StrBytes::from_static_str("Dead"));
                    }
                    return described
                        .with_group_state(StrBytes::from_static_str("Empty"))
                        .with_protocol_type(StrBytes::from_static_str("consumer"));
                };
                let protocol = g.protocol.clone().unwrap_or_default();
                described
                    .with_group_state(StrBytes::from_static_str(g.phase.name()))
                    .with_protocol_type(StrBytes::from_string(g.protocol_type.clone()))
                    .with_protocol_data(StrBytes::from_string(protocol.clone()))
                    .with_members(
                        g.members
                            .iter()
                            .map(|(member_id, m)| {
                                DescribedGroupMember::default()
                                    .with_member_id(StrBytes::from_string(member_id.clone()))
                                    .with_client_id(StrBytes::from_string(m.client_id.clone()))
                                    .with_client_host(StrBytes::from_string(m.client_host.clone()))
                                    .with_group_instance_id(
                                        m.instance_id.clone().map(StrBytes::from_string),
                                    )
                                    .with_member_metadata(
                                        m.protocols
                                            .iter()
                                            .find(|(n, _)| *n == protocol)
                                            .map(|(_, meta)| meta.clone())
                                            .unwrap_or_default(),
                                    )
                                    .with_member_assignment(m.assignment.clone())
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

async fn delete_topics(cx: &Context, request: &DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut results = Vec::with_capacity(request.topic_names.len());
    for name in &request.topic_names {
        let result = DeletableTopicResult::default().with_name(Some(name.clone()));
        let dropped = match topic_table(cx, name.0.as_str()) {
            Err(code) => Err((code, format!("no topic {}", name.0.as_str()))),
            Ok(info) => cx
                .node
                .drop_table(&info.database, &info.name, false)
                .await
                .map_err(|e| (error_code(&e), e.to_string())),
        };
        results.push(match dropped {
            Ok(()) => result,
            Err((code, message)) => result
                .with_error_code(code.code())
                .with_error_message(Some(StrBytes::from_string(message))),
        });
    }
    DeleteTopicsResponse::default().with_responses(results)
}

/// A table's bucket count is fixed when it is created (rows are routed by it), so partitions
/// cannot be added: the request is answered with why.
fn create_partitions(cx: &Context, request: &CreatePartitionsRequest) -> CreatePartitionsResponse {
    CreatePartitionsResponse::default().with_results(
        request
            .topics
            .iter()
            .map(|t| {
                let result = CreatePartitionsTopicResult::default().with_name(t.name.clone());
                let (code, message) = match topic_table(cx, t.name.0.as_str()) {
                    Err(code) => (code, format!("no topic {}", t.name.0.as_str())),
                    Ok(info) => (
                        ResponseError::InvalidPartitions,
                        format!(
                            "{} has {} partitions, fixed when it was created (its rows are routed by the count): create a new topic with more",
                            t.name.0.as_str(),
                            info.bucket_count
                        ),
                    ),
                };
                result
                    .with_error_code(code.code())
                    .with_error_message(Some(StrBytes::from_string(message)))
            })
            .collect(),
    )
}

/// Kafka's config resource types.
const TOPIC_RESOURCE: i8 = 2;
const BROKER_RESOURCE: i8 = 4;

/// A topic's configs, as Kafka names them, from the table's options: `retention.ms` from
/// `table.log.ttl` (-1 when rows are kept until tiered or forever), deletion as the cleanup
/// policy, and every Mink option under its own name.
fn describe_configs(cx: &Context, request: &DescribeConfigsRequest) -> DescribeConfigsResponse {
    let config = |name: &str, value: String| {
        DescribeConfigsResourceResult::default()
            .with_name(StrBytes::from_string(name.to_string()))
            .with_value(Some(StrBytes::from_string(value)))
            .with_read_only(true)
            // DEFAULT_CONFIG for derived values; 1 (TOPIC_CONFIG) for the table's own options.
            .with_config_source(5)
    };
    DescribeConfigsResponse::default().with_results(
        request
            .resources
            .iter()
            .map(|r| {
                let result = DescribeConfigsResult::default()
                    .with_resource_type(r.resource_type)
                    .with_resource_name(r.resource_name.clone());
                let wanted = |name: &str| {
                    r.configuration_keys
                        .as_ref()
                        .is_none_or(|keys| keys.iter().any(|k| k.as_str() == name))
                };
                match r.resource_type {
                    TOPIC_RESOURCE => match topic_table(cx, r.resource_name.as_str()) {
                        Err(code) => result.with_error_code(code.code()),
                        Ok(info) => {
                            let ttl = mink_log::options::TableOptions::parse(&info.options)
                                .ok()
                                .and_then(|o| o.log_ttl);
                            let retention = config(
                                "retention.ms",
                                ttl.map_or_else(|| "-1".to_string(), |t| t.as_millis().to_string()),
                            );
                            let mut configs = vec![
                                // Set on the table (table.log.ttl): a topic config; else the
                                // default (7 days).
                                if info.options.contains_key(mink_log::options::LOG_TTL) {
                                    retention.with_config_source(1)
                                } else {
                                    retention
                                },
                                config("cleanup.policy", "delete".to_string()),
                            ];
                            if records::is_raw(&info.schema) {
                                let option = info
                                    .options
                                    .get(mink_log::options::LOG_COMPRESSION)
                                    .map(String::as_str);
                                // An option set to another spelling than ours reads as ZSTD,
                                // the table's only other codec.
                                let kafka = COMPRESSION_TYPES
                                    .iter()
                                    .find(|(_, o)| *o == option)
                                    .map_or("zstd", |(k, _)| k);
                                let c = config(COMPRESSION_TYPE, kafka.to_string());
                                configs.push(if option.is_some() {
                                    c.with_config_source(1)
                                } else {
                                    c
                                });
                            }
                            configs.extend(
                                info.options
                                    .iter()
                                    .map(|(k, v)| config(k, v.clone()).with_config_source(1)),
                            );
                            result.with_configs(
                                configs
                                    .into_iter()
                                    .filter(|c| wanted(c.name.as_str()))
                                    .collect(),
                            )
                        }
                    },
                    BROKER_RESOURCE => result,
                    _ => result
                        .with_error_code(ResponseError::InvalidRequest.code())
                        .with_error_message(Some(StrBytes::from_static_str(
                            "configs are described for topics and brokers",
                        ))),
                }
            })
            .collect(),
    )
}

fn describe_cluster(cx: &Context) -> DescribeClusterResponse {
    let kafka_nodes = kafka_nodes(cx);
    DescribeClusterResponse::default()
        .with_cluster_id(cluster_id(cx))
        .with_controller_id(controller(cx, &kafka_nodes))
        .with_brokers(
            kafka_nodes
                .into_iter()
                .map(|(id, (host, port))| {
                    DescribeClusterBroker::default()
                        .with_broker_id(broker(id))
                        .with_host(StrBytes::from_string(host))
                        .with_port(port)
                })
                .collect(),
        )
}

/// Creates a topic's log table with the raw schema and `partitions` buckets (and the Kafka
/// database, the first time).
async fn create_raw_topic(
    cx: &Context,
    database: &str,
    table: &str,
    partitions: i32,
    options: Vec<(String, String)>,
    if_not_exists: bool,
) -> std::result::Result<TableInfo, NodeError> {
    if database == cx.config.database {
        cx.node.create_database(database, true).await?;
    }
    cx.node
        .create_table(TableSpec {
            database: database.to_string(),
            name: table.to_string(),
            schema: records::raw_schema(),
            primary_key: vec![],
            options: std::iter::once(("bucket.num".to_string(), partitions.to_string()))
                .chain(options)
                .collect(),
            partition_keys: vec![],
            comment: String::new(),
            if_not_exists,
        })
        .await
}

/// Topics a Metadata request names that do not exist, created with the raw schema when the
/// listener allows it ([`crate::KafkaConfig::auto_create_topics`]) and the request asks for it
/// (always, before version 4).
async fn auto_create(cx: &Context, request: &MetadataRequest) {
    let Some(partitions) = cx.config.auto_create_topics else {
        return;
    };
    let asked = cx.header.request_api_version < 4 || request.allow_auto_topic_creation;
    let Some(topics) = request.topics.as_ref().filter(|_| asked) else {
        return;
    };
    for name in topics.iter().filter_map(|t| t.name.as_ref()) {
        if invalid_topic_name(name.0.as_str()).is_some() {
            continue; // answered UNKNOWN_TOPIC_OR_PARTITION, as Kafka does
        }
        let (database, table) = table_of(&cx.node, &cx.config, name.0.as_str());
        if cx.node.describe_table(&database, &table).is_ok() {
            continue;
        }
        let partitions = i32::try_from(partitions).unwrap_or(1);
        if let Err(e) = create_raw_topic(cx, &database, &table, partitions, Vec::new(), true).await
        {
            tracing::debug!(topic = name.0.as_str(), error = %e, "auto-creating a topic failed");
        }
    }
}
