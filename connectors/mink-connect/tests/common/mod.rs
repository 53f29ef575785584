//! Helpers of the connector's tests.

use mink_node::Node;

/// Waits for the node to apply its next metadata change (rows committed, a group joined):
/// false at `deadline`.
pub(crate) async fn next_change(node: &Node, deadline: tokio::time::Instant) -> bool {
    let applied = node.view().applied_index;
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    node.wait_applied(applied + 1, left).await.is_ok()
}

/// `mink-connect` with `args`, its output captured, killed when dropped.
pub(crate) fn connect(args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_mink-connect"));
    c.args(args)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

/// [`next_change`] while `child` runs: panics with its stderr if it exits first.
#[allow(dead_code)] // a helper of some of the test binaries
pub(crate) async fn next_change_while(
    node: &Node,
    child: &mut tokio::process::Child,
    deadline: tokio::time::Instant,
) -> bool {
    use tokio::io::AsyncReadExt as _;
    tokio::select! {
        status = child.wait() => {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut stderr).await;
            }
            panic!("the connector exited ({status:?}):\n{stderr}");
        }
        changed = next_change(node, deadline) => changed,
    }
}
