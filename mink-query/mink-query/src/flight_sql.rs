//! Flight SQL over a [`QueryEngine`]: statements, catalog metadata, SqlInfo.
//!
//! A statement is planned by `GetFlightInfo`, which fixes its cut (the tables' high
//! watermarks); the plan waits under a handle in the ticket until `DoGet` runs it (once, for
//! up to [`PLAN_TTL`]). DDL runs when it is planned; `INSERT`, `UPDATE` and `DELETE` run at
//! `GetFlightInfo` too, their count waiting for the `DoGet`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::{
    SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder,
};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionCancelQueryRequest, ActionCancelQueryResult, ActionClosePreparedStatementRequest,
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, CommandGetCatalogs,
    CommandGetCrossReference, CommandGetDbSchemas, CommandGetExportedKeys, CommandGetImportedKeys,
    CommandGetPrimaryKeys, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandGetXdbcTypeInfo, CommandPreparedStatementQuery, CommandPreparedStatementUpdate,
    CommandStatementIngest, CommandStatementQuery, CommandStatementUpdate,
    DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, SqlSupportedCaseSensitivity,
    SqlSupportedTransaction, TicketStatementQuery,
};
use arrow_flight::{
    FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket,
};
use datafusion::arrow::array::AsArray as _;
use datafusion::arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, UInt64Type};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::catalog::SchemaProvider as _;
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{DataFrame, SessionContext};
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use mink_client::{ErrorCode, protocol};
use prost::Message as _;
use tonic::{Request, Response, Status};

use crate::system::{SYSTEM, SystemTables};
use crate::{CATALOG, QueryEngine};

/// How long a planned statement waits for its `DoGet`.
pub const PLAN_TTL: Duration = Duration::from_secs(600);

type DoGetStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send + 'static>>;

/// The Flight SQL service of `mink-query` (and of `mink dev`).
#[derive(Clone)]
pub struct MinkFlightSql {
    engine: QueryEngine,
    exec: Arc<Executor>,
    plans: Arc<Mutex<HashMap<String, Planned>>>,
    prepared: Arc<Mutex<HashMap<String, Prepared>>>,
    info: Arc<SqlInfoData>,
    types: Arc<XdbcTypeInfoData>,
}

/// A statement planned, waiting for its `DoGet`: when, its text, its plan.
type Planned = (Instant, String, DataFrame);

/// A prepared statement: its text and the parameter rows bound last (each row one execution).
#[derive(Clone, Debug)]
struct Prepared {
    sql: String,
    parameters: Vec<RecordBatch>,
    at: Instant,
}

/// The threads statements run on, apart from the threads serving gRPC. DataFusion's operators
/// compute for as long as their input is ready (a cross join's batches are ready as soon as
/// asked for) and yield only between leaf batches: run on the server's threads, one heavy
/// statement held them, and every other request (a metadata call, `system.queries`) waited for
/// it to end. Here a statement holds only these threads, and its operators yield on them
/// ([`crate::exec::yielding`]) so statements share them.
struct Executor {
    /// `None` once shut down (a runtime cannot be dropped on a runtime's thread).
    runtime: Option<tokio::runtime::Runtime>,
}

impl Executor {
    fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(2, usize::from);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("mink-query-exec")
            .enable_all()
            .build()
            .expect("cannot start the threads statements run on");
        Executor {
            runtime: Some(runtime),
        }
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.as_ref().expect("executor running").handle()
    }

    /// Runs `work` on the executor's threads; dropping the returned future stops it.
    async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, DataFusionError>> + Send + 'static,
    ) -> Result<T, DataFusionError> {
        let mut task = AbortOnDrop(self.handle().spawn(work));
        match (&mut task.0).await {
            Ok(r) => r,
            Err(e) => Err(DataFusionError::Execution(format!(
                "the statement's task ended: {e}"
            ))),
        }
    }

    /// `plan`'s batches, computed on the executor's threads (a few ahead of the consumer);
    /// dropping the stream stops the statement. An error starting it is returned as such.
    async fn stream(
        &self,
        plan: DataFrame,
    ) -> Result<
        impl Stream<Item = Result<RecordBatch, DataFusionError>> + Send + 'static,
        DataFusionError,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let task = self.handle().spawn(async move {
            let mut batches = match plan.execute_stream().await {
                Ok(b) => b,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            let _ = started_tx.send(Ok(()));
            loop {
                let next = tokio::select! {
                    () = tx.closed() => return, // the consumer went away
                    next = batches.next() => next,
                };
                let Some(next) = next else { return };
                if tx.send(next).await.is_err() {
                    return;
                }
            }
        });
        let task = AbortOnDrop(task);
        match started.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(DataFusionError::Execution(
                    "the statement's task ended before it started".into(),
                ));
            }
        }
        Ok(futures::stream::unfold(
            (rx, task),
            |(mut rx, task)| async move { rx.recv().await.map(|b| (b, (rx, task))) },
        ))
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Keeps `sql` prepared under `handle`, with no parameters bound yet, and forgets the
/// statements unused for `PLAN_TTL * 6`.
fn keep_prepared(prepared: &mut HashMap<String, Prepared>, handle: &str, sql: &str) -> Prepared {
    prepared.retain(|_, p| p.at.elapsed() < PLAN_TTL * 6);
    let p = Prepared {
        sql: sql.to_string(),
        parameters: vec![],
        at: Instant::now(),
    };
    prepared.insert(handle.to_string(), p.clone());
    p
}

