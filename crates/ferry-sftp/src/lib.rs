//! ferry's SFTP [`Store`](ferry_engine::Store): a tree on a server where
//! ferry cannot run (SFTP-only hosting, NAS boxes, OpenSSH `internal-sftp`
//! chroots, other systems), reached with the system `ssh` running the
//! `sftp` subsystem, built as ferry-ssh builds its command (`-e`,
//! `FERRY_RSH`, `~/.ssh/config`).
//!
//! [`wire`] is SFTP version 3 on the wire; [`conn`] one session (the ssh
//! child, a writer and a reader thread, many requests in flight); [`store`]
//! the `Store` over it, reading in `read` and writing in `write` (small
//! files' commits pipelined in `pipe`).
#![deny(missing_docs)]

mod ahead;
pub mod conn;
mod keep;
mod pipe;
mod read;
pub mod store;
#[allow(missing_docs)]
pub mod wire;
mod write;

pub use read::SftpReader;
pub use store::{SftpDir, SftpStore};
pub use write::SftpWriter;
