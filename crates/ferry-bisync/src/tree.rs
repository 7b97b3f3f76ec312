//! Scan: both trees listed at once on the engine's worker pool, each kept
//! as one sorted [`Listing`] per directory: nothing is copied or flattened
//! after listing; the plan's merge walks the directories (see
//! [`crate::plan::merge`]). A key is the relative path with NUL for `/`
//! (see [`crate::journal`]): byte order of keys is the order of that walk.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::sync::{Arc, Mutex};

use ferry_engine::entry::join;
use ferry_engine::pool::Pool;
use ferry_engine::store::{is_temp_name, ListError};
use ferry_engine::{Filter, Kind, Listing, Meta, Store};

use crate::journal::Snapshot;
use crate::plan::{merge_dir, orphans, Act, Ctx, DirMerged, Item, Plan, Sides};
use crate::reconcile::Side;

/// Key of a relative path (`/` → NUL).
pub fn key_of(path: &[u8]) -> Vec<u8> {
    path.iter()
        .map(|&c| if c == b'/' { 0 } else { c })
        .collect()
}

/// Relative path of a key (NUL → `/`).
pub fn path_of(key: &[u8]) -> Vec<u8> {
    key.iter().map(|&c| if c == 0 { b'/' } else { c }).collect()
}

/// The key of the parent directory (`None` at the top level).
pub fn parent_key(key: &[u8]) -> Option<&[u8]> {
    key.iter().rposition(|&c| c == 0).map(|i| &key[..i])
}

/// The last component of a key.
pub fn name_of(key: &[u8]) -> &[u8] {
    match key.iter().rposition(|&c| c == 0) {
        Some(i) => &key[i + 1..],
        None => key,
    }
}

/// A scanned tree.
#[derive(Debug, Default)]
pub struct Scan {
    /// Each listed directory's entries by the directory's relative path
    /// (`/`-separated, empty for the root), in name order, without ferry's
    /// temporaries and special files.
    pub dirs: HashMap<Vec<u8>, Listing>,
    /// Number of entries in `dirs`.
    pub count: usize,
    /// Keys of entries whose state is unknown (unreadable), with everything
    /// below them: nothing there may be judged deleted.
    pub unknown: Vec<Vec<u8>>,
    /// Special files (fifos, sockets, devices), skipped. Their keys are
    /// also unknown: the path is left alone on both sides.
    pub skipped: Vec<Vec<u8>>,
    /// ferry's own temporaries (`.ferry-tmp.*`) left by a killed run: never
    /// synced, removed by the next real run.
    pub temps: Vec<(Vec<u8>, Meta)>,
}

impl Scan {
    /// The entry at `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Meta> {
        let dir = path_of(parent_key(key).unwrap_or(b""));
        let list = self.dirs.get(&dir)?;
        let name = name_of(key);
        let es = list.entries();
        es.binary_search_by(|e| list.name(e).cmp(name))
            .ok()
            .map(|i| &es[i].meta)
    }

    /// A scan holding `entries` (keys with their metadata, any order), for
    /// tests.
    #[cfg(test)]
    pub fn of(entries: &[(Vec<u8>, Meta)]) -> Scan {
        let mut v: Vec<&(Vec<u8>, Meta)> = entries.iter().collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        let mut s = Scan::default();
        s.dirs.insert(Vec::new(), Listing::new());
        for (k, m) in v {
            let dir = path_of(parent_key(k).unwrap_or(b""));
            s.dirs.entry(dir).or_default().push(name_of(k), *m);
            if m.kind == Kind::Dir {
                s.dirs.entry(path_of(k)).or_default();
            }
            s.count += 1;
        }
        for l in s.dirs.values_mut() {
            l.sort();
        }
        s
    }
}

/// One directory to list on the sides that hold it (each with its open
/// parent; `None` for the root), then to merge.
struct DirTask<A: Store, B: Store> {
    rel: Vec<u8>,
    a: Option<Option<Arc<A::Dir>>>,
    b: Option<Option<Arc<B::Dir>>>,
}

