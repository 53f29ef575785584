//! Snapshots built by hand: files added and removed in one commit, on the catalog's
//! compare-and-set.
//!
//! iceberg-rust 0.10.1 commits appends only (its other snapshot actions, and the builder of
//! `TableCommit`, are crate-private). Compaction replaces files, and primary-key tiering adds
//! delete files, so both commit through [`Lake::commit_snapshot`], built on the public parts:
//! the manifest and manifest-list writers, `TableMetadataBuilder`, and the same
//! `UPDATE ... WHERE metadata_location = <old>` the SQL catalog (and pyiceberg) use. A commit
//! applies on the snapshot it was built on or not at all ([`LakeError::Conflict`]): the caller
//! decides whether its change still holds on the new head.

use std::collections::{HashMap, HashSet};
use std::str::FromStr as _;

use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, MAIN_BRANCH, ManifestContentType, ManifestFile,
    ManifestListWriter, ManifestWriterBuilder, Operation, Snapshot, SnapshotReference,
    SnapshotRetention, SnapshotSummaryCollector, Summary, TableMetadataBuilder,
};
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableIdent};

use crate::{CATALOG_NAME, Lake, LakeError, LakeResult};

/// A snapshot to commit on top of a table's current one.
#[derive(Debug, Default)]
pub(crate) struct NewSnapshot {
    /// Data and delete files the snapshot adds (by their content type).
    pub added: Vec<DataFile>,
    /// Paths of live files (data or delete) the snapshot removes. Each must be live in the
    /// base snapshot, or the commit fails with [`LakeError::FileGone`].
    pub removed: HashSet<String>,
    /// Summary properties: the base snapshot's `mink.*` properties are carried over (except
    /// those in `unset`), these are set on top.
    pub properties: HashMap<String, String>,
    pub unset: HashSet<String>,
}

/// The SQL catalog's table row, as iceberg-catalog-sql and pyiceberg keep it.
const CAS: &str = "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
     WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? \
     AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL) AND metadata_location = ?";

fn err(e: impl std::fmt::Display) -> LakeError {
    LakeError::Iceberg(e.to_string())
}

fn new_snapshot_id(table: &Table) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) >> 1) as i64;
        if table.metadata().snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

const TOTALS: [(&str, &str, &str); 5] = [
    ("total-data-files", "added-data-files", "deleted-data-files"),
    (
        "total-delete-files",
        "added-delete-files",
        "removed-delete-files",
    ),
    ("total-records", "added-records", "deleted-records"),
    ("total-files-size", "added-files-size", "removed-files-size"),
    (
        "total-position-deletes",
        "added-position-deletes",
        "removed-position-deletes",
    ),
];

