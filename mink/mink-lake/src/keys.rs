//! Where each live key of a primary-key lake table is: its data file and row position, as of
//! one snapshot (docs/design/0002-primary-key-tables-in-the-lake.md).
//!
//! A tiering round needs the lake location of every key it changes, to write the position
//! delete of the key's previous row. The index answers that with lookups. It is a cache of the
//! lake, kept on the node that runs the table's rounds (a redb file under the node's KV
//! directory, or memory): before a round it catches up from the snapshot it reflects to the
//! round's base by reading only what each snapshot in between changed (the key columns of the
//! data files it added, its position deletes, the files it removed), so a round costs what it
//! changes, not the size of the table. An index with no usable snapshot (a new node, a
//! failover, an ancestor expired, another table of the same name) is rebuilt from the live
//! files once. Nothing in it needs restoring: losing it costs one rebuild.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, Schema as ArrowSchema};
use arrow::row::{RowConverter, SortField};
use futures::TryStreamExt as _;
use iceberg::scan::FileScanTask;
use iceberg::spec::{DataContentType, ManifestStatus};
use iceberg::table::Table;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::{Lake, LakeError, LakeResult};

/// `identity` and `snapshot` (i64, little-endian) of the index.
const META: TableDefinition<'static, &str, &[u8]> = TableDefinition::new("meta");
/// Data file path → its number in the index.
const FILES: TableDefinition<'static, &str, u64> = TableDefinition::new("files");
const PATHS: TableDefinition<'static, u64, &str> = TableDefinition::new("paths");
/// Encoded key → (file number, row position).
const KEYS: TableDefinition<'static, &[u8], (u64, u64)> = TableDefinition::new("keys");
/// (file number, row position) → encoded key: what a position delete or a removed file drops.
const ROWS: TableDefinition<'static, (u64, u64), &[u8]> = TableDefinition::new("rows");
const IDENTITY: &str = "identity";
const SNAPSHOT: &str = "snapshot";
/// Bumped when the key encoding or the tables change: an index of another format is rebuilt.
const FORMAT: &str = "mink-lake-keys-1";

fn err(e: impl std::fmt::Display) -> LakeError {
    LakeError::Iceberg(format!("key index: {e}"))
}

fn redb_err(e: impl Into<redb::Error>) -> LakeError {
    err(e.into())
}

/// A primary-key table's key columns, encoded as comparable bytes (the same bytes whether the
/// rows come from the changelog or from a lake file).
pub(crate) struct KeyCodec {
    key: Vec<String>,
    types: Vec<DataType>,
    converter: RowConverter,
}

impl KeyCodec {
    /// The codec of key columns `key` typed as in the lake schema `lake`.
    pub(crate) fn new(lake: &ArrowSchema, key: &[String]) -> LakeResult<Self> {
        let types: Vec<DataType> = key
            .iter()
            .map(|k| {
                lake.field_with_name(k)
                    .map(|f| f.data_type().clone())
                    .map_err(|_| LakeError::Incompatible {
                        column: k.clone(),
                        reason: "the lake table lacks this primary-key column".into(),
                    })
            })
            .collect::<LakeResult<_>>()?;
        let converter =
            RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())
                .map_err(err)?;
        Ok(KeyCodec {
            key: key.to_vec(),
            types,
            converter,
        })
    }

    /// Each row's key of `batch` (which holds the key columns, in any castable type).
    pub(crate) fn encode(&self, batch: &RecordBatch) -> LakeResult<Vec<Vec<u8>>> {
        let columns: Vec<ArrayRef> = self
            .key
            .iter()
            .zip(&self.types)
            .map(|(k, t)| {
                let c = batch
                    .column_by_name(k)
                    .ok_or_else(|| err(format!("rows without key column {k}")))?;
                arrow::compute::cast(c, t).map_err(err)
            })
            .collect::<LakeResult<_>>()?;
        let rows = self.converter.convert_columns(&columns).map_err(err)?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    }

    fn columns(&self) -> Vec<&str> {
        self.key.iter().map(String::as_str).collect()
    }
}

/// What one snapshot (or, for a rebuild, one live file) changed in the live rows.
#[derive(Debug, Default)]
pub(crate) struct RowChanges {
    /// Data files no longer live: their rows leave the index.
    removed_files: Vec<String>,
    /// Rows deleted by position: (data file, position).
    deleted: Vec<(String, i64)>,
    /// Rows added: the data file, and each row's key and position.
    added: Vec<(String, Vec<KeyAt>)>,
}