/// Reports a path that could not be listed or read.
pub type OnError<'a> = &'a (dyn Fn(&[u8], &io::Error) + Sync);

/// A listed directory, kept open for its subdirectories, and its listing.
type Opened<D> = (Arc<D>, Listing);

/// What one side's scan gathers.
struct Gather<S: Store> {
    root: Mutex<Option<S::Dir>>,
    unknown: Mutex<Vec<Vec<u8>>>,
    temps: Mutex<Vec<(Vec<u8>, Meta)>>,
    skipped: Mutex<Vec<Vec<u8>>>,
}

impl<S: Store> Gather<S> {
    fn new(root: Option<S::Dir>) -> Self {
        Gather {
            root: Mutex::new(root),
            unknown: Mutex::new(Vec::new()),
            temps: Mutex::new(Vec::new()),
            skipped: Mutex::new(Vec::new()),
        }
    }

    /// List one directory; returns it, open, and its listing.
    fn list(
        &self,
        store: &S,
        rel: Vec<u8>,
        parent: Option<Arc<S::Dir>>,
        on_error: OnError<'_>,
    ) -> Option<Opened<S::Dir>> {
        let dir = match &parent {
            None => self.root.lock().unwrap().take().expect("root once"),
            Some(p) => {
                let name = CString::new(name_of_path(&rel)).expect("names hold no NUL");
                match store.open_dir(p, &name) {
                    Ok(d) => d,
                    Err(e) => {
                        on_error(&rel, &e);
                        self.unknown.lock().unwrap().push(key_of(&rel));
                        return None;
                    }
                }
            }
        };
        let mut list = Listing::new();
        let mut errors: Vec<ListError> = Vec::new();
        if let Err(e) = store.list(&dir, &rel, &mut list, &mut errors) {
            on_error(&rel, &e);
            self.unknown.lock().unwrap().push(key_of(&rel));
            return None;
        }
        for e in &errors {
            let p = join(&rel, &e.name);
            on_error(&p, &e.err);
            self.unknown.lock().unwrap().push(key_of(&p));
        }
        // Temporaries and special files are set aside here, so the
        // listing holds only what is synced.
        let odd = |e: &ferry_engine::entry::ListEntry, n: &[u8]| {
            e.meta.kind == Kind::Other || is_temp_name(n)
        };
        if list.entries().iter().any(|e| odd(e, list.name(e))) {
            for e in list.entries() {
                let name = list.name(e);
                if is_temp_name(name) {
                    let k = key_of(&join(&rel, name));
                    self.temps.lock().unwrap().push((k, e.meta));
                } else if e.meta.kind == Kind::Other {
                    let k = key_of(&join(&rel, name));
                    self.unknown.lock().unwrap().push(k.clone());
                    self.skipped.lock().unwrap().push(k);
                }
            }
            list.retain_names(|n| !is_temp_name(n));
            list.retain(|e| e.meta.kind != Kind::Other);
        }
        Some((Arc::new(dir), list))
    }

    fn finish(self, dirs: HashMap<Vec<u8>, Listing>, count: usize) -> Scan {
        let mut scan = Scan {
            count,
            dirs,
            unknown: self.unknown.into_inner().unwrap(),
            skipped: self.skipped.into_inner().unwrap(),
            temps: self.temps.into_inner().unwrap(),
        };
        scan.unknown.sort();
        scan.skipped.sort();
        scan.temps.sort_by(|x, y| x.0.cmp(&y.0));
        scan
    }
}

/// A directory listed on both sides (where it exists), waiting for the
/// journal to be merged.
struct Listed {
    rel: Vec<u8>,
    a: Option<Listing>,
    b: Option<Listing>,
}

