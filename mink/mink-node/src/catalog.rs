//! Catalog operations, all through the command log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::{Schema, SchemaRef};
use mink_log::codec;
use mink_log::options::TableOptions;
use mink_metadata::{
    AlterTable, Command, CreateDatabase, CreatePartition, CreateTable, DropDatabase, DropPartition,
    DropTable, Outcome, RejectionKind, Reply, TableRecord,
};

use crate::{Node, NodeError, NodeResult};

/// What a client asks for when it creates a table: a log table, or a primary-key table when
/// `primary_key` names columns.
#[derive(Clone, Debug)]
pub struct TableSpec {
    pub database: String,
    pub name: String,
    pub schema: Schema,
    /// Columns of the primary key (it must include the partition keys); empty for a log table.
    pub primary_key: Vec<String>,
    /// Fluss's option names (`bucket.num`, `bucket.key`, `table.log.ttl`, ...).
    pub options: BTreeMap<String, String>,
    pub partition_keys: Vec<String>,
    pub comment: String,
    /// Succeed (and describe the existing table) if it already exists.
    pub if_not_exists: bool,
}

/// One bucket as a client sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketInfo {
    pub partition_id: u64,
    /// The partition's name (partitioned tables only).
    pub partition: Option<String>,
    pub bucket: u32,
    pub stream_id: u64,
    pub leader_node_id: u64,
    pub leader_address: String,
    pub leader_epoch: u64,
    pub start_offset: u64,
    /// The committed end: the next offset to be written.
    pub end_offset: u64,
    /// Lake-enabled tables: the offset tiering has reached (rows below it are in the lake's
    /// recorded snapshot); `None` before the first round or without a lake.
    pub tiered_offset: Option<u64>,
    /// The first offset a scan returns: `start_offset`, or 0 when the history below it is
    /// read from the lake.
    pub readable_offset: u64,
}

/// A table as a client sees it.
#[derive(Clone, Debug)]
pub struct TableInfo {
    pub table_id: u64,
    pub database: String,
    pub name: String,
    pub schema: SchemaRef,
    pub schema_version: u32,
    pub options: BTreeMap<String, String>,
    pub partition_keys: Vec<String>,
    pub bucket_count: u32,
    pub bucket_key: Vec<String>,
    /// Empty for a log table.
    pub primary_key: Vec<String>,
    pub comment: String,
    pub created_at_ms: u64,
    pub partitions: Vec<PartitionInfo>,
    pub buckets: Vec<BucketInfo>,
    /// Tables tiered into the lake: how far behind the log it is.
    pub lake: Option<LakeInfo>,
}

impl TableInfo {
    /// Whether a prefix lookup can be served: the bucket key is a proper prefix of the primary
    /// key without the partition keys (all rows of a prefix then live in one bucket, in key
    /// order), as the KV tablet requires. Checked before the keys, so a table that cannot is
    /// told so rather than that a key lacks a column.
    pub fn check_prefix_lookup(&self) -> NodeResult<()> {
        let physical: Vec<&String> = self
            .primary_key
            .iter()
            .filter(|c| !self.partition_keys.contains(c))
            .collect();
        let bucket: Vec<&String> = self.bucket_key.iter().collect();
        if bucket.len() < physical.len() && physical.starts_with(&bucket) {
            return Ok(());
        }
        Err(NodeError::Invalid(format!(
            "{}.{}: prefix lookups need a bucket key that is a proper prefix of the primary key \
             (without partition keys); its bucket key is {:?} and its primary key {:?}",
            self.database, self.name, self.bucket_key, self.primary_key
        )))
    }
}

/// The lake of a table, as the metadata records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LakeInfo {
    /// The Iceberg snapshot the last round recorded (`None` before the first).
    pub snapshot_id: Option<i64>,
    /// When that round was recorded.
    pub committed_at_ms: Option<u64>,
    /// How long the oldest untiered row has waited at most: since the last round (or the
    /// table's creation) while any bucket has rows past its tiered offset; 0 when none has.
    pub lag_ms: u64,
}

