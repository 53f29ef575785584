//! Provides compression utilities for encoding records.
//!
//! This module has implementations of gzip, Snappy, as well as a noop compression format that
//! allows encoding and decoding records into a [`Record`](crate::records::Record).

use crate::protocol::buf::{ByteBuf, ByteBufMut};
use anyhow::Result;

#[cfg(feature = "gzip")]
mod gzip;
#[cfg(feature = "lz4")]
mod lz4;
mod none;
#[cfg(feature = "snappy")]
mod snappy;
#[cfg(feature = "zstd")]
mod zstd;

/// Mink's patch: the most bytes one batch may decompress to. A few bytes on the wire can claim
/// (or expand to) gigabytes; decompression stops with an error past this instead.
pub const MAX_DECOMPRESSED_BYTES: usize = 256 << 20;

/// Mink's patch: a writer that refuses to grow past [`MAX_DECOMPRESSED_BYTES`].
#[allow(dead_code)]
pub(crate) struct Limited<W> {
    inner: W,
    written: usize,
}

#[allow(dead_code)]
impl<W> Limited<W> {
    pub(crate) fn new(inner: W) -> Self {
        Limited { inner, written: 0 }
    }

    pub(crate) fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: std::io::Write> std::io::Write for Limited<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.written.saturating_add(data.len()) > MAX_DECOMPRESSED_BYTES {
            return Err(std::io::Error::other(format!(
                "a batch decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"
            )));
        }
        let n = self.inner.write(data)?;
        self.written += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(feature = "gzip")]
pub use gzip::Gzip;
#[cfg(feature = "lz4")]
pub use lz4::Lz4;
pub use none::None;
#[cfg(feature = "snappy")]
pub use snappy::Snappy;
#[cfg(feature = "zstd")]
pub use zstd::Zstd;

/// A trait for record compression algorithms.
pub trait Compressor<B: ByteBufMut> {
    /// Target buffer type for compression.
    type BufMut: ByteBufMut;
    /// Compresses into provided [`ByteBufMut`], with records encoded by `F` into `R`.
    fn compress<R, F>(buf: &mut B, f: F) -> Result<R>
    where
        F: FnOnce(&mut Self::BufMut) -> Result<R>;
}

/// A trait for record decompression algorithms.
pub trait Decompressor<B: ByteBuf> {
    /// Target buffer type for decompression.
    type Buf: ByteBuf;
    /// Decompress records from `B` mapped using `F` into `R`.
    fn decompress<R, F>(buf: &mut B, f: F) -> Result<R>
    where
        F: FnOnce(&mut Self::Buf) -> Result<R>;
}
