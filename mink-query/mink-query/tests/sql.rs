//! SQL over a node: log and primary-key tables, projection, filters and limits pushed to the
//! nodes, the cut a statement reads, and errors; the sqllogictest files under `tests/slt`;
//! the ADBC Flight SQL driver and Polars over the Flight SQL server.

mod common;

use std::path::PathBuf;

use arrow_flight::sql::client::FlightSqlServiceClient;
use common::Cluster;
use futures::TryStreamExt as _;

fn strings(rows: &[&[&str]]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| r.iter().map(ToString::to_string).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_read_log_and_primary_key_tables() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    assert_eq!(
        c.rows("SELECT count(*), sum(amount), min(id), max(id) FROM app.events")
            .await,
        strings(&[&["100", "49500", "0", "99"]])
    );
    assert_eq!(
        c.rows("SELECT kind, count(*) FROM app.events GROUP BY kind ORDER BY kind NULLS FIRST")
            .await,
        strings(&[
            &["NULL", "10"],
            &["buy", "30"],
            &["click", "30"],
            &["view", "30"]
        ])
    );
    // A primary-key table reads its current rows: updates applied, deletes gone.
    assert_eq!(
        c.rows("SELECT id, name FROM app.users ORDER BY id").await,
        strings(&[&["1", "ann"], &["2", "bo"], &["4", "dan"]])
    );
    // Joins across both.
    assert_eq!(
        c.rows(
            "SELECT u.name, e.amount FROM app.users u JOIN app.events e ON e.id = u.id ORDER BY u.id"
        )
        .await,
        strings(&[&["ann", "10"], &["bo", "20"], &["dan", "40"]])
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_and_limits_go_to_the_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    let plan = c
        .rows("EXPLAIN SELECT amount FROM app.events WHERE id >= 90 AND kind IN ('buy', 'view')")
        .await;
    let physical = &plan.last().unwrap()[1];
    assert!(
        physical.contains(r#"MinkScanExec: table=app.events, splits=3"#)
            && physical.contains(r#"{"column":"id","op":">=","value":90}"#)
            && physical.contains(r#"{"column":"kind","op":"in","values":["buy","view"]}"#),
        "{physical}"
    );
    assert_eq!(
        c.rows(
            "SELECT id, amount FROM app.events WHERE id >= 90 AND kind IN ('buy', 'view') ORDER BY id"
        )
        .await,
        strings(&[
            &["90", "900"],
            &["92", "920"],
            &["93", "930"],
            &["95", "950"],
            &["96", "960"],
            &["98", "980"]
        ])
    );
    // A time range on a log's batch times reaches the nodes (their time index), `now()`
    // folded into a literal.
    let plan = c
        .rows(
            "EXPLAIN SELECT id FROM app.\"events$log\" WHERE __timestamp >= TIMESTAMP '2026-01-01 00:00:00Z' AND __timestamp < now()",
        )
        .await;
    let physical = &plan.last().unwrap()[1];
    assert!(
        physical.contains(
            r#"{"column":"__timestamp","op":">=","value":"2026-01-01T00:00:00.000000Z"}"#
        ) && physical.contains(r#"{"column":"__timestamp","op":"<","value":""#),
        "{physical}"
    );
    // What a node cannot test stays with DataFusion, and the answer is the same.
    assert_eq!(
        c.rows("SELECT count(*) FROM app.events WHERE id % 7 = 0 OR kind IS NULL")
            .await,
        strings(&[&["24"]])
    );
    // Reversed comparisons, dates as text, nulls.
    assert_eq!(
        c.rows("SELECT count(*) FROM app.events WHERE 10 > id AND kind IS NOT NULL")
            .await,
        strings(&[&["9"]])
    );
    assert_eq!(
        c.rows("SELECT id FROM app.users WHERE name = 'bo'").await,
        strings(&[&["2"]])
    );
    // Equality on the whole primary key is a point lookup at the keys' leaders.
    let plan = c
        .rows("EXPLAIN SELECT name FROM app.users WHERE id IN (1, 3, 4) AND name <> 'x'")
        .await;
    let physical = &plan.last().unwrap()[1];
    assert!(
        physical.contains("MinkLookupExec: table=app.users, keys=3"),
        "{physical}"
    );
    assert_eq!(
        c.rows("SELECT id, name FROM app.users WHERE id IN (1, 3, 4) AND name <> 'x' ORDER BY id")
            .await,
        strings(&[&["1", "ann"], &["4", "dan"]])
    );
    assert_eq!(
        c.rows("SELECT count(*) FROM app.users WHERE id = 2").await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("SELECT name FROM app.users WHERE id = 2 AND name = 'bob'")
            .await,
        Vec::<Vec<String>>::new()
    );
    // Not the whole key, or a range: a scan.
    let plan = c
        .rows("EXPLAIN SELECT name FROM app.users WHERE id > 2")
        .await;
    assert!(plan.last().unwrap()[1].contains("MinkScanExec"), "{plan:?}");
    // A limit bounds what each bucket sends.
    assert_eq!(c.rows("SELECT * FROM app.events LIMIT 5").await.len(), 5);
    c.stop().await;
}

/// The scans report the rows the cut holds (offsets count a log table's rows), for the
/// planner's join order; a primary-key table's count lives with its leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_report_row_counts() {
    use datafusion::common::stats::Precision;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    let rows = async |sql: &str| leaf_statistics(&c, sql, "MinkScanExec").await.num_rows;
    // Unfiltered and unlimited: exactly the cut's rows; otherwise at most that.
    assert_eq!(
        rows("SELECT * FROM app.events").await,
        Precision::Exact(100)
    );
    assert_eq!(
        rows("SELECT * FROM app.events WHERE id < 10").await,
        Precision::Inexact(100)
    );
    assert_eq!(
        rows("SELECT * FROM app.events LIMIT 2").await,
        Precision::Inexact(6)
    );
    assert_eq!(rows("SELECT * FROM app.users").await, Precision::Absent);
    // An exact count answers count(*) without a scan, for a lake table too (lake files'
    // record counts and the tail's offsets).
    let plan = c.rows("EXPLAIN SELECT count(*) FROM app.events").await;
    assert!(!format!("{plan:?}").contains("MinkScanExec"), "{plan:?}");
    lake_table_lk(&c).await;
    let plan = c.rows("EXPLAIN SELECT count(*) FROM app.lk").await;
    let plan = format!("{plan:?}");
    assert!(
        !plan.contains("MinkScanExec") && !plan.contains("MinkLakeExec"),
        "{plan}"
    );
    assert_eq!(
        c.rows("SELECT count(*) FROM app.lk").await,
        strings(&[&["60"]])
    );
    // Filtered: counted by reading.
    let plan = c
        .rows("EXPLAIN SELECT count(*) FROM app.lk WHERE v = 'buy'")
        .await;
    assert!(format!("{plan:?}").contains("MinkLakeExec"), "{plan:?}");
    c.stop().await;
}

/// What the plan node named `leaf` (the first found) of `sql`'s physical plan reports of all
/// its partitions.
async fn leaf_statistics(c: &Cluster, sql: &str, leaf: &str) -> datafusion::common::Statistics {
    use datafusion::physical_plan::ExecutionPlan;
    fn find(
        plan: &std::sync::Arc<dyn ExecutionPlan>,
        leaf: &str,
    ) -> Option<std::sync::Arc<dyn ExecutionPlan>> {
        if plan.name() == leaf {
            return Some(std::sync::Arc::clone(plan));
        }
        plan.children().into_iter().find_map(|p| find(p, leaf))
    }
    let plan = c
        .engine
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    find(&plan, leaf)
        .unwrap_or_else(|| panic!("no {leaf} in the plan of {sql}"))
        .partition_statistics(None)
        .unwrap()
}

/// A lake scan tells the planner each column's null count and range from the data files'
/// manifest entries: exact for an unfiltered read of a log table's lake (so `min` and `max`
/// of an integer column are answered without reading), bounds otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lake_scans_report_column_statistics() {
    use datafusion::common::ScalarValue;
    use datafusion::common::stats::Precision;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    lake_table_lk(&c).await;
    let columns = async |sql: &str| {
        leaf_statistics(&c, sql, "MinkLakeExec")
            .await
            .column_statistics
    };
    let nulls: usize = c
        .rows("SELECT count(*) FROM app.lk WHERE id < 50 AND v IS NULL")
        .await[0][0]
        .parse()
        .unwrap();
    let stats = columns("SELECT id, v FROM app.\"lk$lake\"").await;
    assert_eq!(
        stats[0].min_value,
        Precision::Exact(ScalarValue::Int64(Some(0)))
    );
    assert_eq!(
        stats[0].max_value,
        Precision::Exact(ScalarValue::Int64(Some(49)))
    );
    assert_eq!(stats[0].null_count, Precision::Exact(0));
    assert_eq!(stats[1].null_count, Precision::Exact(nulls));
    assert!(
        matches!(
            stats[1].min_value,
            Precision::Inexact(ScalarValue::Utf8(Some(_)))
        ),
        "{:?}",
        stats[1]
    );
    // Filtered: the files' ranges bound what is read.
    let stats = columns("SELECT id FROM app.\"lk$lake\" WHERE id > 10").await;
    assert_eq!(
        stats[0].max_value,
        Precision::Inexact(ScalarValue::Int64(Some(49)))
    );
    // Exact ranges answer min and max without a scan.
    let plan = c
        .rows("EXPLAIN SELECT min(id), max(id) FROM app.\"lk$lake\"")
        .await;
    assert!(!format!("{plan:?}").contains("MinkLakeExec"), "{plan:?}");
    assert_eq!(
        c.rows("SELECT min(id), max(id) FROM app.\"lk$lake\"").await,
        strings(&[&["0", "49"]])
    );
    c.stop().await;
}

/// A statement reads the cut fixed when it was planned: rows written between `GetFlightInfo`
/// and `DoGet` are not in it; the next statement sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_reads_the_cut_it_was_planned_at() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    let mut sql = c.flight_sql().await;
    let count = |sql: &mut FlightSqlServiceClient<tonic::transport::Channel>| {
        let mut sql = sql.clone();
        async move {
            let info = sql
                .execute("SELECT count(*) FROM app.events".into(), None)
                .await
                .unwrap();
            info.endpoint[0].ticket.clone().unwrap()
        }
    };
    let fetch = |sql: &FlightSqlServiceClient<tonic::transport::Channel>,
                 ticket: arrow_flight::Ticket| {
        let mut sql = sql.clone();
        async move {
            let batches: Vec<_> = sql
                .do_get(ticket)
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            common::text_rows(&batches)
        }
    };
    let planned = count(&mut sql).await;
    let more = arrow::array::RecordBatch::try_from_iter(vec![
        (
            "id",
            std::sync::Arc::new(arrow::array::Int64Array::from(vec![500, 501]))
                as arrow::array::ArrayRef,
        ),
        (
            "kind",
            std::sync::Arc::new(arrow::array::StringArray::from(vec![None::<&str>; 2])),
        ),
        (
            "amount",
            std::sync::Arc::new(arrow::array::Int64Array::from(vec![None; 2])),
        ),
    ])
    .unwrap();
    c.client.writer("app", "events").write(&more).await.unwrap();
    assert_eq!(fetch(&sql, planned.clone()).await, strings(&[&["100"]]));
    // A plan runs once.
    let again = sql.do_get(planned).await;
    assert!(
        matches!(&again, Err(e) if e.to_string().contains("ran already or expired")),
        "{again:?}"
    );
    let next = count(&mut sql).await;
    assert_eq!(fetch(&sql, next).await, strings(&[&["102"]]));
    c.stop().await;
}

/// Read-your-writes across processes: a statement carrying `mink-min-applied-index` (what a
/// writer's node answered) reads at least that index, and answers with the index it read at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_read_the_writes_a_client_has_seen() {
    use arrow_flight::sql::{CommandStatementQuery, ProstMessageExt as _};
    use prost::Message as _;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    // Another client writes; the engine's own client has not seen its index.
    let writer = mink_client::Client::connect(&c.address).await.unwrap();
    writer
        .writer("app", "users")
        .write(
            &arrow::array::RecordBatch::try_from_iter(vec![
                (
                    "id",
                    std::sync::Arc::new(arrow::array::Int64Array::from(vec![9]))
                        as arrow::array::ArrayRef,
                ),
                (
                    "name",
                    std::sync::Arc::new(arrow::array::StringArray::from(vec!["ida"])),
                ),
            ])
            .unwrap(),
        )
        .await
        .unwrap();
    let written = writer.applied_index();
    let mut flight =
        arrow_flight::flight_service_client::FlightServiceClient::new(c.channel().await);
    let command = CommandStatementQuery {
        query: "SELECT name FROM app.users WHERE id = 9".into(),
        transaction_id: None,
    };
    let mut request = tonic::Request::new(arrow_flight::FlightDescriptor::new_cmd(
        command.as_any().encode_to_vec(),
    ));
    request
        .metadata_mut()
        .insert("mink-min-applied-index", written.into());
    let response = flight.get_flight_info(request).await.unwrap();
    let seen: u64 = response
        .metadata()
        .get("mink-applied-index")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        seen >= written,
        "answered {seen}, the write was at {written}"
    );
    let ticket = response.into_inner().endpoint[0].ticket.clone().unwrap();
    let mut sql = c.flight_sql().await;
    let batches: Vec<_> = sql
        .do_get(ticket)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(common::text_rows(&batches), strings(&[&["ida"]]));
    // An index no node has reached: the statement waits for it, then fails saying so; other
    // statements are not held to it.
    let mut ahead = tonic::Request::new(arrow_flight::FlightDescriptor::new_cmd(
        command.as_any().encode_to_vec(),
    ));
    ahead
        .metadata_mut()
        .insert("mink-min-applied-index", (written + 1_000_000).into());
    let refused = flight.get_flight_info(ahead).await;
    assert!(
        matches!(&refused, Err(s) if s.code() == tonic::Code::Unavailable),
        "{refused:?}"
    );
    assert_eq!(
        c.rows("SELECT name FROM app.users WHERE id = 9").await,
        strings(&[&["ida"]])
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    assert!(
        c.error("SELECT * FROM app.nope")
            .await
            .contains("table 'mink.app.nope' not found")
    );
    assert!(
        c.error("SELECT nope FROM app.events")
            .await
            .contains("nope")
    );
    assert!(c.error("SELEC 1").await.contains("SELEC"));
    // Over Flight SQL: the gRPC status says who can act; the node keeps serving.
    let mut sql = c.flight_sql().await;
    let missing = sql.execute("SELECT * FROM app.nope".into(), None).await;
    assert!(
        matches!(&missing, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument && s.message().contains("table 'mink.app.nope' not found")),
        "{missing:?}"
    );
    let ddl = sql
        .execute("CREATE VIEW app.v AS SELECT 1".into(), None)
        .await;
    assert!(
        matches!(&ddl, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument && s.message().contains("DDL not supported")),
        "{ddl:?}"
    );
    // Each request runs on an engine of its own: a SET would be forgotten, so it is refused
    // (plain or prepared), naming the header that does the job.
    let set = sql
        .execute("SET mink.freshness = 'lake'".into(), None)
        .await;
    assert!(
        matches!(&set, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument && s.message().contains("mink-freshness header")),
        "{set:?}"
    );
    let set = sql.prepare("set MINK.FRESHNESS = '30s'".into(), None).await;
    assert!(
        matches!(&set, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument && s.message().contains("mink-freshness header")),
        "{set:?}"
    );
    assert_eq!(
        c.rows("SELECT count(*) FROM app.users").await,
        strings(&[&["3"]])
    );
    c.stop().await;
}

/// Over Flight SQL the gRPC code says who can act: a name taken is `ALREADY_EXISTS`; a value
/// that does not convert to its column's type and a parameter left unbound are the statement's
/// fault, `INVALID_ARGUMENT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_sql_codes_say_who_can_act() {
    use arrow_flight::error::FlightError;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    let mut sql = c.flight_sql().await;
    let code = |r: &Result<arrow_flight::FlightInfo, FlightError>| match r {
        Err(FlightError::Tonic(s)) => Some((s.code(), s.message().to_string())),
        _ => None,
    };
    let duplicate = sql
        .execute("CREATE TABLE app.events (id BIGINT NOT NULL)".into(), None)
        .await;
    assert!(
        matches!(code(&duplicate), Some((tonic::Code::AlreadyExists, m)) if m.contains("app.events") && !m.contains("External error")),
        "{duplicate:?}"
    );
    // Planned, then run: a cast of a literal fails in the optimizer, when the DoGet runs it.
    for statement in [
        "SELECT id FROM app.\"events$log\" WHERE __timestamp > 'notadate'",
        "INSERT INTO app.events VALUES ('x', 'k', 1)",
    ] {
        let refused = match sql.execute(statement.into(), None).await {
            Ok(info) => {
                let mut sql = sql.clone();
                fetch(&mut sql, &info).await.map(|_| ())
            }
            Err(e) => Err(e),
        };
        assert!(
            matches!(&refused, Err(FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument),
            "{statement}: {refused:?}"
        );
    }
    let mut prepared = sql
        .prepare(
            "SELECT name FROM app.users WHERE id = $1 AND name = $2".into(),
            None,
        )
        .await
        .unwrap();
    prepared
        .set_parameters(
            arrow::array::RecordBatch::try_from_iter(vec![(
                "$1",
                std::sync::Arc::new(arrow::array::Int64Array::from(vec![1]))
                    as arrow::array::ArrayRef,
            )])
            .unwrap(),
        )
        .unwrap();
    let unbound = prepared.execute().await;
    assert!(
        matches!(code(&unbound), Some((tonic::Code::InvalidArgument, m)) if m.contains("$2")),
        "{unbound:?}"
    );
    // Nothing bound at all.
    let mut prepared = sql
        .prepare("SELECT name FROM app.users WHERE id = $1".into(), None)
        .await
        .unwrap();
    let unbound = prepared.execute().await;
    assert!(
        matches!(code(&unbound), Some((tonic::Code::InvalidArgument, m)) if m.contains("no value bound to $1")),
        "{unbound:?}"
    );
    c.stop().await;
}

/// `INSERT INTO` appends to a log table and upserts into a primary-key table, through the
/// nodes; what cannot be written is refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_into_log_and_primary_key_tables() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    assert_eq!(
        c.rows("INSERT INTO app.events VALUES (1000, 'x', 5), (1001, NULL, NULL)")
            .await,
        strings(&[&["2"]])
    );
    assert_eq!(
        c.rows("SELECT id, kind, amount FROM app.events WHERE id >= 1000 ORDER BY id")
            .await,
        strings(&[&["1000", "x", "5"], &["1001", "NULL", "NULL"]])
    );
    // From a query, with columns named (the others null).
    assert_eq!(
        c.rows("INSERT INTO app.events (id, amount) SELECT id + 2000, amount FROM app.events WHERE id < 3")
            .await,
        strings(&[&["3"]])
    );
    assert_eq!(
        c.rows("SELECT count(*), sum(amount) FROM app.events WHERE id >= 2000")
            .await,
        strings(&[&["3", "30"]])
    );
    // A primary-key table: an insert of an existing key replaces its row.
    c.rows("INSERT INTO app.users VALUES (1, 'anna'), (5, 'eve')")
        .await;
    assert_eq!(
        c.rows("SELECT id, name FROM app.users ORDER BY id").await,
        strings(&[&["1", "anna"], &["2", "bo"], &["4", "dan"], &["5", "eve"]])
    );
    let null_key = c
        .error("INSERT INTO app.events VALUES (NULL, 'x', 1)")
        .await;
    assert!(
        null_key.contains("column id of app.events is NOT NULL"),
        "{null_key}"
    );
    let overwrite = c
        .error("INSERT OVERWRITE app.events VALUES (1, 'x', 1)")
        .await;
    assert!(overwrite.contains("not supported"), "{overwrite}");
    // A value that would lose its fraction in an integer column is refused, not truncated;
    // a cast the statement writes itself stands.
    for lossy in [
        "INSERT INTO app.events VALUES (1.5, 'x', 1)",
        "INSERT INTO app.events (id, amount) VALUES (3000, 2), (3001, 2.5)",
        "INSERT INTO app.events SELECT id + 3000, kind, amount * 1.5 FROM app.events",
    ] {
        let refused = c.error(lossy).await;
        assert!(
            refused.contains("is refused, not truncated"),
            "{lossy}: {refused}"
        );
    }
    assert_eq!(
        c.rows("INSERT INTO app.events VALUES (4000, 'x', CAST(2.5 AS BIGINT) + 1)")
            .await,
        strings(&[&["1"]])
    );
    // A number out of its column's range is refused naming the column.
    c.rows("CREATE TABLE app.small (id INT NOT NULL, b TINYINT)")
        .await;
    for (overflow, column) in [
        (
            "INSERT INTO app.small VALUES (3000000000, 1)",
            "column id is Int32",
        ),
        (
            "INSERT INTO app.small (id, b) VALUES (1, 2), (2, 300)",
            "column b is Int8",
        ),
        ("INSERT INTO app.small SELECT 1, -129", "column b is Int8"),
    ] {
        let refused = c.error(overflow).await;
        assert!(
            refused.contains(column) && refused.contains("is out of its range"),
            "{overflow}: {refused}"
        );
    }
    // So is a text its column's type cannot read (DataFusion's cast error named neither).
    c.rows("CREATE TABLE app.typed (id BIGINT NOT NULL, at TIMESTAMP, d DECIMAL(10, 2))")
        .await;
    for (wrong, column) in [
        (
            "INSERT INTO app.typed VALUES ('x', NULL, NULL)",
            "column id is Int64, and 'x'",
        ),
        (
            "INSERT INTO app.typed (id, at) VALUES (1, 'notadate')",
            "column at is Timestamp(µs), and 'notadate'",
        ),
        (
            "INSERT INTO app.typed (id, d) VALUES (1, 'abc')",
            "column d is Decimal128(10, 2)",
        ),
    ] {
        let refused = c.error(wrong).await;
        assert!(
            refused.contains(column) && refused.contains("is not a value of it"),
            "{wrong}: {refused}"
        );
    }
    assert_eq!(
        c.rows("INSERT INTO app.typed VALUES ('7', '2026-11-30 12:00:00', '1.25')")
            .await,
        strings(&[&["1"]])
    );
    // Scientific notation is a DOUBLE (the planner casts the text '1e3'): 1e3 fits, 1e-3 has
    // more places than the column keeps. Both were "out of its range" (the text was cast).
    assert_eq!(
        c.rows("INSERT INTO app.typed (id, d) VALUES (8, 1e3)")
            .await,
        strings(&[&["1"]])
    );
    let refused = c
        .error("INSERT INTO app.typed (id, d) VALUES (9, 1e-3)")
        .await;
    assert!(refused.contains("not exactly a value of it"), "{refused}");
    // A column or expression of floating-point numbers into a decimal: each value would be
    // rounded (0.333 was stored as 0.33), so it is refused by type, as a float literal is.
    c.rows("CREATE TABLE app.floats (id BIGINT NOT NULL, f DOUBLE)")
        .await;
    c.rows("INSERT INTO app.floats VALUES (1, 0.333)").await;
    for rounded in [
        "INSERT INTO app.typed (id, d) SELECT id + 20, f FROM app.floats",
        "INSERT INTO app.typed (id, d) SELECT id + 20, f * 2 FROM app.floats",
    ] {
        let refused = c.error(rounded).await;
        assert!(
            refused.contains("column d is Decimal128(10, 2)")
                && refused.contains("floating-point values are refused, not rounded"),
            "{rounded}: {refused}"
        );
    }
    assert_eq!(
        c.rows("INSERT INTO app.typed (id, d) SELECT id + 20, CAST(f AS DECIMAL(10, 2)) FROM app.floats")
            .await,
        strings(&[&["1"]])
    );
    // Nothing of the refused statements was stored.
    assert_eq!(
        c.rows("SELECT count(*) FROM app.events").await,
        strings(&[&["106"]])
    );
    c.stop().await;
}

