//! Object stores, chosen by URL.
//!
//! | URL | store |
//! |---|---|
//! | `file:///var/lib/mink/objects` (or a plain path) | [`DurableLocalFileSystem`]: fsyncs before a write returns |
//! | `s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1` | object_store's S3 client |
//! | `memory://` | in memory, for unit tests |
//!
//! For `s3://` URLs, credentials and settings come from the standard `AWS_*` environment
//! variables; any query parameter is an extra setting with object_store's key names
//! (`endpoint`, `region`, `allow_http`, `access_key_id`, `secret_access_key`, ...). An
//! `http://` endpoint allows plain HTTP unless `allow_http` says otherwise: naming one is
//! asking for it (object_store would refuse every request with an opaque "builder error").

mod durable_local;
mod faults;

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;

pub use durable_local::DurableLocalFileSystem;
pub use faults::{FaultyObjectStore, InjectedFault, ObjectFaults};

/// Why an object store URL could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreUrlError {
    #[error("invalid object store URL {url:?}: {reason}")]
    Invalid { url: String, reason: String },
    #[error("object store URL {url:?}: {source}")]
    Store {
        url: String,
        #[source]
        source: object_store::Error,
    },
}

/// Opens the object store `url` names.
pub fn open(url: &str) -> Result<Arc<dyn ObjectStore>, StoreUrlError> {
    let invalid = |reason: String| StoreUrlError::Invalid {
        url: url.to_string(),
        reason,
    };
    let store_error = |source| StoreUrlError::Store {
        url: url.to_string(),
        source,
    };
    if url == "memory://" || url == "memory:" {
        return Ok(Arc::new(InMemory::new()));
    }
    if !url.contains("://") {
        return Ok(Arc::new(
            DurableLocalFileSystem::new(url).map_err(store_error)?,
        ));
    }
    let parsed = url::Url::parse(url).map_err(|e| invalid(e.to_string()))?;
    match parsed.scheme() {
        "file" => {
            let path = parsed
                .to_file_path()
                .map_err(|()| invalid("a file URL needs an absolute path".to_string()))?;
            Ok(Arc::new(
                DurableLocalFileSystem::new(path).map_err(store_error)?,
            ))
        }
        "s3" => {
            let bucket = parsed
                .host_str()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| invalid("an s3 URL needs a bucket: s3://bucket/prefix".into()))?;
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            let mut plain_http = std::env::var("AWS_ENDPOINT")
                .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                .is_ok_and(|e| e.starts_with("http://"));
            let mut allow_http_set = std::env::var("AWS_ALLOW_HTTP").is_ok();
            for (key, value) in parsed.query_pairs() {
                let key: AmazonS3ConfigKey = key
                    .parse()
                    .map_err(|e: object_store::Error| invalid(e.to_string()))?;
                match &key {
                    AmazonS3ConfigKey::Endpoint => plain_http = value.starts_with("http://"),
                    AmazonS3ConfigKey::Client(object_store::ClientConfigKey::AllowHttp) => {
                        allow_http_set = true;
                    }
                    _ => {}
                }
                builder = builder.with_config(key, value.into_owned());
            }
            if plain_http && !allow_http_set {
                builder = builder.with_allow_http(true);
            }
            let s3 = builder.build().map_err(store_error)?;
            let prefix = parsed.path().trim_matches('/');
            if prefix.is_empty() {
                Ok(Arc::new(s3))
            } else {
                Ok(Arc::new(PrefixStore::new(s3, prefix)))
            }
        }
        other => Err(invalid(format!(
            "unsupported scheme {other:?}: use file://, s3:// or memory://"
        ))),
    }
}
