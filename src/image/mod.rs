//! Images: OCI images pulled from registries (or imported from OCI
//! layouts and archives), unpacked once into a content-addressed store
//! shared by every tenant, and shown to a tenant's processes as `/`
//! through a read-only overlay (docs/environments.md).
//!
//! - [`store`]: the store on disk (layers, image records, references), its
//!   bound, garbage collection and recovery at start; pulls, each made
//!   once however many ask at once.
//! - `gc`: eviction, least recently used images no live view holds; the
//!   references kept within `refs::MAX_REFS`.
//! - `refs`: what a reference resolved to, at most `MAX_REFS` of them,
//!   the least recently used of unused images dropped first.
//! - `proof`: a layer already stored is shared with a new image only once
//!   that image's own blob is shown to unpack to it, and without a download
//!   only with a source (a registry's repository, a layout) that served it.
//! - [`fetch`]: where content comes from (a registry, a layout on the
//!   host), every byte checked against its digest.
//! - [`distribution`]: the registry protocol, every read bounded, no hop
//!   to a host the configuration does not name.
//! - [`layout`]: writing an OCI layout (tests, benchmarks, imports).
//! - `tmp`: a pull's work directory under `tmp/`, and its stop: the
//!   blocking unpacks of a pull that ends (its timeout) stop before its
//!   slot is freed; an unpacked layer not committed gives its room back.
//! - [`unpack`]: one layer's tar into a directory, as hostile input.
//! - [`view`]: an image as a tenant sees it: its skeleton (the mount points
//!   the namespace needs) over its layers, an overlay on the host that the
//!   tenant's mount namespace makes its root.
//!
//! Its seam into the rest: the tenant asks [`ImageStore::resolve`] for an
//! image and [`ImageStore::view`] for its view; the view's path goes into
//! the worker's namespace spec (`isolation::namespace`), its top-level
//! entries into the Landlock read grants, its `Env` into the process
//! environment.

pub mod distribution;
pub mod fetch;
mod gc;
pub mod layout;
mod proof;
pub mod refs;
pub mod store;
mod tmp;
pub mod unpack;
pub mod view;

pub use store::{Image, ImageStore};
pub use view::View;

use crate::error::GatewayError;

/// Why an image could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageError {
    /// The image (or its registry's answer) is malformed, hostile, too
    /// large or not for this platform: retrying will not help.
    #[error("image refused: {0}")]
    Refused(String),
    /// The registry or the store could not be reached or written now.
    #[error("image unavailable: {0}")]
    Unavailable(String),
    /// The tenant may not use this image.
    #[error("image not allowed: {0}")]
    NotAllowed(String),
    /// Evicted from the store between its lookup and its view.
    #[error("image evicted from the store: {0}; retry")]
    Evicted(String),
}

impl From<ImageError> for GatewayError {
    fn from(e: ImageError) -> GatewayError {
        match e {
            ImageError::Refused(_) => GatewayError::InvalidParams(e.to_string()),
            ImageError::NotAllowed(_) => GatewayError::Forbidden(e.to_string()),
            ImageError::Unavailable(_) | ImageError::Evicted(_) => {
                GatewayError::Internal(e.to_string())
            }
        }
    }
}