/// `now()` and `TIMESTAMPTZ` literals carry their instant (the session is in UTC, as a
/// PostgreSQL one can be): stored into a column of another zone they keep it, and a filter
/// with one finds the row. Without a session zone DataFusion gave them none, and Europe/Berlin
/// columns got instants an hour off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zoned_literals_keep_their_instant() {
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.rows("CREATE SCHEMA app").await;
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "b",
            DataType::Timestamp(TimeUnit::Millisecond, Some("Europe/Berlin".into())),
            true,
        ),
    ]);
    one_bucket_table(&c, "berlin", &schema).await;
    assert_eq!(
        c.rows("SELECT arrow_typeof(now()), arrow_typeof(TIMESTAMPTZ '2024-01-01T10:00:00Z')")
            .await,
        strings(&[&["Timestamp(ns, \"UTC\")", "Timestamp(ns, \"UTC\")"]])
    );
    c.rows(
        "INSERT INTO app.berlin VALUES (1, TIMESTAMPTZ '2024-01-01T10:00:00Z'), \
         (2, CAST('2024-06-01T10:00:00Z' AS TIMESTAMPTZ))",
    )
    .await;
    assert_eq!(
        c.rows("SELECT id, b FROM app.berlin ORDER BY id").await,
        strings(&[
            &["1", "2024-01-01T11:00:00+01:00"],
            &["2", "2024-06-01T12:00:00+02:00"]
        ])
    );
    assert_eq!(
        c.rows("SELECT id FROM app.berlin WHERE b = TIMESTAMPTZ '2024-01-01T10:00:00Z'")
            .await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("SELECT count(*) FROM app.berlin WHERE b < now()")
            .await,
        strings(&[&["2"]])
    );
    // A timestamp without a zone is read in the session's zone, UTC, as PostgreSQL reads it
    // (Arrow's cast read it as Berlin's wall time: 2023-12-31T23:00Z).
    c.rows("INSERT INTO app.berlin VALUES (3, TIMESTAMP '2024-01-01 00:00:00')")
        .await;
    assert_eq!(
        c.rows(
            "SELECT id, b FROM app.berlin WHERE b = TIMESTAMP '2024-01-01 00:00:00' \
             OR b = CAST(TIMESTAMP '2024-01-01 00:00:00' AS TIMESTAMPTZ)"
        )
        .await,
        strings(&[&["3", "2024-01-01T01:00:00+01:00"]])
    );
    // So is text without an offset, inserted or compared (Arrow read it as Berlin's wall
    // time, an hour off from `TIMESTAMP '...'`); text with an offset keeps it.
    c.rows(
        "INSERT INTO app.berlin VALUES (4, '2024-02-01 10:00:00'), (5, '2024-02-01T10:00:00+05:00')",
    )
    .await;
    assert_eq!(
        c.rows(
            "SELECT id, b FROM app.berlin WHERE b = '2024-02-01 10:00:00'              OR b = '2024-02-01T05:00:00Z' ORDER BY id"
        )
        .await,
        strings(&[
            &["4", "2024-02-01T11:00:00+01:00"],
            &["5", "2024-02-01T06:00:00+01:00"]
        ])
    );
    c.stop().await;
}

