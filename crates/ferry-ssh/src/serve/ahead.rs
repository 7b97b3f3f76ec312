//! Listings made ahead ([`Req::ListAhead`], protocol 15): the client
//! names, with its hello, a tree its run will walk; this end lists it
//! (breadth first, on threads of its own) while the hellos, the root's
//! `StatRoot` and each level's requests are still on their way, so that a
//! `List` finds its answer made, or being made.
//!
//! A listing made ahead is the answer to a `List` only when it is still
//! what a listing made then would say, as far as this end can tell:
//! - it is of the same directory: its device and inode are the handle's;
//! - the directory did not change since: its ctime (every entry added,
//!   removed or renamed, every change of its own metadata moves it) is
//!   the one read before its entries were;
//! - the client changed nothing since: any request that may change a
//!   file or directory ends the listing ahead and drops what it made;
//! - it is fresh: made at most [`FRESH`] before it is asked for, and
//!   asked for once.
//!
//! Otherwise the `List` lists the directory then, as without this. What
//! it cannot tell (a file's content or metadata changed in place within
//! those seconds, its directory untouched) is a listing made a moment
//! earlier, the same as a change a moment after any listing.
//!
//! It stays on the root's file system, lists at most [`BUDGET`] entries
//! and holds at most [`QUEUED`] directories waiting: a tree past that is
//! listed when asked, as before.

use super::*;
use parking_lot::Condvar;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A listing made ahead is used at most this long after it was made.
pub(super) const FRESH: Duration = Duration::from_secs(3);
/// Entries listed ahead at most, per session.
pub(super) const BUDGET: usize = 200_000;
/// Directories waiting to be listed ahead at most.
const QUEUED: usize = 4096;
/// Threads listing ahead at most.
const THREADS: usize = 4;

/// Directories listed ahead, and `List`s answered with one, in this
/// process (for the tests: they wait for the one, and count the other).
#[cfg(test)]
pub(super) static LISTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
#[cfg(test)]
pub(super) static SERVED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A directory's identity: device and inode.
type Key = (u64, u64);

/// One directory's listing made ahead.
enum Slot {
    /// Being listed: a `List` of it waits.
    Busy,
    /// Listed: the reply frame (id to be set), the directory's ctime when
    /// its entries were read, and when.
    Done(Vec<u8>, (i64, i64), Instant),
    /// A `List` came first and lists it itself: not listed ahead.
    Taken,
}

#[derive(Default)]
struct Inner {
    dirs: HashMap<Key, Slot>,
    /// To list: a directory and a subdirectory's name in it.
    queue: VecDeque<(Arc<LocalDir>, CString)>,
    /// Threads listing a directory now.
    busy: usize,
    /// Entries listed so far.
    listed: usize,
    /// The root's device: nothing on another is listed ahead.
    dev: u64,
}

/// The listings made ahead of one session.
#[derive(Default)]
pub(super) struct Ahead {
    /// Asked once (a second `ListAhead` does nothing).
    asked: AtomicBool,
    /// Listing ahead, and its listings to be used: false until asked, and
    /// once the client asked for a change. Read without the lock (a `List`
    /// or a change then costs nothing more); set under it.
    on: AtomicBool,
    inner: Mutex<Inner>,
    cv: Condvar,
}

fn key_of(fd: BorrowedFd<'_>) -> io::Result<(Key, (i64, i64))> {
    let s = rustix::fs::fstat(fd)?;
    Ok((
        (s.st_dev, s.st_ino),
        (s.st_ctime as i64, s.st_ctime_nsec as i64),
    ))
}

impl Ahead {
    /// Start listing the tree at `path` (as `StatRoot` names it) ahead.
    /// A second request, or one after the client changed anything, does
    /// nothing.
    pub(super) fn start(st: &Arc<State>, path: &[u8]) {
        let a = &st.ahead;
        if a.asked.swap(true, Ordering::AcqRel) {
            return;
        }
        a.on.store(true, Ordering::Release);
        let (st, path) = (st.clone(), path.to_vec());
        std::thread::spawn(move || {
            let Some((root, _)) = answer::open_tree(&st, &path).ok().and_then(|(_, d)| d) else {
                st.ahead.stop();
                return;
            };
            {
                let mut i = st.ahead.inner.lock();
                i.dev = key_of(root.fd()).map_or(0, |k| k.0 .0);
                i.busy = 1;
            }
            list_one(&st, Arc::new(root));
            st.ahead.inner.lock().busy -= 1;
            st.ahead.cv.notify_all();
            spawn_threads(&st, threads(&st) - 1);
            run(&st);
        });
    }

    /// Start listing ahead below `root`, whose own listing (`listing`)
    /// was made and answered already (the first flight answered unasked,
    /// `push.rs`): it is not listed a second time, its subdirectories are
    /// queued at once. As [`Ahead::start`] otherwise.
    pub(super) fn start_below(st: &Arc<State>, root: Arc<LocalDir>, listing: &Listing) {
        let a = &st.ahead;
        if a.asked.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok((key, _)) = key_of(root.fd()) else {
            return;
        };
        a.on.store(true, Ordering::Release);
        {
            let mut i = a.inner.lock();
            i.dev = key.0;
            i.dirs.insert(key, Slot::Taken);
            i.listed += listing.len();
            queue_subdirs(&mut i, &root, listing);
            if i.queue.is_empty() {
                return;
            }
        }
        spawn_threads(st, threads(st));
    }

