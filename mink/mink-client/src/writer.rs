//! Routed, idempotent table writes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow_flight::FlightDescriptor;
use mink_flight::encode::BatchEncoder;
use mink_flight::protocol::{self, BucketResult, ErrorCode, TableDescription};
use mink_log::routing::{split_by_bucket, split_by_partition};

use crate::{Client, ClientError, ClientResult};

/// A bucket: its partition's name (partitioned tables) and number.
type BucketKey = (Option<String>, u32);

/// What a write stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteSummary {
    pub rows: u64,
    /// One result per bucket the rows went to, with their offsets.
    pub buckets: Vec<BucketResult>,
}

/// What the writer knows about its table.
#[derive(Debug)]
struct Layout {
    schema: SchemaRef,
    bucket_count: u32,
    bucket_key: Vec<usize>,
    partition_key: Vec<usize>,
    /// A primary-key table: batches may hold some of the columns (a partial update) and a
    /// `_row_kind` column; keys are found by name.
    primary_key: bool,
    /// A log table stored with ZSTD: batches are sent compressed, so the leader stores
    /// them as they arrive instead of compressing them itself.
    zstd: bool,
    leaders: HashMap<BucketKey, String>,
}

impl Layout {
    fn new(d: &TableDescription) -> ClientResult<Self> {
        let schema = Arc::new(d.arrow_schema().map_err(|e| ClientError::Protocol(e.0))?);
        let index = |c: &String| {
            schema.index_of(c).map_err(|_| {
                ClientError::Protocol(format!("key column {c:?} is not in the schema"))
            })
        };
        let mut layout = Layout {
            bucket_count: d.bucket_count.max(1),
            bucket_key: d
                .bucket_key
                .iter()
                .map(index)
                .collect::<ClientResult<_>>()?,
            partition_key: d
                .partition_keys
                .iter()
                .map(index)
                .collect::<ClientResult<_>>()?,
            primary_key: !d.primary_key.is_empty(),
            zstd: d.primary_key.is_empty()
                && d.options
                    .get("table.log.arrow.compression.type")
                    .is_none_or(|c| c.eq_ignore_ascii_case("zstd")),
            schema,
            leaders: HashMap::new(),
        };
        layout.learn(d);
        Ok(layout)
    }

    fn learn(&mut self, d: &TableDescription) {
        for b in &d.buckets {
            if !b.leader_address.is_empty() {
                self.leaders
                    .insert((b.partition.clone(), b.bucket), b.leader_address.clone());
            }
        }
    }
}

/// Rows of one bucket on their way.
#[derive(Debug)]
struct Part {
    key: BucketKey,
    batch: RecordBatch,
    /// The writer's sequences for it: first and last.
    sequence: Option<(u64, u64)>,
}

/// Source offsets per bucket of a keyless table, for a writer following them: a run of this
/// many offsets goes to one bucket, the same one on every replay.
const FOLLOWING_STRIDE: u64 = 4096;

/// Writes rows to a table: routes each row to its partition and bucket on the client (the
/// server's function, `mink_log::routing`), sends each bucket's rows to the bucket's leader,
/// follows redirects, and retries what failed until [`crate::ClientConfig::retry_deadline`].
///
/// Idempotent by default ([`Client::writer`]): the writer has an id and numbers its batches
/// per bucket, so a batch retried after an unknown outcome (a timeout, a dropped connection, a
/// node crash) is stored once and answered with its original offsets. Calls to
/// [`TableWriter::write`] are sequential (`&mut self`); use several writers for parallelism.
#[derive(Debug)]
pub struct TableWriter {
    client: Client,
    database: String,
    table: String,
    idempotent: bool,
    layout: Option<Layout>,
    writer: Option<protocol::Writer>,
    /// Next sequence per bucket.
    sequences: HashMap<BucketKey, u64>,
    /// Keyless tables: the bucket of the next write.
    sticky: u32,
}

impl TableWriter {
    pub(crate) fn new(client: Client, database: &str, table: &str, idempotent: bool) -> Self {
        TableWriter {
            client,
            database: database.to_string(),
            table: table.to_string(),
            idempotent,
            layout: None,
            writer: None,
            sequences: HashMap::new(),
            sticky: rand_start(),
        }
    }

