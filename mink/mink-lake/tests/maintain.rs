//! Lake maintenance on real catalogs (a SQLite file, PostgreSQL) and stores (local, S3 on
//! moto): compaction keeps every row and the tiered offsets and leaves rows in bucket and
//! offset order; expiry keeps the current and the pinned snapshots; orphan removal deletes
//! what no snapshot references (a crashed commit's files included) and nothing a kept
//! snapshot reads; pyiceberg and DuckDB read the compacted table.

use iceberg::spec::Operation;
use mink_lake::maintain::Maintenance;
use mink_lake::tier::{Tiered, tiered_offsets};
use mink_lake::{Lake, LakeError};

mod common;
use common::{columns, expected, lake_rows, round};

fn policy() -> Maintenance {
    Maintenance {
        min_files: 4,
        ..Maintenance::default()
    }
}

/// Ten rounds of two buckets, ten rows each per bucket: ten small files.
async fn ten_rounds(l: &Lake) {
    for r in 0..10 {
        l.tier(
            "app",
            "events",
            vec![round(0, r * 10, r * 10 + 10), round(1, r * 10, r * 10 + 10)],
        )
        .await
        .unwrap();
    }
}

async fn data_files(l: &Lake) -> usize {
    let t = l.load_table("app", "events").await.unwrap();
    let summary = &t.metadata().current_snapshot().unwrap().summary();
    summary.additional_properties["total-data-files"]
        .parse()
        .unwrap()
}

