//! The merge of a write batch into the rows already stored: the changelog and the new state
//! of every key the batch touches.
//!
//! Vectorised by rounds: round `r` holds the `r`-th row of each key in the batch, so the keys
//! of a round are distinct and each round is a handful of Arrow kernels over its rows; the
//! previous image of a key is the stored row or the after-image of an earlier round. Images are
//! referred to as (source, row) and only gathered (`interleave`) when needed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, GenericStringArray, GenericStringBuilder,
    OffsetSizeTrait, RecordBatch, new_null_array,
};
use arrow::compute::kernels::{boolean, cmp, numeric, zip::zip};
use arrow::compute::{interleave, is_null, take};
use arrow::datatypes::{DataType, SchemaRef, UInt32Type};

use crate::changelog::{self, ChangeType};
use crate::definition::{AggFunction, ChangelogImage, DeleteBehavior, KvTableDef, MergeEngine};
use crate::rows::RowCodec;
use crate::{KeyChange, KvError, KvResult, invalid};

/// What a row of a write does to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    Upsert,
    Delete,
}

/// A batch written to a primary-key table.
#[derive(Clone, Debug)]
pub struct KvWrite {
    /// Rows of the table's schema; in a partial update the columns not set are ignored.
    pub batch: RecordBatch,
    /// `true` marks a delete (all rows upsert when absent).
    pub deletes: Option<BooleanArray>,
    /// A partial update: the columns the writer sets (every key column among them).
    pub targets: Option<Vec<usize>>,
}

impl KvWrite {
    pub fn upsert(batch: RecordBatch) -> Self {
        KvWrite {
            batch,
            deletes: None,
            targets: None,
        }
    }

    pub fn delete(batch: RecordBatch) -> Self {
        let deletes = BooleanArray::from(vec![true; batch.num_rows()]);
        KvWrite {
            batch,
            deletes: Some(deletes),
            targets: None,
        }
    }

    fn is_delete(&self, row: usize) -> bool {
        self.deletes
            .as_ref()
            .is_some_and(|d| d.is_valid(row) && d.value(row))
    }
}

/// Values for the auto-increment column: `[next, end)` taken from the table's sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutoIds {
    pub next: i64,
    pub end: i64,
}

impl AutoIds {
    pub fn remaining(&self) -> u64 {
        u64::try_from(self.end - self.next).unwrap_or(0)
    }

    fn take(&mut self, n: usize) -> KvResult<Vec<i64>> {
        if (n as u64) > self.remaining() {
            return Err(KvError::Store(format!(
                "{n} auto-increment values needed, {} at hand",
                self.remaining()
            )));
        }
        let ids = (self.next..).take(n).collect();
        self.next += i64::try_from(n).unwrap_or(i64::MAX);
        Ok(ids)
    }
}

/// The outcome of a merge.
#[derive(Debug, Default)]
pub struct Merged {
    /// Table columns and change types of the changelog, in the order of the write's rows.
    pub changelog: Option<(Vec<ArrayRef>, Vec<i8>)>,
    /// The new state of each key the write changed: the encoded after-image, `None` when
    /// deleted. In first-touch order.
    pub puts: Vec<KeyChange>,
}

impl Merged {
    pub fn is_empty(&self) -> bool {
        self.changelog.is_none()
    }

    pub fn changelog_rows(&self) -> usize {
        self.changelog.as_ref().map_or(0, |(_, t)| t.len())
    }
}

/// Answers the stored (encoded) row of each key asked, in order.
pub type StoredRows<'a> = dyn FnMut(&[&[u8]]) -> KvResult<Vec<Option<Vec<u8>>>> + 'a;

/// A row image: `(source, row)`.
type Image = (usize, usize);

/// Source 0 is one row of nulls (the image of an absent key), 1 the stored rows, 2 the write.
const NULLS: usize = 0;
const STORED: usize = 1;
const INPUT: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Ignore,
    Insert,
    Update,
    Delete,
}

