//! Iceberg's file I/O over the node's object store: one client stack for the log and the lake,
//! on the local filesystem and S3 alike (iceberg 0.10's own storages are the local filesystem
//! and memory only).
//!
//! Iceberg names files by absolute URI (`file:///data/lake/...`, `s3://bucket/prefix/lake/...`).
//! A storage serves the URIs under its root, the object store's root as Iceberg names it, and
//! maps each to the object store path below it; a URI elsewhere is refused. Iceberg may
//! serialize a storage (typetag): what travels is the object store URL, and the store is opened
//! again from it on first use (a `memory://` store comes back empty).

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

/// The URI Iceberg gives the root of the object store at `store_url` (a path, `file://`,
/// `s3://bucket/prefix?options` or `memory://`): query options dropped, no trailing slash.
pub fn root_uri(store_url: &str) -> std::result::Result<String, String> {
    if store_url == "memory://" || store_url == "memory:" {
        return Ok("memory://".to_string());
    }
    if !store_url.contains("://") {
        let path = std::path::absolute(store_url).map_err(|e| e.to_string())?;
        let url = url::Url::from_directory_path(&path)
            .map_err(|()| format!("{} is not an absolute path", path.display()))?;
        return Ok(url.as_str().trim_end_matches('/').to_string());
    }
    let mut url = url::Url::parse(store_url).map_err(|e| e.to_string())?;
    url.set_query(None);
    url.set_fragment(None);
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// [`Storage`] over an object store.
#[derive(Clone, Serialize, Deserialize)]
pub struct ObjectStoreStorage {
    store_url: String,
    root: String,
    #[serde(skip)]
    store: OnceLock<Arc<dyn ObjectStore>>,
}

impl std::fmt::Debug for ObjectStoreStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStoreStorage")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn unexpected(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unexpected, e.to_string())
}

fn store_error(path: &str, e: &object_store::Error) -> Error {
    let retryable = !matches!(
        e,
        object_store::Error::NotFound { .. } | object_store::Error::AlreadyExists { .. }
    );
    Error::new(ErrorKind::Unexpected, format!("{path}: {e}")).with_retryable(retryable)
}

impl ObjectStoreStorage {
    /// The storage of `store` (opened from `store_url`): its root is [`root_uri`].
    pub fn new(store_url: &str, store: Arc<dyn ObjectStore>) -> Result<Self> {
        let root = root_uri(store_url).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("object store URL {store_url:?}: {e}"),
            )
        })?;
        let lock = OnceLock::new();
        let _ = lock.set(store);
        Ok(ObjectStoreStorage {
            store_url: store_url.to_string(),
            root,
            store: lock,
        })
    }

    /// The root URI: every file this storage serves is below it.
    pub fn root(&self) -> &str {
        &self.root
    }

    fn store(&self) -> Result<&Arc<dyn ObjectStore>> {
        if let Some(s) = self.store.get() {
            return Ok(s);
        }
        let opened = s3stream::store::open(&self.store_url).map_err(unexpected)?;
        Ok(self.store.get_or_init(|| opened))
    }

    /// Every object below `uri` (a directory), as `(uri, last modified in ms since the epoch)`.
    pub async fn list(&self, uri: &str) -> Result<Vec<(String, i64)>> {
        use futures::TryStreamExt as _;
        let prefix = self.path(uri)?;
        let objects: Vec<object_store::ObjectMeta> = self
            .store()?
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| store_error(uri, &e))?;
        Ok(objects
            .into_iter()
            .map(|o| {
                (
                    format!("{}/{}", self.root, o.location),
                    o.last_modified.timestamp_millis(),
                )
            })
            .collect())
    }

    /// The object store path of `uri`.
    fn path(&self, uri: &str) -> Result<Path> {
        let relative = uri
            .strip_prefix(&self.root)
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!("{uri} is outside this node's object store ({})", self.root),
                )
            })?;
        Path::parse(relative).map_err(|e| Error::new(ErrorKind::DataInvalid, format!("{uri}: {e}")))
    }
}

#[async_trait]
#[typetag::serde(name = "mink-object-store")]
impl Storage for ObjectStoreStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        match self.store()?.head(&self.path(path)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error(path, &e)),
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let meta = self
            .store()?
            .head(&self.path(path)?)
            .await
            .map_err(|e| store_error(path, &e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let got = self
            .store()?
            .get(&self.path(path)?)
            .await
            .map_err(|e| store_error(path, &e))?;
        got.bytes().await.map_err(|e| store_error(path, &e))
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        Ok(Box::new(Reader {
            store: Arc::clone(self.store()?),
            path: self.path(path)?,
            uri: path.to_string(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        self.store()?
            .put(&self.path(path)?, PutPayload::from(bs))
            .await
            .map_err(|e| store_error(path, &e))?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        Ok(Box::new(Writer {
            inner: object_store::buffered::BufWriter::new(
                Arc::clone(self.store()?),
                self.path(path)?,
            ),
            uri: path.to_string(),
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        match self.store()?.delete(&self.path(path)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(path, &e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let store = Arc::clone(self.store()?);
        let prefix = self.path(path.trim_end_matches('/'))?;
        let listed: Vec<Path> = store
            .list(Some(&prefix))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| store_error(path, &e))?;
        for location in listed {
            match store.delete(&location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_error(path, &e)),
            }
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        self.path(path)?;
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        self.path(path)?;
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

struct Reader {
    store: Arc<dyn ObjectStore>,
    path: Path,
    uri: String,
}

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store
            .get_range(&self.path, range)
            .await
            .map_err(|e| store_error(&self.uri, &e))
    }
}

struct Writer {
    inner: object_store::buffered::BufWriter,
    uri: String,
}

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.inner
            .write_all(&bs)
            .await
            .map_err(|e| unexpected(format!("{}: {e}", self.uri)))
    }

    async fn close(&mut self) -> Result<()> {
        self.inner
            .shutdown()
            .await
            .map_err(|e| unexpected(format!("{}: {e}", self.uri)))
    }
}

/// [`StorageFactory`] handing out one [`ObjectStoreStorage`] (a catalog's file I/O).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ObjectStoreStorageFactory {
    storage: ObjectStoreStorage,
}

impl ObjectStoreStorageFactory {
    pub fn new(storage: ObjectStoreStorage) -> Self {
        ObjectStoreStorageFactory { storage }
    }
}

#[typetag::serde(name = "mink-object-store")]
impl StorageFactory for ObjectStoreStorageFactory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.storage.clone()))
    }
}
