//! The log tablet's codec, options, routing, and the tablet on a real stream engine.
#![allow(clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::*;
use arrow::datatypes::*;
use mink_log::codec::{self, Compression};
use mink_log::options::TableOptions;
use mink_log::routing::{buckets_of, murmur3_32, split_by_bucket};
use mink_log::{LogError, LogTablet};

/// A batch with the common Arrow types, nested ones included.
fn wide_batch() -> RecordBatch {
    let tags = {
        let mut b = ListBuilder::new(StringBuilder::new());
        b.values().append_value("a");
        b.values().append_value("b");
        b.append(true);
        b.append(false);
        b.values().append_value("c");
        b.append(true);
        b.finish()
    };
    let point = StructArray::from(vec![
        (
            Arc::new(Field::new("x", DataType::Float64, false)),
            Arc::new(Float64Array::from(vec![1.5, 2.5, -0.5])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("y", DataType::Int32, true)),
            Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])) as ArrayRef,
        ),
    ]);
    let attrs = {
        let mut b = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
        b.keys().append_value("k");
        b.values().append_value(7);
        b.append(true).unwrap();
        b.append(true).unwrap();
        b.append(false).unwrap();
        b.finish()
    };
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from(vec![1, 2, 3]))),
        (
            "name",
            Arc::new(StringArray::from(vec![Some("x"), None, Some("z")])),
        ),
        ("ok", Arc::new(BooleanArray::from(vec![true, false, true]))),
        ("small", Arc::new(Int8Array::from(vec![1, -2, 3]))),
        ("u", Arc::new(UInt64Array::from(vec![1, 2, u64::MAX]))),
        ("f", Arc::new(Float32Array::from(vec![0.5, 1.0, f32::NAN]))),
        (
            "day",
            Arc::new(Date32Array::from(vec![19_000, 19_001, 19_002])),
        ),
        (
            "at",
            Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3]).with_timezone("UTC")),
        ),
        (
            "price",
            Arc::new(
                Decimal128Array::from(vec![12345, -1, 0])
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
            ),
        ),
        (
            "blob",
            Arc::new(BinaryArray::from(vec![&b"\x00"[..], b"", b"\xff"])),
        ),
        ("tags", Arc::new(tags)),
        ("point", Arc::new(point)),
        ("attrs", Arc::new(attrs)),
    ];
    RecordBatch::try_from_iter(columns).unwrap()
}

#[test]
fn batches_and_schemas_round_trip_with_and_without_compression() {
    let batch = wide_batch();
    for compression in [Compression::None, Compression::Zstd] {
        let bytes = codec::encode_batch(&batch, compression).unwrap();
        assert_eq!(
            codec::decode_batch(&bytes).unwrap(),
            batch,
            "{compression:?}"
        );
    }
    let schema = codec::encode_schema(&batch.schema()).unwrap();
    assert_eq!(codec::decode_schema(&schema).unwrap(), *batch.schema());
    assert!(matches!(
        codec::decode_schema(b"garbage"),
        Err(LogError::Invalid(_))
    ));
    assert!(codec::decode_batch(b"garbage").is_err());
    let projected = codec::project(&batch, &["point".into(), "id".into()]).unwrap();
    assert_eq!(projected.schema().field(0).name(), "point");
    let e = codec::project(&batch, &["nope".into()])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no column \"nope\" (the columns: id Int64"),
        "{e}"
    );
}

