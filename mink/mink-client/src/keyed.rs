//! Lookups and prefix lookups of primary-key tables, routed on the client: each key goes to
//! the leader of its bucket (the working copies live there), and the answers are put back in
//! the order of the keys.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{Field, Schema};
use arrow::row::{RowConverter, SortField};
use mink_flight::protocol::{TableDescription, Ticket};
use mink_log::routing::{buckets_of, partitions_of};
use serde_json::{Map, Value};

use crate::{Client, ClientError, ClientResult};

type Key = Map<String, Value>;

fn invalid(e: impl std::fmt::Display) -> ClientError {
    ClientError::Invalid(e.to_string())
}

impl Client {
    /// Keys (or prefixes) routed to their buckets' leaders; rows back in the keys' order.
    pub(crate) async fn keyed_get(
        &self,
        database: &str,
        table: &str,
        keys: Vec<Key>,
        columns: &[String],
        prefix: bool,
    ) -> ClientResult<RecordBatch> {
        let d = self.describe_table(database, table).await?;
        let schema = d.arrow_schema().map_err(|e| ClientError::Protocol(e.0))?;
        if d.primary_key.is_empty() {
            return Err(invalid(format!(
                "{database}.{table} is a log table: lookups need a primary key"
            )));
        }
        let ticket = |keys: Vec<Key>, columns: Vec<String>| Ticket {
            database: database.to_string(),
            table: table.to_string(),
            lookup: (!prefix).then(|| keys.clone()),
            prefix_lookup: prefix.then(|| keys.clone()),
            columns,
            ..Default::default()
        };
        // The columns that identify a key (or a prefix), typed by the table.
        let ids: Vec<String> = if prefix {
            d.partition_keys
                .iter()
                .chain(&d.bucket_key)
                .cloned()
                .collect()
        } else {
            d.primary_key.clone()
        };
        if keys.is_empty() {
            return mink_log::codec::project(&RecordBatch::new_empty(Arc::new(schema)), columns)
                .map_err(invalid);
        }
        let typed = typed_keys(&schema, &ids, &keys)?;
        let addresses = leaders(self.address(), &d, &typed, &ids)?;
        let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, a) in addresses.iter().enumerate() {
            groups.entry(a.as_str()).or_default().push(i);
        }
        if groups.len() <= 1 {
            let address = groups
                .keys()
                .next()
                .map_or_else(|| self.address().to_string(), |a| (*a).to_string());
            return self
                .get_rows_at(&address, ticket(keys, columns.to_vec()))
                .await;
        }
        // Several leaders: ask each for whole rows, match them to the keys, project at the end.
        let converter = RowConverter::new(
            ids.iter()
                .map(|c| {
                    schema
                        .field_with_name(c)
                        .map(|f| SortField::new(f.data_type().clone()))
                        .map_err(invalid)
                })
                .collect::<ClientResult<_>>()?,
        )
        .map_err(invalid)?;
        let wanted = converter
            .convert_columns(typed.columns())
            .map_err(invalid)?;
        // Each distinct key is asked once; every occurrence gets its rows below.
        let mut seen = std::collections::HashSet::new();
        let answers = futures::future::try_join_all(groups.iter().map(|(address, rows)| {
            let keys: Vec<Key> = rows
                .iter()
                .filter(|&&i| seen.insert(wanted.row(i).as_ref().to_vec()))
                .map(|&i| keys[i].clone())
                .collect();
            self.get_rows_at(address, ticket(keys, Vec::new()))
        }))
        .await?;
        let mut by_id: HashMap<Vec<u8>, Vec<(usize, usize)>> = HashMap::new();
        for (a, batch) in answers.iter().enumerate() {
            let id_columns: Vec<ArrayRef> = ids
                .iter()
                .map(|c| {
                    batch.column_by_name(c).cloned().ok_or_else(|| {
                        ClientError::Protocol(format!("no column {c:?} in the answer"))
                    })
                })
                .collect::<ClientResult<_>>()?;
            let found = converter.convert_columns(&id_columns).map_err(invalid)?;
            for r in 0..batch.num_rows() {
                by_id
                    .entry(found.row(r).as_ref().to_vec())
                    .or_default()
                    .push((a, r));
            }
        }
        let mut order = Vec::new();
        for i in 0..typed.num_rows() {
            if let Some(rows) = by_id.get(wanted.row(i).as_ref()) {
                order.extend(rows.iter().copied());
            }
        }
        let out = if order.is_empty() {
            RecordBatch::new_empty(Arc::new(schema))
        } else {
            let refs: Vec<&RecordBatch> = answers.iter().collect();
            arrow::compute::interleave_record_batch(&refs, &order).map_err(invalid)?
        };
        mink_log::codec::project(&out, columns).map_err(invalid)
    }
}

/// The keys as a batch of the identifying columns, cast to the table's types.
fn typed_keys(schema: &Schema, ids: &[String], keys: &[Key]) -> ClientResult<RecordBatch> {
    let fields: Vec<Field> = ids
        .iter()
        .map(|c| {
            schema
                .field_with_name(c)
                .map(|f| f.as_ref().clone().with_nullable(true))
                .map_err(|_| invalid(format!("key column {c:?} is not in the table")))
        })
        .collect::<ClientResult<_>>()?;
    for (i, k) in keys.iter().enumerate() {
        if let Some(c) = ids.iter().find(|c| k.get(*c).is_none_or(Value::is_null)) {
            return Err(invalid(format!("key {i} has no value for {c:?}")));
        }
    }
    let key_schema = Arc::new(Schema::new(fields));
    let mut decoder = arrow::json::ReaderBuilder::new(Arc::clone(&key_schema))
        .build_decoder()
        .map_err(invalid)?;
    decoder
        .serialize(keys)
        .map_err(|e| invalid(format!("keys: {e}")))?;
    Ok(decoder
        .flush()
        .map_err(|e| invalid(format!("keys: {e}")))?
        .unwrap_or_else(|| RecordBatch::new_empty(key_schema)))
}

/// The leader's address of each key's bucket (the connected node where unknown).
fn leaders(
    connected: &str,
    d: &TableDescription,
    keys: &RecordBatch,
    ids: &[String],
) -> ClientResult<Vec<String>> {
    let at = |names: &[String]| -> Vec<usize> {
        names
            .iter()
            .filter_map(|n| ids.iter().position(|c| c == n))
            .collect()
    };
    let partitions = if d.partition_keys.is_empty() {
        vec![String::new(); keys.num_rows()]
    } else {
        partitions_of(keys, &at(&d.partition_keys)).map_err(invalid)?
    };
    let buckets = buckets_of(keys, &at(&d.bucket_key), d.bucket_count.max(1)).map_err(invalid)?;
    let leader: HashMap<(Option<String>, u32), &str> = d
        .buckets
        .iter()
        .filter(|b| !b.leader_address.is_empty())
        .map(|b| ((b.partition.clone(), b.bucket), b.leader_address.as_str()))
        .collect();
    Ok(partitions
        .into_iter()
        .zip(buckets)
        .map(|(p, b)| {
            let p = (!d.partition_keys.is_empty()).then_some(p);
            leader
                .get(&(p, b))
                .map_or_else(|| connected.to_string(), |a| (*a).to_string())
        })
        .collect())
}
