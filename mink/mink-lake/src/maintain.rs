//! Keeping a lake table small and readable while tiering keeps appending to it: compaction of
//! small data files, expiry of old snapshots, removal of files no snapshot references.
//!
//! - **Compaction** rewrites a partition's small files into few large ones, rows sorted by
//!   `(__bucket, __offset)` (so a bucket's rows are contiguous and row groups prune by bucket),
//!   as one `replace` snapshot that carries the tiered offsets over. A tiering round that
//!   commits meanwhile does not void it: the replace is rebuilt on the new head as long as
//!   every file it removes is still live there.
//! - **Expiry** drops snapshots older than an age from the metadata, except the current one,
//!   heads of branches and tags, and the snapshots a caller still reads (`keep`: the one the
//!   command log records).
//! - **Orphan removal** deletes files below the table's location that no snapshot, manifest or
//!   metadata version references and that are older than an age (younger ones may belong to a
//!   commit in flight). It refuses a table whose files live outside this node's object store.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::SortColumn;
use futures::TryStreamExt as _;
use iceberg::scan::FileScanTask;
use iceberg::spec::{Operation, TableMetadataBuilder};

use crate::commit::NewSnapshot;
use crate::table::{BUCKET_COLUMN, OFFSET_COLUMN};
use crate::{Lake, LakeError, LakeResult};

/// How a lake table is kept.
#[derive(Clone, Debug)]
pub struct Maintenance {
    /// Data files smaller than this are compacted.
    pub small_file_bytes: u64,
    /// A partition is compacted once it has this many small files.
    pub min_files: usize,
    /// Bytes of small files read into one output at most (they are sorted in memory).
    pub max_input_bytes: u64,
    /// Snapshots older than this many milliseconds are expired.
    pub snapshot_age_ms: i64,
    /// Unreferenced files older than this many milliseconds are removed.
    pub orphan_age_ms: i64,
    /// Whether [`Lake::maintain`] compacts.
    pub compact: bool,
    /// Whether [`Lake::maintain`] expires snapshots and removes orphan files.
    pub expire: bool,
}

impl Default for Maintenance {
    fn default() -> Self {
        Maintenance {
            small_file_bytes: 32 << 20,
            min_files: 8,
            max_input_bytes: 128 << 20,
            snapshot_age_ms: 60 * 60 * 1000,
            orphan_age_ms: 60 * 60 * 1000,
            compact: true,
            expire: true,
        }
    }
}

/// What one compaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compacted {
    pub snapshot_id: i64,
    pub files_removed: usize,
    pub files_added: usize,
    pub rows: u64,
}

/// Files a compaction wrote and the files they replace, before the commit.
#[derive(Clone, Debug, Default)]
pub struct Rewrite {
    /// The snapshot the files were read from.
    base_snapshot_id: Option<i64>,
    added: Vec<iceberg::spec::DataFile>,
    removed: HashSet<String>,
    rows: u64,
}

/// What [`Lake::maintain`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Maintained {
    pub compacted: Option<Compacted>,
    pub snapshots_expired: Vec<i64>,
    pub orphans_removed: Vec<String>,
}

fn err(e: impl std::fmt::Display) -> LakeError {
    LakeError::Iceberg(e.to_string())
}

/// Rows sorted by `(__bucket, __offset)` when the table has them.
fn sorted(batch: RecordBatch) -> LakeResult<RecordBatch> {
    let (Some(bucket), Some(offset)) = (
        batch.column_by_name(BUCKET_COLUMN),
        batch.column_by_name(OFFSET_COLUMN),
    ) else {
        return Ok(batch);
    };
    let keys = [bucket, offset].map(|c| SortColumn {
        values: Arc::clone(c),
        options: None,
    });
    let indices = arrow::compute::lexsort_to_indices(&keys, None).map_err(err)?;
    arrow::compute::take_record_batch(&batch, &indices).map_err(err)
}