#[test]
fn batches_are_checked_against_the_table_schema() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let ok = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        (
            "name",
            Arc::new(StringArray::from(vec![Some("a")])) as ArrayRef,
        ),
    ])
    .unwrap();
    let stored = codec::check_batch(&schema, &ok).unwrap();
    assert_eq!(stored.schema(), schema);
    let null_id = RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(Int64Array::from(vec![None, Some(2)])) as ArrayRef,
        ),
        (
            "name",
            Arc::new(StringArray::from(vec![Some("a"), None])) as ArrayRef,
        ),
    ])
    .unwrap();
    let e = codec::check_batch(&schema, &null_id)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"id\" is not nullable"), "{e}");
    let wrong_type = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(Int32Array::from(vec![1])) as ArrayRef),
        (
            "name",
            Arc::new(StringArray::from(vec![Some("a")])) as ArrayRef,
        ),
    ])
    .unwrap();
    assert!(
        codec::check_batch(&schema, &wrong_type)
            .unwrap_err()
            .to_string()
            .contains("Int32")
    );
    let one_column = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(vec![1])) as ArrayRef,
    )])
    .unwrap();
    // Named as a user writes the columns, not as Rust debug output.
    let e = codec::check_batch(&schema, &one_column)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the batch has 1 columns, the table 2: expected id Int64, name Utf8"),
        "{e}"
    );
    // Another name, or the columns in another order, said as such (both were "column "ID"
    // of type Int64 does not match the table's "id" of type Int64").
    let renamed = RecordBatch::try_from_iter(vec![
        ("ID", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
        ("name", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
    ])
    .unwrap();
    let e = codec::check_batch(&schema, &renamed)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column 1 is named \"ID\", the table's is \"id\""),
        "{e}"
    );
    let swapped = RecordBatch::try_from_iter(vec![
        ("name", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
        ("id", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
    ])
    .unwrap();
    let e = codec::check_batch(&schema, &swapped)
        .unwrap_err()
        .to_string();
    assert!(e.contains("in another order: name Utf8, id Int64"), "{e}");
}

#[test]
fn murmur3_matches_the_reference_vectors() {
    assert_eq!(murmur3_32(b"", 0), 0);
    assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
    assert_eq!(murmur3_32(b"test", 0), 0xba6b_d213);
    assert_eq!(
        murmur3_32(b"The quick brown fox jumps over the lazy dog", 0),
        0x2e4f_f723
    );
}

/// The bucket of an integer key is the hash of its encoding (a valid byte, the value as 8
/// bytes little-endian; a null is one 0 byte), whatever the integer type.
#[test]
fn integer_keys_hash_their_documented_encoding() {
    let values = [
        Some(0i64),
        Some(-1),
        Some(7),
        None,
        Some(i64::from(i32::MAX)),
        Some(42),
    ];
    let want: Vec<u32> = values
        .iter()
        .map(|v| match v {
            Some(v) => {
                let mut key = vec![1u8];
                key.extend_from_slice(&v.to_le_bytes());
                murmur3_32(&key, 0) % 5
            }
            None => murmur3_32(&[0], 0) % 5,
        })
        .collect();
    let narrow: Vec<Option<i32>> = values.iter().map(|v| v.map(|v| v as i32)).collect();
    for column in [
        Arc::new(Int64Array::from(values.to_vec())) as ArrayRef,
        Arc::new(Int32Array::from(narrow.clone())) as ArrayRef,
        Arc::new(Date32Array::from(narrow)) as ArrayRef,
    ] {
        let batch = RecordBatch::try_from_iter(vec![("k", column)]).unwrap();
        assert_eq!(buckets_of(&batch, &[0], 5).unwrap(), want);
    }
    let unsigned = RecordBatch::try_from_iter(vec![(
        "k",
        Arc::new(UInt64Array::from(vec![u64::MAX, 3])) as ArrayRef,
    )])
    .unwrap();
    let expect = |v: u64| {
        let mut key = vec![1u8];
        key.extend_from_slice(&v.to_le_bytes());
        murmur3_32(&key, 0) % 5
    };
    assert_eq!(
        buckets_of(&unsigned, &[0], 5).unwrap(),
        vec![expect(u64::MAX), expect(3)]
    );

    // The integer path hashes and reduces without the general path's buffer and division:
    // the same buckets for values spread over every byte, and for any bucket count.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let spread: Vec<Option<i64>> = (0..10_000)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (i % 97 != 0).then_some(x as i64)
        })
        .collect();
    let batch = RecordBatch::try_from_iter(vec![(
        "k",
        Arc::new(Int64Array::from(spread.clone())) as ArrayRef,
    )])
    .unwrap();
    for count in [1, 2, 3, 16, 1000, 65_537, u32::MAX] {
        let want: Vec<u32> = spread
            .iter()
            .map(|v| match v {
                Some(v) => {
                    let mut key = vec![1u8];
                    key.extend_from_slice(&v.to_le_bytes());
                    murmur3_32(&key, 0) % count
                }
                None => murmur3_32(&[0], 0) % count,
            })
            .collect();
        assert_eq!(
            buckets_of(&batch, &[0], count).unwrap(),
            want,
            "{count} buckets"
        );
    }
}

