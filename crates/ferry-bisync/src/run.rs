//! The executor: scan both sides (and load the journal) at once, plan,
//! then carry the plan out over any two [`Store`]s, recording each
//! completed action in the journal.
//!
//! Order of work, chosen so that nothing is ever overwritten or deleted
//! before what must survive is safe:
//! 1. conflicts: the losing version moves to its conflict name on its own
//!    side (a rename, which loses nothing);
//! 2. directories are created, parents first;
//! 3. renames seen on one side are replayed on the other;
//! 4. files, symlinks and metadata are copied, in parallel on the pool;
//! 5. deletions: files in parallel, then directories deepest first, each
//!    only if empty;
//! 6. files that replace a directory (now empty) are copied.
//!
//! Right before an entry is replaced or deleted, it is stat'ed again and
//! must still be what the plan saw (unchanged since the last sync); if it
//! changed during the run it is left alone and reported, and the next run
//! sees the change.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ferry_engine::pool::Pool;
use ferry_engine::store::MetaChange;
use ferry_engine::{Filter, Kind, Meta, Stats, Store};

use crate::journal::{Journal, Snapshot, Update};
use crate::plan::{finish, still, Act, Item, Plan, Sides};
use crate::reconcile::{Side, Synced};
use crate::tree::{name_of, parent_key, path_of, scan_merge};

/// Options of a bisync run.
#[derive(Debug)]
pub struct Options {
    /// Plan and report, change nothing (not even the journal).
    pub dry_run: bool,
    /// Propagate deletions beyond the limit.
    pub force: bool,
    /// Most deletions propagated to one side without `force`, in percent of
    /// the files and symlinks the journal knows.
    pub max_delete: u8,
    /// Forget the journal and merge both trees as on a first run.
    pub resync: bool,
    /// Worker threads.
    pub jobs: usize,
    /// Exclude rules (excluded entries are neither copied nor deleted).
    pub filter: Option<Filter>,
    /// fsync each file before it is named.
    pub fsync: bool,
}

/// What happened (or would happen) to one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BiAction {
    /// A file new to the target side was copied.
    Copy,
    /// A file replaced the target side's older version.
    Update,
    /// A directory was created.
    Mkdir,
    /// A symlink was created or replaced.
    Symlink,
    /// An entry was deleted.
    Delete,
    /// An entry was renamed (replaying the other side's rename).
    Rename,
    /// Only mtime and mode were set.
    Meta,
    /// Both sides changed: one version moved to a conflict name.
    Conflict,
    /// An entry the target cannot hold (symlink on S3, special file).
    Skip,
}

impl BiAction {
    /// Lower-case name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            BiAction::Copy => "copy",
            BiAction::Update => "update",
            BiAction::Mkdir => "mkdir",
            BiAction::Symlink => "symlink",
            BiAction::Delete => "delete",
            BiAction::Rename => "rename",
            BiAction::Meta => "meta",
            BiAction::Conflict => "conflict",
            BiAction::Skip => "skip",
        }
    }
}

/// Receives actions and errors from any thread.
pub trait BiReporter: Sync {
    /// `act` was done on side `on` at `path`; `other` is the old path of a
    /// rename or the conflict name of a conflict.
    fn action(&self, act: BiAction, on: Side, path: &[u8], other: Option<&[u8]>, size: u64);
    /// One path failed; the run goes on.
    fn error(&self, path: &[u8], err: &io::Error);
}

/// Counters of a run besides the engine's [`Stats`].
#[derive(Debug, Default)]
struct Counts {
    renamed: AtomicU64,
    conflicts: AtomicU64,
}

/// The result of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Entries listed on both sides.
    pub entries_scanned: u64,
    /// Files and symlinks written.
    pub files_copied: u64,
    /// File bytes written.
    pub bytes_copied: u64,
    /// Entries deleted.
    pub files_deleted: u64,
    /// Directories created.
    pub dirs_created: u64,
    /// Renames replayed.
    pub renamed: u64,
    /// Conflicts (both versions kept).
    pub conflicts: u64,
    /// Paths in sync that needed nothing.
    pub unchanged: u64,
    /// Paths that failed.
    pub errors: u64,
    /// Wall time.
    pub elapsed_s: f64,
}

