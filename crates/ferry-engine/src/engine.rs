//! The engine: scan → plan → transfer → write, on a fixed pool of workers.
//!
//! A task is either one directory pair to scan and plan, or a batch of files
//! of one directory to transfer. Scanning a directory lists both sides,
//! merge-joins them ([`crate::plan`]), performs the cheap steps at once
//! (mkdir, symlinks, deletes, metadata) and pushes file batches and
//! subdirectories as new tasks, so copies start while the rest of the tree is
//! still being listed. Each directory node counts its outstanding children;
//! the last one to finish sets the directory's metadata (mtime after its
//! content) and reports to its parent.
//!
//! (Over 800 lines: scan, plan, transfer and removal of copy/sync share the engine's state; each
//! stage is a method group in data-flow order.)

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::bwlimit::Limiter;
use crate::copy::{Copier, FileCopy};
use crate::entry::{join, same_names, Kind, Listing, Meta};
use crate::filter::{drop_names, Filter};
use crate::keep::{self, Keeper};
use crate::plan::{meta_change, plan_dir, PlanOptions, Step};
use crate::report::{Action, Reporter, Stats, Summary};
use crate::special::SpecialBits;
use crate::store::{
    is_legacy_partial_name, is_temp_name, Committing, ListError, MetaChange, Store, StoreExt,
};
use crate::walk::{self, Queue, Visitor};
use crate::xattr::{XattrRun, XattrSel};

mod delete;
mod finish;
mod links;
mod plan;
mod scan;
mod specials;
mod transfer;
use links::{How, Links, Outcome};
mod guard;
pub use guard::{may_remove, Barrier, Guard, RemovalsStopped, WINDOW as MAX_DELETE_WINDOW};
mod scoped;
pub use scoped::Scope;

/// Files per transfer task, at most.
const BATCH_FILES: usize = 64;
/// Files per transfer task where a store waits a round trip per file: small
/// tasks, so that the workers (many, for such stores) all have files.
const BATCH_FILES_LATENCY: usize = 8;
/// Commits a worker leaves unconfirmed at most
/// ([`PipelineStore::commit_nowait`](crate::store::PipelineStore::commit_nowait)): a batch's files
/// are sent before their results are waited for.
const COMMITS_IN_FLIGHT: usize = 64;
/// Bytes per transfer task, at most (a bigger file gets a task of its own).
const BATCH_BYTES: u64 = 8 << 20;
/// Why a socket is skipped (the `skip` note and record).
const SOCKET_SKIP: &str = "socket in SRC: not copied (a socket is only an address that a running program listens on; ferry does not recreate it)";
/// Why an entry of a type ferry does not know is skipped.
const OTHER_SKIP: &str = "special file of an unknown type in SRC: not copied";
/// Why fifos and device nodes are skipped where the destination cannot
/// store them (said once per run; the others are `skip` actions).
const NODE_SKIP: &str = "fifo or device node in SRC: the destination cannot store special files (fifos, device nodes); this note is shown once, the others are skipped too";

/// One-way mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Add and update, never delete.
    #[default]
    Copy,
    /// Also delete what the source lacks.
    Sync,
}

/// Options of a copy or sync run. The default is a copy with every
/// option off, as `ferry copy SRC DST` with no flag but `-j 1`.
#[derive(Debug, Default)]
pub struct Options {
    /// Copy or sync.
    pub mode: Mode,
    /// Plan and report, change nothing.
    pub dry_run: bool,
    /// Compare content of same-size files.
    pub checksum: bool,
    /// fsync each file before renaming it into place.
    pub fsync: bool,
    /// Worker threads (0: one).
    pub jobs: usize,
    /// More worker threads than `jobs`, once known: a count that depends
    /// on something measured while the run begins (a remote link's round
    /// trip), taken when it comes ([`crate::pool::Pool::run_growing`]).
    pub more_jobs: Option<MoreJobs>,
    /// Exclude rules.
    pub filter: Option<Filter>,
    /// Bandwidth limit over all transfers together (`--bwlimit`).
    pub bwlimit: Option<Limiter>,
    /// Refuse a run that would remove more than this from the destination
    /// (`--max-delete`).
    pub max_delete: Option<MaxDelete>,
    /// Go ahead even when the source root is empty and the destination is
    /// not (`sync --force`).
    pub force: bool,
    /// Extended attributes and ACLs to keep (`-X`, `-A`), where both
    /// stores keep them.
    pub xattrs: XattrSel,
    /// Names of one file in the source are names of one file in the
    /// destination (`-H`, see `engine/links.rs`).
    pub hard_links: bool,
    /// When changed files go by delta (`--delta`, `--whole-file`).
    pub delta: crate::delta::Mode,
    /// Keep what the run replaces or removes in the destination, first
    /// (`--backup-dir`, `--suffix`, `--versions`; see [`crate::keep`]);
    /// `None`: replaced and removed for good.
    pub keep: Option<Arc<Keeper>>,
    /// Apply setuid, setgid and sticky bits from a source whose modes are
    /// not this machine's (`--keep-special-bits`; see [`crate::special`]).
    pub keep_special_bits: bool,
}

