//! Mink's lakehouse half: the Apache Iceberg tables that hold a Mink table's history.
//!
//! - [`storage`]: Iceberg's file I/O over the node's object store.
//! - [`table`]: a Mink table's lake schema and partitioning, and the check an existing Iceberg
//!   table passes to be attached.
//! - [`tier`]: a round of log rows committed to the lake exactly once.
//! - [`Lake::read_bucket`]: a bucket's rows between two offsets, read back from a snapshot.
//! - [`Lake`]: the catalog (iceberg-rust's SQL catalog on the metadata database, the one
//!   pyiceberg reads too) and the warehouse (`<object store>/lake`).

mod commit;
mod drop;
mod keys;
pub mod maintain;
pub mod pk;
mod read;
pub use read::{ColumnStats, LakeSplits, Prune};
pub mod storage;
pub mod table;
pub mod tier;

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::Schema as ArrowSchema;
use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder as _, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalog, SqlCatalogBuilder};
use object_store::ObjectStore;

use crate::storage::{ObjectStoreStorage, ObjectStoreStorageFactory};

/// The catalog name Mink's lake tables are registered under (`catalog_name` in the SQL
/// catalog's tables; pyiceberg's `SqlCatalog("mink", ...)` finds them).
pub const CATALOG_NAME: &str = "mink";

/// The Iceberg table property naming the Mink table whose lake it is (`<table id>@<created
/// at ms>` in its cluster): a lake disabled and enabled again resumes on its own table, and
/// another table of the same name is refused it.
pub const OWNER_PROPERTY: &str = "mink.owner";

#[derive(Debug, thiserror::Error)]
pub enum LakeError {
    /// A Mink table and an Iceberg table (or Iceberg itself) disagree about a column.
    #[error("column {column:?}: {reason}")]
    Incompatible { column: String, reason: String },
    #[error("Iceberg table {0} does not exist")]
    NotFound(String),
    #[error("Iceberg table {0} already exists (attach it instead)")]
    AlreadyExists(String),
    /// The rows of a bucket would leave a hole in the lake: it is tiered to `tiered` and the
    /// round's rows continue only at `start` (a round starting past the tiered offset, or
    /// batches with a gap between them).
    #[error(
        "bucket {bucket}: the lake is tiered to offset {tiered}, the round's rows continue at {start}"
    )]
    Gap {
        bucket: u32,
        tiered: u64,
        start: u64,
    },
    /// A hand-built commit found the table moved on, or a file it removes no longer live:
    /// nothing was committed.
    #[error("lake commit conflict: {0}")]
    Conflict(String),
    /// A commit would remove a file the table's head no longer holds (another commit removed
    /// it): nothing was committed.
    #[error("lake commit: {0} is no longer live in the table")]
    FileGone(String),
    /// An Iceberg table holds what Mink tiered for an earlier table of the same name.
    #[error("{0}")]
    Stale(String),
    /// An Iceberg table to attach holds rows another writer put there.
    #[error("{0}")]
    NotEmpty(String),
    #[error("Iceberg: {0}")]
    Iceberg(String),
}

impl From<iceberg::Error> for LakeError {
    fn from(e: iceberg::Error) -> Self {
        LakeError::Iceberg(e.to_string())
    }
}

pub type LakeResult<T> = Result<T, LakeError>;

/// The lake of a cluster: its Iceberg catalog and warehouse.
#[derive(Debug, Clone)]
pub struct Lake {
    catalog: Arc<SqlCatalog>,
    /// The catalog's database, for the compare-and-set of hand-built commits.
    pool: Arc<sqlx::AnyPool>,
    postgres: bool,
    /// The warehouse's storage, for listing files (orphan removal).
    storage: ObjectStoreStorage,
    warehouse: String,
    /// Tables as last loaded for reading: a read of a snapshot they hold needs no catalog
    /// round trip (a union read asks once per read step).
    loaded: Arc<std::sync::Mutex<HashMap<(String, String), Table>>>,
    /// Where primary-key tables' key-location indexes live (memory when `None`).
    key_index_dir: Option<std::path::PathBuf>,
    /// The indexes open, by (database, table).
    key_indexes: Arc<std::sync::Mutex<HashMap<(String, String), keys::SharedIndex>>>,
    key_files_read: Arc<std::sync::atomic::AtomicU64>,
    /// What stamps the snapshots this lake commits (their `timestamp-ms`).
    clock: Arc<dyn mink_metadata::Clock>,
}

