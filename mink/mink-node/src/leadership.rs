//! Bucket leadership, reconciled with the metadata view every `leadership_interval`:
//! - as coordinator (lease holder): give every bucket without a leader to the least loaded live
//!   node, and a bucket led by an earlier life of a restarted node back to that node, with
//!   `LeadBucket` (which raises the bucket's leader epoch). Moving the buckets of a node that
//!   died and stayed down (failover) is not automatic yet;
//! - as any node: open the stream of every bucket this node leads at the bucket's leader
//!   epoch (fencing whoever wrote it before), and forget buckets it no longer leads.

use std::collections::{BTreeMap, BTreeSet};

use mink_metadata::{Command, LeadBucket};

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
    let sink = &node.inner.sink;
    let view = node.view();
    // Buckets without a leader, or led by an earlier life of a node that has since restarted
    // (registered again at a new node epoch).
    let orphaned: Vec<_> = view
        .state
        .buckets
        .values()
        .filter(|b| {
            b.leader_node_id == 0
                || view
                    .state
                    .nodes
                    .get(&b.leader_node_id)
                    .is_none_or(|n| n.node_epoch != b.leader_node_epoch)
        })
        .cloned()
        .collect();
    let coordinator_epoch = sink.lease().borrow().coordinator_epoch();
    if let (Some(epoch), false) = (coordinator_epoch, orphaned.is_empty()) {
        let live: BTreeSet<u64> = sink
            .live_nodes()
            .await?
            .into_iter()
            .map(|n| n.node_id)
            .filter(|id| view.state.nodes.contains_key(id))
            .collect();
        // Load per live node: how many buckets each leads now.
        let mut load: BTreeMap<u64, usize> = live.iter().map(|id| (*id, 0)).collect();
        for b in view.state.buckets.values() {
            if let Some(n) = load.get_mut(&b.leader_node_id) {
                *n += 1;
            }
        }
        for b in orphaned {
            // A restarted node takes its buckets back; the rest go to the least loaded.
            let pick = if live.contains(&b.leader_node_id) {
                Some(b.leader_node_id)
            } else if b.leader_node_id == 0 {
                load.iter()
                    .min_by_key(|(id, n)| (**n, **id))
                    .map(|(id, _)| *id)
            } else {
                // Its leader is gone without restarting: failover is not automatic yet.
                None
            };
            let Some(pick) = pick else { continue };
            *load.entry(pick).or_default() += 1;
            let proposed = sink
                .propose(Command::LeadBucket(LeadBucket {
                    coordinator_epoch: epoch,
                    table_id: b.table_id,
                    partition_id: b.partition_id,
                    bucket: b.bucket,
                    leader_node_id: pick,
                }))
                .await?;
            if let Err(r) = proposed.result {
                tracing::info!(%r, table = b.table_id, bucket = b.bucket, "LeadBucket refused");
            }
        }
    }
    // Open what this node leads; forget what it no longer does.
    let me = sink.node();
    let view = node.view();
    let mine: Vec<_> = view
        .state
        .buckets
        .values()
        .filter(|b| b.leader_node_id == me.node_id && b.leader_node_epoch == me.node_epoch)
        .cloned()
        .collect();
    {
        let keep: BTreeSet<_> = mine
            .iter()
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
    for b in mine {
        let Some(table) = view.state.tables.get(&b.table_id) else {
            continue;
        };
        // A failure (the epoch moved on meanwhile) is retried by the next round.
        if let Err(e) = node.lead(table, &b).await {
            tracing::info!(error = %e, bucket = b.bucket, "could not open bucket stream");
        }
    }
    Ok(())
}
