//! A read's filter as an Iceberg predicate: how the lake prunes files and row groups with it.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Int64Type};
use mink_log::filter::{Bound, BoundFilter, CmpOp};

/// The filter as an Iceberg predicate over a lake table of schema `lake`, for pruning its
/// files and row groups (Iceberg also drops the rows it rejects): the predicates the lake
/// can test, `__bucket` and `__offset` included; `None` when there are none. Predicates
/// on columns the lake lacks, or of types it cannot compare, are left out, so every row
/// that meets the whole filter meets the predicate.
pub fn to_iceberg(
    filter: &BoundFilter,
    lake: &iceberg::spec::Schema,
) -> Option<iceberg::expr::Predicate> {
    use iceberg::expr::Reference;
    let mut all: Option<iceberg::expr::Predicate> = None;
    for p in filter.predicates() {
        let Some(field) = lake.field_by_name(&p.column) else {
            continue;
        };
        let datum = |v: &ArrayRef| datum(v, &field.field_type);
        let r = Reference::new(p.column.clone());
        let predicate = match &p.op {
            Bound::Cmp(op, value) => {
                let Some(d) = datum(value) else { continue };
                // Arrow orders NaN above every number, Iceberg's file metrics leave it out: a
                // range on a floating-point column would keep NaN rows in the log and prune
                // them from the lake. Mink tests those itself.
                let float = matches!(
                    field.field_type.as_ref(),
                    iceberg::spec::Type::Primitive(
                        iceberg::spec::PrimitiveType::Float | iceberg::spec::PrimitiveType::Double
                    )
                );
                if float && !matches!(op, CmpOp::Eq | CmpOp::NotEq) {
                    continue;
                }
                match op {
                    CmpOp::Eq => r.equal_to(d),
                    CmpOp::NotEq => r.not_equal_to(d),
                    CmpOp::Lt => r.less_than(d),
                    CmpOp::LtEq => r.less_than_or_equal_to(d),
                    CmpOp::Gt => r.greater_than(d),
                    CmpOp::GtEq => r.greater_than_or_equal_to(d),
                }
            }
            Bound::In(values) => {
                // A null in the list matches nothing: left out; any other value the
                // lake cannot take leaves the whole predicate out.
                let data: Option<Vec<_>> =
                    values.iter().filter(|v| v.is_valid(0)).map(datum).collect();
                match data {
                    Some(d) if !d.is_empty() => r.is_in(d),
                    _ => continue,
                }
            }
            Bound::IsNull(true) => r.is_null(),
            Bound::IsNull(false) => r.is_not_null(),
        };
        all = Some(match all {
            None => predicate,
            Some(a) => a.and(predicate),
        });
    }
    all
}

/// A read's filter as the lake prunes with it ([`to_iceberg`]).
#[derive(Debug)]
pub struct LakePrune<'a>(pub &'a BoundFilter);

impl mink_lake::Prune for LakePrune<'_> {
    fn predicate(&self, lake: &iceberg::spec::Schema) -> Option<iceberg::expr::Predicate> {
        to_iceberg(self.0, lake)
    }
}

/// A one-row literal as an Iceberg datum of `lake` type (cast to the type's Arrow type);
/// `None` for a null, a type the conversion does not cover, or a value that does not fit.
fn datum(value: &ArrayRef, lake: &iceberg::spec::Type) -> Option<iceberg::spec::Datum> {
    use arrow::datatypes::{
        Date32Type, Float32Type, Float64Type, Int32Type, TimeUnit, TimestampMicrosecondType,
    };
    use iceberg::spec::{Datum as D, PrimitiveType as P, Type};
    if !value.is_valid(0) {
        return None;
    }
    let Type::Primitive(primitive) = lake else {
        return None;
    };
    let target = iceberg::arrow::type_to_arrow_type(lake).ok()?;
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let v = cast_with_options(value, &target, &options).ok()?;
    Some(match (primitive, target) {
        (P::Boolean, _) => D::bool(v.as_boolean().value(0)),
        (P::Int, _) => D::int(v.as_primitive::<Int32Type>().value(0)),
        (P::Long, _) => D::long(v.as_primitive::<Int64Type>().value(0)),
        (P::Float, _) => D::float(v.as_primitive::<Float32Type>().value(0)),
        (P::Double, _) => D::double(v.as_primitive::<Float64Type>().value(0)),
        (P::String, DataType::Utf8) => D::string(v.as_string::<i32>().value(0)),
        (P::String, DataType::LargeUtf8) => D::string(v.as_string::<i64>().value(0)),
        (P::Date, _) => D::date(v.as_primitive::<Date32Type>().value(0)),
        (P::Timestamp, DataType::Timestamp(TimeUnit::Microsecond, _)) => {
            D::timestamp_micros(v.as_primitive::<TimestampMicrosecondType>().value(0))
        }
        (P::Timestamptz, DataType::Timestamp(TimeUnit::Microsecond, _)) => {
            D::timestamptz_micros(v.as_primitive::<TimestampMicrosecondType>().value(0))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Schema};
    use mink_log::filter::{BUCKET, Filter};
    use serde_json::json;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("day", DataType::Date32, true),
        ])
    }

    #[test]
    fn the_lake_prunes_with_what_it_can_compare() {
        let lake = mink_lake::table::lake_schema(&schema()).unwrap();
        let f = serde_json::from_value::<Filter>(json!([
            {"column": "id", "op": ">", "value": 2},
            {"column": "name", "op": "in", "values": ["a", null]},
            {"column": "__bucket", "op": "=", "value": 1}
        ]))
        .unwrap()
        .bind(&schema(), &[BUCKET])
        .unwrap();
        let p = to_iceberg(&f, &lake).unwrap().to_string();
        assert!(p.contains("id > 2"), "{p}");
        assert!(p.contains("name IN"), "{p}");
        assert!(p.contains("__bucket = 1"), "{p}");
        assert!(to_iceberg(&BoundFilter::default(), &lake).is_none());
        // Ranges on floating-point columns are not pushed (NaN orders differently there).
        let floats = Schema::new(vec![Field::new("f", DataType::Float64, true)]);
        let lake = mink_lake::table::lake_schema(&floats).unwrap();
        let range =
            serde_json::from_value::<Filter>(json!([{"column": "f", "op": ">", "value": 1.0}]))
                .unwrap()
                .bind(&floats, &[])
                .unwrap();
        assert!(to_iceberg(&range, &lake).is_none());
    }
}