#[test]
fn routing_is_independent_of_integer_width_and_keeps_rows() {
    let narrow = RecordBatch::try_from_iter(vec![(
        "k",
        Arc::new(Int16Array::from(vec![1, 2, 3, 4, 5])) as ArrayRef,
    )])
    .unwrap();
    let wide = RecordBatch::try_from_iter(vec![(
        "k",
        Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5])) as ArrayRef,
    )])
    .unwrap();
    assert_eq!(
        buckets_of(&narrow, &[0], 8).unwrap(),
        buckets_of(&wide, &[0], 8).unwrap()
    );
    let batch = wide_batch();
    let key = [batch.schema().index_of("name").unwrap(), 0];
    let parts = split_by_bucket(&batch, &key, 4).unwrap();
    let rows: usize = parts.iter().map(|(_, b)| b.num_rows()).sum();
    assert_eq!(rows, batch.num_rows());
    let expected = buckets_of(&batch, &key, 4).unwrap();
    for (bucket, part) in &parts {
        assert!(*bucket < 4);
        for id in part.column(0).as_primitive::<Int64Type>().values() {
            assert_eq!(expected[usize::try_from(*id - 1).unwrap()], *bucket);
        }
    }
    let nested = batch.schema().index_of("tags").unwrap();
    assert!(
        buckets_of(&batch, &[nested], 4).is_err(),
        "lists are not bucket keys"
    );
}

#[test]
fn options_use_flusss_names_and_reject_bad_values() {
    let opts = |pairs: &[(&str, &str)]| {
        TableOptions::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let d = opts(&[]).unwrap();
    assert_eq!((d.bucket_count, d.compression), (1, Compression::Zstd));
    assert_eq!(d.log_ttl, Some(Duration::from_secs(7 * 86_400)));
    let o = opts(&[
        ("bucket.num", "8"),
        ("bucket.key", "user_id, region"),
        ("table.log.ttl", "36h"),
        ("table.log.arrow.compression.type", "none"),
    ])
    .unwrap();
    assert_eq!(o.bucket_count, 8);
    assert_eq!(o.bucket_key, vec!["user_id", "region"]);
    assert_eq!(o.log_ttl, Some(Duration::from_secs(36 * 3600)));
    assert_eq!(o.compression, Compression::None);
    assert_eq!(opts(&[("table.log.ttl", "-1")]).unwrap().log_ttl, None);
    for (k, v) in [
        ("bucket.num", "0"),
        ("bucket.num", "lots"),
        ("table.log.ttl", "7 fortnights"),
        ("table.log.format", "INDEXED"),
        ("table.log.arrow.compression.type", "LZ5"),
    ] {
        let e = opts(&[(k, v)]).unwrap_err().to_string();
        assert!(e.contains(k), "{k}: {e}");
    }
}

#[tokio::test]
async fn a_tablet_appends_and_reads_with_slicing_and_projection() {
    let meta = Arc::new(
        mink_sql::SqliteStore::connect("sqlite::memory:")
            .await
            .unwrap(),
    );
    let sink = mink_sql::Sink::start(meta, mink_sql::SinkConfig::new(1))
        .await
        .unwrap();
    let engine = s3stream::S3Stream::start(
        sink,
        s3stream::store::open("memory://").unwrap(),
        s3stream::EngineConfig {
            flush_delay: Duration::from_millis(2),
            ..s3stream::EngineConfig::default()
        },
    );
    let stream = engine.create_streams(1).await.unwrap();
    engine.open(stream, 1).await.unwrap();
    let batch = wide_batch();
    let tablet = LogTablet::new(engine.clone(), stream, batch.schema(), Compression::Zstd);
    let a = tablet.append(&batch, None).await.unwrap();
    let b = tablet.append(&batch, None).await.unwrap();
    assert_eq!(
        (a.base_offset, a.end_offset, b.base_offset),
        (0, 3, 3),
        "one offset per row"
    );
    // From the middle of the first batch: the rows before the offset are cut off.
    let read = tablet
        .read(1, 1 << 20, &["id".into(), "name".into()])
        .await
        .unwrap();
    assert_eq!(read[0].base_offset, 1);
    assert_eq!(read[0].batch.num_rows(), 2);
    assert_eq!(read[0].batch.num_columns(), 2);
    assert_eq!(read[1].base_offset, 3);
    assert_eq!(
        read[1].batch,
        codec::project(&batch, &["id".into(), "name".into()]).unwrap()
    );
    // Bad batches change nothing.
    let other = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(vec![1])) as ArrayRef,
    )])
    .unwrap();
    assert!(matches!(
        tablet.append(&other, None).await,
        Err(LogError::Invalid(_))
    ));
    assert_eq!(engine.info(stream).unwrap().end_offset, 6);
    engine.shutdown().await;
}

