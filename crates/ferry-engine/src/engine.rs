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

use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use crate::bwlimit::Limiter;
use crate::copy::Copier;
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

mod links;
use links::{How, Links, Outcome};
mod guard;
pub use guard::{may_remove, Guard, WINDOW as MAX_DELETE_WINDOW};
mod scoped;
pub use scoped::Scope;

/// Files per transfer task, at most.
const BATCH_FILES: usize = 64;
/// Files per transfer task where a store waits a round trip per file: small
/// tasks, so that the workers (many, for such stores) all have files.
const BATCH_FILES_LATENCY: usize = 8;
/// Commits a worker leaves unconfirmed at most ([`Store::commit_nowait`]):
/// a batch's files are sent before their results are waited for.
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Add and update, never delete.
    Copy,
    /// Also delete what the source lacks.
    Sync,
}

/// Options of a copy or sync run.
#[derive(Debug)]
pub struct Options {
    /// Copy or sync.
    pub mode: Mode,
    /// Plan and report, change nothing.
    pub dry_run: bool,
    /// Compare content of same-size files.
    pub checksum: bool,
    /// fsync each file before renaming it into place.
    pub fsync: bool,
    /// Worker threads.
    pub jobs: usize,
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
        }
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
        self.removals_at_start = g.removals(0);
        self
    }

    /// A watch was asked to stop ([`Guard::stop`]): no entry is begun.
    fn stopping(&self) -> bool {
        self.guard.is_some_and(Guard::stopping)
    }

    /// The check of [`Engine::open_roots`] alone: SRC exists, and in a
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
                    Err(msg) => return Err(guard::refusal(msg)),
                }
            }
        }
        Ok((src, dst))
    }

    /// The removals a run may make, given what its counting pass counted
    /// (`full`: over the whole tree); a refusal when it counted more. In a
    /// watch, the removals of the window's earlier runs are taken from
    /// the limit first, and `P%` is of the entries the last full run saw.
    fn allowance(&self, limit: MaxDelete, counted: &Stats, full: bool) -> io::Result<u64> {
        let Some(g) = self.guard else {
            return self.check_limit(limit, counted);
        };
        if full {
            g.set_dst_total(counted.dst_entries.load(Ordering::Relaxed));
        }
        let would = counted.files_deleted.load(Ordering::Relaxed);
        let total = match g.dst_total() {
            0 => counted.dst_entries.load(Ordering::Relaxed),
            n => n,
        };
        let before = g.removed(1, Instant::now());
        let allowed = limit.allowed(total).saturating_sub(before);
        if would > allowed {
            let of = match limit {
                MaxDelete::Percent(_) => format!(" of {total} entries"),
                MaxDelete::Count(_) => String::new(),
            };
            let less = match before {
                0 => String::new(),
                n => format!(
                    ", less the {n} removed by this watch's runs of the last {} minutes",
                    g.window().as_secs() / 60
                ),
            };
            return Err(refused(format!(
                "refusing to delete {would} entries in DST (--max-delete {limit}{of}{less}); nothing was changed"
            )));
        }
        Ok(allowed)
    }

    /// Count what a run removed into the watch's window.
    fn count_removed(&self, before: u64) {
        if let Some(g) = self.guard {
            g.add_removed(
                1,
                self.stats
                    .files_deleted
                    .load(Ordering::Relaxed)
                    .saturating_sub(before),
            );
        }
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

    /// Removals allowed by `limit` given what a (dry) walk counted; a
    /// refusal when it counted more.
    fn check_limit(&self, limit: MaxDelete, stats: &Stats) -> io::Result<u64> {
        let would = stats.files_deleted.load(Ordering::Relaxed);
        let total = stats.dst_entries.load(Ordering::Relaxed);
        let allowed = limit.allowed(total);
        if would > allowed {
            let what = match limit {
                MaxDelete::Percent(_) => format!(
                    "{would} of {total} entries in DST (--max-delete {limit} allows {allowed})"
                ),
                MaxDelete::Count(_) => format!("{would} entries in DST (--max-delete {limit})"),
            };
            return Err(refused(format!(
                "refusing to delete {what}; nothing was changed"
            )));
        }
        Ok(allowed)
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
        walk::walk(&Walker(self), self.opts.jobs, vec![DirTask::Scan(root)]);
        match self.refusal.lock().expect("refusal").take() {
            Some(msg) => Err(refused(msg)),
            None => Ok(()),
        }
    }

    /// True when nothing in directory `rel` may be deleted: it, or a
    /// directory above it, listed entries no path can name (`unnamed`: this
    /// one did; it is noted for the directories below).
    fn held(&self, rel: &[u8], unnamed: bool) -> bool {
        let mut h = self.held.lock().expect("held");
        if unnamed {
            h.push(rel.to_vec());
            return true;
        }
        h.iter().any(|d| {
            d.is_empty() || rel == &d[..] || (rel.starts_with(d) && rel.get(d.len()) == Some(&b'/'))
        })
    }

    fn path(&self, node: &Node<S, D>, name: &[u8]) -> Vec<u8> {
        join(&node.rel, name)
    }

    fn fail(&self, path: &[u8], err: &io::Error) {
        Stats::add(&self.stats.errors, 1);
        self.rep.error(path, err);
    }

    /// Keep the destination entry `name` of `dir` (at `path`, listed as
    /// `meta`) before the run replaces it (`replacing`) or removes it, when
    /// the run keeps what it replaces (`Options::keep`; a directory is
    /// never kept whole, its entries are). In a dry run (`dir` may then be
    /// `None`) it is only said. `Ok(true)`: kept (and, unless `replacing`,
    /// gone from `dir`); `Ok(false)`: nothing to keep. An error: nothing
    /// was kept, the entry must be left as it is.
    fn keep_old(
        &self,
        dir: Option<&D::Dir>,
        name: &CStr,
        path: &[u8],
        meta: &Meta,
        replacing: bool,
    ) -> io::Result<bool> {
        let Some(k) = self.opts.keep.as_deref() else {
            return Ok(false);
        };
        if meta.kind == Kind::Dir {
            return Ok(false);
        }
        let to = match dir {
            Some(d) if !self.dry_run => {
                k.keep(self.dst, d, name, path, meta, replacing, self.mtime_step)?
            }
            Some(d) => k.place_in(self.dst, d, path),
            _ => {
                let (base, at) = k.target(path, 1);
                keep::shown(&base, &at)
            }
        };
        self.kept(path, &to, meta.size);
        Ok(true)
    }

    /// Count and report an entry kept at `to`.
    fn kept(&self, path: &[u8], to: &[u8], size: u64) {
        Stats::add(&self.stats.files_kept, 1);
        Stats::add(&self.stats.bytes_kept, size);
        self.rep.kept(path, to, size);
    }

    /// Remove the destination entry `name` of `dir` (not a directory),
    /// kept first when the run keeps what it removes.
    fn remove_file(&self, dir: &D::Dir, name: &CStr, path: &[u8], meta: &Meta) -> io::Result<()> {
        if !self.keep_old(Some(dir), name, path, meta, false)? {
            // Only while it is still what was listed (else reported, left
            // for the next run).
            let at = crate::store::Planned::new(meta, self.mtime_step);
            self.dst.remove_planned(dir, name, &at)?;
        }
        Ok(())
    }

    /// Leave out of the listing of directory `rel` (of the source, or of
    /// the destination: `dst`) what the run never touches: the backup
    /// directory inside the destination, and in the destination the names
    /// `--suffix` protects (`.ferry-versions` is left out by the plan).
    fn drop_untouched(&self, rel: &[u8], list: &mut Listing, dst: bool) {
        if let Some((dir, name)) = &self.backup_in {
            if dir == rel {
                list.retain_names(|n| n != name.as_slice());
            }
        }
        if let (true, Some(k)) = (dst, self.opts.keep.as_deref()) {
            if list.entries().iter().any(|e| k.protects(list.name(e))) {
                list.retain_names(|n| !k.protects(n));
            }
        }
    }

    /// With `--suffix` alone, the source's names that end in the suffix
    /// are synced like any other: no keep may take them ([`Keeper::reserve`]).
    fn reserve_source_names(&self, node: &Node<S, D>, src_list: &Listing) {
        if let Some(k) = self.opts.keep.as_deref() {
            for e in src_list.entries() {
                let name = src_list.name(e);
                if k.protects(name) {
                    k.reserve(&self.path(node, name));
                }
            }
        }
    }

    /// Say once that SRC's `path`, named like `what`, is left out (`which`:
    /// 0 for `.ferry-versions`, 1 for the backup directory).
    fn left_out(&self, which: usize, path: &[u8], what: &str) {
        if !self.left_out_noted[which].swap(true, Ordering::Relaxed) {
            self.rep.note(&format!(
                "SRC {}: left out of the run ({what} has this name: ferry never copies or deletes it)",
                String::from_utf8_lossy(path)
            ));
        }
    }

    /// True for a path below the root that the run never touches:
    /// `.ferry-versions` or the backup directory inside the destination,
    /// or anything below them.
    fn untouched_path(&self, rel: &[u8]) -> bool {
        let mut at: Vec<u8> = Vec::new();
        for c in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            if keep::is_versions_dir(c) {
                return true;
            }
            if let Some((dir, name)) = &self.backup_in {
                if *dir == at && c == name.as_slice() {
                    return true;
                }
            }
            at = join(&at, c);
        }
        false
    }

    /// Refuse the run (the first refusal is the one said) and stop acting.
    fn refuse(&self, msg: String) {
        let mut r = self.refusal.lock().expect("refusal");
        if r.is_none() {
            *r = Some(msg);
        }
        self.halted.store(true, Ordering::Relaxed);
    }

    /// The refusal of listing `list` of directory `rel` on `side` when a
    /// subdirectory in it is a root, or above one, seen again.
    fn aliased(&self, side: &str, rel: &[u8], list: &Listing) -> bool {
        match self.aliases.as_ref().and_then(|a| a.check(side, rel, list)) {
            Some(msg) => {
                self.refuse(msg);
                true
            }
            None => false,
        }
    }

    /// Take `n` removals from the `--max-delete` allowance; an error (and
    /// nothing taken) when fewer are left.
    fn take_removals(&self, n: u64) -> io::Result<()> {
        self.budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(n))
            .map(|_| ())
            .map_err(|_| io::Error::other("not removed: the --max-delete limit is reached"))
    }

    /// `sync` of an empty source root (an unmounted mount point looks like
    /// this) into a destination that has entries would delete them all:
    /// refused unless `--force`. True when refused (nothing was changed).
    fn empty_src_refused(&self, src: &Listing, dst: &Listing) -> bool {
        let live = |l: &Listing| {
            l.entries()
                .iter()
                .filter(|e| !is_temp_name(l.name(e)))
                .count()
        };
        if self.opts.mode != Mode::Sync || self.opts.force || live(src) > 0 {
            return false;
        }
        let n = live(dst);
        if n == 0 {
            return false;
        }
        let (entries, them) = if n == 1 {
            ("entry", "it")
        } else {
            ("entries", "them")
        };
        *self.refusal.lock().expect("refusal") = Some(format!(
            "SRC is empty and DST has {n} {entries} at its top level: refusing to delete {them} (if SRC is an unmounted mount point, mount it; --force deletes {them})"
        ));
        true
    }

    /// Partial downloads older versions named `.ferry-tmp.part.<16 hex>`:
    /// ferry's own when they carry its resume record, then removed (and
    /// left out of the listing); any other entry of such a name is a user's.
    fn drop_legacy_partials(&self, node: &Node<S, D>, d: &D::Dir, list: &mut Listing) {
        let mut own: Vec<Vec<u8>> = Vec::new();
        for e in list.entries() {
            if is_legacy_partial_name(list.name(e)) && e.meta.kind == Kind::File {
                let c = list.cname(e);
                if self.dst.is_own_legacy_partial(d, c) {
                    self.remove_temp(node, c, Kind::File);
                    own.push(c.to_bytes().to_vec());
                }
            }
        }
        if !own.is_empty() {
            list.retain_names(|n| !own.iter().any(|o| o == n));
        }
    }

    /// Remove a stale temporary of ferry's (counted in the summary).
    fn remove_temp(&self, node: &Node<S, D>, name: &CStr, kind: Kind) {
        if self.dry_run {
            Stats::add(&self.stats.temps_removed, 1);
            return;
        }
        let Some(d) = &node.dst else { return };
        match self.dst.remove(d, name, kind == Kind::Dir) {
            Ok(_) => Stats::add(&self.stats.temps_removed, 1),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => self.fail(&self.path(node, name.to_bytes()), &e),
        }
    }

    /// An existing destination directory that is read-only (a copy of a
    /// read-only source directory, as a non-root user) is made writable
    /// when its plan changes entries in it; its mode is set back when the
    /// directory completes (`done`). A run killed in between leaves it
    /// writable, and the next run restores it.
    fn unlock_if_needed(&self, node: &Node<S, D>, steps: &[Step]) {
        let (Some(d), Some(m)) = (&node.dst, &node.dst_meta) else {
            return;
        };
        if self.dry_run || m.mode & 0o200 != 0 {
            return;
        }
        let changes = steps.iter().any(|s| {
            !matches!(
                s,
                Step::Same { .. } | Step::Recurse { .. } | Step::Skip { .. }
            )
        });
        if !changes {
            return;
        }
        match self.dst.make_writable(d) {
            Ok(true) => node.unlocked.store(true, Ordering::Relaxed),
            Ok(false) => {}
            Err(e) => self.fail(&node.rel, &e),
        }
    }

    /// With a store that lists approximate metadata (S3 without a HEAD per
    /// object): make exact the files present on both sides with the same
    /// size, the only ones compared by mtime and mode. Files to create take
    /// theirs from the reader as they are copied; a size change needs no
    /// compare. An entry whose metadata cannot be read is left alone on
    /// both sides (reported).
    fn refine(&self, node: &Node<S, D>, src: &mut Listing, dst: &mut Listing) {
        let (mut ws, mut wd) = (Vec::new(), Vec::new());
        same_names(src, dst, |i, j| {
            let (a, b) = (&src.entries()[i].meta, &dst.entries()[j].meta);
            if a.kind == Kind::File && b.kind == Kind::File && a.size == b.size {
                ws.push(i);
                wd.push(j);
            }
        });
        if ws.is_empty() {
            return;
        }
        let mut bad: Vec<Vec<u8>> = Vec::new();
        let mut errors = Vec::new();
        if self.src.features().approximate_meta {
            if let Err(e) = self.src.refine(&node.src, src, &ws, &mut errors) {
                self.fail(&node.rel, &e);
                bad.extend(ws.iter().map(|&i| src.name(&src.entries()[i]).to_vec()));
            }
        }
        if let (true, Some(d)) = (self.dst.features().approximate_meta, &node.dst) {
            if let Err(e) = self.dst.refine(d, dst, &wd, &mut errors) {
                self.fail(&node.rel, &e);
                bad.extend(wd.iter().map(|&j| dst.name(&dst.entries()[j]).to_vec()));
            }
        }
        for e in errors {
            self.fail(&self.path(node, &e.name), &e.err);
            bad.push(e.name);
        }
        if !bad.is_empty() {
            bad.sort();
            src.retain_names(|n| bad.binary_search_by(|b| b.as_slice().cmp(n)).is_err());
            dst.retain_names(|n| bad.binary_search_by(|b| b.as_slice().cmp(n)).is_err());
        }
    }

    /// Open (or create) the directory pair of a subdirectory task.
    fn open_node(
        &self,
        parent: &Arc<Node<S, D>>,
        name: &CStr,
        src_meta: Meta,
        at: DstAt,
    ) -> Option<Arc<Node<S, D>>> {
        let rel = self.path(parent, name.to_bytes());
        let src = match self.src.open_dir(&parent.src, name) {
            Ok(d) => d,
            Err(e) => {
                self.fail(&rel, &e);
                return None;
            }
        };
        let (dst, dst_meta) = match (at, &parent.dst) {
            (DstAt::Dir(m), Some(pd)) => match self.dst.open_dir(pd, name) {
                Ok(d) => (Some(d), Some(m)),
                Err(e) => {
                    self.fail(&rel, &e);
                    return None;
                }
            },
            // Dry run: report the directory that would be made (replacing
            // whatever is there); everything below it is new.
            (_, None) | (_, Some(_)) if self.dry_run => {
                if let DstAt::Other(m) = at {
                    let _ = self.keep_old(None, name, &rel, &m, false);
                    self.rep.action(Action::Delete, &rel, m.size);
                    Stats::add(&self.stats.files_deleted, 1);
                }
                if self.dst.features().empty_dirs {
                    self.rep.action(Action::Mkdir, &rel, 0);
                    Stats::add(&self.stats.dirs_created, 1);
                }
                (None, None)
            }
            (_, None) => (None, None),
            (at, Some(pd)) => {
                if let DstAt::Other(m) = at {
                    if let Err(e) = self
                        .take_removals(1)
                        .and_then(|()| self.remove_file(pd, name, &rel, &m))
                    {
                        self.fail(&rel, &e);
                        return None;
                    }
                    Stats::add(&self.stats.files_deleted, 1);
                    self.rep.action(Action::Delete, &rel, m.size);
                }
                match self.dst.make_dir(pd, name) {
                    Ok(d) => {
                        parent.dirty.store(true, Ordering::Relaxed);
                        // An object store makes nothing: the prefix exists
                        // once an object is under it.
                        if self.dst.features().empty_dirs {
                            Stats::add(&self.stats.dirs_created, 1);
                            self.rep.action(Action::Mkdir, &rel, 0);
                        }
                        (Some(d), None)
                    }
                    Err(e) => {
                        self.fail(&rel, &e);
                        return None;
                    }
                }
            }
        };
        Some(Arc::new(Node {
            rel,
            src,
            dst,
            src_meta,
            dst_meta,
            pending: AtomicUsize::new(1),
            dirty: AtomicBool::new(false),
            unlocked: AtomicBool::new(false),
            parent: Some(parent.clone()),
            lanes: Mutex::new((0, VecDeque::new())),
        }))
    }

    /// Leave out of both listings of a directory what the filter does
    /// ([`Filter::retain_pair`]); a file whose metadata could not be made
    /// exact is left alone on both sides (reported in its side's errors).
    fn filter_pair(
        &self,
        f: &Filter,
        node: &Node<S, D>,
        src: &mut Listing,
        serr: &mut Vec<ListError>,
        dst: &mut Listing,
        derr: &mut Vec<ListError>,
    ) -> io::Result<()> {
        let bad_src = f.prepare(self.src, &node.src, &node.rel, src, serr)?;
        let bad_dst = match &node.dst {
            Some(d) => f.prepare(self.dst, d, &node.rel, dst, derr)?,
            None => Vec::new(),
        };
        drop_names(dst, &bad_src);
        drop_names(src, &bad_dst);
        f.retain_pair(&node.rel, src, dst);
        Ok(())
    }

    /// List both sides of a directory, plan, and act.
    fn scan(&self, node: &Arc<Node<S, D>>, q: &Q<'_, S, D>) {
        if let Some(dir) = self.plan_node(node, q) {
            self.act(node, q, dir);
        }
    }

    /// Both listings of `node`'s directory (the source's with its
    /// per-entry errors, the destination's: empty where it has none); `None`
    /// when one could not be listed (said, and the directory done).
    fn list_both(&self, node: &Arc<Node<S, D>>) -> Option<Lists> {
        let mut src_list = Listing::new();
        let mut errors: Vec<ListError> = Vec::new();
        // The filter decides on both listings together (`filter_pair`).
        if let Err(e) = walk::list(
            self.src,
            &node.src,
            &node.rel,
            None,
            &mut src_list,
            &mut |_, e| errors.push(e),
        ) {
            // Without a complete source listing nothing may be deleted here.
            self.fail(&node.rel, &e);
            self.done(node);
            return None;
        }
        let mut dst_list = Listing::new();
        let mut derr = Vec::new();
        if let (Some(d), Some(_)) = (&node.dst, &node.dst_meta) {
            if let Err(e) = walk::list(self.dst, d, &node.rel, None, &mut dst_list, &mut |_, e| {
                derr.push(e)
            }) {
                self.fail(&node.rel, &e);
                self.done(node);
                return None;
            }
        }
        Some(Lists {
            src: src_list,
            errors,
            dst: dst_list,
            derr,
        })
    }

    /// `node`'s directory listed, filtered and planned ([`plan_dir`]);
    /// `None` when nothing is to be done there (said, and the directory
    /// done, or the run stopped).
    fn plan_node(&self, node: &Arc<Node<S, D>>, q: &Q<'_, S, D>) -> Option<PlannedDir> {
        let Lists {
            src: mut src_list,
            mut errors,
            dst: mut dst_list,
            mut derr,
        } = self.list_both(node)?;
        if let Some((dir, name)) = &self.backup_in {
            if *dir == node.rel && src_list.entries().iter().any(|e| src_list.name(e) == name) {
                self.left_out(1, &join(dir, name), "the --backup-dir inside DST");
            }
            self.drop_untouched(&node.rel, &mut src_list, false);
            self.drop_untouched(&node.rel, &mut dst_list, false);
        }
        self.reserve_source_names(node, &src_list);
        if node.parent.is_none()
            && src_list
                .entries()
                .iter()
                .any(|e| keep::is_versions_dir(src_list.name(e)))
        {
            self.left_out(0, keep::VERSIONS_DIR, "the directory of kept versions");
        }
        if let Some(f) = &self.opts.filter {
            if let Err(e) = self.filter_pair(
                f,
                node,
                &mut src_list,
                &mut errors,
                &mut dst_list,
                &mut derr,
            ) {
                self.fail(&node.rel, &e);
                self.done(node);
                return None;
            }
        }
        if self.aliased("SRC", &node.rel, &src_list) || self.aliased("DST", &node.rel, &dst_list) {
            q.stop();
            return None;
        }
        for e in derr {
            self.fail(&self.path(node, &e.name), &e.err);
        }
        // With mtime rules the filter made the listings exact already.
        let exact = self.opts.filter.as_ref().is_some_and(Filter::needs_mtime);
        if (self.src.features().approximate_meta || self.dst.features().approximate_meta)
            && !self.counting
            && !exact
        {
            self.refine(node, &mut src_list, &mut dst_list);
        }
        if let Some(d) = &node.dst {
            self.drop_legacy_partials(node, d, &mut dst_list);
        }
        // Entries no path can name are there all the same: SRC is not empty.
        let unnamed = errors.iter().any(ListError::for_dir);
        if node.parent.is_none() && !unnamed && self.empty_src_refused(&src_list, &dst_list) {
            self.done(node);
            return None;
        }
        Stats::add(&self.stats.entries_scanned, src_list.len() as u64);
        Stats::add(&self.stats.dst_entries, dst_list.len() as u64);
        if src_list.is_empty()
            && errors.is_empty()
            && node.parent.is_some()
            && !self.dst.features().empty_dirs
        {
            // Said, not counted as made: nothing can be stored for it.
            self.rep.skip(
                &node.rel,
                "empty directory: the destination keeps no empty directories",
            );
        }
        // Names the source could not read are left alone in the destination.
        let unreadable: Vec<Vec<u8>> = errors.iter().map(|e| e.name.clone()).collect();
        let held = self.held(&node.rel, unnamed);
        for e in errors {
            self.fail(&self.path(node, &e.name), &e.err);
        }

        if self.mtime_step > 1 {
            coarsen(&mut src_list, self.mtime_step);
            coarsen(&mut dst_list, self.mtime_step);
        }
        self.special.fix_list(&mut src_list);
        let mut steps = Vec::with_capacity(src_list.len().max(dst_list.len()));
        plan_dir(&src_list, &dst_list, &self.plan, &mut steps);
        if !self.written.is_empty() {
            self.check_written(&node.rel, &src_list, &mut steps);
        }
        self.unlock_if_needed(node, &steps);
        Some(PlannedDir {
            src: src_list,
            dst: dst_list,
            steps,
            unreadable,
            held,
        })
    }

    /// The steps of a planned directory done: files batched for the
    /// workers, subdirectories queued, the rest here.
    fn act(&self, node: &Arc<Node<S, D>>, q: &Q<'_, S, D>, dir: PlannedDir) {
        let PlannedDir {
            src: src_list,
            dst: dst_list,
            steps,
            unreadable,
            held,
        } = dir;
        let mut batch = FileBatch::default();
        let mut subdirs: Vec<DirTask<S, D>> = Vec::new();
        let se = src_list.entries();
        let de = dst_list.entries();
        for step in steps {
            if self.halted.load(Ordering::Relaxed) || self.stopping() {
                q.stop();
                return;
            }
            match step {
                Step::Create { s } => {
                    let m = se[s].meta;
                    match m.kind {
                        Kind::Dir => subdirs.push(self.dir_task(
                            node,
                            src_list.cname(&se[s]),
                            m,
                            DstAt::Nothing,
                        )),
                        Kind::Symlink => self.symlink(node, src_list.cname(&se[s]), &m, None, None),
                        k if k.is_node() => self.special(node, src_list.cname(&se[s]), &m, None),
                        _ => {
                            self.add_file(node, &mut batch, src_list.cname(&se[s]), m, None, false)
                        }
                    }
                }
                Step::Update { s, d } => self.add_file(
                    node,
                    &mut batch,
                    src_list.cname(&se[s]),
                    se[s].meta,
                    Some(de[d].meta),
                    false,
                ),
                Step::Check { s, d } => self.add_file(
                    node,
                    &mut batch,
                    src_list.cname(&se[s]),
                    se[s].meta,
                    Some(de[d].meta),
                    true,
                ),
                Step::Same { s, d, meta } => {
                    let (name, sm) = (src_list.cname(&se[s]), se[s].meta);
                    match &self.links {
                        Some(l) => self.group_file(
                            l,
                            node,
                            &mut batch,
                            name,
                            sm,
                            Some(de[d].meta),
                            How::Same(meta),
                        ),
                        None => self.same(node, name, &sm, meta),
                    }
                }
                Step::CheckLink { s, d } => self.symlink(
                    node,
                    src_list.cname(&se[s]),
                    &se[s].meta,
                    Some(de[d].meta),
                    Some(de[d].meta),
                ),
                Step::Recurse { s, d } if self.recurses(node, src_list.name(&se[s])) => subdirs
                    .push(self.dir_task(
                        node,
                        src_list.cname(&se[s]),
                        se[s].meta,
                        DstAt::Dir(de[d].meta),
                    )),
                Step::Recurse { .. } => {}
                Step::Replace { s, d } => {
                    let name = src_list.cname(&se[s]);
                    self.replace(node, &mut batch, &mut subdirs, name, se[s].meta, de[d].meta)
                }
                Step::Delete { d } => {
                    let name = dst_list.name(&de[d]);
                    let protected = self.opts.keep.as_ref().is_some_and(|k| k.protects(name));
                    if !held && !unreadable.iter().any(|u| u == name) && !protected {
                        self.delete(node, dst_list.cname(&de[d]), &de[d].meta);
                    }
                }
                Step::RemoveTemp { d } => {
                    self.remove_temp(node, dst_list.cname(&de[d]), de[d].meta.kind)
                }
                Step::Skip { s } => {
                    let m = se[s].meta;
                    self.skip_special(&self.path(node, src_list.name(&se[s])), &m);
                }
                Step::ReplaceBySpecial { s, d } => {
                    self.stale_at_special(node, src_list.cname(&se[s]), &se[s].meta, &de[d].meta)
                }
            }
            if batch.full(self.batch_files) {
                self.queue_batch(node, &mut batch, q);
            }
        }
        self.queue_batch(node, &mut batch, q);
        if !subdirs.is_empty() {
            node.pending.fetch_add(subdirs.len(), Ordering::AcqRel);
            q.dirs(subdirs);
        }
        self.done(node);
    }

    /// [`Step::Replace`]: the source's `sm` where the destination has an
    /// entry of another kind, `dm`.
    fn replace(
        &self,
        node: &Arc<Node<S, D>>,
        batch: &mut FileBatch,
        subdirs: &mut Vec<DirTask<S, D>>,
        name: &CStr,
        sm: Meta,
        dm: Meta,
    ) {
        if dm.kind == Kind::Dir {
            if self.opts.mode == Mode::Copy {
                let err = io::Error::other(format!(
                    "is a {} in the source but a directory in the destination; copy never deletes (use sync)",
                    sm.kind.as_str()
                ));
                self.fail(&self.path(node, name.to_bytes()), &err);
                return;
            }
            if sm.kind.is_node() && !self.dst.supports_special() {
                self.stale_at_special(node, name, &sm, &dm);
                return;
            }
            if !self.delete(node, name, &dm) {
                return;
            }
            match sm.kind {
                Kind::Symlink => self.symlink(node, name, &sm, None, None),
                k if k.is_node() => self.special(node, name, &sm, None),
                _ => self.add_file(node, batch, name, sm, None, false),
            }
        } else {
            match sm.kind {
                Kind::Dir => {
                    subdirs.push(self.dir_task(node, name, sm, DstAt::Other(dm)))
                }
                // rename() replaces a file or symlink atomically.
                Kind::Symlink => self.symlink(node, name, &sm, None, Some(dm)),
                k if k.is_node() && !self.dst.supports_special() => {
                    self.stale_at_special(node, name, &sm, &dm)
                }
                k if k.is_node() => self.special(node, name, &sm, Some(dm)),
                _ => self.add_file(node, batch, name, sm, Some(dm), false),
            }
        }
    }

    fn dir_task(
        &self,
        node: &Arc<Node<S, D>>,
        name: &CStr,
        src_meta: Meta,
        dst: DstAt,
    ) -> DirTask<S, D> {
        DirTask::Dir {
            parent: node.clone(),
            name: name.to_owned(),
            src_meta,
            dst,
        }
    }

    /// A file to transfer (`dm`: the destination's entry of that name;
    /// `check`: compare content first): batched, or with `-H` first
    /// matched with the other names of its file (`engine/links.rs`).
    fn add_file(
        &self,
        node: &Arc<Node<S, D>>,
        batch: &mut FileBatch,
        name: &CStr,
        sm: Meta,
        dm: Option<Meta>,
        check: bool,
    ) {
        match &self.links {
            Some(l) => self.group_file(l, node, batch, name, sm, dm, How::Transfer { check }),
            None => batch.add(name.to_bytes(), sm, dm, check),
        }
    }

    /// A file the same on both sides: counted, its metadata fixed.
    fn same(&self, node: &Node<S, D>, name: &CStr, sm: &Meta, meta: MetaChange) {
        Stats::add(&self.stats.unchanged, 1);
        self.set_meta(node, name, sm, meta);
    }

    fn queue_batch(&self, node: &Arc<Node<S, D>>, batch: &mut FileBatch, q: &Q<'_, S, D>) {
        if batch.files.is_empty() {
            return;
        }
        let b = std::mem::take(batch);
        Stats::add(&self.stats.files_planned, b.files.len() as u64);
        Stats::add(&self.stats.bytes_planned, b.bytes);
        node.pending.fetch_add(1, Ordering::AcqRel);
        {
            let mut l = node.lanes.lock().expect("lanes");
            if l.0 >= self.lanes {
                l.1.push_back(b);
                return;
            }
            l.0 += 1;
        }
        q.work(Files {
            node: node.clone(),
            batch: b,
        });
    }

    /// A child of `node` finished; the last one sets the directory's metadata.
    fn done(&self, node: &Arc<Node<S, D>>) {
        if node.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let refused = node.parent.is_none() && self.refusal.lock().expect("refusal").is_some();
        if refused {
            // Nothing is changed, not even the root's metadata.
        } else if let (false, Some(d)) = (self.dry_run, &node.dst) {
            let mut what = match &node.dst_meta {
                None => MetaChange::ALL,
                Some(m) => {
                    let mut c = meta_change(&node.src_meta, m, self.plan.owner);
                    c.mtime |= node.dirty.load(Ordering::Relaxed);
                    c.mode |= node.unlocked.load(Ordering::Relaxed);
                    c
                }
            };
            let mut meta = node.src_meta;
            if !self.src.features().dir_meta {
                // A prefix has no times or owner to copy, but a mode: the
                // one it lists (0755). A new directory (made 0700) gets it,
                // and so does one whose mode differs (left 0700 by a killed
                // run, or changed): directories converge like files. The
                // root only when made by this run (see `run_tree`); one
                // made writable for the run gets its own back.
                let unlocked = node.unlocked.load(Ordering::Relaxed);
                what = MetaChange {
                    mode: match &node.dst_meta {
                        None => true,
                        Some(m) => {
                            unlocked || (node.parent.is_some() && m.mode != node.src_meta.mode)
                        }
                    },
                    ..MetaChange::default()
                };
                // The root keeps its own mode (only unlocked for the run);
                // other directories take the listed one.
                if let (true, Some(m), None) = (unlocked, &node.dst_meta, &node.parent) {
                    meta.mode = m.mode;
                }
            }
            what.owner &= self.plan.owner;
            if !what.is_empty() {
                if let Err(e) = self.dst.set_dir_meta(d, &meta, what) {
                    self.fail(&node.rel, &e);
                }
            }
            // Attributes last: a directory's ACL may deny us what its
            // content needed, and setting the mode first keeps the mask.
            if let Err(e) = self.dir_xattrs(node, d).and_then(|x| match x {
                Some((want, have)) => self.copier().put_xattrs(d, None, &meta, &want, Some(&have)),
                None => Ok(()),
            }) {
                self.fail(&node.rel, &e);
            }
        } else if self.dry_run {
            if let Some(m) = &node.dst_meta {
                let c = meta_change(&node.src_meta, m, self.plan.owner);
                let attrs = match &node.dst {
                    Some(d) => self.dir_xattrs(node, d).unwrap_or_else(|e| {
                        self.fail(&node.rel, &e);
                        None
                    }),
                    None => None,
                };
                if c.mode || c.owner || attrs.is_some() {
                    self.rep.action(Action::Meta, &node.rel, 0);
                }
            }
        }
        if let Some(p) = &node.parent {
            self.done(p);
        }
    }

    /// The attributes of a directory pair, when they differ (see
    /// [`Copier::xattr_diff`]).
    fn dir_xattrs(
        &self,
        node: &Node<S, D>,
        d: &D::Dir,
    ) -> io::Result<Option<(crate::xattr::Xattrs, crate::xattr::Xattrs)>> {
        self.copier()
            .xattr_diff(&node.src, None, d, None, Kind::Dir)
    }

    /// Bring an entry of `node` whose content is unchanged up to date: its
    /// metadata (`what`), and with `-X`/`-A` its attributes.
    fn set_meta(&self, node: &Node<S, D>, name: &CStr, meta: &Meta, what: MetaChange) {
        let path = || self.path(node, name.to_bytes());
        self.fix_unchanged(&node.src, name, node.dst.as_ref(), name, &path, meta, what);
    }

    /// Bring `dname` of `ddir`, whose content equals `sname` of `sdir`, up
    /// to date: its metadata (`what`) and, with `-X`/`-A`, its attributes
    /// (listed on both sides, written only where they differ). One `meta`
    /// action when anything changes; `path` names it.
    #[allow(clippy::too_many_arguments)]
    fn fix_unchanged(
        &self,
        sdir: &S::Dir,
        sname: &CStr,
        ddir: Option<&D::Dir>,
        dname: &CStr,
        path: &dyn Fn() -> Vec<u8>,
        meta: &Meta,
        what: MetaChange,
    ) {
        let cp = self.copier();
        let attrs = match (cp.xattrs, ddir) {
            (Some(_), Some(d)) => cp
                .xattr_diff(sdir, Some(sname), d, Some(dname), meta.kind)
                .unwrap_or_else(|e| {
                    self.fail(&path(), &e);
                    None
                }),
            _ => None,
        };
        if what.is_empty() && attrs.is_none() {
            return;
        }
        let path = path();
        self.rep.action(Action::Meta, &path, 0);
        let Some(d) = ddir.filter(|_| !self.dry_run) else {
            return;
        };
        let res = (|| {
            if !what.is_empty() {
                self.dst.set_meta(d, dname, meta, what)?;
            }
            match &attrs {
                Some((want, have)) => cp.put_xattrs(d, Some(dname), meta, want, Some(have)),
                None => Ok(()),
            }
        })();
        if let Err(e) = res {
            self.fail(&path, &e);
        }
    }

    /// Remove a destination entry; false when it failed (already reported).
    /// Each entry removed (every one of a directory tree) is one `Delete`
    /// action, with its size, and one in `files_deleted`: in a dry run too,
    /// so that its records, its summary and `--max-delete` see what the
    /// real run removes.
    fn delete(&self, node: &Node<S, D>, name: &CStr, meta: &Meta) -> bool {
        let path = self.path(node, name.to_bytes());
        let is_dir = meta.kind == Kind::Dir;
        let size = if is_dir { 0 } else { meta.size };
        let deleted = |rel: &[u8], size: u64| {
            Stats::add(&self.stats.files_deleted, 1);
            self.rep.action(Action::Delete, rel, size);
        };
        if self.dry_run {
            match (&node.dst, is_dir) {
                (Some(d), true) => match self.count_tree(d, &path, name, &deleted) {
                    Ok(n) => Stats::add(&self.stats.dst_entries, n - 1),
                    Err(e) => {
                        if Refused::of(&e).is_none() {
                            self.fail(&path, &e);
                        }
                        return false;
                    }
                },
                _ => {
                    let _ = self.keep_old(None, name, &path, meta, false);
                    deleted(&path, size)
                }
            }
            return true;
        }
        let Some(d) = &node.dst else { return true };
        if !self.src_root_alive() {
            return false;
        }
        let limited = self.budget.load(Ordering::Relaxed) != u64::MAX;
        let res = if !is_dir {
            self.take_removals(u64::from(limited))
                .and_then(|()| self.remove_file(d, name, &path, meta))
                .map(|()| deleted(&path, size))
        } else if self.opts.filter.is_some() || limited || self.opts.keep.is_some() {
            // Entry by entry: what the filter excludes stays, each removal
            // takes its share of the allowance, each entry is kept first.
            self.delete_each(d, &path, name, &deleted)
        } else if !self.rep.shows_actions() {
            // Nobody sees the entries: counted, not stat'ed one by one.
            self.dst.remove(d, name, true).map(|n| {
                Stats::add(&self.stats.files_deleted, n);
            })
        } else {
            let mut full = path.clone();
            self.dst
                .remove_each(d, name, &mut |sub, size| {
                    full.truncate(path.len());
                    if !sub.is_empty() {
                        full.push(b'/');
                        full.extend_from_slice(sub);
                    }
                    deleted(&full, size);
                })
                .map(|_| ())
        };
        // Whatever was removed before a failure is gone: the directory
        // changed either way.
        node.dirty.store(true, Ordering::Relaxed);
        match res {
            Ok(()) => true,
            // A root met again below: the run is refused (said once).
            Err(e) if Refused::of(&e).is_some() => false,
            Err(e) => {
                self.fail(&path, &e);
                false
            }
        }
    }

    /// Open destination directory `name` (at `rel`) and list it: the open
    /// directory, its listing and the entries that could not be read.
    fn list_dst_dir(
        &self,
        parent: &D::Dir,
        rel: &[u8],
        name: &CStr,
    ) -> io::Result<(D::Dir, Listing, Vec<ListError>)> {
        let dir = self.dst.open_dir(parent, name)?;
        let mut list = Listing::new();
        let mut errs = Vec::new();
        self.dst.list(&dir, rel, &mut list, &mut errs)?;
        // What the run never touches is never deleted.
        list.retain_names(|n| !keep::is_versions_dir(n));
        self.drop_untouched(rel, &mut list, true);
        // What the filter leaves out is never deleted.
        if let Some(f) = &self.opts.filter {
            f.apply(self.dst, &dir, rel, &mut list, &mut errs, |_, _| ())?;
        }
        if self.aliased("DST", rel, &list) {
            return Err(refused("run refused".to_string()));
        }
        Ok((dir, list, errs))
    }

    /// What a removal of the destination directory `name` would remove,
    /// the directory included (what the filter excludes is kept), each
    /// entry told to `deleted` (path, size), the directory last; returns
    /// how many.
    fn count_tree(
        &self,
        parent: &D::Dir,
        rel: &[u8],
        name: &CStr,
        deleted: &dyn Fn(&[u8], u64),
    ) -> io::Result<u64> {
        let (dir, list, errs) = self.list_dst_dir(parent, rel, name)?;
        let mut n = 1 + errs.len() as u64;
        for e in list.entries() {
            let path = join(rel, list.name(e));
            n += if e.meta.kind == Kind::Dir {
                self.count_tree(&dir, &path, list.cname(e), deleted)?
            } else {
                let _ = self.keep_old(None, list.cname(e), &path, &e.meta, false);
                deleted(&path, e.meta.size);
                1
            };
        }
        deleted(rel, 0);
        Ok(n)
    }

    /// Remove a destination-only directory entry by entry, telling
    /// `deleted` of each (path, size): what the filter excludes is kept
    /// (excluded entries are never deleted; the directory itself stays if
    /// any remain inside), and under `--max-delete` each removal takes its
    /// share of the allowance first.
    fn delete_each(
        &self,
        parent: &D::Dir,
        rel: &[u8],
        name: &CStr,
        deleted: &dyn Fn(&[u8], u64),
    ) -> io::Result<()> {
        let (dir, list, errs) = self.list_dst_dir(parent, rel, name)?;
        if let Some(e) = errs.into_iter().next() {
            return Err(e.err);
        }
        let mut unlocked = false;
        for e in list.entries() {
            let child = list.cname(e);
            let path = join(rel, child.to_bytes());
            if e.meta.kind == Kind::Dir {
                self.delete_each(&dir, &path, child, deleted)?;
                continue;
            }
            self.take_removals(1)?;
            loop {
                match self.remove_file(&dir, child, &path, &e.meta) {
                    Ok(()) => deleted(&path, e.meta.size),
                    // A read-only directory (non-root): made writable once.
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied && !unlocked => {
                        unlocked = true;
                        if self.dst.make_writable(&dir)? {
                            continue;
                        }
                        return Err(e);
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                break;
            }
        }
        drop(dir);
        self.take_removals(1)?;
        match self.dst.rmdir(parent, name) {
            Ok(()) => {
                deleted(rel, 0);
                Ok(())
            }
            // Excluded (or protected, or never synced) entries remain,
            // and so does the directory.
            Err(e)
                if (self.opts.filter.is_some() || self.opts.keep.is_some())
                    && e.kind() == io::ErrorKind::DirectoryNotEmpty =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Create or replace a symlink (`dst_meta`: an existing symlink to
    /// compare; `old`: the entry it replaces, kept first).
    fn symlink(
        &self,
        node: &Node<S, D>,
        name: &CStr,
        meta: &Meta,
        dst_meta: Option<Meta>,
        old: Option<Meta>,
    ) {
        let path = self.path(node, name.to_bytes());
        if !self.dst.features().symlinks {
            return self.rep.skip(
                &path,
                "symlink in SRC: the destination cannot store symlinks",
            );
        }
        let target = match self.src.read_link(&node.src, name) {
            Ok(t) => t,
            Err(e) => return self.fail(&path, &e),
        };
        if let (Some(dm), Some(d)) = (dst_meta, &node.dst) {
            match self.dst.read_link(d, name) {
                Ok(t) if t == target => {
                    Stats::add(&self.stats.unchanged, 1);
                    let mut c = meta_change(meta, &dm, self.plan.owner);
                    // A link's time where it cannot be set stays as made.
                    c.mtime =
                        c.mtime && (self.dry_run || self.dst.sets_symlink_times(d, name, &dm));
                    self.set_meta(node, name, meta, c);
                    return;
                }
                Ok(_) => {}
                Err(e) => return self.fail(&path, &e),
            }
        }
        if let Some(old) = old {
            // create_symlink replaces atomically: the old entry is linked
            // where it is kept first.
            if let Err(e) = self.keep_old(node.dst.as_ref(), name, &path, &old, true) {
                return self.fail(&path, &e);
            }
        }
        self.rep.action(Action::Symlink, &path, 0);
        Stats::add(&self.stats.symlinks_created, 1);
        if self.dry_run {
            return;
        }
        if let Some(d) = &node.dst {
            match self
                .dst
                .create_symlink(d, name, &target, meta)
                .and_then(|()| {
                    node.dirty.store(true, Ordering::Relaxed);
                    self.copier()
                        .new_entry_xattrs(&node.src, name, d, name, meta)
                }) {
                Ok(()) => {}
                Err(e) => self.fail(&path, &e),
            }
        }
    }

    /// Say why a source entry that is not copied is skipped: a socket or
    /// an unknown type (a note each), or a fifo or device node for a
    /// destination that cannot store them (one note per run, then `skip`
    /// actions).
    fn skip_special(&self, path: &[u8], meta: &Meta) {
        match meta.kind {
            Kind::Socket => self.rep.skip(path, SOCKET_SKIP),
            k if k.is_node() => {
                if self.nodes_noted.swap(true, Ordering::Relaxed) {
                    self.rep.action(Action::Skip, path, 0);
                } else {
                    self.rep.skip(path, NODE_SKIP);
                }
            }
            _ => self.rep.skip(path, OTHER_SKIP),
        }
    }

    /// The source has an entry that is not copied (`meta`) where the
    /// destination has another (`dm`): that one is stale. Sync removes it
    /// (then the skip note), copy reports it (copy never deletes).
    fn stale_at_special(&self, node: &Node<S, D>, name: &CStr, meta: &Meta, dm: &Meta) {
        let path = self.path(node, name.to_bytes());
        if self.opts.mode == Mode::Copy {
            let err = io::Error::other(format!(
                "is a {} in the source (not copied) but a {} in the destination; copy never deletes (use sync)",
                kind_word(meta.kind),
                kind_word(dm.kind)
            ));
            return self.fail(&path, &err);
        }
        if self.delete(node, name, dm) {
            self.skip_special(&path, meta);
        }
    }

    /// Create or replace a fifo or device node (`dst_meta`: the entry it
    /// replaces, a file, symlink or node of another kind or device).
    fn special(&self, node: &Node<S, D>, name: &CStr, meta: &Meta, dst_meta: Option<Meta>) {
        let path = self.path(node, name.to_bytes());
        if !self.dst.supports_special() {
            return self.skip_special(&path, meta);
        }
        if let Some(old) = dst_meta {
            if let Err(e) = self.keep_old(node.dst.as_ref(), name, &path, &old, true) {
                return self.fail(&path, &e);
            }
        }
        self.rep.action(Action::Mknod, &path, 0);
        Stats::add(&self.stats.specials_created, 1);
        if self.dry_run {
            return;
        }
        if let Some(d) = &node.dst {
            match self.dst.create_special(d, name, meta, dst_meta.is_some()) {
                Ok(()) => node.dirty.store(true, Ordering::Relaxed),
                Err(e) => self.fail(&path, &e),
            }
        }
    }

    /// Transfer one file (`check`: compare content first, `--checksum`).
    fn transfer(
        &self,
        node: &Node<S, D>,
        name: &CStr,
        meta: &Meta,
        dst_meta: Option<Meta>,
        check: bool,
    ) -> Outcome {
        match self.transfer_start(node, name, meta, dst_meta, check, false) {
            Transfer::Over(out) => out,
            t @ Transfer::Committing { .. } => self.transfer_end(node, t),
        }
    }

    /// [`Engine::transfer`] up to the commit; with `nowait`, a commit the
    /// store confirms later ([`Store::commit_nowait`]) is returned
    /// unconfirmed, for [`Engine::transfer_end`] to wait for and report.
    fn transfer_start<'n>(
        &'n self,
        node: &'n Node<S, D>,
        name: &CStr,
        meta: &Meta,
        dst_meta: Option<Meta>,
        check: bool,
        nowait: bool,
    ) -> Transfer<'n> {
        let path = self.path(node, name.to_bytes());
        if check {
            let (Some(d), Some(dm)) = (&node.dst, dst_meta) else {
                return Transfer::Over(Outcome::Failed);
            };
            match self
                .copier()
                .same_content(&node.src, name, d, name, meta.size)
            {
                Ok(true) => {
                    Stats::add(&self.stats.unchanged, 1);
                    let c = meta_change(meta, &dm, self.plan.owner);
                    self.set_meta(node, name, meta, c);
                    return Transfer::Over(Outcome::Same);
                }
                Ok(false) => {}
                Err(e) => {
                    self.fail_or_vanished(node, name, &path, &e);
                    return Transfer::Over(Outcome::Failed);
                }
            }
        }
        let action = if dst_meta.is_some() {
            Action::Update
        } else {
            Action::Copy
        };
        if self.dry_run {
            if let Some(dm) = &dst_meta {
                let _ = self.keep_old(node.dst.as_ref(), name, &path, dm, true);
            }
            self.rep.action(action, &path, meta.size);
            Stats::add(&self.stats.files_copied, 1);
            Stats::add(&self.stats.bytes_copied, meta.size);
            return Transfer::Over(Outcome::Copied);
        }
        let Some(d) = &node.dst else {
            return Transfer::Over(Outcome::Failed);
        };
        let cp = self.copier();
        let started = if nowait {
            cp.copy_file_nowait(&node.src, name, d, name, &path, meta, dst_meta.as_ref())
        } else {
            cp.copy_file(&node.src, name, d, name, &path, meta, dst_meta.as_ref())
                .map(|c| (c, Committing::done(Ok(()))))
        };
        match started {
            Ok((copied, commit)) => Transfer::Committing {
                path,
                action,
                copied,
                dst_meta,
                commit,
            },
            Err(e) => {
                self.fail_or_vanished(node, name, &path, &e);
                Transfer::Over(Outcome::Failed)
            }
        }
    }

    /// Files a watch saw written that look the same by size and mtime (an
    /// edit in place that kept the size and put the mtime back) are
    /// compared by content ([`Scope::written`]).
    fn check_written(&self, rel: &[u8], src_list: &Listing, steps: &mut [Step]) {
        let se = src_list.entries();
        for step in steps.iter_mut() {
            if let Step::Same { s, d, .. } = *step {
                if se[s].meta.kind == Kind::File
                    && self
                        .written
                        .binary_search(&join(rel, src_list.name(&se[s])))
                        .is_ok()
                {
                    *step = Step::Check { s, d };
                }
            }
        }
    }

    /// A file that failed at `path`: an error, except in a watch when it
    /// is gone from the source (an editor's swap file, a `*.part` renamed
    /// or removed before it could be copied): then a skip saying it
    /// vanished, as rsync's note does (its removal is the watch's next
    /// change).
    fn fail_or_vanished(&self, node: &Node<S, D>, name: &CStr, path: &[u8], e: &io::Error) {
        if self.guard.is_some()
            && e.kind() == io::ErrorKind::NotFound
            && matches!(self.src.stat(&node.src, name), Ok(None))
        {
            self.rep
                .skip(path, "vanished: removed before it was copied");
        } else {
            self.fail(path, e);
        }
    }

    /// Tell the source which files of `batch` are about to be opened, in
    /// order ([`Store::open_ahead`]): those copied without a compare first,
    /// not empty, not waiting for another name of their file (`-H`).
    fn open_ahead(&self, node: &Node<S, D>, batch: &FileBatch) {
        if self.dry_run || node.dst.is_none() || batch.files.len() < 2 {
            return;
        }
        let files: Vec<(&CStr, u64)> = batch
            .files
            .entries()
            .iter()
            .zip(&batch.check)
            .filter(|(f, check)| {
                !**check && f.meta.size > 0 && !(self.links.is_some() && f.meta.nlink > 1)
            })
            .map(|(f, _)| (batch.files.cname(f), f.meta.size))
            .collect();
        if files.len() > 1 {
            self.src.open_ahead(&node.src, &files);
        }
    }

    /// Wait for the commit of a transfer [`Engine::transfer_start`] began,
    /// and report it: copied once the store confirmed it, else one error.
    fn transfer_end(&self, node: &Node<S, D>, t: Transfer<'_>) -> Outcome {
        let (path, action, c, dst_meta, commit) = match t {
            Transfer::Over(out) => return out,
            Transfer::Committing {
                path,
                action,
                copied,
                dst_meta,
                commit,
            } => (path, action, copied, dst_meta, commit),
        };
        match commit.wait().map_err(|e| match &node.dst {
            Some(d) => self.copier().full_disk(d, c.meta.size, e),
            None => e,
        }) {
            Ok(()) => {
                if let (Some(to), Some(dm)) = (&c.kept, &dst_meta) {
                    self.kept(&path, to, dm.size);
                }
                let n = c.bytes;
                node.dirty.store(true, Ordering::Relaxed);
                Stats::add(&self.stats.files_copied, 1);
                Stats::add(&self.stats.bytes_copied, n);
                self.rep.action(action, &path, n);
                Outcome::Copied
            }
            Err(e) => {
                self.fail(&path, &e);
                Outcome::Failed
            }
        }
    }

    /// The file copy and content compare of this run.
    fn copier(&self) -> Copier<'_, S, D> {
        Copier {
            src: self.src,
            dst: self.dst,
            fsync: self.opts.fsync,
            bwlimit: self.opts.bwlimit.as_ref(),
            moved: &self.stats.bytes_moved,
            xattrs: if self.counting {
                None
            } else {
                self.xattrs.active()
            },
            delta: crate::delta::Use::of(self.opts.delta, &self.stats.delta),
            mtime_step: self.mtime_step,
            special: Some(&self.special),
            keep: if self.counting {
                None
            } else {
                self.opts.keep.as_deref()
            },
            grow: self.guard,
        }
    }

    /// Copy or sync a single file `src_name` (in the source root directory)
    /// to `dst_name` (in the destination root directory).
    pub fn run_file(&self, src_name: &CStr, dst_name: &CStr) -> io::Result<RunResult> {
        let start = Instant::now();
        let (sdir, _) = self
            .src
            .open_root()?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let (ddir, _) = self
            .dst
            .open_root()?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        // One entry on each side: stat it, never list its whole directory.
        let sm = self
            .src
            .stat(&sdir, src_name)?
            .map(|m| self.special.apply(&m))
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let dm = self.dst.stat(&ddir, dst_name)?;
        Stats::add(&self.stats.entries_scanned, 1);
        let path = dst_name.to_bytes();
        let changed = match dm {
            None => true,
            Some(dm) if dm.kind != Kind::File => true,
            Some(dm) if dm.size != sm.size => true,
            Some(_) if self.checksum => !self
                .copier()
                .same_content(&sdir, src_name, &ddir, dst_name, sm.size)?,
            Some(dm) => !sm.same_mtime(&dm),
        };
        if !changed {
            Stats::add(&self.stats.unchanged, 1);
            let dm = dm.expect("unchanged implies present");
            let c = meta_change(&sm, &dm, self.plan.owner);
            let p = || path.to_vec();
            self.fix_unchanged(&sdir, src_name, Some(&ddir), dst_name, &p, &sm, c);
            self.xattr_note();
            return Ok(self.stats.summary(start.elapsed()));
        }
        let action = if dm.is_some() {
            Action::Update
        } else {
            Action::Copy
        };
        if self.dry_run {
            if let Some(dm) = &dm {
                let _ = self.keep_old(Some(&ddir), dst_name, path, dm, true);
            }
            self.rep.action(action, path, sm.size);
            Stats::add(&self.stats.files_copied, 1);
            Stats::add(&self.stats.bytes_copied, sm.size);
            return Ok(self.stats.summary(start.elapsed()));
        }
        let res = self
            .copier()
            .copy_file(&sdir, src_name, &ddir, dst_name, path, &sm, dm.as_ref());
        match res {
            Ok(c) => {
                if let (Some(to), Some(dm)) = (&c.kept, &dm) {
                    self.kept(path, to, dm.size);
                }
                let n = c.bytes;
                Stats::add(&self.stats.files_copied, 1);
                Stats::add(&self.stats.bytes_copied, n);
                self.rep.action(action, path, n);
            }
            Err(e) => self.fail(path, &e),
        }
        self.xattr_note();
        Ok(self.stats.summary(start.elapsed()))
    }
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
            // Commits the store confirms later (`Store::commit_nowait`):
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
            let mut l = node.lanes.lock().expect("lanes");
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
