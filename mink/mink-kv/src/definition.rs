//! A primary-key table's definition: keys, merge engine, delete behaviour and changelog image,
//! with the option names and rules of Apache Fluss. Every rule is checked at create time and a
//! broken one is named in the error.

use std::collections::{BTreeMap, BTreeSet};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::{KvResult, invalid};

pub const MERGE_ENGINE: &str = "table.merge-engine";
pub const VERSION_COLUMN: &str = "table.merge-engine.versioned.ver-column";
pub const DELETE_BEHAVIOR: &str = "table.delete.behavior";
pub const CHANGELOG_IMAGE: &str = "table.changelog.image";
pub const AUTO_INCREMENT: &str = "auto-increment.fields";
pub const AUTO_INCREMENT_CACHE: &str = "table.auto-increment.cache-size";
/// Columns of the changelog view; user columns may not use these names.
pub const RESERVED_COLUMNS: [&str; 3] = ["_change_type", "_log_offset", "_commit_timestamp"];

/// How a write meets the row already stored under its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeEngine {
    /// The last row wins (no `table.merge-engine`); supports partial updates.
    LastRow,
    /// The first row of a key is kept; later ones are ignored.
    FirstRow,
    /// The row with the greater version (column index) wins; an equal version replaces, a null
    /// version is the smallest.
    Versioned { column: usize },
    /// Each non-key column aggregates with its function (index = column; `None` for keys).
    Aggregation { functions: Vec<Option<AggFunction>> },
}

/// Aggregate functions of the aggregation merge engine (`fields.<col>.agg`). All but
/// `LastValue` and `FirstValue` skip nulls: a null side yields the other side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AggFunction {
    Sum,
    Product,
    Max,
    Min,
    /// The newest value, null included.
    LastValue,
    /// The newest non-null value (the default).
    LastValueIgnoreNulls,
    /// The value of the first row written for the key, null included.
    FirstValue,
    /// The first non-null value.
    FirstValueIgnoreNulls,
    /// Strings joined by the delimiter (`fields.<col>.listagg.delimiter`, default `,`).
    ListAgg {
        delimiter: String,
    },
    BoolAnd,
    BoolOr,
}

impl AggFunction {
    fn parse(column: &str, name: &str, options: &BTreeMap<String, String>) -> KvResult<Self> {
        let normalized = name.trim().to_ascii_lowercase().replace('-', "_");
        Ok(match normalized.as_str() {
            "sum" => AggFunction::Sum,
            "product" => AggFunction::Product,
            "max" => AggFunction::Max,
            "min" => AggFunction::Min,
            "last_value" => AggFunction::LastValue,
            "last_value_ignore_nulls" => AggFunction::LastValueIgnoreNulls,
            "first_value" => AggFunction::FirstValue,
            "first_value_ignore_nulls" => AggFunction::FirstValueIgnoreNulls,
            "listagg" | "string_agg" => {
                let key = format!("fields.{column}.{normalized}.delimiter");
                let delimiter = options.get(&key).cloned().unwrap_or_else(|| ",".into());
                if delimiter.is_empty() {
                    return Err(invalid(format!("{key} may not be empty")));
                }
                AggFunction::ListAgg { delimiter }
            }
            "bool_and" => AggFunction::BoolAnd,
            "bool_or" => AggFunction::BoolOr,
            _ => {
                return Err(invalid(format!(
                    "fields.{column}.agg: unknown function {name:?} (sum, product, max, min, \
                     last_value, last_value_ignore_nulls, first_value, first_value_ignore_nulls, \
                     listagg, string_agg, bool_and, bool_or)"
                )));
            }
        })
    }

