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
//! (Over 800 lines: the executor of every bisync action kind and the refusal checks before it, in
//! action order.)

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
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
}

impl Options {
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
}

/// Why a run stopped before changing anything.
#[derive(Debug)]
pub struct Refused(pub String);

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

/// [`run`], or with a scope [`run_scoped`].
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
        Some(j) if !opts.resync => j.knows_pair().map_err(Refused)?,
        _ => false,
    };
    if scope.is_some() && !known {
        return Ok(None);
    }
    let removals_at_start = opts
        .guard
        .as_ref()
        .map_or([0; 2], |g| [g.removals(0), g.removals(1)]);
    let (oa, ob) = (open_root(a, Side::A, opts)?, open_root(b, Side::B, opts)?);
    if let Some(g) = &opts.guard {
        for (side, o) in [
            (Side::A, oa.as_ref().map(|r| &r.1)),
            (Side::B, ob.as_ref().map(|r| &r.1)),
        ] {
            let Some(m) = o else { continue };
            match g.check(side as usize, &opts.name(side), m, opts.force) {
                Ok(None) => {}
                Ok(Some(note)) => rep.note(&note),
                Err(msg) => return Err(Refused(msg)),
            }
        }
    }
    // A missing root: the side to create and the mode it gets.
    let missing = match (&oa, &ob) {
        (None, None) => {
            return Err(Refused(format!(
                "neither {} nor {} exists",
                opts.name(Side::A),
                opts.name(Side::B)
            )))
        }
        (None, Some((_, m))) => Some((Side::A, m.mode)),
        (Some((_, m)), None) => Some((Side::B, m.mode)),
        _ => None,
    };
    if let (Some((side, _)), true) = (missing, known) {
        return Err(Refused(format!(
            "{}: does not exist, but it did at the last run (an unmounted disk, or a renamed folder?): nothing done; check it, then run again with --resync to sync it as a new, empty side (--force does not)",
            opts.name(side)
        )));
    }
    // A path that cannot be listed is an error of the run (exit 1), like
    // any other; it is left alone on both sides.
    let fail = |p: &[u8], e: &io::Error| {
        add(&stats.errors, 1);
        rep.error(p, e)
    };
    // Both trees are listed on the pool while another thread loads the
    // journal, and merged with it as the listings come in: on a no-op run,
    // that is all the work there is.
    let ra = if oa.is_some() {
        Some(clone_dir(a)?)
    } else {
        None
    };
    let rb = if ob.is_some() {
        Some(clone_dir(b)?)
    } else {
        None
    };
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
        j.clear().map_err(Refused)?;
        j.mark_synced().map_err(Refused)?;
    }
    let cp = Copier {
        src: a,
        dst: b,
        fsync: opts.fsync,
        bwlimit: opts.bwlimit.as_ref(),
        moved: &stats.bytes_moved,
        // Only compares: nothing written.
        xattrs: None,
        delta: None,
        keep: None,
        mtime_step: ferry_engine::store::mtime_step(a, b),
        special: None,
        grow: None,
    };
    let jr: Option<&Journal> = journal.as_deref();
    let records: &dyn Records = match jr {
        Some(j) if known => j,
        _ => &NoRecords,
    };
    // Records wait here while the writer is behind, a bounded number of
    // directories' worth.
    let (tx, rx) = mpsc::sync_channel::<Update>(16);
    let scanned = std::thread::scope(|s| {
        let writer = early.then(|| {
            let j = jr.expect("a real run has a journal");
            s.spawn(move || j.write_from(rx))
        });
        let o = ScanOpts {
            sides,
            jobs: opts.jobs,
            filter: opts.filter.as_ref(),
            checksum: opts.checksum,
            on_error: &fail,
            compare: Some(&cp),
            in_sync: if opts.dry_run {
                InSync::Count
            } else if early {
                InSync::Write(&tx)
            } else {
                InSync::Keep
            },
            stop_if_both_hold: !known && !opts.resync,
            reserved: Reserved {
                keep: [opts.keep[0].as_ref(), opts.keep[1].as_ref()],
            },
        };
        let r = match (scope, oa, ob) {
            (Some(sc), Some((da, _)), Some((db, _))) => {
                scan_scoped((a, da), (b, db), records, &o, sc)
            }
            // (A missing root was refused above: the pair is known.)
            (Some(_), _, _) => Ok(None),
            (None, oa, ob) => scan_merge(
                (a, oa.map(|(d, _)| d)),
                (b, ob.map(|(d, _)| d)),
                records,
                &o,
            )
            .map(Some),
        };
        drop(tx);
        if let Some(w) = writer {
            if let Err(e) = w.join().expect("journal writer") {
                rep.error(b"", &io::Error::other(e));
                add(&stats.errors, 1);
            }
        }
        r
    });
    let Some((mut plan, mut sa, mut sb)) = scanned.map_err(Refused)? else {
        return Ok(None);
    };
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
        xattrs: XattrRun::new(opts.xattrs, a.xattr_caps(), b.xattr_caps()),
        relock: Mutex::new(Vec::new()),
        special: [
            SpecialBits::new(b, a, opts.keep_special_bits),
            SpecialBits::new(a, b, opts.keep_special_bits),
        ],
        lost: Default::default(),
        removals_at_start,
        own: Default::default(),
        deleted: Default::default(),
    };
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
    // An empty root while the journal knew entries: an unmounted mount
    // point looks like this, and going on would empty the other side.
    for side in [Side::A, Side::B] {
        let (i, o) = (side as usize, side.other() as usize);
        let held = (plan.known[i], plan.known_dirs);
        let del = (plan.deletes[o], plan.dir_deletes[o]);
        if scope.is_some() {
            // Only a whole run counts a side's entries: one that deletes
            // while the other root is empty decides (and refuses) itself.
            if !opts.force && del != (0, 0) && on_side!(ex, side, |st, dc| root_empty(st, dc)) {
                return Ok(None);
            }
            continue;
        }
        if known && !opts.force && count[i] == 0 && del != (0, 0) {
            return Err(Refused(format!(
                "{} is empty, but held {} at the last run (an unmounted disk looks like this): nothing done; mount it, or run again with --force to delete {} on {}",
                opts.name(side),
                entries(held),
                entries(del),
                side.other().as_str()
            )));
        }
    }
    if scope.is_some() && plan.deletes != [0; 2] {
        // The limit is a share of every file the journal knows, not of
        // the records of the directories this run read.
        let all = journal.as_deref().expect("scoped runs have a journal");
        plan.known = [all.count_files().map_err(Refused)?; 2];
    }
    let now = Instant::now();
    for (i, side) in [(0, "A"), (1, "B")] {
        let (del, known) = (plan.deletes[i], plan.known[i]);
        // A watch's earlier runs of the window count too.
        let before = opts.guard.as_ref().map_or(0, |g| g.removed(i, now));
        // (A share of what there was at the window's start.)
        if !opts.force
            && known > 0
            && (del + before) * 100 > (known + before) * opts.max_delete as u64
        {
            let also = match &opts.guard {
                Some(g) if before > 0 => format!(
                    " with the {before} deleted there by this watch's runs of the last {} minutes",
                    g.window().as_secs() / 60
                ),
                _ => String::new(),
            };
            return Err(Refused(format!(
                "refusing to delete {del} of {known} files on {side}{also} (more than {}%); check the other side, then run again with --force",
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
        if let Some((side, _)) = missing {
            rep.note(&format!(
                "would create {} (does not exist)",
                opts.name(side)
            ));
            add(&stats.dirs_created, 1);
            rep.action(BiAction::Mkdir, side, b"", None, 0);
        }
        ex.report_dry(&plan);
        ex
    } else {
        let j = journal.expect("a real run has a journal");
        if !early {
            j.mark_synced().map_err(Refused)?;
        }
        if let Some((side, mode)) = missing {
            let mode = ex.special[side as usize]
                .apply(&Meta {
                    mode,
                    ..dir_rec(None)
                })
                .mode;
            on_side!(ex, side, |st, dc| create_root(st, dc, mode))
                .map_err(|e| Refused(format!("{}: {}", opts.name(side), e)))?;
            rep.note(&format!("created {} (did not exist)", opts.name(side)));
            // In a watch, the root it made is the one watched.
            if let Some(g) = &opts.guard {
                let made = on_side!(ex, side, |st, _dc| st
                    .open_root()
                    .ok()
                    .flatten()
                    .map(|r| r.1));
                if let Some(m) = made {
                    g.seen(side as usize, &m);
                }
            }
            add(&stats.dirs_created, 1);
            rep.action(BiAction::Mkdir, side, b"", None, 0);
        }
        let (tx, rx) = mpsc::channel();
        let ex = Exec { tx: Some(tx), ..ex };
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
    // The files this run deleted count in the watch's window.
    if let Some(g) = &opts.guard {
        for (i, n) in ex.deleted.iter().enumerate() {
            g.add_removed(i, n.load(Ordering::Relaxed));
        }
    }
    if let Some(n) = ex.xattrs.note("a replica") {
        rep.note(&n);
    }
    // Bits dropped on the way to A are B's, and the reverse.
    for (side, from) in [(Side::A, Side::B), (Side::B, Side::A)] {
        if let Some(n) = ex.special[side as usize].note(from.as_str()) {
            rep.note(&n);
        }
    }
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let c = &ex.counts;
    Ok(Some(Outcome {
        entries_scanned: plan.scanned,
        files_copied: g(&ex.stats.files_copied),
        bytes_copied: g(&ex.stats.bytes_copied),
        files_deleted: g(&ex.stats.files_deleted),
        dirs_created: g(&ex.stats.dirs_created),
        renamed: g(&c.renamed),
        conflicts: g(&c.conflicts),
        // Paths found equal whose record was only written now count as unchanged.
        unchanged: plan.unchanged
            + plan.recorded
            + plan.items.iter().filter(|it| it.act == Act::Record).count() as u64,
        errors: g(&ex.stats.errors),
        elapsed_s: start.elapsed().as_secs_f64(),
        kept: g(&c.kept),
        bytes_kept: g(&c.bytes_kept),
    }))
}

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

/// A second handle on a root (the scan consumes its own).
fn clone_dir<S: Store>(s: &S) -> Result<S::Dir, Refused> {
    match s.open_root() {
        Ok(Some((d, _))) => Ok(d),
        Ok(None) => Err(Refused("root vanished".into())),
        Err(e) => Err(Refused(e.to_string())),
    }
}

/// True when two files (or two symlinks) hold the same bytes: the
/// engine's content compare (a store's hash spares reading its side).
fn same_content<S: Store, D: Store>(
    cp: &Copier<'_, S, D>,
    sd: &Dirs<S>,
    skey: &[u8],
    dd: &Dirs<D>,
    dkey: &[u8],
) -> io::Result<bool> {
    let (s, d) = (cp.src, cp.dst);
    let (sdir, sname) = sd.at(s, skey)?;
    let (ddir, dname) = dd.at(d, dkey)?;
    let sm = s
        .stat(&sdir, &sname)?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    if sm.kind == Kind::Symlink {
        return Ok(s.read_link(&sdir, &sname)? == d.read_link(&ddir, &dname)?);
    }
    cp.same_content(&sdir, &sname, &ddir, &dname, sm.size)
}

impl<A: Store, B: Store> Exec<'_, A, B> {
    /// The engine's file copy from `s` to `d` with this run's options.
    fn copier<'x, S: Store, D: Store>(&'x self, s: &'x S, d: &'x D) -> Copier<'x, S, D> {
        Copier {
            src: s,
            dst: d,
            fsync: self.opts.fsync,
            bwlimit: self.opts.bwlimit.as_ref(),
            moved: &self.stats.bytes_moved,
            xattrs: self.xattrs.active(),
            delta: ferry_engine::delta::Use::of(self.opts.delta, &self.stats.delta),
            keep: None,
            mtime_step: ferry_engine::store::mtime_step(s, d),
            special: None,
            grow: None,
        }
    }

    /// The copier that writes to side `to`, keeping what it replaces there
    /// with `to`'s keeper.
    fn copier_to<'x, S: Store, D: Store>(
        &'x self,
        s: &'x S,
        d: &'x D,
        to: Side,
    ) -> Copier<'x, S, D> {
        Copier {
            keep: self.keeper(to),
            special: Some(&self.special[to as usize]),
            ..self.copier(s, d)
        }
    }

    /// The step mtimes are compared to between the two sides.
    fn step(&self) -> u32 {
        ferry_engine::store::mtime_step(self.a, self.b)
    }

    /// Side `on`'s keeper, if it keeps what is replaced or deleted.
    fn keeper(&self, on: Side) -> Option<&Keeper> {
        self.opts.keep[on as usize].as_ref()
    }

    /// Report (and count) an entry of `on` kept at `to` before it was
    /// replaced or deleted (or, in a dry run, where it would be kept).
    fn kept(&self, on: Side, key: &[u8], to: &[u8], m: &Meta) {
        add(&self.counts.kept, 1);
        add(&self.counts.bytes_kept, size_of(m));
        self.rep
            .action(BiAction::Keep, on, &path_of(key), Some(to), size_of(m));
    }

    /// A dry run's line for an entry of `on` that would be kept.
    fn dry_kept(&self, on: Side, key: &[u8], m: &Meta) {
        if let Some(k) = self.keeper(on) {
            self.kept(on, key, &k.place(&path_of(key)), m);
        }
    }

    /// Keep the entry `n` of `d` on `on` (at `key`, as planned: `m`) before
    /// it is removed: the keeper moves it away (it is gone afterwards).
    /// Without a keeper it is removed for good.
    fn keep_or_remove<S: Store>(
        &self,
        st: &S,
        on: Side,
        d: &S::Dir,
        n: &std::ffi::CStr,
        key: &[u8],
        m: &Meta,
    ) -> io::Result<()> {
        match self.keeper(on) {
            Some(k) => {
                let to = k.keep(
                    st,
                    d,
                    n,
                    &path_of(key),
                    &Planned::new(m, self.step()),
                    false,
                )?;
                self.kept(on, key, &to, m);
                Ok(())
            }
            // Only while it is still what the plan saw (one stat where the
            // store checks: a write made since is never lost).
            None => st
                .remove_planned(d, n, &Planned::new(m, self.step()))
                .map(|_| ())
                .map_err(|e| op_err(e, None, "unlink")),
        }
    }

    /// Report a failure of the act on side `on` at `key`.
    fn fail(&self, on: Side, key: &[u8], e: &io::Error) {
        add(&self.stats.errors, 1);
        self.rep.error_on(on, &path_of(key), e);
    }

    /// Run `act`, an act on side `on` in the directory holding `key`; if
    /// it is refused for want of permission, make that directory writable
    /// once (a read-only directory of ours, as a non-root user: what
    /// copy and sync do) and run it again. Its mode is set back at the end
    /// of the run ([`Exec::relock_all`]).
    fn unlocking<T>(&self, on: Side, key: &[u8], act: impl Fn() -> io::Result<T>) -> io::Result<T> {
        match act() {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                let pk = parent_key(key).unwrap_or(b"");
                match self.unlock(on, pk) {
                    Ok(true) => act(),
                    _ => Err(e),
                }
            }
            r => r,
        }
    }

    /// Make directory `key` of side `on` writable (see
    /// [`Exec::unlocking`]); true when it is (or was made so by this run).
    fn unlock(&self, on: Side, key: &[u8]) -> io::Result<bool> {
        let mut relock = self.relock.lock().unwrap();
        if relock.iter().any(|(s, k, _)| *s == on && k == key) {
            return Ok(true);
        }
        on_side!(self, on, |st, dc| {
            let meta = if key.is_empty() {
                st.open_root()?.map(|(_, m)| m)
            } else {
                let (d, n) = dc.at(st, key)?;
                st.stat(&d, &n)?
            };
            let Some(meta) = meta else {
                return Ok(false);
            };
            let d = dc.dir(st, key)?;
            if !st.make_writable(&d)? {
                return Ok(false);
            }
            relock.push((on, key.to_vec(), meta));
            Ok(true)
        })
    }

    /// Set back the mode of the directories [`Exec::unlock`] changed.
    fn relock_all(&self) {
        let dirs = std::mem::take(&mut *self.relock.lock().unwrap());
        for (on, key, meta) in dirs.iter().rev() {
            let res = on_side!(self, *on, |st, dc| dc.dir(st, key).and_then(|d| {
                let what = MetaChange {
                    mode: true,
                    ..MetaChange::default()
                };
                st.set_dir_meta(&d, meta, what)
                    .map_err(|e| op_err(e, None, "chmod"))
            }));
            if let Err(e) = res {
                self.fail(*on, key, &e);
            }
        }
    }

    fn record(&self, u: Update) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(u);
        }
    }

    /// True when an entry is at `key` on side `on` (a failure to look
    /// counts as none: a rename onto an entry there fails, never replaces).
    fn exists(&self, on: Side, key: &[u8]) -> bool {
        on_side!(self, on, |st, dc| dc
            .at(st, key)
            .and_then(|(d, n)| st.stat(&d, &n))
            .is_ok_and(|m| m.is_some()))
    }

    /// Prove rename candidates (in parallel): the new path on side X must
    /// hold the bytes of the old path on the other side, which is the
    /// synced copy of what X had there (an inode, or a size and mtime, are
    /// no proof: a new file can reuse a deleted file's inode).
    fn verify_renames(&self, cands: &[Candidate]) -> Vec<bool> {
        let ok: Vec<std::sync::atomic::AtomicBool> = cands
            .iter()
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        let pool: Pool<usize> = Pool::new();
        pool.push_all(0..cands.len());
        pool.run(self.opts.jobs, |i, _| {
            let (x, new, old) = &cands[i];
            let same = between!(self, *x, |s, sd, d, dd| same_content(
                &self.copier(s, d),
                sd,
                new,
                dd,
                old
            ));
            ok[i].store(same.unwrap_or(false), Ordering::Relaxed);
        });
        ok.into_iter().map(|b| b.into_inner()).collect()
    }

    /// Report every planned action (`--dry-run`): the lines and counts of
    /// the real run when nothing fails, in the order of [`Exec::execute`].
    fn report_dry(&self, plan: &Plan) {
        let items = &plan.items;
        let p = |k: &[u8]| path_of(k);
        // 1. Conflicts: the loser moves aside, then each side gets the
        // other's version.
        for it in items {
            if let Act::Conflict { loser, name } = &it.act {
                let winner = loser.other();
                let lm = *it.side(*loser).expect("conflicts have both sides");
                let wm = *it.side(winner).expect("conflicts have both sides");
                add(&self.counts.conflicts, 1);
                self.rep.action(
                    BiAction::Conflict,
                    *loser,
                    &p(&it.key),
                    Some(&p(name)),
                    size_of(&lm),
                );
                self.dry_copy(*loser, name, &lm, None);
                if wm.kind == Kind::Dir {
                    add(&self.stats.dirs_created, 1);
                    self.rep
                        .action(BiAction::Mkdir, *loser, &p(&it.key), None, 0);
                } else {
                    self.dry_copy(winner, &it.key, &wm, None);
                }
            }
        }
        // 2. Directories.
        for it in items {
            if let Act::Copy { from } = it.act {
                if it.side(from).is_some_and(|m| m.kind == Kind::Dir) {
                    let to = from.other();
                    match it.side(to) {
                        Some(o) if o.kind == Kind::Dir => {}
                        old => {
                            if let Some(o) = old {
                                self.dry_kept(to, &it.key, o);
                                add(&self.stats.files_deleted, 1);
                                self.rep.action(
                                    BiAction::Delete,
                                    to,
                                    &p(&it.key),
                                    None,
                                    size_of(o),
                                );
                            }
                            add(&self.stats.dirs_created, 1);
                            self.rep.action(BiAction::Mkdir, to, &p(&it.key), None, 0);
                        }
                    }
                }
            }
        }
        // 3. Renames.
        for it in items {
            if let Act::Rename { on, from } = it.act {
                let m = it.side(on.other()).expect("new path exists");
                add(&self.counts.renamed, 1);
                let old = p(&items[from].key);
                self.rep
                    .action(BiAction::Rename, on, &p(&it.key), Some(&old), size_of(m));
            }
        }
        // 4. Copies and metadata (a file replacing a directory waits for 6).
        for it in items {
            match it.act {
                Act::Copy { from } => {
                    let m = it.side(from).expect("copied entries exist");
                    let over = it.side(from.other());
                    if m.kind != Kind::Dir && !over.is_some_and(|o| o.kind == Kind::Dir) {
                        self.dry_copy(from, &it.key, m, over);
                    }
                }
                Act::Meta { from } => {
                    let m = it.side(from).expect("both");
                    self.rep
                        .action(BiAction::Meta, from.other(), &p(&it.key), None, size_of(m))
                }
                _ => {}
            }
        }
        // 5. Deletions: files, then directories deepest first.
        let deleted = |it: &Item, dirs: bool| match it.act {
            Act::Delete { on } => it
                .side(on)
                .filter(|m| (m.kind == Kind::Dir) == dirs)
                .map(|m| (on, *m)),
            _ => None,
        };
        for it in items {
            if let Some((on, m)) = deleted(it, false) {
                self.dry_kept(on, &it.key, &m);
                add(&self.stats.files_deleted, 1);
                self.rep
                    .action(BiAction::Delete, on, &p(&it.key), None, size_of(&m));
            }
        }
        for it in items.iter().rev() {
            if let Some((on, _)) = deleted(it, true) {
                add(&self.stats.files_deleted, 1);
                self.rep.action(BiAction::Delete, on, &p(&it.key), None, 0);
            }
        }
        // 6. Files replacing directories (now empty).
        for it in items {
            if let Act::Copy { from } = it.act {
                let m = it.side(from).expect("copied entries exist");
                let to = from.other();
                if m.kind != Kind::Dir && it.side(to).is_some_and(|o| o.kind == Kind::Dir) {
                    add(&self.stats.files_deleted, 1);
                    self.rep.action(BiAction::Delete, to, &p(&it.key), None, 0);
                    self.dry_copy(from, &it.key, m, None);
                }
            }
        }
    }

    /// What [`Exec::copy`] reports for a copy of `m` from `from` to `key`
    /// on the other side (`over`: the entry there it replaces, kept first
    /// if that side keeps).
    fn dry_copy(&self, from: Side, key: &[u8], m: &Meta, over: Option<&Meta>) {
        let to = from.other();
        if m.kind == Kind::Symlink && !on_side!(self, to, |st, _dc| st.features().symlinks) {
            self.skip_symlink(from, key);
            return;
        }
        if let Some(o) = over {
            self.dry_kept(to, key, o);
        }
        add(&self.stats.files_copied, 1);
        add(&self.stats.bytes_copied, m.size);
        let act = match (m.kind, over) {
            (Kind::Symlink, _) => BiAction::Symlink,
            (_, Some(_)) => BiAction::Update,
            _ => BiAction::Copy,
        };
        self.rep.action(act, to, &path_of(key), None, m.size);
    }

    /// A symlink on `on` that the other side cannot hold.
    fn skip_symlink(&self, on: Side, key: &[u8]) {
        self.rep.skip(
            on,
            &path_of(key),
            &format!(
                "symlink, which {} cannot store: not synced",
                self.opts.name(on.other())
            ),
        );
    }

    /// Remove temporaries a killed run left (they are ferry's, never a user's).
    fn remove_temps(&self, temps: &[Vec<(Vec<u8>, Meta)>; 2]) {
        for (side, list) in [(Side::A, &temps[0]), (Side::B, &temps[1])] {
            for (key, m) in list {
                let res = on_side!(self, side, |st, dc| dc
                    .at(st, key)
                    .and_then(|(d, n)| st.remove(&d, &n, m.kind == Kind::Dir))
                    .map_err(|e| op_err(e, None, "unlink")));
                if let Err(e) = res {
                    if e.kind() != io::ErrorKind::NotFound {
                        self.fail(side, key, &e);
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
                Act::Record => self.record(Update::Put(it.key.clone(), record_of(it))),
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
                    self.unlocking(to, &c.dst, || {
                        st.rmdir(&d, &n).map_err(|e| op_err(e, None, "rmdir"))
                    })
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
                Err(e) => self.fail(to, &c.dst, &e),
            }
        }
        // 7. Read-only directories made writable get their mode back.
        self.relock_all();
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
                self.unlocking(loser, &it.key, || {
                    st.rename(&d1, &n1, &d2, &n2)
                        .map_err(|e| op_err(e, None, "rename"))
                })?;
                if lm.kind == Kind::Dir {
                    dc.forget(&it.key);
                }
                // The entry as the rename left it (a rename moves the
                // change time): what the journal records of it.
                st.stat(&d2, &n2)
            })()
        });
        let lm = match res {
            Ok(Some(m)) if m.kind == lm.kind => m,
            Ok(_) => lm,
            Err(e) => {
                self.fail(loser, &it.key, &e);
                return None;
            }
        };
        add(&self.counts.conflicts, 1);
        self.rep.action(
            BiAction::Conflict,
            loser,
            &path_of(&it.key),
            Some(&path_of(name)),
            size_of(&lm),
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
                    self.unlocking(to, &it.key, || {
                        self.keep_or_remove(st, to, &d, &n, &it.key, &o)
                    })?;
                    add(&self.stats.files_deleted, 1);
                    self.rep
                        .action(BiAction::Delete, to, &path_of(&it.key), None, size_of(&o));
                }
                if old.is_some_and(|o| o.kind == Kind::Dir) {
                    return Ok(());
                }
                let made = self.unlocking(to, &it.key, || {
                    st.make_dir(&d, &n).map_err(|e| op_err(e, None, "mkdir"))
                });
                match made {
                    Ok(nd) => {
                        if st.features().dir_meta {
                            st.set_dir_meta(
                                &nd,
                                &self.special[to as usize].apply(&m),
                                MetaChange {
                                    mode: true,
                                    ..MetaChange::default()
                                },
                            )
                            .map_err(|e| op_err(e, None, "chmod"))?;
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
            Err(e) => self.fail(to, &it.key, &e),
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
                self.unlocking(on, &old.key, || {
                    self.unlocking(on, &it.key, || {
                        st.rename(&d1, &n1, &d2, &n2)
                            .map_err(|e| op_err(e, None, "rename"))
                    })
                })?;
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
                    size_of(&xm),
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
                self.fail(on, &it.key, &e);
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
        if c.meta.kind == Kind::Symlink && !on_side!(self, to, |st, _dc| st.features().symlinks) {
            self.skip_symlink(c.from, &c.src);
            return;
        }
        let copy = || {
            between!(self, c.from, |s, sd, d, dd| copy_one(
                &self.copier_to(s, d, to),
                sd,
                dd,
                c
            ))
        };
        // A read-only directory of ours on the target side is made
        // writable (not for an error met on the source side).
        let res = match copy() {
            Err(e)
                if e.kind() == io::ErrorKind::PermissionDenied
                    && op_of(&e).is_none_or(|(end, _)| end != Some(End::Src)) =>
            {
                let pk = parent_key(&c.dst).unwrap_or(b"");
                match self.unlock(to, pk) {
                    Ok(true) => copy(),
                    _ => Err(e),
                }
            }
            r => r,
        };
        match res {
            Ok((from, now, kept)) => {
                if let (Some(k), Some(old)) = (kept, &c.expect) {
                    self.kept(to, &c.dst, &k, old);
                }
                add(&self.stats.files_copied, 1);
                add(&self.stats.bytes_copied, from.size);
                let act = match (c.meta.kind, c.expect) {
                    (Kind::Symlink, _) => BiAction::Symlink,
                    (_, Some(_)) => BiAction::Update,
                    _ => BiAction::Copy,
                };
                self.rep.action(act, to, &path_of(&c.dst), None, from.size);
                self.record(Update::Put(c.dst.clone(), synced(c.from, from, now)));
            }
            Err(e) => {
                let on = match op_of(&e) {
                    Some((Some(End::Src), _)) => c.from,
                    _ => to,
                };
                self.fail(on, &c.dst, &e)
            }
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
                    &self.special[to as usize].apply(&c.meta),
                    MetaChange {
                        mtime: true,
                        mode: c.meta.kind != Kind::Symlink,
                        owner: false,
                    },
                )
                .map_err(|e| op_err(e, None, "chmod"))?;
                st.stat(&d, &n)?
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
            })()
        });
        match res {
            Ok(now) => {
                self.rep
                    .action(BiAction::Meta, to, &path_of(&c.src), None, size_of(&c.meta));
                let attrs = between!(self, c.from, |s, sd, d, dd| same_attrs(
                    &self.copier(s, d),
                    sd,
                    dd,
                    &c.src,
                    &c.meta
                ));
                // Extended attributes written move the ctime: the record
                // holds the entry as they left it (else the next run sees a
                // change of ours).
                let now = match attrs {
                    Ok(true) => on_side!(self, to, |st, dc| {
                        (|| {
                            let (d, n) = dc.at(st, &c.src)?;
                            st.stat(&d, &n)
                        })()
                    })
                    .ok()
                    .flatten()
                    .unwrap_or(now),
                    _ => now,
                };
                self.record(Update::Put(c.src.clone(), synced(c.from, c.meta, now)));
                if let Err(e) = attrs {
                    self.fail(to, &c.src, &e);
                }
            }
            Err(e) => self.fail(to, &c.src, &e),
        }
    }

    /// In a watch, before a deletion on `on` (one that `from`'s side made):
    /// `from`'s root is still the directory watched (one open and statx
    /// by its path), so that a root removed or unmounted while the run
    /// deletes stops the deletions it causes there. Said once.
    fn root_alive(&self, from: Side) -> bool {
        let Some(g) = &self.opts.guard else {
            return true;
        };
        let lost = &self.lost[from as usize];
        if lost.load(Ordering::Relaxed) {
            return false;
        }
        let name = self.opts.name(from);
        let i = from as usize;
        let root = on_side!(self, from, |st, _dc| st
            .open_root()
            .ok()
            .flatten()
            .map(|(_, m)| m));
        // This run's own removals there count as seen.
        let at_start = self.removals_at_start[i] + self.own[i].load(Ordering::Relaxed);
        match ferry_engine::may_remove(g, i, &name, root.as_ref(), at_start) {
            Ok(()) => true,
            Err(why) => {
                if !lost.swap(true, Ordering::Relaxed) {
                    self.fail(from, b"", &io::Error::other(why));
                }
                false
            }
        }
    }

    /// Delete an entry unchanged since the last sync (a directory only if empty).
    fn delete(&self, it: &Item, on: Side) {
        if !self.root_alive(on.other()) {
            return;
        }
        let planned = *it.side(on).expect("deleted entries exist");
        let res = on_side!(self, on, |st, dc| {
            (|| {
                let (d, n) = dc.at(st, &it.key)?;
                if planned.kind == Kind::Dir {
                    dc.forget(&it.key);
                    return self.unlocking(on, &it.key, || {
                        st.rmdir(&d, &n).map_err(|e| op_err(e, None, "rmdir"))
                    });
                }
                // Checked right before the act (by the store).
                self.unlocking(on, &it.key, || {
                    self.keep_or_remove(st, on, &d, &n, &it.key, &planned)
                })
            })()
        });
        match res {
            Ok(()) => {
                // (Seen by that side's watcher too: not someone else's.)
                self.own[on as usize].fetch_add(1, Ordering::Relaxed);
                if planned.kind != Kind::Dir {
                    self.deleted[on as usize].fetch_add(1, Ordering::Relaxed);
                }
                add(&self.stats.files_deleted, 1);
                self.rep.action(
                    BiAction::Delete,
                    on,
                    &path_of(&it.key),
                    None,
                    size_of(&planned),
                );
                self.record(Update::Delete(it.key.clone()));
            }
            // Something this run did not plan to delete is inside (an
            // excluded entry, or one that appeared): the directory stays.
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && planned.kind == Kind::Dir => {
                self.record(Update::Delete(it.key.clone()));
            }
            Err(e) => self.fail(on, &it.key, &e),
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

/// Give `key` on the copier's destination side the attributes it has on
/// its source side (`-X`, `-A`; `meta`: the entry's metadata, as set).
fn same_attrs<S: Store, D: Store>(
    cp: &Copier<'_, S, D>,
    sd: &Dirs<S>,
    dd: &Dirs<D>,
    key: &[u8],
    meta: &Meta,
) -> io::Result<bool> {
    if cp.xattrs.is_none() {
        return Ok(false);
    }
    let (s, d) = (cp.src, cp.dst);
    let (sdir, sname) = sd.at(s, key)?;
    let (ddir, dname) = dd.at(d, key)?;
    match cp.xattr_diff(&sdir, Some(&sname), &ddir, Some(&dname), meta.kind)? {
        Some((want, have)) => cp
            .put_xattrs(&ddir, Some(&dname), meta, &want, Some(&have))
            .map(|()| true),
        None => Ok(false),
    }
}

/// Copy `c.src` to `c.dst` (the engine's file copy: temporary + commit, so
/// never visible half-written, paced and counted); returns the source's
/// metadata the copy was made from, the target's afterwards, and where
/// the entry it replaced was kept (the copier's keeper, if any: when it
/// cannot keep, nothing is replaced).
fn copy_one<S: Store, D: Store>(
    cp: &Copier<'_, S, D>,
    sd: &Dirs<S>,
    dd: &Dirs<D>,
    c: &Copy,
) -> io::Result<(Meta, Meta, Option<Vec<u8>>)> {
    let (s, d) = (cp.src, cp.dst);
    let (sdir, sname) = sd.at(s, &c.src)?;
    let (ddir, dname) = dd.at(d, &c.dst)?;
    // The target must still be what the plan saw: absent, or unchanged
    // since the last sync.
    if !still(d.stat(&ddir, &dname)?.as_ref(), c.expect.as_ref()) {
        return Err(changed_err());
    }
    let mut from = c.meta;
    let rel = path_of(&c.dst);
    let kept;
    if c.meta.kind == Kind::Symlink {
        let target = s.read_link(&sdir, &sname)?;
        // The entry a symlink replaces is kept first (left in place where
        // the store can: the new link replaces it in one step).
        kept = match (cp.keep, &c.expect) {
            (Some(k), Some(old)) => Some(k.keep(
                d,
                &ddir,
                &dname,
                &rel,
                &Planned::new(old, cp.mtime_step),
                true,
            )?),
            _ => None,
        };
        d.create_symlink(&ddir, &dname, &target, &c.meta)?;
        cp.new_entry_xattrs(&sdir, &sname, &ddir, &dname, &c.meta)?;
    } else {
        let done = cp.copy_file(FileCopy {
            sdir: &sdir,
            sname: &sname,
            ddir: &ddir,
            name: &dname,
            rel: &rel,
            meta: &c.meta,
            old: c.expect.as_ref(),
        })?;
        from = done.meta;
        kept = done.kept;
        if let Some(m) = d.meta_after_commit(&from) {
            return Ok((from, m, kept));
        }
    }
    let now = d
        .stat(&ddir, &dname)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "vanished after the copy"))?;
    Ok((from, now, kept))
}