/// A row's encoded key and its position in its data file.
type KeyAt = (Vec<u8>, i64);

/// The key-location index of one lake table (see the module doc).
pub(crate) struct KeyIndex {
    db: Database,
}

impl std::fmt::Debug for KeyIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyIndex").finish_non_exhaustive()
    }
}

fn as_u64(pos: i64) -> LakeResult<u64> {
    u64::try_from(pos).map_err(err)
}

impl KeyIndex {
    /// The index at `path` (in memory for `None`), created if missing.
    fn open(path: Option<&Path>) -> LakeResult<Self> {
        let db = match path {
            None => redb::Builder::new()
                .create_with_backend(redb::backends::InMemoryBackend::new())
                .map_err(redb_err)?,
            Some(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| err(format!("{}: {e}", dir.display())))?;
                }
                match Database::create(path) {
                    Ok(db) => db,
                    Err(e) => {
                        // A file that does not open is a cache lost: start again.
                        tracing::warn!(path = %path.display(), error = %e, "key index does not open; rebuilding");
                        let _ = std::fs::remove_file(path);
                        Database::create(path).map_err(redb_err)?
                    }
                }
            }
        };
        Ok(KeyIndex { db })
    }

    fn meta(&self, name: &str) -> LakeResult<Option<Vec<u8>>> {
        let txn = self.db.begin_read().map_err(redb_err)?;
        let meta = match txn.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(redb_err(e)),
        };
        Ok(meta
            .get(name)
            .map_err(redb_err)?
            .map(|v| v.value().to_vec()))
    }

    /// The snapshot whose live rows the index holds (`None`: none yet, or being rebuilt).
    fn snapshot(&self) -> LakeResult<Option<i64>> {
        Ok(self
            .meta(SNAPSHOT)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(i64::from_le_bytes))
    }

    /// Empties the index (no snapshot) for `identity`.
    fn reset(&self, identity: &str) -> LakeResult<()> {
        let mut txn = self.db.begin_write().map_err(redb_err)?;
        txn.set_durability(Durability::Immediate).map_err(err)?;
        {
            txn.delete_table(META).map_err(redb_err)?;
            txn.delete_table(FILES).map_err(redb_err)?;
            txn.delete_table(PATHS).map_err(redb_err)?;
            txn.delete_table(KEYS).map_err(redb_err)?;
            txn.delete_table(ROWS).map_err(redb_err)?;
            let mut meta = txn.open_table(META).map_err(redb_err)?;
            meta.insert(IDENTITY, identity.as_bytes())
                .map_err(redb_err)?;
        }
        txn.commit().map_err(redb_err)
    }

    /// The location (data file, position) of each of `keys`, `None` for a key the lake does
    /// not hold.
    pub(crate) fn locate(&self, keys: &[&[u8]]) -> LakeResult<Vec<Option<(String, i64)>>> {
        let txn = self.db.begin_read().map_err(redb_err)?;
        let (index, paths) = match (txn.open_table(KEYS), txn.open_table(PATHS)) {
            (Ok(k), Ok(p)) => (k, p),
            (Err(redb::TableError::TableDoesNotExist(_)), _)
            | (_, Err(redb::TableError::TableDoesNotExist(_))) => {
                return Ok(vec![None; keys.len()]);
            }
            (Err(e), _) | (_, Err(e)) => return Err(redb_err(e)),
        };
        let mut names: HashMap<u64, String> = HashMap::new();
        keys.iter()
            .map(|k| {
                let Some(at) = index.get(*k).map_err(redb_err)? else {
                    return Ok(None);
                };
                let (file, pos) = at.value();
                if let std::collections::hash_map::Entry::Vacant(e) = names.entry(file) {
                    let path = paths
                        .get(file)
                        .map_err(redb_err)?
                        .ok_or_else(|| err(format!("file number {file} without a path")))?;
                    e.insert(path.value().to_string());
                }
                Ok(Some((
                    names[&file].clone(),
                    i64::try_from(pos).map_err(err)?,
                )))
            })
            .collect()
    }

    /// Applies `changes` (removed files, then deleted rows, then added rows) in one
    /// transaction, and records `snapshot` as the one the index now reflects if given.
    fn apply(&self, changes: &RowChanges, snapshot: Option<i64>) -> LakeResult<()> {
        let mut txn = self.db.begin_write().map_err(redb_err)?;
        // Only the commit naming a snapshot must survive a crash: an index that lost the
        // others reflects an older snapshot, or none, and catches up or rebuilds.
        txn.set_durability(if snapshot.is_some() {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(err)?;
        {
            let mut files = txn.open_table(FILES).map_err(redb_err)?;
            let mut paths = txn.open_table(PATHS).map_err(redb_err)?;
            let mut keys = txn.open_table(KEYS).map_err(redb_err)?;
            let mut rows = txn.open_table(ROWS).map_err(redb_err)?;
            for path in &changes.removed_files {
                let Some(file) = files.remove(path.as_str()).map_err(redb_err)? else {
                    continue;
                };
                let file = file.value();
                paths.remove(file).map_err(redb_err)?;
                let gone: Vec<(u64, Vec<u8>)> = rows
                    .extract_from_if((file, 0)..=(file, u64::MAX), |_, _| true)
                    .map_err(redb_err)?
                    .map(|r| r.map(|(at, key)| (at.value().1, key.value().to_vec())))
                    .collect::<Result<_, _>>()
                    .map_err(redb_err)?;
                for (pos, key) in gone {
                    // The key may have moved on already (a later row in another file).
                    let here = keys
                        .get(key.as_slice())
                        .map_err(redb_err)?
                        .map(|v| v.value());
                    if here == Some((file, pos)) {
                        keys.remove(key.as_slice()).map_err(redb_err)?;
                    }
                }
            }
            for (path, pos) in &changes.deleted {
                let Some(file) = files
                    .get(path.as_str())
                    .map_err(redb_err)?
                    .map(|v| v.value())
                else {
                    continue;
                };
                let at = (file, as_u64(*pos)?);
                let Some(key) = rows
                    .remove(at)
                    .map_err(redb_err)?
                    .map(|k| k.value().to_vec())
                else {
                    continue;
                };
                let here = keys
                    .get(key.as_slice())
                    .map_err(redb_err)?
                    .map(|v| v.value());
                if here == Some(at) {
                    keys.remove(key.as_slice()).map_err(redb_err)?;
                }
            }
            // Numbers are never reused while the index lives: a removed file's rows are gone.
            let mut next = paths
                .last()
                .map_err(redb_err)?
                .map_or(0, |l| l.0.value() + 1);
            for (path, added) in &changes.added {
                let known = files
                    .get(path.as_str())
                    .map_err(redb_err)?
                    .map(|f| f.value());
                let file = match known {
                    Some(f) => f,
                    None => {
                        let f: u64 = next;
                        next += 1;
                        files.insert(path.as_str(), f).map_err(redb_err)?;
                        paths.insert(f, path.as_str()).map_err(redb_err)?;
                        f
                    }
                };
                for (key, pos) in added {
                    let at = (file, as_u64(*pos)?);
                    if let Some(before) = keys
                        .insert(key.as_slice(), at)
                        .map_err(redb_err)?
                        .map(|v| v.value())
                        && before != at
                    {
                        rows.remove(before).map_err(redb_err)?;
                    }
                    rows.insert(at, key.as_slice()).map_err(redb_err)?;
                }
            }
            if let Some(id) = snapshot {
                let mut meta = txn.open_table(META).map_err(redb_err)?;
                meta.insert(SNAPSHOT, id.to_le_bytes().as_slice())
                    .map_err(redb_err)?;
            }
        }
        txn.commit().map_err(redb_err)
    }

    /// Forgets the snapshot the index reflects (before a rebuild refills it).
    fn clear(&self) -> LakeResult<()> {
        let identity = self
            .meta(IDENTITY)?
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default();
        self.reset(&identity)
    }
}

/// The file name of `database.table`'s index: the names hex-encoded (any character is safe).
fn index_file(database: &str, table: &str) -> String {
    let mut name = String::new();
    for b in database.bytes().chain([0]).chain(table.bytes()) {
        name.push_str(&format!("{b:02x}"));
    }
    format!("{name}.redb")
}

/// The key columns `names` of the Parquet file `bytes`, whole.
pub(crate) fn read_columns(bytes: bytes::Bytes, names: &[&str]) -> LakeResult<Vec<RecordBatch>> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(err)?;
    let schema = builder.parquet_schema();
    let leaves: Vec<usize> = names
        .iter()
        .map(|n| {
            (0..schema.num_columns())
                .find(|&i| schema.column(i).path().string() == *n)
                .ok_or_else(|| err(format!("a lake file without column {n}")))
        })
        .collect::<LakeResult<_>>()?;
    let mask = ProjectionMask::leaves(schema, leaves);
    builder
        .with_projection(mask)
        .build()
        .map_err(err)?
        .map(|b| b.map_err(err))
        .collect()
}