/// A prepared statement's handle: an id, a newline, the statement's text. Carrying the text
/// lets any server answer it (after a restart, or behind a load balancer with others), as
/// clients keep a handle for as long as they like.
fn prepared_handle(sql: &str) -> String {
    format!("{}\n{sql}", uuid::Uuid::now_v7())
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::fmt::Debug for MinkFlightSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MinkFlightSql")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

/// The largest gRPC message Flight SQL takes or sends: a node's default `--max-message-bytes`,
/// so what a node takes in one message (an ingest batch, bound parameters) Flight SQL takes too.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

impl MinkFlightSql {
    pub fn new(engine: QueryEngine) -> Self {
        MinkFlightSql {
            engine,
            exec: Arc::new(Executor::new()),
            plans: Arc::default(),
            prepared: Arc::default(),
            info: Arc::new(sql_info()),
            types: Arc::new(xdbc_types()),
        }
    }

    /// The gRPC service, ready for a tonic server: messages up to [`MAX_MESSAGE_BYTES`] each
    /// way (tonic's default of 4 MiB refused a Polars `write_database` of 150 000 short rows).
    pub fn into_service(self) -> FlightServiceServer<MinkFlightService> {
        FlightServiceServer::new(MinkFlightService(self))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Serves this service on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        // Without TCP_NODELAY a statement's small GetFlightInfo and DoGet exchanges each
        // wait out a delayed ACK: ~40 ms apiece.
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .initial_stream_window_size(mink_flight::STREAM_WINDOW)
            .initial_connection_window_size(mink_flight::CONNECTION_WINDOW)
            .add_service(self.into_service())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// Plans a statement of `request` (refusing what the engine cannot run yet) on an engine
    /// of its own, whose reads wait for the request's `mink-min-applied-index`.
    async fn plan<T>(
        &self,
        request: &Request<T>,
        sql: &str,
    ) -> Result<(QueryEngine, DataFrame), Status> {
        let floor = match request.metadata().get(protocol::MIN_APPLIED_INDEX_HEADER) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "{} must be an unsigned integer",
                            protocol::MIN_APPLIED_INDEX_HEADER
                        ))
                    })?,
            ),
        };
        // Each request runs on an engine of its own: a SET would be forgotten with it.
        if crate::settings::is_set_freshness(sql) {
            return Err(Status::invalid_argument(format!(
                "SET {} does not last past its request over Flight SQL: send the {} header with each request instead (an ADBC connection's call header adbc.flight.sql.rpc.call_header.{})",
                crate::settings::FRESHNESS,
                crate::settings::FRESHNESS_HEADER,
                crate::settings::FRESHNESS_HEADER,
            )));
        }
        let engine = self.engine.fork(floor);
        if let Some(v) = request.metadata().get(crate::settings::FRESHNESS_HEADER) {
            let v = v.to_str().map_err(|_| {
                Status::invalid_argument(format!(
                    "{} must be text",
                    crate::settings::FRESHNESS_HEADER
                ))
            })?;
            engine.set_freshness(crate::settings::Freshness::parse(v).map_err(status)?);
        }
        let plan = engine.sql(sql).await.map_err(status)?;
        Ok((engine, plan))
    }

    fn keep(&self, sql: &str, plan: DataFrame) -> String {
        let handle = uuid::Uuid::now_v7().to_string();
        let mut plans = self.plans.lock().expect("plans");
        plans.retain(|_, (at, _, _)| at.elapsed() < PLAN_TTL);
        plans.insert(handle.clone(), (Instant::now(), sql.to_string(), plan));
        handle
    }

    /// The prepared statement under `handle`, kept another while (it is in use). A handle
    /// carries its statement's text (see [`prepared_handle`]), so one this server does not
    /// hold (it restarted, or prepared it long ago, or another server behind the same address
    /// did) is prepared again from it; only the parameters bound before are gone, and clients
    /// bind them before each execution.
    fn prepared(&self, handle: &[u8]) -> Result<Prepared, Status> {
        let unknown = || {
            Status::not_found(
                "no prepared statement under this handle (not one of this server's); prepare it again",
            )
        };
        let h = std::str::from_utf8(handle).map_err(|_| unknown())?;
        let mut prepared = self.prepared.lock().expect("prepared");
        if let Some(p) = prepared.get_mut(h) {
            p.at = Instant::now();
            return Ok(p.clone());
        }
        let (_, sql) = h.split_once('\n').ok_or_else(unknown)?;
        Ok(keep_prepared(&mut prepared, h, sql))
    }

    /// The `FlightInfo` of a planned statement: its schema, one endpoint whose ticket is the
    /// handle the plan waits under, the index the planning read at. `INSERT`, `UPDATE` and
    /// `DELETE` run now, as DDL does when planned, and their count waits instead: a client
    /// that executes a write and never fetches its result (ADBC's `cursor.execute` then
    /// `close`) still writes.
    async fn planned(
        &self,
        sql: &str,
        plan: DataFrame,
        engine: &QueryEngine,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        all_bound(&plan)?;
        let plan = if matches!(plan.logical_plan(), LogicalPlan::Dml(_)) {
            let _running = engine.queries().track(sql, "flight sql", None, None);
            let schema = Arc::new(plan.schema().as_arrow().clone());
            let (state, _) = plan.clone().into_parts();
            let counted = self.exec.run(plan.collect()).await.map_err(status)?;
            let counted = MemTable::try_new(schema, vec![counted]).map_err(status)?;
            SessionContext::new_with_state(state)
                .read_table(Arc::new(counted))
                .map_err(status)?
        } else {
            plan
        };
        let schema = plan.schema().as_arrow().clone();
        let handle = self.keep(sql, plan);
        let ticket = TicketStatementQuery {
            statement_handle: handle.into_bytes().into(),
        };
        info(
            &schema,
            ticket.as_any().encode_to_vec(),
            request.into_inner(),
        )
        .map(|r| stamp(r, engine))
    }

    /// The schemas of catalog `mink`: the databases (one named `system` is hidden by the
    /// system tables, as in SQL) and `system`.
    async fn schema_names(&self) -> Result<Vec<String>, Status> {
        let mut names: Vec<String> = self
            .engine
            .client()
            .list_databases()
            .await
            .map_err(|e| status(crate::client_error(e)))?
            .into_iter()
            .filter(|d| d != SYSTEM)
            .collect();
        names.push(SYSTEM.to_string());
        Ok(names)
    }

    fn take(&self, handle: &str) -> Result<(String, DataFrame), Status> {
        self.plans
            .lock()
            .expect("plans")
            .remove(handle)
            .map(|(_, sql, plan)| (sql, plan))
            .ok_or_else(|| {
                Status::not_found(
                    "no statement under this handle: it ran already or expired; run the statement again",
                )
            })
    }
}

