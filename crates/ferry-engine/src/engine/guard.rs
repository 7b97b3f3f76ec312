//! What a watch remembers from one run to the next, checked by every run
//! of it, scoped or full, before it changes anything: both go through
//! [`Engine::open_roots`] and [`Engine::allowance`].
//!
//! - **Root identity:** each root's device and inode as first seen (at the
//!   watch's start). A root that is another directory now (a tmpfs
//!   unmounted, leaving its empty mount point; a root renamed away and
//!   replaced by a new directory or a symlink) refuses the run, unless
//!   `--force` (which adopts the new root, with a note).
//! - **`--max-delete` over a sliding window:** the removals of every run
//!   of the last [`WINDOW`] count together against the limit, so a mass
//!   removal split over many small scoped runs is refused as a whole run
//!   of it would be. `P%` is a share of the entries DST had at the last
//!   full run.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Weak;
use std::time::{Duration, Instant};

use crate::entry::Meta;
use crate::Refused;

/// How long a run's removals count against `--max-delete` in a watch.
pub const WINDOW: Duration = Duration::from_secs(600);

/// The state a watch's runs share (see the module's documentation).
#[derive(Debug)]
pub struct Guard {
    /// (device, inode) of SRC and DST as first seen; `None`: not seen yet
    /// (or a store without inodes).
    ids: Mutex<[Option<(u64, u64)>; 2]>,
    /// Removals by the runs of the window on each side: when, how many.
    removed: Mutex<[VecDeque<(Instant, u64)>; 2]>,
    /// Entries of DST counted by the last full run.
    dst_total: AtomicU64,
    window: Duration,
    /// Removals seen on each side by its watcher so far (bumped by the
    /// watching thread as the events come, also while a run goes on).
    removals: [AtomicU64; 2],
    /// Each side's watcher, to read what the kernel has queued
    /// ([`Guard::settled`]); gone with the watcher's thread.
    barriers: Mutex<[Option<Weak<dyn Barrier>>; 2]>,
    /// The removals seen on each side when the watch last looked
    /// ([`Guard::mark`]): a run starts from these.
    base: Mutex<Option<[u64; 2]>>,
    /// SIGINT or SIGTERM came: the run in flight stops between entries.
    stop: AtomicBool,
    /// DST files (paths) last written while their source changed (a
    /// growing file's first bytes, as listed): before they are appended
    /// to unchanged, their whole old part is compared.
    torn: Mutex<std::collections::HashSet<Vec<u8>>>,
}

impl Default for Guard {
    fn default() -> Self {
        Guard::new(WINDOW)
    }
}

/// A root's identity, where its store has one.
pub fn root_id(m: &Meta) -> Option<(u64, u64)> {
    (m.ino != 0).then_some((m.dev, m.ino))
}

