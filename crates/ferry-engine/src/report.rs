//! Counters and events: what the engine tells the user interface.
//!
//! The engine counts into [`Stats`] (relaxed atomics: a progress display
//! reads them whenever it likes) and calls a [`Reporter`] once per action
//! and per error. The CLI decides how to show them (JSON lines, human lines,
//! progress bar).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Live counters of a run.
#[derive(Debug, Default)]
pub struct Stats {
    /// Source entries listed (the root not included).
    pub entries_scanned: AtomicU64,
    /// Files written.
    pub files_copied: AtomicU64,
    /// Symlinks created or replaced.
    pub symlinks_created: AtomicU64,
    /// Fifos and device nodes created or replaced.
    pub specials_created: AtomicU64,
    /// Hard links made (`-H`): names given to a file already in DST.
    pub hard_links: AtomicU64,
    /// File bytes written (files complete in place).
    pub bytes_copied: AtomicU64,
    /// File bytes moved so far, counted as each piece is written (what a
    /// progress display shows; a failed or repeated copy counts again).
    pub bytes_moved: AtomicU64,
    /// ferry's own leftover temporaries removed from the destination.
    pub temps_removed: AtomicU64,
    /// Destination entries seen (listed, or inside a removed tree): the
    /// base of `--max-delete P%`.
    pub dst_entries: AtomicU64,
    /// Entries removed from the destination (each entry of a removed tree counts).
    pub files_deleted: AtomicU64,
    /// Directories created.
    pub dirs_created: AtomicU64,
    /// Files and symlinks whose content needed no transfer.
    pub unchanged: AtomicU64,
    /// Entries that failed.
    pub errors: AtomicU64,
    /// Bytes queued for transfer so far (for progress).
    pub bytes_planned: AtomicU64,
    /// Files queued for transfer so far (for progress).
    pub files_planned: AtomicU64,
    /// Delta transfers: files, literal and matched bytes, bytes between
    /// the stores.
    pub delta: crate::delta::Counts,
    /// Destination entries kept before they were replaced or removed
    /// (`--backup-dir`, `--suffix`, `--versions`).
    pub files_kept: AtomicU64,
    /// Their bytes.
    pub bytes_kept: AtomicU64,
}

impl Stats {
    /// Add `n` to a counter.
    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// A snapshot as a [`Summary`].
    pub fn summary(&self, elapsed: Duration) -> Summary {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Summary {
            entries_scanned: g(&self.entries_scanned),
            files_copied: g(&self.files_copied),
            symlinks_created: g(&self.symlinks_created),
            specials_created: g(&self.specials_created),
            hard_links: g(&self.hard_links),
            bytes_copied: g(&self.bytes_copied),
            temps_removed: g(&self.temps_removed),
            files_deleted: g(&self.files_deleted),
            dirs_created: g(&self.dirs_created),
            unchanged: g(&self.unchanged),
            errors: g(&self.errors),
            elapsed_s: elapsed.as_secs_f64(),
            delta: self.delta.figures(),
            files_kept: g(&self.files_kept),
            bytes_kept: g(&self.bytes_kept),
        }
    }
}

/// The result of a run (the `--json` summary line).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// Source entries listed.
    pub entries_scanned: u64,
    /// Files written.
    pub files_copied: u64,
    /// Symlinks created or replaced.
    pub symlinks_created: u64,
    /// Fifos and device nodes created or replaced.
    pub specials_created: u64,
    /// Hard links made.
    pub hard_links: u64,
    /// Bytes written.
    pub bytes_copied: u64,
    /// Stale temporaries of ferry's removed.
    pub temps_removed: u64,
    /// Entries removed.
    pub files_deleted: u64,
    /// Directories created.
    pub dirs_created: u64,
    /// Files and symlinks left as they were (metadata may have been updated).
    pub unchanged: u64,
    /// Failed entries.
    pub errors: u64,
    /// Wall time.
    pub elapsed_s: f64,
    /// Delta transfers.
    pub delta: crate::delta::Figures,
    /// Entries kept before being replaced or removed.
    pub files_kept: u64,
    /// Their bytes.
    pub bytes_kept: u64,
}

