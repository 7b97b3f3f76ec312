//! Scan: both trees walked at once on the engine's worker pool
//! ([`ferry_engine::walk`]), each directory merged, as soon as it is listed
//! on both sides, with the journal's records of it, read from the journal
//! then ([`Records::dir`]). A path in sync is decided on the spot and
//! nothing of it is kept; only paths with work become [`Item`]s. Content
//! comparisons run on the same pool while the walk goes on, and a first
//! run's records are written a directory at a time as each completes: memory
//! holds the directories in flight and the work, not the tree.
//!
//! A key is the relative path with NUL for `/` (see [`crate::journal`]):
//! byte order of keys is the order of the walk.
//!
//! The scoped walk of `--watch` (the directories that changed) is
//! `tree/scoped.rs`; the tests, `tree/tests.rs`.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::ffi::CString;
use std::hash::{Hash, Hasher};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use ferry_engine::copy::Copier;
use ferry_engine::entry::join;
use ferry_engine::keep::{is_versions_dir, Keeper};
use ferry_engine::store::is_temp_name;
use ferry_engine::store::StoreExt;
use ferry_engine::walk::{self, Queue, Visitor};
use ferry_engine::{Filter, Kind, Listing, Meta, Refused, Store};

use crate::journal::{DirRecs, Records, Update};
use crate::plan::{compared, merge_dir, record_of, Act, Ctx, DirMerged, Item, Plan, Sides};
use crate::reconcile::{Side, Synced};

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

/// What the scan of one side found besides the plan.
#[derive(Debug, Default)]
pub struct Scan {
    /// Entries listed (without ferry's temporaries and special files).
    pub count: usize,
    /// Keys of entries whose state is unknown (unreadable), with everything
    /// below them: nothing there may be judged deleted.
    pub unknown: Vec<Vec<u8>>,
    /// Special files (fifos, sockets, devices), skipped. Their keys are
    /// also unknown: the path is left alone on both sides.
    pub skipped: Vec<Vec<u8>>,
    /// ferry's own temporaries left by a killed run: never synced, removed
    /// by the next real run.
    pub temps: Vec<(Vec<u8>, Meta)>,
}

/// A whole tree, listed: the reference merge's input, in tests.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct Tree {
    /// Each directory's entries by its relative path, in name order.
    pub dirs: std::collections::HashMap<Vec<u8>, Listing>,
    /// Number of entries in `dirs`.
    pub count: usize,
    /// Keys of unreadable entries.
    pub unknown: Vec<Vec<u8>>,
}

#[cfg(test)]
impl Tree {
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

    /// A tree holding `entries` (keys with their metadata, any order).
    pub fn of(entries: &[(Vec<u8>, Meta)]) -> Tree {
        let mut v: Vec<&(Vec<u8>, Meta)> = entries.iter().collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        let mut s = Tree::default();
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

/// Reports a path that could not be listed or read.
pub type OnError<'a> = &'a (dyn Fn(&[u8], &io::Error) + Sync);

/// What becomes of paths found in sync that the journal does not know as
/// such yet (records only).
pub enum InSync<'a> {
    /// Kept in the plan: the executor writes them after the refusal checks.
    Keep,
    /// Only counted (a dry run writes nothing).
    Count,
    /// Written during the scan, each directory's at once when it completes
    /// (a first run, whose journal was just cleared).
    Write(&'a mpsc::SyncSender<Update>),
}

/// How to scan.
pub struct ScanOpts<'a, A: Store, B: Store> {
    /// What the stores are like.
    pub sides: Sides,
    /// Worker threads.
    pub jobs: usize,
    /// Exclude rules.
    pub filter: Option<&'a Filter>,
    /// Files in sync by metadata get their bytes compared ([`Act::Check`]).
    pub checksum: bool,
    /// Where errors go (their keys become unknown).
    pub on_error: OnError<'a>,
    /// Compare contents during the scan (A's files against B's) and plan
    /// the outcome; `None` leaves [`Act::Compare`] and [`Act::Check`] in the
    /// plan.
    pub compare: Option<&'a Copier<'a, A, B>>,
    /// Records of paths found in sync.
    pub in_sync: InSync<'a>,
    /// Stop at the root when both roots hold entries: the run is refused
    /// then (no journal), and nothing more is needed.
    pub stop_if_both_hold: bool,
    /// Entries never synced (kept versions and backups).
    pub reserved: Reserved<'a>,
    /// A signal asked the run to stop: no further directory is listed
    /// (what was scanned is then only a part: nothing may act on it).
    pub stopping: &'a (dyn Fn() -> bool + Sync),
}

/// What a run keeps beside the synced tree, never synced on either side:
/// kept versions ([`ferry_engine::keep::VERSIONS_DIR`], at any depth),
/// either side's backup directory inside its root, and with `--suffix`
/// alone the names it protects. Left out of both listings: never copied,
/// deleted or recorded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reserved<'a> {
    /// Each side's keeper (`None`: nothing kept there).
    pub keep: [Option<&'a Keeper>; 2],
}

impl Reserved<'_> {
    /// True for the entry `name` of directory `rel` (a `/` path).
    pub fn holds(&self, rel: &[u8], name: &[u8]) -> bool {
        is_versions_dir(name)
            || self.keep.iter().flatten().any(|k| {
                k.protects(name)
                    || k.inside_root().is_some_and(|p| {
                        let (dir, last) = ferry_engine::keep::split_parent(p);
                        last == name && dir == rel
                    })
            })
    }
}

