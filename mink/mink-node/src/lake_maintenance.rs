//! Lake maintenance, run by the lease holder beside tiering: every lake-enabled table is
//! compacted, its old snapshots expired and its orphan files removed
//! ([`mink_lake::Lake::maintain`]) once per [`interval`] (five freshness periods, at least a
//! minute: about ten tiering rounds of small files each time), as the table's
//! `table.datalake.*` maintenance options say. Tiering goes on meanwhile: a compaction commits
//! on top of the rounds tiered while it ran.
//!
//! The snapshot the command log records is kept by expiry (readers plan on it); a compaction's
//! snapshot is recorded once committed, so readers move onto the compacted files and the old
//! ones can go once the snapshot retention (an hour by default) has passed. Recording it does not move the lake's commit time: no offset
//! advanced.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use mink_lake::maintain::{Maintained, Maintenance};
use mink_log::options::{LakeMaintenance, TableOptions};
use mink_metadata::TableRecord;

use crate::{Node, NodeResult};

/// How often the lease holder looks for tables due maintenance.
const MAINTENANCE_TICK: Duration = Duration::from_secs(5);

/// Time between two maintenance runs of a table tiered every `freshness / 2`, unless its
/// `table.datalake.maintenance.interval` says otherwise.
pub(crate) fn interval(freshness: Duration, maintenance: &LakeMaintenance) -> Duration {
    maintenance
        .interval
        .unwrap_or_else(|| (freshness * 5).max(Duration::from_secs(60)))
}

/// Files no snapshot references are this old at least before they are removed: a tiering
/// round writes its files before it commits them.
const ORPHAN_MIN_AGE: Duration = Duration::from_secs(3600);

/// The table's maintenance policy, from its options.
fn policy(table: &TableRecord) -> NodeResult<Maintenance> {
    let m = TableOptions::parse(&table.options)?.lake_maintenance;
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    Ok(Maintenance {
        small_file_bytes: m.small_file_bytes,
        min_files: m.min_files,
        snapshot_age_ms: ms(m.snapshot_retention),
        orphan_age_ms: ms(m.snapshot_retention.max(ORPHAN_MIN_AGE)),
        compact: m.compaction,
        expire: m.expire_snapshots,
        ..Maintenance::default()
    })
}

/// The lease holder's lake maintenance, run by the coordinator ([`mink_coordinator::Duty`]):
/// each round maintains the lake tables due.
pub(crate) struct LakeMaintenanceDuty {
    node: Node,
    /// table id -> when it was last maintained (or when this node began to hold the lease).
    last: Mutex<HashMap<u64, u64>>,
}

impl LakeMaintenanceDuty {
    pub(crate) fn new(node: Node) -> Self {
        LakeMaintenanceDuty {
            node,
            last: Mutex::new(HashMap::new()),
        }
    }

    async fn maintain_due(&self, epoch: u64) {
        let node = &self.node;
        let view = node.view();
        let now_ms = node.inner.config.clock.now_ms();
        for (table, freshness, options) in crate::tiering::lake_tables(&view) {
            let due = u64::try_from(interval(freshness, &options.lake_maintenance).as_millis())
                .unwrap_or(u64::MAX);
            {
                let mut last = self.last.lock().expect("maintenance schedule");
                let since = last.entry(table.table_id).or_insert(now_ms);
                if now_ms.saturating_sub(*since) < due {
                    continue;
                }
                *since = now_ms;
            }
            if let Err(e) = maintain_table(node, epoch, table).await {
                tracing::warn!(error = %e, table = %table.name, "lake maintenance failed");
            }
        }
    }
}

impl mink_coordinator::Duty for LakeMaintenanceDuty {
    fn name(&self) -> &'static str {
        "lake maintenance"
    }

    fn period(&self) -> Duration {
        MAINTENANCE_TICK
    }

    fn round(&self, epoch: u64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.maintain_due(epoch))
    }

    fn lease_lost(&self) {
        self.last.lock().expect("maintenance schedule").clear();
    }
}

impl Node {
    /// Maintains the lake table of `database.table` now rather than on its schedule, on the
    /// node holding the lease (elsewhere: `Unavailable`).
    pub async fn maintain_lake_now(&self, database: &str, table: &str) -> NodeResult<Maintained> {
        let (record, epoch) = self.lake_duty(database, table, "lake maintenance")?;
        maintain_table(self, epoch, &record).await
    }
}

async fn maintain_table(
    node: &Node,
    coordinator_epoch: u64,
    table: &TableRecord,
) -> NodeResult<Maintained> {
    let lake = node.lake().await?;
    // A partition dropped while its lake files could not be removed: removed now.
    let dropped = node.drop_lake_partitions(table).await?;
    let view = node.view();
    let record = view.state.lake_snapshots.get(&table.table_id);
    let keep: Vec<i64> = record.map(|r| r.snapshot_id).into_iter().collect();
    let now_ms = i64::try_from(node.inner.config.clock.now_ms()).unwrap_or(i64::MAX);
    let done = lake
        .maintain(&table.database, &table.name, &policy(table)?, now_ms, &keep)
        .await?;
    if done.compacted.is_some() || dropped {
        crate::tiering::record_lake_snapshot(node, coordinator_epoch, table, record).await?;
    }
    tracing::debug!(table = %table.name, ?done, "lake maintained");
    Ok(done)
}