/// Why a run stopped before changing anything.
#[derive(Debug)]
pub struct Refused(pub String);

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Open directories of one side, by key (opened once each).
struct Dirs<S: Store> {
    root: Arc<S::Dir>,
    map: Mutex<HashMap<Vec<u8>, Arc<S::Dir>>>,
}

fn cname(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

impl<S: Store> Dirs<S> {
    fn new(root: S::Dir) -> Self {
        Dirs {
            root: Arc::new(root),
            map: Mutex::new(HashMap::new()),
        }
    }

    fn dir(&self, s: &S, key: &[u8]) -> io::Result<Arc<S::Dir>> {
        if key.is_empty() {
            return Ok(self.root.clone());
        }
        if let Some(d) = self.map.lock().unwrap().get(key) {
            return Ok(d.clone());
        }
        let parent = self.dir(s, parent_key(key).unwrap_or(b""))?;
        let d = Arc::new(s.open_dir(&parent, &cname(name_of(key))?)?);
        self.map.lock().unwrap().insert(key.to_vec(), d.clone());
        Ok(d)
    }

    /// The directory holding `key` and the entry's name in it.
    fn at(&self, s: &S, key: &[u8]) -> io::Result<(Arc<S::Dir>, CString)> {
        Ok((
            self.dir(s, parent_key(key).unwrap_or(b""))?,
            cname(name_of(key))?,
        ))
    }

    fn forget(&self, key: &[u8]) {
        self.map
            .lock()
            .unwrap()
            .retain(|k, _| !(k == key || (k.starts_with(key) && k.get(key.len()) == Some(&0))));
    }
}

/// A dry run, or a real one with the journal's sender.
struct Exec<'r, A: Store, B: Store> {
    a: &'r A,
    b: &'r B,
    da: Dirs<A>,
    db: Dirs<B>,
    opts: &'r Options,
    rep: &'r dyn BiReporter,
    counts: Counts,
    /// Shared with the caller (a progress display reads it while we run).
    stats: &'r Stats,
    tx: Option<mpsc::Sender<Update>>,
}

/// `$body` with `$st` and `$dc` bound to one side's store and directories.
macro_rules! on_side {
    ($self:expr, $side:expr, |$st:ident, $dc:ident| $body:expr) => {
        match $side {
            Side::A => {
                let $st = $self.a;
                let $dc = &$self.da;
                $body
            }
            Side::B => {
                let $st = $self.b;
                let $dc = &$self.db;
                $body
            }
        }
    };
}

/// `$body` with the source side (`$s`, `$sd`) and the target side (`$d`, `$dd`).
macro_rules! between {
    ($self:expr, $from:expr, |$s:ident, $sd:ident, $d:ident, $dd:ident| $body:expr) => {
        match $from {
            Side::A => {
                let ($s, $sd, $d, $dd) = ($self.a, &$self.da, $self.b, &$self.db);
                $body
            }
            Side::B => {
                let ($s, $sd, $d, $dd) = ($self.b, &$self.db, $self.a, &$self.da);
                $body
            }
        }
    };
}

/// Metadata standing for a directory in the journal (only its kind counts).
fn dir_rec(m: Option<&Meta>) -> Meta {
    Meta {
        kind: Kind::Dir,
        size: 0,
        mtime_sec: 0,
        mtime_nsec: 0,
        mode: m.map_or(0, |m| m.mode),
        uid: 0,
        gid: 0,
        ino: 0,
    }
}

fn synced(side: Side, mine: Meta, other: Meta) -> Synced {
    match side {
        Side::A => Synced { a: mine, b: other },
        Side::B => Synced { a: other, b: mine },
    }
}

fn changed_err() -> io::Error {
    io::Error::other("changed during the run; left alone (the next run sees it)")
}

