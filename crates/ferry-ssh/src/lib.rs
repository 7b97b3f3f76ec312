//! ferry's SSH [`Store`](ferry_engine::Store): a tree on another machine,
//! reached with the system `ssh` (so `~/.ssh/config`, agents, ProxyJump
//! and known_hosts work as they do for ssh itself), served there by
//! `ferry serve` through the same local store a local run uses.
//!
//! [`proto`] is the wire protocol (versioned hello, framed requests with
//! ids, many in flight); [`conn`] one connection (the ssh child, a writer
//! and a reader thread); [`store`] the `Store` over it; [`mod@serve`] the
//! remote end.
#![deny(missing_docs)]

pub mod conn;
mod error;
pub mod extra;
pub mod install;
pub mod proto;
mod push;
pub mod quiet;
pub mod serve;
pub mod spawn;
pub mod splice;
pub mod store;
pub mod watch;

pub use conn::{
    close_all, end_all, hint_walk, note_round_trip, round_trip, round_trip_known, split_words,
    Lost, Settings, Target,
};
pub use error::SessionError;
pub use serve::serve;
pub use store::{SshDir, SshReader, SshStore, SshWriter};
