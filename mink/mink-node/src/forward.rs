//! Requests for buckets led by other nodes: the node decides what goes where; a
//! [`Forwarder`] carries it over the wire.
//!
//! Lookups and snapshot scans read a primary-key bucket's working copy, which lives with the
//! bucket's leader; routed writes of rows whose bucket another node leads are written there.
//! One hop only: a forwarded request is served from what the receiving node leads.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};
use futures::stream::BoxStream;
use mink_log::routing::{buckets_of, partitions_of};

use crate::{AppendAck, BucketRef, Node, NodeError, NodeResult};

/// How a node reaches other nodes for the buckets they lead. The frontend that owns the wire
/// implements it (`mink-flight` does, over Arrow Flight) and gives it to the node
/// ([`Node::set_forwarder`]).
///
/// Contract, for every call: the request is marked forwarded, so the receiving node serves it
/// from what it leads and never forwards it again; it carries `applied_index`, this node's
/// metadata position, and the leader waits until it has applied as much (it answers with at
/// least what this node has seen: a new schema, a new partition); it is bounded by a deadline,
/// so one slow leader cannot hold a request forever. Errors are the leader's, structured
/// ([`NodeError`]); a call cut short after it was sent is `Unavailable` (its outcome unknown).
#[async_trait::async_trait]
pub trait Forwarder: Send + Sync + std::fmt::Debug {
    /// The rows of `keys` (the key columns, typed) at the leader at `address`: a point lookup,
    /// or with `prefix`, every row under each bucket-key prefix.
    async fn lookup(
        &self,
        address: &str,
        database: &str,
        table: &str,
        keys: &RecordBatch,
        prefix: bool,
        applied_index: u64,
    ) -> NodeResult<RecordBatch>;

    /// A snapshot scan of one bucket at its leader: batches of its current rows (`columns`;
    /// all when empty) that meet `filter`, each with the offset the scan is consistent at.
    #[allow(clippy::too_many_arguments)]
    async fn snapshot(
        &self,
        address: &str,
        bucket: &BucketRef,
        columns: &[String],
        filter: &crate::Filter,
        max_rows: Option<u64>,
        applied_index: u64,
    ) -> NodeResult<BoxStream<'static, NodeResult<(RecordBatch, u64)>>>;

    /// Writes `rows` (the table's columns; `_row_kind` for a primary-key table) to one
    /// bucket at its leader, as a write naming the bucket (never forwarded again). Returns
    /// the leader's acknowledgement and the metadata index it had applied when it answered
    /// (the commit of the rows included), which this node waits for before it answers: a
    /// read after the write, here or anywhere the client's index reaches, sees the rows.
    async fn write(
        &self,
        address: &str,
        bucket: &BucketRef,
        rows: &RecordBatch,
        applied_index: u64,
    ) -> NodeResult<(AppendAck, u64)>;
}

impl Node {
    /// Lets this node forward requests for buckets other nodes lead.
    pub fn set_forwarder(&self, forwarder: Arc<dyn Forwarder>) {
        *self.inner.forwarder.write().expect("forwarder lock") = Some(forwarder);
    }

    pub(crate) fn forwarder(&self) -> NodeResult<Arc<dyn Forwarder>> {
        self.inner
            .forwarder
            .read()
            .expect("forwarder lock")
            .clone()
            .ok_or_else(|| {
                NodeError::Unavailable(
                    "this node cannot reach other nodes (no forwarder); ask the bucket's leader"
                        .into(),
                )
            })
    }