/// [`Options::more_jobs`]: the worker count, once known (never blocks).
#[derive(Clone)]
pub struct MoreJobs(pub Arc<dyn Fn() -> Option<usize> + Send + Sync>);

impl std::fmt::Debug for MoreJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MoreJobs")
    }
}

/// `--max-delete N` or `--max-delete P%`: how many destination entries a
/// run may remove (each entry of a removed tree counts, as in the summary's
/// `files_deleted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxDelete {
    /// At most this many entries.
    Count(u64),
    /// At most this percentage of the entries the destination has.
    Percent(u8),
}

impl MaxDelete {
    /// Parse `N` or `P%` (P from 0 to 100).
    /// Returns `String`: clap's `value_parser` contract (the message is its usage error).
    pub fn parse(s: &str) -> Result<MaxDelete, String> {
        let t = s.trim();
        let bad =
            || format!("invalid --max-delete {s:?} (a count like 100, or a percentage like 10%)");
        match t.strip_suffix('%') {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= 100 => Ok(MaxDelete::Percent(p)),
                _ => Err(bad()),
            },
            None => t.parse().map(MaxDelete::Count).map_err(|_| bad()),
        }
    }

    /// How many removals are allowed out of `dst_entries`.
    pub fn allowed(self, dst_entries: u64) -> u64 {
        match self {
            MaxDelete::Count(n) => n,
            MaxDelete::Percent(p) => (u128::from(dst_entries) * u128::from(p) / 100) as u64,
        }
    }
}

impl std::fmt::Display for MaxDelete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MaxDelete::Count(n) => write!(f, "{n}"),
            MaxDelete::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// A run refused before it changed anything (exit 2): the reason, one line.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl Refused {
    /// The refusal carried by `e`, if it is one.
    pub fn of(e: &io::Error) -> Option<&Refused> {
        e.get_ref().and_then(|x| x.downcast_ref::<Refused>())
    }
}

fn refused(msg: String) -> io::Error {
    io::Error::other(Refused(msg))
}

/// A run's result.
pub type RunResult = Summary;

/// Both roots as a run opens them: SRC's, and DST's if it exists.
type Roots<S, D> = ((<S as Store>::Dir, Meta), Option<(<D as Store>::Dir, Meta)>);

/// Both listings of a directory, with the entries each could not read.
struct Lists {
    src: Listing,
    errors: Vec<ListError>,
    dst: Listing,
    derr: Vec<ListError>,
}

/// A directory listed and planned: its listings, the steps, the names the
/// source could not read (left alone in the destination), and whether its
/// removals are held.
struct PlannedDir {
    src: Listing,
    dst: Listing,
    steps: Vec<Step>,
    unreadable: Vec<Vec<u8>>,
    held: bool,
}

struct Node<S: Store, D: Store> {
    rel: Vec<u8>,
    src: S::Dir,
    /// `None` only in a dry run, for a directory that does not exist yet.
    dst: Option<D::Dir>,
    src_meta: Meta,
    /// Metadata of the destination directory before the run; `None` when
    /// it was just created (or replaced) and needs all of its metadata.
    dst_meta: Option<Meta>,
    pending: AtomicUsize,
    dirty: AtomicBool,
    /// The destination directory was read-only and made writable for this
    /// run: its mode is set back when it completes.
    unlocked: AtomicBool,
    parent: Option<Arc<Node<S, D>>>,
    /// Transfer tasks of this directory running or queued in the pool, and
    /// the batches waiting for one of them (see `Engine::lanes`).
    lanes: Mutex<(usize, VecDeque<FileBatch>)>,
}