/// The rows a statement changed: DML answers one row with the `count`; anything else counts
/// its rows.
fn updated(batches: &[RecordBatch]) -> i64 {
    let count = match batches.first() {
        Some(b)
            if b.num_columns() == 1
                && b.num_rows() == 1
                && b.schema().field(0).name() == "count" =>
        {
            b.column(0)
                .as_primitive_opt::<UInt64Type>()
                .map_or(0, |c| c.value(0))
        }
        _ => batches.iter().map(|b| b.num_rows() as u64).sum(),
    };
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Refuses a statement about to run with parameters no value was bound to (DataFusion would
/// fail it at execution, as its own fault).
fn all_bound(plan: &DataFrame) -> Result<(), Status> {
    let mut unbound: Vec<String> = plan
        .logical_plan()
        .get_parameter_types()
        .map_err(status)?
        .into_keys()
        .collect();
    if unbound.is_empty() {
        return Ok(());
    }
    unbound.sort();
    Err(Status::invalid_argument(format!(
        "no value bound to {}: bind one row of parameters before running the statement",
        unbound.join(", ")
    )))
}

/// `schema` as the IPC message Flight SQL carries schemas in.
fn ipc_schema(schema: &Schema) -> Result<bytes::Bytes, Status> {
    let message: IpcMessage = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
    Ok(message.0)
}

/// The record batches of a `DoPut` (bound parameters). A message without an IPC header (the
/// descriptor alone, which is how arrow-flight's client sends a prepared update whose
/// parameters it bound before) carries none.
async fn parameter_rows(stream: PeekableFlightDataStream) -> Result<Vec<RecordBatch>, Status> {
    record_batches(stream, "the bound parameters").await
}

/// The record batches of a `DoPut` (`what` they are, for errors).
async fn record_batches(
    stream: PeekableFlightDataStream,
    what: &str,
) -> Result<Vec<RecordBatch>, Status> {
    arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
        stream
            .try_filter(|d| futures::future::ready(!d.data_header.is_empty()))
            .map_err(FlightError::from),
    )
    .try_collect()
    .await
    .map_err(|e| Status::invalid_argument(format!("{what}: {e}")))
}

/// Each row of `batches` as positional parameter values (`$1` is the first column).
fn parameters(batches: &[RecordBatch]) -> Result<Vec<Vec<ScalarValue>>, Status> {
    let mut rows = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let values = b
                .columns()
                .iter()
                .map(|c| ScalarValue::try_from_array(c, r))
                .collect::<datafusion::error::Result<Vec<_>>>()
                .map_err(status)?;
            rows.push(values);
        }
    }
    Ok(rows)
}

/// `plan` with `values` bound to its parameters (`$1` the first), each cast to the type the
/// statement gives its parameter (an `INSERT`'s column, the column it is compared with): a
/// client binds an integer as Int64 whatever the column, and DataFusion would carry the value
/// into the plan with the client's type. A value that does not convert (2^40 into an INT) is
/// refused, naming the column.
fn bind(plan: DataFrame, values: Vec<ScalarValue>) -> Result<DataFrame, Status> {
    let fields = plan.logical_plan().get_parameter_fields().map_err(status)?;
    if values.len() > fields.len() {
        return Err(Status::invalid_argument(format!(
            "{} values bound to a statement with {} parameter{}: bind one value per parameter",
            values.len(),
            fields.len(),
            if fields.len() == 1 { "" } else { "s" },
        )));
    }
    let options = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let values = values
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let id = format!("${}", i + 1);
            match fields.get(&id) {
                Some(Some(f)) if v.data_type() != *f.data_type() => {
                    let shown = crate::insert::show(&v);
                    let cast = crate::literals::cast_value(&v, f.data_type(), &options).map_err(|e| {
                        Status::invalid_argument(format!(
                            "the value bound to {id} ({shown}, {}) does not convert to {}, the type of column {}: {}",
                            v.data_type(),
                            f.data_type(),
                            f.name(),
                            e.find_root()
                        ))
                    })?;
                    // A cast to an integer or a decimal truncates or rounds what the type
                    // cannot hold (2.7 into an INT): refused, as a literal's is.
                    if !crate::insert::exactly(&v, &cast) {
                        return Err(Status::invalid_argument(format!(
                            "the value bound to {id} ({shown}, {}) is not exactly a value of {}, the type of column {}: it is refused, not truncated",
                            v.data_type(),
                            f.data_type(),
                            f.name()
                        )));
                    }
                    Ok(cast)
                }
                _ => Ok(v),
            }
        })
        .collect::<Result<Vec<_>, Status>>()?;
    plan.with_param_values(ParamValues::from(values))
        .and_then(crate::bound_dml)
        .map_err(status)
}

/// `response` with the highest metadata index `engine` has seen (`mink-applied-index`): a
/// client passing it on to a node (or back here) reads at least what the statement read.
fn stamp<T>(mut response: Response<T>, engine: &QueryEngine) -> Response<T> {
    response.metadata_mut().insert(
        protocol::APPLIED_INDEX_HEADER,
        engine.client().applied_index().into(),
    );
    response
}

/// What the server answers `GetSqlInfo` with (ADBC asks for the transaction capabilities).
fn sql_info() -> SqlInfoData {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "Mink");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(
        SqlInfo::FlightSqlServerArrowVersion,
        env!("MINK_ARROW_VERSION"),
    );
    b.append(SqlInfo::FlightSqlServerReadOnly, false);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    b.append(SqlInfo::FlightSqlServerCancel, true);
    b.append(SqlInfo::SqlTransactionsSupported, false);
    b.append(SqlInfo::SqlDdlCatalog, false);
    // CREATE and DROP SCHEMA and TABLE; there is one catalog.
    b.append(SqlInfo::SqlDdlSchema, true);
    b.append(SqlInfo::SqlDdlTable, true);
    // Unquoted names are lower-cased (DataFusion's rule).
    b.append(
        SqlInfo::SqlIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32,
    );
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.build().expect("static SqlInfo")
}

