//! This node's side of bucket leadership, reconciled with the metadata view every
//! `leadership_interval`: open the stream of every bucket this node leads at the bucket's
//! leader epoch (fencing whoever wrote it before), forget buckets it no longer leads, and hand
//! over buckets the coordinator moves away. Who leads what is the coordinator's decision
//! (`mink-coordinator`, on the lease holder).
//!
//! A graceful move (drain, rebalance): the coordinator marks the bucket's stream as transferred
//! to another node (`TransferStream`). From then on the leader redirects writes to that node
//! (`NotLeader`, see [`Node::tablet`]); here it waits for the appends in flight, snapshots the
//! bucket's KV tablet (so the next leader replays little), and closes the stream. Seeing the
//! stream closed, the coordinator leads the bucket on the target, which opens the stream at the
//! next leader epoch and completes the transfer (`CompleteTransfer`).

use std::collections::BTreeSet;

use mink_coordinator::planner::{handed_over, moving_to};
use mink_metadata::{BucketRecord, Command, CompleteTransfer};

use crate::{Node, NodeResult};

pub(crate) async fn run(node: Node) {
    let mut shutdown = node.inner.shutdown.subscribe();
    loop {
        if let Err(e) = reconcile(&node).await {
            tracing::warn!(error = %e, "bucket leadership round failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(node.inner.config.leadership_interval) => {}
            _ = shutdown.changed() => return,
        }
    }
}

async fn reconcile(node: &Node) -> NodeResult<()> {
    let me = node.inner.sink.node();
    let view = node.view();
    let (moving, mine): (Vec<_>, Vec<_>) = view
        .state
        .buckets
        .values()
        .filter(|b| b.leader_node_id == me.node_id && b.leader_node_epoch == me.node_epoch)
        .cloned()
        .partition(|b| moving_to(&view.state, b).is_some());
    {
        let keep: BTreeSet<_> = mine
            .iter()
            .chain(&moving)
            .map(|b| (b.table_id, b.partition_id, b.bucket))
            .collect();
        node.inner
            .led
            .write()
            .expect("led lock")
            .retain(|k, _| keep.contains(k));
        node.inner
            .kv
            .write()
            .expect("kv lock")
            .retain(|k, _| keep.contains(k));
    }
    // Hand-overs run side by side: a drain moves every bucket at once.
    let handovers = moving.iter().filter(|b| {
        view.state
            .streams
            .get(&b.stream_id)
            .is_some_and(|s| !handed_over(s, b))
    });
    futures::future::join_all(handovers.map(|b| hand_over(node, b))).await;
    for b in mine {
        let Some(table) = view.state.tables.get(&b.table_id) else {
            continue;
        };
        // A failure (the epoch moved on meanwhile) is retried by the next round.
        if let Err(e) = node.lead(table, &b).await {
            tracing::info!(error = %e, bucket = b.bucket, "could not open bucket stream");
            continue;
        }
        let arriving = view
            .state
            .streams
            .get(&b.stream_id)
            .is_some_and(|s| s.transfer_to_node_id == me.node_id);
        if arriving {
            complete_transfer(node, &b).await;
        }
    }
    Ok(())
}

/// Hands a bucket over: no appends after those in flight, a KV snapshot, the stream closed.
/// Writes are already redirected (the view shows the transfer). A failure leaves the move to
/// the coordinator's handover timeout.
async fn hand_over(node: &Node, b: &BucketRecord) {
    let key = (b.table_id, b.partition_id, b.bucket);
    let led = node.inner.led.read().expect("led lock").get(&key).copied();
    let Some(led) = led.filter(|l| l.leader_epoch == b.leader_epoch) else {
        // Never opened in this life: nothing in flight, nothing to close here.
        return;
    };
    let started = std::time::Instant::now();
    if let Err(e) = node.inner.streams.stop_appends(led.stream_id).await {
        tracing::warn!(error = %e, bucket = b.bucket, "handover: stopping appends");
        return;
    }
    let kv = node.inner.kv.read().expect("kv lock").get(&key).cloned();
    if let Some(open) = kv.filter(|o| o.leader_epoch == b.leader_epoch)
        && let Err(e) = node.snapshot_kv_bucket(key, &open).await
    {
        // The next leader replays more of the log; nothing is lost.
        tracing::warn!(error = %e, bucket = b.bucket, "handover: KV snapshot");
    }
    if let Err(e) = node.inner.streams.close(led.stream_id).await {
        tracing::warn!(error = %e, bucket = b.bucket, "handover: closing the stream");
        return;
    }
    node.inner.led.write().expect("led lock").remove(&key);
    node.inner.kv.write().expect("kv lock").remove(&key);
    tracing::info!(
        table_id = b.table_id,
        partition = b.partition_id,
        bucket = b.bucket,
        leader_epoch = b.leader_epoch,
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "handed over bucket"
    );
}

/// The target of a move leads the bucket: the transfer is complete.
async fn complete_transfer(node: &Node, b: &BucketRecord) {
    let me = node.inner.sink.node();
    let command = Command::CompleteTransfer(CompleteTransfer {
        node_id: me.node_id,
        node_epoch: me.node_epoch,
        stream_id: b.stream_id,
        stream_epoch: b.leader_epoch,
    });
    match node.inner.sink.propose(command).await {
        Ok(p) => {
            if let Err(r) = p.result {
                tracing::debug!(%r, bucket = b.bucket, "completing a transfer");
            }
        }
        Err(e) => tracing::warn!(error = %e, bucket = b.bucket, "completing a transfer"),
    }
}
