//! DDL on Mink tables: `CREATE TABLE` (with a `PRIMARY KEY` and `WITH ('bucket.num' = '4',
//! ...)` options named as in Apache Fluss), `DROP TABLE`, and `CREATE SCHEMA` / `DROP SCHEMA`
//! for databases, carried out by the cluster's metadata when the statement is planned.
//!
//! DataFusion turns the column definitions into an Arrow schema and the key into a
//! constraint; the options (which DataFusion's planner refuses) are taken off the statement
//! first and sent to Mink as they are, so a Mink table option is checked by the nodes and a
//! wrong one refused there with its name.

use std::collections::BTreeMap;

use datafusion::common::Constraint;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    ArrayElemTypeDef, ColumnDef, CreateTableOptions, DataType as SqlType, Expr,
    HiveDistributionStyle, ObjectName, ObjectType, SchemaName, SqlOption, Statement, Value,
};
use mink_client::{Client, protocol};

use crate::client_error;

/// Whether `sql` is a statement [`run`] carries out (DDL on Mink tables and databases).
pub fn is_ddl(sql: &str) -> bool {
    let Ok(mut statements) = datafusion::sql::parser::DFParser::parse_sql(sql) else {
        return false;
    };
    matches!(
        statements.pop_front(),
        Some(DfStatement::Statement(s)) if matches!(
            s.as_ref(),
            Statement::CreateTable(_)
                | Statement::CreateSchema { .. }
                | Statement::Drop { .. }
                | Statement::AlterTable(_)
        )
    )
}

