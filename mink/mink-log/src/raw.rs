//! The raw schema: a Kafka record as a row (`key`, `value`, `headers`, `timestamp`), the schema
//! of topics created over Kafka and of tables a Kafka source fills with records as they are.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, TimeUnit};

/// The raw schema. `timestamp` is the record's time in microseconds (Kafka's are
/// milliseconds), as Iceberg stores time.
pub fn schema() -> Schema {
    Schema::new(vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new(
            "headers",
            DataType::List(Arc::new(Field::new("item", header_type(), true))),
            true,
        ),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
    ])
}

/// A header: `key` (Utf8), `value` (Binary, nullable).
pub fn header_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Binary, true),
    ])
}

/// The type of a header (an item of `headers`).
pub fn header_type() -> DataType {
    DataType::Struct(header_fields())
}

/// Whether `schema` is the raw schema.
pub fn is_raw(schema: &Schema) -> bool {
    schema.fields() == self::schema().fields()
}
