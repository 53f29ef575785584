//! The connector's state tables in Mink (`mink_connect.<name>_state` for sources,
//! `mink_connect.<name>_sink` for sinks): small primary-key tables the connector upserts its
//! positions into and reads back after a restart.

use arrow::datatypes::Schema;
use mink_client::Client;

/// Creates `database.table` (and its database) with `schema` and `primary_key` when missing.
pub(crate) async fn create(
    client: &Client,
    (database, table): (String, String),
    schema: &Schema,
    primary_key: &[&str],
    comment: &str,
) -> anyhow::Result<()> {
    client.create_database(&database, true).await?;
    let spec = mink_flight::protocol::CreateTable {
        database,
        table,
        schema: mink_flight::protocol::encode_schema(schema).map_err(|e| anyhow::anyhow!(e.0))?,
        options: Default::default(),
        partition_keys: vec![],
        primary_key: primary_key.iter().map(|c| (*c).to_string()).collect(),
        comment: comment.into(),
        if_not_exists: true,
    };
    client.create_table_with(&spec).await?;
    Ok(())
}
