//! The tree walk every command shares (ls, copy/sync, bisync): directories
//! are tasks of one [`Pool`], each visited by a [`Visitor`] that lists it
//! (through [`list`], the one place a listing is produced) on the one or
//! two stores it walks, acts on the sorted listings and queues its
//! subdirectories ([`Queue::dirs`]) and any other work ([`Queue::work`],
//! e.g. a batch of file copies) on the same pool.
//!
//! The pool is a stack: subdirectories are pushed so that they are visited
//! in name order, and work pushed by a directory runs before the walk goes
//! further, so memory stays with the directories in flight, not the tree.

use std::io;

use crate::entry::{join, Listing};
use crate::filter::Filter;
use crate::pool::Pool;
use crate::store::{ListError, Store};

/// What a walk does at each directory.
pub trait Visitor: Sync {
    /// A directory to visit (what the visitor needs of it: open handles,
    /// its path).
    type Dir: Send;
    /// Other work queued on the walk's pool.
    type Work: Send;
    /// Visit one directory: list it, act, queue its subdirectories.
    fn dir(&self, dir: Self::Dir, q: &Queue<'_, Self::Dir, Self::Work>);
    /// Run one piece of other work.
    fn work(&self, work: Self::Work, q: &Queue<'_, Self::Dir, Self::Work>);
}

/// A task of the walk's pool.
pub enum Task<D, W> {
    /// A directory to visit.
    Dir(D),
    /// Other work.
    Work(W),
}

/// Where a visitor queues more tasks.
pub struct Queue<'p, D, W> {
    pool: &'p Pool<Task<D, W>>,
}

impl<D: Send, W: Send> Queue<'_, D, W> {
    /// Queue subdirectories, given in name order (visited in that order).
    pub fn dirs(&self, mut dirs: Vec<D>) {
        if dirs.is_empty() {
            return;
        }
        dirs.reverse();
        self.pool.push_all(dirs.into_iter().map(Task::Dir));
    }

    /// Queue one piece of work.
    pub fn work(&self, w: W) {
        self.pool.push(Task::Work(w));
    }

    /// Drop every queued task and end the walk once running ones return.
    pub fn stop(&self) {
        self.pool.stop();
    }
}

/// Walk from `roots` (visited in the order given) on `jobs` workers until
/// every directory and piece of work queued is done.
pub fn walk<V: Visitor>(v: &V, jobs: usize, roots: Vec<V::Dir>) {
    walk_growing(v, jobs, None, roots)
}

/// [`walk`] on `jobs` workers, and on as many as `more` says once it
/// answers ([`Pool::run_growing`]).
pub fn walk_growing<V: Visitor>(
    v: &V,
    jobs: usize,
    more: Option<&crate::MoreJobs>,
    roots: Vec<V::Dir>,
) {
    let pool: Pool<Task<V::Dir, V::Work>> = Pool::new();
    Queue { pool: &pool }.dirs(roots);
    let more = more.map(|m| &*m.0 as &(dyn Fn() -> Option<usize> + Sync));
    pool.run_growing(jobs, more, |t, pool| {
        let q = Queue { pool };
        match t {
            Task::Dir(d) => v.dir(d, &q),
            Task::Work(w) => v.work(w, &q),
        }
    });
}

/// List directory `rel` (its path from the root) of `store` into `out`,
/// sorted by name: every walk's listings are made here. Entries that could
/// not be read are left out and given to `on_error` with their path, as
/// the error of a listing that failed as a whole is returned.
pub fn list<S: Store>(
    store: &S,
    dir: &S::Dir,
    rel: &[u8],
    filter: Option<&Filter>,
    out: &mut Listing,
    on_error: &mut dyn FnMut(Vec<u8>, ListError),
) -> io::Result<()> {
    let mut errors: Vec<ListError> = Vec::new();
    store.list(dir, rel, out, &mut errors)?;
    if let Some(f) = filter {
        f.apply(store, dir, rel, out, &mut errors, |_, _| ())?;
    }
    for e in errors {
        on_error(join(rel, &e.name), e);
    }
    Ok(())
}

/// A root's identity and that of every directory above it
/// ([`crate::store::PosixStore::root_identities`]): `ids` are (device, inode) with a path showing
/// each (the root itself first when it exists).
#[derive(Clone, Debug, Default)]
pub struct RootIds {
    /// The root's path.
    pub root: Vec<u8>,
    /// (device, inode) of the root and of the directories above it (by
    /// path, and in its filesystem), each with a path showing it.
    pub ids: Vec<((u64, u64), Vec<u8>)>,
}

/// The directories no walk may meet again below a root (docs/CLI.md,
/// "Overlapping locations"): both roots and every directory above them,
/// by device and inode. A directory listed in a walk with one of these
/// identities is a root (or a directory holding one) seen again through a
/// bind mount: walking on would copy a tree into itself, delete the
/// other side's files, or never end. Checked on every listing a walk acts
/// on, before it acts: one comparison per subdirectory listed against a
/// few pairs.
#[derive(Debug)]
pub struct Aliases {
    /// (device, inode) and what it is, for the message.
    ids: Vec<((u64, u64), String)>,
}

impl Aliases {
    /// The aliases of two roots named `names` (SRC and DST, A and B);
    /// `None` unless both stores have identities on this machine.
    pub fn new(names: [&str; 2], roots: [Option<RootIds>; 2]) -> Option<Aliases> {
        let [Some(a), Some(b)] = roots else {
            return None;
        };
        let mut ids: Vec<((u64, u64), String)> = Vec::new();
        for (side, r) in names.iter().zip([a, b]) {
            let root = String::from_utf8_lossy(&r.root).into_owned();
            for (id, path) in r.ids {
                if id.1 == 0 || ids.iter().any(|(x, _)| *x == id) {
                    continue;
                }
                let what = if path == r.root {
                    format!("{side} {root}")
                } else {
                    format!(
                        "{}, which holds {side} {root}",
                        String::from_utf8_lossy(&path)
                    )
                };
                ids.push((id, what));
            }
        }
        Some(Aliases { ids })
    }

    /// The refusal for directory `rel`'s listing `list` on side `side`
    /// when a subdirectory in it is one of the roots or above one.
    pub fn check(&self, side: &str, rel: &[u8], list: &Listing) -> Option<String> {
        for e in list.entries() {
            if e.meta.kind != crate::entry::Kind::Dir || e.meta.ino == 0 {
                continue;
            }
            let id = (e.meta.dev, e.meta.ino);
            if let Some((_, what)) = self.ids.iter().find(|(x, _)| *x == id) {
                return Some(format!(
                    "{side} {}: the same directory as {what} (same device and inode: a bind mount or another path to it): run refused",
                    String::from_utf8_lossy(&join(rel, list.name(e)))
                ));
            }
        }
        None
    }
}