#[test]
fn rows_split_by_partition_with_fluss_style_names() {
    use mink_log::routing::{check_partition_key_type, partition_values, split_by_partition};
    let batch = RecordBatch::try_from_iter(vec![
        (
            "region",
            Arc::new(StringArray::from(vec!["eu", "us", "eu", "us"])) as ArrayRef,
        ),
        (
            "day",
            Arc::new(Date32Array::from(vec![19000, 19000, 19001, 19000])) as ArrayRef,
        ),
        (
            "v",
            Arc::new(Int64Array::from(vec![1, 2, 3, 4])) as ArrayRef,
        ),
    ])
    .unwrap();
    let parts = split_by_partition(&batch, &[0, 1]).unwrap();
    let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["eu$2022-01-08", "eu$2022-01-09", "us$2022-01-08"]);
    let us = &parts[2].1;
    assert_eq!(us.column(2).as_primitive::<Int64Type>().values(), &[2, 4]);
    let keys = vec!["region".to_string(), "day".to_string()];
    assert_eq!(
        partition_values(&keys, "eu$2022-01-08").unwrap(),
        BTreeMap::from([
            ("region".into(), "eu".into()),
            ("day".into(), "2022-01-08".into())
        ])
    );
    assert!(partition_values(&keys, "eu").is_err());
    // Values that cannot name a partition, and types that cannot be partition keys.
    for bad in [
        vec![Some("a$b")],
        vec![None],
        vec![Some("")],
        vec![Some("x/y")],
    ] {
        let b =
            RecordBatch::try_from_iter(vec![("p", Arc::new(StringArray::from(bad)) as ArrayRef)])
                .unwrap();
        let e = split_by_partition(&b, &[0]).unwrap_err().to_string();
        assert!(e.contains("partition column \"p\""), "{e}");
    }
    assert!(check_partition_key_type(&DataType::Float64).is_err());
    assert!(check_partition_key_type(&DataType::Utf8).is_ok());
}

#[test]
fn a_log_table_schema_only_grows_by_nullable_columns_at_the_end() {
    let old = Schema::new(vec![Field::new("a", DataType::Int64, false)]);
    let grown = Schema::new(vec![
        Field::new("a", DataType::Int64, false),
        Field::new("b", DataType::Utf8, true),
    ]);
    codec::check_evolution(&old, &grown).unwrap();
    for bad in [
        Schema::new(vec![Field::new("a", DataType::Int32, false)]),
        Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Utf8, false),
        ]),
        Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("a", DataType::Utf8, true),
        ]),
        Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
        ]),
        Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("__timestamp", DataType::Utf8, true),
        ]),
        Schema::empty(),
    ] {
        assert!(codec::check_evolution(&old, &bad).is_err(), "{bad}");
    }
    let written = RecordBatch::try_from_iter(vec![(
        "a",
        Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef,
    )])
    .unwrap();
    let read = codec::evolve(&Arc::new(grown), &written).unwrap();
    assert_eq!(read.num_columns(), 2);
    assert_eq!(read.column(1).null_count(), 2);
}

#[test]
fn a_narrow_read_decodes_the_named_columns_in_the_table_schema() {
    let written = RecordBatch::try_from_iter(vec![
        ("a", Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef),
        (
            "s",
            Arc::new(StringArray::from(vec!["x", "y", "z"])) as ArrayRef,
        ),
        ("c", Arc::new(Int64Array::from(vec![7, 8, 9])) as ArrayRef),
    ])
    .unwrap();
    // The table grew a column since the batch was stored.
    let mut fields: Vec<Field> = written
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("late", DataType::Utf8, true));
    let table = Arc::new(Schema::new(fields));
    for compression in [Compression::Zstd, Compression::None] {
        let stored = codec::encode_batch(&written, compression).unwrap();
        let names = |n: &[&str]| n.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        // Named order, not stored order; a repeated name twice; a late column as nulls.
        let read =
            codec::decode_columns(&stored, &table, &names(&["c", "late", "a", "c"])).unwrap();
        assert_eq!(field_names(&read.schema()), ["c", "late", "a", "c"]);
        assert_eq!(read.num_rows(), 3);
        assert_eq!(read.column(0).as_ref(), written.column(2).as_ref());
        assert_eq!(read.column(1).null_count(), 3);
        assert_eq!(read.column(2).as_ref(), written.column(0).as_ref());
        // Only a late column: the row count still comes from the batch.
        let late = codec::decode_columns(&stored, &table, &names(&["late"])).unwrap();
        assert_eq!((late.num_rows(), late.num_columns()), (3, 1));
        // Every column when none are named, as `evolve` gives them.
        let all = codec::decode_columns(&stored, &table, &[]).unwrap();
        assert_eq!(all, codec::evolve(&table, &written).unwrap());
        let e = codec::decode_columns(&stored, &table, &names(&["nope"])).unwrap_err();
        assert!(e.to_string().contains("no column \"nope\""), "{e}");
    }
}

