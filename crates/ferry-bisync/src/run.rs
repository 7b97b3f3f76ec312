//! The executor: scan both sides with the journal (see [`crate::tree`]),
//! plan, then carry the plan out over any two [`Store`]s, recording each
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
//!
//! With a keeper on a side ([`Options::keep`]: `--versions`, `--backup-dir`,
//! `--suffix`), every file or symlink replaced or deleted there (an update,
//! a delete, a symlink or directory taking its place) is kept first, on
//! that side, at its path below that side's root; when keeping fails the
//! entry is left alone, the path fails and is not recorded as synced.
//!
//! The steps of a run: `run/pass.rs`; the executor's means, `run/exec.rs`;
//! its actions, `run/act.rs`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ferry_engine::bwlimit::Limiter;
use ferry_engine::copy::{Copier, FileCopy};
use ferry_engine::keep::Keeper;
use ferry_engine::pool::Pool;
use ferry_engine::special::SpecialBits;
use ferry_engine::store::StoreExt;
use ferry_engine::store::{op_err, op_of, End, MetaChange, Planned};
use ferry_engine::xattr::{XattrRun, XattrSel};
use ferry_engine::{Filter, Kind, Meta, Stats, Store};

use crate::journal::{Journal, NoRecords, Records, Update};
use crate::plan::{dir_rec, finish, record_of, still, Act, Candidate, Item, Plan, Sides};
use crate::reconcile::{Side, Synced};
use crate::tree::{
    name_of, parent_key, path_of, scan_merge, scan_scoped, InSync, Reserved, ScanOpts, ScopeDirs,
};

/// Options of a bisync run.
#[derive(Debug, Default)]
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
    /// Bandwidth limit over all transfers together (`--bwlimit`).
    pub bwlimit: Option<Limiter>,
    /// Files that metadata says are in sync also have their bytes
    /// compared; different bytes are a conflict (both kept).
    pub checksum: bool,
    /// How messages name each root, e.g. `/home/me/docs` (empty: the side's
    /// letter alone).
    pub roots: [String; 2],
    /// Extended attributes and ACLs carried by the files and symlinks a
    /// run copies or updates (`-X`, `-A`), where both stores keep them.
    pub xattrs: XattrSel,
    /// When changed files go by delta (`--delta`, `--whole-file`).
    pub delta: ferry_engine::delta::Mode,
    /// What each side keeps of the entries the run replaces or deletes
    /// there (`--versions`, `--backup-dir`, `--suffix`): A's keeper, B's
    /// (`None`: replaced and deleted for good). What they keep, and the
    /// backup directories inside a root, are never synced.
    pub keep: [Option<Keeper>; 2],
    /// Apply setuid, setgid and sticky bits from a side whose modes are
    /// not this machine's (`--keep-special-bits`; see
    /// `ferry_engine::special`).
    pub keep_special_bits: bool,
    /// `--watch`: what every run of the watch checks, whole or scoped:
    /// each root is the directory watched at the start (device and
    /// inode), and the deletion limit counts the deletions of the watch's
    /// runs of the last [`ferry_engine::MAX_DELETE_WINDOW`] too.
    pub guard: Option<std::sync::Arc<ferry_engine::Guard>>,
    /// Set by a signal (SIGINT, SIGTERM) of a run without `--watch`: the
    /// run begins no further entry (in a watch, [`ferry_engine::Guard::stop`]).
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Options {
    /// A signal asked the run to stop: no further entry is begun (what
    /// was done is in the journal, the rest is the next run's).
    pub fn stopping(&self) -> bool {
        self.guard.as_ref().is_some_and(|g| g.stopping())
            || self
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// `A /path` (or `A` when the root has no name).
    fn name(&self, s: Side) -> String {
        match self.roots[s as usize].as_str() {
            "" => s.as_str().to_string(),
            r => format!("{} {r}", s.as_str()),
        }
    }
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
    /// An entry left out (special file, or a symlink the other side
    /// cannot hold): see [`BiReporter::skip`].
    Skip,
    /// An entry about to be replaced or deleted was kept first (`other`:
    /// where, as its side's keeper shows it).
    Keep,
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
            BiAction::Keep => "keep",
        }
    }
}

