//! The log tablet: Arrow record batches stored in a bucket's stream.
//!
//! - [`codec`]: a stored batch is a self-describing Arrow IPC stream (schema, one record batch,
//!   end marker), optionally zstd-compressed; one offset per row.
//! - [`options`]: table options with the names Apache Fluss users know.
//! - [`routing`]: which bucket a row belongs to — the same function in clients and servers.
//! - [`export`]: rows written out as files for other tools (Parquet's types).
//! - [`LogTablet`]: append and read one bucket.

pub mod changelog;
pub mod codec;
pub mod export;
pub mod filter;
pub mod json;
pub mod options;
pub mod raw;
pub mod routing;
#[cfg(feature = "tablet")]
mod tablet;

#[cfg(feature = "tablet")]
pub use tablet::{LogTablet, ReadBatch, StoredBatch};

/// Errors of the log tablet, classed for gRPC statuses and Kafka codes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The request or the data is wrong: a schema that does not match, a null in a non-null
    /// column, an unknown option value, a batch that does not decode.
    #[error("invalid: {0}")]
    Invalid(String),
    #[cfg(feature = "tablet")]
    #[error(transparent)]
    Stream(#[from] s3stream::StreamError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

pub type LogResult<T> = Result<T, LogError>;
