//! ferry's engine: copy and sync directory trees between [`Store`]s.
//!
//! Data flow: `scan` (a [`Store`] lists one directory at a time, sorted) →
//! [`plan`] (merge-join of the two listings into steps) → transfer (a fixed
//! [`pool`] of workers; file batches) → write (temporary name, metadata,
//! rename). [`engine::Engine`] wires the stages; [`report`] carries counters
//! and events to the user interface.
#![deny(missing_docs)]

pub mod bwlimit;
pub mod class;
pub mod copy;
pub mod delta;
pub mod encode;
pub mod engine;
pub mod entry;
pub mod filter;
pub mod hash;
pub mod keep;
pub mod ls;
pub mod piece;
pub mod plan;
pub mod pool;
pub mod prefetch;
pub mod ranged;
pub mod report;
pub mod special;
pub mod store;
pub mod versions;
pub mod walk;
pub mod watch;
pub mod xattr;

pub use engine::{
    may_remove, walks_into, Barrier, Engine, Guard, MaxDelete, Mode, MoreJobs, Options, Refused,
    RemovalsStopped, Scope, MAX_DELETE_WINDOW,
};
pub use entry::{Kind, Listing, Meta};
pub use filter::Filter;
pub use report::{Action, Reporter, Stats, Summary};
pub use store::Store;