/// Receives actions and errors from any thread.
pub trait BiReporter: Sync {
    /// `act` was done on side `on` at `path`; `other` is the old path of a
    /// rename, the conflict name of a conflict, or where a kept entry went.
    fn action(&self, act: BiAction, on: Side, path: &[u8], other: Option<&[u8]>, size: u64);
    /// One path failed; the run goes on.
    fn error(&self, path: &[u8], err: &io::Error);
    /// One path failed on side `on`; the run goes on. The error may name
    /// the operation ([`ferry_engine::store::op_of`]). By default as
    /// [`BiReporter::error`].
    fn error_on(&self, on: Side, path: &[u8], err: &io::Error) {
        let _ = on;
        self.error(path, err)
    }
    /// The entry at `path` on side `on` is left out of the sync, because
    /// `why` (a phrase, e.g. "special file (fifo, socket or device)").
    fn skip(&self, on: Side, path: &[u8], why: &str);
    /// Something about the run as a whole the user must see (a root
    /// created), as one line.
    fn note(&self, msg: &str);
}

/// Counters of a run besides the engine's [`Stats`].
#[derive(Debug, Default)]
struct Counts {
    renamed: AtomicU64,
    conflicts: AtomicU64,
    kept: AtomicU64,
    bytes_kept: AtomicU64,
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
    /// Entries kept before they were replaced or deleted (both sides).
    pub kept: u64,
    /// Their bytes.
    pub bytes_kept: u64,
    /// A signal stopped the run between entries: what it did not begin is
    /// left for the next run.
    pub stopped: bool,
}

/// Why a run stopped before changing anything: the engine's own refusal,
/// so [`ferry_engine::class::classify`] tells a refused bisync as it tells
/// a refused sync.
pub use ferry_engine::Refused;

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Open directories of one side, by key (opened once each).
struct Dirs<S: Store> {
    /// Unset while the root does not exist (a dry run of a first run that
    /// would create it).
    root: std::sync::OnceLock<Arc<S::Dir>>,
    map: Mutex<HashMap<Vec<u8>, Arc<S::Dir>>>,
}