    /// The rows of `keys` of a primary-key table, in the keys' order (a key asked twice gets
    /// its rows twice; missing keys are left out), with `columns` (all when empty). `keys`
    /// holds the primary-key columns by name, or with `prefix` the bucket-key columns (and
    /// the partition columns of a partitioned table): then every row under each prefix. Keys
    /// of buckets led elsewhere are asked of their leaders, each distinct key once, unless
    /// `local_only` (a forwarded request): then they fail with `NotLeader`.
    pub async fn lookup_rows(
        &self,
        database: &str,
        table: &str,
        keys: &RecordBatch,
        prefix: bool,
        columns: &[String],
        local_only: bool,
    ) -> NodeResult<RecordBatch> {
        let record = self.table_record(database, table)?;
        let def = self.kv_definition(&record)?;
        let schema = Arc::clone(&def.schema);
        let found = if keys.num_rows() == 0 {
            RecordBatch::new_empty(Arc::clone(&schema))
        } else {
            let wanted: Vec<usize> = if prefix {
                def.partition_keys
                    .iter()
                    .chain(&def.bucket_key)
                    .copied()
                    .collect()
            } else {
                def.primary_key.clone()
            };
            let what = if prefix { "bucket key" } else { "primary key" };
            let (keys, ids) = crate::kv::key_columns(&def, keys, &wanted, what)?;
            // Where each key lives.
            let at = |names: &[usize]| -> Vec<usize> {
                names
                    .iter()
                    .filter_map(|&i| ids.iter().position(|n| n == schema.field(i).name()))
                    .collect()
            };
            let partitions: Vec<Option<String>> = if def.partition_keys.is_empty() {
                vec![None; keys.num_rows()]
            } else {
                partitions_of(&keys, &at(&def.partition_keys))?
                    .into_iter()
                    .map(Some)
                    .collect()
            };
            let buckets = buckets_of(&keys, &at(&def.bucket_key), record.bucket_count)?;
            let view = self.view();
            let me = self.node_id();
            let mut remote: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for (row, (p, b)) in partitions.iter().zip(&buckets).enumerate() {
                let Ok(bucket) = self.bucket_record(&view, &record, p.as_deref(), *b) else {
                    continue; // no such partition: nothing to find
                };
                if local_only || bucket.leader_node_id == me || bucket.leader_node_id == 0 {
                    continue;
                }
                if let Some(n) = view.state.nodes.get(&bucket.leader_node_id) {
                    remote.entry(n.address.clone()).or_default().push(row);
                }
            }
            if remote.is_empty() {
                self.lookup_here(database, table, &keys, prefix).await?
            } else {
                let matcher = KeyMatcher::new(&schema, &ids, &keys)?;
                let first = matcher.first_occurrences();
                let elsewhere: HashSet<usize> = remote.values().flatten().copied().collect();
                let here: Vec<usize> = (0..keys.num_rows())
                    .filter(|i| first[*i] && !elsewhere.contains(i))
                    .collect();
                let mut answers = Vec::new();
                if !here.is_empty() {
                    answers.push(
                        self.lookup_here(database, table, &take(&keys, &here)?, prefix)
                            .await?,
                    );
                }
                let forwarder = self.forwarder()?;
                let applied = view.applied_index;
                for (address, rows) in remote {
                    let rows: Vec<usize> = rows.into_iter().filter(|i| first[*i]).collect();
                    answers.push(
                        forwarder
                            .lookup(
                                &address,
                                database,
                                table,
                                &take(&keys, &rows)?,
                                prefix,
                                applied,
                            )
                            .await?,
                    );
                }
                matcher.in_key_order(Arc::clone(&schema), &answers)?
            }
        };
        Ok(mink_log::codec::project(&found, columns)?)
    }

    async fn lookup_here(
        &self,
        database: &str,
        table: &str,
        keys: &RecordBatch,
        prefix: bool,
    ) -> NodeResult<RecordBatch> {
        if prefix {
            self.prefix_lookup(database, table, keys).await
        } else {
            self.lookup(database, table, keys).await
        }
    }
}

fn take(batch: &RecordBatch, rows: &[usize]) -> NodeResult<RecordBatch> {
    let indices =
        UInt32Array::from_iter_values(rows.iter().map(|&r| u32::try_from(r).unwrap_or(u32::MAX)));
    Ok(arrow::compute::take_record_batch(batch, &indices)?)
}

/// Matches rows to keys by their identifying columns.
#[derive(Debug)]
pub(crate) struct KeyMatcher {
    converter: RowConverter,
    ids: Vec<String>,
    wanted: Rows,
}

impl KeyMatcher {
    pub(crate) fn new(schema: &Schema, ids: &[String], keys: &RecordBatch) -> NodeResult<Self> {
        let converter = RowConverter::new(
            ids.iter()
                .map(|c| {
                    schema
                        .field_with_name(c)
                        .map(|f| SortField::new(f.data_type().clone()))
                })
                .collect::<Result<_, _>>()?,
        )?;
        let wanted = converter.convert_columns(keys.columns())?;
        Ok(KeyMatcher {
            converter,
            ids: ids.to_vec(),
            wanted,
        })
    }

    /// Whether key `i` is the first of its value (ask each distinct key once).
    pub(crate) fn first_occurrences(&self) -> Vec<bool> {
        let mut seen = HashSet::new();
        (0..self.wanted.num_rows())
            .map(|i| seen.insert(self.wanted.row(i).as_ref().to_vec()))
            .collect()
    }

    /// Rows answered for the keys (whole rows, in any grouping), in the order of the keys:
    /// each occurrence of a key gets its rows.
    pub(crate) fn in_key_order(
        &self,
        schema: SchemaRef,
        answers: &[RecordBatch],
    ) -> NodeResult<RecordBatch> {
        let mut by_id: HashMap<Vec<u8>, Vec<(usize, usize)>> = HashMap::new();
        for (a, batch) in answers.iter().enumerate() {
            let id_columns: Vec<ArrayRef> = self
                .ids
                .iter()
                .map(|c| {
                    batch.column_by_name(c).cloned().ok_or_else(|| {
                        NodeError::Failed(format!("no column {c:?} in a leader's answer"))
                    })
                })
                .collect::<NodeResult<_>>()?;
            let found = self.converter.convert_columns(&id_columns)?;
            for r in 0..batch.num_rows() {
                by_id
                    .entry(found.row(r).as_ref().to_vec())
                    .or_default()
                    .push((a, r));
            }
        }
        let mut order = Vec::new();
        for i in 0..self.wanted.num_rows() {
            if let Some(rows) = by_id.get(self.wanted.row(i).as_ref()) {
                order.extend(rows.iter().copied());
            }
        }
        if order.is_empty() {
            return Ok(RecordBatch::new_empty(schema));
        }
        let refs: Vec<&RecordBatch> = answers.iter().collect();
        Ok(arrow::compute::interleave_record_batch(&refs, &order)?)
    }
}
