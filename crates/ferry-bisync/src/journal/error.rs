//! What can go wrong with a pair's journal or its lock.

use std::path::PathBuf;

/// A journal (or its lock) that cannot be opened, read or written. The
/// messages are the ones ferry prints.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Neither `XDG_STATE_HOME` nor `HOME` says where the default journal lives.
    #[error("neither XDG_STATE_HOME nor HOME is set: give --journal PATH")]
    NoHome,
    /// The journal's directory cannot be created.
    #[error("journal directory {}: {source}", dir.display())]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The lock file cannot be opened.
    #[error("{}: {source}", path.display())]
    LockFile {
        /// `<journal>.lock`.
        path: PathBuf,
        /// Why.
        source: rustix::io::Errno,
    },
    /// Another run of the pair holds the lock.
    #[error("another bisync of this pair is running (lock {} is held)", path.display())]
    Busy {
        /// `<journal>.lock`.
        path: PathBuf,
    },
    /// SQLite failed on the journal.
    #[error("journal {}: {source}", path.display())]
    Sqlite {
        /// The journal file.
        path: PathBuf,
        /// Why.
        source: rusqlite::Error,
    },
    /// A record that does not decode.
    #[error("journal {}: damaged record", path.display())]
    Damaged {
        /// The journal file.
        path: PathBuf,
    },
    /// A journal written by a ferry this one cannot read.
    #[error("journal {}: version {found}, this ferry reads version {reads}", path.display())]
    Version {
        /// The journal file.
        path: PathBuf,
        /// Its version.
        found: String,
        /// The version this ferry reads.
        reads: &'static str,
    },
    /// A journal made for another pair of roots.
    #[error("journal {} belongs to {} and {}, not to {} and {}", path.display(), theirs.0, theirs.1, ours.0, ours.1)]
    OtherPair {
        /// The journal file.
        path: PathBuf,
        /// The roots it was made for.
        theirs: (String, String),
        /// The roots it was asked for.
        ours: (String, String),
    },
}

impl From<JournalError> for ferry_engine::Refused {
    /// A journal that cannot be read or written refuses the run.
    fn from(e: JournalError) -> Self {
        ferry_engine::Refused(e.to_string())
    }
}