/// An uncompressed stored batch decodes in place: its values point into the stored bytes (a
/// block read from storage) instead of a copy; every type still decodes whole.
#[test]
fn a_stored_batch_decodes_without_copying_its_values() {
    let values = BinaryArray::from_iter_values((0..100).map(|i| vec![i as u8; 1024]));
    let batch = RecordBatch::try_from_iter(vec![("value", Arc::new(values) as ArrayRef)]).unwrap();
    let stored = codec::encode_batch(&batch, Compression::None).unwrap();
    let read = codec::decode_columns(&stored, &batch.schema(), &[]).unwrap();
    assert_eq!(read, batch);
    let at = read.column(0).as_binary::<i32>().values().as_ptr() as usize;
    let range = stored.as_ptr() as usize..stored.as_ptr() as usize + stored.len();
    assert!(
        range.contains(&at),
        "the values were copied out of the stored bytes"
    );
    // Nested types, nulls and compression decode as before, projected or not.
    let wide = wide_batch();
    for compression in [Compression::None, Compression::Zstd] {
        let stored = codec::encode_batch(&wide, compression).unwrap();
        let all = codec::decode_columns(&stored, &wide.schema(), &[]).unwrap();
        assert_eq!(all, wide, "{compression:?}");
        let named =
            codec::decode_columns(&stored, &wide.schema(), &field_names(&wide.schema())).unwrap();
        assert_eq!(named, wide, "{compression:?}");
    }
}

