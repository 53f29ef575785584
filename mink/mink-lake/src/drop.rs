//! What a lake table loses when the Mink table loses it: a dropped partition's rows (its data
//! and delete files, and its buckets' tiered offsets), or the whole table.

use std::collections::{BTreeMap, HashSet};

use futures::TryStreamExt as _;
use iceberg::scan::FileScanTask;
use iceberg::spec::{Literal, Operation, Struct};

use crate::commit::NewSnapshot;
use crate::tier::tiered_offsets;
use crate::{Lake, LakeError, LakeResult};

impl Lake {
    /// Removes from the lake table of `database.table` the partitions the Mink table no
    /// longer has: every data and delete file whose partition values are none of `live`
    /// (partition id → key values, as Mink names them), and the tiered offsets of every
    /// partition id not in `live`, in one `delete` snapshot. Returns whether it committed one.
    /// Idempotent: a drop that crashed is finished by the next call.
    pub async fn drop_partitions(
        &self,
        database: &str,
        table: &str,
        live: &BTreeMap<u64, BTreeMap<String, String>>,
    ) -> LakeResult<bool> {
        let base = self.load_table(database, table).await?;
        let metadata = base.metadata();
        let spec = metadata.default_partition_spec();
        if spec.is_unpartitioned() || metadata.current_snapshot().is_none() {
            return Ok(false);
        }
        let schema = metadata.current_schema();
        // Each live partition as the lake writes it: identity values in spec order.
        let live_values: HashSet<Struct> =
            live.values()
                .map(|values| {
                    spec.fields()
                        .iter()
                        .map(|f| {
                            let column = schema.field_by_id(f.source_id).ok_or_else(|| {
                                LakeError::Iceberg(format!("no field {}", f.source_id))
                            })?;
                            let value = values.get(&column.name).ok_or_else(|| {
                                LakeError::Incompatible {
                                    column: column.name.clone(),
                                    reason: "a partition without a value for it".into(),
                                }
                            })?;
                            let datum = crate::read::partition_datum(schema, &column.name, value)?;
                            Ok(Some(Literal::Primitive(datum.literal().clone())))
                        })
                        .collect::<LakeResult<Struct>>()
                })
                .collect::<LakeResult<_>>()?;
        let tasks: Vec<FileScanTask> = base
            .scan()
            .build()?
            .plan_files()
            .await?
            .try_collect()
            .await?;
        let mut removed = HashSet::new();
        for task in tasks {
            if task
                .partition
                .as_ref()
                .is_some_and(|p| !live_values.contains(p))
            {
                removed.insert(task.data_file_path.clone());
                removed.extend(task.deletes.iter().map(|d| d.file_path.clone()));
            }
        }
        let unset: HashSet<String> = tiered_offsets(&base)
            .into_keys()
            .filter(|(partition, _)| !live.contains_key(partition))
            .flat_map(|(partition, bucket)| {
                [
                    crate::tier::offset_key(partition, bucket),
                    crate::tier::start_key(partition, bucket),
                ]
            })
            .collect();
        if removed.is_empty() && unset.is_empty() {
            return Ok(false);
        }
        let new = NewSnapshot {
            added: Vec::new(),
            removed,
            properties: Default::default(),
            unset,
        };
        self.commit_snapshot(&base, Operation::Delete, new).await?;
        Ok(true)
    }

    /// Drops the lake table of `database.table` from the catalog and deletes its files.
    /// `Ok(false)` if there is none.
    pub async fn drop_table(&self, database: &str, table: &str) -> LakeResult<bool> {
        let ident = Self::ident(database, table)?;
        if !self.catalog.table_exists(&ident).await? {
            return Ok(false);
        }
        use iceberg::Catalog as _;
        self.catalog.purge_table(&ident).await?;
        self.loaded
            .lock()
            .expect("lake tables lock")
            .remove(&(database.to_string(), table.to_string()));
        Ok(true)
    }
}