    /// The client may change files from now on: nothing made ahead is
    /// used, nothing more is listed ahead.
    pub(super) fn stop(&self) {
        if !self.on.load(Ordering::Acquire) {
            return;
        }
        let mut i = self.inner.lock();
        if !self.on.swap(false, Ordering::AcqRel) {
            return;
        }
        i.queue.clear();
        // A directory being listed stays `Busy` until its thread is done
        // (and drops what it made): a `List` waiting on it then lists.
        i.dirs.retain(|_, s| matches!(s, Slot::Busy));
        drop(i);
        self.cv.notify_all();
    }

    /// The reply to a `List` of `dir` (request `id`) made ahead, if one
    /// is to be used; `None`: list it now. Waits while it is being made
    /// (not once a change was asked for: then it lists).
    pub(super) fn take(&self, dir: &LocalDir, id: u64) -> Option<Vec<u8>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        let (key, ctime) = key_of(dir.fd()).ok()?;
        let mut i = self.inner.lock();
        loop {
            if !self.on.load(Ordering::Acquire) {
                return None;
            }
            match i.dirs.get(&key) {
                Some(Slot::Busy) => self.cv.wait(&mut i),
                Some(Slot::Taken) => return None,
                Some(Slot::Done(..)) => {
                    let Some(Slot::Done(mut f, was, at)) = i.dirs.remove(&key) else {
                        unreachable!("looked at under the same lock")
                    };
                    if was != ctime || at.elapsed() > FRESH {
                        return None;
                    }
                    crate::proto::set_frame_id(&mut f, id);
                    #[cfg(test)]
                    SERVED.fetch_add(1, Ordering::Relaxed);
                    return Some(f);
                }
                None => {
                    i.dirs.insert(key, Slot::Taken);
                    return None;
                }
            }
        }
    }
}

/// Threads listing ahead: as many as the cores, [`THREADS`] at most.
fn threads(st: &State) -> usize {
    st.cores.clamp(1, THREADS)
}

/// `n` more threads listing the directories queued ([`run`]).
fn spawn_threads(st: &Arc<State>, n: usize) {
    for _ in 0..n {
        let st = st.clone();
        std::thread::spawn(move || run(&st));
    }
}

/// Queue the subdirectories of `d`, listed in `listing`, to be listed
/// ([`QUEUED`] at most waiting).
fn queue_subdirs(i: &mut Inner, d: &Arc<LocalDir>, listing: &Listing) {
    for e in listing.entries() {
        if e.meta.kind != ferry_engine::entry::Kind::Dir || i.queue.len() >= QUEUED {
            continue;
        }
        if let Ok(name) = CString::new(listing.name(e)) {
            i.queue.push_back((d.clone(), name));
        }
    }
}

/// A thread listing ahead: directories from the queue until there are
/// none and none is being listed (or the listing ahead stopped).
fn run(st: &State) {
    let a = &st.ahead;
    loop {
        let (parent, name) = {
            let mut i = a.inner.lock();
            loop {
                if !a.on.load(Ordering::Acquire) || i.listed >= BUDGET {
                    return;
                }
                if let Some(next) = i.queue.pop_front() {
                    i.busy += 1;
                    break next;
                }
                if i.busy == 0 {
                    return;
                }
                a.cv.wait(&mut i);
            }
        };
        if let Ok(d) = st.store.open_dir(&parent, &name) {
            drop(parent);
            list_one(st, Arc::new(d));
        }
        a.inner.lock().busy -= 1;
        a.cv.notify_all();
    }
}

/// List `d` ahead (unless it is listed or taken already, or on another
/// file system) and queue its subdirectories.
fn list_one(st: &State, d: Arc<LocalDir>) {
    let a = &st.ahead;
    let Ok((key, ctime)) = key_of(d.fd()) else {
        return;
    };
    {
        let mut i = a.inner.lock();
        if !a.on.load(Ordering::Acquire) || key.0 != i.dev || i.dirs.contains_key(&key) {
            return;
        }
        i.dirs.insert(key, Slot::Busy);
    }
    // Should listing it panic, its slot goes with the thread: a `List`
    // waiting on it lists the directory itself rather than wait forever.
    struct Unbusy<'a>(&'a Ahead, Key);
    impl Drop for Unbusy<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.inner.lock().dirs.remove(&self.1);
                self.0.cv.notify_all();
            }
        }
    }
    let _unbusy = Unbusy(a, key);
    let mut listing = Listing::new();
    let began = Instant::now();
    let made = answer::listing_frame(st, 0, &d, &mut listing);
    let mut i = a.inner.lock();
    match made {
        Ok(f) if a.on.load(Ordering::Acquire) => {
            i.listed += listing.len();
            i.dirs.insert(key, Slot::Done(f, ctime, began));
            #[cfg(test)]
            LISTED.fetch_add(1, Ordering::Relaxed);
            queue_subdirs(&mut i, &d, &listing);
        }
        // Stopped meanwhile, or not listed: a `List` of it lists it.
        _ => {
            i.dirs.remove(&key);
        }
    }
    drop(i);
    a.cv.notify_all();
}