/// SQL's `TIMESTAMP` is microseconds (as in Postgres, Spark and Iceberg, whose v2 tables have
/// no nanoseconds), `TIMESTAMPTZ` microseconds in UTC; a lake table refuses nanoseconds when it
/// is created, naming the column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_timestamps_are_microseconds() {
    use arrow::datatypes::{DataType, TimeUnit};
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.rows("CREATE SCHEMA app").await;
    c.rows(
        "CREATE TABLE app.ts (id BIGINT NOT NULL, at TIMESTAMP, at_utc TIMESTAMPTZ, \
         at_tz TIMESTAMP WITH TIME ZONE, at_ns TIMESTAMP(9)) WITH ('bucket.num' = '1')",
    )
    .await;
    c.rows("ALTER TABLE app.ts ADD COLUMN later TIMESTAMPTZ")
        .await;
    let schema = c.client.schema("app", "ts").await.unwrap();
    let types: Vec<DataType> = schema
        .fields()
        .iter()
        .skip(1)
        .map(|f| f.data_type().clone())
        .collect();
    let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    assert_eq!(
        types,
        vec![
            DataType::Timestamp(TimeUnit::Microsecond, None),
            utc.clone(),
            utc.clone(),
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            utc,
        ]
    );
    // A lake table with timestamps tiers and reads back.
    c.rows(
        "CREATE TABLE app.lts (id BIGINT NOT NULL, at TIMESTAMP, at_utc TIMESTAMPTZ) WITH \
         ('bucket.num' = '1', 'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1h')",
    )
    .await;
    c.rows(
        "INSERT INTO app.lts VALUES (1, TIMESTAMP '2026-01-02 03:04:05.123456', \
         TIMESTAMP '2026-01-02 03:04:05Z')",
    )
    .await;
    tier_now(&c, "lts").await;
    assert_eq!(
        c.rows("SELECT at, at_utc FROM app.\"lts$lake\"").await,
        strings(&[&["2026-01-02T03:04:05.123456", "2026-01-02T03:04:05Z"]])
    );
    let refused = c
        .error(
            "CREATE TABLE app.lns (id BIGINT NOT NULL, at_ns TIMESTAMP(9)) WITH \
             ('bucket.num' = '1', 'table.datalake.enabled' = 'true')",
        )
        .await;
    assert!(
        refused.contains("at_ns") && refused.contains("use microseconds"),
        "{refused}"
    );
    c.stop().await;
}

/// A table tiered into the lake: the table is the union of lake and log, `t$lake` its lake
/// snapshot, `t$log` its log; filters prune the lake's side too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lake_tables_read_as_union_lake_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    lake_table_lk(&c).await;
    assert_eq!(
        c.rows("SELECT count(*), min(id), max(id) FROM app.lk")
            .await,
        strings(&[&["60", "0", "59"]])
    );
    assert_eq!(
        c.rows("SELECT count(*), max(id) FROM app.lk$lake").await,
        strings(&[&["50", "49"]])
    );
    assert_eq!(
        c.rows("SELECT count(*) FROM app.lk$log").await,
        strings(&[&["60"]])
    );
    assert_eq!(
        c.rows("SELECT id FROM app.lk$lake WHERE id >= 47 ORDER BY id")
            .await,
        strings(&[&["47"], &["48"], &["49"]])
    );
    // The lake's side is read by the engine from object storage, the log's from the nodes.
    let plan = c
        .rows("EXPLAIN SELECT count(*) FROM app.lk WHERE v = 'buy'")
        .await;
    let physical = &plan.last().unwrap()[1];
    assert!(
        physical.contains("MinkLakeExec: table=app.lk, files=")
            && physical.contains("MinkScanExec: table=app.lk, splits=2"),
        "{physical}"
    );
    assert_eq!(
        c.rows("SELECT count(*) FROM app.lk WHERE v = 'buy'").await,
        c.rows("SELECT count(*) FROM app.events WHERE id < 60 AND kind = 'buy'")
            .await
    );
    // Freshness: the lake alone when the statement allows it (no log tail read).
    c.rows("SET mink.freshness = 'lake'").await;
    assert_eq!(
        c.rows("SELECT count(*) FROM app.lk").await,
        strings(&[&["50"]])
    );
    let plan = c.rows("EXPLAIN SELECT count(*) FROM app.lk").await;
    assert!(
        !plan.last().unwrap()[1].contains("MinkScanExec"),
        "{plan:?}"
    );
    c.rows("SET mink.freshness = '1h'").await;
    assert_eq!(
        c.rows("SELECT count(*) FROM app.lk").await,
        strings(&[&["50"]])
    );
    c.rows("SET mink.freshness = '0s'").await;
    assert_eq!(
        c.rows("SELECT count(*) FROM app.lk").await,
        strings(&[&["60"]])
    );
    c.rows("SET mink.freshness = latest").await;
    assert_eq!(
        c.rows("SELECT count(*) FROM app.lk").await,
        strings(&[&["60"]])
    );
    let bad = c.error("SET mink.freshness = 'soon'").await;
    assert!(
        bad.contains("expected 'latest', 'lake' or a duration"),
        "{bad}"
    );
    // Over Flight SQL, a request's mink-freshness header.
    {
        use arrow_flight::sql::{CommandStatementQuery, ProstMessageExt as _};
        use prost::Message as _;
        let mut flight =
            arrow_flight::flight_service_client::FlightServiceClient::new(c.channel().await);
        let command = CommandStatementQuery {
            query: "SELECT count(*) FROM app.lk".into(),
            transaction_id: None,
        };
        let mut request = tonic::Request::new(arrow_flight::FlightDescriptor::new_cmd(
            command.as_any().encode_to_vec(),
        ));
        request
            .metadata_mut()
            .insert("mink-freshness", "lake".parse().unwrap());
        let info = flight.get_flight_info(request).await.unwrap().into_inner();
        let mut sql = c.flight_sql().await;
        let batches = fetch(&mut sql, &info).await.unwrap();
        assert_eq!(common::text_rows(&batches), strings(&[&["50"]]));
    }
    c.stop().await;
}

