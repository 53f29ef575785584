//! Which bucket a row belongs to.
//!
//! A row's bucket is `murmur3_x86_32(key bytes, seed 0) mod bucket_count`, where the key bytes
//! are the bucket-key columns of the row, in the table's `bucket.key` order, each encoded as:
//!
//! | Arrow type | encoding |
//! |---|---|
//! | null (any type) | the byte `0x00` |
//! | signed integers, dates, times, timestamps, durations | `0x01`, then the value as i64, little-endian |
//! | unsigned integers | `0x01`, then the value as u64, little-endian |
//! | floats | `0x01`, then the value as f64 bits, little-endian |
//! | boolean | `0x01`, then `0x00` or `0x01` |
//! | decimal128 | `0x01`, then the i128 value, little-endian |
//! | strings, binary (all widths and views) | `0x01`, the length as u32 little-endian, the bytes |
//!
//! Widening every integer to 64 bits makes the bucket independent of the integer width a
//! client happens to use. Tables without a bucket key place whole batches (round-robin).

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::*;

use crate::{LogError, LogResult};

/// MurmurHash3, x86 32-bit variant.
// The algorithm mixes in the length modulo 2^32.
#[allow(clippy::cast_possible_truncation)]
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, b) in tail.iter().enumerate() {
            k |= u32::from(*b) << (8 * i);
        }
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
    }
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// Appends one row's value of a column to a key's bytes (see the module docs for the encoding).
type Encoder<'a> = Box<dyn Fn(usize, &mut Vec<u8>) + 'a>;

/// The encoder of a column's values, its type resolved once (not per row).
// Value lengths are encoded as u32 by definition (see the module docs).
#[allow(clippy::cast_possible_truncation)]
fn encoder(array: &ArrayRef) -> LogResult<Encoder<'_>> {
    macro_rules! nullable {
        ($value:expr) => {{
            let value = $value;
            Box::new(move |row: usize, out: &mut Vec<u8>| {
                if array.is_null(row) {
                    out.push(0);
                } else {
                    out.push(1);
                    value(row, out);
                }
            })
        }};
    }
    macro_rules! signed {
        ($t:ty) => {{
            let a = array.as_primitive::<$t>();
            nullable!(move |row: usize, out: &mut Vec<u8>| {
                out.extend_from_slice(&i64::from(a.value(row)).to_le_bytes())
            })
        }};
    }
    macro_rules! unsigned {
        ($t:ty) => {{
            let a = array.as_primitive::<$t>();
            nullable!(move |row: usize, out: &mut Vec<u8>| {
                out.extend_from_slice(&u64::from(a.value(row)).to_le_bytes())
            })
        }};
    }
    macro_rules! bytes {
        ($a:expr) => {{
            let a = $a;
            nullable!(move |row: usize, out: &mut Vec<u8>| {
                let v: &[u8] = a.value(row).as_ref();
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            })
        }};
    }
    Ok(match array.data_type() {
        DataType::Int8 => signed!(Int8Type),
        DataType::Int16 => signed!(Int16Type),
        DataType::Int32 => signed!(Int32Type),
        DataType::Int64 => signed!(Int64Type),
        DataType::UInt8 => unsigned!(UInt8Type),
        DataType::UInt16 => unsigned!(UInt16Type),
        DataType::UInt32 => unsigned!(UInt32Type),
        DataType::UInt64 => unsigned!(UInt64Type),
        DataType::Date32 => signed!(Date32Type),
        DataType::Date64 => signed!(Date64Type),
        DataType::Time32(TimeUnit::Second) => signed!(Time32SecondType),
        DataType::Time32(TimeUnit::Millisecond) => signed!(Time32MillisecondType),
        DataType::Time64(TimeUnit::Microsecond) => signed!(Time64MicrosecondType),
        DataType::Time64(TimeUnit::Nanosecond) => signed!(Time64NanosecondType),
        DataType::Timestamp(TimeUnit::Second, _) => signed!(TimestampSecondType),
        DataType::Timestamp(TimeUnit::Millisecond, _) => signed!(TimestampMillisecondType),
        DataType::Timestamp(TimeUnit::Microsecond, _) => signed!(TimestampMicrosecondType),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => signed!(TimestampNanosecondType),
        DataType::Float32 => {
            let a = array.as_primitive::<Float32Type>();
            nullable!(move |row: usize, out: &mut Vec<u8>| {
                out.extend_from_slice(&f64::from(a.value(row)).to_bits().to_le_bytes())
            })
        }
        DataType::Float64 => {
            let a = array.as_primitive::<Float64Type>();
            nullable!(move |row: usize, out: &mut Vec<u8>| {
                out.extend_from_slice(&a.value(row).to_bits().to_le_bytes())
            })
        }
        DataType::Boolean => {
            let a = array.as_boolean();
            nullable!(move |row: usize, out: &mut Vec<u8>| out.push(u8::from(a.value(row))))
        }
        DataType::Decimal128(_, _) => {
            let a = array.as_primitive::<Decimal128Type>();
            nullable!(move |row: usize, out: &mut Vec<u8>| {
                out.extend_from_slice(&a.value(row).to_le_bytes())
            })
        }
        DataType::Utf8 => bytes!(array.as_string::<i32>()),
        DataType::LargeUtf8 => bytes!(array.as_string::<i64>()),
        DataType::Utf8View => bytes!(array.as_string_view()),
        DataType::Binary => bytes!(array.as_binary::<i32>()),
        DataType::LargeBinary => bytes!(array.as_binary::<i64>()),
        DataType::BinaryView => bytes!(array.as_binary_view()),
        other => {
            return Err(LogError::Invalid(format!(
                "a bucket key column cannot be of type {other}"
            )));
        }
    })
}

