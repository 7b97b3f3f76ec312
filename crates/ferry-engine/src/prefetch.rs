//! Listings of a tree made ahead of a run ([`Prefetch`]): while the other
//! side of a run is still being reached (an ssh connection and the remote
//! ferry's start, an object store's first requests), a local tree is
//! listed in the background, so that its scan is hidden behind the
//! connection instead of added to it. The run's walk takes each
//! directory's listing from here when it has it ([`Prefetch::take`]), and
//! lists the directory itself otherwise: same listings, same errors, in
//! the same order, only made earlier.
//!
//! A listing is taken only for the directory it was made of: the same
//! relative path, and the same device, inode and modification time as the
//! walk finds it with when it comes to it (a stat of its own, made then),
//! and only when that mtime is older than the listing by more than
//! [`RACY`] (a change in the same clock tick as the listing leaves the
//! mtime as it was: such a directory is listed again). The background listing stops once the walk begins
//! (the walk lists what is left itself, not twice) and when the prefetch
//! is dropped, and it holds [`MAX_ENTRIES`] entries at most.

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::entry::join;
use crate::entry::{Kind, Listing, Meta};
use crate::store::{ListError, Store};

/// Entries held at most, some 30 MiB (listings of a tree bigger than this are made by
/// the walk, as without a prefetch).
pub const MAX_ENTRIES: usize = 1 << 18;

/// A directory modified less than this before its listing was made is
/// listed again by the walk (filesystem timestamps are coarser than the
/// clock: a change right after the listing may not move its mtime).
pub const RACY: std::time::Duration = std::time::Duration::from_secs(1);

/// Background listers.
const THREADS: usize = 2;

/// One directory's listing, made ahead, with the identity of the
/// directory it lists.
struct Listed {
    id: (u64, u64, i64, u32),
    list: Listing,
    errors: Vec<ListError>,
}

struct Inner {
    lists: Mutex<HashMap<Vec<u8>, Listed>>,
    /// Every directory listed (its listing kept or not: one modified
    /// too recently is left to the walk) and its number of entries.
    seen: Mutex<Vec<(Vec<u8>, usize)>>,
    /// The walk began, or the prefetch was dropped: no directory more.
    stop: AtomicBool,
    entries: AtomicUsize,
    /// Directories listed so far.
    listed: AtomicUsize,
    /// Set (and notified) once the background listing has ended.
    done: (Mutex<bool>, Condvar),
}

/// Marks the background listing ended when dropped (every way out).
struct Ended(Arc<Inner>);

impl Drop for Ended {
    fn drop(&mut self) {
        *self.0.done.0.lock() = true;
        self.0.done.1.notify_all();
    }
}

/// Listings of one tree made ahead of a run (see the module's docs).
pub struct Prefetch {
    inner: Arc<Inner>,
}

/// What identifies a directory for a listing made of it: device, inode,
/// mtime.
fn id(m: &Meta) -> (u64, u64, i64, u32) {
    (m.dev, m.ino, m.mtime_sec, m.mtime_nsec)
}

/// Directories waiting to be listed, and how many listers are busy.
type Queue<D> = (Mutex<(VecDeque<(Vec<u8>, D, Meta)>, usize)>, Condvar);

impl Prefetch {
    /// Start listing the tree of `store` in the background. A root that
    /// is missing or cannot be opened is left to the run (which says why).
    pub fn start<S>(store: S) -> Prefetch
    where
        S: Store + Send + Sync + 'static,
        S::Dir: Send,
    {
        let inner = Arc::new(Inner {
            lists: Mutex::new(HashMap::new()),
            seen: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            entries: AtomicUsize::new(0),
            listed: AtomicUsize::new(0),
            done: (Mutex::new(false), Condvar::new()),
        });
        let i = inner.clone();
        std::thread::spawn(move || {
            let _ended = Ended(i.clone());
            // Below the run's own threads (and the processes it starts:
            // ssh, whose key exchange shares these cores): this listing
            // fills the time they wait.
            let _ = rustix::process::setpriority_process(None, 10);
            let Ok(Some((root, meta))) = store.open_root() else {
                return;
            };
            let q: Arc<Queue<S::Dir>> = Arc::new((
                Mutex::new((VecDeque::from([(Vec::new(), root, meta)]), 0)),
                Condvar::new(),
            ));
            let store = Arc::new(store);
            let listers: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (store, i, q) = (store.clone(), i.clone(), q.clone());
                    std::thread::spawn(move || lister(&*store, &i, &q))
                })
                .collect();
            for l in listers {
                let _ = l.join();
            }
        });
        Prefetch { inner }
    }

    /// The listing of directory `rel`, when it was made ahead of a
    /// directory with `meta`'s identity (and its per-entry errors); taken
    /// once. The first call stops the background listing.
    pub fn take(&self, rel: &[u8], meta: &Meta) -> Option<(Listing, Vec<ListError>)> {
        self.inner.stop.store(true, Ordering::Relaxed);
        let l = self.inner.lists.lock().remove(rel)?;
        (meta.ino != 0 && l.id == id(meta)).then_some((l.list, l.errors))
    }
}

impl Prefetch {
    /// True when directory `rel` has a listing made ahead, not taken yet
    /// (the walk then stats the directory, for [`Prefetch::take`]).
    pub fn has(&self, rel: &[u8]) -> bool {
        self.inner.lists.lock().contains_key(rel)
    }

