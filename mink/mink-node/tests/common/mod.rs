//! Helpers the node's test binaries share.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use mink_node::Node;

/// Rows `(user_id, event)` of `ids`, `event` being `e<id>`.
pub(crate) fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_from_iter(vec![
        (
            "user_id",
            Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef,
        ),
        (
            "event",
            Arc::new(StringArray::from_iter_values(ids.map(|i| format!("e{i}")))) as ArrayRef,
        ),
    ])
    .unwrap()
}

/// Waits, on each change of `node`'s metadata view, until `done` holds; fails after 30 s with
/// `what` and the last value `done` saw.
pub(crate) async fn until_view<T: std::fmt::Debug>(
    node: &Node,
    what: &str,
    mut done: impl FnMut(&mink_metadata::View) -> Result<(), T>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let view = node.view();
        let seen = match done(&view) {
            Ok(()) => return,
            Err(seen) => seen,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "{what} never happened (last seen: {seen:?})"
        );
        let _ = node
            .wait_applied(view.applied_index + 1, left.min(Duration::from_secs(1)))
            .await;
    }
}
