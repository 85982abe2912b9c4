//! The shm provider as a benchmark endpoint (filled in by the core work).

use super::{Endpoint, EndpointConfig, Listener};
use anyhow::{bail, Result};

pub fn listen(_cfg: &EndpointConfig) -> Result<Box<dyn Listener>> {
    bail!("shm endpoint not wired yet")
}

pub fn connect(_cfg: &EndpointConfig, _info: &str) -> Result<Box<dyn Endpoint>> {
    bail!("shm endpoint not wired yet")
}