impl Guard {
    /// A guard whose `--max-delete` window is `window`.
    pub fn new(window: Duration) -> Guard {
        Guard {
            ids: Mutex::new([None, None]),
            removed: Mutex::new([VecDeque::new(), VecDeque::new()]),
            dst_total: AtomicU64::new(0),
            window,
            removals: [AtomicU64::new(0), AtomicU64::new(0)],
            barriers: Mutex::new([None, None]),
            base: Mutex::new(None),
            stop: AtomicBool::new(false),
            torn: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Record the identity of root `side` (0: SRC or A, 1: DST or B) if
    /// none is yet.
    pub fn seen(&self, side: usize, m: &Meta) {
        let mut ids = self.ids.lock();
        if ids[side].is_none() {
            ids[side] = root_id(m);
        }
    }

    /// Check root `side` (called `name` in messages) against the identity
    /// first seen (recording it if none was). `Ok(Some(note))`: another
    /// directory, adopted (`force`).
    pub fn check(
        &self,
        side: usize,
        name: &str,
        m: &Meta,
        force: bool,
    ) -> Result<Option<String>, Refused> {
        let Some(now) = root_id(m) else {
            return Ok(None);
        };
        let mut ids = self.ids.lock();
        match ids[side] {
            None => {
                ids[side] = Some(now);
                Ok(None)
            }
            Some(was) if was == now => Ok(None),
            Some(_) if force => {
                ids[side] = Some(now);
                Ok(Some(format!(
                    "{name} is another directory than the one watched (its device and inode changed): --force: synced as it is now"
                )))
            }
            Some(_) => Err(Refused(format!(
                "{name} is not the directory watched at the start (its device and inode changed: unmounted, or renamed away and replaced?): nothing done; mount or put it back, or restart the watch (or give --force) to sync the new one"
            ))),
        }
    }

    /// Removals on `side` counted in the window ending `now` (older ones
    /// forgotten).
    pub fn removed(&self, side: usize, now: Instant) -> u64 {
        let mut all = self.removed.lock();
        let r = &mut all[side];
        while r
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= self.window)
        {
            r.pop_front();
        }
        r.iter().map(|(_, n)| n).sum()
    }

    /// A run removed `n` entries on `side`.
    pub fn add_removed(&self, side: usize, n: u64) {
        if n > 0 {
            self.removed.lock()[side].push_back((Instant::now(), n));
        }
    }

    /// DST entries a full run counted (the base of `--max-delete P%`).
    pub(super) fn set_dst_total(&self, n: u64) {
        self.dst_total.store(n, Ordering::Relaxed);
    }

    /// DST entries of the last full run (0: none yet).
    pub(super) fn dst_total(&self) -> u64 {
        self.dst_total.load(Ordering::Relaxed)
    }

    /// The watcher of `side` saw an entry removed.
    pub fn removal_seen(&self, side: usize) {
        self.removals[side].fetch_add(1, Ordering::Relaxed);
    }

    /// Removals seen on `side` so far by its watcher's thread, which may
    /// not have read the latest events yet (see [`Guard::settled`]).
    pub fn removals(&self, side: usize) -> u64 {
        self.removals[side].load(Ordering::Relaxed)
    }

    /// `b` reads what the kernel has queued for `side`'s watcher.
    pub fn set_barrier(&self, side: usize, b: Weak<dyn Barrier>) {
        self.barriers.lock()[side] = Some(b);
    }

    /// Removals on `side` with every event the kernel queued until now
    /// read (through its watcher's [`Barrier`]): a removal made before
    /// this call is counted, whatever the watcher's thread is doing. The
    /// count read as [`Guard::removals`] where no watcher reads the side.
    pub fn settled(&self, side: usize) -> u64 {
        let b = self.barriers.lock()[side].as_ref().and_then(Weak::upgrade);
        let mut n = None;
        if let Some(b) = b {
            b.sync(&mut || n = Some(self.removals(side)));
        }
        n.unwrap_or_else(|| self.removals(side))
    }

    /// The watch looks before it takes its next run: the removals seen on
    /// each side, settled. Called before it takes in its messages: every
    /// removal counted here has its message there (a [`Barrier`] sends
    /// what it read before it lets go), so a run taken then holds for it,
    /// and one counted after stops the run's removals ([`may_remove`]).
    pub fn mark(&self) {
        let now = [self.settled(0), self.settled(1)];
        *self.base.lock() = Some(now);
    }

    /// The removals a run starts from on `side`: those of the last
    /// [`Guard::mark`] (the count now, settled, if none was made).
    pub fn base(&self, side: usize) -> u64 {
        let b = *self.base.lock();
        b.map_or_else(|| self.settled(side), |b| b[side])
    }

    /// Ask the run in flight to stop between entries (a signal): what it
    /// did not start is left for the next watch; nothing is half-written.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The DST file `rel` was written while its source changed (`true`),
    /// or as it is (`false`).
    pub fn torn(&self, rel: &[u8], torn: bool) {
        let mut t = self.torn.lock();
        if torn {
            t.insert(rel.to_vec());
        } else if !t.is_empty() {
            t.remove(rel);
        }
    }

    /// Whether the DST file `rel` was written while its source changed.
    pub fn is_torn(&self, rel: &[u8]) -> bool {
        let t = self.torn.lock();
        !t.is_empty() && t.contains(rel)
    }

    /// Whether runs must stop ([`Guard::stop`]).
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The window, for messages.
    pub fn window(&self) -> Duration {
        self.window
    }
}

/// A side's watcher, as the runs reach it: the events the kernel has
/// queued for it are read on demand.
pub trait Barrier: Send + Sync {
    /// Read every event queued now (counting its removals, sending its
    /// changes), then call `then` before any later event is read.
    fn sync(&self, then: &mut dyn FnMut());
}

/// Whether a run that started when `side` had seen `at_start` removals
/// (plus the run's own there, seen by its watcher too) may still remove
/// what that side lacks: its root is the directory
/// watched (`m`, opened now by its path) and no removal was made there
/// since (an `rm -rf` of the root that began while the run went on),
/// counting every one the kernel has queued until now ([`Guard::settled`]),
/// not only those its watcher's thread has read. The reason when not.
pub fn may_remove(
    g: &Guard,
    side: usize,
    name: &str,
    m: Option<&Meta>,
    at_start: u64,
) -> Result<(), RemovalsStopped> {
    let Some(m) = m else {
        return Err(RemovalsStopped(format!(
            "{name} is gone: the run's removals stop here"
        )));
    };
    if g.check(side, name, m, false).is_err() {
        return Err(RemovalsStopped(format!(
            "{name} is another directory than the one watched: the run's removals stop here"
        )));
    }
    if g.settled(side) > at_start {
        return Err(RemovalsStopped(format!(
            "{name} is changing (entries removed there while the run went on): the run's removals stop here, the next run does them"
        )));
    }
    Ok(())
}

/// Why a watch's run stops its removals on a side (its root gone, another
/// directory, or changing): one failure of that run (exit 1, not a
/// refusal), and the full run that follows is held until removals are
/// quiet.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RemovalsStopped(pub String);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::Kind;

