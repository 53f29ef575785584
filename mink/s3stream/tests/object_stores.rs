//! The object stores s3stream runs on, checked with object_store's own conformance suite
//! (its `integration` module) plus the properties s3stream relies on: memory, the durable
//! local filesystem, the fault wrapper with faults off, and a real S3-compatible server (moto,
//! started by scripts/test.sh).
#![allow(clippy::print_stderr)]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use object_store::integration;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutPayload};
use s3stream::store::{self, FaultyObjectStore, ObjectFaults};

/// A fresh, empty store of each kind; `None` for S3 outside CI without a server.
fn s3_url() -> Option<String> {
    match (
        std::env::var("MINK_TEST_S3_ENDPOINT"),
        std::env::var("MINK_TEST_S3_BUCKET"),
    ) {
        (Ok(endpoint), Ok(bucket)) if !endpoint.is_empty() => Some(format!(
            "s3://{bucket}/t-{:016x}?endpoint={endpoint}&allow_http=true&region=us-east-1\
             &access_key_id=test&secret_access_key=test&virtual_hosted_style_request=false",
            rand::random::<u64>()
        )),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but MINK_TEST_S3_ENDPOINT is not set: run scripts/test.sh")
        }
        _ => None,
    }
}

/// An `http://` endpoint without `allow_http` is plain HTTP still: the store works instead of
/// failing every request with "builder error".
#[tokio::test]
async fn an_http_endpoint_allows_plain_http() {
    let Some(url) = s3_url() else {
        eprintln!("skipped: MINK_TEST_S3_ENDPOINT is not set");
        return;
    };
    let url = url.replace("&allow_http=true", "");
    assert!(!url.contains("allow_http"), "{url}");
    let store = store::open(&url).unwrap();
    let path = Path::from("plain-http");
    store
        .put(&path, PutPayload::from_static(b"x"))
        .await
        .unwrap();
    let got = store.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], b"x");
}

/// Capability differences are parameters: S3 has no copy-if-not-exists without extra setup
/// (s3stream never copies), the local filesystem has no conditional update.
async fn conformance(store: &dyn ObjectStore, supports_update: bool, copy_if_not_exists: bool) {
    integration::put_get_delete_list(store).await;
    integration::get_opts(store).await;
    integration::put_opts(store, supports_update).await;
    integration::list_uses_directories_correctly(store).await;
    integration::list_with_delimiter(store).await;
    integration::rename_and_copy(store).await;
    if copy_if_not_exists {
        integration::copy_if_not_exists(store).await;
        integration::copy_rename_nonexistent_object(store).await;
    }
    integration::stream_get(store).await;
}

#[tokio::test]
async fn memory_store() {
    let store = store::open("memory://").unwrap();
    conformance(store.as_ref(), true, true).await;
}

#[tokio::test]
async fn durable_local_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("objects").display());
    let store = store::open(&url).unwrap();
    conformance(store.as_ref(), false, true).await;
    // Objects land as files under the root, at their object path.
    store
        .put(&Path::from("a/b/object-1"), PutPayload::from_static(b"x"))
        .await
        .unwrap();
    assert!(dir.path().join("objects/a/b/object-1").is_file());
    // Ranges are read whole or refused: one past the end fails the call, as it does in
    // object_store's own local store.
    let ranges = store
        .get_ranges(&Path::from("a/b/object-1"), &[0..1, 1..1])
        .await
        .unwrap();
    assert_eq!(ranges, [&b"x"[..], &b""[..]]);
    store
        .get_ranges(&Path::from("a/b/object-1"), &[0..1, 0..2])
        .await
        .unwrap_err();
    // A plain path opens the same kind of store.
    let plain = store::open(dir.path().join("objects").to_str().unwrap()).unwrap();
    assert_eq!(
        plain
            .get(&Path::from("a/b/object-1"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .as_ref(),
        b"x"
    );
}

#[tokio::test]
async fn s3_store_on_moto() {
    let Some(url) = s3_url() else {
        eprintln!("skipped: MINK_TEST_S3_ENDPOINT is not set");
        return;
    };
    let store = store::open(&url).unwrap();
    // object_store's `put_opts` check ends with racing conditional writes, which moto does not
    // serialise (it checks `If-Match` / `If-None-Match` and then writes, without a lock: two of
    // eight racing creates won once under load). Mink never relies on conditional writes (its
    // fencing is the metadata command log), so their answers are checked here one at a time.
    let store = store.as_ref();
    integration::put_get_delete_list(store).await;
    integration::get_opts(store).await;
    integration::list_uses_directories_correctly(store).await;
    integration::list_with_delimiter(store).await;
    integration::rename_and_copy(store).await;
    integration::stream_get(store).await;
    let path = Path::from("conditional");
    let _ = store.delete(&path).await;
    let v1 = store
        .put_opts(&path, "a".into(), PutMode::Create.into())
        .await
        .unwrap();
    let err = store
        .put_opts(&path, "b".into(), PutMode::Create.into())
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "{err}"
    );
    let update = |v: &object_store::PutResult| PutMode::Update(v.clone().into());
    let v2 = store
        .put_opts(&path, "c".into(), update(&v1).into())
        .await
        .unwrap();
    let err = store
        .put_opts(&path, "d".into(), update(&v1).into())
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::Precondition { .. }),
        "{err}"
    );
    store
        .put_opts(&path, "e".into(), update(&v2).into())
        .await
        .unwrap();
    let got = store.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(got.as_ref(), b"e");
}

#[tokio::test]
async fn the_fault_wrapper_passes_through_and_injects() {
    let faults = ObjectFaults::new(1);
    let store = FaultyObjectStore::new(store::open("memory://").unwrap(), Arc::clone(&faults));
    conformance(&store, true, true).await;

    let path = Path::from("objects/1");
    // Throttled: nothing stored.
    faults.put_throttled.store(1000, Ordering::Relaxed);
    assert!(
        store
            .put(&path, PutPayload::from_static(b"a"))
            .await
            .is_err()
    );
    faults.clear();
    assert!(
        store.head(&path).await.is_err(),
        "a throttled PUT stores nothing"
    );
    // Unknown outcome: an error, yet the object is there.
    faults.put_unknown.store(1000, Ordering::Relaxed);
    assert!(
        store
            .put(&path, PutPayload::from_static(b"b"))
            .await
            .is_err()
    );
    faults.clear();
    assert_eq!(store.head(&path).await.unwrap().size, 1);
    // Reads fail on demand.
    faults.read_error.store(1000, Ordering::Relaxed);
    assert!(store.get(&path).await.is_err());
    faults.clear();
    assert!(store.get(&path).await.is_ok());
    assert_eq!(faults.injected(), 3);
    // Paused: requests wait until resumed.
    faults.pause();
    let pending = {
        let store = Arc::new(store);
        let path = path.clone();
        tokio::spawn(async move { store.get(&path).await.map(|_| ()) })
    };
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        faults.gets_in_flight_reach(1),
    )
    .await
    .expect("the GET did not reach the paused store within 30 s");
    assert!(!pending.is_finished());
    faults.resume();
    pending.await.unwrap().unwrap();
}

#[test]
fn urls_are_checked() {
    assert!(store::open("ftp://x").is_err());
    assert!(store::open("s3:///no-bucket").is_err());
    assert!(store::open("s3://bucket?no_such_option=1").is_err());
}
