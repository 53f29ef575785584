//! The object store belongs to one cluster. Object ids come from the metadata, so two
//! clusters (or a dev node and a cluster) writing under one bucket prefix reuse each other's
//! ids: each overwrote the other's objects, and each one's orphan sweep deleted the other's.
//! The cluster's id lives in its metadata; the store holds it in a marker object, checked at
//! every start before anything is written.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};

use mink_metadata::{Command, PutKvIfAbsent};
use mink_sql::Sink;

use crate::{NodeError, NodeResult};

/// The metadata KV key of the cluster's id.
const CLUSTER_ID: &str = "cluster/id";
/// Present once the cluster has marked its store: a store without the marker is then not it.
const STORE_MARKED: &str = "cluster/store-marked";
/// The marker object, at the root of the store's prefix.
pub(crate) const MARKER: &str = "mink-cluster";

/// What the marker holds: this line, then the cluster's id.
const MARKER_TEXT: &str = "mink cluster ";

impl crate::Node {
    /// The cluster's id (a UUID chosen by its first node, kept in the metadata): what Kafka's
    /// Metadata and DescribeCluster name the cluster, and what the object store's marker holds.
    pub fn cluster_id(&self) -> Option<String> {
        cluster_id_in(&self.view().state)
    }
}

/// The cluster's id as `state` records it (none before the first node chose one).
fn cluster_id_in(state: &mink_metadata::State) -> Option<String> {
    state
        .kv
        .get(CLUSTER_ID)
        .map(|r| String::from_utf8_lossy(&r.value).into_owned())
}

/// The value of metadata KV `key`: the one there, or else `value`, written (the first node
/// to write one wins).
async fn put_once(sink: &Sink, key: &str, value: &str) -> NodeResult<String> {
    if let Some(r) = sink.view().state.kv.get(key) {
        return Ok(String::from_utf8_lossy(&r.value).into_owned());
    }
    let proposed = sink
        .propose(Command::PutKvIfAbsent(PutKvIfAbsent {
            key: key.into(),
            value: value.as_bytes().to_vec(),
        }))
        .await?;
    match proposed.result {
        Ok(_) => Ok(value.to_string()),
        Err(r) => match &r.value {
            Some(v) => Ok(String::from_utf8_lossy(v).into_owned()),
            None => Err(NodeError::Failed(format!("metadata {key}: {r}"))),
        },
    }
}

/// Checks that `store` is this cluster's, marking it on the cluster's first start (and on the
/// first start of a cluster from before the marker). Fails the start, naming why, when the
/// store is another cluster's, when the metadata says the store was marked but the marker is
/// missing (a wrong `--object-store`, or a store emptied), when the store cannot be read
/// or written (a missing bucket, wrong credentials), and when it holds objects past the
/// metadata's ids (see [`newer_objects`]; `claim` deletes them instead).
pub(crate) async fn claim_store(
    sink: &Sink,
    store: &dyn ObjectStore,
    object_prefix: &str,
    claim: bool,
) -> NodeResult<()> {
    // The cluster's id, chosen by the first node of the cluster to ask.
    let id = put_once(sink, CLUSTER_ID, &uuid::Uuid::now_v7().to_string()).await?;
    // Nothing is written before both checks pass: a stray node (an empty --metadata against
    // the real bucket) must not mark the store as its own.
    let marked = check_marker(&sink.view().state, store, Some(&id)).await?;
    newer_objects(sink, store, object_prefix, claim).await?;
    mark_store(sink, store, &id, marked).await
}

/// Refuses metadata that is older than the store: objects past every id it has allocated are
/// another copy's (a backup restored while the cluster went on writing, or the original
/// brought back after a restore), and this metadata would write over them. With `claim` (the
/// newer copy is gone for good) they are deleted instead: this metadata never knew them.
async fn newer_objects(
    sink: &Sink,
    store: &dyn ObjectStore,
    object_prefix: &str,
    claim: bool,
) -> NodeResult<()> {
    use futures::{StreamExt as _, TryStreamExt as _};
    let known = sink.view().state.counters.next_object_id;
    let prefix = Path::from(object_prefix);
    let after = s3stream::object_path(object_prefix, known.saturating_sub(1));
    let listed: Vec<u64> = store
        .list_with_offset(Some(&prefix), &after)
        .map_ok(|m| s3stream::object_id_of(&m.location))
        .try_collect::<Vec<_>>()
        .await
        .map_err(unusable)?
        .into_iter()
        .flatten()
        .collect();
    if listed.is_empty() {
        return Ok(());
    }
    // Other nodes of this cluster prepare ids and write objects meanwhile: what was listed
    // was prepared before the log's end now.
    let next = sink.catch_up().await?.state.counters.next_object_id;
    let newer: Vec<u64> = listed.into_iter().filter(|id| *id >= next).collect();
    let Some(first) = newer.first() else {
        return Ok(());
    };
    if claim {
        // Deleting is safe only while no other node of this metadata writes: a running one
        // takes ids from this very next id and would lose what it PUTs to the deletes.
        let me = sink.node().node_id;
        let live: Vec<u64> = sink
            .node_rows()
            .await?
            .iter()
            .filter(|r| r.node_id != me && !r.stopped_cleanly() && sink.is_live(r))
            .map(|r| r.node_id)
            .collect();
        if !live.is_empty() {
            return Err(NodeError::Invalid(format!(
                "--claim-object-store deletes the objects past this metadata's ids: start it on \
                 one node while every other node of the cluster is stopped (live now: {live:?})"
            )));
        }
    } else {
        return Err(NodeError::Invalid(format!(
            "the object store holds {} objects past every id this metadata has allocated (object \
             {first}; its next id is {next}): this metadata is older than the store (restored \
             from a backup while the cluster went on writing, or a copy brought back after a \
             restore), and would write over them. If this metadata is the cluster's from now on \
             and the newer copy is gone for good, start one node once with \
             --claim-object-store: it deletes those objects (what was written after this \
             metadata's time is lost)",
            newer.len()
        )));
    }
    tracing::warn!(
        objects = newer.len(),
        first,
        next,
        "claiming the object store: deleting the objects past this metadata's ids"
    );
    let paths: Vec<object_store::Result<Path>> = newer
        .iter()
        .map(|id| Ok(s3stream::object_path(object_prefix, *id)))
        .collect();
    let mut deleted = store.delete_stream(futures::stream::iter(paths).boxed());
    while let Some(r) = deleted.next().await {
        match r {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(unusable(e)),
        }
    }
    Ok(())
}