/// The SQL catalog's URL for a metadata URL (`sqlite://...` or `postgres://...`): SQLite files
/// are created if missing, as the metadata sink does.
fn catalog_uri(metadata_url: &str) -> String {
    if metadata_url.starts_with("sqlite:") && !metadata_url.contains("mode=") {
        let sep = if metadata_url.contains('?') { '&' } else { '?' };
        format!("{metadata_url}{sep}mode=rwc")
    } else {
        metadata_url.to_string()
    }
}

impl Lake {
    /// This lake with `clock` stamping its snapshots (the node's clock; the system's by default).
    pub fn with_clock(mut self, clock: Arc<dyn mink_metadata::Clock>) -> Lake {
        self.clock = clock;
        self
    }

    /// Opens the lake of the cluster whose metadata is at `metadata_url` and whose objects are
    /// in `store` (opened from `store_url`). Creates the catalog's tables if missing.
    pub async fn open(
        metadata_url: &str,
        store_url: &str,
        store: Arc<dyn ObjectStore>,
    ) -> LakeResult<Lake> {
        if metadata_url.contains(":memory:") {
            return Err(LakeError::Iceberg(
                "the lake's catalog lives in the metadata database: an in-memory SQLite database is not shared between connections; use a file or PostgreSQL".into(),
            ));
        }
        let storage = ObjectStoreStorage::new(store_url, store)?;
        let warehouse = format!("{}/lake", storage.root());
        let bind = if metadata_url.starts_with("postgres") {
            SqlBindStyle::DollarNumeric
        } else {
            SqlBindStyle::QMark
        };
        let catalog = SqlCatalogBuilder::default()
            .uri(catalog_uri(metadata_url))
            .warehouse_location(&warehouse)
            .sql_bind_style(bind)
            .with_storage_factory(Arc::new(ObjectStoreStorageFactory::new(storage.clone())))
            .load(CATALOG_NAME, HashMap::new())
            .await?;
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(2)
            .connect_lazy(&catalog_uri(metadata_url))
            .map_err(|e| LakeError::Iceberg(e.to_string()))?;
        Ok(Lake {
            catalog: Arc::new(catalog),
            pool: Arc::new(pool),
            postgres: metadata_url.starts_with("postgres"),
            storage,
            warehouse,
            loaded: Arc::default(),
            key_index_dir: None,
            key_indexes: Arc::default(),
            key_files_read: Arc::default(),
            clock: mink_metadata::system_clock(),
        })
    }

    /// The warehouse location: lake tables live below it (`<warehouse>/<database>/<table>`).
    pub fn warehouse(&self) -> &str {
        &self.warehouse
    }

    fn ident(database: &str, table: &str) -> LakeResult<TableIdent> {
        Ok(TableIdent::new(
            NamespaceIdent::new(database.to_string()),
            table.to_string(),
        ))
    }

    /// Creates the lake table of Mink table `database.table` with `columns`, partitioned by
    /// `partition_keys` (identity). Fails if an Iceberg table of that name exists.
    pub async fn create_table(
        &self,
        database: &str,
        table: &str,
        columns: &ArrowSchema,
        partition_keys: &[String],
    ) -> LakeResult<Table> {
        self.create_keyed_table(database, table, columns, partition_keys, &[])
            .await
    }

    /// [`Lake::create_table`] of a primary-key table: its key columns are the Iceberg
    /// schema's identifier fields, which Iceberg's upserting writers and readers (Flink,
    /// Spark MERGE, pyiceberg's upsert) take as the row key.
    pub async fn create_keyed_table(
        &self,
        database: &str,
        table: &str,
        columns: &ArrowSchema,
        partition_keys: &[String],
        primary_key: &[String],
    ) -> LakeResult<Table> {
        let ident = Self::ident(database, table)?;
        if self.catalog.table_exists(&ident).await? {
            return Err(LakeError::AlreadyExists(format!("{database}.{table}")));
        }
        let schema = table::with_identifier_fields(table::lake_schema(columns)?, primary_key)?;
        let spec = table::lake_partition_spec(&schema, partition_keys)?;
        let namespace = ident.namespace().clone();
        if !self.catalog.namespace_exists(&namespace).await? {
            self.catalog
                .create_namespace(&namespace, HashMap::new())
                .await?;
        }
        let creation = TableCreation::builder()
            .name(table.to_string())
            .location(format!("{}/{database}/{table}", self.warehouse))
            .schema(schema)
            .partition_spec(spec)
            .properties([(
                "write.parquet.compression-codec".to_string(),
                "zstd".to_string(),
            )])
            .build();
        Ok(self.catalog.create_table(&namespace, creation).await?)
    }