/// What happened (or, in a dry run, would happen) to one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A new file was copied.
    Copy,
    /// An existing file was replaced by a new version.
    Update,
    /// A symlink was created or replaced.
    Symlink,
    /// A fifo or device node was created or replaced.
    Mknod,
    /// A directory was created.
    Mkdir,
    /// An entry (and everything under it) was removed.
    Delete,
    /// Only metadata (mtime, mode, owner) was changed.
    Meta,
    /// An entry ferry does not copy (a socket; a fifo or device node where
    /// the destination cannot store one) was skipped.
    Skip,
    /// A file was given another name, a hard link (`-H`).
    HardLink,
    /// An entry was renamed in the destination as it was in the source
    /// (`--watch`); the path is the new name.
    Rename,
    /// A destination entry about to be replaced or removed was kept
    /// (`--backup-dir`, `--suffix`, `--versions`); where it went is told
    /// by [`Reporter::kept`].
    Keep,
}

impl Action {
    /// Lower-case name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Copy => "copy",
            Action::Update => "update",
            Action::Symlink => "symlink",
            Action::Mknod => "mknod",
            Action::Mkdir => "mkdir",
            Action::Delete => "delete",
            Action::Meta => "meta",
            Action::Skip => "skip",
            Action::HardLink => "hardlink",
            Action::Rename => "rename",
            Action::Keep => "keep",
        }
    }
}

/// Receives actions and errors as they happen, from any worker thread.
pub trait Reporter: Sync {
    /// An action was done (or planned, in a dry run). `path` is relative to
    /// the root; `size` is the file size for copies, 0 otherwise.
    fn action(&self, action: Action, path: &[u8], size: u64);
    /// An entry failed; the run goes on.
    fn error(&self, path: &[u8], err: &io::Error);
    /// An entry is not copied, for the reason `why` (a note, not an
    /// error): the [`Action::Skip`] action, with its reason.
    fn skip(&self, path: &[u8], why: &str) {
        let _ = why;
        self.action(Action::Skip, path, 0);
    }
    /// `path` was made a hard link of `to` (both relative to the root):
    /// the [`Action::HardLink`] action.
    fn hard_link(&self, path: &[u8], to: &[u8]) {
        let _ = to;
        self.action(Action::HardLink, path, 0);
    }
    /// `path` was renamed from `from` on the destination (a watch
    /// replaying a rename it saw): the [`Action::Rename`] action.
    fn renamed(&self, path: &[u8], from: &[u8]) {
        let _ = from;
        self.action(Action::Rename, path, 0);
    }
    /// The destination entry `path` (`size` bytes) was kept at `to` (a
    /// path below the destination root, or the backup directory's path,
    /// `/`, and the path below it) before being replaced or removed: the
    /// [`Action::Keep`] action.
    fn kept(&self, path: &[u8], to: &[u8], size: u64) {
        let _ = to;
        self.action(Action::Keep, path, size);
    }
    /// Something about the run as a whole the user must see, once (a
    /// destination that refused extended attributes), as one line.
    fn note(&self, msg: &str) {
        let _ = msg;
    }
    /// True when actions are shown one by one (lines, JSON records): a
    /// removed tree is then reported entry by entry, with sizes (which a
    /// local store must stat); otherwise its entries are only counted.
    fn shows_actions(&self) -> bool {
        true
    }
}

/// A reporter that ignores everything (benchmarks, library users).
#[derive(Debug, Default)]
pub struct Quiet;

impl Reporter for Quiet {
    fn action(&self, _: Action, _: &[u8], _: u64) {}
    fn error(&self, _: &[u8], _: &io::Error) {}
    fn shows_actions(&self) -> bool {
        false
    }
}

/// Append `bytes` as a JSON string value, lossy: names that are not UTF-8
/// get U+FFFD in place of the bad bytes. For a name, use
/// [`crate::encode::json_name`], which keeps the exact bytes.
pub fn json_str(out: &mut Vec<u8>, bytes: &[u8]) {
    crate::encode::json_string(out, &String::from_utf8_lossy(bytes));
}