#[test]
fn crafted_ipc_messages_are_refused_before_the_reader_sees_them() {
    let batch = RecordBatch::try_from_iter(vec![(
        "v",
        Arc::new(Int64Array::from_iter_values(0..1000)) as ArrayRef,
    )])
    .unwrap();
    let stored = codec::encode_batch(&batch, Compression::Zstd)
        .unwrap()
        .to_vec();
    assert_eq!(codec::decode_batch(&stored).unwrap(), batch);
    // Walk the stream to the record batch message: [0xffffffff][len][header][body].
    let mut at = 0;
    loop {
        let len = i32::from_le_bytes(stored[at + 4..at + 8].try_into().unwrap()) as usize;
        let header = &stored[at + 8..at + 8 + len];
        let message = arrow::ipc::root_as_message(header).unwrap();
        let body_at = at + 8 + len;
        if let Some(rb) = message.header_as_record_batch() {
            let first = rb
                .buffers()
                .unwrap()
                .iter()
                .find(|b| b.length() > 0)
                .unwrap();
            let prefix = body_at + first.offset() as usize;
            // A compressed buffer claiming a terabyte.
            let mut huge = stored.clone();
            huge[prefix..prefix + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
            let e = codec::decode_batch(&huge).unwrap_err().to_string();
            assert!(e.contains("would decode to"), "{e}");
            // A body cut short (the header still declares the whole body).
            let cut = &stored[..body_at + message.bodyLength() as usize / 2];
            assert!(codec::decode_batch(cut).is_err());
            assert!(codec::check_message(header, &stored[body_at..body_at + 10]).is_err());
            break;
        }
        at = body_at + message.bodyLength() as usize;
    }
}

#[test]
fn a_stored_batch_goes_on_the_wire_as_stored() {
    use arrow::ipc::reader::read_record_batch;
    for compression in [Compression::None, Compression::Zstd] {
        let batch = wide_batch();
        let stored = codec::encode_batch(&batch, compression).unwrap();
        let wire = codec::wire_batch(&stored).expect("one schema and one batch message");
        assert!(
            codec::same_schema_header(&wire.schema_header, &codec::schema_header(&batch.schema())),
            "recognised as written under the current schema"
        );
        // What a Flight reader does with the two messages.
        let message = arrow::ipc::root_as_message(&wire.header).unwrap();
        let decoded = read_record_batch(
            &arrow::buffer::Buffer::from(wire.body.to_vec()),
            message.header_as_record_batch().unwrap(),
            batch.schema(),
            &std::collections::HashMap::new(),
            None,
            &message.version(),
        )
        .unwrap();
        assert_eq!(decoded, batch);
    }
    // Whatever padding the stored message got.
    for n in 1..6 {
        let fields: Vec<Field> = (0..n)
            .map(|i| Field::new(format!("c{i}"), DataType::Int64, false))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let columns: Vec<ArrayRef> = (0..n)
            .map(|_| Arc::new(Int64Array::from(vec![1])) as ArrayRef)
            .collect();
        let b = RecordBatch::try_new(schema.clone(), columns).unwrap();
        let stored = codec::encode_batch(&b, Compression::Zstd).unwrap();
        let wire = codec::wire_batch(&stored).unwrap();
        assert!(codec::same_schema_header(
            &wire.schema_header,
            &codec::schema_header(&schema)
        ));
        let other = Schema::new(vec![Field::new("x", DataType::Utf8, true)]);
        assert!(!codec::same_schema_header(
            &wire.schema_header,
            &codec::schema_header(&other)
        ));
    }
    // A batch with dictionaries is not sent as stored.
    let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
    let with_dict = RecordBatch::try_from_iter(vec![("d", Arc::new(dict) as ArrayRef)]).unwrap();
    let stored = codec::encode_batch(&with_dict, Compression::None).unwrap();
    assert!(codec::wire_batch(&stored).is_none());
    assert!(codec::wire_batch(&bytes::Bytes::from_static(b"\xff\xff\xff\xff\x10")).is_none());
}

/// A batch's IPC messages as a client encodes them (a Flight stream: schema, then batch).
fn received(
    batch: &RecordBatch,
    compression: Option<arrow::ipc::CompressionType>,
) -> codec::IpcBatch {
    use arrow::ipc::writer::{
        CompressionContext, DictionaryTracker, IpcDataGenerator, IpcWriteOptions,
    };
    let options = IpcWriteOptions::default()
        .try_with_compression(compression)
        .unwrap();
    let generator = IpcDataGenerator::default();
    let mut dictionaries = DictionaryTracker::new(false);
    let schema = generator.schema_to_bytes_with_dictionary_tracker(
        &batch.schema(),
        &mut dictionaries,
        &options,
    );
    let (_, data) = generator
        .encode(
            batch,
            &mut dictionaries,
            &options,
            &mut CompressionContext::default(),
        )
        .unwrap();
    codec::IpcBatch {
        schema_header: schema.ipc_message.into(),
        header: data.ipc_message.into(),
        body: data.arrow_data.into(),
    }
}

/// `read_batch` of `ipc` (one message, no dictionaries) under its batch's schema.
fn read_received(ipc: &codec::IpcBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    let message = arrow::ipc::root_as_message(&ipc.header).unwrap();
    codec::read_batch(
        &ipc.body,
        message.header_as_record_batch().unwrap(),
        Arc::clone(schema),
        &std::collections::HashMap::new(),
        &message.version(),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn zstd_batches_decode_through_one_context_and_lying_buffers_are_refused() {
    // Compressible columns (their buffers compressed) beside incompressible ones (sent raw,
    // length -1), views with variadic buffers, and the nested types.
    let n = 4000;
    let long = |i: i64| format!("a value long enough to be kept out of line, number {i}");
    let big = RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(Int64Array::from_iter(
                (0..n).map(|i| (i % 7 != 0).then_some(i)),
            )) as ArrayRef,
        ),
        (
            "noise",
            Arc::new(UInt64Array::from_iter_values(
                (0..n as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)),
            )),
        ),
        (
            "text",
            Arc::new(StringArray::from_iter_values((0..n).map(long))),
        ),
        (
            "view",
            Arc::new(StringViewArray::from_iter_values((0..n).map(long))),
        ),
    ])
    .unwrap();
    for batch in [big, wide_batch()] {
        let schema = batch.schema();
        let ipc = received(&batch, Some(arrow::ipc::CompressionType::ZSTD));
        codec::check_message(&ipc.header, &ipc.body).unwrap();
        // Twice: the second through the thread's context the first created.
        for _ in 0..2 {
            assert_eq!(read_received(&ipc, &schema).unwrap(), batch);
        }
        // Uncompressed batches go through arrow's reader unchanged.
        assert_eq!(
            read_received(&received(&batch, None), &schema).unwrap(),
            batch
        );
    }
    // A compressed buffer whose length prefix lies, or whose frame is cut short: an error,
    // never a panic or a batch of zeros.
    let batch = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
    )])
    .unwrap();
    let schema = batch.schema();
    let ipc = received(&batch, Some(arrow::ipc::CompressionType::ZSTD));
    let (at, len) = {
        let message = arrow::ipc::root_as_message(&ipc.header).unwrap();
        let buffers = message.header_as_record_batch().unwrap().buffers().unwrap();
        let b = buffers.iter().find(|b| b.length() > 8).unwrap();
        (b.offset() as usize, b.length() as usize)
    };
    let declared = i64::from_le_bytes(ipc.body[at..at + 8].try_into().unwrap());
    assert_ne!(declared, -1, "the test needs a compressed buffer");
    let with_body = |body: Vec<u8>| codec::IpcBatch {
        body: body.into(),
        ..ipc.clone()
    };
    for (claim, expected) in [
        (declared + 1, "declared"),
        (declared - 1, "zstd"),
        (i64::MAX, "more than"),
        (-2, "claiming -2 bytes"),
    ] {
        let mut body = ipc.body.to_vec();
        body[at..at + 8].copy_from_slice(&claim.to_le_bytes());
        let e = read_received(&with_body(body), &schema).unwrap_err();
        assert!(e.contains(expected), "claiming {claim}: {e}");
    }
    let mut body = ipc.body.to_vec();
    body[at + 8..at + len].fill(0x5a);
    let e = read_received(&with_body(body), &schema).unwrap_err();
    assert!(e.contains("zstd"), "{e}");
}

