//! The changelog view of a primary-key table, as readers see it: `_change_type`,
//! `_log_offset`, `_commit_timestamp`, then the table's columns. (The KV tablet writes and
//! reads the changelog; clients and the SQL engine only need its shape.)

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

pub const CHANGE_TYPE: &str = "_change_type";
pub const LOG_OFFSET: &str = "_log_offset";
pub const COMMIT_TIMESTAMP: &str = "_commit_timestamp";

/// The type of `_commit_timestamp`: milliseconds, UTC.
pub fn commit_timestamp_type() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
}

/// The changelog view's schema for a table of schema `table`.
pub fn view_schema(table: &Schema) -> SchemaRef {
    let mut fields = vec![
        Field::new(CHANGE_TYPE, DataType::Utf8, false),
        Field::new(LOG_OFFSET, DataType::Int64, false),
        Field::new(COMMIT_TIMESTAMP, commit_timestamp_type(), false),
    ];
    fields.extend(table.fields().iter().map(|f| f.as_ref().clone()));
    Arc::new(Schema::new_with_metadata(fields, table.metadata().clone()))
}