/// The cluster's marker in `store`: its cluster id, or `None` when there is none.
async fn read_marker(store: &dyn ObjectStore) -> NodeResult<Option<String>> {
    match store.get(&Path::from(MARKER)).await {
        Ok(r) => {
            let bytes = r.bytes().await.map_err(unusable)?;
            let text = String::from_utf8_lossy(&bytes);
            let found = text.trim().strip_prefix(MARKER_TEXT).ok_or_else(|| {
                NodeError::Invalid(format!("the object store's {MARKER} is not Mink's"))
            })?;
            Ok(Some(found.to_string()))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(unusable(e)),
    }
}

fn unusable(e: impl std::fmt::Display) -> NodeError {
    NodeError::Unavailable(format!("the object store cannot be used: {e}"))
}

fn another_cluster(found: &str, id: Option<&str>) -> NodeError {
    let this = id.map_or_else(
        || "this metadata is a new cluster's".to_string(),
        |id| format!("this metadata is cluster {id}"),
    );
    NodeError::Invalid(format!(
        "the object store belongs to another Mink cluster ({found}; {this}): \
         object ids would collide, so each cluster needs a bucket or prefix of its own"
    ))
}

/// Checks the marker without writing anything: `true` when the store holds the marker of
/// cluster `id` (`None`: metadata that has chosen no id yet, a new cluster's).
async fn check_marker(
    state: &mink_metadata::State,
    store: &dyn ObjectStore,
    id: Option<&str>,
) -> NodeResult<bool> {
    match (read_marker(store).await?, id) {
        (Some(found), Some(id)) if found == id => Ok(true),
        (Some(found), id) => Err(another_cluster(&found, id)),
        (None, _) if state.kv.contains_key(STORE_MARKED) => Err(NodeError::Invalid(format!(
            "the object store is not this cluster's: it lacks the {MARKER} object this \
             cluster {} wrote there (a wrong --object-store, or a store emptied)",
            id.unwrap_or("?")
        ))),
        (None, _) => Ok(false),
    }
}

/// [`check_marker`] before the node registers: a node started against another cluster's
/// store (or one that cannot be read) fails its start without joining the cluster; it
/// stayed listed as a node that is down, for good.
pub(crate) fn check_before_register(store: Arc<dyn ObjectStore>) -> mink_sql::BeforeRegister {
    mink_sql::BeforeRegister(Arc::new(move |state: Arc<mink_metadata::State>| {
        let store = Arc::clone(&store);
        Box::pin(async move {
            // Metadata without an id yet: a new cluster's, or one whose first node is starting
            // with this one (its marker may be written already); `claim_store` checks then.
            let Some(id) = cluster_id_in(&state) else {
                return Ok(());
            };
            check_marker(&state, store.as_ref(), Some(&id))
                .await
                .map(|_| ())
                .map_err(|e| mink_sql::Refusal {
                    retriable: matches!(e, NodeError::Unavailable(_)),
                    message: e.to_string(),
                })
        })
    }))
}

/// Writes the marker, unless another cluster's came first (a create, where the store can
/// create only when absent), and records in the metadata that the store is marked.
async fn mark_store(
    sink: &Sink,
    store: &dyn ObjectStore,
    id: &str,
    marked: bool,
) -> NodeResult<()> {
    if !marked {
        let path = Path::from(MARKER);
        let marker = PutPayload::from(format!("{MARKER_TEXT}{id}\n").into_bytes());
        let create = object_store::PutOptions::from(object_store::PutMode::Create);
        match store.put_opts(&path, marker.clone(), create).await {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
            // A store without conditional writes: the last marker stands, read back below.
            Err(object_store::Error::NotImplemented { .. }) => {
                store.put(&path, marker).await.map_err(unusable)?;
            }
            Err(e) => return Err(unusable(e)),
        }
        match read_marker(store).await? {
            Some(found) if found == id => {}
            Some(found) => return Err(another_cluster(&found, Some(id))),
            None => {
                return Err(NodeError::Unavailable(format!(
                    "the object store lost {MARKER}"
                )));
            }
        }
    }
    // Also when the marker was there already: a first start that failed after writing it
    // left it unrecorded, and the check for a wrong store rests on the record.
    put_once(sink, STORE_MARKED, id).await.map(|_| ())
}