    fn accepts(&self, t: &DataType) -> bool {
        let numeric = t.is_numeric();
        match self {
            AggFunction::Sum | AggFunction::Product => numeric,
            AggFunction::Max | AggFunction::Min => {
                numeric
                    || matches!(
                        t,
                        DataType::Utf8
                            | DataType::LargeUtf8
                            | DataType::Date32
                            | DataType::Date64
                            | DataType::Time32(_)
                            | DataType::Time64(_)
                            | DataType::Timestamp(_, _)
                    )
            }
            AggFunction::ListAgg { .. } => matches!(t, DataType::Utf8 | DataType::LargeUtf8),
            AggFunction::BoolAnd | AggFunction::BoolOr => *t == DataType::Boolean,
            AggFunction::LastValue
            | AggFunction::LastValueIgnoreNulls
            | AggFunction::FirstValue
            | AggFunction::FirstValueIgnoreNulls => true,
        }
    }
}

/// `table.delete.behavior`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteBehavior {
    Allow,
    /// Deletes are dropped silently.
    Ignore,
    /// A batch with a delete is refused.
    Disable,
}

/// `table.changelog.image`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangelogImage {
    /// Updates emit `update_before` (old row) and `update_after` (new row).
    Full,
    /// Updates emit only `update_after`.
    Wal,
}

/// A primary-key table's keys and write semantics. Column lists are indices into `schema`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvTableDef {
    pub schema: SchemaRef,
    /// In declaration order.
    pub primary_key: Vec<usize>,
    pub partition_keys: Vec<usize>,
    /// The primary key without the partition keys: what a bucket's working copy is keyed by.
    pub physical_key: Vec<usize>,
    /// A subset of the physical key; rows hash to buckets by it.
    pub bucket_key: Vec<usize>,
    pub merge_engine: MergeEngine,
    pub delete_behavior: DeleteBehavior,
    pub changelog_image: ChangelogImage,
    /// The auto-increment column (`auto-increment.fields`): a new key gets the next value of
    /// the table's sequence; an existing key keeps its value; writers never set it.
    pub auto_increment: Option<usize>,
    /// Values a bucket takes from the sequence at a time (`table.auto-increment.cache-size`).
    pub auto_increment_cache: u64,
}

