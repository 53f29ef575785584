//! The lake's catalog and tables on real databases (a SQLite file; PostgreSQL from
//! `scripts/test.sh`) and the local object store: creating a Mink table's Iceberg table,
//! loading it from another process's catalog, attaching an existing table after the schema
//! check, and the errors that name the column at fault.

#![allow(clippy::print_stderr)]

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, IntervalUnit, Schema as ArrowSchema, TimeUnit};
use iceberg::spec::{PrimitiveType, Transform, Type};
use mink_lake::table::{BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN};
use mink_lake::{Lake, LakeError};

mod common;
use common::{fresh_postgres, postgres_url, pyiceberg_read, python};

fn columns() -> ArrowSchema {
    ArrowSchema::new(vec![
        Field::new("user_id", DataType::Int64, false),
        Field::new("event", DataType::Utf8, true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("day", DataType::Utf8, false),
        Field::new(
            "tags",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
    ])
}

async fn lake(metadata_url: &str, dir: &std::path::Path) -> Lake {
    let objects = dir.join("objects");
    let url = objects.to_str().unwrap();
    let store = s3stream::store::open(url).unwrap();
    Lake::open(metadata_url, url, store).await.unwrap()
}

async fn creates_and_reloads(metadata_url: &str, dir: &std::path::Path) {
    let l = lake(metadata_url, dir).await;
    let created = l
        .create_table("app", "events", &columns(), &["day".to_string()])
        .await
        .unwrap();
    let meta = created.metadata();
    let schema = meta.current_schema();
    let names: Vec<&str> = schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "user_id",
            "event",
            "at",
            "day",
            "tags",
            BUCKET_COLUMN,
            OFFSET_COLUMN,
            TIMESTAMP_COLUMN
        ]
    );
    let field = |n: &str| schema.field_by_name(n).unwrap().clone();
    assert!(field("user_id").required && !field("event").required);
    assert_eq!(
        *field("at").field_type,
        Type::Primitive(PrimitiveType::Timestamptz)
    );
    assert_eq!(
        *field(OFFSET_COLUMN).field_type,
        Type::Primitive(PrimitiveType::Long)
    );
    let spec = meta.default_partition_spec();
    assert_eq!(spec.fields().len(), 1);
    assert_eq!(spec.fields()[0].source_id, field("day").id);
    assert_eq!(spec.fields()[0].transform, Transform::Identity);
    // Under the warehouse, on the node's object store.
    assert_eq!(meta.location(), format!("{}/app/events", l.warehouse()));
    let metadata_file = created.metadata_location().unwrap().to_string();
    let local = metadata_file.strip_prefix("file://").unwrap();
    assert!(
        std::path::Path::new(local).starts_with(dir.join("objects/lake/app/events/metadata")),
        "{metadata_file}"
    );
    assert!(std::path::Path::new(local).exists(), "{local}");

    // Another node's catalog sees the same table.
    let other = lake(metadata_url, dir).await;
    let loaded = other.load_table("app", "events").await.unwrap();
    assert_eq!(loaded.metadata_location(), Some(metadata_file.as_str()));
    assert!(matches!(
        other.create_table("app", "events", &columns(), &[]).await,
        Err(LakeError::AlreadyExists(_))
    ));
    assert!(matches!(
        other.load_table("app", "nope").await,
        Err(LakeError::NotFound(_))
    ));
    // It can be attached by a table of the same columns, or without optional ones (tiering
    // leaves them null), not without a required one.
    other
        .attach_table("app", "events", &columns(), None)
        .await
        .unwrap();
    let fewer = ArrowSchema::new(columns().fields()[..4].to_vec());
    other
        .attach_table("app", "events", &fewer, None)
        .await
        .unwrap();
    let without_day = ArrowSchema::new(columns().fields()[..3].to_vec());
    let (column, _) = incompatible(
        other
            .attach_table("app", "events", &without_day, None)
            .await,
    );
    assert_eq!(column, "day");
}