/// What the merge gathered.
#[derive(Default)]
struct MergeState {
    /// Keys of the directories merged.
    merged: HashSet<Vec<u8>>,
    items: Vec<Item>,
    unchanged: u64,
    seen_j: usize,
    /// Listings kept for the plan's later steps (directories with
    /// something to do), per side.
    kept: [HashMap<Vec<u8>, Listing>; 2],
    count: [usize; 2],
}

/// The journal once loaded, and the directories listed before that.
enum Journal<'a> {
    Loading(Vec<Listed>),
    Ready(&'a Snapshot),
    Failed,
}

/// Merges directories as they are listed (see [`scan_merge`]).
struct Merger<'a> {
    sides: Sides,
    checksum: bool,
    unknown: [&'a Mutex<Vec<Vec<u8>>>; 2],
    journal: Mutex<Journal<'a>>,
    /// Signalled when the journal is in (or failed).
    journal_in: std::sync::Condvar,
    st: Mutex<MergeState>,
}

impl<'a> Merger<'a> {
    /// Merge directory `rel` now if the journal is in, else keep it for
    /// when it is.
    fn listed(&self, d: Listed) {
        let j = match &mut *self.journal.lock().unwrap() {
            Journal::Loading(waiting) => return waiting.push(d),
            Journal::Ready(j) => *j,
            Journal::Failed => return,
        };
        self.merge(j, vec![d]);
    }

    /// The journal is in (or failed to load): merge what waited for it.
    fn journal(&self, j: Option<&'a Snapshot>) {
        let waiting = {
            let mut g = self.journal.lock().unwrap();
            let next = match j {
                Some(j) => Journal::Ready(j),
                None => Journal::Failed,
            };
            let w = match std::mem::replace(&mut *g, next) {
                Journal::Loading(w) => w,
                _ => Vec::new(),
            };
            self.journal_in.notify_all();
            w
        };
        if let Some(j) = j {
            self.merge(j, waiting);
        }
    }

    /// The journal, once it is in (`None`: it failed to load).
    fn wait_journal(&self) -> Option<&'a Snapshot> {
        let mut g = self.journal.lock().unwrap();
        loop {
            match &*g {
                Journal::Loading(_) => g = self.journal_in.wait(g).unwrap(),
                Journal::Ready(j) => return Some(*j),
                Journal::Failed => return None,
            }
        }
    }

    /// Merge directories, and the directories below them that only the
    /// journal holds.
    fn merge(&self, j: &Snapshot, mut todo: Vec<Listed>) {
        let cx = Ctx {
            j,
            sides: self.sides,
            unknown: self.unknown,
            checksum: self.checksum,
        };
        let empty = Listing::new();
        while let Some(d) = todo.pop() {
            let key = key_of(&d.rel);
            let mut out = DirMerged::default();
            let (la, lb) = (d.a.as_ref(), d.b.as_ref());
            merge_dir(
                &cx,
                &key,
                la.unwrap_or(&empty),
                lb.unwrap_or(&empty),
                &mut out,
            );
            // Later steps (conflict names) look at the names of
            // directories with work; a directory in sync is dropped here.
            let keep = out
                .items
                .iter()
                .any(|it| !matches!(it.act, Act::Record | Act::Forget));
            for (name, listed) in &out.subdirs {
                if *listed == [false, false] {
                    todo.push(Listed {
                        rel: join(&d.rel, name),
                        a: None,
                        b: None,
                    });
                }
            }
            let mut st = self.st.lock().unwrap();
            st.count[0] += la.map_or(0, |l| l.len());
            st.count[1] += lb.map_or(0, |l| l.len());
            st.items.append(&mut out.items);
            st.unchanged += out.unchanged;
            st.seen_j += out.seen_j;
            if keep {
                if let Some(l) = d.a {
                    st.kept[0].insert(d.rel.clone(), l);
                }
                if let Some(l) = d.b {
                    st.kept[1].insert(d.rel.clone(), l);
                }
            }
            st.merged.insert(key);
        }
    }
}