/// One partition of a partitioned table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition_id: u64,
    /// The partition-key values joined by `$` (see `mink_log::routing::partitions_of`).
    pub name: String,
    pub values: BTreeMap<String, String>,
    pub created_at_ms: u64,
}

/// A change to a table: options to set or reset, and optionally a grown schema.
#[derive(Clone, Debug, Default)]
pub struct TableChange {
    pub set_options: BTreeMap<String, String>,
    pub reset_options: Vec<String>,
    /// The whole new schema: the current one plus nullable columns at the end.
    pub schema: Option<Schema>,
}

/// Most partitions a table may have; a write that would create more is refused. Each
/// partition costs `bucket.num` streams, so this bounds what one bad write can create.
pub const MAX_PARTITIONS_PER_TABLE: usize = 1024;

/// Options that only mean something for primary-key tables.
/// Table options Mink acts on under the prefixes Apache Fluss reserves (`table.`, `bucket.`).
const KNOWN_OPTIONS: [&str; 19] = [
    mink_log::options::BUCKET_NUM,
    mink_log::options::BUCKET_KEY,
    mink_log::options::LOG_TTL,
    mink_log::options::LOG_FORMAT,
    mink_log::options::LOG_COMPRESSION,
    mink_log::options::DATALAKE_ENABLED,
    mink_log::options::DATALAKE_FORMAT,
    mink_log::options::DATALAKE_FRESHNESS,
    mink_log::options::DATALAKE_AUTO_COMPACTION,
    mink_log::options::DATALAKE_COMPACTION_MIN_FILES,
    mink_log::options::DATALAKE_COMPACTION_SMALL_FILE_SIZE,
    mink_log::options::DATALAKE_AUTO_EXPIRE_SNAPSHOT,
    mink_log::options::DATALAKE_SNAPSHOT_RETENTION,
    mink_log::options::DATALAKE_MAINTENANCE_INTERVAL,
    mink_kv::definition::MERGE_ENGINE,
    mink_kv::definition::VERSION_COLUMN,
    mink_kv::definition::DELETE_BEHAVIOR,
    mink_kv::definition::CHANGELOG_IMAGE,
    mink_kv::definition::AUTO_INCREMENT_CACHE,
];

/// Refuses options that would be accepted and ignored: Fluss options whose feature Mink does
/// not have yet, and unknown `table.` / `bucket.` options (a misspelling, or an option of
/// another system). Options outside those prefixes are the user's own properties, kept as
/// given; `fields.<column>.*` and `auto-increment.fields` are checked by the key definition.
/// Takes the names of a set's options and of a reset's.
fn check_options<'a>(keys: impl IntoIterator<Item = &'a String>) -> NodeResult<()> {
    for key in keys {
        let not_built = |feature: &str| {
            Err(NodeError::Invalid(format!(
                "option {key}: {feature} is not built yet (README.md, \"Planned\"), so Mink refuses the option rather than ignore it"
            )))
        };
        if key.starts_with("table.auto-partition.") {
            return not_built("automatic partition creation and expiry");
        } else if (key.starts_with("table.") || key.starts_with("bucket."))
            && !KNOWN_OPTIONS.contains(&key.as_str())
        {
            return Err(NodeError::Invalid(format!(
                "unknown option {key}: Mink's table options are {} (see docs/tables.md); options outside table. and bucket. are kept as your own properties",
                KNOWN_OPTIONS.join(", ")
            )));
        }
    }
    Ok(())
}

fn is_primary_key_option(key: &str) -> bool {
    key.starts_with("table.merge-engine")
        || key == mink_kv::definition::DELETE_BEHAVIOR
        || key == mink_kv::definition::CHANGELOG_IMAGE
        || key.starts_with("fields.")
        || key == mink_kv::definition::AUTO_INCREMENT
        || key == mink_kv::definition::AUTO_INCREMENT_CACHE
}