impl Lake {
    /// Compacts, expires snapshots older than `policy.snapshot_age_ms` before `now_ms` (but
    /// not `keep`), then removes orphans older than `policy.orphan_age_ms`.
    pub async fn maintain(
        &self,
        database: &str,
        table: &str,
        policy: &Maintenance,
        now_ms: i64,
        keep: &[i64],
    ) -> LakeResult<Maintained> {
        let compacted = match policy.compact {
            true => self.compact(database, table, policy).await?,
            false => None,
        };
        let mut keep = keep.to_vec();
        keep.extend(compacted.as_ref().map(|c| c.snapshot_id));
        let (snapshots_expired, orphans_removed) = if policy.expire {
            (
                self.expire_snapshots(database, table, now_ms - policy.snapshot_age_ms, &keep)
                    .await?,
                self.remove_orphans(database, table, now_ms - policy.orphan_age_ms)
                    .await?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(Maintained {
            compacted,
            snapshots_expired,
            orphans_removed,
        })
    }

    /// Rewrites the small data files of every partition that has at least `policy.min_files`
    /// of them into large ones, and every partition with position deletes into files without
    /// (deletes applied, the delete files removed), in one `replace` snapshot. `None` when
    /// nothing qualifies.
    pub async fn compact(
        &self,
        database: &str,
        table: &str,
        policy: &Maintenance,
    ) -> LakeResult<Option<Compacted>> {
        match self.rewrite_small_files(database, table, policy).await? {
            Some(rewrite) => Ok(Some(self.commit_rewrite(database, table, &rewrite).await?)),
            None => Ok(None),
        }
    }

    /// The first half of [`Lake::compact`]: the small files chosen and rewritten, not yet
    /// committed.
    pub async fn rewrite_small_files(
        &self,
        database: &str,
        table: &str,
        policy: &Maintenance,
    ) -> LakeResult<Option<Rewrite>> {
        let base = self.load_table(database, table).await?;
        if base.metadata().current_snapshot().is_none() {
            return Ok(None);
        }
        let tasks: Vec<FileScanTask> = base
            .scan()
            .build()?
            .plan_files()
            .await?
            .try_collect()
            .await?;
        let mut by_partition: BTreeMap<String, Vec<FileScanTask>> = BTreeMap::new();
        for task in tasks {
            by_partition
                .entry(format!("{:?}", task.partition))
                .or_default()
                .push(task);
        }
        let mut rewrite = Rewrite {
            base_snapshot_id: base.metadata().current_snapshot_id(),
            ..Rewrite::default()
        };
        for (_, mut group) in by_partition {
            group.sort_by(|a, b| a.data_file_path.cmp(&b.data_file_path));
            let deletes: HashSet<String> = group
                .iter()
                .flat_map(|t| t.deletes.iter().map(|d| d.file_path.clone()))
                .collect();
            let had_deletes = !deletes.is_empty();
            let group: Vec<FileScanTask> = if deletes.is_empty() {
                let small: Vec<FileScanTask> = group
                    .into_iter()
                    .filter(|t| t.file_size_in_bytes < policy.small_file_bytes)
                    .collect();
                if small.len() < policy.min_files.max(2) {
                    continue;
                }
                let mut input = 0;
                small
                    .into_iter()
                    .take_while(|t| {
                        input += t.file_size_in_bytes;
                        input <= policy.max_input_bytes
                    })
                    .collect()
            } else {
                // Deletes fold into the data: every data file of the partition is rewritten
                // (a delete file may point into any of them), and every delete file goes.
                let input: u64 = group.iter().map(|t| t.file_size_in_bytes).sum();
                let equality = group.iter().any(|t| {
                    t.deletes
                        .iter()
                        .any(|d| d.file_type != iceberg::spec::DataContentType::PositionDeletes)
                });
                if input > policy.max_input_bytes || equality {
                    continue;
                }
                rewrite.removed.extend(deletes);
                group
            };
            if group.len() < 2 && !had_deletes {
                continue;
            }
            rewrite
                .removed
                .extend(group.iter().map(|t| t.data_file_path.clone()));
            let tasks = Box::pin(futures::stream::iter(group.into_iter().map(Ok)));
            let batches: Vec<RecordBatch> = base
                .reader_builder()
                .build()
                .read(tasks)?
                .stream()
                .try_collect()
                .await?;
            let Some(first) = batches.first() else {
                continue;
            };
            let all = arrow::compute::concat_batches(&first.schema(), &batches).map_err(err)?;
            rewrite.rows += all.num_rows() as u64;
            rewrite
                .added
                .extend(self.write_data_files(&base, vec![sorted(all)?]).await?);
        }
        Ok((!rewrite.removed.is_empty()).then_some(rewrite))
    }

    /// The second half of [`Lake::compact`]: commits `rewrite` as a `replace` snapshot on the
    /// table's head, which tiering may have moved since the rewrite began (the rewritten
    /// files are still live there: nothing else removes files). [`LakeError::FileGone`] when
    /// a rewritten file is no longer live (another compaction got there first).
    pub async fn commit_rewrite(
        &self,
        database: &str,
        table: &str,
        rewrite: &Rewrite,
    ) -> LakeResult<Compacted> {
        let mut attempts = 0;
        let committed = loop {
            let head = self.load_table(database, table).await?;
            // A rewrite holds the rows as of its base: a delete committed since may point at
            // a row it copied, so it must not land on top of one.
            let mut at = head.metadata().current_snapshot();
            while let Some(s) = at.filter(|s| Some(s.snapshot_id()) != rewrite.base_snapshot_id) {
                let added_deletes = s
                    .summary()
                    .additional_properties
                    .get("added-delete-files")
                    .is_some_and(|n| n != "0");
                if added_deletes {
                    return Err(LakeError::Conflict(format!(
                        "snapshot {} added deletes after the rewrite read its files",
                        s.snapshot_id()
                    )));
                }
                at = s
                    .parent_snapshot_id()
                    .and_then(|p| head.metadata().snapshot_by_id(p));
            }
            let new = NewSnapshot {
                added: rewrite.added.clone(),
                removed: rewrite.removed.clone(),
                properties: Default::default(),
                unset: HashSet::new(),
            };
            match self.commit_snapshot(&head, Operation::Replace, new).await {
                // The head moved between loading and the compare-and-set: try on the new one.
                Err(LakeError::Conflict(_)) if attempts < 3 => {
                    attempts += 1;
                }
                other => break other?,
            }
        };
        let snapshot_id = committed
            .metadata()
            .current_snapshot_id()
            .ok_or_else(|| err("a commit without a snapshot"))?;
        Ok(Compacted {
            snapshot_id,
            files_removed: rewrite.removed.len(),
            files_added: rewrite.added.len(),
            rows: rewrite.rows,
        })
    }

    /// Removes snapshots committed before `older_than_ms` from the table's metadata, except
    /// the current one, the heads of its branches and tags, and `keep`. Returns their ids.
    pub async fn expire_snapshots(
        &self,
        database: &str,
        table: &str,
        older_than_ms: i64,
        keep: &[i64],
    ) -> LakeResult<Vec<i64>> {
        let base = self.load_table(database, table).await?;
        let metadata = base.metadata();
        let mut kept: HashSet<i64> = keep.iter().copied().collect();
        kept.extend(metadata.current_snapshot_id());
        // Heads of every ref (the metadata has no accessor for the list of refs).
        let json = serde_json::to_value(metadata).map_err(err)?;
        if let Some(refs) = json.get("refs").and_then(|r| r.as_object()) {
            kept.extend(
                refs.values()
                    .filter_map(|r| r.get("snapshot-id").and_then(|id| id.as_i64())),
            );
        }
        let expired: Vec<i64> = metadata
            .snapshots()
            .filter(|s| s.timestamp_ms() < older_than_ms && !kept.contains(&s.snapshot_id()))
            .map(|s| s.snapshot_id())
            .collect();
        if expired.is_empty() {
            return Ok(expired);
        }
        let location = base
            .metadata_location()
            .ok_or_else(|| err("a catalog table without a metadata location"))?;
        let builder =
            TableMetadataBuilder::new_from_metadata(metadata.clone(), Some(location.to_string()))
                .remove_snapshots(&expired);
        self.commit_metadata(&base, builder).await?;
        Ok(expired)
    }

    /// Deletes the files below the table's location that nothing in its metadata references
    /// and that were last modified before `older_than_ms`. Returns their URIs.
    pub async fn remove_orphans(
        &self,
        database: &str,
        table: &str,
        older_than_ms: i64,
    ) -> LakeResult<Vec<String>> {
        let base = self.load_table(database, table).await?;
        let metadata = base.metadata();
        let file_io = base.file_io();
        let mut live: HashSet<String> = HashSet::new();
        live.extend(base.metadata_location().map(str::to_string));
        live.extend(
            metadata
                .metadata_log()
                .iter()
                .map(|m| m.metadata_file.clone()),
        );
        live.extend(
            metadata
                .statistics_iter()
                .map(|s| s.statistics_path.clone()),
        );
        live.extend(
            metadata
                .partition_statistics_iter()
                .map(|s| s.statistics_path.clone()),
        );
        let mut manifests_seen = HashSet::new();
        for snapshot in metadata.snapshots() {
            live.insert(snapshot.manifest_list().to_string());
            let list = base.manifest_list_reader(snapshot).load().await?;
            for manifest in list.entries() {
                if !manifests_seen.insert(manifest.manifest_path.clone()) {
                    continue;
                }
                live.insert(manifest.manifest_path.clone());
                let entries = manifest.load_manifest(file_io).await?;
                live.extend(
                    entries
                        .entries()
                        .iter()
                        .filter(|e| e.is_alive())
                        .map(|e| e.file_path().to_string()),
                );
            }
        }
        let root = self.storage.root();
        if let Some(foreign) = live.iter().find(|p| !p.starts_with(root)) {
            return Err(LakeError::Iceberg(format!(
                "{database}.{table}: {foreign} is outside this node's object store ({root}); orphan files are not removed"
            )));
        }
        let mut removed = Vec::new();
        for (uri, modified_ms) in self.storage.list(metadata.location()).await? {
            if modified_ms < older_than_ms && !live.contains(&uri) {
                file_io.delete(&uri).await?;
                removed.push(uri);
            }
        }
        Ok(removed)
    }
}