/// The lake on the SQLite catalog `<dir>/metadata.db` and the local store `<dir>/<store>`.
async fn local_lake(dir: &std::path::Path, store: &str) -> Lake {
    let objects = dir.join(store);
    let url = objects.to_str().unwrap();
    Lake::open(
        &format!("sqlite://{}", dir.join("metadata.db").display()),
        url,
        s3stream::store::open(url).unwrap(),
    )
    .await
    .unwrap()
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Compaction, expiry and orphan removal on the catalog at `metadata_url` and the store at
/// `store_url`.
async fn maintains(metadata_url: &str, store_url: &str) {
    let l = Lake::open(
        metadata_url,
        store_url,
        s3stream::store::open(store_url).unwrap(),
    )
    .await
    .unwrap();
    l.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    ten_rounds(&l).await;
    let rows = expected(&[(0, 0, 100), (1, 0, 100)]);
    assert_eq!(data_files(&l).await, 10);
    let before = l.load_table("app", "events").await.unwrap();
    let pinned = before.metadata().current_snapshot_id().unwrap();

    let compacted = l
        .compact("app", "events", &policy())
        .await
        .unwrap()
        .expect("ten small files are compacted");
    assert_eq!(
        (
            compacted.files_removed,
            compacted.files_added,
            compacted.rows
        ),
        (10, 1, 200)
    );
    let after = l.load_table("app", "events").await.unwrap();
    let snapshot = after.metadata().current_snapshot().unwrap();
    assert_eq!(snapshot.snapshot_id(), compacted.snapshot_id);
    assert_eq!(snapshot.summary().operation, Operation::Replace);
    assert_eq!(tiered_offsets(&after), tiered_offsets(&before));
    assert_eq!(data_files(&l).await, 1);
    assert_eq!(lake_rows(&l).await, rows);
    // Nothing left to compact; a round lands on top of the replace.
    assert_eq!(l.compact("app", "events", &policy()).await.unwrap(), None);
    assert!(matches!(
        l.tier("app", "events", vec![round(0, 100, 110)])
            .await
            .unwrap(),
        Tiered::Committed { .. }
    ));
    let current = l
        .load_table("app", "events")
        .await
        .unwrap()
        .metadata()
        .current_snapshot_id()
        .unwrap();
    // Rows come back in bucket and offset order: a bucket's range reads without a sort.
    let schema = std::sync::Arc::new(columns());
    let back = l
        .read_bucket(
            "app",
            "events",
            current,
            &Default::default(),
            1,
            0..100,
            &schema,
            None,
        )
        .await
        .unwrap();
    assert_eq!(back.iter().map(|b| b.num_rows()).sum::<usize>(), 100);

    // Expiry keeps the current snapshot and the pinned one; the pinned snapshot still reads
    // after orphan removal, which deletes only what no kept snapshot references.
    let expired = l
        .expire_snapshots("app", "events", now_ms() + 1, &[pinned])
        .await
        .unwrap();
    assert_eq!(expired.len(), 10, "{expired:?}");
    let kept: Vec<i64> = l
        .load_table("app", "events")
        .await
        .unwrap()
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    assert_eq!(
        kept.len(),
        2,
        "the pinned and the current snapshot: {kept:?}"
    );
    let none_old = l
        .remove_orphans("app", "events", now_ms() - 3_600_000)
        .await
        .unwrap();
    assert!(none_old.is_empty(), "{none_old:?}");
    let removed = l
        .remove_orphans("app", "events", now_ms() + 1)
        .await
        .unwrap();
    assert!(
        removed.iter().all(|p| !p.contains("/data/")),
        "the pinned snapshot still reads the ten small files: {removed:?}"
    );
    assert!(!removed.is_empty());
    let pinned_rows = l
        .read_bucket(
            "app",
            "events",
            pinned,
            &Default::default(),
            0,
            0..100,
            &schema,
            None,
        )
        .await
        .unwrap();
    assert_eq!(pinned_rows.iter().map(|b| b.num_rows()).sum::<usize>(), 100);

    // Once the pinned snapshot goes, so do its files; the table reads on.
    let expired = l
        .expire_snapshots("app", "events", now_ms() + 1, &[])
        .await
        .unwrap();
    assert_eq!(expired, vec![pinned]);
    let removed = l
        .remove_orphans("app", "events", now_ms() + 1)
        .await
        .unwrap();
    assert_eq!(
        removed.iter().filter(|p| p.contains("/data/")).count(),
        10,
        "{removed:?}"
    );
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 110), (1, 0, 100)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let objects = dir.path().join("objects");
    maintains(
        &format!("sqlite://{}", dir.path().join("metadata.db").display()),
        objects.to_str().unwrap(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_on_postgres_and_s3() {
    let Some(base) = common::postgres_url() else {
        return;
    };
    let Some((_, url)) = common::s3_url() else {
        return;
    };
    maintains(&common::fresh_postgres(&base, "maintain").await, &url).await;
}

/// A compaction crashed before its commit leaves files no snapshot references: orphan removal
/// deletes them once they are old enough, and the table never saw them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_commit_leaves_orphans_only() {
    let dir = tempfile::tempdir().unwrap();
    let l = local_lake(dir.path(), "objects").await;
    l.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    ten_rounds(&l).await;
    // What a crash after the upload leaves: a data file and a manifest nobody references.
    let table = l.load_table("app", "events").await.unwrap();
    let location = table.metadata().location().to_string();
    for stray in [
        format!("{location}/data/crashed-00000.parquet"),
        format!("{location}/metadata/crashed-m0.avro"),
    ] {
        table
            .file_io()
            .new_output(&stray)
            .unwrap()
            .write(bytes::Bytes::from_static(b"half a file"))
            .await
            .unwrap();
    }
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 100), (1, 0, 100)]));
    let removed = l
        .remove_orphans("app", "events", now_ms() + 1)
        .await
        .unwrap();
    let mut names: Vec<&str> = removed
        .iter()
        .map(|p| p.rsplit('/').next().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["crashed-00000.parquet", "crashed-m0.avro"]);
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 100), (1, 0, 100)]));
}

