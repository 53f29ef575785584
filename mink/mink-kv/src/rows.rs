//! Byte encodings of keys and rows in the working copy, by the Arrow row format: keys compare
//! as their values do and the bucket-key columns of a key are a byte prefix of it (prefix
//! lookups are range scans). The row format is not promised stable across Arrow versions, so
//! the working copy records [`FORMAT`] and is rebuilt from the stream when it differs; nothing
//! on object storage uses it.

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, Rows, SortField};

use crate::definition::KvTableDef;
use crate::{KvError, KvResult};

/// Names the encoding of the working copy; a copy written under another one is discarded.
pub const FORMAT: &str = "arrow-row/58/1";

/// Encodes and decodes a table's keys and rows.
#[derive(Debug)]
pub struct RowCodec {
    schema: SchemaRef,
    physical_key: Vec<usize>,
    keys: RowConverter,
    prefixes: RowConverter,
    values: RowConverter,
}

fn converter(schema: &SchemaRef, columns: &[usize]) -> KvResult<RowConverter> {
    Ok(RowConverter::new(
        columns
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect(),
    )?)
}

impl RowCodec {
    pub fn new(def: &KvTableDef) -> KvResult<Self> {
        let all: Vec<usize> = (0..def.schema.fields().len()).collect();
        Ok(RowCodec {
            schema: def.schema.clone(),
            keys: converter(&def.schema, &def.physical_key)?,
            prefixes: converter(&def.schema, &def.bucket_key)?,
            values: converter(&def.schema, &all)?,
            physical_key: def.physical_key.clone(),
        })
    }

    /// The working-copy keys of a batch of the table's schema (or of any batch whose columns
    /// at the key's indices are the key columns).
    pub fn keys(&self, batch: &RecordBatch) -> KvResult<Rows> {
        let columns: Vec<ArrayRef> = self
            .physical_key
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        self.keys_of(&columns)
    }

    /// Keys from the physical key columns alone, in key order.
    pub fn keys_of(&self, key_columns: &[ArrayRef]) -> KvResult<Rows> {
        Ok(self.keys.convert_columns(key_columns)?)
    }

    /// Key prefixes from the bucket key columns alone, in bucket-key order.
    pub fn prefixes_of(&self, bucket_columns: &[ArrayRef]) -> KvResult<Rows> {
        Ok(self.prefixes.convert_columns(bucket_columns)?)
    }

    /// Encoded whole rows.
    pub fn values(&self, columns: &[ArrayRef]) -> KvResult<Rows> {
        Ok(self.values.convert_columns(columns)?)
    }

    /// Decodes whole rows written by [`RowCodec::values`] into the table's columns.
    pub fn decode<'a>(
        &self,
        values: impl IntoIterator<Item = &'a [u8]>,
    ) -> KvResult<Vec<ArrayRef>> {
        let parser = self.values.parser();
        // The parser trusts its bytes; a damaged local copy must be an error, not a crash.
        let values: Vec<&[u8]> = values.into_iter().collect();
        let columns = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.values
                .convert_rows(values.iter().map(|v| parser.parse(v)))
        }))
        .map_err(|_| {
            KvError::Store("a stored row does not decode; rebuild the working copy".into())
        })??;
        columns
            .into_iter()
            .zip(self.schema.fields())
            .map(|(c, f)| {
                // Dictionaries come back as their values.
                if c.data_type() == f.data_type() {
                    Ok(c)
                } else {
                    Ok(cast(&c, f.data_type())?)
                }
            })
            .collect()
    }
}