/// Merges `write` against the rows stored under its keys. `current` answers the stored
/// (encoded) row of each distinct key, in the order asked. Nothing is changed here: the caller
/// appends the changelog and applies `puts` once it is durable.
pub fn merge(
    def: &KvTableDef,
    codec: &RowCodec,
    write: &KvWrite,
    current: &mut StoredRows<'_>,
    auto_ids: &mut AutoIds,
) -> KvResult<Merged> {
    let batch = mink_log::codec::check_batch(&def.write_schema(), &write.batch)?;
    if let Some(c) = def.auto_increment {
        let name = def.schema.field(c).name();
        if batch.column(c).null_count() < batch.num_rows()
            || write.targets.as_ref().is_some_and(|t| t.contains(&c))
        {
            return Err(invalid(format!(
                "column {name:?} is auto-increment: its values are generated, leave it out"
            )));
        }
    }
    let n = batch.num_rows();
    if let Some(d) = &write.deletes
        && d.len() != n
    {
        return Err(invalid(format!(
            "{} row kinds for a batch of {n} rows",
            d.len()
        )));
    }
    let any_delete = (0..n).any(|i| write.is_delete(i));
    if any_delete && def.delete_behavior == DeleteBehavior::Disable {
        return Err(KvError::DeletionDisabled);
    }
    if let Some(t) = &write.targets {
        if let Some(&bad) = t.iter().find(|&&c| c >= def.schema.fields().len()) {
            return Err(invalid(format!(
                "partial update names column {bad}, which does not exist"
            )));
        }
        def.check_partial_update(t)?;
    }
    if n == 0 {
        return Ok(Merged::default());
    }

    let keys = codec.keys(&batch)?;
    // Round of each row, and the distinct keys in first-seen order.
    let mut seen: HashMap<&[u8], usize> = HashMap::new();
    let mut distinct: Vec<&[u8]> = Vec::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for i in 0..n {
        let key = keys.row(i).data();
        let count = seen.entry(key).or_insert_with(|| {
            distinct.push(key);
            0
        });
        if rounds.len() <= *count {
            rounds.push(Vec::new());
        }
        rounds[*count].push(i);
        *count += 1;
    }
    let stored = current(&distinct)?;
    if stored.len() != distinct.len() {
        return Err(KvError::Store(format!(
            "{} answers for {} keys",
            stored.len(),
            distinct.len()
        )));
    }
    let present: Vec<&[u8]> = stored.iter().flatten().map(Vec::as_slice).collect();
    let stored_columns = if present.is_empty() {
        def.schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), 0))
            .collect()
    } else {
        codec.decode(present)?
    };
    let mut state: HashMap<&[u8], Option<Image>> = HashMap::with_capacity(distinct.len());
    let mut row = 0;
    for (key, value) in distinct.iter().zip(&stored) {
        let image = value.as_ref().map(|_| {
            row += 1;
            (STORED, row - 1)
        });
        state.insert(key, image);
    }

    let mut sources: Vec<Vec<ArrayRef>> = vec![
        def.schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), 1))
            .collect(),
        stored_columns,
        batch.columns().to_vec(),
    ];
    // (input row, order within the row, change type, image)
    let mut entries: Vec<(usize, u8, ChangeType, Image)> = Vec::new();
    let mut changed: HashSet<&[u8]> = HashSet::new();
    for rows in &rounds {
        let prev: Vec<Image> = rows
            .iter()
            .map(|&i| state[keys.row(i).data()].unwrap_or((NULLS, 0)))
            .collect();
        let exists: Vec<bool> = prev.iter().map(|&(s, _)| s != NULLS).collect();
        let (actions, after) = merge_round(def, write, &sources, rows, &prev, &exists, auto_ids)?;
        let source = sources.len();
        sources.push(after);
        for (j, &i) in rows.iter().enumerate() {
            let key = keys.row(i).data();
            let image = Some((source, j));
            match actions[j] {
                Action::Ignore => continue,
                Action::Insert => {
                    entries.push((i, 0, ChangeType::Insert, (source, j)));
                    state.insert(key, image);
                }
                Action::Update => {
                    if def.changelog_image == ChangelogImage::Full {
                        entries.push((i, 0, ChangeType::UpdateBefore, prev[j]));
                    }
                    entries.push((i, 1, ChangeType::UpdateAfter, (source, j)));
                    state.insert(key, image);
                }
                Action::Delete => {
                    entries.push((i, 0, ChangeType::Delete, prev[j]));
                    state.insert(key, None);
                }
            }
            changed.insert(key);
        }
    }
    if entries.is_empty() {
        return Ok(Merged::default());
    }
    entries.sort_by_key(|&(i, order, _, _)| (i, order));
    let images: Vec<Image> = entries.iter().map(|&(_, _, _, image)| image).collect();
    let columns = gather(&sources, &images)?;
    let types = entries.iter().map(|&(_, _, t, _)| t as i8).collect();

    // The final state of each changed key, encoded.
    let finals: Vec<(&[u8], Option<Image>)> = distinct
        .iter()
        .filter(|key| changed.contains(*key))
        .map(|key| (*key, state[key]))
        .collect();
    let live: Vec<Image> = finals.iter().filter_map(|(_, image)| *image).collect();
    let encoded = if live.is_empty() {
        None
    } else {
        Some(codec.values(&gather(&sources, &live)?)?)
    };
    let mut next = 0;
    let puts = finals
        .into_iter()
        .map(|(key, image)| {
            let value = image.map(|_| {
                next += 1;
                encoded
                    .as_ref()
                    .map(|rows| rows.row(next - 1).data().to_vec())
                    .unwrap_or_default()
            });
            (key.to_vec(), value)
        })
        .collect();
    Ok(Merged {
        changelog: Some((columns, types)),
        puts,
    })
}

