//! Every deployment file under `deploy/` (Dockerfile, compose, Kubernetes, systemd) starts a
//! node with settings `mink node --check-config` accepts: the node command lines and
//! environments are taken from the files (`tests/deploy_configs.py`) and checked with the
//! binary under test, so a renamed flag or variable cannot leave them behind.
#![allow(clippy::print_stderr)]

mod common;

use std::process::Command;

use crate::common::{MINK, manifest_dir, python};

#[test]
fn every_deploy_file_passes_check_config() {
    let Some(python) = python() else { return };
    let root = manifest_dir().join("../..").canonicalize().unwrap();
    let out = Command::new(&python)
        .arg(manifest_dir().join("tests/deploy_configs.py"))
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deploy_configs.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nodes: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let sources: Vec<&str> = nodes
        .iter()
        .map(|n| n["source"].as_str().unwrap())
        .collect();
    for file in [
        "Dockerfile",
        "compose.yaml",
        "kubernetes/mink.yaml",
        "systemd/mink.service",
    ] {
        assert!(
            sources
                .iter()
                .any(|s| s.starts_with(&format!("deploy/{file}"))),
            "no node found in deploy/{file}: {sources:?}"
        );
    }
    // A `mink` on PATH for the files' own shell commands: the binary under test, checking.
    let bin = tempfile::tempdir().unwrap();
    let wrapper = bin.path().join("mink");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec '{MINK}' \"$@\" --check-config\n"),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for node in &nodes {
        let source = node["source"].as_str().unwrap();
        let mut command = match node["shell"].as_str() {
            Some(shell) => {
                let mut c = Command::new("sh");
                c.args(["-c", shell]);
                c
            }
            None => {
                let mut c = Command::new(MINK);
                for a in node["argv"].as_array().unwrap() {
                    c.arg(a.as_str().unwrap());
                }
                c.arg("--check-config");
                c
            }
        };
        command
            .env_clear()
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.path().display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .current_dir(&root);
        for (k, v) in node["env"].as_object().unwrap() {
            command.env(k, v.as_str().unwrap());
        }
        let out = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let want = format!(
            "the configuration of node {} is valid",
            node["node_id"].as_u64().unwrap()
        );
        assert!(
            out.status.success() && stdout.contains(&want),
            "{source}: `mink node --check-config` refused its settings:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{source}: {}", stdout.lines().next().unwrap_or_default());
    }
    // `mink node --check-config` with only these variables set.
    let check = |vars: &[(&str, &str)]| {
        let out = Command::new(MINK)
            .args(["node", "--check-config", "--node-id", "1"])
            .env_clear()
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // A node whose settings are wrong is refused with what to fix, before it starts.
    let (ok, _, stderr) = check(&[
        ("MINK_METADATA", "mysql://db/mink"),
        ("MINK_OBJECT_STORE", "/tmp/x"),
    ]);
    assert!(!ok && stderr.contains("expected postgres://"), "{stderr}");
    // Settings a node would start with and then serve nothing (every request over a 0-byte
    // limit, an address nobody can dial, two listeners on one port) are refused too.
    let base = [
        ("MINK_METADATA", "sqlite:///tmp/m.db"),
        ("MINK_OBJECT_STORE", "/tmp/x"),
        ("MINK_LISTEN", "127.0.0.1:7171"),
    ];
    for (variable, value, why) in [
        ("MINK_MAX_MESSAGE_BYTES", "0", "no request gets through"),
        (
            "MINK_ADVERTISED_ADDRESS",
            "0.0.0.0:7171",
            "nobody can dial 0.0.0.0",
        ),
        (
            "MINK_METRICS_LISTEN",
            "127.0.0.1:7171",
            "is --listen's address",
        ),
        // A wildcard takes the port on every address.
        (
            "MINK_METRICS_LISTEN",
            "0.0.0.0:7171",
            "is --listen's address",
        ),
        ("MINK_KAFKA_LISTEN", "[::]:7171", "is --listen's address"),
        ("MINK_KV_SNAPSHOT_INTERVAL_S", "0", "at least 1"),
        ("MINK_OTLP_ENDPOINT", "foo", "expected an OTLP/gRPC URL"),
    ] {
        let (ok, _, stderr) = check(&[base.as_slice(), &[(variable, value)]].concat());
        assert!(!ok && stderr.contains(why), "{variable}={value}: {stderr}");
    }
    // An IPv4 wildcard leaves an IPv6 address's port alone.
    let (ok, _, stderr) = check(&[
        ("MINK_METADATA", "sqlite:///tmp/m.db"),
        ("MINK_OBJECT_STORE", "/tmp/x"),
        ("MINK_LISTEN", "[::1]:7171"),
        ("MINK_METRICS_LISTEN", "0.0.0.0:7171"),
    ]);
    assert!(ok, "{stderr}");
    // What it accepts, it prints: every setting given.
    let (ok, stdout, _) = check(
        &[
            base.as_slice(),
            &[
                ("MINK_KAFKA_LISTEN", "127.0.0.1:9092"),
                ("MINK_LEASE_TTL_MS", "5000"),
            ],
        ]
        .concat(),
    );
    assert!(
        ok && stdout.contains("  kafka-listen: 127.0.0.1:9092\n")
            && stdout.contains("  lease-ttl-ms: 5000\n"),
        "{stdout}"
    );
}