impl Lake {
    /// Commits `new` on top of `base`'s current snapshot: `Ok` with the table as committed,
    /// [`LakeError::Conflict`] when the table moved since `base` was loaded, [`LakeError::FileGone`]
    /// when a removed file is no longer live. Files written for a failed commit are left to orphan removal.
    pub(crate) async fn commit_snapshot(
        &self,
        base: &Table,
        operation: Operation,
        new: NewSnapshot,
    ) -> LakeResult<Table> {
        let metadata = base.metadata();
        if metadata.format_version() != FormatVersion::V2 {
            return Err(LakeError::Iceberg(format!(
                "{}: Mink commits delete files and rewrites only to format version 2 tables (this one is {})",
                base.identifier(),
                metadata.format_version()
            )));
        }
        let base_location = base
            .metadata_location()
            .ok_or_else(|| err("a catalog table without a metadata location"))?
            .to_string();
        let file_io = base.file_io();
        let snapshot_id = new_snapshot_id(base);
        let sequence = metadata.next_sequence_number();
        let parent = metadata.current_snapshot();
        let schema = metadata.current_schema().clone();
        let spec = metadata.default_partition_spec().clone();
        let commit = uuid::Uuid::now_v7();
        let mut manifest_no = 0;
        let mut next_manifest = |content: ManifestContentType, spec_id: i32| -> LakeResult<_> {
            manifest_no += 1;
            let path = format!(
                "{}/metadata/{commit}-m{manifest_no}.avro",
                metadata.location()
            );
            let spec = metadata
                .partition_spec_by_id(spec_id)
                .ok_or_else(|| err(format!("no partition spec {spec_id}")))?;
            let builder = ManifestWriterBuilder::new(
                file_io.new_output(path)?,
                Some(snapshot_id),
                schema.clone(),
                spec.as_ref().clone(),
            );
            Ok(match content {
                ManifestContentType::Data => builder.build_v2_data(),
                ManifestContentType::Deletes => builder.build_v2_deletes(),
            })
        };

        let mut stats = SnapshotSummaryCollector::default();
        let mut manifests: Vec<ManifestFile> = Vec::new();
        let mut found: HashSet<&str> = HashSet::new();
        if let Some(parent) = parent {
            let list = base.manifest_list_reader(parent).load().await?;
            for manifest_file in list.entries() {
                if new.removed.is_empty() {
                    manifests.push(manifest_file.clone());
                    continue;
                }
                let manifest = manifest_file.load_manifest(file_io).await?;
                let touched = manifest
                    .entries()
                    .iter()
                    .any(|e| e.is_alive() && new.removed.contains(e.file_path()));
                if !touched {
                    manifests.push(manifest_file.clone());
                    continue;
                }
                // Rewritten: removed files marked deleted, the rest carried as existing.
                let mut writer =
                    next_manifest(manifest_file.content, manifest_file.partition_spec_id)?;
                let entry_spec = metadata
                    .partition_spec_by_id(manifest_file.partition_spec_id)
                    .cloned()
                    .unwrap_or_else(|| spec.clone());
                for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
                    let seq = entry
                        .sequence_number()
                        .ok_or_else(|| err("a live manifest entry without a sequence number"))?;
                    let file = entry.data_file().clone();
                    if let Some(path) = new.removed.get(entry.file_path()) {
                        found.insert(path.as_str());
                        stats.remove_file(&file, schema.clone(), entry_spec.clone());
                        writer.add_delete_file(file, seq, entry.file_sequence_number)?;
                    } else {
                        let added_by = entry
                            .snapshot_id()
                            .unwrap_or(manifest_file.added_snapshot_id);
                        writer.add_existing_file(
                            file,
                            added_by,
                            seq,
                            entry.file_sequence_number,
                        )?;
                    }
                }
                manifests.push(writer.write_manifest_file().await?);
            }
        }
        if let Some(gone) = new.removed.iter().find(|p| !found.contains(p.as_str())) {
            return Err(LakeError::FileGone(gone.clone()));
        }
        let (data, deletes): (Vec<&DataFile>, Vec<&DataFile>) = new
            .added
            .iter()
            .partition(|f| f.content_type() == DataContentType::Data);
        for (files, content) in [
            (data, ManifestContentType::Data),
            (deletes, ManifestContentType::Deletes),
        ] {
            if files.is_empty() {
                continue;
            }
            let mut writer = next_manifest(content, spec.spec_id())?;
            for f in files {
                stats.add_file(f, schema.clone(), spec.clone());
                // Sequence number inherited from the manifest list: this snapshot's.
                writer.add_file(f.clone(), -1)?;
            }
            manifests.push(writer.write_manifest_file().await?);
        }

        let list_path = format!(
            "{}/metadata/snap-{snapshot_id}-0-{commit}.avro",
            metadata.location()
        );
        let mut list = ManifestListWriter::v2(
            file_io.new_output(&list_path)?.writer().await?,
            snapshot_id,
            parent.map(|p| p.snapshot_id()),
            sequence,
        );
        list.add_manifests(manifests.into_iter())?;
        list.close().await?;