fn rejected(r: &mink_metadata::Rejection) -> NodeError {
    match r.kind() {
        RejectionKind::NotFound => NodeError::NotFound(r.message.clone()),
        RejectionKind::AlreadyExists => NodeError::AlreadyExists(r.message.clone()),
        RejectionKind::InvalidArgument | RejectionKind::NotEmpty => {
            NodeError::Invalid(r.message.clone())
        }
        _ => NodeError::Failed(r.to_string()),
    }
}

impl Node {
    pub async fn create_database(&self, name: &str, if_not_exists: bool) -> NodeResult<()> {
        let proposed = self
            .inner
            .sink
            .propose(Command::CreateDatabase(CreateDatabase {
                name: name.to_string(),
                ..Default::default()
            }))
            .await?;
        match proposed.result {
            Ok(Outcome::Done(_)) => Ok(()),
            Ok(Outcome::Redundant(_)) if if_not_exists => Ok(()),
            Ok(Outcome::Redundant(_)) => Err(NodeError::AlreadyExists(format!(
                "database {name:?} already exists"
            ))),
            Err(r) if r.kind() == RejectionKind::AlreadyExists && if_not_exists => Ok(()),
            Err(r) => Err(rejected(&r)),
        }
    }

    pub async fn drop_database(
        &self,
        name: &str,
        cascade: bool,
        if_exists: bool,
    ) -> NodeResult<()> {
        let proposed = self
            .inner
            .sink
            .propose(Command::DropDatabase(DropDatabase {
                name: name.to_string(),
                cascade,
            }))
            .await?;
        match proposed.result {
            Ok(Outcome::Done(_)) => Ok(()),
            Ok(Outcome::Redundant(_)) if if_exists => Ok(()),
            Ok(Outcome::Redundant(_)) => Err(NodeError::NotFound(format!(
                "database {name:?} does not exist"
            ))),
            Err(r) => Err(rejected(&r)),
        }
    }

    pub fn list_databases(&self) -> Vec<String> {
        self.view().state.databases.keys().cloned().collect()
    }

    pub fn list_tables(&self, database: &str) -> NodeResult<Vec<String>> {
        let view = self.view();
        if !view.state.databases.contains_key(database) {
            return Err(NodeError::NotFound(format!(
                "database {database:?} does not exist"
            )));
        }
        Ok(view
            .state
            .tables
            .values()
            .filter(|t| t.database == database)
            .map(|t| t.name.clone())
            .collect())
    }

    pub(crate) fn table_record(&self, database: &str, table: &str) -> NodeResult<TableRecord> {
        self.view()
            .state
            .table_by_name(database, table)
            .cloned()
            .ok_or_else(|| NodeError::TableNotFound {
                database: database.to_string(),
                table: table.to_string(),
            })
    }

    /// The table's schema at its current version, decoded once per version (every write
    /// and read needs it).
    pub(crate) fn table_schema(&self, record: &TableRecord) -> NodeResult<SchemaRef> {
        Ok(self.described(record)?.0)
    }

    /// The decoded schema and, for a primary-key table, its definition, cached by table and
    /// schema version: a table's keys and primary-key options never change after its create.
    pub(crate) fn described(
        &self,
        record: &TableRecord,
    ) -> NodeResult<(SchemaRef, Option<Arc<mink_kv::KvTableDef>>)> {
        let key = (record.table_id, record.schema_version);
        if let Some(d) = self
            .inner
            .described
            .read()
            .expect("described lock")
            .get(&key)
        {
            return Ok(d.clone());
        }
        let schema = Arc::new(codec::decode_schema(&record.schema).map_err(|e| {
            NodeError::Failed(format!(
                "the stored schema of {}.{} does not decode: {e}",
                record.database, record.name
            ))
        })?);
        let def = if record.is_primary_key_table() {
            Some(Arc::new(mink_kv::KvTableDef::new(
                Arc::clone(&schema),
                &record.primary_key,
                &record.bucket_key,
                &record.partition_keys,
                &record.options,
            )?))
        } else {
            None
        };
        self.inner
            .described
            .write()
            .expect("described lock")
            .insert(key, (Arc::clone(&schema), def.clone()));
        Ok((schema, def))
    }

