//! Rows written out as files for other tools.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::error::ArrowError;

/// `t` with `f` applied to it and to every type nested in it, innermost first: the types of
/// list items, struct fields and map entries are mapped before the type that holds them.
/// Shared by the places that write rows where some Arrow types have no name (Parquet files,
/// the Iceberg lake, Flight SQL streams).
pub fn map_types(t: &DataType, f: &impl Fn(DataType) -> DataType) -> DataType {
    let field = |x: &Arc<Field>| {
        Arc::new(
            x.as_ref()
                .clone()
                .with_data_type(map_types(x.data_type(), f)),
        )
    };
    f(match t {
        DataType::List(x) => DataType::List(field(x)),
        DataType::LargeList(x) => DataType::LargeList(field(x)),
        DataType::FixedSizeList(x, n) => DataType::FixedSizeList(field(x), *n),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(field).collect()),
        DataType::Map(x, sorted) => DataType::Map(field(x), *sorted),
        other => other.clone(),
    })
}

/// `schema` with each column's type mapped by [`map_types`].
pub fn map_schema(schema: &Schema, f: &impl Fn(DataType) -> DataType) -> Schema {
    Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|c| {
                c.as_ref()
                    .clone()
                    .with_data_type(map_types(c.data_type(), f))
            })
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    )
}

/// The type a column of type `t` is written as in Parquet, so that readers without Arrow's
/// embedded schema (DuckDB, Spark, Polars' native reader) see a timestamp, time or date:
/// Parquet has no second unit and no millisecond date, and Arrow's Parquet writer stores those
/// as bare integers. Seconds widen to milliseconds and `Date64` (whole days in milliseconds)
/// becomes `Date32`, each exact; nested types are mapped inside.
pub fn parquet_type(t: &DataType) -> DataType {
    map_types(t, &|t| match t {
        DataType::Timestamp(TimeUnit::Second, tz) => DataType::Timestamp(TimeUnit::Millisecond, tz),
        DataType::Time32(TimeUnit::Second) => DataType::Time32(TimeUnit::Millisecond),
        DataType::Date64 => DataType::Date32,
        other => other,
    })
}

/// `schema` with each column's type as [`parquet_type`] maps it.
pub fn parquet_schema(schema: &Schema) -> SchemaRef {
    Arc::new(map_schema(schema, &|t| parquet_type(&t)))
}

/// The type a column of type `t` is written as in CSV and JSON lines: durations as integer
/// counts of their unit, which `mink produce` reads back (Arrow's text form of a duration,
/// `PT1.5S`, is read by nothing); nested ones too.
pub fn text_type(t: &DataType) -> DataType {
    map_types(t, &|t| match t {
        DataType::Duration(_) => DataType::Int64,
        other => other,
    })
}

/// `schema` with each column's type as [`text_type`] maps it.
pub fn text_schema(schema: &Schema) -> SchemaRef {
    Arc::new(map_schema(schema, &|t| text_type(&t)))
}

/// `batch` cast to `schema` (its [`parquet_schema`] or [`text_schema`]); the batch itself when
/// nothing changes.
pub fn cast_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
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

/// `batch` as CSV and JSON lines write it: each column's type as [`text_type`] maps it.
pub fn text_batch(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    cast_batch(batch, &text_schema(&batch.schema()))
}

/// Rows of `batch` as JSON lines, as `mink scan -f json` writes them: durations as counts
/// ([`text_type`]), and every null written (so a map entry whose value is null is kept).
pub fn json_lines(batch: &RecordBatch, out: &mut Vec<u8>) -> Result<(), ArrowError> {
    let batch = text_batch(batch)?;
    let mut w = json_writer(out);
    w.write(&batch)?;
    w.finish()
}

/// Arrow's JSON lines writer as Mink writes rows: every null written, and a float's NaN and
/// infinities as the strings `"NaN"`, `"inf"` and `"-inf"` ([`NonFiniteAsText`]).
pub fn json_writer<W: std::io::Write>(
    out: W,
) -> arrow::json::Writer<W, arrow::json::writer::LineDelimited> {
    json_writer_builder()
        .with_explicit_nulls(true)
        .build::<_, arrow::json::writer::LineDelimited>(out)
}

/// Arrow's JSON writer with a float's NaN and infinities as text ([`NonFiniteAsText`]), nulls
/// left out unless asked for.
pub fn json_writer_builder() -> arrow::json::WriterBuilder {
    arrow::json::WriterBuilder::new().with_encoder_factory(Arc::new(NonFiniteAsText))
}