#[test]
fn a_received_batch_is_stored_as_received_when_it_matches_the_table() {
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..500)) as ArrayRef,
        ),
        (
            "msg",
            Arc::new(StringArray::from_iter_values(
                (0..500).map(|i| format!("m{i}")),
            )) as ArrayRef,
        ),
    ])
    .unwrap();
    let schema = batch.schema();
    for (compression, sent) in [
        (Compression::Zstd, Some(arrow::ipc::CompressionType::ZSTD)),
        (Compression::None, None),
    ] {
        let ipc = received(&batch, sent);
        let stored =
            codec::stored_as_received(&ipc, &schema, compression).expect("stored as received");
        // Byte for byte what the tablet would have encoded, read back the same, and sent on as
        // stored by reads.
        assert_eq!(stored, codec::encode_batch(&batch, compression).unwrap());
        assert_eq!(codec::decode_batch(&stored).unwrap(), batch);
        assert!(codec::wire_batch(&stored).is_some());
    }
    // Another compression than the table's, or another schema: encoded by the tablet instead.
    let plain = received(&batch, None);
    assert!(codec::stored_as_received(&plain, &schema, Compression::Zstd).is_none());
    let zstd = received(&batch, Some(arrow::ipc::CompressionType::ZSTD));
    assert!(codec::stored_as_received(&zstd, &schema, Compression::None).is_none());
    let other = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("msg", DataType::Utf8, true),
    ]);
    assert!(codec::stored_as_received(&zstd, &other, Compression::Zstd).is_none());
    // Dictionary columns travel in messages of their own: never stored from one message.
    let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
    let with_dict = RecordBatch::try_from_iter(vec![("d", Arc::new(dict) as ArrayRef)]).unwrap();
    let ipc = received(&with_dict, None);
    assert!(codec::stored_as_received(&ipc, &with_dict.schema(), Compression::None).is_none());
}

/// The names of `schema`'s fields, in order.
fn field_names(schema: &Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

/// A JSON row that leaves out a required column, or gives it as null, is refused naming the
/// column (Arrow's own error names a struct child), with the record's index.
#[test]
fn json_rows_missing_a_required_column_name_it() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    for bad in [&b"{\"name\": \"a\"}"[..], b"{\"id\": null}"] {
        let values = [Some(&b"{\"id\": 1}"[..]), Some(bad)];
        let e = mink_log::json::rows(&schema, &values).unwrap_err();
        assert_eq!(e.index, 1);
        assert!(
            e.reason.contains("column \"id\" is not nullable"),
            "{}",
            e.reason
        );
    }
}