/// The column types `CREATE TABLE` takes, as `GetXdbcTypeInfo` answers them (JDBC's
/// `getTypeInfo`): each name is one DataFusion plans, as the Arrow type Mink stores.
fn xdbc_types() -> XdbcTypeInfoData {
    use arrow_flight::sql::{Nullable, Searchable, XdbcDataType as X, XdbcDatetimeSubcode};
    let mut b = XdbcTypeInfoDataBuilder::new();
    let number = |name: &str, data_type: X, digits: i32, exact: bool| XdbcTypeInfo {
        type_name: name.into(),
        data_type,
        column_size: Some(digits),
        nullable: Nullable::NullabilityNullable,
        searchable: Searchable::Basic,
        unsigned_attribute: Some(false),
        fixed_prec_scale: exact,
        auto_increment: Some(false),
        local_type_name: Some(name.into()),
        minimum_scale: Some(0),
        maximum_scale: Some(0),
        sql_data_type: data_type,
        num_prec_radix: Some(if exact { 10 } else { 2 }),
        ..Default::default()
    };
    b.append(XdbcTypeInfo {
        column_size: Some(1),
        num_prec_radix: None,
        unsigned_attribute: None,
        ..number("BOOLEAN", X::XdbcBit, 1, false)
    });
    b.append(number("TINYINT", X::XdbcTinyint, 3, true));
    b.append(number("SMALLINT", X::XdbcSmallint, 5, true));
    b.append(number("INT", X::XdbcInteger, 10, true));
    b.append(number("BIGINT", X::XdbcBigint, 19, true));
    b.append(number("REAL", X::XdbcReal, 24, false));
    b.append(number("DOUBLE", X::XdbcDouble, 53, false));
    b.append(XdbcTypeInfo {
        create_params: Some(vec!["precision".into(), "scale".into()]),
        maximum_scale: Some(38),
        ..number("DECIMAL", X::XdbcDecimal, 38, true)
    });
    let quoted = |name: &str, data_type: X, sql_data_type: X| XdbcTypeInfo {
        type_name: name.into(),
        data_type,
        literal_prefix: Some("'".into()),
        literal_suffix: Some("'".into()),
        nullable: Nullable::NullabilityNullable,
        case_sensitive: true,
        searchable: Searchable::Full,
        local_type_name: Some(name.into()),
        sql_data_type,
        ..Default::default()
    };
    b.append(XdbcTypeInfo {
        column_size: Some(i32::MAX),
        ..quoted("VARCHAR", X::XdbcVarchar, X::XdbcVarchar)
    });
    b.append(XdbcTypeInfo {
        column_size: Some(i32::MAX),
        literal_prefix: Some("X'".into()),
        case_sensitive: false,
        searchable: Searchable::Basic,
        ..quoted("BYTEA", X::XdbcVarbinary, X::XdbcVarbinary)
    });
    b.append(XdbcTypeInfo {
        column_size: Some(10),
        case_sensitive: false,
        searchable: Searchable::Basic,
        // Code 1, which the protocol also names XDBC_SUBCODE_DATE (prost keeps one name).
        datetime_subcode: Some(XdbcDatetimeSubcode::XdbcSubcodeYear),
        ..quoted("DATE", X::XdbcDate, X::XdbcDatetime)
    });
    b.append(XdbcTypeInfo {
        column_size: Some(26),
        case_sensitive: false,
        searchable: Searchable::Basic,
        minimum_scale: Some(0),
        maximum_scale: Some(9),
        datetime_subcode: Some(XdbcDatetimeSubcode::XdbcSubcodeTimestamp),
        ..quoted("TIMESTAMP", X::XdbcTimestamp, X::XdbcDatetime)
    });
    b.build().expect("static XdbcTypeInfo")
}

/// The answer to `GetImportedKeys`, `GetExportedKeys` and `GetCrossReference`: Flight SQL's
/// schema of a foreign key's columns. Mink has no foreign keys (`CREATE TABLE` refuses them),
/// so every answer is empty.
fn foreign_keys_schema() -> Schema {
    let name = |n: &str, nullable: bool| Field::new(n, DataType::Utf8, nullable);
    Schema::new(vec![
        name("pk_catalog_name", true),
        name("pk_db_schema_name", true),
        name("pk_table_name", false),
        name("pk_column_name", false),
        name("fk_catalog_name", true),
        name("fk_db_schema_name", true),
        name("fk_table_name", false),
        name("fk_column_name", false),
        Field::new("key_sequence", DataType::Int32, false),
        name("fk_key_name", true),
        name("pk_key_name", true),
        Field::new("update_rule", DataType::UInt8, false),
        Field::new("delete_rule", DataType::UInt8, false),
    ])
}

/// No foreign keys, as a `DoGet` answer.
fn no_foreign_keys() -> Response<DoGetStream> {
    let schema = Arc::new(foreign_keys_schema());
    one(&schema, Ok(RecordBatch::new_empty(Arc::clone(&schema))))
}

/// A DataFusion error as a gRPC status carrying its message: what the statement got wrong
/// (including a value that does not convert to its column's type) is `INVALID_ARGUMENT`,
/// what is missing `NOT_FOUND`, a name taken `ALREADY_EXISTS`, what is not built
/// `UNIMPLEMENTED`.
#[allow(clippy::needless_pass_by_value)] // reads best as `.map_err(status)`
pub fn status(e: DataFusionError) -> Status {
    use datafusion::arrow::error::ArrowError;
    let message = e.to_string();
    match e.find_root() {
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::Configuration(_) => Status::invalid_argument(message),
        // The optimizer folds casts of literals, so `ts > 'notadate'` fails in a rule, wrapped
        // as the rule's failure, with Arrow's error at the root.
        DataFusionError::ArrowError(inner, _)
            if matches!(
                inner.as_ref(),
                ArrowError::CastError(_)
                    | ArrowError::ParseError(_)
                    | ArrowError::DivideByZero
                    | ArrowError::ArithmeticOverflow(_)
            ) =>
        {
            Status::invalid_argument(message)
        }
        DataFusionError::NotImplemented(_) => Status::unimplemented(message),
        DataFusionError::External(inner) => {
            // The node's own words, without DataFusion's "External error: " before them.
            let message = match &e {
                DataFusionError::External(_) => inner.to_string(),
                _ => message,
            };
            match client_error_in(&e) {
                Some(c) => client_status(c, message),
                None => Status::internal(message),
            }
        }
        _ => match client_error_in(&e) {
            Some(c) => client_status(c, message),
            None => Status::internal(message),
        },
    }
}

/// The client error somewhere in `e`'s chain (a node's answer, or that it cannot be reached).
fn client_error_in(e: &DataFusionError) -> Option<&mink_client::ClientError> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = next {
        if let Some(c) = e.downcast_ref::<mink_client::ClientError>() {
            return Some(c);
        }
        next = e.source();
    }
    None
}

/// A node's error as a gRPC status: its code, and a node that cannot be reached (or does not
/// answer) `UNAVAILABLE`, which a client may retry.
fn client_status(e: &mink_client::ClientError, message: String) -> Status {
    use mink_client::ClientError;
    match (e, e.code()) {
        (ClientError::Transport { .. } | ClientError::Timeout { .. }, _)
        | (_, Some(ErrorCode::Unavailable | ErrorCode::NotLeader)) => Status::unavailable(message),
        (_, Some(ErrorCode::NotFound)) => Status::not_found(message),
        (_, Some(ErrorCode::AlreadyExists)) => Status::already_exists(message),
        // The client's own refusal of rows (a null partition column, say) is the statement's
        // fault, as the node's is.
        (ClientError::Invalid(_), _)
        | (_, Some(ErrorCode::Invalid | ErrorCode::OffsetOutOfRange)) => {
            Status::invalid_argument(message)
        }
        _ => Status::internal(message),
    }
}

