//! The VI protocol engine: frame formats and the per-connection transport
//! that gives VIA's reliability levels over a medium that loses, duplicates,
//! reorders and corrupts frames.
//!
//! It owns no socket, no thread and no clock: time comes in as an argument,
//! frames come in through `handle_*` and go out through `poll_*`, so the
//! same engine runs over UDP, raw Ethernet, or a simulated network.
//!
//! [`Conn`] is one VI's connection; [`Endpoint`] is one network address's
//! table of them: it says which connection an arriving frame is for, and
//! answers what no connection answers (requests for listeners, refusals,
//! disconnects of connections already gone, peer-to-peer rendezvous).

pub mod conn;
pub mod endpoint;
pub mod rtt;
pub mod seq;
pub mod wire;

pub use conn::{
    Clock, Config, Conn, Event, Expected, FailReason, Level, Memory, Outcome, Place, PostError,
    RnrPolicy, SendKind, SendOp, Stats, PLACE_FROM,
};
pub use endpoint::{
    Endpoint, EndpointConfig, EndpointEvent, EndpointStats, Incoming, RendezvousError,
};
pub use wire::{PrivateData, PrivateDataTooLong};

/// A xorshift generator for the crate's randomized tests: the same
/// sequence from the same seed, no dependency.
#[cfg(test)]
pub(crate) fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}