/// Run a two-way sync between `a` and `b`. `journal`: `None` only for a
/// dry run without a journal file. `Err(Refused)`: nothing was changed.
/// `stats` is counted into as work completes (for a progress display).
pub fn run<A: Store, B: Store>(
    a: &A,
    b: &B,
    journal: Option<&mut Journal>,
    opts: &Options,
    rep: &dyn BiReporter,
    stats: &Stats,
) -> Result<Outcome, Refused> {
    let start = Instant::now();
    let mut journal = journal;
    if opts.resync && !opts.dry_run {
        if let Some(j) = journal.as_deref_mut() {
            j.clear().map_err(Refused)?;
        }
    }
    let (ra, rb) = (root(a, "A", opts)?, root(b, "B", opts)?);
    let fail = |p: &[u8], e: &io::Error| rep.error(p, e);
    // Both trees are listed on the pool while another thread loads the
    // journal, and merged with it as the listings come in: on a no-op run,
    // that is all the work there is.
    let (ca, cb) = (clone_dir(a)?, clone_dir(b)?);
    let sides = Sides {
        implicit_dirs: [!a.has_dir_meta(), !b.has_dir_meta()],
        inodes: [a.has_inodes(), b.has_inodes()],
    };
    let jr = journal.as_deref_mut().filter(|_| !opts.resync);
    let load = move || jr.map_or_else(|| Ok(Snapshot::default()), |j| j.load());
    let (mut plan, mut sa, mut sb) = scan_merge(
        (a, ca),
        (b, cb),
        load,
        sides,
        opts.jobs,
        opts.filter.as_ref(),
        &fail,
    )
    .map_err(Refused)?;
    Stats::add(&stats.entries_scanned, plan.scanned);
    let ex = Exec {
        a,
        b,
        da: Dirs::new(ra),
        db: Dirs::new(rb),
        opts,
        rep,
        counts: Counts::default(),
        stats,
        tx: None,
    };
    for (scan, side) in [(&sa, Side::A), (&sb, Side::B)] {
        for k in &scan.skipped {
            rep.action(BiAction::Skip, side, &path_of(k), None, 0);
        }
    }
    let temps = [std::mem::take(&mut sa.temps), std::mem::take(&mut sb.temps)];
    ex.compare_all(&mut plan);
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let verify = |x: Side, new: &[u8], old: &[u8]| {
        between!(ex, x, |s, sd, d, dd| same_content(s, sd, new, d, dd, old)).unwrap_or(false)
    };
    finish(&mut plan, &sa, &sb, &crate::plan::stamp(secs), &verify);
    drop((sa, sb));
    for (i, side) in [(0, "A"), (1, "B")] {
        let (del, known) = (plan.deletes[i], plan.known[i]);
        if !opts.force && known > 0 && del * 100 > known * opts.max_delete as u64 {
            return Err(Refused(format!(
                "refusing to delete {del} of {known} files on {side} (more than {}%); check the other side, then run again with --force",
                opts.max_delete
            )));
        }
    }
    for it in &plan.items {
        if let Act::Copy { from } = it.act {
            if let Some(m) = it.side(from).filter(|m| m.kind == Kind::File) {
                Stats::add(&stats.files_planned, 1);
                Stats::add(&stats.bytes_planned, m.size);
            }
        }
    }
    let ex = if opts.dry_run {
        ex.report_dry(&plan);
        ex
    } else {
        let (tx, rx) = mpsc::channel();
        let ex = Exec { tx: Some(tx), ..ex };
        let j = journal.expect("a real run has a journal");
        std::thread::scope(|s| {
            let w = s.spawn(move || j.write_from(rx));
            let mut ex = ex;
            ex.remove_temps(&temps);
            ex.execute(&plan);
            ex.tx = None;
            let res = w.join().expect("journal writer");
            if let Err(e) = res {
                ex.rep.error(b"", &io::Error::other(e));
                add(&ex.stats.errors, 1);
            }
            ex
        })
    };
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let c = &ex.counts;
    Ok(Outcome {
        entries_scanned: plan.scanned,
        files_copied: g(&ex.stats.files_copied),
        bytes_copied: g(&ex.stats.bytes_copied),
        files_deleted: g(&ex.stats.files_deleted),
        dirs_created: g(&ex.stats.dirs_created),
        renamed: g(&c.renamed),
        conflicts: g(&c.conflicts),
        // Paths found equal whose record was only written now count as unchanged.
        unchanged: plan.unchanged
            + plan.items.iter().filter(|it| it.act == Act::Record).count() as u64,
        errors: g(&ex.stats.errors),
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}

/// Open a root; a missing one is created on a real run.
fn root<S: Store>(s: &S, what: &str, opts: &Options) -> Result<S::Dir, Refused> {
    let e = |e: io::Error| Refused(format!("{what}: {e}"));
    match s.open_root().map_err(e)? {
        Some((d, m)) if m.kind == Kind::Dir => Ok(d),
        Some(_) => Err(Refused(format!("{what}: not a directory"))),
        None if opts.dry_run => Err(Refused(format!("{what}: does not exist"))),
        None => s.create_root().map_err(e),
    }
}

/// A second handle on a root (the scan consumes its own).
fn clone_dir<S: Store>(s: &S) -> Result<S::Dir, Refused> {
    match s.open_root() {
        Ok(Some((d, _))) => Ok(d),
        Ok(None) => Err(Refused("root vanished".into())),
        Err(e) => Err(Refused(e.to_string())),
    }
}

/// True when two files (or two symlinks) hold the same bytes.
fn same_content<S: Store, D: Store>(
    s: &S,
    sd: &Dirs<S>,
    skey: &[u8],
    d: &D,
    dd: &Dirs<D>,
    dkey: &[u8],
) -> io::Result<bool> {
    let (sdir, sname) = sd.at(s, skey)?;
    let (ddir, dname) = dd.at(d, dkey)?;
    let sm = s.stat(&sdir, &sname)?;
    if sm.is_some_and(|m| m.kind == Kind::Symlink) {
        return Ok(s.read_link(&sdir, &sname)? == d.read_link(&ddir, &dname)?);
    }
    let mut x = s.open_file(&sdir, &sname)?;
    let mut y = d.open_file(&ddir, &dname)?;
    ferry_engine::engine::same_bytes(&mut x, &mut y)
}

impl<A: Store, B: Store> Exec<'_, A, B> {
    fn fail(&self, key: &[u8], e: &io::Error) {
        add(&self.stats.errors, 1);
        self.rep.error(&path_of(key), e);
    }

    fn record(&self, u: Update) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(u);
        }
    }

    /// Resolve every [`Act::Compare`] by reading both sides (in parallel).
    fn compare_all(&self, plan: &mut Plan) {
        let todo: Vec<usize> = (0..plan.items.len())
            .filter(|&i| plan.items[i].act == Act::Compare)
            .collect();
        if todo.is_empty() {
            return;
        }
        let results: Mutex<Vec<(usize, Act)>> = Mutex::new(Vec::new());
        let items = &plan.items;
        let pool: Pool<usize> = Pool::new();
        pool.push_all(todo);
        pool.run(self.opts.jobs, |i, _| {
            let it = &items[i];
            let act = match same_content(self.a, &self.da, &it.key, self.b, &self.db, &it.key) {
                Ok(true) => {
                    let (ma, mb) = (it.a.expect("both"), it.b.expect("both"));
                    if ma.same_mtime(&mb) && (ma.mode == mb.mode || ma.kind == Kind::Symlink) {
                        Act::Record
                    } else {
                        // Same bytes: the newer mtime (and its mode) wins.
                        let from = if mb.mtime_ns() > ma.mtime_ns() {
                            Side::B
                        } else {
                            Side::A
                        };
                        Act::Meta { from }
                    }
                }
                Ok(false) => Act::Conflict {
                    loser: Side::B,
                    name: Vec::new(),
                },
                Err(e) => {
                    self.fail(&it.key, &e);
                    Act::Skip
                }
            };
            results.lock().unwrap().push((i, act));
        });
        for (i, act) in results.into_inner().unwrap() {
            plan.items[i].act = act;
        }
    }

    /// Report every planned action (`--dry-run`).
    fn report_dry(&self, plan: &Plan) {
        for it in &plan.items {
            let p = path_of(&it.key);
            match &it.act {
                Act::Copy { from } => {
                    let to = from.other();
                    let m = it.side(*from).expect("copied entries exist");
                    match m.kind {
                        Kind::Dir => {
                            if it.side(to).is_some_and(|t| t.kind != Kind::Dir) {
                                self.rep.action(BiAction::Delete, to, &p, None, 0);
                                add(&self.stats.files_deleted, 1);
                            }
                            add(&self.stats.dirs_created, 1);
                            self.rep.action(BiAction::Mkdir, to, &p, None, 0)
                        }
                        _ => {
                            add(&self.stats.files_copied, 1);
                            add(&self.stats.bytes_copied, m.size);
                            let act = match (m.kind, it.side(to)) {
                                (Kind::Symlink, _) => BiAction::Symlink,
                                (_, Some(_)) => BiAction::Update,
                                _ => BiAction::Copy,
                            };
                            self.rep.action(act, to, &p, None, m.size)
                        }
                    }
                }
                Act::Meta { from } => self.rep.action(BiAction::Meta, from.other(), &p, None, 0),
                Act::Delete { on } => {
                    add(&self.stats.files_deleted, 1);
                    self.rep.action(BiAction::Delete, *on, &p, None, 0)
                }
                Act::Rename { on, from } => {
                    add(&self.counts.renamed, 1);
                    let old = path_of(&plan.items[*from].key);
                    self.rep.action(BiAction::Rename, *on, &p, Some(&old), 0)
                }
                Act::Conflict { loser, name } => {
                    add(&self.counts.conflicts, 1);
                    self.rep
                        .action(BiAction::Conflict, *loser, &p, Some(&path_of(name)), 0)
                }
                Act::Record | Act::Forget | Act::RenamedAway | Act::Skip | Act::Compare => {}
            }
        }
    }

    /// Remove temporaries a killed run left (they are ferry's, never a user's).
    fn remove_temps(&self, temps: &[Vec<(Vec<u8>, Meta)>; 2]) {
        for (side, list) in [(Side::A, &temps[0]), (Side::B, &temps[1])] {
            for (key, m) in list {
                let res = on_side!(self, side, |st, dc| dc
                    .at(st, key)
                    .and_then(|(d, n)| st.remove(&d, &n, m.kind == Kind::Dir)));
                if let Err(e) = res {
                    if e.kind() != io::ErrorKind::NotFound {
                        self.fail(key, &e);
                    }
                }
            }
        }
    }

    /// Carry the plan out (see the module doc for the order).
    fn execute(&self, plan: &Plan) {
        let items = &plan.items;
        // Journal-only records first: they cost nothing.
        for it in items {
            match it.act {
                Act::Record => {
                    let (ma, mb) = (it.a.expect("both"), it.b.expect("both"));
                    let s = if ma.kind == Kind::Dir {
                        Synced {
                            a: dir_rec(Some(&ma)),
                            b: dir_rec(Some(&mb)),
                        }
                    } else {
                        Synced { a: ma, b: mb }
                    };
                    self.record(Update::Put(it.key.clone(), s));
                }
                Act::Forget => self.record(Update::Delete(it.key.clone())),
                _ => {}
            }
        }
        // 1. Conflicts: the loser moves aside; its copy and the winner's
        // travel with the other copies.
        let mut copies: Vec<Copy> = Vec::new();
        let mut deferred: Vec<Copy> = Vec::new();
        for it in items {
            if let Act::Conflict { loser, name } = &it.act {
                if let Some(c) = self.conflict(it, *loser, name) {
                    copies.extend(c);
                }
            }
        }
        // 2. Directories, parents first (key order).
        for it in items {
            if let Act::Copy { from } = it.act {
                if it.side(from).is_some_and(|m| m.kind == Kind::Dir) {
                    self.mkdir(it, from);
                }
            }
        }
        // 3. Renames.
        for it in items {
            if let Act::Rename { on, from } = it.act {
                if let Some(c) = self.rename(it, on, &items[from]) {
                    copies.push(c);
                }
            }
        }
        // 4. Copies and metadata.
        for it in items {
            match it.act {
                Act::Copy { from } => {
                    let m = *it.side(from).expect("copied entries exist");
                    if m.kind == Kind::Dir {
                        continue;
                    }
                    let c = Copy {
                        from,
                        src: it.key.clone(),
                        dst: it.key.clone(),
                        meta: m,
                        expect: it.side(from.other()).copied(),
                    };
                    if c.expect.is_some_and(|t| t.kind == Kind::Dir) {
                        deferred.push(c);
                    } else {
                        copies.push(c);
                    }
                }
                Act::Meta { from } => copies.push(Copy {
                    from,
                    src: it.key.clone(),
                    dst: Vec::new(),
                    meta: *it.side(from).expect("both"),
                    expect: it.side(from.other()).copied(),
                }),
                _ => {}
            }
        }
        self.run_copies(copies);
        // 5. Deletions: files in parallel, then directories deepest first.
        let files: Vec<usize> = (0..items.len())
            .filter(|&i| match items[i].act {
                Act::Delete { on } => items[i].side(on).is_some_and(|m| m.kind != Kind::Dir),
                _ => false,
            })
            .collect();
        let pool: Pool<usize> = Pool::new();
        pool.push_all(files);
        pool.run(self.opts.jobs, |i, _| {
            if let Act::Delete { on } = items[i].act {
                self.delete(&items[i], on);
            }
        });
        for it in items.iter().rev() {
            if let Act::Delete { on } = it.act {
                if it.side(on).is_some_and(|m| m.kind == Kind::Dir) {
                    self.delete(it, on);
                }
            }
        }
        // 6. Files replacing directories that are now empty.
        for c in &deferred {
            let to = c.from.other();
            let res = on_side!(self, to, |st, dc| {
                dc.at(st, &c.dst).and_then(|(d, n)| {
                    dc.forget(&c.dst);
                    st.rmdir(&d, &n)
                })
            });
            match res {
                Ok(()) => {
                    add(&self.stats.files_deleted, 1);
                    self.rep
                        .action(BiAction::Delete, to, &path_of(&c.dst), None, 0);
                    let c = Copy {
                        expect: None,
                        ..c.clone()
                    };
                    self.copy(&c);
                }
                Err(e) => self.fail(&c.dst, &e),
            }
        }
    }

    fn run_copies(&self, copies: Vec<Copy>) {
        let copies = &copies;
        let pool: Pool<usize> = Pool::new();
        pool.push_all((0..copies.len()).rev());
        pool.run(self.opts.jobs, |i, _| {
            let c = &copies[i];
            if c.dst.is_empty() {
                self.set_meta(c);
            } else {
                self.copy(c);
            }
        });
    }

    /// Move the loser aside; returns the copies that complete the conflict.
    fn conflict(&self, it: &Item, loser: Side, name: &[u8]) -> Option<Vec<Copy>> {
        let winner = loser.other();
        let lm = *it.side(loser).expect("conflicts have both sides");
        let wm = *it.side(winner).expect("conflicts have both sides");
        let res = on_side!(self, loser, |st, dc| {
            (|| {
                let (d1, n1) = dc.at(st, &it.key)?;
                let (d2, n2) = dc.at(st, name)?;
                st.rename(&d1, &n1, &d2, &n2)?;
                if lm.kind == Kind::Dir {
                    dc.forget(&it.key);
                }
                Ok::<_, io::Error>(())
            })()
        });
        if let Err(e) = res {
            self.fail(&it.key, &e);
            return None;
        }
        add(&self.counts.conflicts, 1);
        self.rep.action(
            BiAction::Conflict,
            loser,
            &path_of(&it.key),
            Some(&path_of(name)),
            0,
        );
        let mut out = vec![Copy {
            from: loser,
            src: name.to_vec(),
            dst: name.to_vec(),
            meta: lm,
            expect: None,
        }];
        if wm.kind == Kind::Dir {
            let tmp = Item {
                act: Act::Copy { from: winner },
                ..it.clone()
            };
            let tmp = match loser {
                Side::A => Item { a: None, ..tmp },
                Side::B => Item { b: None, ..tmp },
            };
            self.mkdir(&tmp, winner);
        } else {
            out.push(Copy {
                from: winner,
                src: it.key.clone(),
                dst: it.key.clone(),
                meta: wm,
                expect: None,
            });
        }
        Some(out)
    }

    /// Create a directory on the other side of `from` (replacing a file
    /// or symlink there that is unchanged since the last sync).
    fn mkdir(&self, it: &Item, from: Side) {
        let to = from.other();
        let m = *it.side(from).expect("dir exists");
        let old = it.side(to).copied();
        let res = on_side!(self, to, |st, dc| {
            (|| {
                let (d, n) = dc.at(st, &it.key)?;
                if let Some(o) = old.filter(|o| o.kind != Kind::Dir) {
                    if !still(st.stat(&d, &n)?.as_ref(), Some(&o)) {
                        return Err(changed_err());
                    }
                    st.remove(&d, &n, false)?;
                    add(&self.stats.files_deleted, 1);
                    self.rep
                        .action(BiAction::Delete, to, &path_of(&it.key), None, 0);
                }
                if old.is_some_and(|o| o.kind == Kind::Dir) {
                    return Ok(());
                }
                match st.make_dir(&d, &n) {
                    Ok(nd) => {
                        if st.has_dir_meta() {
                            st.set_dir_meta(
                                &nd,
                                &m,
                                MetaChange {
                                    mode: true,
                                    ..MetaChange::default()
                                },
                            )?;
                        }
                        dc.map.lock().unwrap().insert(it.key.clone(), Arc::new(nd));
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        if st.stat(&d, &n)?.map(|m| m.kind) != Some(Kind::Dir) {
                            return Err(e);
                        }
                    }
                    Err(e) => return Err(e),
                }
                Ok(())
            })()
        });
        match res {
            Ok(()) => {
                if !matches!(old, Some(o) if o.kind == Kind::Dir) {
                    add(&self.stats.dirs_created, 1);
                    self.rep
                        .action(BiAction::Mkdir, to, &path_of(&it.key), None, 0);
                }
                self.record(Update::Put(
                    it.key.clone(),
                    synced(from, dir_rec(Some(&m)), dir_rec(Some(&m))),
                ));
            }
            Err(e) => self.fail(&it.key, &e),
        }
    }

    /// Replay a rename on `on`; if the old entry changed there, copy instead.
    fn rename(&self, it: &Item, on: Side, old: &Item) -> Option<Copy> {
        let x = on.other();
        let xm = *it.side(x).expect("new path exists");
        let planned = old.side(on).copied();
        let res = on_side!(self, on, |st, dc| {
            (|| {
                let (d1, n1) = dc.at(st, &old.key)?;
                if !still(st.stat(&d1, &n1)?.as_ref(), planned.as_ref()) {
                    return Ok(None);
                }
                let (d2, n2) = dc.at(st, &it.key)?;
                st.rename(&d1, &n1, &d2, &n2)?;
                st.stat(&d2, &n2)
            })()
        });
        match res {
            Ok(Some(now)) => {
                add(&self.counts.renamed, 1);
                self.rep.action(
                    BiAction::Rename,
                    on,
                    &path_of(&it.key),
                    Some(&path_of(&old.key)),
                    0,
                );
                self.record(Update::Put(it.key.clone(), synced(x, xm, now)));
                self.record(Update::Delete(old.key.clone()));
                None
            }
            // Changed there meanwhile (the next run sees it), or no rename
            // on this store: copy the new path instead.
            Ok(None) => Some(self.copy_of(it, x, xm)),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Some(self.copy_of(it, x, xm)),
            Err(e) => {
                self.fail(&it.key, &e);
                None
            }
        }
    }

    fn copy_of(&self, it: &Item, from: Side, m: Meta) -> Copy {
        Copy {
            from,
            src: it.key.clone(),
            dst: it.key.clone(),
            meta: m,
            expect: None,
        }
    }

    /// Copy one file or symlink; the target must still be `expect`.
    fn copy(&self, c: &Copy) {
        let to = c.from.other();
        if c.meta.kind == Kind::Symlink && !on_side!(self, to, |st, _dc| st.supports_symlinks()) {
            self.rep
                .action(BiAction::Skip, to, &path_of(&c.dst), None, 0);
            return;
        }
        let res = between!(self, c.from, |s, sd, d, dd| copy_one(
            s,
            sd,
            d,
            dd,
            c,
            self.opts.fsync
        ));
        match res {
            Ok(now) => {
                add(&self.stats.files_copied, 1);
                add(&self.stats.bytes_copied, c.meta.size);
                let act = match (c.meta.kind, c.expect) {
                    (Kind::Symlink, _) => BiAction::Symlink,
                    (_, Some(_)) => BiAction::Update,
                    _ => BiAction::Copy,
                };
                self.rep
                    .action(act, to, &path_of(&c.dst), None, c.meta.size);
                self.record(Update::Put(c.dst.clone(), synced(c.from, c.meta, now)));
            }
            Err(e) => self.fail(&c.dst, &e),
        }
    }

    /// Give the other side `c.from`'s mtime and mode (same bytes).
    fn set_meta(&self, c: &Copy) {
        let to = c.from.other();
        let res = on_side!(self, to, |st, dc| {
            (|| {
                let (d, n) = dc.at(st, &c.src)?;
                if !still(st.stat(&d, &n)?.as_ref(), c.expect.as_ref()) {
                    return Err(changed_err());
                }
                st.set_meta(
                    &d,
                    &n,
                    &c.meta,
                    MetaChange {
                        mtime: true,
                        mode: c.meta.kind != Kind::Symlink,
                        owner: false,
                    },
                )?;
                st.stat(&d, &n)?
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
            })()
        });
        match res {
            Ok(now) => {
                self.rep
                    .action(BiAction::Meta, to, &path_of(&c.src), None, 0);
                self.record(Update::Put(c.src.clone(), synced(c.from, c.meta, now)));
            }
            Err(e) => self.fail(&c.src, &e),
        }
    }

    /// Delete an entry unchanged since the last sync (a directory only if empty).
    fn delete(&self, it: &Item, on: Side) {
        let planned = *it.side(on).expect("deleted entries exist");
        let res = on_side!(self, on, |st, dc| {
            (|| {
                let (d, n) = dc.at(st, &it.key)?;
                if planned.kind == Kind::Dir {
                    dc.forget(&it.key);
                    return st.rmdir(&d, &n);
                }
                if !still(st.stat(&d, &n)?.as_ref(), Some(&planned)) {
                    return Err(changed_err());
                }
                st.remove(&d, &n, false).map(|_| ())
            })()
        });
        match res {
            Ok(()) => {
                add(&self.stats.files_deleted, 1);
                self.rep
                    .action(BiAction::Delete, on, &path_of(&it.key), None, 0);
                self.record(Update::Delete(it.key.clone()));
            }
            // Something this run did not plan to delete is inside (an
            // excluded entry, or one that appeared): the directory stays.
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && planned.kind == Kind::Dir => {
                self.record(Update::Delete(it.key.clone()));
            }
            Err(e) => self.fail(&it.key, &e),
        }
    }
}

