//! Records the version of the arrow crate this build links (from the workspace's `Cargo.lock`)
//! as `MINK_ARROW_VERSION`: Flight SQL's `FLIGHT_SQL_SERVER_ARROW_VERSION` answers it.
#![allow(clippy::print_stdout)] // a build script talks to cargo on standard output

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let lock = std::path::Path::new(&manifest).join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let version = std::fs::read_to_string(&lock)
        .ok()
        .and_then(|text| arrow_version(&text))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=MINK_ARROW_VERSION={version}");
}

/// The version of package `arrow` in a `Cargo.lock`.
fn arrow_version(lock: &str) -> Option<String> {
    lock.split("[[package]]").find_map(|package| {
        let mut lines = package.lines().map(str::trim);
        lines.any(|l| l == "name = \"arrow\"").then_some(())?;
        package
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix("version = \""))
            .and_then(|v| v.strip_suffix('"'))
            .map(ToString::to_string)
    })
}
