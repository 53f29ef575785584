//! Every merge engine and writer mode against a row-at-a-time model: the changelog (types and
//! images, in order), the state after each write, and the state rebuilt by replaying the
//! changelog alone (after-images overwrite; no merge re-runs).

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap
)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use mink_kv::changelog::{self, ChangeType};
use mink_kv::merge::{AutoIds, KvWrite, merge};
use mink_kv::rows::RowCodec;
use mink_kv::{KvError, KvTableDef};
use proptest::prelude::*;

/// Columns: 0 id (key), 1 v, 2 s, 3 ver, 4 b.
fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("ver", DataType::Int64, true),
        Field::new("b", DataType::Boolean, true),
    ]))
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Cell {
    I(i64),
    S(String),
    B(bool),
}

type Row = Vec<Option<Cell>>;

#[derive(Clone, Debug)]
struct Op {
    row: Row,
    delete: bool,
}

#[derive(Clone, Debug)]
struct Config {
    engine: &'static str,
    /// Aggregate function of v, s, ver, b.
    agg: [&'static str; 4],
    delete: &'static str,
    image: &'static str,
    partial: Option<Vec<usize>>,
}

impl Config {
    fn options(&self) -> BTreeMap<String, String> {
        let mut o = BTreeMap::new();
        match self.engine {
            "last_row" => {}
            "versioned" => {
                o.insert("table.merge-engine".into(), "versioned".into());
                o.insert(
                    "table.merge-engine.versioned.ver-column".into(),
                    "ver".into(),
                );
            }
            e => {
                o.insert("table.merge-engine".into(), e.into());
            }
        }
        if self.engine == "aggregation" {
            for (name, f) in ["v", "s", "ver", "b"].iter().zip(self.agg) {
                o.insert(format!("fields.{name}.agg"), f.into());
            }
            if self.agg[1] == "listagg" {
                o.insert("fields.s.listagg.delimiter".into(), "|".into());
            }
        }
        o.insert("table.delete.behavior".into(), self.delete.into());
        o.insert("table.changelog.image".into(), self.image.into());
        o
    }

