//! `DoGet`: a ticket decoded into a node read or lookup, the answer encoded as Flight data.

use std::time::{Duration, Instant};

use arrow_flight::FlightData;
use arrow_flight::flight_service_server::FlightService;
use futures::StreamExt as _;
use mink_node::{ReadData, ReadItem, ReadOptions, ReadRequest, ReadSource, ReadStart, ReadStop};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use super::{MinkFlight, count_out, fail};
use crate::encode::BatchEncoder;
use crate::protocol;

type DoGetStream = <MinkFlight as FlightService>::DoGetStream;

impl MinkFlight {
    pub(super) async fn get(
        &self,
        request: Request<arrow_flight::Ticket>,
        started: Instant,
    ) -> Result<Response<DoGetStream>, Status> {
        self.catch_up(request.metadata()).await?;
        let t: protocol::Ticket =
            protocol::parse("ticket", &request.get_ref().ticket).map_err(|e| self.invalid(e.0))?;
        let local_only = request.metadata().get(protocol::FORWARDED_HEADER).is_some();
        let span = tracing::info_span!(
            "flight.do_get",
            database = %t.database,
            table = %t.table,
            bucket = ?t.bucket,
            tail = t.tail
        );
        let keys = match (t.lookup.as_ref(), t.prefix_lookup.as_ref()) {
            (Some(_), Some(_)) => {
                return Err(self.invalid("give lookup or prefix_lookup, not both"));
            }
            (Some(k), None) => Some((k, false)),
            (None, Some(k)) => Some((k, true)),
            (None, None) => None,
        };
        if let Some((keys, prefix)) = keys {
            if let Some(field) = read_only_field(&t) {
                return Err(self.invalid(format!(
                    "{field} does not apply to a lookup (it reads the keys' current rows, with `columns`)"
                )));
            }
            return self
                .lookup(&t, keys, prefix, local_only, started)
                .instrument(span)
                .await;
        }
        let plan = self
            .node
            .plan_read(&read_request(&t).map_err(|m| self.invalid(m))?)
            .map_err(|e| self.error(e))?;
        let schema = plan.schema.clone();
        let reads = self.node.read_stream(
            plan,
            ReadOptions {
                step_bytes: self.config.read_bytes,
                stored: true,
                local_only,
            },
        );
        let (tx, rx) = mpsc::channel(8);
        let this = self.clone();
        let sender = tx.clone();
        let work = async move {
            let tx = sender;
            let mut encoder = BatchEncoder::new();
            if tx.send(Ok(encoder.schema(&schema, None))).await.is_err() {
                return tonic::Code::Cancelled;
            }
            let mut reads = reads;
            while let Some(item) = reads.next().await {
                let item = match item {
                    Ok(i) => i,
                    Err(e) => return fail(&tx, this.error(e)).await,
                };
                let data = match this.encode(&mut encoder, item) {
                    Ok(d) => d,
                    Err(status) => return fail(&tx, status).await,
                };
                for d in data {
                    if tx.send(Ok(d)).await.is_err() {
                        return tonic::Code::Cancelled;
                    }
                }
            }
            tonic::Code::Ok
        };
        // Never let a cut-short read look like a complete one.
        self.spawn_call(
            "do_get",
            started,
            span,
            tx,
            work,
            "the read failed inside the node (a bug)",
        );
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(self.respond(Box::pin(stream) as DoGetStream))
    }

    /// One read batch as Flight messages, its position in `app_metadata`.
    fn encode(
        &self,
        encoder: &mut BatchEncoder,
        item: ReadItem,
    ) -> Result<Vec<FlightData>, Status> {
        let meta = protocol::to_json(&protocol::ReadMetadata {
            partition: item.bucket.partition.clone(),
            bucket: item.bucket.bucket,
            offset: item.offset,
        });
        let rows = usize::try_from(item.data.rows()).unwrap_or(usize::MAX);
        let data = match item.data {
            // A stored batch sent as it is stored.
            ReadData::Stored { header, body, .. } => vec![FlightData {
                data_header: header,
                data_body: body,
                app_metadata: meta,
                ..Default::default()
            }],
            ReadData::Rows(batch) => encoder
                .batch(&batch, meta)
                .map_err(|e| self.status(protocol::ErrorCode::Failed, e.to_string()))?,
        };
        count_out(&data, rows);
        Ok(data)
    }