/// An Iceberg table another writer filled is not attached: reads serve the lake up to the
/// offsets Mink tiered, so its rows would never be read, and Mink's rows would take their
/// offsets (it was attached, and reads then failed on the offsets' gap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iceberg_table_with_rows_is_not_attached() {
    let Some(python) = python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metadata.db");
    let l = lake(&format!("sqlite://{}", db.display()), dir.path()).await;
    l.create_table("app", "foreign", &columns(), &[])
        .await
        .unwrap();
    // Empty, it is attached.
    l.attach_table("app", "foreign", &columns(), None)
        .await
        .unwrap();
    let out = std::process::Command::new(&python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/pyiceberg_append.py"
        ))
        .arg(format!("sqlite:///{}", db.display()))
        .arg(l.warehouse())
        .args(["app", "foreign"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pyiceberg append: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for refused in [
        l.attach_table("app", "foreign", &columns(), None).await,
        l.ensure_table("app", "foreign", &columns(), &[], &[], None)
            .await,
    ] {
        match refused {
            Err(LakeError::NotEmpty(why)) => {
                assert!(
                    why.contains("holds rows Mink did not tier (1 in its current snapshot)"),
                    "{why}"
                )
            }
            other => panic!("attached a table holding rows: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_table_is_created_and_reloaded_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("metadata.db").display());
    creates_and_reloads(&url, dir.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_table_is_created_and_reloaded_on_postgres() {
    let Some(base) = postgres_url() else {
        eprintln!("skipped: MINK_TEST_POSTGRES_URL is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = fresh_postgres(&base, "create").await;
    creates_and_reloads(&url, dir.path()).await;
}

fn incompatible(r: Result<impl std::fmt::Debug, LakeError>) -> (String, String) {
    match r {
        Err(LakeError::Incompatible { column, reason }) => (column, reason),
        other => panic!("expected an incompatible column, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incompatible_table_is_refused_naming_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("metadata.db").display());
    let l = lake(&url, dir.path()).await;
    l.create_table("app", "events", &columns(), &[])
        .await
        .unwrap();
    let with = |field: Field| {
        let mut fields = columns().fields().to_vec();
        fields.push(Arc::new(field));
        ArrowSchema::new(fields)
    };
    // A column of another type.
    let mut changed = columns().fields().to_vec();
    changed[1] = Arc::new(Field::new("event", DataType::Int32, true));
    let (column, reason) = incompatible(
        l.attach_table("app", "events", &ArrowSchema::new(changed), None)
            .await,
    );
    assert_eq!(column, "event");
    assert!(
        reason.contains("string") && reason.contains("int"),
        "{reason}"
    );
    // A column the Iceberg table lacks.
    let (column, _) = incompatible(
        l.attach_table(
            "app",
            "events",
            &with(Field::new("extra", DataType::Int64, true)),
            None,
        )
        .await,
    );
    assert_eq!(column, "extra");
    // A nullable Mink column over a required Iceberg one.
    let mut nullable = columns().fields().to_vec();
    nullable[0] = Arc::new(Field::new("user_id", DataType::Int64, true));
    let (column, _) = incompatible(
        l.attach_table("app", "events", &ArrowSchema::new(nullable), None)
            .await,
    );
    assert_eq!(column, "user_id");
    // Columns with no Iceberg type, and the reserved names, are refused at creation.
    let (column, _) = incompatible(
        l.create_table(
            "app",
            "intervals",
            &with(Field::new(
                "took",
                DataType::Interval(IntervalUnit::MonthDayNano),
                true,
            )),
            &[],
        )
        .await,
    );
    assert_eq!(column, "took");
    let (column, _) = incompatible(
        l.create_table(
            "app",
            "reserved",
            &with(Field::new(OFFSET_COLUMN, DataType::Int64, true)),
            &[],
        )
        .await,
    );
    assert_eq!(column, OFFSET_COLUMN);
    let (column, _) = incompatible(
        l.create_table("app", "unknown_key", &columns(), &["nope".to_string()])
            .await,
    );
    assert_eq!(column, "nope");
}

/// pyiceberg 0.12, through the same SQL catalog, reads the table Mink created: its columns
/// with their types, its partitioning, its location, and its data once a round is tiered;
/// DuckDB's iceberg extension reads the same rows from the metadata file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_reads_a_lake_table_mink_created() {
    let Some(interpreter) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metadata.db");
    let l = lake(&format!("sqlite://{}", db.display()), dir.path()).await;
    l.create_table("app", "events", &columns(), &["day".to_string()])
        .await
        .unwrap();
    let seen = pyiceberg_read(&interpreter, &db, &l, "events");
    assert_eq!(
        seen["columns"],
        serde_json::json!([
            ["user_id", "long", true],
            ["event", "string", false],
            ["at", "timestamptz", false],
            ["day", "string", true],
            ["tags", "list<string>", false],
            [BUCKET_COLUMN, "int", true],
            [OFFSET_COLUMN, "long", true],
            [TIMESTAMP_COLUMN, "timestamptz", true]
        ]),
        "{seen}"
    );
    assert_eq!(seen["partition"], serde_json::json!([["day", "identity"]]));
    assert_eq!(seen["location"], format!("{}/app/events", l.warehouse()));
    assert_eq!(seen["rows"], 0);

    // An unpartitioned table with a tiered round: pyiceberg reads its rows and the summary.
    let clicks = ArrowSchema::new(columns().fields()[..2].to_vec());
    l.create_table("app", "clicks", &clicks, &[]).await.unwrap();
    let rows = arrow::array::RecordBatch::try_new(
        Arc::new(clicks),
        vec![
            Arc::new(arrow::array::Int64Array::from_iter_values(0..25)),
            Arc::new(arrow::array::StringArray::from_iter_values(
                (0..25).map(|i| format!("e{i}")),
            )),
        ],
    )
    .unwrap();
    l.tier(
        "app",
        "clicks",
        vec![mink_lake::tier::BucketRound {
            partition_id: 0,
            bucket: 3,
            start_offset: 100,
            end_offset: 125,
            batches: vec![mink_lake::tier::LogRows {
                base_offset: 100,
                timestamp_us: 1_700_000_000_000_000,
                rows,
            }],
        }],
    )
    .await
    .unwrap();
    let seen = pyiceberg_read(&interpreter, &db, &l, "clicks");
    assert_eq!(seen["rows"], 25, "{seen}");
    assert_eq!(
        seen["offsets"],
        serde_json::json!((100..125).collect::<Vec<_>>())
    );
    assert_eq!(
        seen["summary"],
        // The bucket's first round began at 100: the lake starts there.
        serde_json::json!({"mink.tiered-offset.0.3": "125", "mink.lake-start.0.3": "100"})
    );

    // DuckDB's iceberg extension reads the same rows from the table's metadata file.
    let metadata = l
        .load_table("app", "clicks")
        .await
        .unwrap()
        .metadata_location()
        .unwrap()
        .to_string();
    let seen = common::duckdb_read(&interpreter, &metadata);
    assert_eq!(seen["rows"], 25, "{seen}");
    assert_eq!(
        seen["offsets"],
        serde_json::json!((100..125).collect::<Vec<_>>())
    );
}