/// What is at a subdirectory's name in the destination before the run.
#[derive(Clone, Copy)]
enum DstAt {
    Nothing,
    Dir(Meta),
    /// Something else (file, symlink): removed first.
    Other(Meta),
}

/// A directory of the walk: the root's node, or a subdirectory to open.
enum DirTask<S: Store, D: Store> {
    Scan(Arc<Node<S, D>>),
    Dir {
        parent: Arc<Node<S, D>>,
        name: CString,
        src_meta: Meta,
        dst: DstAt,
    },
}

/// A batch of files of one directory to transfer.
struct Files<S: Store, D: Store> {
    node: Arc<Node<S, D>>,
    batch: FileBatch,
}

/// The engine's queue on the walk's pool.
type Q<'q, S, D> = Queue<'q, DirTask<S, D>, Files<S, D>>;

/// Runs copy and sync between two stores.
pub struct Engine<'a, S: Store, D: Store> {
    src: &'a S,
    dst: &'a D,
    opts: &'a Options,
    stats: &'a Stats,
    rep: &'a dyn Reporter,
    plan: PlanOptions,
    /// Transfer tasks of one directory at once, at most: creating entries
    /// in one directory serializes on its lock, so more workers there only
    /// contend (500,000 files in one directory: 2 lanes 11.6 s, 4 lanes
    /// 20.7 s). Unlimited when the source is latency-bound (S3).
    lanes: usize,
    /// Files per transfer task, at most.
    batch_files: usize,
    /// Change nothing: `opts.dry_run`, or the counting pass of `--max-delete`.
    dry_run: bool,
    /// The counting pass: only what would be removed matters (no metadata
    /// refined with a request per object).
    counting: bool,
    /// Compare content (`opts.checksum`; never in the counting pass).
    checksum: bool,
    /// Removals still allowed (`--max-delete`); `u64::MAX`: no limit.
    budget: AtomicU64,
    /// Why the run was refused (nothing changed), once it is.
    refusal: Mutex<Option<String>>,
    /// Directories (relative paths) whose source listing held entries no
    /// path can name ([`ListError::for_dir`]): nothing in them or below
    /// them is deleted.
    held: Mutex<Vec<Vec<u8>>>,
    /// The attributes kept (`opts.xattrs` where both stores keep them).
    xattrs: XattrRun,
    /// A fifo or device node was skipped for a destination that cannot
    /// store them (the note is shown once).
    nodes_noted: AtomicBool,
    /// The hard-link groups met so far (`-H`).
    links: Option<Links<S, D>>,
    /// The coarser mtime step of the two stores (`Features::mtime_step_ns`):
    /// mtimes are compared, and written, to it.
    mtime_step: u32,
    /// A scoped run's deep directories (`run_scoped`); `None`: every
    /// subdirectory is walked.
    scope: Option<Vec<Vec<u8>>>,
    /// A scoped run's files seen written (`Scope::written`, sorted): their
    /// content is compared even when size and mtime match.
    written: Vec<Vec<u8>>,
    /// The source's setuid, setgid and sticky bits: dropped where they
    /// enter the run unless its modes are this machine's (see
    /// [`crate::special`]).
    pub(crate) special: SpecialBits,
    /// The backup directory when it is inside the destination (`--backup-dir`):
    /// its parent's path and its name, left out of the run on both sides.
    backup_in: Option<(Vec<u8>, Vec<u8>)>,
    /// Both roots and the directories above them, by device and inode:
    /// met again in a listing, the run is refused (`walk::Aliases`).
    aliases: Option<walk::Aliases>,
    /// Set with `refusal` (the walk stops: nothing more is acted on).
    halted: AtomicBool,
    /// The notes that SRC's own `.ferry-versions`, and an entry of SRC
    /// named like the backup directory, are left out were given.
    left_out_noted: [AtomicBool; 2],
    /// A watch's runs: the roots' identity and the `--max-delete` window
    /// they share (`engine/guard.rs`).
    guard: Option<&'a Guard>,
    /// In a watch, SRC's root was found gone (or another directory) during
    /// the run: its remaining removals are not done (said once).
    root_lost: AtomicBool,
    /// Removals SRC's watcher had seen when the run started.
    removals_at_start: u64,
    /// SRC's and DST's listings made ahead of the run ([`Engine::prefetched`]).
    prefetch: [Option<&'a crate::prefetch::Prefetch>; 2],
}

