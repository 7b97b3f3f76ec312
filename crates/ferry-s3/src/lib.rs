//! The S3 `Store`: any S3-compatible object storage (AWS S3, Garage,
//! MinIO, Ceph) as a source or destination of copy, sync and ls.
//!
//! Client: rusty-s3 signs requests (Sans-IO, exact keys, every header under
//! our control) and ureq sends them over a pool of keep-alive connections
//! from the engine's worker threads: no async runtime and no hidden
//! executor between the engine's pool and the socket, and the body stream is
//! ours, so `--bwlimit` paces exact bytes. Ranged GETs to plain-`http`
//! endpoints skip ureq's buffer copy (`direct`). (Design notes: docs/DESIGN.md.)
//!
//! Mapping: a directory is a key prefix ending in `/`, listed with the `/`
//! delimiter, one page of 1,000 keys at a time; a file is an object whose
//! mtime and mode travel in `x-amz-meta-mtime` (seconds with a nanosecond
//! fraction, the format rclone writes and reads) and `x-amz-meta-mode`.
//! Objects without them (uploaded by other tools) use LastModified. An upload
//! is invisible until its single PUT or its multipart completion, so an object
//! is either fully written or absent. S3 has no empty directories, directory
//! metadata, owners or symlinks: the engine asks and skips what cannot be
//! stored.

mod check;
mod config;
mod direct;
#[cfg(test)]
mod direct_tests;
mod etag;
mod fail;
mod keep;
mod listing;
mod multipart;
mod parse;
mod reader;
mod store;
mod transport;
/// Public for the parser benchmark (`benches/xml.rs`).
#[doc(hidden)]
pub mod xml;

pub use config::{parse_s3_url, ConfigError, S3Config};
pub use fail::{Unreachable, DEFAULT_TIMEOUT, UNREACHABLE_AFTER};
pub use multipart::PART_SIZE;
pub use parse::{check_key, format_mtime, parse_mtime};
pub use reader::S3Reader;
pub use store::{S3Dir, S3Store, S3Writer};
pub use transport::Counters;