/// A listed directory, kept open for its subdirectories, and its listing.
type Opened<D> = (Arc<D>, Listing);

/// What one side's scan gathers.
struct Gather<S: Store> {
    root: Mutex<Option<S::Dir>>,
    /// The root once listed (what a hint given before the walk was given
    /// for, withdrawn after it: [`expect_dirs`]).
    listed_root: Mutex<Option<Arc<S::Dir>>>,
    unknown: Mutex<Vec<Vec<u8>>>,
    /// Keys listed beside an error of the same name (see [`Ctx::shadowed`]).
    shadowed: Mutex<Vec<Vec<u8>>>,
    temps: Mutex<Vec<(Vec<u8>, Meta)>>,
    skipped: Mutex<Vec<Vec<u8>>>,
}

impl<S: Store> Gather<S> {
    fn new(root: Option<S::Dir>) -> Self {
        Gather {
            root: Mutex::new(root),
            listed_root: Mutex::new(None),
            unknown: Mutex::new(Vec::new()),
            shadowed: Mutex::new(Vec::new()),
            temps: Mutex::new(Vec::new()),
            skipped: Mutex::new(Vec::new()),
        }
    }

    /// List one directory; returns it, open, and its listing.
    fn list(
        &self,
        store: &S,
        rel: &[u8],
        parent: Option<Arc<S::Dir>>,
        on_error: OnError<'_>,
        reserved: &Reserved<'_>,
    ) -> Option<Opened<S::Dir>> {
        let dir = match &parent {
            None => self.root.lock().take().expect("root once"),
            Some(p) => {
                let name = CString::new(name_of_path(rel)).expect("names hold no NUL");
                // Its listing asked with its open (one round trip on a
                // link), or taken from those opened ahead.
                match store.open_dir_to_list(p, &name) {
                    Ok(d) => d,
                    Err(e) => {
                        on_error(rel, &e);
                        self.unknown.lock().push(key_of(rel));
                        return None;
                    }
                }
            }
        };
        let mut list = Listing::new();
        let mut errs: Vec<(Vec<u8>, ferry_engine::store::ListError)> = Vec::new();
        if let Err(e) = walk::list(store, &dir, rel, None, &mut list, &mut |p, e| {
            errs.push((p, e))
        }) {
            on_error(rel, &e);
            self.unknown.lock().push(key_of(rel));
            return None;
        }
        for (p, e) in errs {
            on_error(&p, &e.err);
            // An entry that is listed although its name has an error (an S3
            // object `a` beside objects `a/...`: the prefix is listed as a
            // directory, the object reported) is known: only what could
            // touch the other entry of that name is held back.
            let listed = list
                .entries()
                .iter()
                .any(|x| list.name(x) == e.name.as_slice());
            // Entries no path can name (`a//z`, `x/../y`): the whole
            // directory is unknown.
            if e.for_dir() {
                self.unknown.lock().push(key_of(rel));
            } else if listed {
                self.shadowed.lock().push(key_of(&p));
            } else {
                self.unknown.lock().push(key_of(&p));
            }
        }
        // Temporaries and special files are set aside here, so the
        // listing holds only what is synced.
        let odd = |e: &ferry_engine::entry::ListEntry, n: &[u8]| {
            e.meta.kind.is_special() || is_temp_name(n)
        };
        if list.entries().iter().any(|e| odd(e, list.name(e))) {
            for e in list.entries() {
                let name = list.name(e);
                if is_temp_name(name) {
                    let k = key_of(&join(rel, name));
                    self.temps.lock().push((k, e.meta));
                } else if e.meta.kind.is_special() {
                    let k = key_of(&join(rel, name));
                    self.unknown.lock().push(k.clone());
                    self.skipped.lock().push(k);
                }
            }
            list.retain_names(|n| !is_temp_name(n));
            list.retain(|e| !e.meta.kind.is_special());
        }
        // Kept versions and backups are no part of the replica.
        if list
            .entries()
            .iter()
            .any(|e| reserved.holds(rel, list.name(e)))
        {
            list.retain_names(|n| !reserved.holds(rel, n));
        }
        let dir = Arc::new(dir);
        if parent.is_none() {
            *self.listed_root.lock() = Some(dir.clone());
        }
        Some((dir, list))
    }