/// Mtimes of `list` truncated to `step` nanoseconds.
fn coarsen(list: &mut Listing, step: u32) {
    for e in list.entries_mut() {
        e.meta.mtime_nsec = crate::store::cut_nsec(e.meta.mtime_nsec, step);
    }
}

impl<'a, S: Store, D: Store> Engine<'a, S, D> {
    /// An engine over two stores.
    pub fn new(
        src: &'a S,
        dst: &'a D,
        opts: &'a Options,
        stats: &'a Stats,
        rep: &'a dyn Reporter,
    ) -> Self {
        let plan = PlanOptions {
            delete: opts.mode == Mode::Sync,
            checksum: opts.checksum,
            owner: dst.features().preserves_owner && src.features().preserves_owner,
            partial_cutoff: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
                - crate::store::PARTIAL_KEEP_SECS,
        };
        Engine {
            src,
            dst,
            opts,
            stats,
            rep,
            plan,
            batch_files: if src.features().latency_bound || dst.features().latency_bound {
                BATCH_FILES_LATENCY
            } else {
                BATCH_FILES
            },
            lanes: if src.features().latency_bound {
                usize::MAX
            } else {
                dst.features().dir_write_lanes.max(1)
            },
            dry_run: opts.dry_run,
            counting: false,
            checksum: opts.checksum,
            budget: AtomicU64::new(u64::MAX),
            refusal: Mutex::new(None),
            held: Mutex::new(Vec::new()),
            xattrs: XattrRun::new(opts.xattrs, src.xattr_caps(), dst.xattr_caps()),
            nodes_noted: AtomicBool::new(false),
            links: opts
                .hard_links
                .then(|| Links::new(src.has_hard_links() && dst.has_hard_links())),
            mtime_step: crate::store::mtime_step(src, dst),
            scope: None,
            written: Vec::new(),
            special: SpecialBits::new(src, dst, opts.keep_special_bits),
            backup_in: opts.keep.as_deref().and_then(Keeper::inside_root).map(|p| {
                let (dir, name) = keep::split_parent(p);
                (dir.to_vec(), name.to_vec())
            }),
            aliases: walk::Aliases::new(["SRC", "DST"], [src.root_ids(), dst.root_ids()]),
            halted: AtomicBool::new(false),
            left_out_noted: [AtomicBool::new(false), AtomicBool::new(false)],
            guard: None,
            root_lost: AtomicBool::new(false),
            removals_at_start: 0,
            prefetch: [None, None],
        }
    }

    /// Listings of SRC's tree (`side` 0) or DST's (1) made ahead of the
    /// run, while the other side connected: the walk takes them.
    pub fn prefetched(mut self, side: usize, p: &'a crate::prefetch::Prefetch) -> Self {
        self.prefetch[side] = Some(p);
        self
    }

    /// In a watch, before each removal: SRC's root is still the directory
    /// watched (one open and statx of it by its path) and its watcher saw
    /// no removal since the run started, so that a root removed or
    /// unmounted while the run removes stops its removals there. False
    /// once it is not (said once, as an error of the run: a full run
    /// follows, held until removals are quiet).
    fn src_root_alive(&self) -> bool {
        let Some(g) = self.guard else {
            return true;
        };
        if self.root_lost.load(Ordering::Relaxed) {
            return false;
        }
        let root = self.src.open_root().ok().flatten();
        match guard::may_remove(
            g,
            0,
            "SRC",
            root.as_ref().map(|r| &r.1),
            self.removals_at_start,
        ) {
            Ok(()) => true,
            Err(why) => {
                if !self.root_lost.swap(true, Ordering::Relaxed) {
                    self.fail(b"", &io::Error::other(why));
                }
                false
            }
        }
    }

