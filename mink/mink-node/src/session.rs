//! A stream of writes from one client (a Flight `DoPut`, a Kafka connection): the rows of a
//! routed write whose bucket another node leads are forwarded to that leader, in the order the
//! writes were submitted, through one queue per leader, so a slow leader holds up only the
//! rows bound for it.

use std::collections::HashMap;
use std::sync::Mutex;

use arrow::array::RecordBatch;
use tokio::sync::{mpsc, oneshot};

use crate::node::{PendingWrite, WriteTarget};
use crate::{AppendAck, BucketRef, Node, NodeError, NodeResult};

/// Longest a forwarded write's answer waits for this node to apply the leader's index.
const APPLIED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Rows queued for one leader.
struct Job {
    bucket: BucketRef,
    rows: RecordBatch,
    applied_index: u64,
    reply: oneshot::Sender<NodeResult<AppendAck>>,
}

/// Writes of one stream (see the module docs). Dropping it stops its forwarding queues once
/// they are empty.
pub struct WriteSession {
    node: Node,
    leaders: Mutex<HashMap<String, mpsc::UnboundedSender<Job>>>,
}

impl std::fmt::Debug for WriteSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSession").finish_non_exhaustive()
    }
}

impl Node {
    /// A session for a stream of writes that forwards rows to their buckets' leaders.
    pub fn write_session(&self) -> WriteSession {
        WriteSession {
            node: self.clone(),
            leaders: Mutex::new(HashMap::new()),
        }
    }
}

impl WriteSession {
    /// [`Node::submit_write`], and the rows of a routed write for buckets led elsewhere queued
    /// for their leaders behind this session's earlier writes to them: the write resolves
    /// with the leaders' results for those buckets (a forward cut short is `Unavailable`, its
    /// outcome unknown). Without a forwarder, those buckets keep their `NotLeader`.
    pub async fn submit(
        &self,
        database: &str,
        table: &str,
        batch: &RecordBatch,
        target: &WriteTarget,
    ) -> NodeResult<PendingWrite> {
        let mut pending = self
            .node
            .submit_write(database, table, batch, target)
            .await?;
        let forwards = std::mem::take(&mut pending.forwards);
        if forwards.is_empty() || self.node.forwarder().is_err() {
            return Ok(pending);
        }
        let applied_index = self.node.view().applied_index;
        let mut replies = Vec::with_capacity(forwards.len());
        for f in forwards {
            let (reply, answer) = oneshot::channel();
            let job = Job {
                bucket: BucketRef {
                    database: database.to_string(),
                    table: table.to_string(),
                    partition: f.partition,
                    bucket: f.bucket,
                },
                rows: f.rows,
                applied_index,
                reply,
            };
            self.queue(&f.address).send(job).map_err(|_| {
                NodeError::Unavailable("the forwarding queue stopped; retry".into())
            })?;
            replies.push((f.position, answer));
        }
        Ok(pending.with_replaced(async move {
            let mut out = Vec::with_capacity(replies.len());
            for (position, answer) in replies {
                out.push((
                    position,
                    answer.await.unwrap_or_else(|_| {
                        Err(NodeError::Unavailable(
                            "the forward was dropped: the write's outcome is unknown".into(),
                        ))
                    }),
                ));
            }
            out
        }))
    }

    /// The queue of `address`, started on first use: one forward at a time, in order.
    fn queue(&self, address: &str) -> mpsc::UnboundedSender<Job> {
        let mut leaders = self.leaders.lock().expect("leaders lock");
        if let Some(q) = leaders.get(address).filter(|q| !q.is_closed()) {
            return q.clone();
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let node = self.node.clone();
        let leader = address.to_string();
        tokio::spawn(async move {
            while let Some(job) = rx.recv().await {
                let result = match node.forwarder() {
                    Ok(f) => {
                        f.write(&leader, &job.bucket, &job.rows, job.applied_index)
                            .await
                    }
                    Err(e) => Err(e),
                };
                // Answer once this node has applied the rows' commit too (read-your-writes
                // for a client that reads here next); a lagging view only delays the answer.
                let result = match result {
                    Ok((ack, index)) => {
                        if let Err(e) = node.wait_applied(index, APPLIED_WAIT).await {
                            tracing::debug!(error = %e, index, "forwarded write: view behind the leader's");
                        }
                        Ok(ack)
                    }
                    Err(e) => Err(e),
                };
                let _ = job.reply.send(result);
            }
        });
        leaders.insert(address.to_string(), tx.clone());
        tx
    }
}