/// A table whose files live outside the node's store is not swept: its paths would never match
/// the listing, and every live file would look orphaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_files_stop_orphan_removal() {
    let dir = tempfile::tempdir().unwrap();
    let l = local_lake(dir.path(), "objects").await;
    l.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    l.tier("app", "events", vec![round(0, 0, 10)])
        .await
        .unwrap();
    // The same catalog seen from a node whose store is elsewhere.
    let elsewhere = local_lake(dir.path(), "elsewhere").await;
    let refused = elsewhere
        .remove_orphans("app", "events", now_ms() + 1)
        .await;
    assert!(
        matches!(&refused, Err(LakeError::Iceberg(m)) if m.contains("outside this node's object store")),
        "{refused:?}"
    );
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 10)]));
}

/// pyiceberg 0.12 and DuckDB read the compacted table (a `replace` snapshot Mink built by
/// hand) and see exactly Mink's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_readers_read_a_compacted_table() {
    let Some(interpreter) = common::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metadata.db");
    let l = local_lake(dir.path(), "objects").await;
    l.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    ten_rounds(&l).await;
    l.compact("app", "events", &policy())
        .await
        .unwrap()
        .unwrap();
    let offsets: Vec<i64> = {
        let mut o: Vec<i64> = lake_rows(&l).await.iter().map(|r| r.1).collect();
        o.sort_unstable();
        o
    };
    let seen = common::pyiceberg_read(&interpreter, &db, &l, "events");
    assert_eq!(seen["rows"], 200, "{seen}");
    assert_eq!(seen["offsets"], serde_json::json!(offsets));
    assert_eq!(
        seen["summary"],
        serde_json::json!({"mink.tiered-offset.0.0": "100", "mink.tiered-offset.0.1": "100"})
    );
    let metadata = l
        .load_table("app", "events")
        .await
        .unwrap()
        .metadata_location()
        .unwrap()
        .to_string();
    let seen = common::duckdb_read(&interpreter, &metadata);
    assert_eq!(seen["rows"], 200, "{seen}");
    assert_eq!(seen["offsets"], serde_json::json!(offsets));
}

/// A round tiered while a compaction rewrites files does not void it: the replace is rebuilt
/// on the new head, keeping the round's rows and offsets. Committing the same rewrite again
/// fails, as its files are no longer live, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_commits_on_top_of_a_round_tiered_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let l = local_lake(dir.path(), "objects").await;
    l.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    ten_rounds(&l).await;
    let rewrite = l
        .rewrite_small_files("app", "events", &policy())
        .await
        .unwrap()
        .expect("ten small files to rewrite");
    l.tier("app", "events", vec![round(1, 100, 130)])
        .await
        .unwrap();
    let compacted = l.commit_rewrite("app", "events", &rewrite).await.unwrap();
    assert_eq!((compacted.files_removed, compacted.files_added), (10, 1));
    let t = l.load_table("app", "events").await.unwrap();
    assert_eq!(
        tiered_offsets(&t).into_iter().collect::<Vec<_>>(),
        vec![((0, 0), 100), ((0, 1), 130)]
    );
    assert_eq!(data_files(&l).await, 2);
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 100), (1, 0, 130)]));
    let again = l.commit_rewrite("app", "events", &rewrite).await;
    assert!(matches!(again, Err(LakeError::FileGone(_))), "{again:?}");
    assert_eq!(lake_rows(&l).await, expected(&[(0, 0, 100), (1, 0, 130)]));
}

/// The snapshots Mink builds itself (a compaction's replace) are stamped by the lake's clock,
/// the node's, not read from the system's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_is_stamped_by_the_lake_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = mink_metadata::ManualClock::new(1_800_000_000_000);
    let l = local_lake(dir.path(), "objects")
        .await
        .with_clock(clock.clone());
    l.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    ten_rounds(&l).await;
    clock.advance(std::time::Duration::from_secs(60));
    let compacted = l
        .compact("app", "events", &policy())
        .await
        .unwrap()
        .expect("ten small files are compacted");
    let table = l.load_table("app", "events").await.unwrap();
    let snapshot = table.metadata().current_snapshot().unwrap();
    assert_eq!(snapshot.snapshot_id(), compacted.snapshot_id);
    assert_eq!(snapshot.timestamp_ms(), 1_800_000_060_000);
}
