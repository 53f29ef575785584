//! Reads of primary-key tables forwarded to bucket leaders: lookups and snapshot scans live
//! with each bucket's leader (its working copy), so a node asked for keys or buckets led
//! elsewhere asks those leaders (once: a forwarded request is never forwarded again) and
//! answers as if it held them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{RecordBatch, UInt32Array};
use arrow_flight::FlightData;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use futures::{StreamExt as _, TryStreamExt as _};
use mink_node::TableInfo;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use crate::encode::BatchEncoder;
use crate::keyed::{self, Key, KeyMatcher};
use crate::protocol::{self, FORWARDED_HEADER, Ticket};
use crate::server::MinkFlight;

/// Where a bucket is served from.
pub(crate) enum Place {
    Here,
    Leader(String),
}

impl MinkFlight {
    /// Where a read of `(partition, bucket)` is served: here, or (unless the request was
    /// itself forwarded) at the leader's address.
    pub(crate) fn place(
        &self,
        info: &TableInfo,
        partition: Option<&String>,
        bucket: u32,
        forwarded: bool,
    ) -> Place {
        let me = self.node.node_id();
        info.buckets
            .iter()
            .find(|b| b.bucket == bucket && b.partition.as_ref() == partition)
            .filter(|b| {
                !forwarded
                    && b.leader_node_id != 0
                    && b.leader_node_id != me
                    && !b.leader_address.is_empty()
            })
            .map_or(Place::Here, |b| Place::Leader(b.leader_address.clone()))
    }

    /// The rows of `keys` (or every row under each prefix), in the keys' order, from this node
    /// and the leaders of the buckets it does not lead.
    pub(crate) async fn lookup_rows(
        &self,
        t: &Ticket,
        info: &TableInfo,
        keys: &[Key],
        prefix: bool,
        forwarded: bool,
    ) -> Result<RecordBatch, Status> {
        if keys.is_empty() {
            return Ok(RecordBatch::new_empty(Arc::clone(&info.schema)));
        }
        let d = crate::server::describe(info).map_err(|e| self.invalid(e.0))?;
        let ids = keyed::key_columns(&d, prefix);
        let typed = keyed::typed_keys(&info.schema, &ids, keys).map_err(|e| self.invalid(e))?;
        let mut here = Vec::new();
        let mut there: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, (p, b)) in keyed::key_buckets(&d, &typed, &ids)
            .map_err(|e| self.invalid(e))?
            .into_iter()
            .enumerate()
        {
            match self.place(info, p.as_ref(), b, forwarded) {
                Place::Here => here.push(i),
                Place::Leader(a) => there.entry(a).or_default().push(i),
            }
        }
        let ask_here = |rows: Vec<usize>| {
            let typed = &typed;
            async move {
                let indices = UInt32Array::from_iter_values(
                    rows.iter().map(|&r| u32::try_from(r).unwrap_or(u32::MAX)),
                );
                let subset = arrow::compute::take_record_batch(typed, &indices)
                    .map_err(|e| self.invalid(e.to_string()))?;
                if prefix {
                    self.node
                        .prefix_lookup(&t.database, &t.table, &subset)
                        .await
                } else {
                    self.node.lookup(&t.database, &t.table, &subset).await
                }
                .map_err(|e| self.error(e))
            }
        };
        if there.is_empty() {
            return ask_here(here).await;
        }
        let matcher = KeyMatcher::new(&info.schema, &ids, &typed).map_err(|e| self.invalid(e))?;
        let first = matcher.first_occurrences();
        let mut answers = Vec::new();
        let here: Vec<usize> = here.into_iter().filter(|&i| first[i]).collect();
        if !here.is_empty() {
            answers.push(ask_here(here).await?);
        }
        for (address, rows) in there {
            let asked: Vec<Key> = rows
                .iter()
                .filter(|&&i| first[i])
                .map(|&i| keys[i].clone())
                .collect();
            let ticket = Ticket {
                database: t.database.clone(),
                table: t.table.clone(),
                lookup: (!prefix).then(|| asked.clone()),
                prefix_lookup: prefix.then_some(asked),
                ..Default::default()
            };
            let batches: Vec<(RecordBatch, bytes::Bytes)> = self
                .forwarded(&address, &ticket)
                .await?
                .try_collect()
                .await?;
            let schema = Arc::clone(&info.schema);
            answers.push(
                arrow::compute::concat_batches(&schema, batches.iter().map(|(b, _)| b))
                    .map_err(|e| self.invalid(e.to_string()))?,
            );
        }
        matcher
            .in_key_order(Arc::clone(&info.schema), &answers)
            .map_err(|e| self.invalid(e))
    }

    /// A `DoGet` of `ticket` at a leader, marked forwarded: its batches with their
    /// `app_metadata`.
    pub(crate) async fn forwarded(
        &self,
        address: &str,
        ticket: &Ticket,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<(RecordBatch, bytes::Bytes), Status>>,
        Status,
    > {
        let mut client = FlightServiceClient::new(self.peer(address)?)
            .max_decoding_message_size(self.config.max_message_bytes);
        let mut request = Request::new(arrow_flight::Ticket::new(protocol::to_json(ticket)));
        self.forwarding(request.metadata_mut());
        request.set_timeout(FORWARD_TIMEOUT);
        let response = client.do_get(request).await?;
        let decoder = FlightDataDecoder::new(
            response
                .into_inner()
                .map_err(|s| FlightError::Tonic(Box::new(s))),
        );
        Ok(decoder
            .filter_map(|item| async move {
                match item {
                    Ok(d) => {
                        let meta = d.app_metadata();
                        match d.payload {
                            DecodedPayload::RecordBatch(b) => Some(Ok((b, meta))),
                            _ => None,
                        }
                    }
                    Err(FlightError::Tonic(s)) => Some(Err(*s)),
                    Err(e) => Some(Err(Status::internal(format!("forwarded read: {e}")))),
                }
            })
            .boxed())
    }

    /// A channel to another node (connected on first use, kept).
    fn peer(&self, address: &str) -> Result<Channel, Status> {
        let mut peers = self.peers.lock().expect("peers lock");
        if let Some(c) = peers.get(address) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| Status::internal(format!("leader address {address:?}: {e}")))?
            .connect_timeout(std::time::Duration::from_secs(5))
            .initial_stream_window_size(crate::STREAM_WINDOW)
            .initial_connection_window_size(crate::CONNECTION_WINDOW);
        let channel = endpoint.connect_lazy();
        peers.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// Sends the batches of a forwarded snapshot read of one bucket into `tx`, re-encoded in
    /// this response's stream. Returns rows sent, or the code that ended it.
    pub(crate) async fn relay(
        &self,
        address: &str,
        ticket: &Ticket,
        encoder: &mut BatchEncoder,
        tx: &tokio::sync::mpsc::Sender<Result<FlightData, Status>>,
    ) -> Result<u64, tonic::Code> {
        let mut stream = match self.forwarded(address, ticket).await {
            Ok(s) => s,
            Err(s) => return Err(crate::server::fail(tx, s).await),
        };
        let mut rows = 0;
        while let Some(item) = stream.next().await {
            let (batch, meta) = match item {
                Ok(b) => b,
                Err(s) => return Err(crate::server::fail(tx, s).await),
            };
            let data = match encoder.batch(&batch, meta) {
                Ok(d) => d,
                Err(e) => {
                    return Err(crate::server::fail(tx, Status::internal(e.to_string())).await);
                }
            };
            rows += batch.num_rows() as u64;
            for d in data {
                if tx.send(Ok(d)).await.is_err() {
                    return Err(tonic::Code::Cancelled);
                }
            }
        }
        Ok(rows)
    }
}