/// A number that its column's type would truncate (a fraction into an integer, more decimal
/// places than a decimal's scale) is refused naming the column; an exact one is taken.
#[test]
fn json_rows_take_numbers_exactly_or_not_at_all() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("price", DataType::Decimal128(10, 2), true),
    ]));
    for (bad, column) in [
        (&b"{\"id\": 1.9}"[..], "id"),
        (b"{\"id\": 15e-1}", "id"),
        (b"{\"id\": \"1.5\"}", "id"),
        (b"{\"id\": 1, \"price\": 12.349}", "price"),
        (b"{\"id\": 1, \"price\": \"12.349\"}", "price"),
        (b"{\"id\": 1, \"price\": 1.2345e1}", "price"),
    ] {
        let values = [Some(&b"{\"id\": 1}"[..]), Some(bad)];
        let e = mink_log::json::rows(&schema, &values).unwrap_err();
        assert_eq!(e.index, 1, "{}", String::from_utf8_lossy(bad));
        assert!(
            e.reason.contains(&format!("column {column:?}"))
                && e.reason.contains("not exactly a value of its type"),
            "{}",
            e.reason
        );
    }
    let exact: [Option<&[u8]>; 3] = [
        Some(b"{\"id\": 2.0, \"price\": 12.340}"),
        Some(b"{\"id\": 15e1, \"price\": \"0.5\"}"),
        Some(b"{\"id\": 3, \"price\": 1.25e1}"),
    ];
    let rows = mink_log::json::rows(&schema, &exact).unwrap();
    let ids = rows.column(0).as_primitive::<Int64Type>();
    assert_eq!(ids.values(), &[2, 150, 3]);
    let prices = rows.column(1).as_primitive::<Decimal128Type>();
    assert_eq!(prices.values(), &[1234, 50, 1250]);

    // A number past a narrow float's range was stored as infinity.
    let floats = Arc::new(Schema::new(vec![
        Field::new("f", DataType::Float32, true),
        Field::new("tags", DataType::new_list(DataType::Float32, true), true),
    ]));
    for (bad, column) in [
        (&b"{\"f\": 1e300}"[..], "f"),
        (b"{\"f\": -3.5e38}", "f"),
        (b"{\"tags\": [1.5, 1e39]}", "tags[1]"),
    ] {
        let e = mink_log::json::rows(&floats, &[Some(bad)]).unwrap_err();
        assert!(
            e.reason.contains(&format!("column {column:?}"))
                && e.reason.contains("out of the range"),
            "{}",
            e.reason
        );
    }
    let taken =
        mink_log::json::rows(&floats, &[Some(&b"{\"f\": 3.4e38, \"tags\": [0.1]}"[..])]).unwrap();
    assert!(
        taken
            .column(0)
            .as_primitive::<Float32Type>()
            .value(0)
            .is_finite()
    );
}

/// Numbers inside lists, structs and maps are taken exactly or not at all, as top-level ones
/// are (`[1.5, 2.7]` into a list of integers was stored as `[1, 2]`).
#[test]
fn json_rows_take_nested_numbers_exactly_or_not_at_all() {
    let item = Arc::new(Field::new("item", DataType::Int32, true));
    let entries = Arc::new(Field::new(
        "entries",
        DataType::Struct(
            vec![
                Field::new("keys", DataType::Utf8, false),
                Field::new("values", DataType::Int64, true),
            ]
            .into(),
        ),
        false,
    ));
    let schema = Arc::new(Schema::new(vec![
        Field::new("lst", DataType::List(Arc::clone(&item)), true),
        Field::new(
            "st",
            DataType::Struct(vec![Field::new("a", DataType::Int64, true)].into()),
            true,
        ),
        Field::new("mp", DataType::Map(entries, false), true),
    ]));
    for (bad, path) in [
        (&b"{\"lst\": [1, 2.7]}"[..], "lst[1]"),
        (b"{\"st\": {\"a\": 1.9}}", "st.a"),
        (b"{\"mp\": {\"k\": 1.5}}", "mp[\"k\"]"),
    ] {
        let e = mink_log::json::rows(&schema, &[Some(bad)]).unwrap_err();
        assert!(
            e.reason.contains(&format!("column {path:?}")),
            "{}: {}",
            String::from_utf8_lossy(bad),
            e.reason
        );
    }
    let rows = mink_log::json::rows(
        &schema,
        &[Some(
            &b"{\"lst\": [1, 2.0], \"st\": {\"a\": 3}, \"mp\": {\"k\": 4}}"[..],
        )],
    )
    .unwrap();
    assert_eq!(rows.num_rows(), 1);
}
