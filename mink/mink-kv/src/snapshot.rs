//! KV snapshots: every row of a bucket's working copy as of one changelog offset, written to
//! object storage as an Arrow IPC stream (zstd) in pages of [`PAGE_ROWS`] rows.
//!
//! A snapshot is whole, not incremental: each one writes the bucket's full state, so its cost is
//! the bucket's size per `kv_snapshot_interval`; restoring reads it whole into memory before
//! applying it. What a snapshot covers is recorded by `CommitKvSnapshot` (its next offset);
//! the stream is never trimmed past the latest snapshot's offset, so snapshot + the changelog
//! after it always rebuild the bucket.

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use bytes::Bytes;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};
use tokio::io::AsyncWriteExt as _;

use crate::rows::RowCodec;
use crate::store::KvStore;
use crate::tablet::KvTablet;
use crate::{KeyChange, KvError, KvResult};

/// Rows per IPC batch of a snapshot.
pub const PAGE_ROWS: usize = 8192;
/// Schema metadata key holding the snapshot's next offset (a cross-check on restore).
const NEXT_OFFSET: &str = "mink.kv.next_offset";

/// What a written snapshot covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Every change below this changelog offset is in the snapshot, none at or above it.
    pub log_offset: u64,
    pub rows: u64,
    pub size_bytes: u64,
}

#[allow(clippy::needless_pass_by_value)]
fn storage(e: object_store::Error) -> KvError {
    KvError::Store(format!("KV snapshot: {e}"))
}

impl KvTablet {
    /// Writes a snapshot of the working copy, consistent at one offset, to `location`. Durable
    /// when this returns; recording it in the metadata log is the caller's.
    pub async fn write_snapshot(
        &self,
        objects: Arc<dyn ObjectStore>,
        location: &Path,
    ) -> KvResult<SnapshotInfo> {
        let mut scan = self.snapshot()?;
        let log_offset = scan.offset();
        let mut schema = self.definition().schema.as_ref().clone();
        schema
            .metadata
            .insert(NEXT_OFFSET.into(), log_offset.to_string());
        let options =
            IpcWriteOptions::default().try_with_compression(Some(CompressionType::ZSTD))?;
        let mut ipc = StreamWriter::try_new_with_options(Vec::new(), &schema, options)?;
        let mut out = BufWriter::new(objects, location.clone());
        let mut rows = 0u64;
        let mut size = 0u64;
        let schema = Arc::new(schema);
        let written: KvResult<()> = async {
            loop {
                let page = scan.next_batch(PAGE_ROWS)?;
                if let Some(batch) = &page {
                    rows += batch.num_rows() as u64;
                    ipc.write(&RecordBatch::try_new(
                        Arc::clone(&schema),
                        batch.columns().to_vec(),
                    )?)?;
                } else {
                    ipc.finish()?;
                }
                let bytes = std::mem::take(ipc.get_mut());
                size += bytes.len() as u64;
                out.put(Bytes::from(bytes)).await.map_err(storage)?;
                if page.is_none() {
                    return Ok(());
                }
            }
        }
        .await;
        if let Err(e) = written {
            // No half-written upload left behind.
            let _ = out.abort().await;
            return Err(e);
        }
        out.shutdown()
            .await
            .map_err(|e| KvError::Store(format!("KV snapshot: {e}")))?;
        Ok(SnapshotInfo {
            log_offset,
            rows,
            size_bytes: size,
        })
    }
}

/// Replaces the working copy with the snapshot at `location`, which covers the changelog below
/// `log_offset`.
pub(crate) async fn restore(
    objects: &Arc<dyn ObjectStore>,
    location: &Path,
    log_offset: u64,
    codec: &RowCodec,
    store: &KvStore,
) -> KvResult<u64> {
    let reader = open(objects, location, log_offset).await?;
    // Rows land under offset 0 until the last page, so a crash midway leaves a copy that is
    // replayed from scratch or restored again, never one that looks complete.
    store.reset(0)?;
    let mut rows = 0u64;
    for batch in reader {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        let keys = codec.keys(&batch)?;
        let values = codec.values(batch.columns())?;
        let puts: Vec<KeyChange> = (0..batch.num_rows())
            .map(|i| {
                (
                    keys.row(i).data().to_vec(),
                    Some(values.row(i).data().to_vec()),
                )
            })
            .collect();
        store.apply(&puts, 0)?;
    }
    store.apply(&[], log_offset)?;
    store.sync()?;
    Ok(rows)
}

/// The rows of the KV snapshot at `location`, which the metadata records as covering the
/// changes below `log_offset`: a bucket's whole state at that offset, as batches of its
/// table's columns, held in memory.
pub async fn read_snapshot(
    objects: &Arc<dyn ObjectStore>,
    location: &Path,
    log_offset: u64,
) -> KvResult<Vec<RecordBatch>> {
    Ok(open(objects, location, log_offset)
        .await?
        .collect::<Result<_, _>>()?)
}

/// A reader of the snapshot at `location`, checked to cover `log_offset`.
async fn open(
    objects: &Arc<dyn ObjectStore>,
    location: &Path,
    log_offset: u64,
) -> KvResult<StreamReader<Cursor<Bytes>>> {
    let bytes = objects
        .get(location)
        .await
        .map_err(storage)?
        .bytes()
        .await
        .map_err(storage)?;
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    let recorded = reader.schema().metadata().get(NEXT_OFFSET).cloned();
    if recorded.as_deref() != Some(log_offset.to_string().as_str()) {
        return Err(KvError::Store(format!(
            "KV snapshot {location} covers offset {recorded:?}, the metadata says {log_offset}"
        )));
    }
    Ok(reader)
}