    /// The root, once listed.
    fn root_dir(&self) -> Option<Arc<S::Dir>> {
        self.listed_root.lock().take()
    }

    fn finish(self, count: usize) -> Scan {
        let mut scan = Scan {
            count,
            unknown: self.unknown.into_inner(),
            skipped: self.skipped.into_inner(),
            temps: self.temps.into_inner(),
        };
        scan.unknown.sort();
        scan.skipped.sort();
        scan.temps.sort_by(|x, y| x.0.cmp(&y.0));
        scan
    }
}

/// One directory to visit: listed on the sides that hold it (each with its
/// open parent; `None` for the root), merged with its records.
struct DirTask<A: Store, B: Store> {
    rel: Vec<u8>,
    a: Option<Option<Arc<A::Dir>>>,
    b: Option<Option<Arc<B::Dir>>>,
}

/// A directory whose contents are being compared: its records in sync
/// wait for the last comparison, then are written together.
struct Pending<A: Store, B: Store> {
    key: Vec<u8>,
    da: Arc<A::Dir>,
    db: Arc<B::Dir>,
    /// Comparison batches not done yet.
    left: AtomicUsize,
    recs: Mutex<Vec<(Vec<u8>, Synced)>>,
}

/// Children of one directory to compare, A's bytes against B's.
struct Compare<A: Store, B: Store> {
    dir: Arc<Pending<A, B>>,
    items: Vec<Item>,
}

/// Comparisons per pool task at most.
const COMPARE_BATCH: usize = 64;

/// What the walk gathers.
#[derive(Default)]
struct State {
    /// Paths with work.
    items: Vec<Item>,
    unchanged: u64,
    recorded: u64,
    count: [usize; 2],
    /// Records of files and symlinks, and of directories, read.
    known: (u64, u64),
    /// Hashes of the keys of the directories whose records were read (all
    /// directories visited, in the pass over directories no walk reached).
    visited: HashSet<u64>,
    /// Why the walk stopped: the journal could not be read, or a
    /// directory showed up again under another name (a refusal).
    failed: Option<Refused>,
}

