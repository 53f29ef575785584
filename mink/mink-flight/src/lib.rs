//! Mink's Arrow Flight frontend.
//!
//! - [`protocol`]: the JSON contract of descriptors, tickets, actions and `app_metadata`,
//!   shared with clients (always built); [`keyed`]: lookup keys as JSON and as Arrow.
//! - `service` (feature `server`): [`MinkFlight`], the `FlightService` on a node: an adapter
//!   over the node service.
//!
//! Any Flight client speaks it: `DoPut` a table (path descriptor `[database, table]`),
//! `DoGet` a JSON ticket, `DoAction` for admin. See `docs/flight.md`.

/// HTTP/2 receive windows for Flight connections, both ends. The defaults (64 KiB) make a
/// sender of large batches wait for window updates many times per batch, and each update
/// waits for a busy peer's connection task: 3× less single-stream `DoPut` throughput here.
pub const STREAM_WINDOW: u32 = 8 << 20;
pub const CONNECTION_WINDOW: u32 = 32 << 20;

pub mod encode;
pub mod keyed;
#[cfg(feature = "server")]
mod metrics;
pub mod protocol;
#[cfg(feature = "server")]
mod service;

#[cfg(feature = "server")]
pub use service::{MinkFlight, ServerConfig, serve};
