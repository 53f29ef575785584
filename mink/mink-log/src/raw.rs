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

/// A header: its key and value.
pub type Header<'a> = (&'a str, Option<&'a [u8]>);

/// A record as a raw row: borrowed parts, the time in milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: &'a [Header<'a>],
    pub timestamp_ms: i64,
}

/// `records` as rows of the raw schema.
pub fn rows<'a>(
    records: impl IntoIterator<Item = Record<'a>>,
) -> Result<arrow::array::RecordBatch, arrow::error::ArrowError> {
    use arrow::array::{
        BinaryBuilder, ListBuilder, StringBuilder, StructBuilder, TimestampMicrosecondArray,
    };
    let mut keys = BinaryBuilder::new();
    let mut values = BinaryBuilder::new();
    let mut headers = ListBuilder::new(StructBuilder::from_fields(header_fields(), 0))
        .with_field(Arc::new(Field::new("item", header_type(), true)));
    let mut timestamps = Vec::new();
    for r in records {
        keys.append_option(r.key);
        values.append_option(r.value);
        let entries = headers.values();
        for (k, v) in r.headers {
            entries
                .field_builder::<StringBuilder>(0)
                .expect("header key")
                .append_value(k);
            entries
                .field_builder::<BinaryBuilder>(1)
                .expect("header value")
                .append_option(*v);
            entries.append(true);
        }
        headers.append(true);
        // Microseconds, as Iceberg stores time; Kafka's are milliseconds.
        timestamps.push(r.timestamp_ms.saturating_mul(1000));
    }
    arrow::array::RecordBatch::try_new(
        Arc::new(schema()),
        vec![
            Arc::new(keys.finish()),
            Arc::new(values.finish()),
            Arc::new(headers.finish()),
            Arc::new(TimestampMicrosecondArray::from(timestamps).with_timezone("UTC")),
        ],
    )
}