fn key_hash(key: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The scan as a walk of both stores.
struct Walker<'a, A: Store, B: Store> {
    a: &'a A,
    b: &'a B,
    j: &'a dyn Records,
    o: &'a ScanOpts<'a, A, B>,
    ga: Gather<A>,
    gb: Gather<B>,
    st: Mutex<State>,
    /// Visiting directories below which no walk went (see [`scan_merge`]).
    orphans: AtomicBool,
    /// A scoped walk ([`scan_scoped`]); `None`: the whole tree.
    scope: Option<Scoping>,
    /// Both roots and the directories above them, by device and inode: one
    /// met again in a listing refuses the run (`walk::Aliases`).
    aliases: Option<walk::Aliases>,
}

/// What a scoped walk keeps: where it goes deep, and where it has been.
struct Scoping {
    /// Keys of the directories walked whole (sorted).
    deep: Vec<Vec<u8>>,
    /// Keys of the directories visited (each once).
    seen: Mutex<HashSet<Vec<u8>>>,
}

type Q<'q, A, B> = Queue<'q, DirTask<A, B>, Compare<A, B>>;

impl<A: Store, B: Store> Visitor for Walker<'_, A, B> {
    type Dir = DirTask<A, B>;
    type Work = Compare<A, B>;

    fn dir(&self, t: DirTask<A, B>, q: &Q<'_, A, B>) {
        let o = self.o;
        if (o.stopping)() {
            return q.stop();
        }
        let key = key_of(&t.rel);
        if let Some(sc) = &self.scope {
            if !sc.seen.lock().insert(key.clone()) {
                return;
            }
        }
        let orphans = self.orphans.load(Ordering::Relaxed);
        let recs = match self.j.dir(&key) {
            Ok(r) => r,
            Err(e) => {
                self.st.lock().failed = Some(e.into());
                return q.stop();
            }
        };
        {
            let mut st = self.st.lock();
            if (orphans || !recs.is_empty()) && !st.visited.insert(key_hash(&key)) {
                return;
            }
            st.known.0 += recs.files();
            st.known.1 += recs.len() as u64 - recs.files();
        }
        let la =
            t.a.and_then(|p| self.ga.list(self.a, &t.rel, p, o.on_error, &o.reserved))
                .map(|(d, l)| self.exact(self.a, Side::A, &t.rel, d, l, &recs))
                .map(|(d, l)| (d, filtered(o.filter, &self.ga.unknown, &t.rel, l)));
        let lb =
            t.b.and_then(|p| self.gb.list(self.b, &t.rel, p, o.on_error, &o.reserved))
                .map(|(d, l)| self.exact(self.b, Side::B, &t.rel, d, l, &recs))
                .map(|(d, l)| (d, filtered(o.filter, &self.gb.unknown, &t.rel, l)));
        if let Some(al) = &self.aliases {
            let seen = la
                .as_ref()
                .and_then(|(_, l)| al.check("A", &t.rel, l))
                .or_else(|| lb.as_ref().and_then(|(_, l)| al.check("B", &t.rel, l)));
            if let Some(msg) = seen {
                self.st.lock().failed.get_or_insert(Refused(msg));
                return q.stop();
            }
        }
        let na = la.as_ref().map_or(0, |(_, l)| l.len());
        let nb = lb.as_ref().map_or(0, |(_, l)| l.len());
        if t.rel.is_empty() && o.stop_if_both_hold && na > 0 && nb > 0 {
            self.st.lock().count = [na, nb];
            return q.stop();
        }
        let empty = Listing::new();
        let mut out = DirMerged::default();
        merge_dir(
            &self.ctx(),
            &key,
            la.as_ref().map_or(&empty, |(_, l)| l),
            lb.as_ref().map_or(&empty, |(_, l)| l),
            &recs,
            &mut out,
        );
        drop(recs);
        // Subdirectories of either side (or only the journal's), in name
        // order; a scoped walk goes only into those with something to do
        // themselves (new, gone, replaced on a side) or below a deep one.
        self.scoped_subdirs(&key, &mut out);
        let subdirs: Vec<DirTask<A, B>> = out
            .subdirs
            .iter()
            .map(|(name, listed)| DirTask {
                rel: join(&t.rel, name),
                a: listed[0].then(|| la.as_ref().map(|(d, _)| d.clone())),
                b: listed[1].then(|| lb.as_ref().map(|(d, _)| d.clone())),
            })
            .collect();
        let mut work = Vec::new();
        let mut cmp = Vec::new();
        let mut recs = Vec::new();
        let mut recorded = 0;
        for it in out.items {
            match it.act {
                Act::Compare | Act::Check if o.compare.is_some() => cmp.push(it),
                _ => recorded += self.place(it, &mut work, &mut recs),
            }
        }
        {
            let mut st = self.st.lock();
            st.count[0] += na;
            st.count[1] += nb;
            st.unchanged += out.unchanged;
            st.recorded += recorded;
            st.items.append(&mut work);
        }
        match (cmp.is_empty(), la, lb) {
            (false, Some((da, _)), Some((db, _))) => {
                let batches: Vec<Vec<Item>> =
                    cmp.chunks(COMPARE_BATCH).map(<[Item]>::to_vec).collect();
                let dir = Arc::new(Pending {
                    key,
                    da,
                    db,
                    left: AtomicUsize::new(batches.len()),
                    recs: Mutex::new(recs),
                });
                for items in batches {
                    q.work(Compare {
                        dir: dir.clone(),
                        items,
                    });
                }
            }
            _ => self.in_sync(key, recs),
        }
        q.dirs(subdirs);
    }

    fn work(&self, c: Compare<A, B>, _: &Q<'_, A, B>) {
        let cp = self.o.compare.expect("compare tasks compare");
        let (da, db) = (&*c.dir.da, &*c.dir.db);
        let mut work = Vec::new();
        let mut recs = Vec::new();
        let mut recorded = 0;
        for mut it in c.items {
            let ma = it.a.expect("both");
            let name = CString::new(name_of(&it.key)).expect("names hold no NUL");
            let same = if ma.kind == Kind::Symlink {
                self.a
                    .read_link(da, &name)
                    .and_then(|x| Ok(x == self.b.read_link(db, &name)?))
            } else {
                cp.same_content(da, &name, db, &name, ma.size)
            };
            it.act = match same {
                Ok(same) => compared(&it, same),
                Err(e) => {
                    (self.o.on_error)(&path_of(&it.key), &e);
                    Act::Skip
                }
            };
            recorded += self.place(it, &mut work, &mut recs);
        }
        {
            let mut st = self.st.lock();
            st.recorded += recorded;
            st.items.append(&mut work);
        }
        let mut mine = c.dir.recs.lock();
        mine.append(&mut recs);
        drop(mine);
        if c.dir.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let recs = std::mem::take(&mut *c.dir.recs.lock());
            self.in_sync(c.dir.key.clone(), recs);
        }
    }
}

