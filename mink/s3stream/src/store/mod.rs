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
    // Errors end up in logs: they name the URL without its secrets.
    let invalid = |reason: String| StoreUrlError::Invalid {
        url: mink_sql::redact_url(url),
        reason,
    };
    let store_error = |source| StoreUrlError::Store {
        url: mink_sql::redact_url(url),
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
            let s3 = s3_builder(bucket, parsed.query_pairs())
                .map_err(invalid)?
                .build()
                .map_err(store_error)?;
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

/// The S3 client of `bucket`: the `AWS_*` environment, then the URL's query parameters.
fn s3_builder<'a>(
    bucket: &str,
    query: impl Iterator<Item = (std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>)>,
) -> Result<AmazonS3Builder, String> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let mut plain_http = std::env::var("AWS_ENDPOINT")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .is_ok_and(|e| e.starts_with("http://"));
    let mut allow_http_set = std::env::var("AWS_ALLOW_HTTP").is_ok();
    // Unsigned payloads unless asked otherwise: signing one hashes every byte PUT with
    // SHA-256 (4.5 % of the machine's CPU at 150 MB/s of writes, measured), while each object
    // carries CRC32C checksums that every read verifies, and TLS guards it on the way.
    if std::env::var("AWS_UNSIGNED_PAYLOAD").is_err() {
        builder = builder.with_unsigned_payload(true);
    }
    for (key, value) in query {
        let key: AmazonS3ConfigKey = key
            .parse()
            .map_err(|e: object_store::Error| e.to_string())?;
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
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain HTTP and refused keys are covered against moto in `tests/object_stores.rs`.
    #[test]
    fn payloads_go_unsigned_unless_the_url_says_otherwise() {
        let unsigned = |url: &str| {
            let parsed = url::Url::parse(url).unwrap();
            s3_builder("b", parsed.query_pairs())
                .unwrap()
                .get_config_value(&AmazonS3ConfigKey::UnsignedPayload)
        };
        assert_eq!(
            unsigned("s3://b/p?endpoint=http://127.0.0.1:9000").as_deref(),
            Some("true")
        );
        assert_eq!(
            unsigned("s3://b/p?endpoint=http://127.0.0.1:9000&aws_unsigned_payload=false")
                .as_deref(),
            Some("false")
        );
    }
}