    /// The writer id (idempotent writers, once the first write has allocated it).
    pub fn writer_id(&self) -> Option<u64> {
        self.writer.map(|w| w.writer_id)
    }

    /// When a write started now must have finished: [`crate::ClientConfig::retry_deadline`].
    fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.client.config().retry_deadline
    }

    /// The error of a write whose deadline passed while it waited for `awaited` from the node
    /// at `address`.
    fn timed_out(&self, awaited: &'static str, address: &str) -> ClientError {
        ClientError::Timeout {
            awaited,
            address: address.to_string(),
            waited: self.client.config().retry_deadline,
        }
    }

    /// [`TableWriter::refresh`], given up at `deadline`: a node may take a request and never
    /// answer it.
    async fn refresh_within(&mut self, deadline: tokio::time::Instant) -> ClientResult<()> {
        // The action's own bound (the same deadline, started a moment later) may fire first:
        // either way the write waited for the table's description.
        match tokio::time::timeout_at(deadline, self.refresh()).await {
            Ok(Err(ClientError::Timeout { .. })) | Err(_) => {
                Err(self.timed_out("table description", &self.client.address()))
            }
            Ok(done) => done,
        }
    }

    async fn refresh(&mut self) -> ClientResult<()> {
        let d = self
            .client
            .describe_table(&self.database, &self.table)
            .await?;
        match &mut self.layout {
            Some(layout) if layout.schema.fields().len() == d.columns.len() => layout.learn(&d),
            _ => self.layout = Some(Layout::new(&d)?),
        }
        Ok(())
    }

    /// Writes `batch` (the table's columns, in order) and returns once every row is durable.
    ///
    /// Primary-key tables: rows upsert; a last Utf8 column `_row_kind` (`upsert` or `delete`)
    /// marks deletes; a batch of only some columns (the key among them) is a partial update
    /// of those columns.
    pub async fn write(&mut self, batch: &RecordBatch) -> ClientResult<WriteSummary> {
        let deadline = self.deadline();
        if self.layout.is_none() {
            self.refresh_within(deadline).await?;
        }
        if self.idempotent && self.writer.is_none() {
            let writer =
                match tokio::time::timeout_at(deadline, self.client.allocate_writer()).await {
                    Ok(Err(ClientError::Timeout { .. })) | Err(_) => {
                        Err(self.timed_out("writer id", &self.client.address()))
                    }
                    Ok(done) => done,
                }?;
            self.writer = Some(writer);
        }
        let parts = self.route(batch)?;
        self.send_parts(parts, deadline).await
    }

    /// A writer `writer` (allocated by the cluster) whose batches stand at `positions` in the
    /// table's buckets, as [`crate::Client::writer_positions`] reads them back: for
    /// [`TableWriter::write_following`], a writer whose sequences follow a source's offsets.
    pub fn following(
        client: Client,
        database: &str,
        table: &str,
        writer: protocol::Writer,
        positions: &[protocol::WriterPosition],
    ) -> TableWriter {
        let mut w = TableWriter::new(client, database, table, true);
        w.writer = Some(writer);
        for p in positions {
            w.sequences.insert(
                (p.partition.clone(), p.bucket),
                p.last_sequence.saturating_add(1),
            );
        }
        w
    }

    /// Writes the rows of `batch` from a source whose offsets (`offsets`, one per row,
    /// ascending) the writer's sequences follow, the batch covering source offsets through
    /// `last_offset`. Each bucket's rows go as one write numbered from the bucket's next
    /// sequence through `last_offset`, so a bucket holds every row routed to it whose offset is
    /// below its next sequence; rows a bucket holds already (a replay after a crash) are left
    /// out. Rows go to buckets by the bucket key, or, in a table without one, by runs of
    /// offsets: the same bucket on every replay.
    pub async fn write_following(
        &mut self,
        batch: &RecordBatch,
        offsets: &[u64],
        last_offset: u64,
    ) -> ClientResult<WriteSummary> {
        if offsets.len() != batch.num_rows() {
            return Err(ClientError::Invalid(format!(
                "{} offsets for {} rows",
                offsets.len(),
                batch.num_rows()
            )));
        }
        if offsets.windows(2).any(|w| w[0] >= w[1])
            || offsets.last().is_some_and(|o| *o > last_offset)
        {
            return Err(ClientError::Invalid(
                "offsets ascend and end at or before last_offset".into(),
            ));
        }
        if self.writer.is_none() {
            return Err(ClientError::Invalid(
                "write_following needs a writer made by TableWriter::following".into(),
            ));
        }
        let deadline = self.deadline();
        if self.layout.is_none() {
            self.refresh_within(deadline).await?;
        }
        let layout = self.layout.as_ref().expect("layout loaded");
        let invalid = |e: mink_log::LogError| ClientError::Invalid(e.to_string());
        let batch = if layout.primary_key {
            batch.clone()
        } else {
            mink_log::codec::check_batch(&layout.schema, batch).map_err(invalid)?
        };
        let partitions = if layout.partition_key.is_empty() {
            vec![None; batch.num_rows()]
        } else {
            mink_log::routing::partitions_of(&batch, &layout.partition_key)
                .map_err(invalid)?
                .into_iter()
                .map(Some)
                .collect()
        };
        let buckets = if layout.bucket_key.is_empty() {
            offsets
                .iter()
                .map(|o| {
                    u32::try_from((o / FOLLOWING_STRIDE) % u64::from(layout.bucket_count))
                        .expect("below the bucket count")
                })
                .collect()
        } else {
            mink_log::routing::buckets_of(&batch, &layout.bucket_key, layout.bucket_count)
                .map_err(invalid)?
        };
        let mut rows: std::collections::BTreeMap<BucketKey, Vec<u32>> = Default::default();
        for (row, (key, offset)) in partitions.into_iter().zip(buckets).zip(offsets).enumerate() {
            // What the bucket holds already is not sent again.
            if *offset >= self.sequences.get(&key).copied().unwrap_or(0) {
                rows.entry(key).or_default().push(
                    u32::try_from(row)
                        .map_err(|_| ClientError::Invalid("batch too large".into()))?,
                );
            }
        }
        let mut parts = Vec::with_capacity(rows.len());
        for (key, indices) in rows {
            let indices = arrow::array::UInt32Array::from(indices);
            let columns = batch
                .columns()
                .iter()
                .map(|c| arrow::compute::take(c.as_ref(), &indices, None))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ClientError::Invalid(e.to_string()))?;
            let part = RecordBatch::try_new(batch.schema(), columns)
                .map_err(|e| ClientError::Invalid(e.to_string()))?;
            let first = self.sequences.get(&key).copied().unwrap_or(0);
            parts.push(Part {
                key,
                batch: part,
                sequence: Some((first, last_offset.max(first))),
            });
        }
        self.send_parts(parts, deadline).await
    }

    /// Sends `parts` to their leaders until each is stored, retrying what may be retried, and
    /// fails once `deadline` passes (an attempt without an answer included).
    async fn send_parts(
        &mut self,
        mut parts: Vec<Part>,
        deadline: tokio::time::Instant,
    ) -> ClientResult<WriteSummary> {
        let rows = parts.iter().map(|p| p.batch.num_rows() as u64).sum();
        let mut done: Vec<BucketResult> = Vec::with_capacity(parts.len());
        let mut backoff = Duration::from_millis(20);
        while !parts.is_empty() {
            let outcomes = self.send(&parts, deadline).await;
            let mut retry = Vec::new();
            let mut refresh = false;
            let mut last_error = None;
            for (part, outcome) in parts.into_iter().zip(outcomes) {
                match outcome {
                    Ok(result) => {
                        if let Some((_, last)) = part.sequence {
                            self.sequences.insert(part.key.clone(), last + 1);
                        }
                        done.push(result);
                    }
                    Err(e @ ClientError::Timeout { .. }) => return Err(e),
                    Err(e) => {
                        let retriable = if self.idempotent {
                            e.is_retriable()
                        } else {
                            // Without a writer id only a refusal before storing is safe to retry.
                            e.code() == Some(ErrorCode::NotLeader)
                        };
                        if !retriable {
                            return Err(e);
                        }
                        match &e {
                            ClientError::Server {
                                leader: Some((_, address)),
                                ..
                            } if !address.is_empty() => {
                                if let Some(layout) = &mut self.layout {
                                    layout.leaders.insert(part.key.clone(), address.clone());
                                }
                            }
                            _ => refresh = true,
                        }
                        tracing::debug!(error = %e, bucket = part.key.1, "retrying a bucket write");
                        last_error = Some(e);
                        retry.push(part);
                    }
                }
            }
            parts = retry;
            if let Some(e) = last_error {
                if tokio::time::Instant::now() + backoff > deadline {
                    return Err(e);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                if refresh {
                    // Leaders moved or are being assigned: ask again (errors retry next round).
                    if let Err(e @ ClientError::Timeout { .. }) =
                        self.refresh_within(deadline).await
                    {
                        return Err(e);
                    }
                }
            }
        }
        done.sort_by(|a, b| (&a.partition, a.bucket).cmp(&(&b.partition, b.bucket)));
        Ok(WriteSummary {
            rows,
            buckets: done,
        })
    }

    /// Splits a batch into the parts of each bucket, numbered for the writer.
    fn route(&mut self, batch: &RecordBatch) -> ClientResult<Vec<Part>> {
        let layout = self.layout.as_ref().expect("layout loaded");
        let invalid = |e: mink_log::LogError| ClientError::Invalid(e.to_string());
        let (batch, bucket_key, partition_key) = if layout.primary_key {
            // Checked by the server, which widens partial batches; keys are found by name.
            let by_name = |indices: &[usize]| -> ClientResult<Vec<usize>> {
                indices
                    .iter()
                    .map(|&i| {
                        let name = layout.schema.field(i).name();
                        batch.schema().index_of(name).map_err(|_| {
                            ClientError::Invalid(format!("the batch has no key column {name:?}"))
                        })
                    })
                    .collect()
            };
            (
                batch.clone(),
                by_name(&layout.bucket_key)?,
                by_name(&layout.partition_key)?,
            )
        } else {
            (
                mink_log::codec::check_batch(&layout.schema, batch).map_err(invalid)?,
                layout.bucket_key.clone(),
                layout.partition_key.clone(),
            )
        };
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let by_partition: Vec<(Option<String>, RecordBatch)> = if partition_key.is_empty() {
            vec![(None, batch)]
        } else {
            split_by_partition(&batch, &partition_key)
                .map_err(invalid)?
                .into_iter()
                .map(|(p, b)| (Some(p), b))
                .collect()
        };
        let mut parts = Vec::new();
        for (partition, batch) in by_partition {
            if bucket_key.is_empty() {
                self.sticky = self.sticky.wrapping_add(1) % layout.bucket_count;
                parts.push((partition, self.sticky, batch));
            } else {
                for (b, part) in
                    split_by_bucket(&batch, &bucket_key, layout.bucket_count).map_err(invalid)?
                {
                    parts.push((partition.clone(), b, part));
                }
            }
        }
        Ok(parts
            .into_iter()
            .map(|(partition, bucket, batch)| {
                let key = (partition, bucket);
                let sequence = self.idempotent.then(|| {
                    let s = self.sequences.get(&key).copied().unwrap_or(0);
                    (s, s)
                });
                Part {
                    key,
                    batch,
                    sequence,
                }
            })
            .collect())
    }

    /// Sends every part to its leader (one `DoPut` per leader, concurrently); a result per
    /// part, in order.
    async fn send(
        &self,
        parts: &[Part],
        deadline: tokio::time::Instant,
    ) -> Vec<ClientResult<BucketResult>> {
        let layout = self.layout.as_ref().expect("layout loaded");
        let mut by_address: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, p) in parts.iter().enumerate() {
            let address = layout
                .leaders
                .get(&p.key)
                .cloned()
                .unwrap_or_else(|| self.client.address());
            by_address.entry(address).or_default().push(i);
        }
        let sends = by_address.into_iter().map(|(address, indices)| async move {
            let group: Vec<&Part> = indices.iter().map(|&i| &parts[i]).collect();
            let results = match tokio::time::timeout_at(deadline, self.put(&address, &group)).await
            {
                Ok(r) => r,
                Err(_) => {
                    let e = self.timed_out("acknowledgement", &address);
                    group.iter().map(|_| Err(e.clone())).collect()
                }
            };
            indices.into_iter().zip(results).collect::<Vec<_>>()
        });
        let mut out: Vec<Option<ClientResult<BucketResult>>> = parts.iter().map(|_| None).collect();
        for (i, r) in futures::future::join_all(sends).await.into_iter().flatten() {
            out[i] = Some(r);
        }
        out.into_iter()
            .map(|r| r.expect("every part answered"))
            .collect()
    }

    /// One `DoPut` stream to `address` with the given parts.
    async fn put(&self, address: &str, parts: &[&Part]) -> Vec<ClientResult<BucketResult>> {
        let all = |e: ClientError| parts.iter().map(|_| Err(e.clone())).collect::<Vec<_>>();
        let mut flight = match self.client.channel(address).await {
            Ok(f) => f,
            Err(e) => return all(e),
        };
        let layout = self.layout.as_ref().expect("layout loaded");
        let descriptor = protocol::WriteDescriptor {
            database: self.database.clone(),
            table: self.table.clone(),
            writer_id: self.writer.map(|w| w.writer_id),
            writer_epoch: self.writer.map(|w| w.writer_epoch),
            ..Default::default()
        };
        let mut encoder = if layout.zstd {
            BatchEncoder::zstd()
        } else {
            BatchEncoder::new()
        };
        // The batch's own schema: a primary-key write may hold some columns and `_row_kind`.
        let schema = parts
            .first()
            .map_or_else(|| Arc::clone(&layout.schema), |p| p.batch.schema());
        let mut messages = vec![encoder.schema(
            &schema,
            Some(FlightDescriptor::new_cmd(protocol::to_json(&descriptor))),
        )];
        for p in parts {
            let meta = protocol::BatchMetadata {
                partition: p.key.0.clone(),
                bucket: Some(p.key.1),
                sequence: p.sequence.map(|(first, _)| first),
                last_sequence: p
                    .sequence
                    .and_then(|(first, last)| (last != first).then_some(last)),
            };
            match encoder.batch(&p.batch, protocol::to_json(&meta)) {
                Ok(m) => messages.extend(m),
                Err(e) => return all(ClientError::Invalid(e.to_string())),
            }
        }
        let response = match flight
            .do_put(self.client.request(futures::stream::iter(messages)))
            .await
        {
            Ok(r) => r,
            Err(s) => return all(self.client.status_error(address, &s)),
        };
        self.client.observe(response.metadata());
        let mut stream = response.into_inner();
        let mut results: Vec<Option<ClientResult<BucketResult>>> =
            parts.iter().map(|_| None).collect();
        let mut ended_with = None;
        loop {
            match stream.message().await {
                Ok(Some(put)) => {
                    let ack: protocol::PutAck =
                        match protocol::parse("PutResult", &put.app_metadata) {
                            Ok(a) => a,
                            Err(e) => {
                                ended_with = Some(ClientError::Protocol(e.0));
                                break;
                            }
                        };
                    self.client.observe_index(ack.applied_index);
                    let Some(slot) = usize::try_from(ack.batch)
                        .ok()
                        .and_then(|i| results.get_mut(i))
                    else {
                        ended_with = Some(ClientError::Protocol(format!(
                            "an answer for batch {} never sent",
                            ack.batch
                        )));
                        break;
                    };
                    *slot = Some(match ack.buckets.into_iter().next() {
                        Some(r) => match &r.error {
                            None => Ok(r),
                            Some(e) => Err(ClientError::Server {
                                code: e.code,
                                message: e.message.clone(),
                                leader: e.leader_node_id.zip(e.leader_address.clone()),
                            }),
                        },
                        None => Err(ClientError::Protocol("an answer without a bucket".into())),
                    });
                }
                Ok(None) => break,
                Err(s) => {
                    ended_with = Some(self.client.status_error(address, &s));
                    break;
                }
            }
        }
        // Parts without an answer: their outcome is unknown (retried if idempotent).
        let unanswered = ended_with.unwrap_or_else(|| ClientError::Transport {
            address: address.to_string(),
            message: "the stream ended before every batch was answered".into(),
        });
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(unanswered.clone())))
            .collect()
    }
}

/// Where a keyless writer starts, so that many writers spread over the buckets.
fn rand_start() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id()
}