/// Whether a column of this type can be a bucket (or partition) key.
pub fn check_key_type(data_type: &DataType) -> LogResult<()> {
    let supported = matches!(
        data_type,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Date32
            | DataType::Date64
            | DataType::Time32(TimeUnit::Second | TimeUnit::Millisecond)
            | DataType::Time64(TimeUnit::Microsecond | TimeUnit::Nanosecond)
            | DataType::Timestamp(_, _)
            | DataType::Float32
            | DataType::Float64
            | DataType::Boolean
            | DataType::Decimal128(_, _)
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
    );
    if supported {
        Ok(())
    } else {
        Err(LogError::Invalid(format!(
            "a bucket key column cannot be of type {data_type}"
        )))
    }
}

/// The bucket of each row of a single integer key column, or `None` for another key: the
/// same hash as the general path (a valid byte, then the value as 8 bytes little-endian),
/// computed from the value without a key buffer, and the modulo without a division.
fn integer_buckets(column: &ArrayRef, bucket_count: u32) -> Option<Vec<u32>> {
    fn hash<T: ArrowPrimitiveType>(
        column: &ArrayRef,
        bucket_count: u32,
        widen: impl Fn(T::Native) -> u64,
    ) -> Vec<u32> {
        let a = column.as_primitive::<T>();
        let modulo = FastMod::new(bucket_count);
        let bucket = |v: T::Native| modulo.of(murmur3_valid_u64(widen(v)));
        match a.nulls().filter(|n| n.null_count() > 0) {
            None => a.values().iter().map(|v| bucket(*v)).collect(),
            Some(nulls) => {
                let null = modulo.of(murmur3_32(&[0], 0));
                a.values()
                    .iter()
                    .zip(nulls.iter())
                    .map(|(v, valid)| if valid { bucket(*v) } else { null })
                    .collect()
            }
        }
    }
    let n = bucket_count.max(1);
    // Sign-extended, as the general path encodes signed integers.
    #[allow(clippy::cast_sign_loss)]
    let signed = |v: i64| v as u64;
    Some(match column.data_type() {
        DataType::Int8 => hash::<Int8Type>(column, n, |v| signed(v.into())),
        DataType::Int16 => hash::<Int16Type>(column, n, |v| signed(v.into())),
        DataType::Int32 => hash::<Int32Type>(column, n, |v| signed(v.into())),
        DataType::Date32 => hash::<Date32Type>(column, n, |v| signed(v.into())),
        DataType::Int64 => hash::<Int64Type>(column, n, signed),
        DataType::UInt8 => hash::<UInt8Type>(column, n, u64::from),
        DataType::UInt16 => hash::<UInt16Type>(column, n, u64::from),
        DataType::UInt32 => hash::<UInt32Type>(column, n, u64::from),
        DataType::UInt64 => hash::<UInt64Type>(column, n, |v| v),
        _ => return None,
    })
}