/// List two stores at once on one pool of `jobs` workers and merge them
/// with the journal as they go; the journal is loaded by `load` on another
/// thread meanwhile. A root given as `None` does not exist (yet): that
/// side is empty. With `checksum`, files in sync by metadata are planned
/// for a comparison of their bytes ([`Act::Check`]).
///
/// Each directory is one task: its listing on A and on B, the tasks of
/// its subdirectories (from both listings), then its merge
/// ([`merge_dir`]); its listings are dropped there unless it holds work.
/// Memory stays with the directories in flight, and the merge runs beside
/// the listing instead of after it. Directories listed before the journal
/// is in wait for it. Per-entry errors are reported through `on_error`
/// and make their keys unknown.
#[allow(clippy::too_many_arguments)]
pub fn scan_merge<A: Store, B: Store>(
    a: (&A, Option<A::Dir>),
    b: (&B, Option<B::Dir>),
    load: impl FnOnce() -> Result<Snapshot, String> + Send,
    sides: Sides,
    jobs: usize,
    filter: Option<&Filter>,
    checksum: bool,
    on_error: OnError<'_>,
) -> Result<(Plan, Scan, Scan), String> {
    let root = (a.1.is_some(), b.1.is_some());
    let ga = Gather::<A>::new(a.1);
    let gb = Gather::<B>::new(b.1);
    let jl: std::sync::OnceLock<Result<Snapshot, String>> = std::sync::OnceLock::new();
    let m = Merger {
        sides,
        checksum,
        unknown: [&ga.unknown, &gb.unknown],
        journal: Mutex::new(Journal::Loading(Vec::new())),
        journal_in: std::sync::Condvar::new(),
        st: Mutex::new(MergeState::default()),
    };
    let pool: Pool<DirTask<A, B>> = Pool::new();
    pool.push(DirTask {
        rel: Vec::new(),
        a: root.0.then_some(None),
        b: root.1.then_some(None),
    });
    std::thread::scope(|s| {
        s.spawn(|| {
            let r = jl.get_or_init(load);
            m.journal(r.as_ref().ok());
        });
        pool.run(jobs.max(2), |t, pool| {
            let la =
                t.a.and_then(|p| ga.list(a.0, t.rel.clone(), p, on_error))
                    .map(|(d, l)| exact(a.0, &m, Side::A, &t.rel, d, l, on_error))
                    .map(|(d, l)| (d, filtered(filter, &ga.unknown, &t.rel, l)));
            let lb =
                t.b.and_then(|p| gb.list(b.0, t.rel.clone(), p, on_error))
                    .map(|(d, l)| exact(b.0, &m, Side::B, &t.rel, d, l, on_error))
                    .map(|(d, l)| (d, filtered(filter, &gb.unknown, &t.rel, l)));
            // Subdirectories of either side, in name order, one task each.
            let mut sa = sub_dirs(&la).into_iter().peekable();
            let mut sb = sub_dirs(&lb).into_iter().peekable();
            let mut tasks = Vec::new();
            loop {
                let name = match (sa.peek(), sb.peek()) {
                    (None, None) => break,
                    (Some(x), Some(y)) => x.min(y).clone(),
                    (Some(x), None) => x.clone(),
                    (None, Some(y)) => y.clone(),
                };
                let on_a = sa.next_if(|x| *x == name).is_some();
                let on_b = sb.next_if(|y| *y == name).is_some();
                tasks.push(DirTask {
                    rel: join(&t.rel, &name),
                    a: on_a.then(|| la.as_ref().map(|(d, _)| d.clone())),
                    b: on_b.then(|| lb.as_ref().map(|(d, _)| d.clone())),
                });
            }
            // The pool pops the last pushed first: the first name goes last.
            tasks.reverse();
            pool.push_all(tasks);
            m.listed(Listed {
                rel: t.rel,
                a: la.map(|(_, l)| l),
                b: lb.map(|(_, l)| l),
            });
        });
    });
    let j = match jl.get() {
        Some(Ok(j)) => j,
        Some(Err(e)) => return Err(e.clone()),
        None => unreachable!("the loader ran"),
    };
    // Journal records no merge reached (below directories nobody lists).
    let orphans = {
        let st = m.st.lock().unwrap();
        if st.seen_j < j.len() {
            orphans(j, &st.merged)
        } else {
            Vec::new()
        }
    };
    for key in orphans.into_iter().rev() {
        if !m.st.lock().unwrap().merged.contains(&key) {
            let d = Listed {
                rel: path_of(&key),
                a: None,
                b: None,
            };
            m.merge(j, vec![d]);
        }
    }
    let mut st = m.st.into_inner().unwrap();
    st.items.sort_by(|x, y| x.key.cmp(&y.key));
    let plan = Plan {
        items: st.items,
        scanned: (st.count[0] + st.count[1]) as u64,
        unchanged: st.unchanged,
        deletes: [0; 2],
        known: [j.files(); 2],
        known_dirs: j.len() as u64 - j.files(),
        dir_deletes: [0; 2],
        sides,
    };
    let [ka, kb] = st.kept;
    Ok((plan, ga.finish(ka, st.count[0]), gb.finish(kb, st.count[1])))
}

