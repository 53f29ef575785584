//! Mink's Arrow Flight frontend.
//!
//! - [`protocol`]: the JSON contract of descriptors, tickets, actions and `app_metadata`,
//!   shared with clients (always built); [`keyed`]: routing lookups by key.
//! - `server` (feature `server`): [`MinkFlight`], the `FlightService` on a node.
//!
//! Any Flight client speaks it: `DoPut` a table (path descriptor `[database, table]`),
//! `DoGet` a JSON ticket, `DoAction` for admin. See `docs/flight.md`.

pub mod encode;
#[cfg(feature = "server")]
mod forward;
pub mod keyed;
#[cfg(feature = "server")]
mod metrics;
pub mod protocol;
#[cfg(feature = "server")]
mod server;

#[cfg(feature = "server")]
pub use server::{MinkFlight, ServerConfig, serve};
