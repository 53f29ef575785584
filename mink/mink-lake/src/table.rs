//! A Mink table's Iceberg table: its schema (the table's columns, then `__bucket`,
//! `__offset`, `__timestamp`), its partitioning (identity on the Mink table's partition
//! keys), and the check an existing Iceberg table passes before it is attached instead.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, TimeUnit};
use iceberg::arrow::arrow_schema_to_schema_auto_assign_ids;
use iceberg::spec::{
    NestedField, NestedFieldRef, PrimitiveType, Schema, Transform, Type, UnboundPartitionSpec,
};

use crate::{LakeError, LakeResult};

/// The bucket a lake row came from (Iceberg `int`).
pub const BUCKET_COLUMN: &str = "__bucket";
/// The row's offset in its bucket's log (Iceberg `long`).
pub const OFFSET_COLUMN: &str = "__offset";
/// When the row was appended to the log (Iceberg `timestamptz`, microseconds).
pub const TIMESTAMP_COLUMN: &str = "__timestamp";

/// The system columns, in the order they follow the table's columns.
pub fn system_columns() -> [(&'static str, PrimitiveType); 3] {
    [
        (BUCKET_COLUMN, PrimitiveType::Int),
        (OFFSET_COLUMN, PrimitiveType::Long),
        (TIMESTAMP_COLUMN, PrimitiveType::Timestamptz),
    ]
}

/// The Arrow type a column of type `t` is stored as in the lake. Iceberg holds times and
/// timestamps in microseconds, dates in days, and no durations: seconds and milliseconds widen
/// to microseconds, `Date64` (whole days in milliseconds) becomes a date, and a duration its
/// count of the column's unit (`long`). Each is exact both ways: tiering casts to the lake's
/// types and reads cast back.
pub fn lake_type(t: &DataType) -> DataType {
    mink_log::export::map_types(t, &|t| match t {
        DataType::Timestamp(TimeUnit::Second | TimeUnit::Millisecond, tz) => {
            DataType::Timestamp(TimeUnit::Microsecond, tz)
        }
        DataType::Time32(_) => DataType::Time64(TimeUnit::Microsecond),
        DataType::Date64 => DataType::Date32,
        DataType::Duration(_) => DataType::Int64,
        other => other,
    })
}

/// `field` with its type as the lake stores it ([`lake_type`]).
fn lake_field(field: &Field) -> Field {
    field.clone().with_data_type(lake_type(field.data_type()))
}

/// The Iceberg type of one Mink column (field ids inside nested types are placeholders).
pub(crate) fn column_type(field: &Field) -> LakeResult<NestedFieldRef> {
    // Iceberg has no fixed-size list: a lake table took one, then failed every tiering round
    // (the batch's list matched no Iceberg list), and its log was never trimmed.
    let fixed = std::cell::Cell::new(false);
    // Iceberg's `timestamptz` is UTC: an instant shown in another zone has no Iceberg type.
    let zone = std::cell::RefCell::new(None);
    mink_log::export::map_types(field.data_type(), &|t| {
        fixed.set(fixed.get() || matches!(t, DataType::FixedSizeList(..)));
        if let DataType::Timestamp(_, Some(z)) = &t
            && !matches!(z.as_ref(), "UTC" | "+00:00")
        {
            zone.replace(Some(z.to_string()));
        }
        t
    });
    if fixed.get() {
        return Err(LakeError::Incompatible {
            column: field.name().clone(),
            reason: format!(
                "{} holds a fixed-size list, which Iceberg has no type for: use a List",
                field.data_type()
            ),
        });
    }
    if let Some(zone) = zone.into_inner() {
        return Err(LakeError::Incompatible {
            column: field.name().clone(),
            reason: format!(
                "{} has no Iceberg type: its time zone is {zone}, and Iceberg's timestamptz is \
                 UTC only (a zone \"UTC\" keeps the same instants)",
                field.data_type()
            ),
        });
    }
    let one = ArrowSchema::new(vec![lake_field(field)]);
    let converted =
        arrow_schema_to_schema_auto_assign_ids(&one).map_err(|e| LakeError::Incompatible {
            column: field.name().clone(),
            reason: format!("{} has no Iceberg type ({e})", field.data_type()),
        })?;
    let column = Arc::clone(&converted.as_struct().fields()[0]);
    // Nanosecond timestamps are Iceberg format v3; Mink's lake tables are v2, which pyiceberg
    // and DuckDB read.
    if has_nanoseconds(&column.field_type) {
        return Err(LakeError::Incompatible {
            column: field.name().clone(),
            reason: format!(
                "{} has nanosecond precision, which Iceberg format v2 cannot hold: use microseconds (TIMESTAMP or TIMESTAMP(6) in SQL, Timestamp(µs) in Arrow)",
                field.data_type()
            ),
        });
    }
    Ok(column)
}

/// Whether `t` is or holds a nanosecond timestamp.
fn has_nanoseconds(t: &Type) -> bool {
    match t {
        Type::Primitive(p) => {
            matches!(p, PrimitiveType::TimestampNs | PrimitiveType::TimestamptzNs)
        }
        Type::Struct(s) => s.fields().iter().any(|f| has_nanoseconds(&f.field_type)),
        Type::List(l) => has_nanoseconds(&l.element_field.field_type),
        Type::Map(m) => {
            has_nanoseconds(&m.key_field.field_type) || has_nanoseconds(&m.value_field.field_type)
        }
    }
}

/// The Iceberg schema of a Mink table's lake: `columns` (with the Iceberg types of their Arrow
/// types), then the system columns, all required but the nullable columns.
pub fn lake_schema(columns: &ArrowSchema) -> LakeResult<Schema> {
    for field in columns.fields() {
        if system_columns().iter().any(|(n, _)| n == field.name()) {
            return Err(LakeError::Incompatible {
                column: field.name().clone(),
                reason: "the name is reserved for the lake's system columns".into(),
            });
        }
        column_type(field)?;
    }
    let stored = ArrowSchema::new(
        columns
            .fields()
            .iter()
            .map(|f| lake_field(f))
            .collect::<Vec<_>>(),
    );
    let user = arrow_schema_to_schema_auto_assign_ids(&stored)
        .map_err(|e| LakeError::Iceberg(e.to_string()))?;
    let mut fields: Vec<NestedFieldRef> = user.as_struct().fields().to_vec();
    for (id, (name, t)) in (user.highest_field_id() + 1..).zip(system_columns()) {
        fields.push(Arc::new(NestedField::required(
            id,
            name,
            Type::Primitive(t),
        )));
    }
    Schema::builder()
        .with_fields(fields)
        .build()
        .map_err(|e| LakeError::Iceberg(e.to_string()))
}

/// `schema` with `primary_key`'s columns as its identifier fields (none for a log table). Iceberg
/// takes only required primitive columns other than floats as identifiers: a key with another
/// column (a float) is left without them.
pub fn with_identifier_fields(schema: Schema, primary_key: &[String]) -> LakeResult<Schema> {
    use iceberg::spec::PrimitiveType as P;
    let ids: Option<Vec<i32>> = primary_key
        .iter()
        .map(|c| {
            let f = schema.field_by_name(c)?;
            let fits = f.required
                && matches!(&*f.field_type, Type::Primitive(p) if !matches!(p, P::Float | P::Double));
            fits.then_some(f.id)
        })
        .collect();
    match ids {
        Some(ids) if !ids.is_empty() => schema
            .into_builder()
            .with_identifier_field_ids(ids)
            .build()
            .map_err(|e| LakeError::Iceberg(e.to_string())),
        _ => Ok(schema),
    }
}

/// Identity partitioning on `partition_keys` (columns of `schema`), as the Mink table's.
pub fn lake_partition_spec(
    schema: &Schema,
    partition_keys: &[String],
) -> LakeResult<UnboundPartitionSpec> {
    let mut spec = UnboundPartitionSpec::builder();
    for key in partition_keys {
        let field = schema
            .field_by_name(key)
            .ok_or_else(|| LakeError::Incompatible {
                column: key.clone(),
                reason: "the partition key is not a column of the lake table".into(),
            })?;
        spec = spec
            .add_partition_field(field.id, key, Transform::Identity)
            .map_err(|e| LakeError::Iceberg(e.to_string()))?;
    }
    Ok(spec.build())
}

/// Whether two Iceberg types are the same, field ids aside.
pub(crate) fn same_type(a: &Type, b: &Type) -> bool {
    let same_field = |x: &NestedFieldRef, y: &NestedFieldRef| {
        x.name == y.name && x.required == y.required && same_type(&x.field_type, &y.field_type)
    };
    match (a, b) {
        (Type::Primitive(x), Type::Primitive(y)) => x == y,
        (Type::Struct(x), Type::Struct(y)) => {
            x.fields().len() == y.fields().len()
                && x.fields()
                    .iter()
                    .zip(y.fields())
                    .all(|(x, y)| same_field(x, y))
        }
        (Type::List(x), Type::List(y)) => same_field(&x.element_field, &y.element_field),
        (Type::Map(x), Type::Map(y)) => {
            same_field(&x.key_field, &y.key_field) && same_field(&x.value_field, &y.value_field)
        }
        _ => false,
    }
}

/// Whether an existing Iceberg table can be a Mink table's lake: every Mink column is there
/// with the same Iceberg type (and optional if the Mink column is nullable), and so are the
/// system columns. Columns only the Iceberg table has are allowed if optional (tiering leaves
/// them null). The error names the first column that does not fit.
pub fn check_compatible(existing: &Schema, columns: &ArrowSchema) -> LakeResult<()> {
    let incompatible = |column: &str, reason: String| LakeError::Incompatible {
        column: column.to_string(),
        reason,
    };
    for field in columns.fields() {
        let want = column_type(field)?;
        let Some(have) = existing.field_by_name(field.name()) else {
            return Err(incompatible(
                field.name(),
                "missing from the Iceberg table".into(),
            ));
        };
        if !same_type(&want.field_type, &have.field_type) {
            return Err(incompatible(
                field.name(),
                format!(
                    "the Iceberg table has {}, the Mink table needs {}",
                    have.field_type, want.field_type
                ),
            ));
        }
        if have.required && field.is_nullable() {
            return Err(incompatible(
                field.name(),
                "required in the Iceberg table, nullable in the Mink table".into(),
            ));
        }
    }
    for (name, t) in system_columns() {
        match existing.field_by_name(name) {
            Some(f) if *f.field_type == Type::Primitive(t.clone()) => {}
            Some(f) => {
                return Err(incompatible(
                    name,
                    format!("the Iceberg table has {}, the lake needs {t}", f.field_type),
                ));
            }
            None => return Err(incompatible(name, "missing from the Iceberg table".into())),
        }
    }
    for f in existing.as_struct().fields() {
        let known = columns.field_with_name(&f.name).is_ok()
            || system_columns().iter().any(|(n, _)| *n == f.name);
        if !known && f.required {
            return Err(incompatible(
                &f.name,
                "required in the Iceberg table but not a column of the Mink table".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, TimeUnit};

    use super::*;

    /// A nanosecond timestamp, alone or nested, is refused by name; microseconds are Iceberg's
    /// `timestamp` and `timestamptz`.
    #[test]
    fn fixed_size_lists_are_refused() {
        let list =
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 2);
        for (name, t) in [
            ("v", list.clone()),
            (
                "s",
                DataType::Struct(vec![Field::new("v", list, true)].into()),
            ),
        ] {
            refused(name, t, "fixed-size list");
        }
    }

    /// Types Iceberg has no type for are refused naming the column (tables.md lists them).
    #[test]
    fn types_without_an_iceberg_type_are_refused() {
        for (name, t) in [("u", DataType::UInt64), ("d", DataType::Decimal256(50, 5))] {
            refused(name, t, "has no Iceberg type");
        }
        // A zone other than UTC, in milliseconds too (named as the column has it), or nested.
        let berlin = |unit| DataType::Timestamp(unit, Some("Europe/Berlin".into()));
        for (name, t) in [
            ("at", berlin(TimeUnit::Millisecond)),
            (
                "ats",
                DataType::List(Arc::new(Field::new(
                    "item",
                    berlin(TimeUnit::Microsecond),
                    true,
                ))),
            ),
        ] {
            refused(
                name,
                t.clone(),
                "its time zone is Europe/Berlin, and Iceberg's timestamptz is UTC only",
            );
        }
        refused(
            "at",
            berlin(TimeUnit::Millisecond),
            "Timestamp(ms, \"Europe/Berlin\")",
        );
    }

    /// A lake of an id and column `name` of type `t` is refused naming the column, `why`.
    fn refused(name: &str, t: DataType, why: &str) {
        let columns = ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(name, t, true),
        ]);
        match lake_schema(&columns) {
            Err(LakeError::Incompatible { column, reason }) => {
                assert_eq!(column, name);
                assert!(reason.contains(why), "{reason}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn nanosecond_timestamps_are_refused() {
        let ns = DataType::Timestamp(TimeUnit::Nanosecond, None);
        for (name, t) in [
            ("at", ns.clone()),
            (
                "at_utc",
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            ),
            (
                "ats",
                DataType::List(Arc::new(Field::new("item", ns, true))),
            ),
        ] {
            refused(name, t, "use microseconds");
        }
        let columns = ArrowSchema::new(vec![
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new(
                "at_utc",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]);
        let schema = lake_schema(&columns).unwrap();
        assert_eq!(
            *schema.field_by_name("at").unwrap().field_type,
            Type::Primitive(PrimitiveType::Timestamp)
        );
        assert_eq!(
            *schema.field_by_name("at_utc").unwrap().field_type,
            Type::Primitive(PrimitiveType::Timestamptz)
        );
    }
}