    /// Creates a log table, then waits (a few seconds at most) until its buckets have leaders.
    pub async fn create_table(&self, mut spec: TableSpec) -> NodeResult<TableInfo> {
        check_options(spec.options.keys())?;
        if spec.primary_key.is_empty() {
            if let Some(k) = spec.options.keys().find(|k| is_primary_key_option(k)) {
                return Err(NodeError::Invalid(format!(
                    "option {k} applies to primary-key tables only"
                )));
            }
        } else {
            // Keys are NOT NULL; the bucket key defaults to the key without partition columns
            // and is stored resolved, so clients route by it like any bucket key.
            spec.schema = mink_kv::KvTableDef::normalize_schema(
                &spec.schema,
                &spec.primary_key,
                &spec.options,
            );
            let given = TableOptions::parse(&spec.options)?.bucket_key;
            mink_kv::definition::check_field_options(&spec.options)?;
            let def = mink_kv::KvTableDef::new(
                Arc::new(spec.schema.clone()),
                &spec.primary_key,
                &given,
                &spec.partition_keys,
                &spec.options,
            )?;
            let bucket_key: Vec<String> = def
                .bucket_key
                .iter()
                .map(|&i| def.schema.field(i).name().clone())
                .collect();
            spec.options.insert(
                mink_log::options::BUCKET_KEY.to_string(),
                bucket_key.join(","),
            );
        }
        let options = TableOptions::parse(&spec.options)?;
        let schema = &spec.schema;
        if schema.fields().is_empty() {
            return Err(NodeError::Invalid(
                "a table needs at least one column".into(),
            ));
        }
        codec::check_column_names(schema)?;
        for c in &spec.partition_keys {
            let field = schema.field_with_name(c).map_err(|_| {
                NodeError::Invalid(format!("partition column {c:?} is not in the schema"))
            })?;
            mink_log::routing::check_partition_key_type(field.data_type())?;
            if options.bucket_key.contains(c) {
                return Err(NodeError::Invalid(format!(
                    "partition column {c:?} cannot also be a bucket key: every row of a partition would land in one bucket"
                )));
            }
        }
        for c in &options.bucket_key {
            let field = schema.field_with_name(c).map_err(|_| {
                NodeError::Invalid(format!("bucket.key column {c:?} is not in the schema"))
            })?;
            mink_log::routing::check_key_type(field.data_type())?;
        }
        // Before the table: a retry finds the Iceberg table and attaches it. (Not when the
        // Mink table exists: its lake is there, and the create answers as it would anyway.)
        if options.lake_freshness.is_some()
            && self.table_record(&spec.database, &spec.name).is_err()
        {
            self.lake()
                .await?
                .ensure_table(
                    &spec.database,
                    &spec.name,
                    schema,
                    &spec.partition_keys,
                    &spec.primary_key,
                    None,
                )
                .await?;
        }
        let proposed = self
            .inner
            .sink
            .propose(Command::CreateTable(CreateTable {
                database: spec.database.clone(),
                name: spec.name.clone(),
                schema: codec::encode_schema(schema)?,
                primary_key: spec.primary_key.clone(),
                bucket_key: options.bucket_key.clone(),
                partition_keys: spec.partition_keys.clone(),
                bucket_count: options.bucket_count,
                options: spec.options.clone(),
                comment: spec.comment.clone(),
            }))
            .await?;
        match proposed.result {
            Ok(Outcome::Done(Reply::Table(_))) => {}
            Ok(Outcome::Redundant(_)) if spec.if_not_exists => {}
            Ok(Outcome::Redundant(_)) => {
                return Err(NodeError::AlreadyExists(format!(
                    "table {}.{} already exists",
                    spec.database, spec.name
                )));
            }
            Err(r) if r.kind() == RejectionKind::AlreadyExists && spec.if_not_exists => {}
            Ok(other) => return Err(NodeError::Failed(format!("unexpected reply {other:?}"))),
            Err(r) => return Err(rejected(&r)),
        }
        self.await_leaders(&spec.database, &spec.name).await
    }