/// [`murmur3_32`] (seed 0) of the 9 bytes `0x01` then `v` little-endian, unrolled: two whole
/// 4-byte blocks and a 1-byte tail.
#[allow(clippy::cast_possible_truncation)]
fn murmur3_valid_u64(v: u64) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mix = |k: u32| k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    let mut h = 0u32;
    for block in [1 | ((v as u32) << 8), (v >> 24) as u32] {
        h ^= mix(block);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    h ^= mix((v >> 56) as u32);
    h ^= 9;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// `x % d` for a fixed `d`, exact for every 32-bit `x`, by multiplication (Lemire, Kaser and
/// Kurz, "Faster remainder by direct computation", 2019): a division costs more than the
/// hash of a row.
struct FastMod {
    m: u64,
    d: u32,
}

impl FastMod {
    fn new(d: u32) -> FastMod {
        FastMod {
            m: (u64::MAX / u64::from(d)).wrapping_add(1),
            d,
        }
    }

    #[allow(clippy::cast_possible_truncation)]
    fn of(&self, x: u32) -> u32 {
        let low = self.m.wrapping_mul(u64::from(x));
        ((u128::from(low) * u128::from(self.d)) >> 64) as u32
    }
}

/// The bucket of each row, given the indices of the bucket-key columns.
pub fn buckets_of(batch: &RecordBatch, key: &[usize], bucket_count: u32) -> LogResult<Vec<u32>> {
    if let [single] = key
        && let Some(buckets) = integer_buckets(batch.column(*single), bucket_count)
    {
        return Ok(buckets);
    }
    let encoders = key
        .iter()
        .map(|&i| encoder(batch.column(i)))
        .collect::<LogResult<Vec<_>>>()?;
    let mut buf = Vec::with_capacity(64);
    Ok((0..batch.num_rows())
        .map(|row| {
            buf.clear();
            for e in &encoders {
                e(row, &mut buf);
            }
            murmur3_32(&buf, 0) % bucket_count.max(1)
        })
        .collect())
}

/// Splits a batch into one batch per bucket (rows keep their relative order).
pub fn split_by_bucket(
    batch: &RecordBatch,
    key: &[usize],
    bucket_count: u32,
) -> LogResult<Vec<(u32, RecordBatch)>> {
    split_rows(batch, buckets_of(batch, key, bucket_count)?)
}

/// Whether a column of this type can be a partition key: values that read well in a name.
pub fn check_partition_key_type(data_type: &DataType) -> LogResult<()> {
    let supported = matches!(
        data_type,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Date32
            | DataType::Boolean
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
    );
    if supported {
        Ok(())
    } else {
        Err(LogError::Invalid(format!(
            "a partition key column cannot be of type {data_type} (use a string, integer, date or boolean)"
        )))
    }
}

/// The partition of each row: the partition-key values (integers in decimal, dates as
/// `YYYY-MM-DD`, booleans as `true`/`false`, strings as they are) joined by `$`, as in Fluss.
/// A null, an empty string, or a value holding `$`, `/` or NUL cannot name a partition.
pub fn partitions_of(batch: &RecordBatch, key: &[usize]) -> LogResult<Vec<String>> {
    let options = arrow::util::display::FormatOptions::default();
    let formatters = key
        .iter()
        .map(|&i| arrow::util::display::ArrayFormatter::try_new(batch.column(i).as_ref(), &options))
        .collect::<Result<Vec<_>, _>>()?;
    let schema = batch.schema();
    (0..batch.num_rows())
        .map(|row| {
            let mut name = String::new();
            for (n, (&i, f)) in key.iter().zip(&formatters).enumerate() {
                let column = schema.field(i).name();
                if batch.column(i).is_null(row) {
                    return Err(LogError::Invalid(format!(
                        "row {row}: partition column {column:?} is null"
                    )));
                }
                let value = f.value(row).to_string();
                if value.is_empty() || value.contains(['$', '/', '\0']) {
                    return Err(LogError::Invalid(format!(
                        "row {row}: partition column {column:?} holds {value:?}, which cannot name a partition (empty, or holds '$', '/' or NUL)"
                    )));
                }
                if n > 0 {
                    name.push('$');
                }
                name.push_str(&value);
            }
            Ok(name)
        })
        .collect()
}

/// The partition-key values a partition name stands for (the inverse of [`partitions_of`]).
pub fn partition_values(
    partition_keys: &[String],
    name: &str,
) -> LogResult<std::collections::BTreeMap<String, String>> {
    let values: Vec<&str> = name.split('$').collect();
    if values.len() != partition_keys.len() || values.iter().any(|v| v.is_empty()) {
        return Err(LogError::Invalid(format!(
            "partition {name:?} does not name one value for each of {partition_keys:?} (joined by '$')"
        )));
    }
    Ok(partition_keys
        .iter()
        .cloned()
        .zip(values.into_iter().map(str::to_string))
        .collect())
}

/// Checks that `name` is how rows name a partition of a table partitioned by the columns
/// `keys`: each value of its column's type, written as [`partitions_of`] writes it. Another
/// spelling (`007` or ` 7` for an integer 7, `2026-1-5` for a date) would be a second partition
/// that no row of that value reaches and no filter on the column can read.
pub fn check_partition_name(keys: &[Field], name: &str) -> LogResult<()> {
    let names: Vec<String> = keys.iter().map(|f| f.name().clone()).collect();
    let values = partition_values(&names, name)?;
    let cast = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let columns = keys
        .iter()
        .map(|f| {
            let text = &values[f.name()];
            let array = arrow::array::StringArray::from(vec![text.as_str()]);
            arrow::compute::cast_with_options(&array, f.data_type(), &cast).map_err(|e| {
                LogError::Invalid(format!(
                    "partition {name:?}: {text:?} is not a value of column {:?} ({}): {e}",
                    f.name(),
                    f.data_type()
                ))
            })
        })
        .collect::<LogResult<Vec<_>>>()?;
    let schema = Schema::new(
        keys.iter()
            .map(|f| f.clone().with_nullable(true))
            .collect::<Vec<_>>(),
    );
    let batch = RecordBatch::try_new(std::sync::Arc::new(schema), columns)?;
    let indices: Vec<usize> = (0..keys.len()).collect();
    let written = partitions_of(&batch, &indices)?.remove(0);
    if written != name {
        return Err(LogError::Invalid(format!(
            "partition {name:?}: rows with these values name their partition {written:?}"
        )));
    }
    Ok(())
}

/// Splits a batch by partition (rows keep their relative order).
pub fn split_by_partition(
    batch: &RecordBatch,
    key: &[usize],
) -> LogResult<Vec<(String, RecordBatch)>> {
    split_rows(batch, partitions_of(batch, key)?)
}

/// One batch per distinct group, in group order; rows keep their relative order.
fn split_rows<K: Ord>(batch: &RecordBatch, groups: Vec<K>) -> LogResult<Vec<(K, RecordBatch)>> {
    let mut rows: std::collections::BTreeMap<K, Vec<u32>> = std::collections::BTreeMap::new();
    for (row, group) in groups.into_iter().enumerate() {
        rows.entry(group)
            .or_default()
            .push(u32::try_from(row).map_err(|_| LogError::Invalid("batch too large".into()))?);
    }
    if rows.len() == 1 {
        let (group, _) = rows.into_iter().next().expect("one group");
        return Ok(vec![(group, batch.clone())]);
    }
    rows.into_iter()
        .map(|(group, indices)| {
            let indices = UInt32Array::from(indices);
            let columns = batch
                .columns()
                .iter()
                .map(|c| take(c.as_ref(), &indices, None))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((group, RecordBatch::try_new(batch.schema(), columns)?))
        })
        .collect()
}
