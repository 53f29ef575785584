//! s3stream: ordered streams of record batches on object storage.
//!
//! Every bucket of every Mink table is one stream. A node buffers appends from all its streams
//! and flushes them as one *stream-set object*; an append is acknowledged once its bytes are on
//! object storage and the object is committed in the metadata log (`CommitStreamSetObject`).
//! Reads come from caches or ranged GETs of the objects that hold the offsets.
//!
//! This crate is built in layers:
//! - [`store`]: object stores chosen by URL (durable local filesystem, S3, memory) and a
//!   fault-injecting wrapper;
//! - [`format`]: the object format (checksummed blocks, an index, a footer);
//! - [`S3Stream`]: the engine: open, append, flush, commit in order, fetch.

mod cache;
mod compaction;
mod engine;
pub mod format;
mod metrics;
mod read;
pub mod store;

pub use cache::CacheStats;
pub use compaction::{CleanupReport, CompactionConfig, RoundReport};
pub use engine::{
    AppendAck, Appending, EngineConfig, EngineStats, S3Stream, StreamError, StreamInfo,
    WriterBatchId, object_id_of, object_path,
};
pub use metrics::latency_histogram;
pub use read::COALESCE_BYTES;
