//! A bucket's local working copy: one redb file holding the latest row per key and the next
//! changelog offset it covers. Only changes already durable in the stream are applied, so the
//! copy is always the stream's state at some offset and can be thrown away and rebuilt.
//!
//! Commits are not fsynced one by one (`Durability::None`); every `sync_interval` one is. After
//! a crash redb reopens at its last synced commit, whose offset says where replay resumes.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use crate::{KeyChange, KvError, KvResult};

const ROWS: TableDefinition<'static, &[u8], &[u8]> = TableDefinition::new("rows");
const META: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("meta");
const NEXT_OFFSET: &str = "next_offset";
const FORMAT: &str = "format";

fn err(e: impl Into<redb::Error>) -> KvError {
    KvError::Store(e.into().to_string())
}

/// The working copy of one bucket.
#[derive(Debug)]
pub struct KvStore {
    db: Database,
    path: PathBuf,
    sync_interval: Duration,
    last_sync: Mutex<Instant>,
}

/// A consistent read of the working copy at one offset.
#[derive(Debug)]
pub struct StoreSnapshot {
    txn: redb::ReadTransaction,
    /// Every change below this offset is in the snapshot, none at or above it.
    pub next_offset: u64,
}

impl KvStore {
    /// Opens the copy at `path`, or creates an empty one. A copy written in another `format`
    /// (or that does not open) is deleted and replaced by an empty one.
    pub fn open(path: &Path, format: &str, sync_interval: Duration) -> KvResult<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| KvError::Store(format!("{}: {e}", dir.display())))?;
        }
        let store = match Self::open_existing(path, sync_interval) {
            Ok(Some(s)) if s.format()?.as_deref() == Some(format) => Some(s),
            Ok(Some(s)) => {
                tracing::warn!(path = %path.display(), "working copy in another format; rebuilding");
                drop(s);
                None
            }
            Ok(None) => None,
            // Still held by the tablet of an earlier leadership on this node: never delete a
            // copy in use; the caller retries once that tablet is gone.
            Err(e @ KvError::Aborted(_)) => return Err(e),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "working copy does not open; rebuilding");
                None
            }
        };
        if let Some(s) = store {
            return Ok(s);
        }
        let _ = std::fs::remove_file(path);
        let db = Database::create(path).map_err(err)?;
        let store = KvStore {
            db,
            path: path.to_path_buf(),
            sync_interval,
            last_sync: Mutex::new(Instant::now()),
        };
        let mut txn = store.db.begin_write().map_err(err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| KvError::Store(e.to_string()))?;
        {
            let mut meta = txn.open_table(META).map_err(err)?;
            meta.insert(FORMAT, format.as_bytes()).map_err(err)?;
            txn.open_table(ROWS).map_err(err)?;
        }
        txn.commit().map_err(err)?;
        Ok(store)
    }

    fn open_existing(path: &Path, sync_interval: Duration) -> KvResult<Option<Self>> {
        if !path.exists() {
            return Ok(None);
        }
        let db = match Database::open(path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(KvError::Aborted(format!(
                    "the working copy {} is still open (an earlier tablet of this bucket); retry",
                    path.display()
                )));
            }
            Err(e) => return Err(err(e)),
        };
        Ok(Some(KvStore {
            db,
            path: path.to_path_buf(),
            sync_interval,
            last_sync: Mutex::new(Instant::now()),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn format(&self) -> KvResult<Option<String>> {
        let txn = self.db.begin_read().map_err(err)?;
        let meta = match txn.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        Ok(meta
            .get(FORMAT)
            .map_err(err)?
            .map(|v| String::from_utf8_lossy(v.value()).into_owned()))
    }

    /// The offset the copy has reached (0 for a new one).
    pub fn next_offset(&self) -> KvResult<u64> {
        let txn = self.db.begin_read().map_err(err)?;
        let meta = txn.open_table(META).map_err(err)?;
        read_offset(&meta)
    }

    /// The stored rows of `keys`, in order.
    pub fn get_many(&self, keys: &[&[u8]]) -> KvResult<Vec<Option<Vec<u8>>>> {
        let txn = self.db.begin_read().map_err(err)?;
        let rows = txn.open_table(ROWS).map_err(err)?;
        keys.iter()
            .map(|k| Ok(rows.get(*k).map_err(err)?.map(|v| v.value().to_vec())))
            .collect()
    }

    /// Runs `f` over the stored rows of `keys`, in order, borrowed from one read transaction
    /// (no copies: for lookups that decode them straight away).
    pub fn with_rows<R>(
        &self,
        keys: &[&[u8]],
        f: impl FnOnce(&[Option<&[u8]>]) -> KvResult<R>,
    ) -> KvResult<R> {
        let txn = self.db.begin_read().map_err(err)?;
        let rows = txn.open_table(ROWS).map_err(err)?;
        let guards = keys
            .iter()
            .map(|k| rows.get(*k).map_err(err))
            .collect::<KvResult<Vec<_>>>()?;
        let values: Vec<Option<&[u8]>> = guards
            .iter()
            .map(|g| g.as_ref().map(redb::AccessGuard::value))
            .collect();
        f(&values)
    }

    /// Applies the changes of the changelog up to `next_offset` (exclusive).
    pub fn apply(&self, puts: &[KeyChange], next_offset: u64) -> KvResult<()> {
        self.apply_all(&[puts], next_offset)
    }

    /// Applies several writes' changes, in order, in one transaction.
    pub fn apply_all(&self, writes: &[&[KeyChange]], next_offset: u64) -> KvResult<()> {
        let mut txn = self.db.begin_write().map_err(err)?;
        let sync = {
            let mut last = self.last_sync.lock().expect("sync lock");
            let due = last.elapsed() >= self.sync_interval;
            if due {
                *last = Instant::now();
            }
            due
        };
        txn.set_durability(if sync {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(|e| KvError::Store(e.to_string()))?;
        {
            let mut rows = txn.open_table(ROWS).map_err(err)?;
            for (key, value) in writes.iter().flat_map(|w| w.iter()) {
                match value {
                    Some(v) => {
                        rows.insert(key.as_slice(), v.as_slice()).map_err(err)?;
                    }
                    None => {
                        rows.remove(key.as_slice()).map_err(err)?;
                    }
                }
            }
            let mut meta = txn.open_table(META).map_err(err)?;
            meta.insert(NEXT_OFFSET, next_offset.to_le_bytes().as_slice())
                .map_err(err)?;
        }
        txn.commit().map_err(err)?;
        Ok(())
    }

    /// Forces the copy to disk (before a snapshot or a graceful close).
    pub fn sync(&self) -> KvResult<()> {
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| KvError::Store(e.to_string()))?;
        txn.commit().map_err(err)?;
        *self.last_sync.lock().expect("sync lock") = Instant::now();
        Ok(())
    }

    /// Removes every row and sets the offset (before loading a KV snapshot).
    pub fn reset(&self, next_offset: u64) -> KvResult<()> {
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| KvError::Store(e.to_string()))?;
        txn.delete_table(ROWS).map_err(err)?;
        {
            txn.open_table(ROWS).map_err(err)?;
            let mut meta = txn.open_table(META).map_err(err)?;
            meta.insert(NEXT_OFFSET, next_offset.to_le_bytes().as_slice())
                .map_err(err)?;
        }
        txn.commit().map_err(err)?;
        Ok(())
    }

    /// A consistent view for scans.
    pub fn snapshot(&self) -> KvResult<StoreSnapshot> {
        let txn = self.db.begin_read().map_err(err)?;
        let next_offset = read_offset(&txn.open_table(META).map_err(err)?)?;
        Ok(StoreSnapshot { txn, next_offset })
    }
}

fn read_offset(meta: &impl ReadableTable<&'static str, &'static [u8]>) -> KvResult<u64> {
    match meta.get(NEXT_OFFSET).map_err(err)? {
        None => Ok(0),
        Some(v) => {
            let bytes: [u8; 8] = v
                .value()
                .try_into()
                .map_err(|_| KvError::Store("a damaged offset".into()))?;
            Ok(u64::from_le_bytes(bytes))
        }
    }
}

impl StoreSnapshot {
    /// Rows from `from` (inclusive) in key order, at most `limit`; keys starting with
    /// `prefix` only when given.
    pub fn scan(
        &self,
        from: &[u8],
        prefix: Option<&[u8]>,
        limit: usize,
    ) -> KvResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let rows = self.txn.open_table(ROWS).map_err(err)?;
        let mut out = Vec::new();
        for entry in rows.range(from..).map_err(err)? {
            if out.len() >= limit {
                break;
            }
            let (k, v) = entry.map_err(err)?;
            if prefix.is_some_and(|p| !k.value().starts_with(p)) {
                break;
            }
            out.push((k.value().to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Number of rows.
    pub fn len(&self) -> KvResult<u64> {
        self.txn.open_table(ROWS).map_err(err)?.len().map_err(err)
    }

    pub fn is_empty(&self) -> KvResult<bool> {
        Ok(self.len()? == 0)
    }
}
