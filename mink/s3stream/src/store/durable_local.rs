//! A local-filesystem object store whose writes are durable when they return.
//!
//! object_store 0.13's `LocalFileSystem` writes to a temporary file and renames it into place,
//! but never fsyncs: a power loss can lose or tear an object whose PUT already returned. This
//! wrapper fsyncs the object's file and every directory from its parent up to the store's root
//! (a new directory's entry lives in its parent) before a write returns. A torn object can then
//! only exist for a PUT that never returned, which nothing references and the sweep deletes.
//!
//! Reads skip the zero-filling of object_store's local store: a GET of up to 64 MiB and every
//! range of `get_ranges` are read into buffers as they are allocated.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
    UploadPart,
};

/// [`LocalFileSystem`] with fsync on every write and reads that do not zero their buffers.
#[derive(Debug)]
pub struct DurableLocalFileSystem {
    inner: Arc<LocalFileSystem>,
    root: PathBuf,
}

impl DurableLocalFileSystem {
    /// A store rooted at `root`, which is created if missing.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|e| generic(e.into()))?;
        let root = root.canonicalize().map_err(|e| generic(e.into()))?;
        let inner = LocalFileSystem::new_with_prefix(&root)?.with_automatic_cleanup(true);
        Ok(DurableLocalFileSystem {
            inner: Arc::new(inner),
            root,
        })
    }

    pub fn root(&self) -> &std::path::Path {
        &self.root
    }
}

fn generic(source: Box<dyn std::error::Error + Send + Sync>) -> object_store::Error {
    object_store::Error::Generic {
        store: "DurableLocalFileSystem",
        source,
    }
}

/// The longest range `get_opts` reads at once; a longer one is left to the caller to read or
/// stream, as object_store's local store does.
const EAGER_READ_MAX: u64 = 64 << 20;

/// `range` of `file`, read into a buffer that is not zeroed first (`None` if the file ends
/// before the range does). object_store's local store zero-fills each buffer before reading
/// into it, which was a tenth of the CPU of a consumer catching up from the local store.
fn read_unzeroed(file: &std::fs::File, range: Range<u64>) -> std::io::Result<Option<Bytes>> {
    use std::io::{Read as _, Seek as _};
    let Some(len) = range.end.checked_sub(range.start) else {
        return Ok(None);
    };
    let mut buf = Vec::with_capacity(usize::try_from(len).map_err(std::io::Error::other)?);
    let mut file = file;
    file.seek(std::io::SeekFrom::Start(range.start))?;
    // `read_to_end` reads into the vector's spare capacity as it is, uninitialised.
    file.take(len).read_to_end(&mut buf)?;
    Ok((buf.len() as u64 == len).then(|| Bytes::from(buf)))
}

/// fsyncs `location`'s file and its directories up to `root`.
async fn sync(inner: &LocalFileSystem, root: &std::path::Path, location: &Path) -> Result<()> {
    let file = inner.path_to_filesystem(location)?;
    let root = root.to_path_buf();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        std::fs::File::open(&file)?.sync_all()?;
        let mut dir = file.parent();
        while let Some(d) = dir {
            std::fs::File::open(d)?.sync_all()?;
            if d == root {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    })
    .await?
    .map_err(|e| generic(e.into()))
}

/// fsyncs the directory that held `location` (after a delete or a rename away from it).
async fn sync_parent(inner: &LocalFileSystem, location: &Path) -> Result<()> {
    let file = inner.path_to_filesystem(location)?;
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        if let Some(d) = file.parent() {
            std::fs::File::open(d)?.sync_all()?;
        }
        Ok(())
    })
    .await?
    .map_err(|e| generic(e.into()))
}

impl fmt::Display for DurableLocalFileSystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DurableLocalFileSystem({})", self.root.display())
    }
}

#[async_trait]
impl ObjectStore for DurableLocalFileSystem {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let result = self.inner.put_opts(location, payload, opts).await?;
        sync(&self.inner, &self.root, location).await?;
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(DurableUpload {
            upload,
            inner: Arc::clone(&self.inner),
            root: self.root.clone(),
            location: location.clone(),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        // Read here, into a buffer of its own, what a caller would read whole with `bytes()`
        // (one chunk: collected without a copy); a HEAD or a long range is left as it was.
        let result = self.inner.get_opts(location, options.clone()).await?;
        if options.head || result.range.end - result.range.start > EAGER_READ_MAX {
            return Ok(result);
        }
        let GetResult {
            payload,
            meta,
            range,
            attributes,
        } = result;
        let file = match payload {
            GetResultPayload::File(file, _) => file,
            payload => {
                return Ok(GetResult {
                    payload,
                    meta,
                    range,
                    attributes,
                });
            }
        };
        let wanted = range.clone();
        let read = tokio::task::spawn_blocking(move || read_unzeroed(&file, wanted))
            .await
            .map_err(|e| generic(e.into()))?
            .map_err(|e| generic(e.into()))?;
        match read {
            Some(bytes) => Ok(GetResult {
                payload: GetResultPayload::Stream(
                    futures::stream::once(async { Ok(bytes) }).boxed(),
                ),
                meta,
                range,
                attributes,
            }),
            // The file ended early (it changed under the read): object_store's own read says how.
            None => self.inner.get_opts(location, options).await,
        }
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let file = self.inner.path_to_filesystem(location)?;
        let wanted = ranges.to_vec();
        let read = tokio::task::spawn_blocking(move || -> std::io::Result<Option<Vec<Bytes>>> {
            let file = std::fs::File::open(file)?;
            wanted
                .into_iter()
                .map(|r| read_unzeroed(&file, r))
                .collect()
        })
        .await
        .map_err(|e| generic(e.into()))?;
        match read {
            Ok(Some(read)) => Ok(read),
            // A missing object, or a range past its end: object_store's own read says which.
            Ok(None) | Err(_) => self.inner.get_ranges(location, ranges).await,
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        // Deletes need not be durable: an object that reappears after a crash is unreferenced
        // and the sweep deletes it again.
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await?;
        sync(&self.inner, &self.root, to).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await?;
        sync(&self.inner, &self.root, to).await?;
        sync_parent(&self.inner, from).await
    }
}

/// A multipart upload that fsyncs the object when it completes.
#[derive(Debug)]
struct DurableUpload {
    upload: Box<dyn MultipartUpload>,
    inner: Arc<LocalFileSystem>,
    root: PathBuf,
    location: Path,
}

#[async_trait]
impl MultipartUpload for DurableUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.upload.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let result = self.upload.complete().await?;
        sync(&self.inner, &self.root, &self.location).await?;
        Ok(result)
    }

    async fn abort(&mut self) -> Result<()> {
        self.upload.abort().await
    }
}