impl<A: Store, B: Store> Walker<'_, A, B> {
    /// What the merge of a directory reads of this walk.
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            sides: self.o.sides,
            unknown: [&self.ga.unknown, &self.gb.unknown],
            shadowed: [&self.ga.shadowed, &self.gb.shadowed],
            checksum: self.o.checksum,
        }
    }

    /// In a scoped walk, the subdirectories of `out` to go into: those
    /// with something to do themselves (new, gone, replaced on a side) or
    /// below a deep directory of the scope.
    fn scoped_subdirs(&self, key: &[u8], out: &mut DirMerged) {
        if let Some(sc) = &self.scope {
            let mut ck = key.to_vec();
            if !ck.is_empty() {
                ck.push(0);
            }
            let base = ck.len();
            let acted: HashSet<&[u8]> = out.items.iter().map(|it| name_of(&it.key)).collect();
            out.subdirs.retain(|(name, _)| {
                ck.truncate(base);
                ck.extend_from_slice(name);
                acted.contains(name.as_slice()) || under_any(&sc.deep, &ck)
            });
        }
    }

    /// Where a decided item goes: a path found in sync (a record only) is
    /// kept, counted or set aside in `recs` to be written, as `in_sync`
    /// says; anything else is work. Returns 1 for a record not kept.
    fn place(&self, it: Item, work: &mut Vec<Item>, recs: &mut Vec<(Vec<u8>, Synced)>) -> u64 {
        match (&it.act, &self.o.in_sync) {
            (Act::Record, InSync::Count) => 1,
            (Act::Record, InSync::Write(_)) => {
                recs.push((name_of(&it.key).to_vec(), record_of(&it)));
                1
            }
            _ => {
                work.push(it);
                0
            }
        }
    }

    /// A directory's records of paths in sync, complete.
    fn in_sync(&self, key: Vec<u8>, mut recs: Vec<(Vec<u8>, Synced)>) {
        if let (InSync::Write(tx), false) = (&self.o.in_sync, recs.is_empty()) {
            recs.sort_by(|x, y| x.0.cmp(&y.0));
            let _ = tx.send(Update::Dir(key, recs));
        }
    }

    /// Make exact the approximate metadata of an object store's listing of
    /// directory `rel` (sizes are exact; mtimes and modes live in object
    /// metadata): a file whose size and version fingerprint (`Meta::version`)
    /// are those the journal recorded for this side is unchanged since the
    /// last sync and takes the recorded metadata; only the others are asked
    /// for theirs ([`Store::refine`]: a HEAD each). A no-op run then makes
    /// no request beyond the listing. Entries that cannot be asked are
    /// unknown.
    fn exact<S: Store>(
        &self,
        s: &S,
        side: Side,
        rel: &[u8],
        d: Arc<S::Dir>,
        mut l: Listing,
        recs: &DirRecs,
    ) -> Opened<S::Dir> {
        if !s.features().approximate_meta {
            return (d, l);
        }
        let mut recs = recs.iter().peekable();
        let mut which = Vec::new();
        {
            let (names, ents) = l.parts_mut();
            for (i, e) in ents.iter_mut().enumerate() {
                if e.meta.kind != Kind::File {
                    continue;
                }
                let (o, n) = e.name_span();
                let name = &names[o..o + n];
                while recs.next_if(|(rn, _)| *rn < name).is_some() {}
                let rec = recs
                    .next_if(|(rn, _)| *rn == name)
                    .map(|(_, s)| *s.side(side));
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
            let unknown = match side {
                Side::A => &self.ga.unknown,
                Side::B => &self.gb.unknown,
            };
            let mut errors = Vec::new();
            if let Err(e) = s.refine(&d, &mut l, &which, &mut errors) {
                (self.o.on_error)(rel, &e);
                unknown.lock().push(key_of(rel));
            }
            for e in errors {
                let p = join(rel, &e.name);
                (self.o.on_error)(&p, &e.err);
                unknown.lock().push(key_of(&p));
            }
        }
        (d, l)
    }
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
                unknown.lock().push(key_of(&join(rel, name)));
            }
        });
    }
    l
}