/// One endpoint whose ticket is `message`, the descriptor echoed.
fn info(
    schema: &Schema,
    ticket: Vec<u8>,
    descriptor: FlightDescriptor,
) -> Result<Response<FlightInfo>, Status> {
    let info = FlightInfo::new()
        .try_with_schema(&wire_schema(schema))
        .map_err(|e| Status::internal(e.to_string()))?
        .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
        .with_descriptor(descriptor);
    Ok(Response::new(info))
}

/// The `FlightInfo` of a metadata command: one endpoint whose ticket is the command itself.
fn command_info(
    schema: &Schema,
    command: &impl ProstMessageExt,
    request: Request<FlightDescriptor>,
) -> Result<Response<FlightInfo>, Status> {
    info(
        schema,
        command.as_any().encode_to_vec(),
        request.into_inner(),
    )
}

/// `batches` (of `schema`) as a `DoGet` answer. Dictionary columns stay dictionaries: the
/// encoder's default would send their values instead, and a client (ADBC) refuses a stream
/// whose schema differs from the one `GetFlightInfo` announced. Large lists go as lists
/// ([`wire_schema`]).
fn answer(
    schema: &Schema,
    batches: impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static,
) -> Response<DoGetStream> {
    let wire = Arc::new(wire_schema(schema));
    let batches: Pin<Box<dyn Stream<Item = Result<RecordBatch, FlightError>> + Send>> =
        if *wire == *schema {
            Box::pin(batches)
        } else {
            let wire = Arc::clone(&wire);
            Box::pin(batches.map(move |batch| {
                let batch = batch?;
                let columns = batch
                    .columns()
                    .iter()
                    .zip(wire.fields())
                    .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        FlightError::Tonic(Box::new(Status::out_of_range(format!(
                            "a large list holds more values than a list's 32-bit offsets reach \
                             in one batch, and Flight SQL sends large lists as lists: {e}"
                        ))))
                    })?;
                Ok(RecordBatch::try_new(Arc::clone(&wire), columns)?)
            }))
        };
    let stream = FlightDataEncoderBuilder::new()
        .with_dictionary_handling(DictionaryHandling::Resend)
        .with_schema(wire)
        .build(batches)
        .map_err(Status::from);
    Response::new(Box::pin(stream))
}

/// `schema` as Flight SQL sends it: with every large list (nested ones too) a list.
/// arrow-flight's encoder announces a large list as a list but sends the batch's 64-bit
/// offsets, so a client refused the stream (ADBC: "inconsistent schema") or would read it
/// wrong; the batches are cast to this schema before they are encoded.
fn wire_schema(schema: &Schema) -> Schema {
    mink_log::export::map_schema(schema, &|t| match t {
        DataType::LargeList(item) => DataType::List(item),
        other => other,
    })
}

fn one(schema: &Schema, batch: Result<RecordBatch, FlightError>) -> Response<DoGetStream> {
    answer(schema, futures::stream::once(async move { batch }))
}

#[tonic::async_trait]
impl FlightSqlService for MinkFlightSql {
    type FlightService = MinkFlightSql;

    /// A DoPut of no message at all is what ADBC sends to ingest an empty table: nothing to
    /// write, answered as a write of no rows (arrow-flight's answer, "Command is missing",
    /// failed the client's ingest). A first message without a descriptor is refused, saying so.
    async fn do_put_error_callback(
        &self,
        _request: Request<PeekableFlightDataStream>,
        error: arrow_flight::sql::server::DoPutError,
    ) -> Result<Response<<Self as FlightService>::DoPutStream>, Status> {
        use arrow_flight::sql::server::DoPutError;
        match error {
            DoPutError::MissingCommand => {
                let none = arrow_flight::sql::DoPutUpdateResult { record_count: 0 };
                let answer = arrow_flight::PutResult {
                    app_metadata: none.encode_to_vec().into(),
                };
                Ok(Response::new(Box::pin(futures::stream::iter([Ok(answer)]))))
            }
            DoPutError::MissingFlightDescriptor => Err(Status::invalid_argument(
                "a DoPut's first message names its command (CommandStatementUpdate, CommandStatementIngest, ...) in its FlightDescriptor: it had none",
            )),
        }
    }