/// The (data file, position) pairs of position-delete file `path`.
async fn position_deletes(table: &Table, path: &str) -> LakeResult<Vec<(String, i64)>> {
    let bytes = table.file_io().new_input(path)?.read().await?;
    let mut entries = Vec::new();
    for b in read_columns(bytes, &["file_path", "pos"])? {
        let paths = b.column(0).as_string::<i32>();
        let pos = b.column(1).as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            entries.push((paths.value(r).to_string(), pos.value(r)));
        }
    }
    Ok(entries)
}

/// One table's index, shared: rounds of the table take it in turn.
pub(crate) type SharedIndex = Arc<tokio::sync::Mutex<KeyIndex>>;

impl Lake {
    /// Keeps the key-location indexes of primary-key tables in files under `dir` (a node's
    /// cache directory) instead of memory, so they outlive the process.
    pub fn with_key_index_dir(mut self, dir: PathBuf) -> Lake {
        self.key_index_dir = Some(dir);
        self
    }

    /// How many lake data files this lake has read the key columns of to index them (a
    /// rebuild reads every live file; catching up, those added since).
    pub fn key_files_read(&self) -> u64 {
        self.key_files_read.load(Ordering::Relaxed)
    }

    /// Drops the indexes (open and on disk) of every table not in `keep` (database, table):
    /// tables dropped, or no longer tiered here.
    pub fn retain_key_indexes(&self, keep: &HashSet<(String, String)>) {
        let mut open = self.key_indexes.lock().expect("key indexes");
        open.retain(|k, _| keep.contains(k));
        let Some(dir) = &self.key_index_dir else {
            return;
        };
        let wanted: HashSet<String> = keep.iter().map(|(d, t)| index_file(d, t)).collect();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".redb") && !wanted.contains(&name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// The index of primary-key table `database.table`, held, and caught up to `base`'s current
    /// snapshot. A `base` loaded before another round committed (the index reflects a
    /// snapshot `base` does not know) is loaded again first.
    pub(crate) async fn key_index(
        &self,
        database: &str,
        name: &str,
        base: &mut Table,
        codec: &KeyCodec,
    ) -> LakeResult<tokio::sync::OwnedMutexGuard<KeyIndex>> {
        let shared = {
            let mut open = self.key_indexes.lock().expect("key indexes");
            let key = (database.to_string(), name.to_string());
            match open.get(&key) {
                Some(i) => Arc::clone(i),
                None => {
                    let path = self
                        .key_index_dir
                        .as_ref()
                        .map(|d| d.join(index_file(database, name)));
                    let index = Arc::new(tokio::sync::Mutex::new(KeyIndex::open(path.as_deref())?));
                    open.insert(key, Arc::clone(&index));
                    index
                }
            }
        };
        let index = shared.lock_owned().await;
        if let Some(at) = index.snapshot()?
            && base.metadata().snapshot_by_id(at).is_none()
        {
            *base = self.load_table(database, name).await?;
        }
        // Another table of the name (dropped and created again), or another format: rebuilt.
        let identity = format!(
            "{FORMAT} {} {}",
            base.metadata().uuid(),
            codec.key.join(",")
        );
        if index.meta(IDENTITY)?.as_deref() != Some(identity.as_bytes()) {
            index.reset(&identity)?;
        }
        self.catch_up(base, &index, codec).await?;
        Ok(index)
    }

    /// Brings `index` to `table`'s current snapshot: the changes of each snapshot after the
    /// one it reflects, or a rebuild when that one is not an ancestor any more.
    pub(crate) async fn catch_up(
        &self,
        table: &Table,
        index: &KeyIndex,
        codec: &KeyCodec,
    ) -> LakeResult<()> {
        let metadata = table.metadata();
        let at = index.snapshot()?;
        let target = metadata.current_snapshot_id();
        if at == target {
            return Ok(());
        }
        let Some(target) = target else {
            return index.clear();
        };
        // The snapshots after `at`, newest first, if `at` is an ancestor of the target.
        let mut chain = Vec::new();
        let mut cursor = Some(target);
        while let Some(id) = cursor {
            if Some(id) == at {
                break;
            }
            chain.push(id);
            cursor = metadata
                .snapshot_by_id(id)
                .and_then(|s| s.parent_snapshot_id());
        }
        if at.is_none() || cursor.is_none() {
            return self.rebuild(table, index, codec, target).await;
        }
        for id in chain.into_iter().rev() {
            let changes = self.snapshot_changes(table, id, codec).await?;
            index.apply(&changes, Some(id))?;
        }
        Ok(())
    }

    /// What snapshot `id` of `table` changed: the data files it added (their keys read), the
    /// position deletes it added, the data files it removed.
    async fn snapshot_changes(
        &self,
        table: &Table,
        id: i64,
        codec: &KeyCodec,
    ) -> LakeResult<RowChanges> {
        let snapshot = table
            .metadata()
            .snapshot_by_id(id)
            .ok_or_else(|| err(format!("snapshot {id} is gone")))?;
        let list = table.manifest_list_reader(snapshot).load().await?;
        let mut changes = RowChanges::default();
        for manifest_file in list.entries() {
            if manifest_file.added_snapshot_id != id {
                continue;
            }
            let manifest = manifest_file.load_manifest(table.file_io()).await?;
            for entry in manifest.entries() {
                if entry
                    .snapshot_id()
                    .unwrap_or(manifest_file.added_snapshot_id)
                    != id
                {
                    continue;
                }
                let path = entry.file_path();
                match (entry.status(), entry.content_type()) {
                    (ManifestStatus::Added, DataContentType::Data) => {
                        let keys = self.file_keys(table, path, codec, &HashSet::new()).await?;
                        changes.added.push((path.to_string(), keys));
                    }
                    (ManifestStatus::Added, DataContentType::PositionDeletes) => {
                        changes.deleted.extend(position_deletes(table, path).await?);
                    }
                    (ManifestStatus::Added, DataContentType::EqualityDeletes) => {
                        return Err(equality_deletes(path));
                    }
                    (ManifestStatus::Deleted, DataContentType::Data) => {
                        changes.removed_files.push(path.to_string());
                    }
                    _ => {}
                }
            }
        }
        Ok(changes)
    }

    /// Refills `index` from the live rows of snapshot `target` (the table's current one).
    async fn rebuild(
        &self,
        table: &Table,
        index: &KeyIndex,
        codec: &KeyCodec,
        target: i64,
    ) -> LakeResult<()> {
        index.clear()?;
        let tasks: Vec<FileScanTask> = table
            .scan()
            .snapshot_id(target)
            .build()?
            .plan_files()
            .await?
            .try_collect()
            .await?;
        let mut delete_files: HashMap<String, Vec<(String, i64)>> = HashMap::new();
        for task in tasks {
            let mut deleted: HashSet<i64> = HashSet::new();
            for d in &task.deletes {
                if d.file_type != DataContentType::PositionDeletes {
                    return Err(equality_deletes(&d.file_path));
                }
                if !delete_files.contains_key(&d.file_path) {
                    let entries = position_deletes(table, &d.file_path).await?;
                    delete_files.insert(d.file_path.clone(), entries);
                }
                deleted.extend(
                    delete_files[&d.file_path]
                        .iter()
                        .filter(|(p, _)| *p == task.data_file_path)
                        .map(|(_, pos)| *pos),
                );
            }
            let keys = self
                .file_keys(table, &task.data_file_path, codec, &deleted)
                .await?;
            let file = RowChanges {
                added: vec![(task.data_file_path.clone(), keys)],
                ..RowChanges::default()
            };
            index.apply(&file, None)?;
        }
        index.apply(&RowChanges::default(), Some(target))
    }

    /// The key and position of every row of data file `path` not in `deleted`.
    async fn file_keys(
        &self,
        table: &Table,
        path: &str,
        codec: &KeyCodec,
        deleted: &HashSet<i64>,
    ) -> LakeResult<Vec<KeyAt>> {
        let bytes = table.file_io().new_input(path)?.read().await?;
        self.key_files_read.fetch_add(1, Ordering::Relaxed);
        let mut keys = Vec::new();
        let mut pos = 0i64;
        for b in read_columns(bytes, &codec.columns())? {
            for (r, k) in codec.encode(&b)?.into_iter().enumerate() {
                let here = pos + i64::try_from(r).map_err(err)?;
                if !deleted.contains(&here) {
                    keys.push((k, here));
                }
            }
            pos += i64::try_from(b.num_rows()).map_err(err)?;
        }
        Ok(keys)
    }
}

fn equality_deletes(path: &str) -> LakeError {
    err(format!(
        "{path} holds equality deletes: Mink writes and reads position deletes only"
    ))
}