impl KvTableDef {
    /// Marks the primary-key columns and the auto-increment column (named in `options`) NOT
    /// NULL, as Fluss does: neither is ever null in a stored row.
    pub fn normalize_schema(
        schema: &Schema,
        primary_key: &[String],
        options: &BTreeMap<String, String>,
    ) -> Schema {
        let auto = options.get(AUTO_INCREMENT).map(|v| v.trim().to_string());
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| {
                let f = f.as_ref().clone();
                if primary_key.iter().any(|k| k == f.name()) || auto.as_deref() == Some(f.name()) {
                    f.with_nullable(false)
                } else {
                    f
                }
            })
            .collect();
        Schema::new_with_metadata(fields, schema.metadata().clone())
    }

    /// Checks a table definition; the error names the broken rule and the option or column.
    pub fn new(
        schema: SchemaRef,
        primary_key: &[String],
        bucket_key: &[String],
        partition_keys: &[String],
        options: &BTreeMap<String, String>,
    ) -> KvResult<Self> {
        let index = |what: &str, name: &str| {
            schema
                .index_of(name)
                .map_err(|_| invalid(format!("{what} column {name:?} is not in the schema")))
        };
        for f in schema.fields() {
            if RESERVED_COLUMNS.contains(&f.name().as_str()) {
                return Err(invalid(format!(
                    "column name {:?} is reserved for the changelog",
                    f.name()
                )));
            }
            if contains_map(f.data_type()) {
                return Err(invalid(format!(
                    "column {:?}: map columns are not supported in primary-key tables",
                    f.name()
                )));
            }
        }
        if primary_key.is_empty() {
            return Err(invalid("a primary-key table needs at least one key column"));
        }
        let pk = indices(primary_key, "primary key", &index)?;
        for &i in &pk {
            let f = schema.field(i);
            if f.data_type().is_nested() || matches!(f.data_type(), DataType::Dictionary(_, _)) {
                return Err(invalid(format!(
                    "primary key column {:?} has type {}; keys may not be nested or dictionary-encoded",
                    f.name(),
                    f.data_type()
                )));
            }
            if f.is_nullable() {
                return Err(invalid(format!(
                    "primary key column {:?} must be NOT NULL",
                    f.name()
                )));
            }
        }
        let partitions = indices(partition_keys, "partition key", &index)?;
        if let Some(&p) = partitions.iter().find(|p| !pk.contains(p)) {
            return Err(invalid(format!(
                "partition key {:?} must be part of the primary key {primary_key:?}",
                schema.field(p).name()
            )));
        }
        let physical: Vec<usize> = pk
            .iter()
            .copied()
            .filter(|i| !partitions.contains(i))
            .collect();
        if physical.is_empty() {
            return Err(invalid(format!(
                "the primary key {primary_key:?} may not consist of partition keys only"
            )));
        }
        let bucket = if bucket_key.is_empty() {
            physical.clone()
        } else {
            let b = indices(bucket_key, "bucket key", &index)?;
            if let Some(&c) = b.iter().find(|c| !physical.contains(c)) {
                return Err(invalid(format!(
                    "bucket key {:?} must be part of the primary key without partition keys",
                    schema.field(c).name()
                )));
            }
            b
        };

        let merge_engine = match options
            .get(MERGE_ENGINE)
            .map(|v| v.trim().to_ascii_lowercase())
        {
            None => MergeEngine::LastRow,
            Some(v) if v == "first_row" => MergeEngine::FirstRow,
            Some(v) if v == "versioned" => {
                let name = options.get(VERSION_COLUMN).ok_or_else(|| {
                    invalid(format!("the versioned merge engine needs {VERSION_COLUMN}"))
                })?;
                let column = index(VERSION_COLUMN, name)?;
                let t = schema.field(column).data_type();
                if !matches!(
                    t,
                    DataType::Int32 | DataType::Int64 | DataType::Timestamp(_, _)
                ) {
                    return Err(invalid(format!(
                        "{VERSION_COLUMN}: column {name:?} has type {t}; INT, BIGINT or TIMESTAMP expected"
                    )));
                }
                MergeEngine::Versioned { column }
            }
            Some(v) if v == "aggregation" => {
                let mut functions = vec![None; schema.fields().len()];
                for (i, f) in schema.fields().iter().enumerate() {
                    if pk.contains(&i) {
                        continue;
                    }
                    let function = match options.get(&format!("fields.{}.agg", f.name())) {
                        None => AggFunction::LastValueIgnoreNulls,
                        Some(name) => AggFunction::parse(f.name(), name, options)?,
                    };
                    if !function.accepts(f.data_type()) {
                        let key = format!("fields.{}.agg", f.name());
                        return Err(invalid(format!(
                            "{key}: {} does not apply to type {}",
                            options.get(&key).map_or("", |v| v.trim()),
                            f.data_type()
                        )));
                    }
                    functions[i] = Some(function);
                }
                MergeEngine::Aggregation { functions }
            }
            Some(v) => {
                return Err(invalid(format!(
                    "{MERGE_ENGINE}: unknown engine {v:?} (first_row, versioned or aggregation; \
                     leave it unset for last-row-wins)"
                )));
            }
        };
        // Per-field options name real, non-key columns and need the aggregation engine.
        for key in options.keys().filter(|k| k.starts_with("fields.")) {
            let column = key["fields.".len()..].split('.').next().unwrap_or_default();
            let i = index(key, column)?;
            if pk.contains(&i) {
                return Err(invalid(format!(
                    "{key}: primary key column {column:?} is not aggregated"
                )));
            }
            if !matches!(merge_engine, MergeEngine::Aggregation { .. }) {
                return Err(invalid(format!(
                    "{key} needs {MERGE_ENGINE} = 'aggregation'"
                )));
            }
        }
        if options.contains_key(VERSION_COLUMN)
            && !matches!(merge_engine, MergeEngine::Versioned { .. })
        {
            return Err(invalid(format!(
                "{VERSION_COLUMN} needs {MERGE_ENGINE} = 'versioned'"
            )));
        }

        let delete_behavior = match options
            .get(DELETE_BEHAVIOR)
            .map(|v| v.trim().to_ascii_lowercase())
        {
            None if merge_engine == MergeEngine::LastRow => DeleteBehavior::Allow,
            None => DeleteBehavior::Ignore,
            Some(v) if v == "allow" => DeleteBehavior::Allow,
            Some(v) if v == "ignore" => DeleteBehavior::Ignore,
            Some(v) if v == "disable" => DeleteBehavior::Disable,
            Some(v) => {
                return Err(invalid(format!(
                    "{DELETE_BEHAVIOR}: {v:?} is not one of allow, ignore, disable"
                )));
            }
        };
        if delete_behavior == DeleteBehavior::Allow
            && matches!(
                merge_engine,
                MergeEngine::FirstRow | MergeEngine::Versioned { .. }
            )
        {
            return Err(invalid(format!(
                "{DELETE_BEHAVIOR}: the {} merge engine does not support deletes; set it to \
                 'ignore' or 'disable'",
                options.get(MERGE_ENGINE).map_or("", String::as_str)
            )));
        }
        let changelog_image = match options
            .get(CHANGELOG_IMAGE)
            .map(|v| v.trim().to_ascii_uppercase())
        {
            None => ChangelogImage::Full,
            Some(v) if v == "FULL" => ChangelogImage::Full,
            Some(v) if v == "WAL" => ChangelogImage::Wal,
            Some(v) => {
                return Err(invalid(format!(
                    "{CHANGELOG_IMAGE}: {v:?} is not FULL or WAL"
                )));
            }
        };
        if changelog_image == ChangelogImage::Wal
            && matches!(merge_engine, MergeEngine::Aggregation { .. })
        {
            return Err(invalid(format!(
                "{CHANGELOG_IMAGE}: the aggregation merge engine needs FULL, not WAL"
            )));
        }
        let auto_increment = match options.get(AUTO_INCREMENT).map(|v| v.trim()) {
            None | Some("") => None,
            Some(v) if v.contains(',') => {
                return Err(invalid(format!(
                    "{AUTO_INCREMENT}: a table has at most one auto-increment column, not {v:?}"
                )));
            }
            Some(v) => {
                let c = index(AUTO_INCREMENT, v)?;
                if pk.contains(&c) {
                    return Err(invalid(format!(
                        "{AUTO_INCREMENT}: {v:?} is a primary key column; keys are written, not generated"
                    )));
                }
                let t = schema.field(c).data_type();
                if !matches!(t, DataType::Int32 | DataType::Int64) {
                    return Err(invalid(format!(
                        "{AUTO_INCREMENT}: column {v:?} has type {t}; INT or BIGINT expected"
                    )));
                }
                if matches!(merge_engine, MergeEngine::Aggregation { .. }) {
                    return Err(invalid(format!(
                        "{AUTO_INCREMENT} cannot be combined with the aggregation merge engine"
                    )));
                }
                Some(c)
            }
        };
        let auto_increment_cache = match options.get(AUTO_INCREMENT_CACHE) {
            None => 100_000,
            Some(v) => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=10_000_000).contains(n))
                .ok_or_else(|| {
                    invalid(format!(
                        "{AUTO_INCREMENT_CACHE}: {v:?} is not a count from 1 to 10000000"
                    ))
                })?,
        };
        Ok(KvTableDef {
            schema,
            primary_key: pk,
            partition_keys: partitions,
            physical_key: physical,
            bucket_key: bucket,
            merge_engine,
            delete_behavior,
            changelog_image,
            auto_increment,
            auto_increment_cache,
        })
    }

    /// The schema a write is checked against: the auto-increment column may be null (writers
    /// leave it out; the merge fills it).
    pub fn write_schema(&self) -> SchemaRef {
        match self.auto_increment {
            None => self.schema.clone(),
            Some(c) => {
                let mut fields: Vec<Field> = self
                    .schema
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone())
                    .collect();
                fields[c] = fields[c].clone().with_nullable(true);
                std::sync::Arc::new(Schema::new_with_metadata(
                    fields,
                    self.schema.metadata().clone(),
                ))
            }
        }
    }

    /// Whether partial updates are possible: the default and aggregation engines, and every
    /// non-key column nullable (a column a writer does not set is null in a new row).
    pub fn check_partial_update(&self, targets: &[usize]) -> KvResult<()> {
        if matches!(
            self.merge_engine,
            MergeEngine::FirstRow | MergeEngine::Versioned { .. }
        ) {
            return Err(invalid(
                "partial updates need the default or the aggregation merge engine",
            ));
        }
        if let Some(&k) = self.primary_key.iter().find(|k| !targets.contains(k)) {
            return Err(invalid(format!(
                "a partial update must set every primary key column; {:?} is missing",
                self.schema.field(k).name()
            )));
        }
        if let Some(f) = self.schema.fields().iter().enumerate().find(|(i, f)| {
            !self.primary_key.contains(i) && self.auto_increment != Some(*i) && !f.is_nullable()
        }) {
            return Err(invalid(format!(
                "partial updates need every non-key column nullable; {:?} is NOT NULL",
                f.1.name()
            )));
        }
        Ok(())
    }

    /// Whether prefix lookups by the bucket key are possible: the bucket key is a proper
    /// prefix, in order, of the physical primary key.
    pub fn supports_prefix_lookup(&self) -> bool {
        self.bucket_key.len() < self.physical_key.len()
            && self.physical_key.starts_with(&self.bucket_key)
    }
}