    fn meta(dev: u64, ino: u64) -> Meta {
        Meta {
            kind: Kind::Dir,
            size: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
            mode: 0o755,
            uid: 0,
            gid: 0,
            ino,
            version: 0,
            rdev: 0,
            sparse: false,
            nlink: 2,
            dev,
            ctime: 0,
        }
    }

    #[test]
    fn another_root_is_refused_unless_forced_and_stores_without_inodes_pass() {
        let g = Guard::default();
        g.seen(0, &meta(1, 10));
        assert!(g.check(0, "SRC", &meta(1, 10), false).unwrap().is_none());
        assert!(g.check(0, "SRC", &meta(2, 10), false).is_err());
        assert!(g.check(0, "SRC", &meta(1, 11), false).is_err());
        assert!(g.check(0, "SRC", &meta(1, 11), true).unwrap().is_some());
        assert!(g.check(0, "SRC", &meta(1, 11), false).unwrap().is_none());
        // DST first seen at its first check; no inode: nothing to compare.
        assert!(g.check(1, "DST", &meta(3, 5), false).unwrap().is_none());
        assert!(g.check(1, "DST", &meta(3, 6), false).is_err());
        assert!(g.check(1, "DST", &meta(0, 0), false).unwrap().is_none());
    }

    #[test]
    fn removals_count_within_the_window_only() {
        let g = Guard::new(Duration::from_millis(50));
        g.add_removed(1, 3);
        g.add_removed(1, 0);
        g.add_removed(1, 4);
        g.add_removed(0, 1);
        assert_eq!(g.removed(1, Instant::now()), 7);
        assert_eq!(g.removed(0, Instant::now()), 1);
        assert_eq!(g.removed(1, Instant::now() + Duration::from_millis(60)), 0);
    }
}
