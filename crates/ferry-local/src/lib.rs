//! ferry's local filesystem [`Store`](ferry_engine::Store): trees on a
//! local disk, every operation relative to an open directory descriptor.
//!
//! [`local`] is the store itself; [`download`] fetches big files from a
//! ranged source (S3) as parallel, resumable ranges into a local partial,
//! tracked by a [`range::RangeSet`]; [`mod@write`] coalesces small writes;
//! `xattr` reads and writes extended attributes and ACLs (`-X`, `-A`).
//! `sparse` copies files with holes, `special` makes fifos and device nodes.
#![deny(missing_docs)]

pub mod append;
pub mod delta;
pub mod download;
pub mod ident;
pub mod inplace;
mod keep;
pub mod local;
pub mod range;
mod sparse;
mod special;
pub mod write;
mod xattr;

pub use local::{stat_path, LocalStore};
pub use sparse::data_runs;