    /// The runs of a watch: each checks the roots' identity and counts its
    /// removals in `--max-delete`'s window, in `g` (see `engine/guard.rs`).
    pub fn guarded(mut self, g: &'a Guard) -> Self {
        self.guard = Some(g);
        self.removals_at_start = g.base(0);
        self
    }

    /// A watch was asked to stop ([`Guard::stop`]): no entry is begun.
    fn stopping(&self) -> bool {
        self.guard.is_some_and(Guard::stopping)
    }

    /// The check of `Engine::open_roots` alone: SRC exists, and in a
    /// watch both roots are the ones watched (a refusal if not).
    pub fn check_roots(&self) -> io::Result<()> {
        self.open_roots().map(drop)
    }

    /// Both roots opened (SRC must exist; DST may not yet) and checked
    /// against the identity the watch recorded: the one check of every
    /// run, full or scoped, counting pass or not, before anything changes.
    fn open_roots(&self) -> io::Result<Roots<S, D>> {
        let src = self
            .src
            .open_root()?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "source does not exist"))?;
        let dst = self.dst.open_root()?;
        // (A counting pass with --force leaves the adopting, and its
        // note, to the run itself.)
        if let Some(g) = self.guard.filter(|_| !(self.counting && self.opts.force)) {
            for (side, m) in [(0, Some(&src.1)), (1, dst.as_ref().map(|d| &d.1))] {
                let Some(m) = m else { continue };
                match g.check(side, ["SRC", "DST"][side], m, self.opts.force) {
                    Ok(None) => {}
                    Ok(Some(note)) => self.rep.note(&note),
                    Err(r) => return Err(io::Error::other(r)),
                }
            }
        }
        Ok((src, dst))
    }

    /// The `--max-delete` counting pass: the same walk, changing nothing,
    /// reading no file content, reporting nothing, counting into `stats`.
    fn counter<'b>(&'b self, stats: &'b Stats) -> Engine<'b, S, D> {
        static QUIET: crate::report::Quiet = crate::report::Quiet;
        let mut e = Engine::new(self.src, self.dst, self.opts, stats, &QUIET);
        e.guard = self.guard;
        e.dry_run = true;
        e.counting = true;
        e.checksum = false;
        e.plan.checksum = false;
        e.links = None;
        e
    }

    /// Copy or sync the whole tree: the source root must be a directory.
    ///
    /// With `--max-delete`, a first pass plans the whole run without
    /// changing anything (listings only, no file content read) and counts
    /// what it would remove: over the limit, the run is refused before any
    /// change. The run itself still never removes more than the limit (the
    /// trees may change in between): each removal takes its share of the
    /// allowance first, and what finds none left is reported as an error.
    pub fn run_tree(&self) -> io::Result<RunResult> {
        let start = Instant::now();
        if let Some(limit) = self.opts.max_delete {
            if !self.dry_run && self.dst.open_root()?.is_some() {
                let stats = Stats::default();
                self.counter(&stats).walk()?;
                let allowed = self.allowance(limit, &stats, true)?;
                self.budget.store(allowed, Ordering::Relaxed);
            }
        }
        let before = self.stats.files_deleted.load(Ordering::Relaxed);
        let walked = self.walk();
        self.count_removed(before);
        walked?;
        if let (Some(limit), true) = (self.opts.max_delete, self.dry_run) {
            self.check_limit(limit, self.stats)?;
        }
        self.xattr_note();
        Ok(self.stats.summary(start.elapsed()))
    }

    /// The one note of a run whose destination refused attributes, and
    /// the one of a run that dropped SRC's setuid, setgid or sticky bits.
    pub(crate) fn xattr_note(&self) {
        if let Some(n) = self.xattrs.note("DST") {
            self.rep.note(&n);
        }
        if let Some(n) = self.special.note("SRC") {
            self.rep.note(&n);
        }
    }

    /// One walk over the tree (see `run_tree`).
    fn walk(&self) -> io::Result<()> {
        let ((src_dir, mut src_meta), dst) = self.open_roots()?;
        self.special.fix(&mut src_meta);
        let (dst_dir, dst_meta) = match dst {
            Some((d, m)) => (Some(d), Some(m)),
            None if self.dry_run => (None, None),
            None => {
                let d = self.dst.create_root()?;
                Stats::add(&self.stats.dirs_created, 1);
                // In a watch, the root it made is the one watched.
                if let (Some(g), Ok(Some((_, m)))) = (self.guard, self.dst.open_root()) {
                    g.seen(1, &m);
                }
                if !self.src.features().dir_meta {
                    // Its final mode at once (no times to set after its
                    // content): a kill cannot leave it 0700, and an
                    // existing root's mode is never changed (see `done`).
                    let mode = MetaChange {
                        mode: true,
                        ..MetaChange::default()
                    };
                    if let Err(e) = self.dst.set_dir_meta(&d, &src_meta, mode) {
                        self.fail(b"", &e);
                    }
                }
                (Some(d), None)
            }
        };
        if dst_meta.is_none() {
            self.rep.action(Action::Mkdir, b"", 0);
        }
        let root = Arc::new(Node {
            rel: Vec::new(),
            src: src_dir,
            dst: dst_dir,
            src_meta,
            dst_meta,
            pending: AtomicUsize::new(1),
            dirty: AtomicBool::new(false),
            unlocked: AtomicBool::new(false),
            parent: None,
            lanes: Mutex::new((0, VecDeque::new())),
        });
        let hinted = self.expect_dirs(&root, true);
        walk::walk_growing(
            &Walker(self),
            self.opts.jobs,
            self.opts.more_jobs.as_ref(),
            vec![DirTask::Scan(root.clone())],
        );
        if hinted {
            self.expect_dirs(&root, false);
        }
        match self.refusal.lock().take() {
            Some(msg) => Err(refused(msg)),
            None => Ok(()),
        }
    }

    /// Before the walk: the tree listed ahead on one side tells the other
    /// side's store which directories it likely has
    /// ([`PipelineStore::expect_dirs`](crate::store::PipelineStore::expect_dirs)): a store
    /// over a network opens and lists them now, all levels in one round
    /// trip, instead of one round trip per level as the walk reaches them.
    /// After the walk (`before` false): an empty hint, so that what was
    /// opened ahead and not taken is let go. True when a hint was given.
    fn expect_dirs(&self, root: &Node<S, D>, before: bool) -> bool {
        use crate::prefetch::{HINT_DIRS, HINT_ENTRIES};
        let filter = self.opts.filter.as_ref();
        let dirs = |p: &crate::prefetch::Prefetch| match before {
            true => p
                .dirs(HINT_DIRS, HINT_ENTRIES)
                .into_iter()
                .filter(|rel| walks_into(filter, rel))
                .collect(),
            false => Vec::new(),
        };
        if let (Some(p), Some(d), Some(_)) = (self.prefetch[0], &root.dst, &root.dst_meta) {
            self.dst.expect_dirs(d, &dirs(p));
            return true;
        }
        if let Some(p) = self.prefetch[1] {
            self.src.expect_dirs(&root.src, &dirs(p));
            return true;
        }
        false
    }

    fn path(&self, node: &Node<S, D>, name: &[u8]) -> Vec<u8> {
        join(&node.rel, name)
    }

    fn fail(&self, path: &[u8], err: &io::Error) {
        Stats::add(&self.stats.errors, 1);
        self.rep.error(path, err);
    }

    /// Refuse the run (the first refusal is the one said) and stop acting.
    fn refuse(&self, msg: String) {
        let mut r = self.refusal.lock();
        if r.is_none() {
            *r = Some(msg);
        }
        self.halted.store(true, Ordering::Relaxed);
    }
}

