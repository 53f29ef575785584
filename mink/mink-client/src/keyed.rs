//! Lookups and prefix lookups of primary-key tables, routed on the client: each key goes to
//! the leader of its bucket (the working copies live there), and the answers are put back in
//! the order of the keys.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::RecordBatch;
use mink_flight::keyed::{Key, KeyMatcher, key_buckets, key_columns, typed_keys};
use mink_flight::protocol::Ticket;

use crate::{Client, ClientError, ClientResult};

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
        let schema = Arc::new(d.arrow_schema().map_err(|e| ClientError::Protocol(e.0))?);
        if d.primary_key.is_empty() {
            return Err(invalid(format!(
                "{database}.{table} is a log table: lookups need a primary key"
            )));
        }
        if keys.is_empty() {
            return mink_log::codec::project(&RecordBatch::new_empty(schema), columns)
                .map_err(invalid);
        }
        let ticket = |keys: Vec<Key>, columns: Vec<String>| Ticket {
            database: database.to_string(),
            table: table.to_string(),
            lookup: (!prefix).then(|| keys.clone()),
            prefix_lookup: prefix.then(|| keys.clone()),
            columns,
            ..Default::default()
        };
        let ids = key_columns(&d, prefix);
        let typed = typed_keys(&schema, &ids, &keys).map_err(invalid)?;
        let leader: HashMap<(Option<String>, u32), &str> = d
            .buckets
            .iter()
            .filter(|b| !b.leader_address.is_empty())
            .map(|b| ((b.partition.clone(), b.bucket), b.leader_address.as_str()))
            .collect();
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, b) in key_buckets(&d, &typed, &ids)
            .map_err(invalid)?
            .into_iter()
            .enumerate()
        {
            let address = leader.get(&b).map_or(self.address(), |a| a);
            groups.entry(address.to_string()).or_default().push(i);
        }
        if groups.len() == 1 {
            let address = groups.into_keys().next().unwrap_or_default();
            return self
                .get_rows_at(&address, ticket(keys, columns.to_vec()))
                .await;
        }
        // Several leaders: ask each distinct key once for whole rows, put them back in the
        // keys' order, project at the end.
        let matcher = KeyMatcher::new(&schema, &ids, &typed).map_err(invalid)?;
        let first = matcher.first_occurrences();
        let answers = futures::future::try_join_all(groups.iter().map(|(address, rows)| {
            let asked: Vec<Key> = rows
                .iter()
                .filter(|&&i| first[i])
                .map(|&i| keys[i].clone())
                .collect();
            self.get_rows_at(address, ticket(asked, Vec::new()))
        }))
        .await?;
        let rows = matcher.in_key_order(schema, &answers).map_err(invalid)?;
        mink_log::codec::project(&rows, columns).map_err(invalid)
    }
}