impl MinkFlight {
    /// Writes the rows of one bucket of a routed write at its leader (a `DoPut` naming the
    /// bucket, so it is never forwarded again) and returns the leader's result for them. If
    /// the leader cannot be reached, the original `NOT_LEADER` result stands.
    pub(crate) async fn forward_put(
        &self,
        database: &str,
        table: &str,
        w: &mink_node::BucketWrite,
        rows: &RecordBatch,
        address: &str,
    ) -> protocol::BucketResult {
        let fallback = crate::server::bucket_result(w);
        let descriptor = protocol::WriteDescriptor {
            database: database.to_string(),
            table: table.to_string(),
            partition: w.partition.clone(),
            bucket: Some(w.bucket),
            ..Default::default()
        };
        let mut encoder = BatchEncoder::new();
        let mut messages = vec![encoder.schema(
            &rows.schema(),
            Some(arrow_flight::FlightDescriptor::new_cmd(protocol::to_json(
                &descriptor,
            ))),
        )];
        match encoder.batch(rows, bytes::Bytes::new()) {
            Ok(m) => messages.extend(m),
            Err(_) => return fallback,
        }
        let Ok(channel) = self.peer(address) else {
            return fallback;
        };
        let mut client = FlightServiceClient::new(channel)
            .max_encoding_message_size(self.config.max_message_bytes)
            .max_decoding_message_size(self.config.max_message_bytes);
        let mut request = Request::new(futures::stream::iter(messages));
        self.forwarding(request.metadata_mut());
        request.set_timeout(FORWARD_TIMEOUT);
        let ack = async {
            let mut results = client.do_put(request).await?.into_inner();
            let first = results.message().await?.ok_or_else(|| {
                Status::unavailable("the leader closed the write without an answer")
            })?;
            protocol::parse::<protocol::PutAck>("forwarded PutResult", &first.app_metadata)
                .map_err(|e| Status::internal(e.0))
        }
        .await;
        let failed = |code: protocol::ErrorCode, message: String| protocol::BucketResult {
            base_offset: None,
            end_offset: None,
            duplicate: false,
            error: Some(protocol::ErrorBody {
                code,
                message,
                leader_node_id: None,
                leader_address: None,
            }),
            ..fallback.clone()
        };
        match ack {
            Ok(a) => match a.buckets.into_iter().next() {
                Some(mut r) => {
                    r.rows = w.rows as u64;
                    r
                }
                None => failed(
                    protocol::ErrorCode::Unavailable,
                    "the leader answered without a result: the write's outcome is unknown".into(),
                ),
            },
            // The leader refused the rows themselves: its answer stands for them.
            Err(s) if s.code() == tonic::Code::InvalidArgument => {
                failed(protocol::ErrorCode::Invalid, s.message().to_string())
            }
            // Sent, then cut short: the rows may or may not be stored. Never "retry at the
            // leader", which a client without a writer id takes as "not stored".
            Err(s) => failed(
                protocol::ErrorCode::Unavailable,
                format!(
                    "forwarding to the bucket's leader at {address} failed ({}): the write's \
                     outcome is unknown",
                    s.message()
                ),
            ),
        }
    }

    /// Marks a request as forwarded and carries this node's metadata position, so the leader
    /// answers with what this node has seen (a new schema, a new partition).
    fn forwarding(&self, metadata: &mut tonic::metadata::MetadataMap) {
        metadata.insert(
            FORWARDED_HEADER,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        if let Ok(v) = self.node.view().applied_index.to_string().parse() {
            metadata.insert(protocol::MIN_APPLIED_INDEX_HEADER, v);
        }
    }
}

/// Longest a forwarded read or write may take.
const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Keeps the map type in one place.
pub(crate) type Peers = std::sync::Mutex<HashMap<String, Channel>>;