    /// Mink has no authentication. A handshake without credentials is answered (an empty
    /// response to each request); one carrying credentials (an `authorization` header, as
    /// JDBC and ADBC send a username and password, or a payload) is refused rather than
    /// accepted and ignored: a user who set a password would believe it protects something.
    async fn do_handshake(
        &self,
        request: Request<tonic::Streaming<arrow_flight::HandshakeRequest>>,
    ) -> Result<
        Response<
            Pin<Box<dyn Stream<Item = Result<arrow_flight::HandshakeResponse, Status>> + Send>>,
        >,
        Status,
    > {
        if request.metadata().contains_key("authorization") {
            return Err(no_authentication());
        }
        let answers = request.into_inner().map(|r| {
            let r = r?;
            if r.payload.is_empty() {
                Ok(arrow_flight::HandshakeResponse {
                    protocol_version: r.protocol_version,
                    payload: bytes::Bytes::new(),
                })
            } else {
                Err(no_authentication())
            }
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let (engine, plan) = self.plan(&request, &query.query).await?;
        self.planned(&query.query, plan, &engine, request).await
    }

    /// A statement that returns no rows (`INSERT INTO`): the number of rows it wrote.
    async fn do_put_statement_update(
        &self,
        command: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let (_, plan) = self.plan(&request, &command.query).await?;
        all_bound(&plan)?;
        Ok(updated(
            &self.exec.run(plan.collect()).await.map_err(status)?,
        ))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let handle = std::str::from_utf8(&ticket.statement_handle)
            .map_err(|_| Status::invalid_argument("a statement handle is not UTF-8"))?;
        let (sql, plan) = self.take(handle)?;
        let schema = Arc::new(plan.schema().as_arrow().clone());
        let batches = self.exec.stream(plan).await.map_err(status)?;
        // Running until its stream ends or is dropped; CancelFlightInfo stops it.
        let (batches, cancel) = futures::stream::abortable(batches);
        let guard = self.engine.queries().track(
            &sql,
            "flight sql",
            Some(handle.to_string()),
            Some(cancel.clone()),
        );
        let ended = futures::stream::once(async move {
            drop(guard);
            cancel.is_aborted().then(|| {
                Err(FlightError::Tonic(Box::new(Status::cancelled(
                    "the statement was cancelled (CancelFlightInfo)",
                ))))
            })
        })
        .filter_map(|e| async move { e });
        Ok(answer(
            &schema,
            batches
                .map_err(|e| FlightError::Tonic(Box::new(status(e))))
                .chain(ended),
        ))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.info).schema();
        command_info(&schema, &query, request)
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let builder = query.into_builder(&self.info);
        let schema = builder.schema();
        Ok(one(&schema, builder.build()))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        command_info(&schema, &query, request)
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG);
        let schema = builder.schema();
        Ok(one(&schema, builder.build()))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        command_info(&schema, &query, request)
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let databases = self.schema_names().await?;
        let mut builder = query.into_builder();
        for d in databases {
            builder.append(CATALOG, d);
        }
        let schema = builder.schema();
        Ok(one(&schema, builder.build()))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        command_info(&schema, &query, request)
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let client = self.engine.client();
        let with_schemas = query.include_schema;
        let mut builder = query.into_builder();
        for d in self.schema_names().await? {
            if d == SYSTEM {
                let system = SystemTables::new(client.clone(), Arc::clone(self.engine.queries()));
                for t in system.table_names() {
                    let schema = match system.table(&t).await.map_err(status)? {
                        Some(table) if with_schemas => table.schema().as_ref().clone(),
                        _ => Schema::empty(),
                    };
                    builder
                        .append(CATALOG, SYSTEM, &t, "TABLE", &schema)
                        .map_err(|e| Status::internal(e.to_string()))?;
                }
                continue;
            }
            let Ok(tables) = client.list_tables(&d).await else {
                continue; // dropped meanwhile
            };
            for t in tables {
                let schema = if with_schemas {
                    match client.schema(&d, &t).await {
                        Ok(s) => s,
                        Err(e) if e.code() == Some(ErrorCode::NotFound) => continue,
                        Err(e) => return Err(status(crate::client_error(e))),
                    }
                } else {
                    Schema::empty()
                };
                builder
                    .append(CATALOG, &d, &t, "TABLE", &schema)
                    .map_err(|e| Status::internal(e.to_string()))?;
            }
        }
        let schema = builder.schema();
        Ok(one(&schema, builder.build()))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        command_info(&schema, &query, request)
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append("TABLE");
        let schema = builder.schema();
        Ok(one(&schema, builder.build()))
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&primary_keys_schema(), &query, request)
    }

    async fn do_get_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let schema = Arc::new(primary_keys_schema());
        // Without a db_schema, every database holding a table of that name answers (an
        // omitted db_schema does not narrow); the system tables have no keys.
        let databases = match (query.catalog.as_deref(), query.db_schema.clone()) {
            (Some(c), _) if c != CATALOG => vec![],
            (_, Some(d)) if d == SYSTEM => vec![],
            (_, Some(d)) => vec![d],
            (_, None) => self
                .schema_names()
                .await?
                .into_iter()
                .filter(|d| d != SYSTEM)
                .collect(),
        };
        let (mut databases_of, mut columns, mut sequence) = (vec![], vec![], vec![]);
        for database in databases {
            let key = match self
                .engine
                .client()
                .describe_table(&database, &query.table)
                .await
            {
                Ok(d) => d.primary_key,
                Err(e) if e.code() == Some(ErrorCode::NotFound) => vec![],
                Err(e) => return Err(status(crate::client_error(e))),
            };
            for (i, column) in key.into_iter().enumerate() {
                databases_of.push(database.clone());
                columns.push(column);
                sequence.push(i32::try_from(i + 1).unwrap_or(i32::MAX));
            }
        }
        let n = columns.len();
        let constant = |v: &str| -> ArrayRef { Arc::new(StringArray::from(vec![v; n])) };
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                constant(CATALOG),
                Arc::new(StringArray::from(databases_of)),
                constant(&query.table),
                Arc::new(StringArray::from(columns)),
                Arc::new(StringArray::from(vec![None::<&str>; n])),
                Arc::new(Int32Array::from(sequence)),
            ],
        );
        Ok(one(&schema, batch.map_err(FlightError::from)))
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder(&self.types).schema();
        command_info(&schema, &query, request)
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let builder = query.into_builder(&self.types);
        let schema = builder.schema();
        Ok(one(&schema, builder.build()))
    }

    async fn get_flight_info_imported_keys(
        &self,
        query: CommandGetImportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&foreign_keys_schema(), &query, request)
    }

    async fn do_get_imported_keys(
        &self,
        _query: CommandGetImportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(no_foreign_keys())
    }

    async fn get_flight_info_exported_keys(
        &self,
        query: CommandGetExportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&foreign_keys_schema(), &query, request)
    }

    async fn do_get_exported_keys(
        &self,
        _query: CommandGetExportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(no_foreign_keys())
    }

    async fn get_flight_info_cross_reference(
        &self,
        query: CommandGetCrossReference,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&foreign_keys_schema(), &query, request)
    }

    async fn do_get_cross_reference(
        &self,
        _query: CommandGetCrossReference,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(no_foreign_keys())
    }

    /// The deprecated `CancelQuery`: as `CancelFlightInfo` (their result codes agree).
    async fn do_action_cancel_query(
        &self,
        query: ActionCancelQueryRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<ActionCancelQueryResult, Status> {
        let info = FlightInfo::decode(query.info)
            .map_err(|e| Status::invalid_argument(format!("CancelQuery's FlightInfo: {e}")))?;
        Ok(ActionCancelQueryResult {
            result: self.cancel(info) as i32,
        })
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        // DDL is carried out when the prepared statement runs (ADBC prepares every
        // statement), not when it is prepared: it has no rows and no parameters.
        let (dataset, parameter_schema) = if crate::ddl::is_ddl(&query.query) {
            (Schema::empty(), Schema::empty())
        } else {
            let (_, plan) = self.plan(&request, &query.query).await?;
            let mut parameters: Vec<(String, Option<DataType>)> = plan
                .logical_plan()
                .get_parameter_types()
                .map_err(status)?
                .into_iter()
                .collect();
            parameters.sort_by_key(|(name, _)| {
                name.trim_start_matches('$')
                    .parse::<u64>()
                    .unwrap_or(u64::MAX)
            });
            let parameter_schema = Schema::new(
                parameters
                    .into_iter()
                    .map(|(name, t)| Field::new(name, t.unwrap_or(DataType::Null), true))
                    .collect::<Vec<_>>(),
            );
            (plan.schema().as_arrow().clone(), parameter_schema)
        };
        let handle = prepared_handle(&query.query);
        keep_prepared(
            &mut self.prepared.lock().expect("prepared"),
            &handle,
            &query.query,
        );
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into_bytes().into(),
            dataset_schema: ipc_schema(&wire_schema(&dataset))?,
            parameter_schema: ipc_schema(&parameter_schema)?,
        })
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let handle = query.prepared_statement_handle;
        self.prepared(&handle)?;
        let parameters = parameter_rows(request.into_inner()).await?;
        let key = String::from_utf8_lossy(&handle).into_owned();
        if let Some(p) = self.prepared.lock().expect("prepared").get_mut(&key) {
            p.parameters = parameters;
            p.at = Instant::now();
        }
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle),
        })
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let prepared = self.prepared(&query.prepared_statement_handle)?;
        let (engine, plan) = self.plan(&request, &prepared.sql).await?;
        let rows = parameters(&prepared.parameters)?;
        if rows.len() > 1 {
            return Err(Status::invalid_argument(
                "a query runs with one row of parameters; bind one",
            ));
        }
        let plan = match rows.into_iter().next() {
            Some(values) => bind(plan, values)?,
            None => plan,
        };
        self.planned(&prepared.sql, plan, &engine, request).await
    }

    /// A prepared `INSERT`, `UPDATE` or `DELETE`: run once per bound row of parameters (once
    /// without); answers the rows written in all.
    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let prepared = self.prepared(&query.prepared_statement_handle)?;
        let metadata = request.metadata().clone();
        let mut rows = parameters(&parameter_rows(request.into_inner()).await?)?;
        if rows.is_empty() {
            rows = parameters(&prepared.parameters)?;
        }
        let runs: Vec<Option<Vec<ScalarValue>>> = if rows.is_empty() {
            vec![None]
        } else {
            rows.into_iter().map(Some).collect()
        };
        let mut total = 0i64;
        for values in runs {
            let mut r = Request::new(());
            *r.metadata_mut() = metadata.clone();
            let (_, plan) = self.plan(&r, &prepared.sql).await?;
            let plan = match values {
                Some(v) => bind(plan, v)?,
                None => plan,
            };
            all_bound(&plan)?;
            let rows = self.exec.run(plan.collect()).await.map_err(status)?;
            total = total.saturating_add(updated(&rows));
        }
        Ok(total)
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        let key = String::from_utf8_lossy(&query.prepared_statement_handle).into_owned();
        self.prepared.lock().expect("prepared").remove(&key);
        Ok(())
    }

    /// Bulk ingest (ADBC's `adbc_ingest`, Polars' `write_database`): the rows appended to an
    /// existing table through the writer `INSERT INTO` uses. Creating or replacing a table this
    /// way is refused (create it with `CREATE TABLE`), as are temporary tables and
    /// transactions, which Mink has not.
    async fn do_put_statement_ingest(
        &self,
        command: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        use arrow_flight::sql::{TableExistsOption, TableNotExistOption};
        let options = command.table_definition_options.unwrap_or_default();
        let (if_not_exist, if_exists) = (options.if_not_exist(), options.if_exists());
        if if_not_exist == TableNotExistOption::Create {
            return Err(Status::unimplemented(
                "bulk ingest does not create tables: create the table with CREATE TABLE, then append to it (mode append)",
            ));
        }
        match if_exists {
            TableExistsOption::Append => {}
            TableExistsOption::Replace => {
                return Err(Status::unimplemented(
                    "bulk ingest does not replace tables: append to the table (mode append), or drop and create it with SQL first",
                ));
            }
            TableExistsOption::Fail | TableExistsOption::Unspecified => {
                return Err(Status::unimplemented(
                    "bulk ingest only appends to an existing table (mode append); it does not create tables: use CREATE TABLE first",
                ));
            }
        }
        if command.temporary {
            return Err(Status::unimplemented("Mink has no temporary tables"));
        }
        if command.transaction_id.is_some() {
            return Err(Status::unimplemented("Mink has no transactions"));
        }
        if command.catalog.as_deref().is_some_and(|c| c != CATALOG) {
            return Err(Status::not_found(format!(
                "no catalog {:?}: Mink's one catalog is {CATALOG}",
                command.catalog.unwrap_or_default()
            )));
        }
        let database = command.schema.unwrap_or_else(|| "default".to_string());
        // Read as the write takes them: an ingest is not held in memory whole.
        let mut decoded = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
            request
                .into_inner()
                .try_filter(|d| futures::future::ready(!d.data_header.is_empty()))
                .map_err(FlightError::from),
        );
        let Some(first) = decoded
            .try_next()
            .await
            .map_err(|e| Status::invalid_argument(format!("the rows to ingest: {e}")))?
        else {
            return Ok(0);
        };
        let schema = first.schema();
        let rest =
            decoded.map_err(|e| DataFusionError::Execution(format!("the rows to ingest: {e}")));
        let batches: datafusion::execution::SendableRecordBatchStream = Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                schema,
                futures::stream::once(async move { Ok(first) }).chain(rest),
            ),
        );
        let engine = self.engine.clone();
        let sql = format!("bulk ingest into {database}.{}", command.table);
        let _running = self.engine.queries().track(&sql, "flight sql", None, None);
        let table = command.table;
        let written = self
            .exec
            .run(async move {
                engine
                    .append_batches(&database, &table, batches)
                    .await?
                    .collect()
                    .await
            })
            .await
            .map_err(status)?;
        Ok(updated(&written))
    }

    /// `CancelFlightInfo`: a statement planned and not yet fetched is forgotten; one running
    /// stops (its `DoGet` ends with `CANCELLED`).
    async fn do_action_fallback(
        &self,
        request: Request<arrow_flight::Action>,
    ) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        if request.get_ref().r#type != "CancelFlightInfo" {
            return Err(Status::invalid_argument(format!(
                "unknown action {:?}",
                request.get_ref().r#type
            )));
        }
        let cancel = arrow_flight::CancelFlightInfoRequest::decode(request.get_ref().body.clone())
            .map_err(|e| Status::invalid_argument(format!("CancelFlightInfoRequest: {e}")))?;
        let result = self.cancel(cancel.info.unwrap_or_default());
        let body = arrow_flight::CancelFlightInfoResult::new(result).encode_to_vec();
        Ok(Response::new(Box::pin(futures::stream::once(async move {
            Ok(arrow_flight::Result { body: body.into() })
        }))))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