    /// Leaders are assigned by the coordinator and the streams opened by the leaders; give
    /// them a moment so that a write right after a create finds its buckets ready.
    async fn await_leaders(&self, database: &str, table: &str) -> NodeResult<TableInfo> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let info = self.describe_table(database, table)?;
            let ready = info.buckets.iter().all(|b| {
                b.leader_node_id != 0
                    && (b.leader_node_id != self.node_id() || self.leads(info.table_id, b))
            });
            if ready || tokio::time::Instant::now() >= deadline {
                return Ok(info);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Changes a table's options or grows its schema (new nullable columns at the end).
    pub async fn alter_table(
        &self,
        database: &str,
        table: &str,
        change: TableChange,
    ) -> NodeResult<TableInfo> {
        let record = self.table_record(database, table)?;
        // A reset names an option as a set does: a misspelt one is refused, not a no-op.
        check_options(change.set_options.keys().chain(&change.reset_options))?;
        // A raw topic's rows are Kafka records (key, value, headers, timestamp) because its
        // schema is exactly that: a column more made it a typed table, and every record stored
        // before fetched as a JSON row instead of its key and value.
        if change.schema.is_some() && mink_log::raw::is_raw(self.table_schema(&record)?.as_ref()) {
            return Err(NodeError::Invalid(format!(
                "{database}.{table} holds raw Kafka records (key, value, headers, timestamp): its \
                 columns cannot change, or its records would fetch as JSON rows; create a typed \
                 table for rows with columns"
            )));
        }
        if !record.is_primary_key_table()
            && let Some(k) = change.set_options.keys().find(|k| is_primary_key_option(k))
        {
            return Err(NodeError::Invalid(format!(
                "option {k} applies to primary-key tables only"
            )));
        }
        let mut options = record.options.clone();
        options.extend(change.set_options.clone());
        for k in &change.reset_options {
            options.remove(k);
        }
        TableOptions::parse(&options)?;
        let lake = |o: &BTreeMap<String, String>| {
            o.get(mink_log::options::DATALAKE_ENABLED)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        };
        let enabling = lake(&options) && !lake(&record.options);
        if lake(&record.options) && !lake(&options) {
            // Tiering stops, the log's TTL alone trims it, reads are the log's; the Iceberg
            // table stays, marked as this table's so that enabling the lake again resumes it.
            let version = self.view().state.metadata_version;
            if version < mink_metadata::LAKE_DISABLE_VERSION {
                return Err(NodeError::Unavailable(format!(
                    "disabling the lake needs cluster metadata_version {} (this cluster is at {version}): every node must run a binary that supports it",
                    mink_metadata::LAKE_DISABLE_VERSION
                )));
            }
            let lake = self.lake().await?;
            match lake.set_owner(database, table, &lake_owner(&record)).await {
                Ok(()) | Err(mink_lake::LakeError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if enabling {
            // The lake table first (created, or attached after the checks): a retried alter
            // finds it. Tiering then starts at each bucket's log start; a primary-key bucket
            // whose changelog no longer begins at 0 starts from its latest KV snapshot. The
            // table's own lake, disabled before, resumes where it stopped.
            let schema = self.table_schema(&record)?;
            let lake_table = self
                .lake()
                .await?
                .ensure_table(
                    database,
                    table,
                    &schema,
                    &record.partition_keys,
                    &record.primary_key,
                    Some(&lake_owner(&record)),
                )
                .await?;
            self.check_lake_resumes(&record, &mink_lake::tier::tiered_offsets(&lake_table))?;
        }
        if record.is_primary_key_table() {
            // The working copies and the changelog are encoded by the schema and keys.
            if change.schema.is_some() {
                return Err(NodeError::Invalid(format!(
                    "{database}.{table} is a primary-key table: its schema cannot change yet"
                )));
            }
            if let Some(k) = change
                .set_options
                .keys()
                .chain(&change.reset_options)
                .find(|k| is_primary_key_option(k) || k.as_str() == mink_log::options::BUCKET_KEY)
            {
                return Err(NodeError::Invalid(format!(
                    "option {k} of primary-key table {database}.{table} cannot change"
                )));
            }
        }
        let new_schema = match &change.schema {
            Some(schema) => {
                let current = self.table_schema(&record)?;
                codec::check_evolution(&current, schema)?;
                if lake(&options) {
                    // The lake first: a retried alter finds its columns there already, and
                    // a lake column the table lacks (a failed alter) is optional, left null.
                    let added = &schema.fields()[current.fields().len()..];
                    self.lake()
                        .await?
                        .add_columns(database, table, added)
                        .await?;
                }
                codec::encode_schema(schema)?
            }
            None => Vec::new(),
        };
        let proposed = self
            .inner
            .sink
            .propose(Command::AlterTable(AlterTable {
                table_id: record.table_id,
                set_options: change.set_options,
                reset_options: change.reset_options,
                new_schema,
                expected_schema_version: record.schema_version,
            }))
            .await?;
        match proposed.result {
            Ok(_) => self.describe_table(database, table),
            Err(r) if r.kind() == RejectionKind::Conflict => Err(NodeError::Unavailable(format!(
                "{database}.{table} changed concurrently: {}; describe it and retry",
                r.message
            ))),
            Err(r) => Err(rejected(&r)),
        }
    }

    /// Creates a partition (by name: the partition-key values joined by `$`) and waits for its
    /// buckets' leaders. Writes create partitions themselves; this is for ahead-of-time setup.
    pub async fn create_partition(
        &self,
        database: &str,
        table: &str,
        name: &str,
        if_not_exists: bool,
    ) -> NodeResult<PartitionInfo> {
        let record = self.table_record(database, table)?;
        let existed = self
            .view()
            .state
            .partition_names
            .contains_key(&(record.table_id, name.to_string()));
        if existed && !if_not_exists {
            return Err(NodeError::AlreadyExists(format!(
                "partition {name:?} of {database}.{table} already exists"
            )));
        }
        self.ensure_partition(&record, name).await?;
        let info = self.await_leaders(database, table).await?;
        info.partitions
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                NodeError::NotFound(format!(
                    "partition {name:?} of {database}.{table} was dropped meanwhile"
                ))
            })
    }

    /// The id of a partition, created if it does not exist yet.
    pub(crate) async fn ensure_partition(
        &self,
        record: &TableRecord,
        name: &str,
    ) -> NodeResult<u64> {
        if !record.is_partitioned() {
            return Err(NodeError::Invalid(format!(
                "{}.{} is not partitioned",
                record.database, record.name
            )));
        }
        let view = self.view();
        if let Some(id) = view
            .state
            .partition_names
            .get(&(record.table_id, name.to_string()))
        {
            return Ok(*id);
        }
        let values = mink_log::routing::partition_values(&record.partition_keys, name)?;
        let schema = self.table_schema(record)?;
        let keys = record
            .partition_keys
            .iter()
            .map(|k| schema.field_with_name(k).cloned())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| NodeError::Failed(e.to_string()))?;
        mink_log::routing::check_partition_name(&keys, name)?;
        let count = view
            .state
            .partitions
            .range((record.table_id, 0)..=(record.table_id, u64::MAX))
            .count();
        if count >= MAX_PARTITIONS_PER_TABLE {
            return Err(NodeError::Invalid(format!(
                "{}.{} already has {count} partitions, the most a table may have; drop old ones",
                record.database, record.name
            )));
        }
        let proposed = self
            .inner
            .sink
            .propose(Command::CreatePartition(CreatePartition {
                table_id: record.table_id,
                name: name.to_string(),
                values,
            }))
            .await?;
        match proposed.result {
            Ok(outcome) => match outcome.into_reply() {
                Reply::Table(created) => Ok(created.partition_id),
                other => Err(NodeError::Failed(format!("unexpected reply {other:?}"))),
            },
            Err(r) => Err(rejected(&r)),
        }
    }

    pub async fn drop_partition(
        &self,
        database: &str,
        table: &str,
        name: &str,
        if_exists: bool,
    ) -> NodeResult<()> {
        let record = self.table_record(database, table)?;
        let proposed = self
            .inner
            .sink
            .propose(Command::DropPartition(DropPartition {
                table_id: record.table_id,
                name: name.to_string(),
            }))
            .await?;
        match proposed.result {
            Ok(Outcome::Done(_)) => {
                // Its rows leave the lake too; lake maintenance finishes this if it fails.
                if let Err(e) = self.drop_lake_partitions(&record).await {
                    tracing::warn!(error = %e, table, partition = name, "dropping a partition's lake files");
                }
                Ok(())
            }
            Ok(Outcome::Redundant(_)) if if_exists => Ok(()),
            Ok(Outcome::Redundant(_)) => Err(NodeError::NotFound(format!(
                "partition {name:?} of {database}.{table} does not exist"
            ))),
            Err(r) if r.kind() == RejectionKind::NotFound && if_exists => Ok(()),
            Err(r) => Err(rejected(&r)),
        }
    }

    fn leads(&self, table_id: u64, b: &BucketInfo) -> bool {
        self.inner
            .led
            .read()
            .expect("led lock")
            .get(&(table_id, b.partition_id, b.bucket))
            .is_some_and(|l| l.leader_epoch == b.leader_epoch)
    }

    /// Removes from `record`'s lake table the partitions the table no longer has (a no-op
    /// for tables without a lake or partitions).
    pub(crate) async fn drop_lake_partitions(&self, record: &TableRecord) -> NodeResult<bool> {
        if !record.is_partitioned()
            || TableOptions::parse(&record.options)?
                .lake_freshness
                .is_none()
        {
            return Ok(false);
        }
        let view = self.view();
        let live = view
            .state
            .partitions
            .range((record.table_id, 0)..=(record.table_id, u64::MAX))
            .map(|(&(_, id), p)| (id, p.values.clone()))
            .collect();
        Ok(self
            .lake()
            .await?
            .drop_partitions(&record.database, &record.name, &live)
            .await?)
    }

    /// Refuses to enable the lake of `record` when its lake table holds rows tiered (to
    /// `tiered`, by partition and bucket) before the lake was disabled and the log no longer
    /// holds every row since: the rows in between would be in neither.
    fn check_lake_resumes(
        &self,
        record: &TableRecord,
        tiered: &BTreeMap<(u64, u32), u64>,
    ) -> NodeResult<()> {
        let view = self.view();
        let buckets = view
            .state
            .buckets
            .range((record.table_id, 0, 0)..=(record.table_id, u64::MAX, u32::MAX));
        for (&(_, partition_id, bucket), b) in buckets {
            let (Some(&lake_end), Some(stream)) = (
                tiered.get(&(partition_id, bucket)),
                view.state.streams.get(&b.stream_id),
            ) else {
                continue;
            };
            if stream.start_offset > lake_end {
                let partition = view
                    .state
                    .partitions
                    .get(&(record.table_id, partition_id))
                    .map(|p| format!(" of partition {}", p.name))
                    .unwrap_or_default();
                return Err(NodeError::Invalid(format!(
                    "the lake of {}.{} cannot resume: it holds bucket {bucket}{partition} up to offset {lake_end}, and the log has been trimmed to {} since the lake was disabled, so offsets {lake_end}..{} are in neither. Drop the Iceberg table {}.{} (for example with pyiceberg) to start a new lake",
                    record.database,
                    record.name,
                    stream.start_offset,
                    stream.start_offset,
                    record.database,
                    record.name
                )));
            }
        }
        Ok(())
    }

    pub async fn drop_table(&self, database: &str, table: &str, if_exists: bool) -> NodeResult<()> {
        let lake = self
            .table_record(database, table)
            .ok()
            .and_then(|r| TableOptions::parse(&r.options).ok())
            .is_some_and(|o| o.lake_freshness.is_some());
        let proposed = self
            .inner
            .sink
            .propose(Command::DropTable(DropTable {
                database: database.to_string(),
                name: table.to_string(),
            }))
            .await?;
        match proposed.result {
            Ok(Outcome::Done(_)) => {
                // Its lake table goes with it (a table created again under this name would
                // otherwise find the old rows and their offsets, and is refused).
                if lake {
                    self.lake().await?.drop_table(database, table).await?;
                }
                Ok(())
            }
            Ok(Outcome::Redundant(_)) if if_exists => Ok(()),
            Ok(Outcome::Redundant(_)) => Err(NodeError::TableNotFound {
                database: database.to_string(),
                table: table.to_string(),
            }),
            Err(r) => Err(rejected(&r)),
        }
    }

    pub fn describe_table(&self, database: &str, table: &str) -> NodeResult<TableInfo> {
        let record = self.table_record(database, table)?;
        let schema = self.table_schema(&record)?;
        let view = self.view();
        let state = &view.state;
        let buckets: Vec<BucketInfo> = state
            .buckets
            .range((record.table_id, 0, 0)..=(record.table_id, u64::MAX, u32::MAX))
            .map(|(_, b)| {
                let stream = state.streams.get(&b.stream_id);
                BucketInfo {
                    partition_id: b.partition_id,
                    partition: state
                        .partitions
                        .get(&(b.table_id, b.partition_id))
                        .map(|p| p.name.clone()),
                    bucket: b.bucket,
                    stream_id: b.stream_id,
                    leader_node_id: b.leader_node_id,
                    leader_address: state
                        .nodes
                        .get(&b.leader_node_id)
                        .map(|n| n.address.clone())
                        .unwrap_or_default(),
                    leader_epoch: b.leader_epoch,
                    start_offset: stream.map_or(0, |s| s.start_offset),
                    end_offset: stream.map_or(0, |s| s.end_offset),
                    tiered_offset: state
                        .lake_snapshots
                        .get(&b.table_id)
                        .and_then(|l| l.tiered_offset(b.partition_id, b.bucket)),
                    readable_offset: crate::read::readable_from(
                        state,
                        &record,
                        b,
                        stream.map_or(0, |s| s.start_offset),
                    ),
                }
            })
            .collect();
        let lake = TableOptions::parse(&record.options)?
            .lake_freshness
            .map(|_| {
                let recorded = state.lake_snapshots.get(&record.table_id);
                let behind = buckets
                    .iter()
                    .any(|b| b.end_offset > b.tiered_offset.unwrap_or(b.start_offset));
                let since = recorded.map_or(record.created_at_ms, |r| r.committed_at_ms);
                LakeInfo {
                    snapshot_id: recorded.map(|r| r.snapshot_id),
                    committed_at_ms: recorded.map(|r| r.committed_at_ms),
                    lag_ms: if behind {
                        self.inner.config.clock.now_ms().saturating_sub(since)
                    } else {
                        0
                    },
                }
            });
        Ok(TableInfo {
            table_id: record.table_id,
            database: record.database.clone(),
            name: record.name.clone(),
            schema,
            schema_version: record.schema_version,
            options: record.options.clone(),
            partition_keys: record.partition_keys.clone(),
            bucket_count: record.bucket_count,
            bucket_key: record.bucket_key.clone(),
            primary_key: record.primary_key.clone(),
            comment: record.comment.clone(),
            created_at_ms: record.created_at_ms,
            partitions: state
                .partitions
                .range((record.table_id, 0)..=(record.table_id, u64::MAX))
                .map(|(_, p)| PartitionInfo {
                    partition_id: p.partition_id,
                    name: p.name.clone(),
                    values: p.values.clone(),
                    created_at_ms: p.created_at_ms,
                })
                .collect(),
            buckets,
            lake,
        })
    }
}

/// The identity of `record`'s Mink table in its lake table ([`mink_lake::OWNER_PROPERTY`]):
/// unique in the cluster, even across tables dropped and created again under one name.
fn lake_owner(record: &TableRecord) -> String {
    format!("{}@{}", record.table_id, record.created_at_ms)
}