/// JSON has no NaN or infinity: arrow writes them as `null`, so a row read as JSON (mink scan,
/// a Kafka fetch of a typed topic, mink-connect's sink) and written back changed NaN into a
/// null. They are written as the strings `"NaN"`, `"inf"` and `"-inf"`, which a JSON write of
/// a float column reads back as those values, as CSV writes them; finite values as arrow does.
#[derive(Debug)]
struct NonFiniteAsText;

static PLAIN: std::sync::LazyLock<arrow::json::writer::EncoderOptions> =
    std::sync::LazyLock::new(Default::default);

impl arrow::json::writer::EncoderFactory for NonFiniteAsText {
    fn make_default_encoder<'a>(
        &self,
        field: &'a arrow::datatypes::FieldRef,
        array: &'a dyn arrow::array::Array,
        _: &'a arrow::json::writer::EncoderOptions,
    ) -> Result<Option<arrow::json::writer::NullableEncoder<'a>>, ArrowError> {
        use arrow::array::AsArray as _;
        use arrow::datatypes::{Float16Type, Float32Type, Float64Type};
        let value: Box<dyn Fn(usize) -> f64 + 'a> = match array.data_type() {
            DataType::Float64 => {
                let a = array.as_primitive::<Float64Type>();
                Box::new(move |i| a.value(i))
            }
            DataType::Float32 => {
                let a = array.as_primitive::<Float32Type>();
                Box::new(move |i| f64::from(a.value(i)))
            }
            DataType::Float16 => {
                let a = array.as_primitive::<Float16Type>();
                Box::new(move |i| a.value(i).to_f64())
            }
            _ => return Ok(None),
        };
        // Arrow's own encoder for the finite values (no factory: this one is not asked again).
        let finite = arrow::json::writer::make_encoder(field, array, &PLAIN)?;
        Ok(Some(arrow::json::writer::NullableEncoder::new(
            Box::new(NonFinite { value, finite }),
            array.nulls().cloned(),
        )))
    }
}

struct NonFinite<'a> {
    value: Box<dyn Fn(usize) -> f64 + 'a>,
    finite: arrow::json::writer::NullableEncoder<'a>,
}

impl arrow::json::writer::Encoder for NonFinite<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        let v = (self.value)(idx);
        if v.is_nan() {
            out.extend_from_slice(b"\"NaN\"");
        } else if v.is_infinite() {
            out.extend_from_slice(if v > 0.0 { b"\"inf\"" } else { b"\"-inf\"" });
        } else {
            self.finite.encode(idx, out);
        }
    }
}

#[cfg(test)]
mod tests {
    /// NaN and the infinities are written as text a JSON write reads back (they were null),
    /// finite values and nulls as before, in lists too.
    #[test]
    fn non_finite_floats_survive_json() {
        use arrow::array::{AsArray as _, Float32Array, Float64Array};
        let schema = Arc::new(Schema::new(vec![
            Field::new("f", DataType::Float64, true),
            Field::new("g", DataType::Float32, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Float64Array::from(vec![
                    Some(f64::NAN),
                    Some(f64::INFINITY),
                    Some(f64::NEG_INFINITY),
                    Some(2.5),
                    None,
                ])),
                Arc::new(Float32Array::from(vec![
                    Some(f32::NAN),
                    Some(1.5),
                    None,
                    Some(f32::NEG_INFINITY),
                    Some(1e20),
                ])),
            ],
        )
        .unwrap();
        let mut out = Vec::new();
        json_lines(&batch, &mut out).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert_eq!(
            text,
            "{\"f\":\"NaN\",\"g\":\"NaN\"}\n{\"f\":\"inf\",\"g\":1.5}\n{\"f\":\"-inf\",\"g\":null}\n{\"f\":2.5,\"g\":\"-inf\"}\n{\"f\":null,\"g\":1.0e20}\n"
        );
        let mut decoder = arrow::json::ReaderBuilder::new(Arc::clone(&schema))
            .build_decoder()
            .unwrap();
        decoder.decode(&out).unwrap();
        let back = decoder.flush().unwrap().unwrap();
        let f = back
            .column(0)
            .as_primitive::<arrow::datatypes::Float64Type>();
        assert!(
            f.value(0).is_nan() && f.value(1) == f64::INFINITY && f.value(2) == f64::NEG_INFINITY
        );
        assert_eq!((f.value(3), f.is_null(4)), (2.5, true));
    }

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
        let out = cast_batch(&batch, &out_schema).unwrap();
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
            cast_batch(&plain, &parquet_schema(&plain.schema())).unwrap(),
            plain
        );
    }
}