/// Gathers images into columns.
fn gather(sources: &[Vec<ArrayRef>], images: &[Image]) -> KvResult<Vec<ArrayRef>> {
    let columns = sources[0].len();
    (0..columns)
        .map(|c| {
            let arrays: Vec<&dyn Array> = sources.iter().map(|s| s[c].as_ref()).collect();
            Ok(interleave(&arrays, images)?)
        })
        .collect()
}

/// One round: the action and the after-image (one row per row of the round) of each row.
fn merge_round(
    def: &KvTableDef,
    write: &KvWrite,
    sources: &[Vec<ArrayRef>],
    rows: &[usize],
    prev: &[Image],
    exists: &[bool],
    auto_ids: &mut AutoIds,
) -> KvResult<(Vec<Action>, Vec<ArrayRef>)> {
    let m = rows.len();
    let indices = arrow::array::PrimitiveArray::<UInt32Type>::from_iter_values(
        rows.iter().map(|&i| u32::try_from(i).unwrap_or(u32::MAX)),
    );
    let new: Vec<ArrayRef> = sources[INPUT]
        .iter()
        .map(|c| take(c.as_ref(), &indices, None))
        .collect::<Result<_, _>>()?;
    let old = gather(sources, prev)?;
    let exists_mask = BooleanArray::from(exists.to_vec());
    let is_key = |c: usize| def.primary_key.contains(&c);
    let targeted = |c: usize| write.targets.as_ref().is_none_or(|t| t.contains(&c));
    let columns = def.schema.fields().len();
    let schema: &SchemaRef = &def.schema;

    // Deletes take no part in aggregates (an overflow there must not fail the batch).
    let delete_mask =
        BooleanArray::from(rows.iter().map(|&i| write.is_delete(i)).collect::<Vec<_>>());
    let aggregated: Vec<ArrayRef> = if delete_mask.true_count() > 0
        && matches!(def.merge_engine, MergeEngine::Aggregation { .. })
    {
        new.iter()
            .map(|c| zip(&delete_mask, &new_null_array(c.data_type(), m), c))
            .collect::<Result<_, _>>()?
    } else {
        new.clone()
    };

    let mut actions = vec![Action::Ignore; m];
    let mut after: Vec<ArrayRef> = Vec::with_capacity(columns);
    // Upserts.
    for c in 0..columns {
        let column = if is_key(c) {
            new[c].clone()
        } else if !targeted(c) {
            old[c].clone()
        } else {
            match &def.merge_engine {
                MergeEngine::Aggregation { functions } => {
                    let f = functions[c]
                        .as_ref()
                        .unwrap_or(&AggFunction::LastValueIgnoreNulls);
                    aggregate(f, &old[c], &aggregated[c], &exists_mask)?
                }
                _ => new[c].clone(),
            }
        };
        after.push(column);
    }
    let only_keys = write
        .targets
        .as_ref()
        .is_some_and(|t| t.iter().all(|&c| is_key(c)));
    let ignored_versions = match &def.merge_engine {
        MergeEngine::Versioned { column } => Some(older(&new[*column], &old[*column])?),
        _ => None,
    };
    // Deletes: a partial delete nulls the columns it names and deletes the row only when no
    // other non-key column holds a value.
    // Per row: (no other non-key column holds a value, the named columns are all null
    // already). A partial write naming no non-key column deletes like a full one.
    let all_null = |cols: &mut dyn Iterator<Item = usize>| -> KvResult<Vec<bool>> {
        let nulls: Vec<BooleanArray> = cols
            .map(|c| is_null(old[c].as_ref()))
            .collect::<Result<_, _>>()?;
        Ok((0..m).map(|j| nulls.iter().all(|k| k.value(j))).collect())
    };
    let partial_delete: Option<(Vec<bool>, Vec<bool>)> = match &write.targets {
        Some(t) if t.iter().any(|&c| !is_key(c)) => Some((
            all_null(&mut (0..columns).filter(|&c| !is_key(c) && !targeted(c)))?,
            all_null(&mut (0..columns).filter(|&c| !is_key(c) && targeted(c)))?,
        )),
        _ => None,
    };
    let mut deleted_image: Option<Vec<ArrayRef>> = None;
    for (j, &i) in rows.iter().enumerate() {
        actions[j] = if write.is_delete(i) {
            match def.delete_behavior {
                DeleteBehavior::Ignore | DeleteBehavior::Disable => Action::Ignore,
                DeleteBehavior::Allow if !exists[j] => Action::Ignore,
                DeleteBehavior::Allow => match &partial_delete {
                    None => Action::Delete,
                    Some((rest_null, _)) if rest_null[j] => Action::Delete,
                    // Nothing to null: no change.
                    Some((_, named_null)) if named_null[j] => Action::Ignore,
                    Some(_) => {
                        if deleted_image.is_none() {
                            deleted_image = Some(
                                (0..columns)
                                    .map(|c| {
                                        if !is_key(c) && targeted(c) {
                                            new_null_array(schema.field(c).data_type(), m)
                                        } else {
                                            old[c].clone()
                                        }
                                    })
                                    .collect(),
                            );
                        }
                        Action::Update
                    }
                },
            }
        } else {
            match &def.merge_engine {
                MergeEngine::FirstRow if exists[j] => Action::Ignore,
                MergeEngine::Versioned { .. }
                    if exists[j] && ignored_versions.as_ref().is_some_and(|v| v[j]) =>
                {
                    Action::Ignore
                }
                _ if exists[j] && only_keys => Action::Ignore,
                _ if exists[j] => Action::Update,
                _ => Action::Insert,
            }
        };
    }
    // A new key gets the next auto-increment value; a stored one keeps its own.
    if let Some(c) = def.auto_increment {
        let inserts = actions.iter().filter(|a| **a == Action::Insert).count();
        let mut ids = auto_ids.take(inserts)?.into_iter();
        let fresh: arrow::array::Int64Array = actions
            .iter()
            .map(|a| (*a == Action::Insert).then(|| ids.next()).flatten())
            .collect();
        let fresh = arrow::compute::cast(&fresh, schema.field(c).data_type())?;
        after[c] = zip(&exists_mask, &old[c], &fresh)?;
    }
    // Rows that are partial deletes take the nulled image instead of the upsert's.
    if let Some(image) = deleted_image {
        after = after
            .iter()
            .zip(&image)
            .map(|(upsert, nulled)| zip(&delete_mask, nulled, upsert))
            .collect::<Result<_, _>>()?;
    }
    Ok((actions, after))
}