/// Carries out `statement` if it is DDL on Mink tables (returning `true`); leaves anything
/// else to DataFusion (`false`).
pub async fn run(ctx: &SessionContext, client: &Client, statement: &DfStatement) -> Result<bool> {
    let DfStatement::Statement(s) = statement else {
        return Ok(false);
    };
    match s.as_ref() {
        Statement::CreateTable(create) => {
            let mut stripped = create.clone();
            let options = match std::mem::take(&mut stripped.table_options) {
                CreateTableOptions::None => BTreeMap::new(),
                CreateTableOptions::With(options) | CreateTableOptions::Options(options) => {
                    table_options(&options)?
                }
                other => {
                    return Err(DataFusionError::NotImplemented(format!(
                        "table options as {other}: give them as WITH ('bucket.num' = '4', ...)"
                    )));
                }
            };
            if stripped.query.is_some() {
                return Err(DataFusionError::NotImplemented(
                    "CREATE TABLE ... AS SELECT is not supported: create the table, then INSERT INTO it".into(),
                ));
            }
            // Hive's `PARTITIONED BY (day VARCHAR)`: partition columns follow the others and
            // are the partition keys.
            let mut partition_keys = Vec::new();
            if let HiveDistributionStyle::PARTITIONED { columns } =
                std::mem::replace(&mut stripped.hive_distribution, HiveDistributionStyle::NONE)
            {
                for c in columns {
                    if stripped
                        .columns
                        .iter()
                        .any(|x| normalized(&x.name) == normalized(&c.name))
                    {
                        return Err(DataFusionError::Plan(format!(
                            "partition column {} is declared twice: in PARTITIONED BY, name it only there (with its type)",
                            c.name.value
                        )));
                    }
                    partition_keys.push(normalized(&c.name));
                    stripped.columns.push(c);
                }
            }
            refuse_ignored(&stripped.columns, &stripped.constraints)?;
            let (database, table) = names(&create.name)?;
            lake_timestamps(&mut stripped.columns);
            let plan = column_planner(ctx)
                .statement_to_plan(DfStatement::Statement(Box::new(Statement::CreateTable(
                    stripped,
                ))))
                .await?;
            let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(c)) = plan else {
                return Err(DataFusionError::Internal(format!(
                    "CREATE TABLE planned as {}",
                    plan.display()
                )));
            };
            let schema = c.input.schema().as_arrow().clone();
            let primary_key: Vec<String> = c
                .constraints
                .iter()
                .find_map(|k| match k {
                    Constraint::PrimaryKey(columns) => Some(
                        columns
                            .iter()
                            .map(|&i| schema.field(i).name().clone())
                            .collect(),
                    ),
                    Constraint::Unique(_) => None,
                })
                .unwrap_or_default();
            client
                .create_table_with(&protocol::CreateTable {
                    database,
                    table,
                    schema: protocol::encode_schema(&schema)
                        .map_err(|e| DataFusionError::External(Box::new(e)))?,
                    options,
                    partition_keys,
                    primary_key,
                    comment: String::new(),
                    if_not_exists: c.if_not_exists,
                })
                .await
                .map_err(client_error)?;
            Ok(true)
        }
        Statement::AlterTable(alter) => {
            alter_table(ctx, client, alter).await?;
            Ok(true)
        }
        // A database is a schema of catalog `mink`.
        Statement::CreateSchema {
            schema_name: SchemaName::Simple(name),
            if_not_exists,
            ..
        } => {
            let database = database_name(name)?;
            if database == crate::system::SYSTEM {
                return Err(DataFusionError::Plan(
                    "system is the schema of the system tables: name the database otherwise".into(),
                ));
            }
            client
                .create_database(&database, *if_not_exists)
                .await
                .map_err(client_error)?;
            Ok(true)
        }
        Statement::Drop {
            object_type: ObjectType::Schema,
            if_exists,
            cascade,
            names: databases,
            ..
        } => {
            for name in databases {
                client
                    .drop_database(&database_name(name)?, *cascade, *if_exists)
                    .await
                    .map_err(client_error)?;
            }
            Ok(true)
        }
        Statement::Drop {
            object_type: ObjectType::Table,
            if_exists,
            names: tables,
            ..
        } => {
            for name in tables {
                let (database, table) = names(name)?;
                client
                    .drop_table(&database, &table, *if_exists)
                    .await
                    .map_err(client_error)?;
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Refuses what a Mink table would not keep, rather than accepting and ignoring it (a
/// `DEFAULT` that no INSERT got, a `UNIQUE` that let duplicates in): a column takes `NULL`,
/// `NOT NULL` and `PRIMARY KEY`, the table a `PRIMARY KEY` constraint.
fn refuse_ignored(
    columns: &[ColumnDef],
    constraints: &[datafusion::sql::sqlparser::ast::TableConstraint],
) -> Result<()> {
    use datafusion::sql::sqlparser::ast::{ColumnOption as O, TableConstraint};
    for c in columns {
        for o in &c.options {
            let why = match &o.option {
                O::Null | O::NotNull | O::PrimaryKey(_) => continue,
                O::Default(_) => "a table keeps what each write gives: name the value in INSERT",
                O::Unique(_) => "a PRIMARY KEY is a table's one key (its rows are upserted by it)",
                _ => "a column takes NULL, NOT NULL and PRIMARY KEY",
            };
            return Err(DataFusionError::NotImplemented(format!(
                "column {}: {} is not supported: {why}",
                c.name, o.option
            )));
        }
    }
    // One key, declared once: a second declaration was kept or dropped by where it stood.
    let keys = columns
        .iter()
        .flat_map(|c| &c.options)
        .filter(|o| matches!(o.option, O::PrimaryKey(_)))
        .count()
        + constraints
            .iter()
            .filter(|k| matches!(k, TableConstraint::PrimaryKey(_)))
            .count();
    if keys > 1 {
        return Err(DataFusionError::Plan(format!(
            "{keys} PRIMARY KEY declarations: a table has one key; name all its columns in one (PRIMARY KEY (a, b))"
        )));
    }
    for k in constraints {
        if !matches!(k, TableConstraint::PrimaryKey(_)) {
            return Err(DataFusionError::NotImplemented(format!(
                "{k} is not supported: a table takes a PRIMARY KEY, its one key (its rows are upserted by it)"
            )));
        }
    }
    Ok(())
}

/// `ALTER TABLE t ADD COLUMN c type` (nullable, at the end, as Mink's schema evolution
/// allows) and `ALTER TABLE t SET ('k' = 'v', ...)` (table options).
async fn alter_table(
    ctx: &SessionContext,
    client: &Client,
    alter: &datafusion::sql::sqlparser::ast::AlterTable,
) -> Result<()> {
    use datafusion::sql::sqlparser::ast::AlterTableOperation as Op;
    let (database, table) = names(&alter.name)?;
    let mut change = protocol::AlterTable {
        database: database.clone(),
        table: table.clone(),
        ..Default::default()
    };
    let mut added = Vec::new();
    for op in &alter.operations {
        match op {
            Op::AddColumn {
                column_def,
                if_not_exists,
                column_position,
                ..
            } => {
                if column_position.is_some() {
                    return Err(DataFusionError::NotImplemented(format!(
                        "ADD COLUMN {} FIRST or AFTER is not supported: Mink adds columns at the end",
                        column_def.name
                    )));
                }
                refuse_ignored(std::slice::from_ref(column_def), &[])?;
                let mut column = column_def.clone();
                lake_timestamps(std::slice::from_mut(&mut column));
                added.push((column, *if_not_exists));
            }
            Op::SetOptionsParens { options }
            | Op::SetTblProperties {
                table_properties: options,
            } => {
                change.set_options.extend(table_options(options)?);
            }
            other => {
                return Err(DataFusionError::NotImplemented(format!(
                    "ALTER TABLE ... {other} is not supported: Mink adds nullable columns at the end (ADD COLUMN) and sets options (SET ('k' = 'v'))"
                )));
            }
        }
    }
    if !added.is_empty() {
        let current = client
            .schema(&database, &table)
            .await
            .map_err(client_error)?;
        // ADD COLUMN IF NOT EXISTS of a column the table has: nothing to add, as in PostgreSQL.
        // Names as the table keeps them (unquoted ones folded), including the statement's own.
        let mut seen: Vec<String> = Vec::new();
        let added: Vec<ColumnDef> = added
            .into_iter()
            .filter(|(c, if_not_exists)| {
                let name = normalized(&c.name);
                let exists = current.field_with_name(&name).is_ok() || seen.contains(&name);
                seen.push(name);
                !(*if_not_exists && exists)
            })
            .map(|(c, _)| c)
            .collect();
        if !added.is_empty() {
            // The new columns' Arrow types, as DataFusion plans them.
            let probe = format!(
                "CREATE TABLE mink_alter_probe ({})",
                added
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let plan = column_planner(ctx).create_logical_plan(&probe).await?;
            let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(c)) = plan else {
                return Err(DataFusionError::Internal(
                    "ADD COLUMN planned otherwise".into(),
                ));
            };
            let mut fields: Vec<_> = current
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.extend(
                c.input
                    .schema()
                    .as_arrow()
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone()),
            );
            let schema =
                arrow::datatypes::Schema::new_with_metadata(fields, current.metadata().clone());
            change.schema = Some(
                protocol::encode_schema(&schema)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?,
            );
        }
    }
    // Nothing left to change (every column exists already): nothing to ask.
    if change.schema.is_some() || !change.set_options.is_empty() {
        client.alter_table(&change).await.map_err(client_error)?;
    }
    Ok(())
}

/// `TIMESTAMP` columns as Postgres, Spark and Iceberg type them: microseconds unless a
/// precision is given. DataFusion's nanoseconds are a format-v3 Iceberg type that pyiceberg and
/// DuckDB cannot read in the v2 lake tables Mink writes.
fn lake_timestamps(columns: &mut [ColumnDef]) {
    fn micros(t: &mut SqlType) {
        match t {
            SqlType::Timestamp(precision @ None, _) => *precision = Some(6),
            SqlType::Array(
                ArrayElemTypeDef::AngleBracket(t)
                | ArrayElemTypeDef::SquareBracket(t, _)
                | ArrayElemTypeDef::Parenthesis(t),
            ) => micros(t),
            SqlType::Struct(fields, _) => {
                for f in fields {
                    micros(&mut f.field_type);
                }
            }
            SqlType::Map(k, v) => {
                micros(k);
                micros(v);
            }
            _ => {}
        }
    }
    for c in columns {
        micros(&mut c.data_type);
    }
}

/// A planner for column definitions: `TIMESTAMP WITH TIME ZONE` (`TIMESTAMPTZ`) is in UTC,
/// where DataFusion takes the session's time zone (none by default, so no zone at all).
fn column_planner(ctx: &SessionContext) -> datafusion::execution::SessionState {
    let mut state = ctx.state();
    state.config_mut().options_mut().execution.time_zone = Some("UTC".into());
    state
}

/// An identifier as DataFusion resolves it: unquoted names are lowercase.
pub(crate) fn normalized(i: &datafusion::sql::sqlparser::ast::Ident) -> String {
    if i.quote_style.is_some() {
        i.value.clone()
    } else {
        i.value.to_lowercase()
    }
}

/// A database's name (`name`, or `mink.name`).
fn database_name(name: &ObjectName) -> Result<String> {
    let parts: Vec<String> = name
        .0
        .iter()
        .filter_map(|p| p.as_ident().map(normalized))
        .collect();
    match parts.as_slice() {
        [database] => Ok(database.clone()),
        [catalog, database] if catalog == crate::CATALOG => Ok(database.clone()),
        _ => Err(DataFusionError::Plan(format!(
            "{name}: a database is a schema of catalog {}",
            crate::CATALOG
        ))),
    }
}

/// `database.table` (or a table of database `default`).
fn names(name: &ObjectName) -> Result<(String, String)> {
    names_as(name, normalized)
}

/// The (database, table) names `text` may mean, for a command that takes a table's name as
/// typed (the REPL's `\d`): read as SQL reads it (`app."Events"` is `Events`, unquoted parts
/// lower-cased), then, when that differs, as written (`app.Events`).
pub fn table_names(text: &str) -> Result<Vec<(String, String)>> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    use datafusion::sql::sqlparser::tokenizer::Token;
    let name = Parser::new(&GenericDialect {})
        .try_with_sql(text)
        .and_then(|mut p| {
            let name = p.parse_object_name(false)?;
            p.expect_token(&Token::EOF)?;
            Ok(name)
        })
        .map_err(|e| DataFusionError::Plan(format!("{text}: {e}")))?;
    let mut found = vec![names(&name)?];
    let written = names_as(&name, |i| i.value.clone())?;
    if !found.contains(&written) {
        found.push(written);
    }
    Ok(found)
}

/// `database.table` with each part read by `part`.
fn names_as(
    name: &ObjectName,
    part: fn(&datafusion::sql::sqlparser::ast::Ident) -> String,
) -> Result<(String, String)> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| {
            p.as_ident()
                .map(part)
                .ok_or_else(|| DataFusionError::Plan(format!("{name} is not a table name")))
        })
        .collect::<Result<_>>()?;
    match parts.as_slice() {
        [table] => Ok(("default".into(), table.clone())),
        [database, table] => Ok((database.clone(), table.clone())),
        [catalog, database, table] if catalog == crate::CATALOG => {
            Ok((database.clone(), table.clone()))
        }
        _ => Err(DataFusionError::Plan(format!(
            "{name}: name a table as database.table (catalog {})",
            crate::CATALOG
        ))),
    }
}

/// `WITH ('key' = 'value', ...)` as Mink table options (values as their text).
fn table_options(options: &[SqlOption]) -> Result<BTreeMap<String, String>> {
    options
        .iter()
        .map(|o| match o {
            SqlOption::KeyValue { key, value } => {
                let value = match value {
                    Expr::Value(v) => match &v.value {
                        Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
                        Value::Number(n, _) => n.clone(),
                        Value::Boolean(b) => b.to_string(),
                        other => other.to_string(),
                    },
                    Expr::Identifier(i) => i.value.clone(),
                    other => other.to_string(),
                };
                Ok((key.value.clone(), value))
            }
            other => Err(DataFusionError::Plan(format!(
                "table option {other}: expected 'key' = 'value'"
            ))),
        })
        .collect()
}