/// `app.lk`, tiered into the lake: ids 0..50 of `app.events` in the lake, 50..60 in the log.
async fn lake_table_lk(c: &Cluster) {
    c.rows(
        "CREATE TABLE app.lk (id BIGINT NOT NULL, v VARCHAR) WITH ('bucket.num' = '2', \
         'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1h')",
    )
    .await;
    c.rows("INSERT INTO app.lk SELECT id, kind FROM app.events WHERE id < 50")
        .await;
    tier_now(c, "lk").await;
    c.rows("INSERT INTO app.lk SELECT id, kind FROM app.events WHERE id >= 50 AND id < 60")
        .await;
}

/// A tiering round of `app.<table>` now, on the lease holder: retried until this node holds
/// the lease and no scheduled round races it (a conflicting commit is refused, not merged).
async fn tier_now(c: &Cluster, table: &str) {
    tier_now_in(c, "app", table).await;
}

/// [`tier_now`] of `database.table`.
async fn tier_now_in(c: &Cluster, database: &str, table: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match c.node.tier_now(database, table).await {
            Ok(_) => return,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "waited to tier {database}.{table}: {e}"
                );
                c.client
                    .wait_for_change(std::time::Duration::from_millis(200))
                    .await
                    .unwrap();
            }
        }
    }
}

/// Waits (at most `within`) until `rows` rows of `app.<table>` are tiered.
async fn until_tiered(c: &Cluster, table: &str, rows: u64, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let t: u64 = c
            .rows(&format!(
                "SELECT coalesce(sum(tiered_offset), 0) FROM system.buckets WHERE \"table\" = '{table}'"
            ))
            .await[0][0]
            .parse()
            .unwrap();
        if t == rows {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "waited {within:?} for {rows} tiered rows of app.{table}; {t} are"
        );
        c.client
            .wait_for_change(std::time::Duration::from_millis(500))
            .await
            .unwrap();
    }
}

/// A partitioned lake table read directly: each partition's lake files and log tails; a
/// dropped partition's rows are gone at once, even while the lake snapshot recorded before the
/// drop still holds its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_lake_table_reads_its_live_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    c.rows(
        "CREATE TABLE app.daily (id BIGINT NOT NULL, v VARCHAR) PARTITIONED BY (day VARCHAR) \
         WITH ('bucket.num' = '2', 'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1h')",
    )
    .await;
    c.rows(
        "INSERT INTO app.daily SELECT id, kind, CASE WHEN id % 2 = 0 THEN '2026-12-01' ELSE '2026-12-02' END FROM app.events WHERE id < 40",
    )
    .await;
    tier_now(&c, "daily").await;
    until_tiered(&c, "daily", 40, std::time::Duration::from_secs(20)).await;
    assert_eq!(
        c.rows("SELECT day, count(*) FROM app.daily GROUP BY day ORDER BY day")
            .await,
        strings(&[&["2026-12-01", "20"], &["2026-12-02", "20"]])
    );
    assert_eq!(
        c.rows("SELECT count(*) FROM app.daily$lake WHERE day = '2026-12-02'")
            .await,
        strings(&[&["20"]])
    );
    c.client
        .drop_partition("app", "daily", "2026-12-02", false)
        .await
        .unwrap();
    assert_eq!(
        c.rows("SELECT day, count(*) FROM app.daily GROUP BY day")
            .await,
        strings(&[&["2026-12-01", "20"]])
    );
    c.stop().await;
}

/// Queries that read a long log tail of a lake table tier it sooner: the engine reports the
/// tail rows its scans read to the tiering node, which runs the next round as soon as they
/// add up, long before the table's freshness would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_reading_a_long_tail_tier_the_table_sooner() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start_with(dir.path(), |n| n.tail_rows_for_a_round = 20).await;
    c.load().await;
    // Freshness 60 s: without queries, a round every 30 s.
    c.rows(
        "CREATE TABLE app.hot (id BIGINT NOT NULL, v VARCHAR) WITH ('bucket.num' = '2', \
         'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '60s')",
    )
    .await;
    c.rows("INSERT INTO app.hot SELECT id, kind FROM app.events WHERE id < 50")
        .await;
    tier_now(&c, "hot").await;
    until_tiered(&c, "hot", 50, std::time::Duration::from_secs(20)).await;
    c.rows("INSERT INTO app.hot SELECT id, kind FROM app.events WHERE id >= 50 AND id < 80")
        .await;
    // A query reads the 30-row tail (more than 20): the next round comes within seconds,
    // not at the 30 s the freshness gives. (`max(id)` reads the rows; `count(*)` alone would
    // come from the row counts, reading nothing.)
    assert_eq!(
        c.rows("SELECT count(*), max(id) FROM app.hot").await,
        strings(&[&["80", "79"]])
    );
    until_tiered(&c, "hot", 80, std::time::Duration::from_secs(20)).await;
    c.stop().await;
}

/// `UPDATE` and `DELETE` change a primary-key table's rows by key: the rows their filters
/// select, read at the statement's cut, written back as upserts or deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_and_delete_change_primary_key_tables() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    // EXPLAIN plans a statement and changes nothing; EXPLAIN ANALYZE runs it.
    for explained in [
        "EXPLAIN DELETE FROM app.users WHERE id = 4",
        "EXPLAIN UPDATE app.users SET name = 'x' WHERE id = 1",
    ] {
        c.rows(explained).await;
    }
    assert_eq!(
        c.rows("SELECT id, name FROM app.users ORDER BY id").await,
        strings(&[&["1", "ann"], &["2", "bo"], &["4", "dan"]])
    );
    c.rows("EXPLAIN ANALYZE UPDATE app.users SET name = 'x' WHERE id = 1")
        .await;
    assert_eq!(
        c.rows("SELECT name FROM app.users WHERE id = 1").await,
        strings(&[&["x"]])
    );
    c.rows("UPDATE app.users SET name = 'ann' WHERE id = 1")
        .await;
    assert_eq!(
        c.rows("UPDATE app.users SET name = upper(name) WHERE id >= 2")
            .await,
        strings(&[&["2"]])
    );
    assert_eq!(
        c.rows("SELECT id, name FROM app.users ORDER BY id").await,
        strings(&[&["1", "ann"], &["2", "BO"], &["4", "DAN"]])
    );
    assert_eq!(
        c.rows("DELETE FROM app.users WHERE name = 'DAN'").await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("SELECT id, name FROM app.users ORDER BY id").await,
        strings(&[&["1", "ann"], &["2", "BO"]])
    );
    // The changes are in the changelog, as any write's.
    assert_eq!(
        c.rows(
            "SELECT _change_type, name FROM app.users$changelog WHERE id = 4 ORDER BY _log_offset"
        )
        .await,
        strings(&[
            &["insert", "dan"],
            &["update_before", "dan"],
            &["update_after", "DAN"],
            &["delete", "DAN"]
        ])
    );
    // A WHERE the optimizer proves empty changes nothing (DataFusion hands the table no
    // filter then); a subquery in it is refused.
    for nothing in [
        "DELETE FROM app.users WHERE id = NULL",
        "DELETE FROM app.users WHERE 1 = 0",
        "UPDATE app.users SET name = 'gone' WHERE name = NULL",
    ] {
        assert_eq!(c.rows(nothing).await, strings(&[&["0"]]), "{nothing}");
    }
    assert_eq!(
        c.rows("SELECT id, name FROM app.users ORDER BY id").await,
        strings(&[&["1", "ann"], &["2", "BO"]])
    );
    let sub = c
        .error("DELETE FROM app.users WHERE id IN (SELECT id FROM app.events WHERE id < 2)")
        .await;
    assert!(sub.contains("subquery"), "{sub}");
    // The table under an alias, as PostgreSQL takes it.
    assert_eq!(
        c.rows("UPDATE app.users AS u SET name = 'BOB' WHERE u.id = 2")
            .await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("UPDATE app.users u SET name = 'BO' WHERE id = 2")
            .await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("DELETE FROM app.users AS U WHERE u.id = 3").await,
        strings(&[&["0"]])
    );
    c.rows("EXPLAIN DELETE FROM app.users AS u WHERE u.id = 3")
        .await;
    // A key asked for twice is one row.
    assert_eq!(
        c.rows("SELECT count(*) FROM app.users WHERE id IN (1, 1)")
            .await,
        strings(&[&["1"]])
    );
    let key = c.error("UPDATE app.users SET id = 7 WHERE id = 1").await;
    assert!(key.contains("id is part of the primary key"), "{key}");
    let log = c.error("DELETE FROM app.events WHERE id = 1").await;
    assert!(log.contains("app.events is a log table"), "{log}");
    let view = c.error("DELETE FROM app.users$changelog").await;
    assert!(view.contains("read-only"), "{view}");
    // Without a filter: every row.
    assert_eq!(
        c.rows("UPDATE app.users SET name = 'x'").await,
        strings(&[&["2"]])
    );
    assert_eq!(c.rows("DELETE FROM app.users").await, strings(&[&["2"]]));
    assert_eq!(
        c.rows("SELECT count(*) FROM app.users").await,
        strings(&[&["0"]])
    );
    c.stop().await;
}