impl MinkFlightSql {
    /// Cancels the statements of `info`'s endpoints: one planned and not yet fetched is
    /// forgotten, one running stops.
    fn cancel(&self, info: FlightInfo) -> arrow_flight::CancelStatus {
        let mut result = arrow_flight::CancelStatus::Unspecified;
        for endpoint in info.endpoint {
            let Some(handle) = endpoint
                .ticket
                .and_then(|t| arrow_flight::sql::Any::decode(t.ticket).ok())
                .and_then(|any| any.unpack::<TicketStatementQuery>().ok().flatten())
                .and_then(|t| String::from_utf8(t.statement_handle.to_vec()).ok())
            else {
                continue;
            };
            let planned = self.plans.lock().expect("plans").remove(&handle).is_some();
            if planned || self.engine.queries().cancel(&handle) {
                result = arrow_flight::CancelStatus::Cancelled;
            } else if result == arrow_flight::CancelStatus::Unspecified {
                result = arrow_flight::CancelStatus::NotCancellable;
            }
        }
        result
    }
}

/// What a client sending credentials is told.
fn no_authentication() -> Status {
    Status::unauthenticated(
        "mink-query has no authentication: connect without a username and password",
    )
}

/// The result schema of `GetPrimaryKeys` (Flight SQL's).
fn primary_keys_schema() -> Schema {
    Schema::new(vec![
        Field::new("catalog_name", DataType::Utf8, true),
        Field::new("db_schema_name", DataType::Utf8, true),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("column_name", DataType::Utf8, false),
        Field::new("key_name", DataType::Utf8, true),
        Field::new("key_sequence", DataType::Int32, false),
    ])
}