/// Make exact the approximate metadata of an object store's listing of
/// directory `rel` (sizes are exact; mtimes and modes live in object
/// metadata): a file whose size and version fingerprint (`Meta::version`) are
/// those the journal recorded for this side is unchanged since the last
/// sync and takes the recorded metadata; only the others are asked for
/// theirs ([`Store::refine`]: a HEAD each). A no-op run then makes no
/// request beyond the listing. Entries that cannot be asked are unknown.
fn exact<S: Store>(
    s: &S,
    m: &Merger<'_>,
    side: Side,
    rel: &[u8],
    d: Arc<S::Dir>,
    mut l: Listing,
    on_error: OnError<'_>,
) -> (Arc<S::Dir>, Listing) {
    if !s.approximate_meta() {
        return (d, l);
    }
    let key = key_of(rel);
    let j = m.wait_journal();
    let mut recs = j.map(|j| j.children(&key).peekable());
    let mut which = Vec::new();
    {
        let (names, ents) = l.parts_mut();
        for (i, e) in ents.iter_mut().enumerate() {
            if e.meta.kind != Kind::File {
                continue;
            }
            let (o, n) = e.name_span();
            let name = &names[o..o + n];
            let rec = recs.as_mut().and_then(|r| {
                while r.next_if(|(rn, _)| *rn < name).is_some() {}
                r.next_if(|(rn, _)| *rn == name).map(|(_, s)| *s.side(side))
            });
            match rec {
                Some(t)
                    if t.kind == Kind::File
                        && t.size == e.meta.size
                        && t.version != 0
                        && t.version == e.meta.version =>
                {
                    e.meta = t
                }
                _ => which.push(i),
            }
        }
    }
    if !which.is_empty() {
        let unknown = m.unknown[side as usize];
        let mut errors = Vec::new();
        if let Err(e) = s.refine(&d, &mut l, &which, &mut errors) {
            on_error(rel, &e);
            unknown.lock().unwrap().push(key);
        }
        for e in errors {
            let p = join(rel, &e.name);
            on_error(&p, &e.err);
            unknown.lock().unwrap().push(key_of(&p));
        }
    }
    (d, l)
}

/// A side's listing (metadata exact) without what the filter leaves out.
/// A file left out for its size or mtime may be in on the other side: its
/// key is unknown, so the path is out of the run on both sides and its
/// journal record stays as it is.
fn filtered(
    f: Option<&Filter>,
    unknown: &Mutex<Vec<Vec<u8>>>,
    rel: &[u8],
    mut l: Listing,
) -> Listing {
    if let Some(f) = f {
        f.retain(rel, &mut l, |name, by_meta| {
            if by_meta {
                unknown.lock().unwrap().push(key_of(&join(rel, name)));
            }
        });
    }
    l
}