    fn targeted(&self, c: usize) -> bool {
        self.partial.as_ref().is_none_or(|t| t.contains(&c))
    }
}

fn agg(f: &str, old: Option<&Cell>, new: Option<&Cell>, exists: bool) -> Option<Cell> {
    let skip = |combine: &dyn Fn(&Cell, &Cell) -> Cell| match (old, new) {
        (Some(a), Some(b)) => Some(combine(a, b)),
        (a, b) => a.or(b).cloned(),
    };
    match f {
        "sum" => skip(&|a, b| match (a, b) {
            (Cell::I(a), Cell::I(b)) => Cell::I(a + b),
            _ => unreachable!(),
        }),
        "product" => skip(&|a, b| match (a, b) {
            (Cell::I(a), Cell::I(b)) => Cell::I(a * b),
            _ => unreachable!(),
        }),
        "max" => skip(&|a, b| a.max(b).clone()),
        "min" => skip(&|a, b| a.min(b).clone()),
        "last_value" => new.cloned(),
        "last_value_ignore_nulls" => new.or(old).cloned(),
        "first_value" => {
            if exists {
                old.cloned()
            } else {
                new.cloned()
            }
        }
        "first_value_ignore_nulls" => old.or(new).cloned(),
        "listagg" => skip(&|a, b| match (a, b) {
            (Cell::S(a), Cell::S(b)) => Cell::S(format!("{a}|{b}")),
            _ => unreachable!(),
        }),
        "bool_and" => skip(&|a, b| match (a, b) {
            (Cell::B(a), Cell::B(b)) => Cell::B(*a && *b),
            _ => unreachable!(),
        }),
        "bool_or" => skip(&|a, b| match (a, b) {
            (Cell::B(a), Cell::B(b)) => Cell::B(*a || *b),
            _ => unreachable!(),
        }),
        f => panic!("{f}"),
    }
}

fn key(row: &Row) -> i64 {
    match row[0] {
        Some(Cell::I(k)) => k,
        _ => unreachable!(),
    }
}

/// One row, one key at a time.
fn model_apply(
    cfg: &Config,
    state: &mut BTreeMap<i64, Row>,
    op: &Op,
    out: &mut Vec<(ChangeType, Row)>,
) {
    let k = key(&op.row);
    let old = state.get(&k).cloned();
    let full = cfg.image == "FULL";
    let mut update = |state: &mut BTreeMap<i64, Row>, old: Row, after: Row| {
        if full {
            out.push((ChangeType::UpdateBefore, old));
        }
        out.push((ChangeType::UpdateAfter, after.clone()));
        state.insert(k, after);
    };
    if op.delete {
        let Some(old) = old else { return };
        if cfg.delete != "allow" {
            return;
        }
        // A partial delete naming no non-key column deletes like a full one; one whose
        // named columns are null already changes nothing.
        match cfg.partial.as_ref().filter(|t| t.iter().any(|&c| c > 0)) {
            None => {
                out.push((ChangeType::Delete, old));
                state.remove(&k);
            }
            Some(_) => {
                let rest_null = (1..5)
                    .filter(|&c| !cfg.targeted(c))
                    .all(|c| old[c].is_none());
                let named_null = (1..5)
                    .filter(|&c| cfg.targeted(c))
                    .all(|c| old[c].is_none());
                if named_null && !rest_null {
                    return;
                }
                if rest_null {
                    out.push((ChangeType::Delete, old));
                    state.remove(&k);
                } else {
                    let nulled: Row = (0..5)
                        .map(|c| {
                            if c > 0 && cfg.targeted(c) {
                                None
                            } else {
                                old[c].clone()
                            }
                        })
                        .collect();
                    update(state, old, nulled);
                }
            }
        }
        return;
    }
    let only_keys = cfg.partial.as_ref().is_some_and(|t| t == &[0]);
    let after: Row = match cfg.engine {
        "first_row" if old.is_some() => return,
        "versioned" => {
            if let Some(o) = &old {
                let older = match (&op.row[3], &o[3]) {
                    (None, Some(_)) => true,
                    (Some(a), Some(b)) => a < b,
                    _ => false,
                };
                if older {
                    return;
                }
            }
            op.row.clone()
        }
        "aggregation" => (0..5)
            .map(|c| {
                let prev = old.as_ref().and_then(|o| o[c].as_ref());
                if c == 0 {
                    op.row[0].clone()
                } else if !cfg.targeted(c) {
                    prev.cloned()
                } else {
                    agg(cfg.agg[c - 1], prev, op.row[c].as_ref(), old.is_some())
                }
            })
            .collect(),
        _ => (0..5)
            .map(|c| {
                if cfg.targeted(c) {
                    op.row[c].clone()
                } else {
                    old.as_ref().and_then(|o| o[c].clone())
                }
            })
            .collect(),
    };
    match old {
        Some(_) if only_keys => {}
        Some(old) => update(state, old, after),
        None => {
            out.push((ChangeType::Insert, after.clone()));
            state.insert(k, after);
        }
    }
}

fn to_batch(rows: &[Row]) -> RecordBatch {
    let int = |c: usize| {
        Arc::new(Int64Array::from(
            rows.iter()
                .map(|r| match &r[c] {
                    Some(Cell::I(v)) => Some(*v),
                    _ => None,
                })
                .collect::<Vec<_>>(),
        )) as ArrayRef
    };
    let s = Arc::new(StringArray::from(
        rows.iter()
            .map(|r| match &r[2] {
                Some(Cell::S(v)) => Some(v.clone()),
                _ => None,
            })
            .collect::<Vec<_>>(),
    )) as ArrayRef;
    let b = Arc::new(BooleanArray::from(
        rows.iter()
            .map(|r| match &r[4] {
                Some(Cell::B(v)) => Some(*v),
                _ => None,
            })
            .collect::<Vec<_>>(),
    )) as ArrayRef;
    RecordBatch::try_new(schema(), vec![int(0), int(1), s, int(3), b]).unwrap()
}

fn from_columns(columns: &[ArrayRef]) -> Vec<Row> {
    let n = columns[0].len();
    (0..n)
        .map(|i| {
            let int = |c: usize| {
                let a = columns[c].as_primitive::<Int64Type>();
                a.is_valid(i).then(|| Cell::I(a.value(i)))
            };
            let s = columns[2].as_string::<i32>();
            let b = columns[4].as_boolean();
            vec![
                int(0),
                int(1),
                s.is_valid(i).then(|| Cell::S(s.value(i).to_string())),
                int(3),
                b.is_valid(i).then(|| Cell::B(b.value(i))),
            ]
        })
        .collect()
}

fn cell(kind: u8, v: i64) -> impl Strategy<Value = Option<Cell>> {
    prop_oneof![
        1 => Just(None),
        4 => Just(Some(match kind {
            b'i' => Cell::I(v),
            b's' => Cell::S(format!("x{v}")),
            _ => Cell::B(v % 2 == 0),
        })),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    (
        0i64..5,
        -3i64..4,
        0i64..3,
        -2i64..3,
        0i64..2,
        prop::bool::weighted(0.2),
    )
        .prop_flat_map(|(id, v, s, ver, b, delete)| {
            (cell(b'i', v), cell(b's', s), cell(b'i', ver), cell(b'b', b)).prop_map(
                move |(v, s, ver, b)| Op {
                    row: vec![Some(Cell::I(id)), v, s, ver, b],
                    delete,
                },
            )
        })
}

fn config() -> impl Strategy<Value = Config> {
    let engine = prop::sample::select(vec!["last_row", "first_row", "versioned", "aggregation"]);
    let agg_v = prop::sample::select(vec![
        "sum",
        "product",
        "max",
        "min",
        "last_value",
        "last_value_ignore_nulls",
        "first_value",
        "first_value_ignore_nulls",
    ]);
    let agg_s = prop::sample::select(vec!["listagg", "max", "min", "last_value", "first_value"]);
    let agg_ver = prop::sample::select(vec!["sum", "max", "first_value_ignore_nulls"]);
    let agg_b = prop::sample::select(vec!["bool_and", "bool_or", "last_value"]);
    let delete = prop::sample::select(vec!["allow", "ignore", "disable"]);
    let image = prop::sample::select(vec!["FULL", "WAL"]);
    (engine, agg_v, agg_s, agg_ver, agg_b, delete, image).prop_map(
        |(engine, v, s, ver, b, delete, image)| {
            let merges = matches!(engine, "first_row" | "versioned");
            Config {
                engine,
                agg: [v, s, ver, b],
                // Deletes cannot be allowed with these engines (checked below too).
                delete: if merges && delete == "allow" {
                    "ignore"
                } else {
                    delete
                },
                image: if engine == "aggregation" {
                    "FULL"
                } else {
                    image
                },
                partial: None,
            }
        },
    )
}

/// A write: the columns it sets (all when `None`; the key is always among them) and its rows.
type Write = (Option<Vec<usize>>, Vec<Op>);

/// Writes mixing full and partial ones (partial only where the engine supports them).
fn writes() -> impl Strategy<Value = Vec<Write>> {
    let targets =
        prop::option::weighted(0.4, prop::sample::subsequence(vec![1usize, 2, 3, 4], 0..=4))
            .prop_map(|t| {
                t.map(|mut t| {
                    t.insert(0, 0);
                    t
                })
            });
    prop::collection::vec((targets, prop::collection::vec(op(), 1..10)), 1..8)
}

fn run(cfg: &Config, writes: &[Write]) -> Result<(), TestCaseError> {
    let partial_ok = !matches!(cfg.engine, "first_row" | "versioned");
    let def = KvTableDef::new(schema(), &["id".into()], &[], &[], &cfg.options())
        .map_err(|e| TestCaseError::fail(format!("{cfg:?}: {e}")))?;
    let codec = RowCodec::new(&def).unwrap();
    let storage = changelog::storage_schema(&def.schema);
    let mut model: BTreeMap<i64, Row> = BTreeMap::new();
    let mut store: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut replayed: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for (targets, ops) in writes {
        let cfg = &Config {
            partial: targets.clone().filter(|_| partial_ok),
            ..cfg.clone()
        };
        let rows: Vec<Row> = ops.iter().map(|o| o.row.clone()).collect();
        let write = KvWrite {
            batch: to_batch(&rows),
            deletes: Some(BooleanArray::from(
                ops.iter().map(|o| o.delete).collect::<Vec<_>>(),
            )),
            targets: cfg.partial.clone(),
        };
        let result = merge(
            &def,
            &codec,
            &write,
            &mut |keys: &[&[u8]]| Ok(keys.iter().map(|k| store.get(*k).cloned()).collect()),
            &mut AutoIds::default(),
        );
        if cfg.delete == "disable" && ops.iter().any(|o| o.delete) {
            prop_assert!(
                matches!(result, Err(KvError::DeletionDisabled)),
                "{result:?}"
            );
            continue;
        }
        let merged = result.map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut expected = Vec::new();
        for o in ops {
            model_apply(cfg, &mut model, o, &mut expected);
        }
        let got: Vec<(ChangeType, Row)> = match &merged.changelog {
            None => Vec::new(),
            Some((columns, types)) => types
                .iter()
                .map(|t| ChangeType::from_i8(*t).unwrap())
                .zip(from_columns(columns))
                .collect(),
        };
        prop_assert_eq!(&got, &expected, "changelog of {:?}", ops);
        for (k, v) in &merged.puts {
            match v {
                Some(v) => store.insert(k.clone(), v.clone()),
                None => store.remove(k),
            };
        }
        if let Some(stored) = changelog_batch(&storage, &merged) {
            for (k, v) in changelog::key_changes(&codec, &stored).unwrap() {
                match v {
                    Some(v) => replayed.insert(k, v),
                    None => replayed.remove(&k),
                };
            }
        }
        prop_assert_eq!(&replayed, &store, "replay of the changelog gives the state");
    }
    let mut values: Vec<&Vec<u8>> = store.values().collect();
    values.sort();
    let mut rows = if values.is_empty() {
        Vec::new()
    } else {
        from_columns(&codec.decode(values.iter().map(|v| v.as_slice())).unwrap())
    };
    rows.sort_by_key(key);
    let want: Vec<Row> = model.into_values().collect();
    prop_assert_eq!(rows, want);
    Ok(())
}

fn changelog_batch(storage: &SchemaRef, merged: &mink_kv::Merged) -> Option<RecordBatch> {
    mink_kv::merge::changelog_batch(storage, merged, 1).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn merges_match_the_row_at_a_time_model(
        cfg in config(),
        writes in writes(),
    ) {
        run(&cfg, &writes)?;
    }
}

#[test]
fn definitions_follow_flusss_rules_and_name_what_is_wrong() {
    let opts = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let def = |pk: &[&str], bucket: &[&str], partitions: &[&str], o: &[(&str, &str)]| {
        let pk: Vec<String> = pk.iter().map(|s| s.to_string()).collect();
        let schema = KvTableDef::normalize_schema(&schema(), &pk, &opts(o));
        KvTableDef::new(
            Arc::new(schema),
            &pk,
            &bucket.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            &partitions.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            &opts(o),
        )
    };
    let ok = def(&["id", "s"], &["id"], &[], &[]).unwrap();
    assert!(ok.supports_prefix_lookup());
    assert!(
        !def(&["id"], &[], &[], &[])
            .unwrap()
            .supports_prefix_lookup()
    );
    // Defaults per engine.
    let d = def(&["id"], &[], &[], &[("table.merge-engine", "first_row")]).unwrap();
    assert_eq!(d.delete_behavior, mink_kv::DeleteBehavior::Ignore);
    let d = def(&["id"], &[], &[], &[]).unwrap();
    assert_eq!(d.delete_behavior, mink_kv::DeleteBehavior::Allow);
    assert_eq!(d.changelog_image, mink_kv::ChangelogImage::Full);

    for (pk, bucket, partitions, o, needle) in [
        (
            &["nope"][..],
            &[][..],
            &[][..],
            &[][..],
            "\"nope\" is not in the schema",
        ),
        (&["id", "id"], &[], &[], &[], "listed twice"),
        (&["id"], &["v"], &[], &[], "bucket key \"v\""),
        (
            &["id"],
            &[],
            &["s"],
            &[],
            "partition key \"s\" must be part of the primary key",
        ),
        (&["s"], &[], &["s"], &[], "partition keys only"),
        (&["id", "s"], &["s"], &["s"], &[], "bucket key \"s\""),
        (
            &["id"],
            &[],
            &[],
            &[("table.merge-engine", "newest")],
            "table.merge-engine",
        ),
        (
            &["id"],
            &[],
            &[],
            &[("table.merge-engine", "versioned")],
            "ver-column",
        ),
        (
            &["id"],
            &[],
            &[],
            &[
                ("table.merge-engine", "versioned"),
                ("table.merge-engine.versioned.ver-column", "s"),
            ],
            "INT, BIGINT or TIMESTAMP",
        ),
        (
            &["id"],
            &[],
            &[],
            &[
                ("table.merge-engine", "first_row"),
                ("table.delete.behavior", "allow"),
            ],
            "does not support deletes",
        ),
        (
            &["id"],
            &[],
            &[],
            &[
                ("table.merge-engine", "aggregation"),
                ("table.changelog.image", "WAL"),
            ],
            "needs FULL",
        ),
        (
            &["id"],
            &[],
            &[],
            &[
                ("table.merge-engine", "aggregation"),
                ("fields.s.agg", "sum"),
            ],
            "fields.s.agg",
        ),
        (
            &["id"],
            &[],
            &[],
            &[
                ("table.merge-engine", "aggregation"),
                ("fields.v.agg", "median"),
            ],
            "unknown function",
        ),
        (
            &["id"],
            &[],
            &[],
            &[
                ("table.merge-engine", "aggregation"),
                ("fields.id.agg", "sum"),
            ],
            "primary key column",
        ),
        (
            &["id"],
            &[],
            &[],
            &[("fields.v.agg", "sum")],
            "needs table.merge-engine",
        ),
        (
            &["id"],
            &[],
            &[],
            &[("table.delete.behavior", "maybe")],
            "table.delete.behavior",
        ),
        (
            &["id"],
            &[],
            &[],
            &[("table.changelog.image", "HALF")],
            "table.changelog.image",
        ),
        (
            &["id"],
            &[],
            &[],
            &[("auto-increment.fields", "id")],
            "primary key column",
        ),
        (
            &["id"],
            &[],
            &[],
            &[("auto-increment.fields", "s")],
            "INT or BIGINT",
        ),
        (
            &["id"],
            &[],
            &[],
            &[("auto-increment.fields", "v,ver")],
            "at most one",
        ),
        (
            &["id"],
            &[],
            &[],
            &[
                ("auto-increment.fields", "v"),
                ("table.merge-engine", "aggregation"),
            ],
            "aggregation",
        ),
        (
            &["id"],
            &[],
            &[],
            &[
                ("auto-increment.fields", "v"),
                ("table.auto-increment.cache-size", "0"),
            ],
            "cache-size",
        ),
    ] {
        let e = def(pk, bucket, partitions, o).unwrap_err().to_string();
        assert!(e.contains(needle), "{pk:?} {o:?}: {e}");
    }
    // At create, an unknown fields.<column>.* option is refused; a listagg column's
    // delimiter is its option. (A stored table loads as it is: the check came later.)
    let check = |o: &[(&str, &str)]| {
        mink_kv::definition::check_field_options(
            &o.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    for (o, needle) in [
        (
            &[("fields.v.aggregate-function", "sum")][..],
            "fields.v.aggregate-function: unknown option",
        ),
        (
            &[("fields.v.agg", "sum"), ("fields.v.listagg.delimiter", ";")][..],
            "fields.v.listagg.delimiter: unknown option",
        ),
    ] {
        let e = check(o).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
    check(&[
        ("fields.s.agg", "listagg"),
        ("fields.s.listagg.delimiter", ";"),
    ])
    .unwrap();
    def(
        &["id"],
        &[],
        &[],
        &[
            ("table.merge-engine", "aggregation"),
            ("fields.v.agg", "sum"),
            ("fields.v.listagg.delimiter", ";"),
        ],
    )
    .unwrap();
    // Reserved and unsupported columns.
    let reserved = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("_change_type", DataType::Utf8, true),
    ]);
    let e = KvTableDef::new(
        Arc::new(reserved),
        &["id".into()],
        &[],
        &[],
        &BTreeMap::new(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("reserved"), "{e}");
    let nullable_key =
        KvTableDef::new(schema(), &["v".into()], &[], &[], &BTreeMap::new()).unwrap_err();
    assert!(
        nullable_key.to_string().contains("NOT NULL"),
        "{nullable_key}"
    );
}

#[test]
fn bad_writes_get_precise_errors_and_change_nothing() {
    let def = KvTableDef::new(schema(), &["id".into()], &[], &[], &BTreeMap::new()).unwrap();
    let codec = RowCodec::new(&def).unwrap();
    let mut no_rows = |keys: &[&[u8]]| Ok(vec![None; keys.len()]);
    // A null key.
    let nulls = RecordBatch::try_new(
        Arc::new(Schema::new(
            schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        )),
        to_batch(&[vec![Some(Cell::I(1)), None, None, None, None]])
            .columns()
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    Arc::new(Int64Array::from(vec![None::<i64>])) as ArrayRef
                } else {
                    c.clone()
                }
            })
            .collect(),
    )
    .unwrap();
    let e = merge(
        &def,
        &codec,
        &KvWrite::upsert(nulls),
        &mut no_rows,
        &mut AutoIds::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("\"id\" is not nullable"), "{e}");
    // A partial update that leaves out the key, or names a column that does not exist.
    let batch = to_batch(&[vec![Some(Cell::I(1)), Some(Cell::I(2)), None, None, None]]);
    let mut partial = KvWrite::upsert(batch.clone());
    partial.targets = Some(vec![1]);
    let e = merge(
        &def,
        &codec,
        &partial,
        &mut no_rows,
        &mut AutoIds::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("every primary key column"), "{e}");
    partial.targets = Some(vec![0, 9]);
    let e = merge(
        &def,
        &codec,
        &partial,
        &mut no_rows,
        &mut AutoIds::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("column 9"), "{e}");
    // A partial update on a first_row table; a delete on a `disable` table.
    let first = KvTableDef::new(
        schema(),
        &["id".into()],
        &[],
        &[],
        &[
            ("table.merge-engine".to_string(), "first_row".to_string()),
            ("table.delete.behavior".to_string(), "disable".to_string()),
        ]
        .into(),
    )
    .unwrap();
    partial.targets = Some(vec![0, 1]);
    let e = merge(
        &first,
        &codec,
        &partial,
        &mut no_rows,
        &mut AutoIds::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("partial updates need"), "{e}");
    let e = merge(
        &first,
        &codec,
        &KvWrite::delete(batch),
        &mut no_rows,
        &mut AutoIds::default(),
    )
    .unwrap_err();
    assert!(matches!(e, KvError::DeletionDisabled), "{e}");
    // Wrong schema.
    let other = RecordBatch::try_from_iter(vec![(
        "id",
        Arc::new(Int64Array::from(vec![1])) as ArrayRef,
    )])
    .unwrap();
    let e = merge(
        &def,
        &codec,
        &KvWrite::upsert(other),
        &mut no_rows,
        &mut AutoIds::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("columns"), "{e}");
}

/// Deletes of partial writes: naming no non-key column deletes the row; naming columns that
/// are already null changes nothing; otherwise the named columns are nulled.
#[test]
fn partial_deletes_delete_null_or_change_nothing() {
    let cfg = |_: Vec<usize>| Config {
        engine: "last_row",
        agg: ["sum", "listagg", "sum", "bool_or"],
        delete: "allow",
        image: "FULL",
        partial: None,
    };
    let row = |v: Option<i64>, s: Option<&str>| -> Row {
        vec![
            Some(Cell::I(1)),
            v.map(Cell::I),
            s.map(|s| Cell::S(s.into())),
            None,
            None,
        ]
    };
    let upsert = |r: Row| Op {
        row: r,
        delete: false,
    };
    let delete = |r: Row| Op {
        row: r,
        delete: true,
    };
    for (targets, then) in [
        (vec![0], vec![]),
        (vec![0, 3], vec![]),
        (
            vec![0, 1],
            vec![(ChangeType::UpdateAfter, row(None, Some("x")))],
        ),
    ] {
        let c = cfg(targets.clone());
        let writes = vec![
            (None, vec![upsert(row(Some(5), Some("x")))]),
            (Some(targets.clone()), vec![delete(row(None, None))]),
        ];
        run(&c, &writes).unwrap();
        let mut state = BTreeMap::new();
        let mut out = Vec::new();
        for (t, w) in &writes {
            let c = Config {
                partial: t.clone(),
                ..c.clone()
            };
            for o in w {
                model_apply(&c, &mut state, o, &mut out);
            }
        }
        let last: Vec<_> = out
            .iter()
            .skip(1)
            .filter(|(t, _)| *t != ChangeType::UpdateBefore)
            .cloned()
            .collect();
        match targets.as_slice() {
            [0] => assert!(
                state.is_empty() && last[0].0 == ChangeType::Delete,
                "{out:?}"
            ),
            [0, 3] => assert!(last.is_empty() && state.len() == 1, "{out:?}"),
            _ => assert_eq!(last, then, "{out:?}"),
        }
    }
}

/// Decimal arithmetic widens its type; aggregates keep the column's, and refuse overflow.
#[test]
fn decimal_sums_keep_the_column_type_and_refuse_overflow() {
    use arrow::array::Decimal128Array;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("amount", DataType::Decimal128(5, 2), true),
    ]));
    let options: BTreeMap<String, String> = [
        ("table.merge-engine".to_string(), "aggregation".to_string()),
        ("fields.amount.agg".to_string(), "sum".to_string()),
    ]
    .into();
    let def = KvTableDef::new(schema.clone(), &["id".into()], &[], &[], &options).unwrap();
    let codec = RowCodec::new(&def).unwrap();
    let batch = |cents: i128| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1])) as ArrayRef,
                Arc::new(
                    Decimal128Array::from(vec![cents])
                        .with_precision_and_scale(5, 2)
                        .unwrap(),
                ),
            ],
        )
        .unwrap()
    };
    let mut store: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let write = |cents: i128, store: &mut HashMap<Vec<u8>, Vec<u8>>| {
        let merged = merge(
            &def,
            &codec,
            &KvWrite::upsert(batch(cents)),
            &mut |keys: &[&[u8]]| Ok(keys.iter().map(|k| store.get(*k).cloned()).collect()),
            &mut AutoIds::default(),
        )?;
        for (k, v) in merged.puts {
            store.insert(k, v.unwrap());
        }
        Ok::<_, KvError>(())
    };
    write(12_345, &mut store).unwrap();
    write(50_000, &mut store).unwrap();
    let row = codec.decode(store.values().map(Vec::as_slice)).unwrap();
    assert_eq!(row[1].data_type(), &DataType::Decimal128(5, 2));
    assert_eq!(
        row[1]
            .as_any()
            .downcast_ref::<Decimal128Array>()
            .unwrap()
            .value(0),
        62_345
    );
    let e = write(50_000, &mut store).unwrap_err();
    assert!(e.to_string().contains("sum aggregate"), "{e}");
}
