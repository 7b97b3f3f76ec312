//! The seam between `--watch` (crate ferry-watch: inotify, the loop) and
//! the stores that notify of their own (an ssh side whose remote `ferry
//! serve` watches its tree): the change type they exchange ([`Change`],
//! [`Msg`]), what a side that notifies implements ([`Source`]), and the
//! local tree watcher `ferry serve` runs, plugged in by the binary
//! ([`set_tree_watcher`]) so that a store crate needs no watch crate.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What the kernel (or a poll) says changed on side `.0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An entry at this path changed; `true` when it is complete (closed,
    /// removed, renamed), `false` while it may still be written.
    Entry(usize, Vec<u8>, bool),
    /// An entry at this path was removed (or moved out of the tree): see
    /// the watch loop's hold on removals.
    Removed(usize, Vec<u8>),
    /// A directory's own metadata changed.
    Dir(usize, Vec<u8>),
    /// A directory appeared (created, moved in) or must be compared whole.
    Deep(usize, Vec<u8>),
    /// Renamed inside the tree: from, to, is a directory.
    Rename(usize, Vec<u8>, Vec<u8>, bool),
    /// The kernel's event queue overflowed: events were lost.
    Overflow(usize),
    /// The side's root went away.
    Gone(usize),
    /// The side's root is back.
    Back(usize),
}

impl Change {
    /// The side it is of.
    pub fn side(&self) -> usize {
        match self {
            Change::Entry(s, ..)
            | Change::Removed(s, _)
            | Change::Dir(s, _)
            | Change::Deep(s, _)
            | Change::Rename(s, ..)
            | Change::Overflow(s)
            | Change::Gone(s)
            | Change::Back(s) => *s,
        }
    }
}

/// Messages to the watch loop.
pub enum Msg {
    /// Changes read at once.
    Changes(Vec<Change>),
    /// The next [`Msg::Changes`] of side `.0` reached the kernel's queue at
    /// `.1`, as well as its reader can tell (an inotify tree), and was
    /// counted in the status's gauges as `.2` (the paths it names).
    Arrived(usize, Instant, usize),
    /// A line to say once (`ferry: note: ...`).
    Note(String),
    /// SIGINT or SIGTERM: stop after the entry in flight.
    Stop,
    /// Side `.0` of a [`Source`] must be polled from now on (`true`: its
    /// watch is lost) or notifies again (`false`: one full run follows, a
    /// change may have been missed meanwhile).
    Polled(usize, bool),
}

/// A side watched by something other than a local inotify tree.
pub trait Source: Send {
    /// Start watching as side `side`: its changes and notes go to `tx`
    /// from a thread of its own, from before this returns. `Err(why)`: it
    /// cannot notify, and the side is polled.
    fn start(self: Box<Self>, side: usize, tx: Sender<Msg>) -> Result<(), NotWatched>;
}

/// Why a [`Source`] cannot notify: the one line a watch says before it
/// polls that side instead (not a failure of the run).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotWatched(pub String);

/// A local tree being watched (ferry-watch's inotify tree), as side 0.
pub trait WatchedTree: Send {
    /// Whether its root is missing now.
    fn is_gone(&self) -> bool;
    /// Send its changes to `tx` until `stop` hangs up (or `tx` is closed).
    fn run_until(self: Box<Self>, tx: Sender<Msg>, stop: Option<OwnedFd>);
}

/// Starts watching the local tree at a root, polling it every interval
/// while it cannot be watched.
pub type TreeWatcher = fn(&Path, Duration) -> io::Result<Box<dyn WatchedTree>>;

static TREE_WATCHER: OnceLock<TreeWatcher> = OnceLock::new();

/// Plug in the local tree watcher (the binary: ferry-watch's inotify
/// tree); the first one set stays.
pub fn set_tree_watcher(w: TreeWatcher) {
    let _ = TREE_WATCHER.set(w);
}

/// Watch the local tree at `root` with the watcher plugged in.
pub fn watch_tree(root: &Path, poll: Duration) -> io::Result<Box<dyn WatchedTree>> {
    match TREE_WATCHER.get() {
        Some(w) => w(root, poll),
        None => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this ferry has no tree watcher",
        )),
    }
}