    /// The lake table of Mink table `database.table`: the Iceberg table of that name if there
    /// is one and it fits ([`Lake::attach_table`]), else a new one ([`Lake::create_table`]).
    pub async fn ensure_table(
        &self,
        database: &str,
        table: &str,
        columns: &ArrowSchema,
        partition_keys: &[String],
        primary_key: &[String],
        owner: Option<&str>,
    ) -> LakeResult<Table> {
        match self.attach_table(database, table, columns, owner).await {
            Err(LakeError::NotFound(_)) => {
                self.create_keyed_table(database, table, columns, partition_keys, primary_key)
                    .await
            }
            other => other,
        }
    }

    /// The Iceberg table `database.table` as Mink table `database.table`'s lake, after checking
    /// it can hold the table's `columns` ([`table::check_compatible`]) and holds no rows Mink
    /// tiered, unless they are `owner`'s ([`Lake::set_owner`]: its own lake, disabled and
    /// enabled again).
    pub async fn attach_table(
        &self,
        database: &str,
        table: &str,
        columns: &ArrowSchema,
        owner: Option<&str>,
    ) -> LakeResult<Table> {
        let mut loaded = self.load_table(database, table).await?;
        let own = owner.is_some()
            && loaded
                .metadata()
                .properties()
                .get(OWNER_PROPERTY)
                .map(String::as_str)
                == owner;
        if own {
            // Its own lake, disabled while the table gained columns: the Iceberg table gains
            // them now, optional (rows tiered before read them as null), as an alter with the
            // lake on adds them.
            let current = loaded.metadata().current_schema();
            let added: Vec<arrow::datatypes::FieldRef> = columns
                .fields()
                .iter()
                .filter(|f| f.is_nullable() && current.field_by_name(f.name()).is_none())
                .cloned()
                .collect();
            if !added.is_empty() {
                loaded = self.add_columns(database, table, &added).await?;
            }
        }
        table::check_compatible(loaded.metadata().current_schema(), columns)?;
        if own {
            return Ok(loaded);
        }
        // Its offsets would say the new table's rows are tiered already.
        if !tier::tiered_offsets(&loaded).is_empty() {
            return Err(LakeError::Stale(format!(
                "Iceberg table {database}.{table} holds rows Mink tiered for an earlier table of that name (mink.tiered-offset.* in its snapshot summary): drop it, or give the new table another name"
            )));
        }
        // Rows another writer put there: reads serve the lake up to the offsets Mink tiered,
        // so they would never be read, and tiering would add rows at their offsets.
        if let Some(snapshot) = loaded.metadata().current_snapshot() {
            let rows = snapshot
                .summary()
                .additional_properties
                .get("total-records")
                .map(|n| n.as_str());
            if rows != Some("0") {
                return Err(LakeError::NotEmpty(format!(
                    "Iceberg table {database}.{table} holds rows Mink did not tier ({} in its current snapshot): Mink attaches only an empty Iceberg table; drop or empty it, or give the new table another name",
                    rows.unwrap_or("an unknown number")
                )));
            }
        }
        Ok(loaded)
    }

    /// Marks the lake table of `database.table` as Mink table `owner`'s ([`OWNER_PROPERTY`]),
    /// so that [`Lake::attach_table`] gives it back to that table only.
    pub async fn set_owner(&self, database: &str, table: &str, owner: &str) -> LakeResult<()> {
        use iceberg::transaction::{ApplyTransactionAction as _, Transaction};
        let loaded = self.load_table(database, table).await?;
        if loaded
            .metadata()
            .properties()
            .get(OWNER_PROPERTY)
            .map(String::as_str)
            == Some(owner)
        {
            return Ok(());
        }
        let tx = Transaction::new(&loaded);
        let tx = tx
            .update_table_properties()
            .set(OWNER_PROPERTY.to_string(), owner.to_string())
            .apply(tx)?;
        tx.commit(self.catalog.as_ref()).await?;
        Ok(())
    }

