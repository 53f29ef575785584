//! This node's side of bucket leadership, reconciled with the metadata view every
//! `leadership_interval`: open the stream of every bucket this node leads at the bucket's
//! leader epoch (fencing whoever wrote it before), and forget buckets it no longer leads. Who
//! leads what is the coordinator's decision (`mink-coordinator`, on the lease holder).

use std::collections::BTreeSet;

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