/// Walk two stores at once on one pool and merge each directory with the
/// journal's records of it (`j`) as it is listed. A root given as `None`
/// does not exist (yet): that side is empty. Per-entry errors are reported
/// through `o.on_error` and make their keys unknown.
///
/// Each directory is one task: its records read from the journal, its
/// listing on A and on B, its merge ([`merge_dir`]), the comparisons it
/// needs queued as tasks of their own, then its subdirectories. Records
/// below directories no side lists and the journal does not name as
/// directories (a journal from a killed run can hold those) are merged in
/// a second pass over the directories the journal holds that the walk did
/// not visit. Errors (refusals): the journal could not be read, or one
/// directory was reached under two names.
pub fn scan_merge<A: Store, B: Store>(
    a: (&A, Option<A::Dir>),
    b: (&B, Option<B::Dir>),
    j: &dyn Records,
    o: &ScanOpts<'_, A, B>,
) -> Result<(Plan, Scan, Scan), Refused> {
    let root = (a.1.is_some(), b.1.is_some());
    let hinted = [
        expect_dirs(a.0, a.1.as_ref(), j, o.filter),
        expect_dirs(b.0, b.1.as_ref(), j, o.filter),
    ];
    let w = Walker {
        a: a.0,
        b: b.0,
        j,
        o,
        ga: Gather::<A>::new(a.1),
        gb: Gather::<B>::new(b.1),
        st: Mutex::new(State::default()),
        orphans: AtomicBool::new(false),
        scope: None,
        aliases: walk::Aliases::new(["A", "B"], [a.0.root_ids(), b.0.root_ids()]),
    };
    let jobs = o.jobs.max(2);
    walk::walk(
        &w,
        jobs,
        vec![DirTask {
            rel: Vec::new(),
            a: root.0.then_some(None),
            b: root.1.then_some(None),
        }],
    );
    // What was opened ahead and not taken is let go.
    if hinted[0] {
        if let Some(d) = w.ga.root_dir() {
            a.0.expect_dirs(&d, &[]);
        }
    }
    if hinted[1] {
        if let Some(d) = w.gb.root_dir() {
            b.0.expect_dirs(&d, &[]);
        }
    }
    let stopped = {
        let mut st = w.st.lock();
        if let Some(e) = st.failed.take() {
            return Err(e);
        }
        o.stop_if_both_hold && st.count[0] > 0 && st.count[1] > 0
    };
    if !stopped {
        let mut orphans = Vec::new();
        {
            let st = w.st.lock();
            j.each_dir(&mut |d| {
                if !st.visited.contains(&key_hash(d)) {
                    orphans.push(DirTask {
                        rel: path_of(d),
                        a: None,
                        b: None,
                    });
                }
            })
            .map_err(Refused::from)?;
        }
        if !orphans.is_empty() {
            w.orphans.store(true, Ordering::Relaxed);
            walk::walk(&w, jobs, orphans);
            if let Some(e) = w.st.lock().failed.take() {
                return Err(e);
            }
        }
    }
    Ok(w.into_plan())
}