/// One file, symlink or metadata transfer.
#[derive(Clone, Debug)]
struct Copy {
    from: Side,
    src: Vec<u8>,
    /// Target key (empty: a metadata-only change of `src`).
    dst: Vec<u8>,
    /// The source entry as planned.
    meta: Meta,
    /// What the target holds as planned (`None`: nothing).
    expect: Option<Meta>,
}

/// Copy `c.src` of `s` to `c.dst` of `d` (temporary + commit, so never
/// visible half-written); returns the target's metadata afterwards.
fn copy_one<S: Store, D: Store>(
    s: &S,
    sd: &Dirs<S>,
    d: &D,
    dd: &Dirs<D>,
    c: &Copy,
    fsync: bool,
) -> io::Result<Meta> {
    let (sdir, sname) = sd.at(s, &c.src)?;
    let (ddir, dname) = dd.at(d, &c.dst)?;
    // The target must still be what the plan saw: absent, or unchanged
    // since the last sync.
    if !still(d.stat(&ddir, &dname)?.as_ref(), c.expect.as_ref()) {
        return Err(changed_err());
    }
    if c.meta.kind == Kind::Symlink {
        let target = s.read_link(&sdir, &sname)?;
        d.create_symlink(&ddir, &dname, &target, &c.meta)?;
    } else {
        let mut r = s.open_file(&sdir, &sname)?;
        let mut w = d.create_file(&ddir, &dname, &c.meta)?;
        let n = match d.write_from(&ddir, &mut w, &mut r, c.meta.size, None) {
            Ok(n) => n,
            Err(e) => {
                d.abort(&ddir, w);
                return Err(e);
            }
        };
        if n != c.meta.size {
            d.abort(&ddir, w);
            return Err(io::Error::other(format!(
                "changed while being copied (size {} when listed, {n} read); the next run copies it",
                c.meta.size
            )));
        }
        d.commit(&ddir, w, &dname, &c.meta, fsync)?;
        if let Some(m) = d.meta_after_commit(&c.meta) {
            return Ok(m);
        }
    }
    d.stat(&ddir, &dname)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "vanished after the copy"))
}