/// `UPDATE` and `DELETE` are refused on tables whose merge engine would not carry them out as
/// written (as Apache Fluss refuses them): an aggregation would sum an update into the row, a
/// `first_row` or `versioned` table ignores it, and a table whose `table.delete.behavior` is
/// not `allow` drops or refuses deletes. The rows stay as they were; over Flight SQL the
/// refusal is `INVALID_ARGUMENT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_and_delete_refuse_what_the_merge_engine_would_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    for ddl in [
        "CREATE TABLE app.visits (user_id BIGINT NOT NULL, visits BIGINT, PRIMARY KEY (user_id)) \
         WITH ('table.merge-engine' = 'aggregation', 'fields.visits.agg' = 'sum')",
        "CREATE TABLE app.firsts (id BIGINT NOT NULL, name VARCHAR, PRIMARY KEY (id)) \
         WITH ('table.merge-engine' = 'first_row')",
        "CREATE TABLE app.versions (id BIGINT NOT NULL, ver BIGINT, name VARCHAR, PRIMARY KEY (id)) \
         WITH ('table.merge-engine' = 'versioned', 'table.merge-engine.versioned.ver-column' = 'ver')",
        "CREATE TABLE app.kept (id BIGINT NOT NULL, name VARCHAR, PRIMARY KEY (id)) \
         WITH ('table.delete.behavior' = 'ignore')",
    ] {
        c.rows(ddl).await;
    }
    c.rows("INSERT INTO app.visits VALUES (1, 5)").await;
    c.rows("INSERT INTO app.firsts VALUES (1, 'ann')").await;
    c.rows("INSERT INTO app.versions VALUES (1, 1, 'ann')")
        .await;
    c.rows("INSERT INTO app.kept VALUES (1, 'ann')").await;
    for (statement, names) in [
        (
            "UPDATE app.visits SET visits = 100 WHERE user_id = 1",
            &["app.visits", "aggregation", "summed"][..],
        ),
        (
            "DELETE FROM app.visits WHERE user_id = 1",
            &["app.visits", "aggregation"][..],
        ),
        (
            "UPDATE app.firsts SET name = 'bob' WHERE id = 1",
            &["app.firsts", "first_row"][..],
        ),
        ("DELETE FROM app.firsts", &["app.firsts", "first_row"][..]),
        (
            "UPDATE app.versions SET name = 'bob' WHERE id = 1",
            &["app.versions", "versioned"][..],
        ),
        (
            "DELETE FROM app.versions WHERE id = 1",
            &["app.versions", "versioned"][..],
        ),
        (
            "DELETE FROM app.kept WHERE id = 1",
            &["app.kept", "table.delete.behavior", "ignore"][..],
        ),
    ] {
        let refused = c.error(statement).await;
        for name in names {
            assert!(refused.contains(name), "{statement}: {refused}");
        }
    }
    // Nothing changed.
    assert_eq!(
        c.rows("SELECT visits FROM app.visits").await,
        strings(&[&["5"]])
    );
    assert_eq!(
        c.rows("SELECT name FROM app.firsts").await,
        strings(&[&["ann"]])
    );
    assert_eq!(
        c.rows("SELECT name FROM app.versions").await,
        strings(&[&["ann"]])
    );
    // Deletes are what `ignore` drops; an update applies.
    assert_eq!(
        c.rows("UPDATE app.kept SET name = 'bob' WHERE id = 1")
            .await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("SELECT name FROM app.kept").await,
        strings(&[&["bob"]])
    );
    let mut sql = c.flight_sql().await;
    let refused = sql
        .execute_update("UPDATE app.visits SET visits = 100".into(), None)
        .await;
    assert!(
        matches!(&refused, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument && s.message().contains("aggregation")),
        "{refused:?}"
    );
    c.stop().await;
}

/// A table's auto-increment column is generated by the nodes: `INSERT` leaves it out (a new key
/// gets a value), `UPDATE` and `DELETE` leave it alone (a key keeps its value), and a statement
/// that sets it is refused, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_increment_columns_are_generated() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    c.rows(
        "CREATE TABLE app.ai (k VARCHAR NOT NULL, uid BIGINT, v INT, PRIMARY KEY (k)) \
         WITH ('auto-increment.fields' = 'uid', 'bucket.num' = '2')",
    )
    .await;
    assert_eq!(
        c.rows("INSERT INTO app.ai (k, v) VALUES ('a', 1), ('b', 2), ('c', 3)")
            .await,
        strings(&[&["3"]])
    );
    assert_eq!(
        c.rows("INSERT INTO app.ai (v, k) SELECT 4, 'd'").await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("SELECT count(DISTINCT uid), count(*) FROM app.ai WHERE uid IS NOT NULL")
            .await,
        strings(&[&["4", "4"]])
    );
    let uid_of_a = c.rows("SELECT uid FROM app.ai WHERE k = 'a'").await;
    assert_eq!(
        c.rows("UPDATE app.ai SET v = 50 WHERE k = 'a'").await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("UPDATE app.ai SET v = v + 1 WHERE k <> 'a'").await,
        strings(&[&["3"]])
    );
    assert_eq!(
        c.rows("SELECT uid FROM app.ai WHERE k = 'a'").await,
        uid_of_a
    );
    assert_eq!(
        c.rows("DELETE FROM app.ai WHERE k = 'b'").await,
        strings(&[&["1"]])
    );
    assert_eq!(
        c.rows("SELECT k, v FROM app.ai ORDER BY k").await,
        strings(&[&["a", "50"], &["c", "4"], &["d", "5"]])
    );
    for statement in [
        "INSERT INTO app.ai VALUES ('e', 7, 1)",
        "INSERT INTO app.ai (k, uid, v) VALUES ('e', 7, 1)",
        "INSERT INTO app.ai (k, uid, v) SELECT 'e', 7, 1",
        "UPDATE app.ai SET uid = 9 WHERE k = 'a'",
    ] {
        let refused = c.error(statement).await;
        assert!(
            refused.contains("uid") && refused.contains("auto-increment"),
            "{statement}: {refused}"
        );
    }
    assert_eq!(
        c.rows("SELECT count(*) FROM app.ai").await,
        strings(&[&["3"]])
    );
    assert_eq!(
        c.rows("SELECT uid FROM app.ai WHERE k = 'a'").await,
        uid_of_a
    );
    c.stop().await;
}

/// The batches of a statement's (first) endpoint.
async fn fetch(
    sql: &mut FlightSqlServiceClient<tonic::transport::Channel>,
    info: &arrow_flight::FlightInfo,
) -> Result<Vec<arrow::array::RecordBatch>, arrow_flight::error::FlightError> {
    let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
    sql.do_get(ticket).await?.try_collect().await
}

/// A prepared statement outlives the Flight SQL server that prepared it: a BI tool or ADBC
/// cursor re-runs its handle after `mink-query serve` restarted (it got NOT_FOUND for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_statement_runs_after_the_server_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path()).await;
    c.load().await;
    let mut sql = c.flight_sql().await;
    let mut prepared = sql
        .prepare(
            "SELECT count(*) FROM app.events WHERE id >= $1".into(),
            None,
        )
        .await
        .unwrap();
    let bound = || {
        arrow::array::RecordBatch::try_from_iter(vec![(
            "$1",
            std::sync::Arc::new(arrow::array::Int64Array::from(vec![40])) as arrow::array::ArrayRef,
        )])
        .unwrap()
    };
    let mut counts = Vec::new();
    for restart in [false, true] {
        if restart {
            c.restart_sql().await;
        }
        prepared.set_parameters(bound()).unwrap();
        // The channel reconnects to the new server on the first call after the restart; a
        // call that met the old connection as it closed is `Cancelled` ("connection closed").
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let info = loop {
            match prepared.execute().await {
                Err(arrow_flight::error::FlightError::Tonic(s))
                    if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Cancelled)
                        && std::time::Instant::now() < deadline =>
                {
                    prepared.set_parameters(bound()).unwrap();
                }
                other => break other.unwrap(),
            }
        };
        let batches = fetch(&mut sql, &info).await.unwrap();
        counts.push(
            arrow::util::pretty::pretty_format_batches(&batches)
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(counts[0], counts[1]);
    assert!(counts[0].contains("| 60 "), "{}", counts[0]);
    c.stop().await;
}

/// A prepared `INSERT`'s parameters are cast to their columns' types (a client binds a Python
/// int as Int64, whatever the column); a value that does not fit is refused, naming the column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_insert_parameters_take_their_columns_types() {
    use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    c.rows("CREATE TABLE app.o (id BIGINT, item VARCHAR, qty INT, PRIMARY KEY (id))")
        .await;
    let mut sql = c.flight_sql().await;
    let row = |id: i64, item: &str, qty: i64| {
        RecordBatch::try_from_iter(vec![
            ("$1", Arc::new(Int64Array::from(vec![id])) as ArrayRef),
            ("$2", Arc::new(StringArray::from(vec![item])) as ArrayRef),
            ("$3", Arc::new(Int64Array::from(vec![qty])) as ArrayRef),
        ])
        .unwrap()
    };
    // As an update (ADBC's executemany) and as a query (its execute).
    let mut prepared = sql
        .prepare("INSERT INTO app.o VALUES (?, ?, ?)".into(), None)
        .await
        .unwrap();
    prepared.set_parameters(row(11, "fig", 2)).unwrap();
    assert_eq!(prepared.execute_update().await.unwrap(), 1);
    prepared.set_parameters(row(12, "kiwi", 3)).unwrap();
    prepared.execute().await.unwrap();
    assert_eq!(
        c.rows("SELECT id, item, qty FROM app.o ORDER BY id").await,
        strings(&[&["11", "fig", "2"], &["12", "kiwi", "3"]])
    );
    // Also with the columns named, in another order.
    let mut named = sql
        .prepare(
            "INSERT INTO app.o (qty, id, item) VALUES ($1, $2, $3)".into(),
            None,
        )
        .await
        .unwrap();
    named
        .set_parameters(
            RecordBatch::try_from_iter(vec![
                ("$1", Arc::new(Int64Array::from(vec![4])) as ArrayRef),
                ("$2", Arc::new(Int64Array::from(vec![13])) as ArrayRef),
                ("$3", Arc::new(StringArray::from(vec!["lime"])) as ArrayRef),
            ])
            .unwrap(),
        )
        .unwrap();
    assert_eq!(named.execute_update().await.unwrap(), 1);
    // 2^40 does not fit an INT, and 2.7 is not an integer (it was stored as 2).
    let fraction = RecordBatch::try_from_iter(vec![
        ("$1", Arc::new(Int64Array::from(vec![15])) as ArrayRef),
        ("$2", Arc::new(StringArray::from(vec!["pear"])) as ArrayRef),
        (
            "$3",
            Arc::new(arrow::array::Float64Array::from(vec![2.7])) as ArrayRef,
        ),
    ])
    .unwrap();
    for parameters in [row(14, "plum", 1 << 40), fraction] {
        prepared.set_parameters(parameters).unwrap();
        for refused in [
            prepared.execute_update().await.map(|_| ()),
            prepared.execute().await.map(|_| ()),
        ] {
            assert!(
                matches!(&refused, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument && s.message().contains("qty")),
                "{refused:?}"
            );
        }
    }
    assert_eq!(
        c.rows("SELECT id, item, qty FROM app.o ORDER BY id").await,
        strings(&[
            &["11", "fig", "2"],
            &["12", "kiwi", "3"],
            &["13", "lime", "4"]
        ])
    );
    c.stop().await;
}