/// The actions the service carries out, as `ListActions` answers them.
const ACTIONS: [(&str, &str); 4] = [
    (
        "CreatePreparedStatement",
        "Creates a prepared statement (ActionCreatePreparedStatementRequest)",
    ),
    (
        "ClosePreparedStatement",
        "Closes a prepared statement (ActionClosePreparedStatementRequest)",
    ),
    (
        "CancelFlightInfo",
        "Cancels a statement planned or running (CancelFlightInfoRequest)",
    ),
    (
        "CancelQuery",
        "Cancels a statement planned or running; deprecated for CancelFlightInfo (ActionCancelQueryRequest)",
    ),
];

/// The gRPC service of [`MinkFlightSql`]: arrow-flight's Flight SQL dispatch, but
/// `ListActions` lists the actions served (arrow-flight's lists transactions, savepoints and
/// Substrait plans whatever the server does, and not `CancelFlightInfo`).
#[derive(Clone, Debug)]
pub struct MinkFlightService(MinkFlightSql);

type Sql = MinkFlightSql;

/// The Flight SQL command (or ticket) in `bytes`, or what is wrong with it: arrow-flight's
/// dispatch would answer protobuf's debug output (`DecodeError { description:
/// InvalidWireType { value: 7 } ... }`) or, for a message it does not know, that it is
/// unimplemented.
fn command(bytes: &[u8]) -> Result<arrow_flight::sql::Command, String> {
    let any = arrow_flight::sql::Any::decode(bytes)
        .map_err(|e| format!("it is not a Flight SQL message: {e}"))?;
    match arrow_flight::sql::Command::try_from(any) {
        Ok(arrow_flight::sql::Command::Unknown(any)) => Err(format!(
            "it is not a Flight SQL message (type {:?})",
            any.type_url
        )),
        Ok(command) => Ok(command),
        Err(e) => Err(format!("its message does not decode: {e}")),
    }
}

#[tonic::async_trait]
impl FlightService for MinkFlightService {
    type HandshakeStream = <Sql as FlightService>::HandshakeStream;
    type ListFlightsStream = <Sql as FlightService>::ListFlightsStream;
    type DoGetStream = <Sql as FlightService>::DoGetStream;
    type DoPutStream = <Sql as FlightService>::DoPutStream;
    type DoExchangeStream = <Sql as FlightService>::DoExchangeStream;
    type DoActionStream = <Sql as FlightService>::DoActionStream;
    type ListActionsStream = <Sql as FlightService>::ListActionsStream;

    async fn handshake(
        &self,
        request: Request<tonic::Streaming<arrow_flight::HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        FlightService::handshake(&self.0, request).await
    }

    async fn list_flights(
        &self,
        request: Request<arrow_flight::Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        FlightService::list_flights(&self.0, request).await
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command(&request.get_ref().cmd).map_err(|e| {
            Status::invalid_argument(format!("not a Flight SQL command this server serves ({e})"))
        })?;
        FlightService::get_flight_info(&self.0, request).await
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<arrow_flight::PollInfo>, Status> {
        FlightService::poll_flight_info(&self.0, request).await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<arrow_flight::SchemaResult>, Status> {
        FlightService::get_schema(&self.0, request).await
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        command(&request.get_ref().ticket).map_err(|e| {
            Status::invalid_argument(format!(
                "not a ticket this server issued ({e}): a ticket comes from the FlightInfo this server answered (GetFlightInfo), as it is"
            ))
        })?;
        FlightService::do_get(&self.0, request).await
    }

    async fn do_put(
        &self,
        request: Request<tonic::Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        FlightService::do_put(&self.0, request).await
    }

    async fn do_exchange(
        &self,
        request: Request<tonic::Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        FlightService::do_exchange(&self.0, request).await
    }

    async fn do_action(
        &self,
        request: Request<arrow_flight::Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        FlightService::do_action(&self.0, request).await
    }

    async fn list_actions(
        &self,
        _request: Request<arrow_flight::Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let actions = ACTIONS.map(|(r#type, description)| {
            Ok(arrow_flight::ActionType {
                r#type: r#type.into(),
                description: description.into(),
            })
        });
        Ok(Response::new(Box::pin(futures::stream::iter(actions))))
    }
}