        let mut properties: HashMap<String, String> = parent
            .map(|p| {
                p.summary()
                    .additional_properties
                    .iter()
                    .filter(|(k, _)| k.starts_with("mink.") && !new.unset.contains(*k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        properties.extend(new.properties);
        let changes = stats.build();
        let number = |m: &HashMap<String, String>, k: &str| -> Option<u64> {
            m.get(k).and_then(|v| v.parse().ok())
        };
        for (total, added, removed) in TOTALS {
            let before = match parent {
                Some(p) => number(&p.summary().additional_properties, total),
                None => Some(0),
            };
            if let Some(before) = before {
                let after = (before + number(&changes, added).unwrap_or(0))
                    .saturating_sub(number(&changes, removed).unwrap_or(0));
                properties.insert(total.to_string(), after.to_string());
            }
        }
        properties.extend(changes);

        let now_ms = i64::try_from(self.clock.now_ms()).map_err(err)?;
        let snapshot = Snapshot::builder()
            .with_manifest_list(list_path)
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(parent.map(|p| p.snapshot_id()))
            .with_sequence_number(sequence)
            .with_summary(Summary {
                operation,
                additional_properties: properties,
            })
            .with_schema_id(metadata.current_schema_id())
            // Snapshots must not go back in time (the metadata builder refuses it).
            .with_timestamp_ms(now_ms.max(metadata.last_updated_ms() + 1))
            .build();
        let builder =
            TableMetadataBuilder::new_from_metadata(metadata.clone(), Some(base_location))
                .add_snapshot(snapshot)?
                .set_ref(
                    MAIN_BRANCH,
                    SnapshotReference::new(
                        snapshot_id,
                        SnapshotRetention::branch(None, None, None),
                    ),
                )?;
        self.commit_metadata(base, builder).await
    }

    /// Writes the metadata `builder` (started from `base`'s) builds as the table's next
    /// version and points the catalog at it if it still points at `base`'s.
    pub(crate) async fn commit_metadata(
        &self,
        base: &Table,
        builder: TableMetadataBuilder,
    ) -> LakeResult<Table> {
        let base_location = base
            .metadata_location()
            .ok_or_else(|| err("a catalog table without a metadata location"))?;
        let built = builder.build()?;
        // A new file, the next version: metadata files are never rewritten, and the
        // compare-and-set below must swap one location for another to detect a conflict.
        let location = MetadataLocation::from_str(base_location)?
            .with_next_version()
            .with_new_metadata(&built.metadata);
        built.metadata.write_to(base.file_io(), &location).await?;
        self.swap_metadata(base.identifier(), base_location, &location.to_string())
            .await?;
        let ident = base.identifier();
        self.load_table(&ident.namespace().join("."), ident.name())
            .await
    }

    /// `statement` (with `?` placeholders) in the catalog database's bind style.
    pub(crate) fn sql<'a>(&self, statement: &'a str) -> std::borrow::Cow<'a, str> {
        if !self.postgres {
            return statement.into();
        }
        let mut n = 0;
        statement
            .chars()
            .map(|c| {
                if c == '?' {
                    n += 1;
                    format!("${n}")
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
            .into()
    }

    /// The catalog's compare-and-set: `ident` points at `new` if it pointed at `old`.
    async fn swap_metadata(&self, ident: &TableIdent, old: &str, new: &str) -> LakeResult<()> {
        let statement = self.sql(CAS);
        let namespace = ident.namespace().join(".");
        let done = sqlx::query(&statement)
            .bind(new)
            .bind(old)
            .bind(CATALOG_NAME)
            .bind(namespace)
            .bind(ident.name())
            .bind(old)
            .execute(self.pool.as_ref())
            .await
            .map_err(err)?;
        if done.rows_affected() == 0 {
            return Err(LakeError::Conflict(format!(
                "{ident} moved past {old} before the commit"
            )));
        }
        Ok(())
    }
}