/// An `INSERT` that gives a NOT NULL column (a key column, or one declared NOT NULL) no value or
/// NULL is refused naming the column, as the statement's fault (`INVALID_ARGUMENT` over Flight
/// SQL), and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_refuses_null_in_not_null_columns_naming_them() {
    use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    c.rows("CREATE TABLE app.o (id BIGINT, item VARCHAR, qty INT, PRIMARY KEY (id))")
        .await;
    c.rows("CREATE TABLE app.nn (a BIGINT NOT NULL, b VARCHAR NOT NULL, c INT)")
        .await;
    for (statement, column) in [
        (
            "INSERT INTO app.o VALUES (NULL, 'x', 1)",
            "column id of app.o is NOT NULL (a key column)",
        ),
        (
            "INSERT INTO app.o (item, qty) VALUES ('x', 1)",
            "column id of app.o is NOT NULL (a key column)",
        ),
        (
            "INSERT INTO app.o VALUES (1, 'x', 1), (NULL, 'y', 2)",
            "column id of app.o",
        ),
        (
            "INSERT INTO app.o SELECT CASE WHEN id > 1 THEN NULL ELSE id END, 'x', 1 FROM app.users",
            "column id of app.o",
        ),
        (
            "INSERT INTO app.nn (a, c) VALUES (1, 1)",
            "column b of app.nn is NOT NULL",
        ),
        (
            "INSERT INTO app.nn VALUES (1, NULL, 1)",
            "column b of app.nn is NOT NULL",
        ),
        (
            "INSERT INTO app.events (kind) VALUES ('x')",
            "column id of app.events is NOT NULL",
        ),
    ] {
        let refused = c.error(statement).await;
        assert!(refused.contains(column), "{statement}: {refused}");
    }
    // A null in a later batch of a SELECT: the batches before it are stored, and the error
    // says how many rows that was (a retry would store them again).
    c.rows("CREATE TABLE app.part (a BIGINT NOT NULL)").await;
    let refused = c
        .error(
            "INSERT INTO app.part SELECT CASE WHEN value = 50000 THEN NULL ELSE value END \
             FROM range(100000)",
        )
        .await;
    let stored = c.rows("SELECT count(*) FROM app.part").await[0][0].clone();
    assert!(stored != "0", "nothing was stored before the null");
    assert!(
        refused.contains(&format!(
            "INSERT INTO app.part stopped after {stored} rows were stored"
        )) && refused.contains("column a of app.part is NOT NULL"),
        "{refused}"
    );
    let mut sql = c.flight_sql().await;
    c.rows("CREATE TABLE app.daily (id BIGINT NOT NULL) PARTITIONED BY (day VARCHAR)")
        .await;
    for (statement, says) in [
        (
            "INSERT INTO app.o VALUES (NULL, 'x', 1)",
            "column id of app.o",
        ),
        (
            "INSERT INTO app.o (item, qty) VALUES ('x', 1)",
            "column id of app.o",
        ),
        // Refused by the writer, not the planner: INTERNAL before.
        (
            "INSERT INTO app.daily VALUES (1, NULL)",
            "partition column \"day\" is null",
        ),
    ] {
        let refused = sql.execute_update(statement.into(), None).await;
        assert!(
            matches!(&refused, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument && s.message().contains(says)),
            "{statement}: {refused:?}"
        );
    }
    // A parameter bound to null.
    let mut prepared = sql
        .prepare("INSERT INTO app.o VALUES (?, ?, ?)".into(), None)
        .await
        .unwrap();
    prepared
        .set_parameters(
            RecordBatch::try_from_iter(vec![
                ("$1", Arc::new(Int64Array::from(vec![None])) as ArrayRef),
                ("$2", Arc::new(StringArray::from(vec!["x"])) as ArrayRef),
                ("$3", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ])
            .unwrap(),
        )
        .unwrap();
    let refused = prepared.execute_update().await;
    assert!(
        matches!(&refused, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::InvalidArgument && s.message().contains("column id of app.o")),
        "{refused:?}"
    );
    assert_eq!(
        c.rows("SELECT (SELECT count(*) FROM app.o) AS o, (SELECT count(*) FROM app.nn) AS nn")
            .await,
        strings(&[&["0", "0"]])
    );
    c.stop().await;
}

/// A statement running over Flight SQL is listed in `system.queries` while its `DoGet`
/// streams; `CancelFlightInfo` stops it (its stream ends with CANCELLED) or forgets one planned
/// and not yet fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_statements_are_listed_and_cancelled() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    use futures::StreamExt as _;
    use prost::Message as _;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    let mut sql = c.flight_sql().await;
    // A million rows: more than the connection buffers, so the statement runs until read.
    let big = "SELECT a.id, b.id, c.id FROM app.events a, app.events b, app.events c";
    let info = sql.execute(big.into(), None).await.unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let mut stream = sql.do_get(ticket).await.unwrap();
    assert!(stream.next().await.unwrap().unwrap().num_rows() > 0);
    let listed = {
        let mut other = c.flight_sql().await;
        let i = other
            .execute("SELECT sql, source FROM system.queries".into(), None)
            .await
            .unwrap();
        let batches: Vec<_> = other
            .do_get(i.endpoint[0].ticket.clone().unwrap())
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        common::text_rows(&batches)
    };
    assert!(
        listed.contains(&vec![big.to_string(), "flight sql".to_string()]),
        "{listed:?}"
    );
    let cancel = |info: arrow_flight::FlightInfo| {
        let channel = c.channel();
        async move {
            let mut flight = FlightServiceClient::new(channel.await);
            let body = arrow_flight::CancelFlightInfoRequest::new(info).encode_to_vec();
            let mut results = flight
                .do_action(arrow_flight::Action::new("CancelFlightInfo", body))
                .await
                .unwrap()
                .into_inner();
            let r = results.message().await.unwrap().unwrap();
            arrow_flight::CancelFlightInfoResult::decode(r.body)
                .unwrap()
                .status()
        }
    };
    assert_eq!(cancel(info).await, arrow_flight::CancelStatus::Cancelled);
    let mut ended = None;
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            ended = Some(e);
            break;
        }
    }
    assert!(
        matches!(&ended, Some(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::Cancelled),
        "{ended:?}"
    );
    // Planned, not fetched: forgotten.
    let info = sql
        .execute("SELECT count(*) FROM app.events".into(), None)
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    assert_eq!(cancel(info).await, arrow_flight::CancelStatus::Cancelled);
    assert!(sql.do_get(ticket).await.is_err());
    c.stop().await;
}

/// Every file under `tests/slt` run against the loaded cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_files() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    // For tiered.slt: a log and a primary-key table of database `lake`, each with its first
    // rows tiered into the lake and later changes in the log.
    for sql in [
        "CREATE SCHEMA lake",
        "CREATE TABLE lake.clicks (id BIGINT NOT NULL, kind VARCHAR) WITH ('bucket.num' = '2', \
         'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1h')",
        "INSERT INTO lake.clicks SELECT id, kind FROM app.events WHERE id < 60",
        "CREATE TABLE lake.balances (id BIGINT NOT NULL, amount BIGINT, PRIMARY KEY (id)) WITH \
         ('bucket.num' = '2', 'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1h')",
        "INSERT INTO lake.balances VALUES (1, 10), (2, 20), (3, 30), (4, 40)",
    ] {
        c.rows(sql).await;
    }
    tier_now_in(&c, "lake", "clicks").await;
    tier_now_in(&c, "lake", "balances").await;
    for sql in [
        "INSERT INTO lake.clicks SELECT id, kind FROM app.events WHERE id >= 60",
        "INSERT INTO lake.balances VALUES (2, 21), (5, 50)",
        "DELETE FROM lake.balances WHERE id = 3",
    ] {
        c.rows(sql).await;
    }
    let root = manifest_dir().join("tests/slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let engine = c.engine.clone();
        let mut runner = sqllogictest::Runner::new(move || {
            let engine = engine.clone();
            async move { Ok(common::Slt(engine)) }
        });
        runner
            .run_file_async(&file)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
    c.stop().await;
}

/// The ADBC Flight SQL driver (as a BI tool or notebook uses it) and Polars over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adbc_and_polars_over_flight_sql() {
    let Some(python) = common::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    dictionary_table(&c).await;
    {
        use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
        let zoned = DataType::Timestamp(TimeUnit::Microsecond, Some("Europe/Berlin".into()));
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("b", zoned, true),
        ]);
        one_bucket_table(&c, "berlin", &schema).await;
    }
    let script = manifest_dir().join("tests/adbc_flight_sql.py");
    let uri = format!("grpc://{}", c.sql_address);
    let out = tokio::process::Command::new(python)
        .arg(&script)
        .arg(&uri)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    c.stop().await;
}

/// This package's directory, at run time: a shared target directory may hold a binary built
/// from another checkout.
fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// Waits (on the metadata's progress, 20 s at most) until `done` holds, naming `what` if not.
async fn until(node: &mink_node::Node, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done().await {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "{what} never happened");
        let next = node.view().applied_index + 1;
        let _ = node
            .wait_applied(next, left.min(std::time::Duration::from_millis(100)))
            .await;
    }
}

/// A query reads each bucket's log at the bucket's leader, whose log cache holds the recent
/// appends; when a leader cannot be reached, the connected node reads its buckets instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn log_reads_go_to_the_bucket_leaders() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    let second = c.add_node(dir.path(), 2).await;
    // Both nodes live before the table exists, so its buckets spread over them.
    until(&c.node, "two live nodes", async || {
        c.node.live_nodes().await.unwrap().len() == 2
    })
    .await;
    c.rows("CREATE SCHEMA app").await;
    c.rows("CREATE TABLE app.spread (id BIGINT NOT NULL, v VARCHAR) WITH ('bucket.num' = '8')")
        .await;
    let led_by = |node: u64| {
        c.node
            .describe_table("app", "spread")
            .unwrap()
            .buckets
            .iter()
            .filter(|b| b.leader_node_id == node)
            .count()
    };
    until(&c.node, "buckets led by both nodes", async || {
        led_by(1) + led_by(2) == 8 && led_by(2) > 0 && led_by(1) > 0
    })
    .await;
    let values: Vec<String> = (0..200).map(|i| format!("({i}, 'v{i}')")).collect();
    c.rows(&format!(
        "INSERT INTO app.spread VALUES {}",
        values.join(", ")
    ))
    .await;
    let with_rows = |node: u64| {
        c.node
            .describe_table("app", "spread")
            .unwrap()
            .buckets
            .iter()
            .filter(|b| b.leader_node_id == node && b.end_offset > 0)
            .count() as u64
    };
    let want = strings(&[&["200", "19900"]]);
    let sql = "SELECT count(v), sum(id) FROM app.spread";

    let (first_before, second_before) = (c.node.reads_served(), second.node.reads_served());
    assert_eq!(c.rows(sql).await, want);
    assert_eq!(
        second.node.reads_served() - second_before,
        with_rows(2),
        "reads at the second node"
    );
    assert_eq!(c.node.reads_served() - first_before, with_rows(1));

    // The second node stops serving Flight but still leads its buckets.
    let second = second.stop_flight().await;
    let first_before = c.node.reads_served();
    assert_eq!(c.rows(sql).await, want);
    assert_eq!(
        c.node.reads_served() - first_before,
        with_rows(1) + with_rows(2),
        "every bucket read at the connected node"
    );
    second.shutdown().await;
    c.stop().await;
}