    /// Evolves the lake table of `database.table` with `added` columns (optional, at the end),
    /// as `ALTER TABLE ... ADD COLUMN` does to the Mink table. A column the lake has already
    /// with the same type is skipped (a retried alter); one it has with another type fails
    /// naming it.
    pub async fn add_columns(
        &self,
        database: &str,
        table: &str,
        added: &[arrow::datatypes::FieldRef],
    ) -> LakeResult<Table> {
        use iceberg::transaction::{AddColumn, ApplyTransactionAction as _, Transaction};
        let current = self.load_table(database, table).await?;
        let schema = current.metadata().current_schema().clone();
        let tx = Transaction::new(&current);
        let mut update = tx.update_schema();
        let mut any = false;
        for field in added {
            let t = table::column_type(field)?;
            if let Some(existing) = schema.field_by_name(field.name()) {
                if !table::same_type(&existing.field_type, &t.field_type) {
                    return Err(LakeError::Incompatible {
                        column: field.name().clone(),
                        reason: format!(
                            "the Iceberg table has {}, the new column is {}",
                            existing.field_type, t.field_type
                        ),
                    });
                }
                continue;
            }
            update = update.add_column(AddColumn::optional(field.name(), (*t.field_type).clone()));
            any = true;
        }
        if !any {
            return Ok(current);
        }
        let tx = update.apply(tx)?;
        Ok(tx.commit(self.catalog.as_ref()).await?)
    }

    /// Every row of the lake table's current snapshot (deletes applied), as Arrow batches with
    /// the lake's schema. For checks and small tables: it reads the whole table.
    pub async fn scan(
        &self,
        database: &str,
        table: &str,
    ) -> LakeResult<Vec<arrow::array::RecordBatch>> {
        use futures::TryStreamExt as _;
        let t = self.load_table(database, table).await?;
        Ok(t.scan().build()?.to_arrow().await?.try_collect().await?)
    }

    /// The lake table of `database.table` as of a metadata version holding `snapshot_id`: the
    /// one loaded last when it does, else loaded again.
    pub(crate) async fn table_with_snapshot(
        &self,
        database: &str,
        table: &str,
        snapshot_id: i64,
    ) -> LakeResult<Table> {
        let key = (database.to_string(), table.to_string());
        let cached = self
            .loaded
            .lock()
            .expect("lake tables lock")
            .get(&key)
            .cloned();
        if let Some(t) = cached.filter(|t| t.metadata().snapshot_by_id(snapshot_id).is_some()) {
            return Ok(t);
        }
        let t = self.load_table(database, table).await?;
        self.loaded
            .lock()
            .expect("lake tables lock")
            .insert(key, t.clone());
        Ok(t)
    }

    /// The current metadata file of every lake table in the catalog, by `(database, table)`:
    /// one query, so a caller can tell which tables moved without loading them.
    pub async fn metadata_locations(&self) -> LakeResult<HashMap<(String, String), String>> {
        use sqlx::Row as _;
        let statement = self.sql(
            "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables \
             WHERE catalog_name = ? AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
        );
        let rows = sqlx::query(&statement)
            .bind(CATALOG_NAME)
            .fetch_all(self.pool.as_ref())
            .await
            .map_err(|e| LakeError::Iceberg(e.to_string()))?;
        let mut out = HashMap::new();
        for row in rows {
            let get = |c: &str| -> LakeResult<Option<String>> {
                row.try_get::<Option<String>, _>(c)
                    .map_err(|e| LakeError::Iceberg(e.to_string()))
            };
            if let (Some(ns), Some(name), Some(location)) = (
                get("table_namespace")?,
                get("table_name")?,
                get("metadata_location")?,
            ) {
                out.insert((ns, name), location);
            }
        }
        Ok(out)
    }

    /// The lake table of `database.table`.
    pub async fn load_table(&self, database: &str, table: &str) -> LakeResult<Table> {
        let ident = Self::ident(database, table)?;
        if !self.catalog.table_exists(&ident).await? {
            return Err(LakeError::NotFound(format!("{database}.{table}")));
        }
        Ok(self.catalog.load_table(&ident).await?)
    }
}