    /// How many directories were listed ahead so far (taken or not).
    pub fn listed(&self) -> usize {
        self.inner.listed.load(Ordering::Relaxed)
    }

    /// A handle on this prefetch's directories for another thread
    /// ([`Hint::dirs_when_done`]).
    pub fn hint(&self) -> Hint {
        Hint(self.inner.clone())
    }

    /// The tree's directories listed so far (paths relative to its root,
    /// the root left out), level by level, each after its parent, as many
    /// as `max_dirs` and, counting the entries of each, `max_entries`
    /// allow: those the other side of a run likely has too, for it to open
    /// and list ahead of the walk
    /// ([`PipelineStore::expect_dirs`](crate::store::PipelineStore::expect_dirs)).
    pub fn dirs(&self, max_dirs: usize, max_entries: usize) -> Vec<Vec<u8>> {
        dirs_of(&self.inner, max_dirs, max_entries)
    }
}

/// The directories of a [`Prefetch`], for a thread that does not own it.
#[derive(Clone)]
pub struct Hint(Arc<Inner>);

impl Hint {
    /// [`Prefetch::dirs`] once the background listing has ended (all of
    /// the tree listed, or the walk began, or the prefetch was dropped),
    /// the run's walk leaving out what `walked` says (the walk's own
    /// choice: [`crate::Engine`]'s hint) — waiting for it.
    pub fn dirs_when_done(&self, walked: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
        let (lock, cv) = &self.0.done;
        let mut done = lock.lock();
        while !*done {
            cv.wait(&mut done);
        }
        drop(done);
        dirs_of(&self.0, HINT_DIRS, HINT_ENTRIES)
            .into_iter()
            .filter(|d| walked(d))
            .collect()
    }
}

/// Directories hinted to the other side's store at most
/// ([`crate::store::PipelineStore::expect_dirs`]), and entries in them.
pub const HINT_DIRS: usize = 1024;
/// See [`HINT_DIRS`].
pub const HINT_ENTRIES: usize = 100_000;

/// [`Prefetch::dirs`] of `inner`.
fn dirs_of(inner: &Inner, max_dirs: usize, max_entries: usize) -> Vec<Vec<u8>> {
    let seen = inner.seen.lock();
    let depth = |p: &[u8]| p.iter().filter(|&&b| b == b'/').count();
    let mut all: Vec<(usize, &[u8], usize)> = seen
        .iter()
        .filter(|(rel, _)| !rel.is_empty())
        .map(|(rel, n)| (depth(rel), rel.as_slice(), *n))
        .collect();
    all.sort_unstable();
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut taken = std::collections::HashSet::new();
    let mut entries = 0;
    for (_, rel, n) in all {
        if out.len() >= max_dirs || entries + n > max_entries {
            break;
        }
        let parent = rel.iter().rposition(|&b| b == b'/').map(|i| &rel[..i]);
        if parent.is_some_and(|p| !taken.contains(p)) {
            continue;
        }
        taken.insert(rel);
        entries += n;
        out.push(rel.to_vec());
    }
    out
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
    }
}

/// One background lister: directories from `q` listed into `i`, their
/// subdirectories queued, until none is left or the prefetch stops.
fn lister<S: Store>(store: &S, i: &Inner, q: &Queue<S::Dir>) {
    loop {
        let (rel, dir, meta) = {
            let mut g = q.0.lock();
            loop {
                if i.stop.load(Ordering::Relaxed) {
                    g.0.clear();
                    q.1.notify_all();
                    return;
                }
                if let Some(next) = g.0.pop_front() {
                    g.1 += 1;
                    break next;
                }
                if g.1 == 0 {
                    q.1.notify_all();
                    return;
                }
                q.1.wait(&mut g);
            }
        };
        let mut list = Listing::new();
        let mut errors = Vec::new();
        // Modified too close to this listing: left to the walk.
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let racy = (meta.mtime_sec, meta.mtime_nsec)
            >= (
                since.saturating_sub(RACY).as_secs() as i64,
                since.saturating_sub(RACY).subsec_nanos(),
            );
        if store.list(&dir, &rel, &mut list, &mut errors).is_ok()
            && i.entries.fetch_add(list.len(), Ordering::Relaxed) + list.len() <= MAX_ENTRIES
        {
            let mut subdirs = Vec::new();
            for e in list.entries() {
                if e.meta.kind != Kind::Dir || i.stop.load(Ordering::Relaxed) {
                    continue;
                }
                let name = list.name(e);
                let Ok(c) = std::ffi::CString::new(name) else {
                    continue;
                };
                if let Ok(d) = store.open_dir(&dir, &c) {
                    subdirs.push((join(&rel, name), d, e.meta));
                }
            }
            i.seen.lock().push((rel.clone(), list.len()));
            if !racy {
                let l = Listed {
                    id: id(&meta),
                    list,
                    errors,
                };
                i.lists.lock().insert(rel, l);
            }
            i.listed.fetch_add(1, Ordering::Relaxed);
            q.0.lock().0.extend(subdirs);
        }
        let mut g = q.0.lock();
        g.1 -= 1;
        q.1.notify_all();
    }
}