/// Log table `app.<name>` of `schema` (types SQL cannot name), in one bucket.
async fn one_bucket_table(c: &Cluster, name: &str, schema: &arrow::datatypes::Schema) {
    c.client
        .create_table_with(&mink_client::protocol::CreateTable {
            database: "app".into(),
            table: name.into(),
            schema: mink_client::protocol::encode_schema(schema).unwrap(),
            options: [("bucket.num".to_string(), "1".to_string())].into(),
            partition_keys: vec![],
            primary_key: vec![],
            comment: String::new(),
            if_not_exists: false,
        })
        .await
        .unwrap();
}

/// `app.nested`: a log table with a dictionary column and a large list, one row written.
async fn dictionary_table(c: &Cluster) {
    use arrow::array::{DictionaryArray, Int64Array, LargeListArray};
    use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "d",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new(
            "xs",
            DataType::LargeList(std::sync::Arc::new(Field::new_list_field(
                DataType::Int64,
                true,
            ))),
            true,
        ),
    ]);
    one_bucket_table(c, "nested", &schema).await;
    let row = arrow::array::RecordBatch::try_new(
        std::sync::Arc::new(schema),
        vec![
            std::sync::Arc::new(Int64Array::from(vec![1])),
            std::sync::Arc::new(DictionaryArray::<Int32Type>::from_iter([Some("x")])),
            std::sync::Arc::new(LargeListArray::from_iter_primitive::<Int64Type, _, _>([
                Some([Some(1), Some(2)]),
            ])),
        ],
    )
    .unwrap();
    c.client.writer("app", "nested").write(&row).await.unwrap();
}

/// A dictionary column reads over Flight SQL: the schema `GetFlightInfo` announces is the one
/// `DoGet` streams (ADBC refuses an endpoint whose schema differs). A large list, alone or in
/// a struct, goes as a list: arrow-flight's encoder announced it as one while it sent 64-bit
/// offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dictionary_columns_read_over_flight_sql() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.client.create_database("app", true).await.unwrap();
    dictionary_table(&c).await;
    let mut sql = c.flight_sql().await;
    let info = sql
        .execute(
            "SELECT id, d, xs, named_struct('a', xs) AS s FROM app.nested".into(),
            None,
        )
        .await
        .unwrap();
    let announced = info.clone().try_decode_schema().unwrap();
    let mut stream = sql
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap();
    let mut batches = vec![];
    while let Some(b) = futures::StreamExt::next(&mut stream).await {
        batches.push(b.unwrap());
    }
    let streamed = stream.schema().cloned().unwrap();
    assert_eq!(
        streamed.fields(),
        announced.fields(),
        "DoGet streamed another schema than GetFlightInfo announced"
    );
    assert_eq!(
        common::text_rows(&batches),
        strings(&[&["1", "x", "[1, 2]", "{a: [1, 2]}"]])
    );
    c.stop().await;
}

/// A statement's CPU work does not hold up other requests: while a cross join of 10^10 rows
/// runs (hours), `system.queries` (another statement) and `GetDbSchemas` (metadata) from
/// another connection are answered, and the cross join still runs until it is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_statement_does_not_hold_up_other_requests() {
    use futures::StreamExt as _;
    use prost::Message as _;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.rows("CREATE SCHEMA big").await;
    c.rows("CREATE TABLE big.t (v BIGINT NOT NULL) WITH ('bucket.num' = '2')")
        .await;
    c.rows("INSERT INTO big.t SELECT value FROM generate_series(1, 100000)")
        .await;
    let heavy = "SELECT sum(a.v * b.v) FROM big.t a CROSS JOIN big.t b";
    let mut sql = c.flight_sql().await;
    let info = sql.execute(heavy.into(), None).await.unwrap();
    // Answered once the statement runs (it is listed by then); its one row comes at the end.
    let mut stream = sql
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap();
    let heavy_ended = tokio::spawn(async move {
        while let Some(item) = stream.next().await {
            item?;
        }
        Ok::<_, arrow_flight::error::FlightError>(())
    });
    let mut other = c.flight_sql().await;
    let answered = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let i = other
            .execute("SELECT sql FROM system.queries".into(), None)
            .await
            .unwrap();
        let listed: Vec<_> = other
            .do_get(i.endpoint[0].ticket.clone().unwrap())
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let i = other
            .get_db_schemas(arrow_flight::sql::CommandGetDbSchemas::default())
            .await
            .unwrap();
        let schemas: Vec<_> = other
            .do_get(i.endpoint[0].ticket.clone().unwrap())
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        (common::text_rows(&listed), common::text_rows(&schemas))
    })
    .await;
    let (listed, schemas) = answered.expect(
        "system.queries and GetDbSchemas were not answered within 60 s while a heavy statement ran",
    );
    assert!(
        !heavy_ended.is_finished(),
        "the heavy statement ended before the others were answered"
    );
    assert!(listed.contains(&vec![heavy.to_string()]), "{listed:?}");
    assert!(schemas.iter().any(|r| r[1] == "big"), "{schemas:?}");
    // Cancelled, it stops.
    let mut flight =
        arrow_flight::flight_service_client::FlightServiceClient::new(c.channel().await);
    let body = arrow_flight::CancelFlightInfoRequest::new(info).encode_to_vec();
    flight
        .do_action(arrow_flight::Action::new("CancelFlightInfo", body))
        .await
        .unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(60), heavy_ended)
        .await
        .expect("the cancelled statement's stream did not end within 60 s")
        .unwrap();
    assert!(
        matches!(&ended, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::Cancelled),
        "{ended:?}"
    );
    c.stop().await;
}

/// A node that cannot be reached is `UNAVAILABLE` over Flight SQL (a client may retry), for a
/// statement that reads a table and for one that reads none (the catalog is the node's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_node_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path()).await;
    c.load().await;
    c.stop_node_flight().await;
    let mut sql = c.flight_sql().await;
    for statement in ["SELECT 1", "SELECT count(*) FROM app.events"] {
        let refused = match sql.execute(statement.into(), None).await {
            Ok(info) => fetch(&mut sql, &info).await.map(|_| ()),
            Err(e) => Err(e),
        };
        assert!(
            matches!(&refused, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::Unavailable),
            "{statement}: {refused:?}"
        );
    }
    let schemas = sql
        .get_db_schemas(arrow_flight::sql::CommandGetDbSchemas::default())
        .await;
    let schemas = match schemas {
        Ok(info) => match sql.do_get(info.endpoint[0].ticket.clone().unwrap()).await {
            Ok(stream) => stream.try_collect::<Vec<_>>().await.map(|_| ()),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    assert!(
        matches!(&schemas, Err(arrow_flight::error::FlightError::Tonic(s)) if s.code() == tonic::Code::Unavailable),
        "GetDbSchemas: {schemas:?}"
    );
    c.stop().await;
}

/// When the node a Flight SQL server talks through cannot be reached, its statements and
/// metadata calls go on at another node of the cluster (a BI tool's queries failed until that
/// node came back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_go_on_at_another_node_when_theirs_cannot_be_reached() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path()).await;
    c.load().await;
    let other = c.add_node(dir.path(), 2).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !c.client.peers().contains(&other.address) {
        assert!(
            std::time::Instant::now() < deadline,
            "the client never learned of node 2: {:?}",
            c.client.peers()
        );
        c.client
            .wait_for_change(std::time::Duration::from_millis(200))
            .await
            .unwrap();
        c.client.learn_peers().await.unwrap();
    }
    let count = "SELECT count(*) FROM app.events";
    let before = c.rows(count).await;
    c.stop_node_flight().await;
    let mut sql = c.flight_sql().await;
    let info = sql.execute(count.into(), None).await.unwrap();
    let rows = common::text_rows(&fetch(&mut sql, &info).await.unwrap());
    assert_eq!(rows, before);
    assert_eq!(c.client.address(), other.address, "the client moved on");
    let schemas = sql
        .get_db_schemas(arrow_flight::sql::CommandGetDbSchemas::default())
        .await
        .unwrap();
    assert!(metadata_rows(&mut sql, schemas).await.len() > 1);
    let node = other.stop_flight().await;
    node.shutdown().await;
    c.stop().await;
}

/// The answer of a Flight SQL metadata command, each row as text.
async fn metadata_rows(
    sql: &mut FlightSqlServiceClient<tonic::transport::Channel>,
    info: arrow_flight::FlightInfo,
) -> Vec<Vec<String>> {
    let batches = fetch(sql, &info).await.unwrap();
    common::text_rows(&batches)
}

/// `GetDbSchemas` and `GetTables` list schema `system` and its tables, as
/// `information_schema` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_sql_metadata_lists_the_system_tables() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    let mut sql = c.flight_sql().await;
    let info = sql
        .get_db_schemas(arrow_flight::sql::CommandGetDbSchemas::default())
        .await
        .unwrap();
    assert_eq!(
        metadata_rows(&mut sql, info).await,
        strings(&[&["mink", "app"], &["mink", "system"]])
    );
    let info = sql
        .get_tables(arrow_flight::sql::CommandGetTables {
            db_schema_filter_pattern: Some("system".into()),
            include_schema: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let batches = fetch(&mut sql, &info).await.unwrap();
    let names: Vec<Vec<String>> = common::text_rows(&batches)
        .into_iter()
        .map(|r| r[..4].to_vec())
        .collect();
    assert_eq!(
        names,
        strings(&[
            &["mink", "system", "buckets", "TABLE"],
            &["mink", "system", "nodes", "TABLE"],
            &["mink", "system", "queries", "TABLE"],
            &["mink", "system", "tables", "TABLE"],
        ])
    );
    // With their columns.
    let schemas = batches[0].column_by_name("table_schema").unwrap();
    let schemas = arrow::array::AsArray::as_binary::<i32>(schemas.as_ref());
    let queries = arrow::ipc::convert::try_schema_from_ipc_buffer(schemas.value(2)).unwrap();
    assert_eq!(queries.field(1).name(), "sql");
    c.stop().await;
}

/// `GetPrimaryKeys` without a db_schema answers for every database holding a table of that
/// name (an omitted db_schema does not narrow); with one, for that database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_keys_without_a_db_schema_span_the_databases() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    c.rows("CREATE SCHEMA other").await;
    c.rows("CREATE TABLE other.users (org BIGINT NOT NULL, uid BIGINT NOT NULL, PRIMARY KEY (org, uid))")
        .await;
    let mut sql = c.flight_sql().await;
    let keys = |db_schema: Option<&str>| arrow_flight::sql::CommandGetPrimaryKeys {
        catalog: None,
        db_schema: db_schema.map(Into::into),
        table: "users".into(),
    };
    let info = sql.get_primary_keys(keys(None)).await.unwrap();
    let mut rows = metadata_rows(&mut sql, info).await;
    rows.sort();
    assert_eq!(
        rows,
        strings(&[
            &["mink", "app", "users", "id", "NULL", "1"],
            &["mink", "other", "users", "org", "NULL", "1"],
            &["mink", "other", "users", "uid", "NULL", "2"],
        ])
    );
    let info = sql.get_primary_keys(keys(Some("app"))).await.unwrap();
    assert_eq!(
        metadata_rows(&mut sql, info).await,
        strings(&[&["mink", "app", "users", "id", "NULL", "1"]])
    );
    c.stop().await;
}