    /// A lookup (or prefix lookup) of JSON keys, answered in one batch.
    async fn lookup(
        &self,
        t: &protocol::Ticket,
        keys: &[crate::keyed::Key],
        prefix: bool,
        local_only: bool,
        started: Instant,
    ) -> Result<Response<DoGetStream>, Status> {
        let info = self
            .node
            .describe_table(&t.database, &t.table)
            .map_err(|e| self.error(e))?;
        if info.primary_key.is_empty() {
            return Err(self.invalid(format!(
                "{}.{} is a log table: lookup and prefix_lookup read primary-key tables",
                t.database, t.table
            )));
        }
        if prefix {
            info.check_prefix_lookup().map_err(|e| self.error(e))?;
        }
        let ids = crate::keyed::key_columns(
            &info.primary_key,
            &info.partition_keys,
            &info.bucket_key,
            prefix,
        );
        let typed =
            crate::keyed::typed_keys(&info.schema, &ids, keys).map_err(|m| self.invalid(m))?;
        let found = self
            .node
            .lookup_rows(
                &t.database,
                &t.table,
                &typed,
                prefix,
                &t.columns,
                local_only,
            )
            .await
            .map_err(|e| self.error(e))?;
        let mut encoder = BatchEncoder::new();
        let mut messages = vec![Ok(encoder.schema(&found.schema(), None))];
        if found.num_rows() > 0 {
            let data = encoder
                .batch(&found, bytes::Bytes::new())
                .map_err(|e| self.status(protocol::ErrorCode::Failed, e.to_string()))?;
            count_out(&data, found.num_rows());
            messages.extend(data.into_iter().map(Ok));
        }
        crate::metrics::finished("do_get", tonic::Code::Ok, started);
        Ok(self.respond(Box::pin(futures::stream::iter(messages)) as DoGetStream))
    }
}

/// The first field of `t` that only a read of buckets takes, if `t` sets one.
fn read_only_field(t: &protocol::Ticket) -> Option<&'static str> {
    [
        ("partition", t.partition.is_some()),
        ("bucket", t.bucket.is_some()),
        ("offset", t.offset.is_some()),
        ("latest", t.latest),
        ("end_offset", t.end_offset.is_some()),
        ("tail", t.tail),
        ("tail_idle_ms", t.tail_idle_ms.is_some()),
        ("max_rows", t.max_rows.is_some()),
        ("changelog", t.changelog),
        ("source", t.source.is_some()),
        ("filter", !t.filter.is_empty()),
    ]
    .into_iter()
    .find_map(|(name, set)| set.then_some(name))
}

/// A ticket in the node's terms.
fn read_request(t: &protocol::Ticket) -> Result<ReadRequest, String> {
    let start = match (t.offset, t.latest) {
        (Some(_), true) => return Err("give offset or latest, not both".into()),
        (Some(o), false) => ReadStart::Offset(o),
        (None, true) => ReadStart::Latest,
        (None, false) => ReadStart::Earliest,
    };
    let stop = match (t.tail, t.end_offset) {
        (true, Some(_)) => return Err("a tail has no end_offset".into()),
        (true, None) => ReadStop::Tail {
            idle: t.tail_idle_ms.map(Duration::from_millis),
        },
        (false, Some(e)) => ReadStop::Before(e),
        (false, None) => ReadStop::HighWatermark,
    };
    let source = match t.source.as_deref() {
        None => ReadSource::Auto,
        Some("union") => ReadSource::Union,
        Some("lake") => ReadSource::Lake,
        Some("log") => ReadSource::Log,
        Some(other) => {
            return Err(format!("source {other:?}: expected union, lake or log"));
        }
    };
    Ok(ReadRequest {
        database: t.database.clone(),
        table: t.table.clone(),
        partition: t.partition.clone(),
        bucket: t.bucket,
        start,
        stop,
        columns: t.columns.clone(),
        max_rows: t.max_rows,
        changelog: t.changelog,
        source,
        filter: t.filter.clone(),
    })
}