/// Per row: whether `new` is an older version than `old` (a null version is the smallest).
fn older(new: &ArrayRef, old: &ArrayRef) -> KvResult<Vec<bool>> {
    let less = cmp::lt(new, old)?;
    Ok((0..new.len())
        .map(|j| match (new.is_null(j), old.is_null(j)) {
            (true, false) => true,
            (false, false) => less.value(j),
            _ => false,
        })
        .collect())
}

/// `f(old, new)` per row; `exists` says whether the key had a row (else `old` is null).
fn aggregate(
    f: &AggFunction,
    old: &ArrayRef,
    new: &ArrayRef,
    exists: &BooleanArray,
) -> KvResult<ArrayRef> {
    // Null-skipping: a null side yields the other side.
    let skip_nulls = |combined: ArrayRef| -> KvResult<ArrayRef> {
        let old_null = is_null(old.as_ref())?;
        let new_null = is_null(new.as_ref())?;
        let either = zip(&old_null, new, &combined)?;
        Ok(zip(&new_null, old, &either)?)
    };
    Ok(match f {
        AggFunction::Sum => skip_nulls(same_type(
            numeric::add(old, new).map_err(overflow("sum"))?,
            new,
            "sum",
        )?)?,
        AggFunction::Product => skip_nulls(same_type(
            numeric::mul(old, new).map_err(overflow("product"))?,
            new,
            "product",
        )?)?,
        AggFunction::Max => skip_nulls(zip(&cmp::gt(new, old)?, new, old)?)?,
        AggFunction::Min => skip_nulls(zip(&cmp::lt(new, old)?, new, old)?)?,
        AggFunction::LastValue => new.clone(),
        AggFunction::LastValueIgnoreNulls => zip(&is_null(new.as_ref())?, old, new)?,
        AggFunction::FirstValue => zip(exists, old, new)?,
        AggFunction::FirstValueIgnoreNulls => zip(&is_null(old.as_ref())?, new, old)?,
        AggFunction::ListAgg { delimiter } => match new.data_type() {
            DataType::Utf8 => listagg::<i32>(old, new, delimiter),
            DataType::LargeUtf8 => listagg::<i64>(old, new, delimiter),
            t => return Err(invalid(format!("listagg over {t}"))),
        },
        AggFunction::BoolAnd => {
            skip_nulls(Arc::new(boolean::and(old.as_boolean(), new.as_boolean())?))?
        }
        AggFunction::BoolOr => {
            skip_nulls(Arc::new(boolean::or(old.as_boolean(), new.as_boolean())?))?
        }
    })
}