/// Before the walk, for a side whose store waits on a link
/// ([`Features::latency_bound`](ferry_engine::store::Features)): the
/// directories the journal holds records in (where the last run found
/// them, parents first, at most [`HINT_DIRS`](ferry_engine::prefetch::HINT_DIRS),
/// none the filter leaves out), told to its store
/// ([`StoreExt::expect_dirs`]): over ssh they are opened and listed now,
/// all levels in one round trip, instead of one round trip per level as
/// the walk reaches them. The scan changes nothing, so a listing taken
/// from there is one made a moment earlier. True when a hint was given
/// (withdrawn after the walk).
fn expect_dirs<S: Store>(
    s: &S,
    root: Option<&S::Dir>,
    j: &dyn Records,
    filter: Option<&Filter>,
) -> bool {
    use ferry_engine::prefetch::HINT_DIRS;
    let Some(root) = root.filter(|_| s.features().latency_bound) else {
        return false;
    };
    let mut dirs = Vec::new();
    // (A journal that cannot be read gives no hint; the walk says why.)
    let _ = j.each_dir(&mut |k| {
        let rel = path_of(k);
        if dirs.len() < HINT_DIRS
            && !rel.is_empty()
            && ferry_engine::engine::walks_into(filter, &rel)
        {
            dirs.push(rel);
        }
    });
    if dirs.is_empty() {
        return false;
    }
    s.expect_dirs(root, &dirs);
    true
}

impl<A: Store, B: Store> Walker<'_, A, B> {
    /// The plan of what the walk found, and each side's scan.
    fn into_plan(self) -> (Plan, Scan, Scan) {
        let mut st = self.st.into_inner();
        st.items.sort_by(|x, y| x.key.cmp(&y.key));
        let plan = Plan {
            items: st.items,
            scanned: (st.count[0] + st.count[1]) as u64,
            unchanged: st.unchanged,
            recorded: st.recorded,
            deletes: [0; 2],
            known: [st.known.0; 2],
            known_dirs: st.known.1,
            dir_deletes: [0; 2],
            sides: self.o.sides,
        };
        (
            plan,
            self.ga.finish(st.count[0]),
            self.gb.finish(st.count[1]),
        )
    }
}

mod scoped;

use scoped::name_of_path;
pub use scoped::{scan_scoped, under_any, ScopeDirs};

#[cfg(test)]
mod tests;
