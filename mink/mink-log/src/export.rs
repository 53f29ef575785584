//! Rows written out as files for other tools.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::error::ArrowError;

/// The type a column of type `t` is written as in Parquet, so that readers without Arrow's
/// embedded schema (DuckDB, Spark, Polars' native reader) see a timestamp, time or date:
/// Parquet has no second unit and no millisecond date, and Arrow's Parquet writer stores those
/// as bare integers. Seconds widen to milliseconds and `Date64` (whole days in milliseconds)
/// becomes `Date32`, each exact; nested types are mapped inside.
pub fn parquet_type(t: &DataType) -> DataType {
    let field = |f: &Arc<Field>| {
        Arc::new(
            f.as_ref()
                .clone()
                .with_data_type(parquet_type(f.data_type())),
        )
    };
    match t {
        DataType::Timestamp(TimeUnit::Second, tz) => {
            DataType::Timestamp(TimeUnit::Millisecond, tz.clone())
        }
        DataType::Time32(TimeUnit::Second) => DataType::Time32(TimeUnit::Millisecond),
        DataType::Date64 => DataType::Date32,
        DataType::List(f) => DataType::List(field(f)),
        DataType::LargeList(f) => DataType::LargeList(field(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(field(f), *n),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(field).collect()),
        DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
        other => other.clone(),
    }
}

/// `schema` with each column's type as [`parquet_type`] maps it.
pub fn parquet_schema(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| {
                f.as_ref()
                    .clone()
                    .with_data_type(parquet_type(f.data_type()))
            })
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    ))
}

/// `batch` cast to `schema` (its [`parquet_schema`]); the batch itself when nothing changes.
pub fn to_parquet(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    if batch.schema_ref() == schema {
        return Ok(batch.clone());
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(Arc::clone(schema), columns)
}

#[cfg(test)]
mod tests {
    use arrow::array::{
        Array as _, Date64Array, Int64Array, ListArray, Time32SecondArray, TimestampSecondArray,
    };
    use arrow::datatypes::Int64Type;

    use super::*;

    #[test]
    fn seconds_and_millisecond_dates_become_parquet_types_exactly() {
        let schema = Arc::new(Schema::new(vec![
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Second, Some("UTC".into())),
                true,
            ),
            Field::new("t", DataType::Time32(TimeUnit::Second), true),
            Field::new("d", DataType::Date64, true),
            Field::new("n", DataType::Int64, true),
            Field::new(
                "l",
                DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true))),
                true,
            ),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(
                    TimestampSecondArray::from(vec![Some(1_700_000_000), None])
                        .with_timezone("UTC"),
                ),
                Arc::new(Time32SecondArray::from(vec![Some(3_600), None])),
                Arc::new(Date64Array::from(vec![Some(86_400_000 * 3), None])),
                Arc::new(Int64Array::from(vec![Some(1), None])),
                Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>([
                    Some([Some(1)]),
                    None,
                ])),
            ],
        )
        .unwrap();
        let out_schema = parquet_schema(&schema);
        let out = to_parquet(&batch, &out_schema).unwrap();
        assert_eq!(
            out.schema().field(0).data_type(),
            &DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
        );
        assert_eq!(
            out.schema().field(1).data_type(),
            &DataType::Time32(TimeUnit::Millisecond)
        );
        assert_eq!(out.schema().field(2).data_type(), &DataType::Date32);
        // Exact both ways: casting back gives the rows written.
        for (i, f) in schema.fields().iter().enumerate() {
            let back = arrow::compute::cast(out.column(i), f.data_type()).unwrap();
            assert_eq!(back.to_data(), batch.column(i).to_data(), "{}", f.name());
        }
        // Nothing to map: the same batch.
        let plain = batch.project(&[3, 4]).unwrap();
        assert_eq!(
            to_parquet(&plain, &parquet_schema(&plain.schema())).unwrap(),
            plain
        );
    }
}
