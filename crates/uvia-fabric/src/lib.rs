//! A libfabric provider named `uvia`: libfabric programs over uvia's
//! media, connected endpoints (VIs) on each, reliable datagrams with tag
//! matching of its own on shm (`rdm`) and through `ofi_rxm` layered on
//! the VIs elsewhere, hence MPI.
//!
//! Built as `libuvia-fi.so`, which libfabric loads from `FI_PROVIDER_PATH`
//! or its own provider folder and enters through [`prov::fi_prov_ini`].
//! Each libfabric object is a `#[repr(C)]` struct whose first field is
//! libfabric's own (`fid_fabric`, `fid_domain`, ...), so the pointer
//! libfabric holds is the object; its ops tables are statics, every slot
//! filled (`nosys` for what is not offered). Every function libfabric calls
//! runs through `guard`, so a panic is `-FI_EOTHER`, never an abort.
//! Progress is made inside the program's calls; a domain on a network
//! medium adds a thread that runs its protocol timers (see `drive`).

#![allow(clippy::missing_safety_doc)]

pub mod cq;
pub mod defer;
pub mod domain;
pub mod drive;
pub mod ep;
pub mod eq;
pub mod fabric;
pub mod guard;
pub mod info;
pub mod inject;
pub mod medium;
pub mod mr;
mod nosys;
pub mod pep;
pub mod prov;
pub mod rdm;
pub mod share;
pub mod sys;