/// Arithmetic on decimals widens precision (and `mul` the scale): back to the column's type,
/// refusing what does not fit.
fn same_type(result: ArrayRef, like: &ArrayRef, what: &'static str) -> KvResult<ArrayRef> {
    if result.data_type() == like.data_type() {
        return Ok(result);
    }
    let options = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    arrow::compute::cast_with_options(&result, like.data_type(), &options).map_err(overflow(what))
}

fn overflow(what: &'static str) -> impl Fn(arrow::error::ArrowError) -> KvError {
    move |e| invalid(format!("{what} aggregate: {e}"))
}

fn listagg<O: OffsetSizeTrait>(old: &ArrayRef, new: &ArrayRef, delimiter: &str) -> ArrayRef {
    let old: &GenericStringArray<O> = old.as_string();
    let new: &GenericStringArray<O> = new.as_string();
    let mut out = GenericStringBuilder::<O>::new();
    for j in 0..new.len() {
        match (old.is_valid(j), new.is_valid(j)) {
            (true, true) => {
                out.append_value(format!("{}{delimiter}{}", old.value(j), new.value(j)));
            }
            (true, false) => out.append_value(old.value(j)),
            (false, true) => out.append_value(new.value(j)),
            (false, false) => out.append_null(),
        }
    }
    Arc::new(out.finish())
}

/// The changelog of a merge as a stored batch.
pub fn changelog_batch(
    storage: &SchemaRef,
    merged: &Merged,
    commit_ms: i64,
) -> KvResult<Option<RecordBatch>> {
    merged
        .changelog
        .as_ref()
        .map(|(columns, types)| {
            changelog::stored_batch(storage, columns.clone(), types.clone(), commit_ms)
        })
        .transpose()
}