/// Refuses a `fields.<column>.*` option that is neither the column's function (`agg`) nor
/// its listagg delimiter: a misspelt key (Paimon's `aggregate-function`, say) would leave the
/// column merging as last-value. Checked when a table is created; tables stored before the
/// check load as they are.
pub fn check_field_options(options: &BTreeMap<String, String>) -> KvResult<()> {
    for key in options.keys().filter(|k| k.starts_with("fields.")) {
        let column = key["fields.".len()..].split('.').next().unwrap_or_default();
        let rest = &key["fields.".len() + column.len()..];
        let function = options
            .get(&format!("fields.{column}.agg"))
            .map(|f| f.trim().to_ascii_lowercase().replace('-', "_"));
        let delimiter = function
            .as_deref()
            .filter(|f| matches!(*f, "listagg" | "string_agg"))
            .map(|f| format!(".{f}.delimiter"));
        if rest != ".agg" && Some(rest) != delimiter.as_deref() {
            return Err(invalid(format!(
                "{key}: unknown option (fields.{column}.agg names the column's function, \
                 fields.{column}.listagg.delimiter its delimiter)"
            )));
        }
    }
    Ok(())
}

fn indices(
    names: &[String],
    what: &str,
    index: &dyn Fn(&str, &str) -> KvResult<usize>,
) -> KvResult<Vec<usize>> {
    let mut seen = BTreeSet::new();
    names
        .iter()
        .map(|n| {
            if !seen.insert(n.as_str()) {
                return Err(invalid(format!("{what} column {n:?} is listed twice")));
            }
            index(what, n)
        })
        .collect()
}

fn contains_map(t: &DataType) -> bool {
    match t {
        DataType::Map(_, _) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _) => contains_map(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| contains_map(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| contains_map(f.data_type())),
        DataType::Dictionary(_, v) => contains_map(v),
        DataType::RunEndEncoded(_, v) => contains_map(v.data_type()),
        _ => false,
    }
}
