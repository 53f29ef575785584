//! The conformance suite of the metadata command log: every scenario runs against SQLite
//! (file), `sqlite::memory:` (single-node scenarios only) and Postgres.
#![allow(clippy::print_stderr, clippy::print_stdout, unreachable_pub)]

mod harness;

mod convergence;
mod lease;
mod linearizability;
mod sink;
mod snapshots;
mod store;
mod upgrade;