/// `GetXdbcTypeInfo` lists the column types `CREATE TABLE` takes (each one is created here),
/// narrowed by a type code; Mink has no foreign keys, so `GetImportedKeys`,
/// `GetExportedKeys` and `GetCrossReference` answer none, with Flight SQL's schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn type_info_lists_what_create_table_takes_and_there_are_no_foreign_keys() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    let mut sql = c.flight_sql().await;
    let info = sql
        .get_xdbc_type_info(arrow_flight::sql::CommandGetXdbcTypeInfo { data_type: None })
        .await
        .unwrap();
    let types: Vec<String> = metadata_rows(&mut sql, info)
        .await
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    assert!(
        ["BIGINT", "VARCHAR", "TIMESTAMP", "DECIMAL"]
            .iter()
            .all(|t| types.iter().any(|n| n == t)),
        "{types:?}"
    );
    c.rows("CREATE SCHEMA kinds").await;
    for (i, name) in types.iter().enumerate() {
        c.rows(&format!("CREATE TABLE kinds.t{i} (c {name})")).await;
    }
    let bigint = arrow_flight::sql::XdbcDataType::XdbcBigint as i32;
    let info = sql
        .get_xdbc_type_info(arrow_flight::sql::CommandGetXdbcTypeInfo {
            data_type: Some(bigint),
        })
        .await
        .unwrap();
    let rows = metadata_rows(&mut sql, info).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][..2], [String::from("BIGINT"), bigint.to_string()]);

    let users = || arrow_flight::sql::CommandGetImportedKeys {
        catalog: None,
        db_schema: Some("app".into()),
        table: "users".into(),
    };
    let info = sql.get_imported_keys(users()).await.unwrap();
    let batches = fetch(&mut sql, &info).await.unwrap();
    let rows: usize = batches
        .iter()
        .map(arrow::array::RecordBatch::num_rows)
        .sum();
    assert_eq!(rows, 0);
    let schema = arrow::ipc::convert::try_schema_from_ipc_buffer(&info.schema).unwrap();
    assert_eq!(schema.field(3).name(), "pk_column_name");
    assert_eq!(schema.fields().len(), 13);
    let exported = arrow_flight::sql::CommandGetExportedKeys {
        catalog: None,
        db_schema: Some("app".into()),
        table: "users".into(),
    };
    let info = sql.get_exported_keys(exported).await.unwrap();
    assert!(metadata_rows(&mut sql, info).await.is_empty());
    let cross = arrow_flight::sql::CommandGetCrossReference {
        pk_catalog: None,
        pk_db_schema: Some("app".into()),
        pk_table: "users".into(),
        fk_catalog: None,
        fk_db_schema: Some("app".into()),
        fk_table: "users".into(),
    };
    let info = sql.get_cross_reference(cross).await.unwrap();
    assert!(metadata_rows(&mut sql, info).await.is_empty());
    c.stop().await;
}

/// `GetSqlInfo` says what the server does: DDL of schemas and tables, unquoted names
/// lower-cased, and the version of the arrow crate it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_info_says_what_the_server_does() {
    use arrow_flight::sql::SqlInfo;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    let mut sql = c.flight_sql().await;
    let asked = [
        SqlInfo::FlightSqlServerArrowVersion,
        SqlInfo::SqlDdlSchema,
        SqlInfo::SqlDdlTable,
        SqlInfo::SqlIdentifierCase,
    ];
    let info = sql.get_sql_info(asked.to_vec()).await.unwrap();
    let answered: std::collections::BTreeMap<String, String> = metadata_rows(&mut sql, info)
        .await
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    let lock = std::fs::read_to_string(manifest_dir().join("../../Cargo.lock")).unwrap();
    let arrow = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"arrow\"\n"))
        .and_then(|p| p.split("version = \"").nth(1))
        .and_then(|v| v.split('"').next())
        .unwrap();
    let value = |id: SqlInfo| answered.get(&(id as u32).to_string()).cloned();
    assert_eq!(
        value(SqlInfo::FlightSqlServerArrowVersion),
        Some(format!("{{string_value={arrow}}}")),
        "{answered:?}"
    );
    assert_eq!(
        value(SqlInfo::SqlDdlSchema).as_deref(),
        Some("{bool_value=true}")
    );
    assert_eq!(
        value(SqlInfo::SqlDdlTable).as_deref(),
        Some("{bool_value=true}")
    );
    // SqlSupportedCaseSensitivity: 3 is lower case.
    assert_eq!(
        value(SqlInfo::SqlIdentifierCase).as_deref(),
        Some("{int32_bitmask=3}")
    );
    c.stop().await;
}

/// `ListActions` lists the actions the service carries out, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_actions_lists_what_is_served() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    let mut flight = FlightServiceClient::new(c.channel().await);
    let listed: Vec<_> = flight
        .list_actions(arrow_flight::Empty {})
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap();
    let mut types: Vec<String> = listed.into_iter().map(|a| a.r#type).collect();
    types.sort();
    assert_eq!(
        types,
        [
            "CancelFlightInfo",
            "CancelQuery",
            "ClosePreparedStatement",
            "CreatePreparedStatement"
        ]
    );
    // Each is served: an empty body is refused as a bad request, not as an unknown action.
    for t in &types {
        let answer = flight
            .do_action(arrow_flight::Action::new(t.clone(), vec![0x0f]))
            .await;
        assert!(
            matches!(&answer, Err(s) if s.code() == tonic::Code::InvalidArgument && !s.message().contains("unknown action")),
            "{t}: {answer:?}"
        );
    }
    c.stop().await;
}

/// DDL answers no rows over Flight SQL, run as a statement or prepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_answers_no_rows() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    let mut sql = c.flight_sql().await;
    let info = sql
        .execute("CREATE SCHEMA shop".into(), None)
        .await
        .unwrap();
    assert_eq!(
        metadata_rows(&mut sql, info).await,
        Vec::<Vec<String>>::new()
    );
    let mut prepared = sql
        .prepare(
            "CREATE TABLE shop.t (id BIGINT NOT NULL, PRIMARY KEY (id))".into(),
            None,
        )
        .await
        .unwrap();
    let info = prepared.execute().await.unwrap();
    assert_eq!(
        metadata_rows(&mut sql, info).await,
        Vec::<Vec<String>>::new()
    );
    assert_eq!(
        c.rows("SELECT count(*) FROM shop.t").await,
        strings(&[&["0"]])
    );
    c.stop().await;
}

/// More values bound than a statement has parameters are refused (`INVALID_ARGUMENT`, naming
/// both counts), for a query and for an update, not ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_bound_parameters_are_refused() {
    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    c.load().await;
    let mut sql = c.flight_sql().await;
    let two = RecordBatch::try_from_iter(vec![
        (
            "$1",
            std::sync::Arc::new(Int64Array::from(vec![1])) as ArrayRef,
        ),
        (
            "$2",
            std::sync::Arc::new(Int64Array::from(vec![2])) as ArrayRef,
        ),
    ])
    .unwrap();
    let mut query = sql
        .prepare("SELECT id FROM app.users WHERE id = ?".into(), None)
        .await
        .unwrap();
    query.set_parameters(two.clone()).unwrap();
    let refused = query.execute().await;
    assert!(
        matches!(&refused, Err(arrow_flight::error::FlightError::Tonic(s))
            if s.code() == tonic::Code::InvalidArgument
                && s.message().contains("2 values bound to a statement with 1 parameter")),
        "{refused:?}"
    );
    let mut update = sql
        .prepare("DELETE FROM app.users WHERE id = ?".into(), None)
        .await
        .unwrap();
    update.set_parameters(two).unwrap();
    let refused = update.execute_update().await;
    assert!(
        matches!(&refused, Err(arrow_flight::error::FlightError::Tonic(s))
            if s.code() == tonic::Code::InvalidArgument
                && s.message().contains("2 values bound to a statement with 1 parameter")),
        "{refused:?}"
    );
    assert_eq!(
        c.rows("SELECT id FROM app.users ORDER BY id").await,
        strings(&[&["1"], &["2"], &["4"]])
    );
    c.stop().await;
}

/// A ticket this server did not issue (garbage, a message of another kind) is refused as
/// that, with `INVALID_ARGUMENT`, and the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_ticket_is_refused_as_such() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    let mut flight = FlightServiceClient::new(c.channel().await);
    for ticket in [vec![0x0f], vec![], b"hello".to_vec()] {
        let refused = flight
            .do_get(arrow_flight::Ticket::new(ticket.clone()))
            .await;
        assert!(
            matches!(&refused, Err(s) if s.code() == tonic::Code::InvalidArgument
                && s.message().starts_with("not a ticket this server issued")),
            "{ticket:?}: {:?}",
            refused.err()
        );
    }
    let refused = flight
        .get_flight_info(arrow_flight::FlightDescriptor::new_cmd(vec![0x0f]))
        .await;
    assert!(
        matches!(&refused, Err(s) if s.code() == tonic::Code::InvalidArgument
            && s.message().starts_with("not a Flight SQL command")),
        "{refused:?}"
    );
    let mut sql = c.flight_sql().await;
    let info = sql.execute("SELECT 1".into(), None).await.unwrap();
    assert_eq!(metadata_rows(&mut sql, info).await, strings(&[&["1"]]));
    c.stop().await;
}

/// Mink has no authentication: a handshake without credentials succeeds; one with a username
/// and password (the `authorization` header JDBC and ADBC send) or another payload is refused
/// with `UNAUTHENTICATED` saying so, not accepted and ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_with_credentials_is_refused() {
    use arrow_flight::HandshakeRequest;
    use arrow_flight::flight_service_client::FlightServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path()).await;
    let mut flight = FlightServiceClient::new(c.channel().await);
    let request = |payload: &'static [u8]| {
        futures::stream::iter([HandshakeRequest {
            protocol_version: 0,
            payload: payload.into(),
        }])
    };
    let answered: Vec<_> = flight
        .handshake(request(b""))
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(answered.len(), 1);
    let refused = match flight.handshake(request(b"user:password")).await {
        Ok(r) => r.into_inner().try_collect::<Vec<_>>().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(
        matches!(&refused, Err(s) if s.code() == tonic::Code::Unauthenticated
            && s.message().contains("mink-query has no authentication")),
        "{refused:?}"
    );
    let mut sql = c.flight_sql().await;
    let refused = sql.handshake("user", "password").await;
    assert!(
        matches!(&refused, Err(e) if e.to_string().contains("mink-query has no authentication")),
        "{refused:?}"
    );
    c.stop().await;
}