/// Names of the subdirectories in a listing.
fn sub_dirs<D>(l: &Option<(Arc<D>, Listing)>) -> Vec<Vec<u8>> {
    l.as_ref().map_or(Vec::new(), |(_, l)| {
        l.entries()
            .iter()
            .filter(|e| e.meta.kind == Kind::Dir)
            .map(|e| l.name(e).to_vec())
            .collect()
    })
}

/// Last component of a `/` path.
fn name_of_path(rel: &[u8]) -> &[u8] {
    match rel.iter().rposition(|&c| c == b'/') {
        Some(i) => &rel[i + 1..],
        None => rel,
    }
}

/// True when `key` is one of `prefixes` (sorted) or below one.
pub fn under_any(prefixes: &[Vec<u8>], key: &[u8]) -> bool {
    prefixes.iter().any(|p| {
        key == p.as_slice() || (key.len() > p.len() && key.starts_with(p) && key[p.len()] == 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::merge;
    use crate::reconcile::Synced;
    use ferry_local::LocalStore;
    use proptest::prelude::*;

    /// Every entry of a local tree, listed through the store (the metadata
    /// the scan sees).
    fn full_scan(s: &LocalStore) -> Scan {
        fn go(
            s: &LocalStore,
            d: &<LocalStore as Store>::Dir,
            rel: &[u8],
            out: &mut Vec<(Vec<u8>, Meta)>,
        ) {
            let mut l = Listing::new();
            let mut errs = Vec::new();
            s.list(d, rel, &mut l, &mut errs).unwrap();
            for e in l.entries() {
                let p = join(rel, l.name(e));
                out.push((key_of(&p), e.meta));
                if e.meta.kind == Kind::Dir {
                    let c = s.open_dir(d, l.cname(e)).unwrap();
                    go(s, &c, &p, out);
                }
            }
        }
        let (root, _) = s.open_root().unwrap().unwrap();
        let mut v = Vec::new();
        go(s, &root, b"", &mut v);
        Scan::of(&v)
    }

    /// Paths of a random tree: `d` ending = directory.
    fn tree() -> impl Strategy<Value = Vec<String>> {
        let name = prop::sample::select(vec!["a", "b", "c", "a.x", "a-"]);
        let path = prop::collection::vec(name, 1..4).prop_map(|v| v.join("/"));
        prop::collection::vec((path, any::<bool>()), 0..25).prop_map(|v| {
            v.into_iter()
                .map(|(p, d)| if d { format!("{p}/") } else { p })
                .collect()
        })
    }

    fn make(root: &std::path::Path, paths: &[String]) {
        for p in paths {
            let full = root.join(p.trim_end_matches('/'));
            let parent_ok = full
                .parent()
                .is_none_or(|d| std::fs::create_dir_all(d).is_ok());
            if !parent_ok || full.exists() {
                continue;
            }
            if p.ends_with('/') {
                let _ = std::fs::create_dir(&full);
            } else {
                let _ = std::fs::write(&full, p.as_bytes());
            }
        }
    }

    const EMPTY: Meta = Meta {
        kind: Kind::File,
        size: 0,
        mtime_sec: 0,
        mtime_nsec: 0,
        mode: 0o644,
        uid: 0,
        gid: 0,
        ino: 0,
        version: 0,
    };

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The merge done as listings arrive gives the plan of the
        /// reference merge over complete scans, whatever the journal holds
        /// (records matching either side, stale ones, records under
        /// directories nobody has, in no particular shape).
        #[test]
        fn scan_merge_equals_the_reference(
            ta in tree(),
            tb in tree(),
            picks in prop::collection::vec((0usize..64, 0u8..4), 0..40),
            jobs in 2usize..5,
        ) {
            let d = tempfile::tempdir().unwrap();
            let (ra, rb) = (d.path().join("a"), d.path().join("b"));
            std::fs::create_dir(&ra).unwrap();
            std::fs::create_dir(&rb).unwrap();
            make(&ra, &ta);
            make(&rb, &tb);
            let (sa, sb) = (LocalStore::new(&ra, 1), LocalStore::new(&rb, 1));
            let (fa, fb) = (full_scan(&sa), full_scan(&sb));
            // Journal records: for keys of either side (or orphans under
            // `z/`), each side's entry as it is now, changed, or a directory.
            let mut keys: Vec<(Vec<u8>, Meta)> = Vec::new();
            for (dir, l) in fa.dirs.iter().chain(fb.dirs.iter()) {
                for e in l.entries() {
                    keys.push((key_of(&join(dir, l.name(e))), e.meta));
                }
            }
            keys.sort_by(|x, y| x.0.cmp(&y.0));
            keys.dedup_by(|x, y| x.0 == y.0);
            let mut recs: Vec<(Vec<u8>, Synced)> = Vec::new();
            for (i, how) in picks {
                let (key, m) = match keys.get(i) {
                    Some(k) => k.clone(),
                    None => (key_of(format!("z/y{}/f", i % 3).as_bytes()), keys.first().map_or(EMPTY, |k| k.1)),
                };
                let mut r = Synced { a: fa.get(&key).copied().unwrap_or(m), b: fb.get(&key).copied().unwrap_or(m) };
                match how {
                    0 => {}
                    1 => r.a.size += 1,
                    2 => r.b.mtime_sec -= 5,
                    _ => { r.a.kind = Kind::Dir; r.b.kind = Kind::Dir; }
                }
                if recs.iter().all(|(k, _)| *k != key) {
                    recs.push((key, r));
                }
            }
            let snap = Snapshot::from_keys(recs.clone());
            let sides = Sides::default();
            let want = merge(&fa, &fb, &snap, sides);
            let (ca, cb) = (sa.open_root().unwrap().unwrap().0, sb.open_root().unwrap().unwrap().0);
            let fail = |p: &[u8], e: &io::Error| panic!("{}: {e}", String::from_utf8_lossy(p));
            let (got, _, _) = scan_merge(
                (&sa, Some(ca)),
                (&sb, Some(cb)),
                move || Ok(Snapshot::from_keys(recs)),
                sides,
                jobs,
                None,
                false,
                &fail,
            )
            .unwrap();
            let acts = |p: &Plan| -> Vec<(Vec<u8>, crate::plan::Act)> {
                p.items.iter().map(|it| (it.key.clone(), it.act.clone())).collect()
            };
            prop_assert_eq!(acts(&got), acts(&want));
            prop_assert_eq!(got.unchanged, want.unchanged);
            prop_assert_eq!(got.scanned, want.scanned);
            prop_assert_eq!(got.known, want.known);
        }
    }

    #[test]
    fn keys_sort_like_a_walk() {
        let mut v = [
            key_of(b"a.b"),
            key_of(b"a/x"),
            key_of(b"a"),
            key_of(b"a/x/y"),
            key_of(b"a-"),
        ];
        v.sort();
        let p: Vec<Vec<u8>> = v.iter().map(|k| path_of(k)).collect();
        assert_eq!(
            p,
            vec![
                b"a".to_vec(),
                b"a/x".to_vec(),
                b"a/x/y".to_vec(),
                b"a-".to_vec(),
                b"a.b".to_vec()
            ]
        );
        assert_eq!(parent_key(&key_of(b"a/x/y")), Some(&key_of(b"a/x")[..]));
        assert_eq!(name_of(&key_of(b"a/x/y")), b"y");
        assert!(under_any(&[key_of(b"a/x")], &key_of(b"a/x/y")));
        assert!(!under_any(&[key_of(b"a/x")], &key_of(b"a/xy")));
    }
}
