//! The `mink` catalog: one schema per database, one [`MinkTable`] per table.
//!
//! DataFusion lists schemas and tables synchronously, so the catalog keeps the names it
//! fetched last ([`MinkCatalog::refresh`], before each statement is planned); a table is
//! described (schema, buckets, high watermarks) when a statement names it.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::error::{DataFusionError, Result};
use mink_client::{Client, ErrorCode};

use crate::client_error;
use crate::system::{SYSTEM, SystemTables};
use crate::table::{MinkTable, TableView};

/// The databases and tables of a cluster.
#[derive(Debug)]
pub struct MinkCatalog {
    /// Scans report the log-tail rows they read (see [`crate::QueryEngine::report_tail_scans`]).
    pub report_tails: Arc<std::sync::atomic::AtomicBool>,
    client: Client,
    lake: Option<Arc<mink_lake::Lake>>,
    queries: Arc<crate::queries::Queries>,
    freshness: Arc<std::sync::Mutex<crate::settings::Freshness>>,
    /// Database → its tables, as last fetched.
    names: Arc<RwLock<BTreeMap<String, Vec<String>>>>,
}

impl MinkCatalog {
    pub fn new(
        client: Client,
        lake: Option<Arc<mink_lake::Lake>>,
        queries: Arc<crate::queries::Queries>,
        freshness: Arc<std::sync::Mutex<crate::settings::Freshness>>,
    ) -> Self {
        MinkCatalog {
            report_tails: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            client,
            lake,
            queries,
            freshness,
            names: Arc::default(),
        }
    }

    /// Fetches the databases and tables as the cluster's metadata has them now.
    pub async fn refresh(&self) -> Result<()> {
        let mut names = BTreeMap::new();
        for database in self.client.list_databases().await.map_err(client_error)? {
            let tables = match self.client.list_tables(&database).await {
                Ok(t) => t,
                // Dropped between the two calls.
                Err(e) if e.code() == Some(ErrorCode::NotFound) => continue,
                Err(e) => return Err(client_error(e)),
            };
            names.insert(database, tables);
        }
        *self.names.write().expect("catalog names") = names;
        Ok(())
    }
}

impl CatalogProvider for MinkCatalog {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .names
            .read()
            .expect("catalog names")
            .keys()
            .filter(|d| d.as_str() != SYSTEM)
            .cloned()
            .collect();
        names.push(SYSTEM.to_string());
        names
    }

    /// A database, or `system` (the system tables; a database of that name is hidden).
    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if name == SYSTEM {
            return Some(Arc::new(SystemTables::new(
                self.client.clone(),
                Arc::clone(&self.queries),
            )));
        }
        self.names
            .read()
            .expect("catalog names")
            .contains_key(name)
            .then(|| {
                Arc::new(MinkDatabase {
                    report_tails: Arc::clone(&self.report_tails),
                    client: self.client.clone(),
                    lake: self.lake.clone(),
                    freshness: Arc::clone(&self.freshness),
                    database: name.to_string(),
                    names: Arc::clone(&self.names),
                }) as _
            })
    }
}

/// One database's tables.
#[derive(Debug)]
pub struct MinkDatabase {
    report_tails: Arc<std::sync::atomic::AtomicBool>,
    client: Client,
    lake: Option<Arc<mink_lake::Lake>>,
    freshness: Arc<std::sync::Mutex<crate::settings::Freshness>>,
    database: String,
    names: Arc<RwLock<BTreeMap<String, Vec<String>>>>,
}

#[async_trait]
impl SchemaProvider for MinkDatabase {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.names
            .read()
            .expect("catalog names")
            .get(&self.database)
            .cloned()
            .unwrap_or_default()
    }

    /// A table, or one of its virtual tables (`t$changelog`, `t$log`, `t$lake`).
    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let (table, view) = match name.rsplit_once('$') {
            None => (name, TableView::Rows),
            Some((table, suffix)) => match TableView::from_suffix(suffix) {
                Some(view) => (table, view),
                None => {
                    return Err(DataFusionError::Plan(format!(
                        "{}.{name}: no virtual table ${suffix} (there are $changelog, $log and $lake)",
                        self.database
                    )));
                }
            },
        };
        match self.client.describe_table(&self.database, table).await {
            Ok(description) => Ok(Some(Arc::new(
                MinkTable::view(self.client.clone(), description, view)?
                    .reading_lake(self.lake.clone())
                    .at_freshness(*self.freshness.lock().expect("freshness"))
                    .reporting_tails(self.report_tails.load(std::sync::atomic::Ordering::Relaxed)),
            ))),
            Err(e) if e.code() == Some(ErrorCode::NotFound) => Ok(None),
            Err(e) => Err(client_error(e)),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        let table = name.rsplit_once('$').map_or(name, |(t, _)| t);
        self.table_names().iter().any(|t| t == table)
    }
}