/// Whether a walk with `filter` goes into directory `rel` (relative to its
/// root), as far as its name tells: not one the run leaves out (the
/// exclude rules, kept versions). What is under one it leaves out is not
/// walked either: a hint of the directories a store is to open ahead of
/// the walk leaves those out (the engine's, and one given to a store
/// before the run: the ssh store's first write).
pub fn walks_into(filter: Option<&Filter>, rel: &[u8]) -> bool {
    let (dir, name) = match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&b""[..], rel),
    };
    name != crate::keep::VERSIONS_DIR && !filter.is_some_and(|f| f.excluded(dir, name, true))
}

/// The engine as the visitor of its walk.
struct Walker<'e, 'a, S: Store, D: Store>(&'e Engine<'a, S, D>);

impl<S: Store, D: Store> Visitor for Walker<'_, '_, S, D> {
    type Dir = DirTask<S, D>;
    type Work = Files<S, D>;

    fn dir(&self, task: DirTask<S, D>, q: &Q<'_, S, D>) {
        let e = self.0;
        match task {
            DirTask::Scan(node) => e.scan(&node, q),
            DirTask::Dir {
                parent,
                name,
                src_meta,
                dst,
            } => {
                // The child node reports to its parent when it completes;
                // if it could not be opened, the task does.
                match e.open_node(&parent, &name, src_meta, dst) {
                    Some(node) => e.scan(&node, q),
                    None => e.done(&parent),
                }
            }
        }
    }