fn cname(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

impl<S: Store> Dirs<S> {
    fn new(root: Option<S::Dir>) -> Self {
        let d = Dirs {
            root: std::sync::OnceLock::new(),
            map: Mutex::new(HashMap::new()),
        };
        if let Some(r) = root {
            let _ = d.root.set(Arc::new(r));
        }
        d
    }

    fn dir(&self, s: &S, key: &[u8]) -> io::Result<Arc<S::Dir>> {
        if key.is_empty() {
            return self
                .root
                .get()
                .cloned()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the root does not exist"));
        }
        if let Some(d) = self.map.lock().get(key) {
            return Ok(d.clone());
        }
        let parent = self.dir(s, parent_key(key).unwrap_or(b""))?;
        let d = Arc::new(s.open_dir(&parent, &cname(name_of(key))?)?);
        self.map.lock().insert(key.to_vec(), d.clone());
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
    /// The attributes kept (`opts.xattrs` where both stores keep them).
    xattrs: XattrRun,
    /// Read-only directories of ours made writable for the entries that
    /// change in them (a non-root user), with their mode to set back at
    /// the end of the run: side, key, metadata.
    relock: Mutex<Vec<(Side, Vec<u8>, Meta)>>,
    /// The rule for setuid, setgid and sticky bits of modes written to
    /// each side (index: the side written) from the other
    /// (`--keep-special-bits`; see `ferry_engine::special`).
    special: [SpecialBits; 2],
    /// In a watch: side A's, B's root found gone (or another directory)
    /// during the run; the deletions it would cause on the other side are
    /// not done (said once).
    lost: [std::sync::atomic::AtomicBool; 2],
    /// In a watch: the removals each side's watcher had seen when the run
    /// started.
    removals_at_start: [u64; 2],
    /// Removals this run made on each side (its watcher sees them too),
    /// and of them the files and symlinks (for the deletion limit's window).
    own: [AtomicU64; 2],
    deleted: [AtomicU64; 2],
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

fn synced(side: Side, mine: Meta, other: Meta) -> Synced {
    match side {
        Side::A => Synced { a: mine, b: other },
        Side::B => Synced { a: other, b: mine },
    }
}

/// The size reported for an entry: a file's or symlink's, 0 for a directory.
fn size_of(m: &Meta) -> u64 {
    if m.kind == Kind::Dir {
        0
    } else {
        m.size
    }
}

fn changed_err() -> io::Error {
    ferry_engine::store::changed()
}

/// Run a two-way sync between `a` and `b`. `journal`: `None` only for a
/// dry run without a journal file. `Err(Refused)`: nothing was changed.
/// `stats` is counted into as work completes (for a progress display).
///
/// Refused (before anything changes, whatever `force` says unless noted):
/// a root the journal has seen that no longer exists (only `resync` goes
/// on: a root seen once is never created again); no journal and both
/// roots non-empty, unless `resync` (without the journal a deletion looks
/// like a creation); a root that is empty while
/// the journal knew files and the other side would lose them, unless
/// `force` (an unmounted disk looks like that); more deletions than
/// `max_delete`, unless `force`. A first run creates a missing root with
/// the other root's mode (a dry run says it would).
pub fn run<A: Store, B: Store>(
    a: &A,
    b: &B,
    journal: Option<&mut Journal>,
    opts: &Options,
    rep: &dyn BiReporter,
    stats: &Stats,
) -> Result<Outcome, Refused> {
    run_with(a, b, journal, opts, rep, stats, None).map(|o| o.expect("a whole run"))
}

/// A bisync of the directories where something changed since the last
/// run (`scope`, what `--watch` saw: see [`crate::tree::scan_scoped`]),
/// with the rules of [`run`]: the same plan for those paths as a whole
/// run's, carried out the same way, and only their journal records read
/// and written. The deletion limit counts against every file the journal
/// knows. `Ok(None)`: only a whole run can tell (no journal of an earlier
/// run, a directory of the scope that could not be reached, a side whose
/// root is empty while deletions are planned on the other: a whole run
/// refuses that, or goes on with `--force`); nothing was changed.
pub fn run_scoped<A: Store, B: Store>(
    a: &A,
    b: &B,
    journal: &mut Journal,
    opts: &Options,
    rep: &dyn BiReporter,
    stats: &Stats,
    scope: &ScopeDirs,
) -> Result<Option<Outcome>, Refused> {
    if opts.dry_run || opts.resync {
        return Ok(None);
    }
    run_with(a, b, Some(journal), opts, rep, stats, Some(scope))
}

/// [`run`], or with a scope [`run_scoped`] (the steps: [`pass::Pass`]).
fn run_with<A: Store, B: Store>(
    a: &A,
    b: &B,
    journal: Option<&mut Journal>,
    opts: &Options,
    rep: &dyn BiReporter,
    stats: &Stats,
    scope: Option<&ScopeDirs>,
) -> Result<Option<Outcome>, Refused> {
    let start = Instant::now();
    let mut journal = journal;
    // The journal has seen this pair (so both roots existed at a run).
    let known = match journal.as_deref() {
        Some(j) if !opts.resync => j.knows_pair()?,
        _ => false,
    };
    if scope.is_some() && !known {
        return Ok(None);
    }
    let p = pass::Pass {
        a,
        b,
        opts,
        rep,
        stats,
        scope,
    };
    let removals_at_start = opts
        .guard
        .as_ref()
        .map_or([0; 2], |g| [g.base(0), g.base(1)]);
    let (oa, ob, missing) = p.open_roots(known)?;
    let sides = Sides {
        implicit_dirs: [!a.features().dir_meta, !b.features().dir_meta],
        inodes: [a.features().inodes, b.features().inodes],
    };
    if let Some(j) = journal.as_deref_mut() {
        j.set_sides(sides.inodes);
    }
    // A real --resync writes the records of what it finds in sync while it
    // scans, a directory at a time (its journal is cleared first, and
    // nothing refuses a resync once it scans: with no records nothing is
    // deleted). Other runs write only after the refusal checks.
    let early = !opts.dry_run && opts.resync;
    if early {
        let j = journal.as_deref_mut().expect("a real run has a journal");
        j.clear()?;
        j.mark_synced()?;
    }
    // Second handles on the roots, for the executor (the scan takes its
    // own), opened beside the scan: over ssh the round trip of each is
    // hidden behind the scan's, not added before it.
    let (scanned, ra, rb) = std::thread::scope(|s| {
        let ha = oa.as_ref().map(|_| s.spawn(|| clone_dir(a)));
        let hb = ob.as_ref().map(|_| s.spawn(|| clone_dir(b)));
        let scanned = p.scan(journal.as_deref(), (known, early, sides), oa, ob);
        (scanned, ha.map(joined), hb.map(joined))
    });
    let (ra, rb) = (ra.transpose()?, rb.transpose()?);
    let Some((mut plan, mut sa, mut sb)) = scanned? else {
        return Ok(None);
    };
    Stats::add(&stats.entries_scanned, plan.scanned);
    if opts.stopping() {
        // A signal during the scan: a part of a scan plans nothing, and
        // nothing is done (the journal is as it was, but for what a
        // --resync found in sync so far).
        return Ok(Some(Outcome {
            entries_scanned: plan.scanned,
            errors: stats.errors.load(Ordering::Relaxed),
            elapsed_s: start.elapsed().as_secs_f64(),
            stopped: true,
            ..Outcome::default()
        }));
    }
    let ex = p.exec(ra, rb, removals_at_start);
    let count = [sa.count, sb.count];
    // No journal and both sides hold entries: a first run would merge
    // them, bringing back whatever was deleted since a lost journal's run.
    if !known && !opts.resync && count[0] > 0 && count[1] > 0 {
        return Err(Refused(format!(
            "no journal of an earlier run of {} and {}, and both hold files: without it a deletion cannot be told from a creation (deleted files would come back), so nothing was done; if this is the first run of the pair, or its journal was lost, check both sides, then run again with --resync (merges both trees, deletes nothing)",
            opts.name(Side::A),
            opts.name(Side::B)
        )));
    }
    for (scan, side) in [(&sa, Side::A), (&sb, Side::B)] {
        for k in &scan.skipped {
            rep.skip(
                side,
                &path_of(k),
                "special file (fifo, socket or device): not synced, the path is left alone on both sides",
            );
        }
    }
    let temps = [std::mem::take(&mut sa.temps), std::mem::take(&mut sb.temps)];
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let verify = |cands: &[Candidate]| ex.verify_renames(cands);
    let taken = |k: &[u8]| ex.exists(Side::A, k) || ex.exists(Side::B, k);
    finish(&mut plan, &taken, &crate::plan::stamp(secs), &verify);
    drop((sa, sb));
    if !p.limits(&ex, &mut plan, (count, known), journal.as_deref())? {
        return Ok(None);
    }
    for it in &plan.items {
        if let Act::Copy { from } = it.act {
            if let Some(m) = it.side(from).filter(|m| m.kind == Kind::File) {
                Stats::add(&stats.files_planned, 1);
                Stats::add(&stats.bytes_planned, m.size);
            }
        }
    }
    let ex = p.carry_out(ex, &plan, journal, (early, missing), &temps)?;
    Ok(Some(p.outcome(&ex, &plan, start)))
}

mod act;
mod exec;
mod pass;

/// True when the root of a side holds no entry (a failure to list counts
/// as not empty: the listing of the run went through).
fn root_empty<S: Store>(s: &S, dc: &Dirs<S>) -> bool {
    let Some(root) = dc.root.get() else {
        return true;
    };
    let mut l = ferry_engine::Listing::new();
    let mut errs = Vec::new();
    s.list(root, b"", &mut l, &mut errs).is_ok()
        && errs.is_empty()
        && l.entries().iter().all(|e| {
            let n = l.name(e);
            ferry_engine::store::is_temp_name(n) || ferry_engine::keep::is_versions_dir(n)
        })
}

/// `3 files`, `1 file and 2 directories`, `1 directory`.
fn entries((files, dirs): (u64, u64)) -> String {
    let n = |k: u64, one: &str, many: &str| format!("{k} {}", if k == 1 { one } else { many });
    match (files, dirs) {
        (f, 0) => n(f, "file", "files"),
        (0, d) => n(d, "directory", "directories"),
        (f, d) => format!(
            "{} and {}",
            n(f, "file", "files"),
            n(d, "directory", "directories")
        ),
    }
}

/// Open a root: `None` when it does not exist.
fn open_root<S: Store>(
    s: &S,
    side: Side,
    opts: &Options,
) -> Result<Option<(S::Dir, Meta)>, Refused> {
    match s.open_root() {
        Ok(Some((d, m))) if m.kind == Kind::Dir => Ok(Some((d, m))),
        Ok(Some(_)) => Err(Refused(format!("{}: not a directory", opts.name(side)))),
        Ok(None) => Ok(None),
        Err(e) => Err(Refused(format!("{}: {e}", opts.name(side)))),
    }
}

/// Create a missing root with mode `mode` (the other root's).
fn create_root<S: Store>(s: &S, dc: &Dirs<S>, mode: u32) -> io::Result<()> {
    let d = s.create_root()?;
    if s.features().dir_meta && mode & 0o7777 != 0 {
        let m = Meta {
            mode,
            ..dir_rec(None)
        };
        s.set_dir_meta(
            &d,
            &m,
            MetaChange {
                mode: true,
                ..MetaChange::default()
            },
        )?;
    }
    let _ = dc.root.set(Arc::new(d));
    Ok(())
}

/// What a thread opening a root ([`clone_dir`]) gave.
fn joined<D>(h: std::thread::ScopedJoinHandle<'_, Result<D, Refused>>) -> Result<D, Refused> {
    h.join()
        .unwrap_or_else(|_| Err(Refused("opening the root panicked".into())))
}

/// A second handle on a root (the scan consumes its own).
fn clone_dir<S: Store>(s: &S) -> Result<S::Dir, Refused> {
    match s.open_root() {
        Ok(Some((d, _))) => Ok(d),
        Ok(None) => Err(Refused("root vanished".into())),
        Err(e) => Err(Refused(e.to_string())),
    }
}