    fn work(&self, Files { node, batch }: Files<S, D>, _: &Q<'_, S, D>) {
        let e = self.0;
        let mut batch = Some(batch);
        while let Some(b) = batch {
            // Commits the store confirms later (`PipelineStore::commit_nowait`):
            // the batch's files are all sent, then their results are waited
            // for and reported, before the directory may be finished.
            let mut committing: VecDeque<Transfer<'_>> = VecDeque::new();
            e.open_ahead(&node, &b);
            for (i, f) in b.files.entries().iter().enumerate() {
                if e.stopping() {
                    break;
                }
                let name = b.files.cname(f);
                if let (Some(l), true) = (&e.links, f.meta.nlink > 1) {
                    let out = e.transfer(&node, name, &f.meta, b.dst[i], b.check[i]);
                    e.led(l, &node, name, &f.meta, b.dst[i], out);
                    continue;
                }
                match e.transfer_start(&node, name, &f.meta, b.dst[i], b.check[i], true) {
                    Transfer::Over(_) => {}
                    t if t.confirmed() => {
                        e.transfer_end(&node, t);
                    }
                    t => {
                        committing.push_back(t);
                        if committing.len() > COMMITS_IN_FLIGHT {
                            let t = committing.pop_front().expect("a commit");
                            e.transfer_end(&node, t);
                        }
                    }
                }
            }
            for t in committing {
                e.transfer_end(&node, t);
            }
            e.done(&node);
            // This lane goes on with the directory's waiting batches.
            let mut l = node.lanes.lock();
            batch = l.1.pop_front();
            if batch.is_none() {
                l.0 -= 1;
            }
        }
    }
}

/// A kind as a word in messages.
fn kind_word(k: Kind) -> &'static str {
    match k {
        Kind::Dir => "directory",
        Kind::CharDev => "character device",
        Kind::BlockDev => "block device",
        Kind::Other => "special file of an unknown type",
        k => k.as_str(),
    }
}

/// A file transfer begun ([`Engine::transfer_start`]). Not boxed: one
/// lives per file in flight, and a box would cost an allocation per file.
#[allow(clippy::large_enum_variant)]
enum Transfer<'n> {
    /// Over: reported (copied, unchanged or failed) or nothing to do.
    Over(Outcome),
    /// Copied up to a commit that may not be confirmed yet: reported by
    /// [`Engine::transfer_end`].
    Committing {
        path: Vec<u8>,
        action: Action,
        copied: crate::copy::Copied,
        dst_meta: Option<Meta>,
        commit: Committing<'n>,
    },
}

impl Transfer<'_> {
    /// True when its result is known (nothing to wait for).
    fn confirmed(&self) -> bool {
        match self {
            Transfer::Over(_) => true,
            Transfer::Committing { commit, .. } => commit.is_done(),
        }
    }
}

/// Files of one directory gathered into one transfer task.
#[derive(Default)]
struct FileBatch {
    files: Listing,
    dst: Vec<Option<Meta>>,
    check: Vec<bool>,
    bytes: u64,
}

impl FileBatch {
    fn add(&mut self, name: &[u8], meta: Meta, dst: Option<Meta>, check: bool) {
        self.files.push(name, meta);
        self.dst.push(dst);
        self.check.push(check);
        self.bytes += meta.size;
    }

    fn full(&self, files: usize) -> bool {
        self.files.len() >= files || self.bytes >= BATCH_BYTES
    }
}
