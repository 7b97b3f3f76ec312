//! `ferry versions PATH` and `ferry restore PATH [--at TIME]`, and the
//! pruning of kept versions after each run with `--versions` (see
//! `ferry_engine::versions` for the policy and docs/CLI.md, "Versions").
//!
//! PATH is anywhere in a replica: its root is the nearest directory above
//! PATH (or PATH itself) that holds `.ferry-versions`, found locally with
//! a stat per level, over ssh/sftp with one remote stat per level, on S3
//! with one listing per level.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use ferry_backends::{AnyDir, AnyStore, Location, Opts, Root};
use ferry_engine::copy::{Copier, FileCopy};
use ferry_engine::encode::{json_name, json_string, text_name_string};
use ferry_engine::keep::{split_parent, KeepBase, KeepRule, Keeper, VERSIONS_DIR};
use ferry_engine::store::{Planned, StoreExt};
use ferry_engine::versions::{
    collect, has_versions_dir, keeps_all, open_versions_dir, spans, state_at, Version,
};
use ferry_engine::{Kind, Listing, Meta, Store};
use ferry_s3::S3Config;
use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::Timestamp;

use crate::args::{now_unix, KeepArgs, RestoreArgs, VersionsArgs};
use crate::output::{cause, CliReporter};

/// Prune the versions of each replica in `roots` after a run with
/// `--versions` and a retention policy (none for a dry run). Never fails:
/// problems are notes.
pub fn after_run(roots: &[&Root], keep: &KeepArgs, dry_run: bool, rep: &CliReporter) {
    let r = keep.retention();
    if !keep.versions || dry_run || keeps_all(&r) {
        return;
    }
    let now = now_unix();
    for root in roots {
        let o = Opts {
            jobs: 4,
            lazy_meta: true,
        };
        let report = match ferry_backends::open(root, &o) {
            Ok(s) => ferry_engine::versions::prune(&s, now, &r),
            Err(e) => ferry_engine::versions::PruneReport {
                notes: vec![format!("pruning versions: {e}")],
                ..Default::default()
            },
        };
        rep.versions_pruned(&root.id(), &report);
    }
}

/// Prune the versions a watch's run kept: in the directories `dirs` of
/// each replica's `.ferry-versions` ((index in `roots`, path below it)),
/// not their subdirectories. Never fails: problems are notes.
pub fn after_run_in(
    roots: &[&Root],
    keep: &KeepArgs,
    dirs: &[(usize, Vec<u8>)],
    rep: &CliReporter,
) {
    let r = keep.retention();
    if !keep.versions || keeps_all(&r) {
        return;
    }
    let now = now_unix();
    for (i, root) in roots.iter().enumerate() {
        let subs: Vec<Vec<u8>> = dirs
            .iter()
            .filter(|(s, _)| *s == i)
            .map(|(_, d)| d.clone())
            .collect();
        if subs.is_empty() {
            continue;
        }
        let o = Opts {
            jobs: 4,
            lazy_meta: true,
        };
        let report = match ferry_backends::open(root, &o) {
            Ok(s) => ferry_engine::versions::prune_in(&s, now, &r, &subs),
            Err(e) => ferry_engine::versions::PruneReport {
                notes: vec![format!("pruning versions: {e}")],
                ..Default::default()
            },
        };
        rep.versions_pruned(&root.id(), &report);
    }
}

/// A replica found above PATH: its root and PATH below it.
struct Replica {
    root: Root,
    rel: Vec<u8>,
}

/// A backup directory (`--backup-dir DIR [--suffix SUF]`) whose tree
/// mirrors a replica's: what a run kept there is listed and restored
/// as versions.
struct Backups {
    store: AnyStore,
    root: Root,
    suffix: Vec<u8>,
    /// How a restore keeps what it replaces: into the same directory.
    rule: KeepRule,
}

impl Backups {
    /// The backups of the file `only` (or of every file, walking
    /// subdirectories) in the directory `dir` (below the backup root,
    /// as below the replica's).
    fn collect(
        &self,
        dir: &[u8],
        only: Option<&[u8]>,
        out: &mut Vec<Version>,
        notes: &mut Vec<String>,
    ) -> io::Result<()> {
        let Some(d) = live_dir(&self.store, open_root(&self.store)?, dir, false)? else {
            return Ok(());
        };
        self.walk(&d, dir, only, out, notes);
        Ok(())
    }

    fn walk(
        &self,
        d: &AnyDir,
        dir: &[u8],
        only: Option<&[u8]>,
        out: &mut Vec<Version>,
        notes: &mut Vec<String>,
    ) {
        let mut l = Listing::new();
        let mut errors = Vec::new();
        if let Err(e) = self.store.list(d, dir, &mut l, &mut errors) {
            notes.push(format!("{}: {}", location(&self.root, dir), cause(&e)));
            return;
        }
        for e in l.entries() {
            let vname = l.name(e);
            if !plain_name(vname) {
                continue;
            }
            if e.meta.kind == Kind::Dir {
                if only.is_none() {
                    let sub = ferry_engine::entry::join(dir, vname);
                    match self.store.open_dir(d, l.cname(e)) {
                        Ok(sd) => self.walk(&sd, &sub, only, out, notes),
                        Err(err) => {
                            notes.push(format!("{}: {}", location(&self.root, &sub), cause(&err)))
                        }
                    }
                }
                continue;
            }
            let Some((name, n)) = ferry_engine::keep::parse_backup_name(vname, &self.suffix) else {
                continue;
            };
            if only.is_some_and(|o| o != name.as_slice()) {
                continue;
            }
            // When it was kept: its change time (the link or rename that
            // kept it), else its mtime.
            // (A store marks a ctime it has with the top bit.)
            let kept = match e.meta.ctime & !(1 << 63) {
                0 => e.meta.mtime_sec,
                c => (c / 1_000_000_000) as i64,
            };
            out.push(Version {
                dir: dir.to_vec(),
                name,
                vname: vname.to_vec(),
                kept,
                n,
                meta: e.meta,
                backup: true,
            });
        }
    }
}

/// The replica above PATH that keeps backups in `dir` (`--backup-dir`,
/// relative to the replica's root as a run takes it, or absolute), with
/// those backups: the ancestor of PATH, farthest first, whose backup
/// directory has PATH's directory, holding a backup of PATH (or PATH as
/// a directory). Local paths only.
fn find_backups(path: &Path, dir: &Path, suffix: &[u8]) -> Result<(Replica, Backups), String> {
    let loc = Location::parse(path.as_os_str());
    let Location::Local(p) = &loc else {
        return Err(format!("{loc}: with --backup-dir, PATH is a local path"));
    };
    let abs = absolute(p).map_err(|e| format!("{loc}: {}", cause(&e)))?;
    let ancestors: Vec<&Path> = abs.ancestors().collect();
    for a in ancestors.into_iter().rev() {
        let b = absolute(&a.join(dir)).map_err(|e| format!("--backup-dir: {}", cause(&e)))?;
        let rel = abs.strip_prefix(a).unwrap_or(Path::new(""));
        let relb = rel.as_os_str().as_bytes();
        let (pdir, name) = split_parent(relb);
        let bdir = b.join(std::ffi::OsStr::from_bytes(pdir));
        let Ok(rd) = std::fs::read_dir(&bdir) else {
            continue;
        };
        let found = relb.is_empty()
            || b.join(rel).is_dir()
            || rd.flatten().any(|e| {
                ferry_engine::keep::parse_backup_name(e.file_name().as_bytes(), suffix)
                    .is_some_and(|(n, _)| n == name)
            });
        if !found || b.starts_with(a) && b == a {
            continue;
        }
        let root = Root::Local(a.to_path_buf());
        let broot = Root::Local(b.clone());
        let base = ferry_backends::keep::keep_base(&root, dir.as_os_str())?;
        return Ok((
            Replica {
                root,
                rel: relb.to_vec(),
            },
            Backups {
                store: open_store(&broot)?,
                root: broot,
                suffix: suffix.to_vec(),
                rule: KeepRule::BackupDir {
                    base,
                    suffix: suffix.to_vec(),
                },
            },
        ));
    }
    Err(format!(
        "{loc}: no backup of it in {} (nor of a directory holding it)",
        dir.display()
    ))
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
fn utc(unix: i64) -> String {
    match Timestamp::from_second(unix) {
        Ok(t) => t.strftime("%Y-%m-%d %H:%M:%S").to_string(),
        Err(_) => unix.to_string(),
    }
}

/// The location of `rel` below `root`, as a user writes it (escaped as
/// text output escapes names).
fn location(root: &Root, rel: &[u8]) -> String {
    text_name_string(&location_bytes(root, rel))
}

/// A local path made absolute, its directories resolved (as many as
/// exist), its last component kept as typed (a symlink is not followed).
fn absolute(p: &Path) -> io::Result<PathBuf> {
    let abs = std::path::absolute(p)?;
    let (mut cur, last) = match abs.file_name() {
        Some(n) => (
            abs.parent().unwrap_or(Path::new("/")).to_path_buf(),
            Some(n.to_owned()),
        ),
        None => (abs.clone(), None),
    };
    let mut rest = Vec::new();
    let mut base = loop {
        match cur.canonicalize() {
            Ok(c) => break c,
            Err(_) => match (cur.file_name(), cur.parent()) {
                (Some(n), Some(parent)) => {
                    rest.push(n.to_owned());
                    cur = parent.to_path_buf();
                }
                _ => break cur,
            },
        }
    };
    for n in rest.iter().rev() {
        base.push(n);
    }
    if let Some(n) = last {
        base.push(n);
    }
    Ok(base)
}

/// Find the replica holding `path`: the nearest directory at or above it
/// with a `.ferry-versions` directory.
fn find_replica(path: &Path, endpoint: Option<&str>) -> Result<Replica, String> {
    let loc = Location::parse(path.as_os_str());
    let typed = loc.to_string();
    let none = || {
        format!(
            "{typed}: no .ferry-versions directory in it or above it (versions are kept with --versions; for a --backup-dir, give it)"
        )
    };
    match &loc {
        Location::Local(p) => {
            let abs = absolute(p).map_err(|e| format!("{typed}: {}", cause(&e)))?;
            for c in abs.ancestors() {
                let v = c.join(std::ffi::OsStr::from_bytes(VERSIONS_DIR));
                if std::fs::symlink_metadata(&v).is_ok_and(|m| m.is_dir()) {
                    let rel = abs.strip_prefix(c).unwrap_or(Path::new(""));
                    return Ok(Replica {
                        root: Root::Local(c.to_path_buf()),
                        rel: rel.as_os_str().as_bytes().to_vec(),
                    });
                }
            }
            Err(none())
        }
        Location::S3(u) => {
            let cfg = S3Config::from_url(u, endpoint).map_err(|e| e.to_string())?;
            let key = cfg.prefix.trim_matches('/').to_string();
            let parts: Vec<&str> = key.split('/').filter(|p| !p.is_empty()).collect();
            for k in (0..=parts.len()).rev() {
                let mut c = cfg.clone();
                c.prefix = parts[..k].join("/");
                let root = Root::S3(Box::new(c));
                let store = ferry_backends::open(
                    &root,
                    &Opts {
                        jobs: 1,
                        lazy_meta: true,
                    },
                )
                .map_err(|e| e.to_string())?;
                let Some((d, _)) = store
                    .open_root()
                    .map_err(|e| format!("{typed}: {}", cause(&e)))?
                else {
                    continue;
                };
                if has_versions_dir(&store, &d).map_err(|e| format!("{typed}: {}", cause(&e)))? {
                    return Ok(Replica {
                        root,
                        rel: parts[k..].join("/").into_bytes(),
                    });
                }
            }
            Err(none())
        }
        Location::Shell { .. } => {
            let root = crate::remote::root_of(&loc, endpoint)?;
            let (Root::Ssh(r) | Root::Sftp(r)) = &root else {
                unreachable!("a shell location")
            };
            let s = ferry_backends::remote(&root).map_err(|e| format!("{typed}: {e}"))?;
            let mut path = r.path.clone();
            while path.len() > 1 && path.ends_with(b"/") {
                path.pop();
            }
            let mut cut = path.len();
            loop {
                let c = &path[..cut];
                let probe = match c {
                    b"" => VERSIONS_DIR.to_vec(),
                    b"/" => [b"/", VERSIONS_DIR].concat(),
                    _ => [c, b"/", VERSIONS_DIR].concat(),
                };
                // A file at PATH: no `.ferry-versions` below it.
                let m = match s.stat_path(&probe, true) {
                    Err(e) if missing(&e) => None,
                    r => r.map_err(|e| format!("{typed}: {}", cause(&e)))?,
                };
                if m.is_some_and(|m| m.kind == Kind::Dir) {
                    let rel = path[cut..].strip_prefix(b"/").unwrap_or(&path[cut..]);
                    return Ok(Replica {
                        root: s.root(r.at(c.to_vec())),
                        rel: rel.to_vec(),
                    });
                }
                match c.iter().rposition(|&b| b == b'/') {
                    _ if c.is_empty() || c == b"/" => return Err(none()),
                    Some(0) => cut = 1,
                    Some(i) => cut = i,
                    None => cut = 0,
                }
            }
        }
    }
}

fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a name"))
}

fn missing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// Open the live directory `dir` below the root (creating what is
/// missing with `create`); `None` when it does not exist.
fn live_dir(
    store: &AnyStore,
    root: AnyDir,
    dir: &[u8],
    create: bool,
) -> io::Result<Option<AnyDir>> {
    let mut d = root;
    for part in dir.split(|&c| c == b'/').filter(|p| !p.is_empty()) {
        let name = cstr(part)?;
        d = match store.open_dir(&d, &name) {
            Ok(x) => x,
            Err(e) if missing(&e) && create => store.make_dir(&d, &name)?,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
    }
    Ok(Some(d))
}

/// One file's history in its replica: its kept versions, oldest first,
/// and the file as it is now (`None`: deleted).
struct History {
    rel: Vec<u8>,
    live: Option<Meta>,
    versions: Vec<Version>,
    /// The backup directory's root, when some versions are backups.
    broot: Option<Root>,
    /// The states' spans, once asked for.
    sp: std::cell::OnceCell<Vec<ferry_engine::versions::Span>>,
}

/// Which state of a file a restore or a listing takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// The current file.
    Live,
    /// `versions[i]`.
    Version(usize),
}

impl History {
    /// (mtime, time kept) of each state, oldest first, the current file
    /// last ([`ferry_engine::versions::spans`]).
    fn states(&self) -> Vec<(i64, Option<i64>)> {
        let mut v: Vec<(i64, Option<i64>)> = self
            .versions
            .iter()
            .map(|v| (v.meta.mtime_sec, Some(v.kept)))
            .collect();
        if let Some(m) = &self.live {
            v.push((m.mtime_sec, None));
        }
        v
    }

    /// The state the file had at `at` (`None`: it did not exist then, as
    /// far as the history tells); without a time, the newest version.
    fn pick(&self, at: Option<i64>) -> Option<Pick> {
        let Some(at) = at else {
            return self.versions.len().checked_sub(1).map(Pick::Version);
        };
        let i = state_at(&self.states(), at)?;
        Some(if i == self.versions.len() {
            Pick::Live
        } else {
            Pick::Version(i)
        })
    }

    /// When the state `p` was written (its span's start).
    fn written(&self, p: Pick) -> i64 {
        let sp = self.sp.get_or_init(|| spans(&self.states()));
        match p {
            Pick::Live => sp.last().map_or(0, |s| s.start),
            Pick::Version(i) => sp[i].start,
        }
    }

    /// Where the state `p` is, as raw bytes (`root`: the replica's).
    fn where_bytes(&self, root: &Root, p: Pick) -> Vec<u8> {
        match p {
            Pick::Live => location_bytes(root, &self.rel),
            Pick::Version(i) => {
                let v = &self.versions[i];
                match (&self.broot, v.backup) {
                    (Some(b), true) => location_bytes(b, &v.path()),
                    _ => location_bytes(root, &v.path()),
                }
            }
        }
    }

    /// [`History::where_bytes`] as text.
    fn where_text(&self, root: &Root, p: Pick) -> String {
        text_name_string(&self.where_bytes(root, p))
    }

    fn meta(&self, p: Pick) -> Meta {
        match p {
            Pick::Live => self.live.expect("a live pick has a live file"),
            Pick::Version(i) => self.versions[i].meta,
        }
    }
}

/// What PATH names in its replica.
enum Target {
    /// A file.
    File(History),
    /// A directory (`rel` below the root): every file below it that
    /// exists or has versions, by path.
    Dir {
        rel: Vec<u8>,
        files: BTreeMap<Vec<u8>, History>,
    },
}

fn open_root(store: &AnyStore) -> io::Result<AnyDir> {
    match store.open_root()? {
        Some((d, _)) => Ok(d),
        None => Err(io::Error::from(io::ErrorKind::NotFound)),
    }
}

/// Every file and symlink below the live directory `d` (at `rel`),
/// leaving out `.ferry-versions` at any depth; problems go to `notes`.
fn live_files(
    store: &AnyStore,
    d: &AnyDir,
    rel: &[u8],
    out: &mut Vec<(Vec<u8>, Meta)>,
    notes: &mut Vec<String>,
) {
    let mut l = Listing::new();
    let mut errors = Vec::new();
    if let Err(e) = store.list(d, rel, &mut l, &mut errors) {
        notes.push(format!("{}: {}", String::from_utf8_lossy(rel), cause(&e)));
        return;
    }
    for e in errors {
        notes.push(format!(
            "{}: {}",
            String::from_utf8_lossy(&ferry_engine::entry::join(rel, &e.name)),
            e.err
        ));
    }
    for e in l.entries() {
        let name = l.name(e);
        if ferry_engine::keep::is_versions_dir(name) || !plain_name(name) {
            continue;
        }
        let sub = ferry_engine::entry::join(rel, name);
        match e.meta.kind {
            Kind::Dir => match store.open_dir(d, l.cname(e)) {
                Ok(sd) => live_files(store, &sd, &sub, out, notes),
                Err(err) => notes.push(format!(
                    "{}: {}",
                    String::from_utf8_lossy(&sub),
                    cause(&err)
                )),
            },
            _ => out.push((sub, e.meta)),
        }
    }
}

/// A name that stays in its directory: not empty, `.`, `..`, nor holding
/// a `/` (an object store's key may have any of these).
fn plain_name(n: &[u8]) -> bool {
    !n.is_empty() && n != b"." && n != b".." && !n.contains(&b'/')
}

/// A path below a root whose every component is a plain name: PATH
/// never escapes its replica.
fn plain_rel(rel: &[u8]) -> bool {
    rel.is_empty() || rel.split(|&c| c == b'/').all(plain_name)
}

/// Look PATH (`rel` below the root) up in its replica; `Ok(None)` when it
/// names nothing known (neither a live entry nor one with versions).
fn target(
    store: &AnyStore,
    rel: &[u8],
    bk: Option<&Backups>,
    notes: &mut Vec<String>,
) -> io::Result<Option<Target>> {
    if !plain_rel(rel) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a path with an empty, `.` or `..` component (it could leave the replica)",
        ));
    }
    if rel
        .split(|&c| c == b'/')
        .any(ferry_engine::keep::is_versions_dir)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "inside .ferry-versions: name the file whose versions these are",
        ));
    }
    // `known`: PATH is a directory (the root, or a live directory); else
    // it is one only when something is below it (an object store has no
    // directories of its own).
    let dir_target = |known: bool, notes: &mut Vec<String>| -> io::Result<Option<Target>> {
        let mut files: BTreeMap<Vec<u8>, History> = BTreeMap::new();
        let mut v = Vec::new();
        if let Some(d) = open_versions_dir(store, &open_root(store)?, rel)? {
            collect(store, &d, rel, None, true, &mut v, notes);
        }
        if let Some(b) = bk {
            b.collect(rel, None, &mut v, notes)?;
        }
        for x in v {
            files
                .entry(x.rel())
                .or_insert_with(|| History {
                    rel: x.rel(),
                    live: None,
                    versions: Vec::new(),
                    broot: bk.map(|b| b.root.clone()),
                    sp: Default::default(),
                })
                .versions
                .push(x);
        }
        let mut live = Vec::new();
        if let Some(d) = live_dir(store, open_root(store)?, rel, false)? {
            live_files(store, &d, rel, &mut live, notes);
        }
        if !known && live.is_empty() && files.is_empty() {
            return Ok(None);
        }
        for (r, m) in live {
            files
                .entry(r.clone())
                .or_insert_with(|| History {
                    rel: r,
                    live: None,
                    versions: Vec::new(),
                    broot: bk.map(|b| b.root.clone()),
                    sp: Default::default(),
                })
                .live = Some(m);
        }
        for h in files.values_mut() {
            h.versions.sort_by_key(|v| (v.kept, v.n));
        }
        Ok(Some(Target::Dir {
            rel: rel.to_vec(),
            files,
        }))
    };
    if rel.is_empty() {
        return dir_target(true, notes);
    }
    let (pdir, name) = split_parent(rel);
    let live = match live_dir(store, open_root(store)?, pdir, false)? {
        Some(d) => store.stat(&d, &cstr(name)?)?,
        None => None,
    };
    if live.is_some_and(|m| m.kind == Kind::Dir) {
        return dir_target(true, notes);
    }
    let mut versions = Vec::new();
    if let Some(d) = open_versions_dir(store, &open_root(store)?, pdir)? {
        collect(store, &d, pdir, Some(name), false, &mut versions, notes);
    }
    if let Some(b) = bk {
        b.collect(pdir, Some(name), &mut versions, notes)?;
    }
    versions.sort_by_key(|v| (v.kept, v.n));
    if live.is_some() || !versions.is_empty() {
        return Ok(Some(Target::File(History {
            rel: rel.to_vec(),
            live,
            versions,
            broot: bk.map(|b| b.root.clone()),
            sp: Default::default(),
        })));
    }
    // A deleted directory with versions below it, or a directory an
    // object store knows only by the objects under it.
    dir_target(false, notes)
}

/// Open a replica's store.
fn open_store(root: &Root) -> Result<AnyStore, String> {
    ferry_backends::open(
        root,
        &Opts {
            jobs: 4,
            lazy_meta: false,
        },
    )
    .map_err(|e| e.to_string())
}

fn print_notes(notes: Vec<String>) {
    for n in notes {
        eprintln!("ferry: note: {}", text_name_string(n.as_bytes()));
    }
}

/// Look `rep.rel` up in its replica; every failure is one line (exit 2).
fn lookup_in(
    typed: &str,
    rep: &Replica,
    store: &AnyStore,
    bk: Option<&Backups>,
) -> Result<Target, String> {
    let mut notes = Vec::new();
    let t =
        target(store, &rep.rel, bk, &mut notes).map_err(|e| format!("{typed}: {}", cause(&e)))?;
    print_notes(notes);
    t.ok_or_else(|| {
        format!(
            "{typed}: no such file or directory, and no versions of it kept in {}",
            location(&rep.root, VERSIONS_DIR)
        )
    })
}

/// Find PATH's replica, open its store and look PATH up; every failure
/// is one line (exit 2).
fn lookup(
    path: &Path,
    endpoint: Option<&str>,
    backup: Option<(&Path, &[u8])>,
) -> Result<(Replica, AnyStore, Target, Option<Backups>), String> {
    let typed = Location::parse(path.as_os_str()).to_string();
    let (rep, bk) = match backup {
        Some((dir, suffix)) => {
            let (r, b) = find_backups(path, dir, suffix)?;
            (r, Some(b))
        }
        None => (find_replica(path, endpoint)?, None),
    };
    let store = open_store(&rep.root)?;
    let t = lookup_in(&typed, &rep, &store, bk.as_ref())?;
    Ok((rep, store, t, bk))
}

/// `--from DST PATH`: PATH is in the tree synced to DST (SRC); its place
/// in DST is the trailing part of its path that DST has (live or with
/// versions) whose directory in DST shares the most names with PATH's
/// directory here (the longest such part on a tie); an existing directory
/// may be SRC's root, DST's root.
fn lookup_from(
    dst: &Path,
    path: &Path,
    endpoint: Option<&str>,
) -> Result<(Replica, AnyStore, Target), String> {
    let loc = Location::parse(path.as_os_str());
    let Location::Local(p) = &loc else {
        return Err(format!(
            "{loc}: with --from, PATH is a local path in the tree synced to DST"
        ));
    };
    let abs = absolute(p).map_err(|e| format!("{loc}: {}", cause(&e)))?;
    let dst_rep = find_replica(dst, endpoint)?;
    let store = open_store(&dst_rep.root)?;
    let is_dir = std::fs::metadata(&abs).is_ok_and(|m| m.is_dir());
    let comps: Vec<&[u8]> = abs
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.as_bytes()),
            _ => None,
        })
        .collect();
    // The names in PATH's directory here (PATH itself when a directory).
    let here_dir = if is_dir {
        abs.clone()
    } else {
        abs.parent().unwrap_or(Path::new("/")).to_path_buf()
    };
    let here: std::collections::HashSet<Vec<u8>> = std::fs::read_dir(&here_dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().as_bytes().to_vec())
                .filter(|n| !ferry_engine::keep::is_versions_dir(n))
                .collect()
        })
        .unwrap_or_default();
    let mut best: Option<(usize, usize, Vec<u8>)> = None;
    // Longest part first; DST's root (the empty part) for a directory.
    let last = if is_dir {
        comps.len()
    } else {
        comps.len().saturating_sub(1)
    };
    for k in 0..=last {
        let tail = comps[k..].join(&b'/');
        let rel = ferry_engine::entry::join(&dst_rep.rel, &tail);
        let reserved = rel
            .split(|&c| c == b'/')
            .any(ferry_engine::keep::is_versions_dir);
        if reserved || !plain_rel(&rel) || !known(&store, &rel).unwrap_or(false) {
            continue;
        }
        let dir = if is_dir {
            rel.clone()
        } else {
            split_parent(&rel).0.to_vec()
        };
        let score = names_there(&store, &dir)
            .map(|n| n.iter().filter(|x| here.contains(*x)).count())
            .unwrap_or(0);
        let len = comps.len() - k;
        if best.as_ref().is_none_or(|b| (score, len) > (b.0, b.1)) {
            best = Some((score, len, rel));
        }
    }
    let Some((_, _, rel)) = best else {
        return Err(format!(
            "{loc}: neither it nor any trailing part of its path is in {} (live or with versions)",
            location(&dst_rep.root, &dst_rep.rel)
        ));
    };
    let mut notes = Vec::new();
    let t = target(&store, &rel, None, &mut notes)
        .map_err(|e| format!("{loc}: {}", cause(&e)))?
        .ok_or_else(|| format!("{loc}: {} went missing", location(&dst_rep.root, &rel)))?;
    print_notes(notes);
    Ok((
        Replica {
            root: dst_rep.root,
            rel,
        },
        store,
        t,
    ))
}

/// True when the replica has `rel`: live, or with versions (one stat and
/// one listing).
fn known(store: &AnyStore, rel: &[u8]) -> io::Result<bool> {
    if rel.is_empty() {
        return Ok(true);
    }
    let (pdir, name) = split_parent(rel);
    if let Some(d) = live_dir(store, open_root(store)?, pdir, false)? {
        if store.stat(&d, &cstr(name)?)?.is_some() {
            return Ok(true);
        }
    }
    let mut v = Vec::new();
    let mut notes = Vec::new();
    if let Some(d) = open_versions_dir(store, &open_root(store)?, pdir)? {
        collect(store, &d, pdir, Some(name), false, &mut v, &mut notes);
    }
    // A deleted directory: versions below it.
    Ok(!v.is_empty() || open_versions_dir(store, &open_root(store)?, rel)?.is_some())
}

/// The names in the replica's directory `dir`: live entries, and files
/// that have versions there.
fn names_there(store: &AnyStore, dir: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    if let Some(d) = live_dir(store, open_root(store)?, dir, false)? {
        let mut l = Listing::new();
        let mut errors = Vec::new();
        store.list(&d, dir, &mut l, &mut errors)?;
        out.extend(
            l.entries()
                .iter()
                .map(|e| l.name(e).to_vec())
                .filter(|n| !ferry_engine::keep::is_versions_dir(n)),
        );
    }
    let mut v = Vec::new();
    let mut notes = Vec::new();
    if let Some(d) = open_versions_dir(store, &open_root(store)?, dir)? {
        collect(store, &d, dir, None, false, &mut v, &mut notes);
    }
    out.extend(v.into_iter().map(|x| x.name));
    out.sort();
    out.dedup();
    Ok(out)
}

/// The location of `rel` below `root` as raw bytes (what `--json` gives:
/// the name as it is, never escaped; `location` is its text form). One
/// `/` between the root and `rel`, none doubled.
fn location_bytes(root: &Root, rel: &[u8]) -> Vec<u8> {
    let mut id = match root {
        Root::Local(p) => p.as_os_str().as_bytes().to_vec(),
        Root::S3(c) => format!("s3://{}/{}", c.bucket, c.prefix.trim_matches('/')).into_bytes(),
        Root::Ssh(r) | Root::Sftp(r) => {
            let mut path = r.path.as_slice();
            while path.len() > 1 && path.ends_with(b"/") {
                path = &path[..path.len() - 1];
            }
            match r.port {
                Some(p) => [
                    format!("ssh://{}:{p}/", r.host).as_bytes(),
                    path.strip_prefix(b"/").unwrap_or(path),
                ]
                .concat(),
                None => [format!("{}:", r.host).as_bytes(), path].concat(),
            }
        }
    };
    if rel.is_empty() {
        return id;
    }
    while id.ends_with(b"//") && !id.ends_with(b"://") {
        id.pop();
    }
    // `host:` (a remote home) and `s3://b/` take the path as it is.
    if !id.is_empty() && !id.ends_with(b"/") && !id.ends_with(b":") {
        id.push(b'/');
    }
    id.extend_from_slice(rel.strip_prefix(b"/").unwrap_or(rel));
    id
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_json(unix: i64) -> String {
    format!("{}Z", utc(unix).replace(' ', "T"))
}

/// One version as a JSON object: paths as the other JSON outputs give
/// names (a string; with `KEY_bytes` in base64 when not UTF-8).
fn json_line(out: &mut Vec<u8>, root: &Root, h: &History, i: usize) {
    let v = &h.versions[i];
    let written = h.written(Pick::Version(i));
    out.extend_from_slice(b"{\"type\":\"version\",");
    json_name(out, "path", &v.rel());
    out.extend_from_slice(b",\"kept\":");
    json_string(out, &utc_json(v.kept));
    out.extend_from_slice(b",\"written\":");
    json_string(out, &utc_json(written));
    let _ = write!(
        out,
        ",\"kept_unix\":{},\"written_unix\":{written},\"size\":{},\"mtime_ns\":{},\"mode\":{},\"deleted\":{},",
        v.kept,
        v.meta.size,
        v.meta.mtime_ns(),
        v.meta.mode,
        h.live.is_none()
    );
    json_name(out, "where", &h.where_bytes(root, Pick::Version(i)));
    out.push(b',');
    json_name(out, "root", &location_bytes(root, b""));
    out.extend_from_slice(b"}\n");
}

/// The state of a file at `--at`, as a JSON object.
fn json_state(out: &mut Vec<u8>, root: &Root, h: &History, p: Pick) {
    let m = h.meta(p);
    out.extend_from_slice(b"{\"type\":\"state\",");
    json_name(out, "path", &h.rel);
    let state = match (p, &h.live) {
        (Pick::Live, _) => "current",
        (_, Some(_)) => "changed",
        (_, None) => "deleted",
    };
    let written = h.written(p);
    let _ = write!(
        out,
        ",\"state\":\"{state}\",\"written_unix\":{written},\"size\":{},\"mtime_ns\":{},",
        m.size,
        m.mtime_ns()
    );
    json_name(out, "where", &h.where_bytes(root, p));
    out.extend_from_slice(b"}\n");
}

/// Columns padded to their widest cell, two spaces apart, the last one
/// as it is; the first row is the header.
fn table(out: &mut Vec<u8>, rows: &[Vec<String>], right: &[bool]) {
    let n = rows.first().map_or(0, Vec::len);
    let mut w = vec![0; n];
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n.saturating_sub(1)) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == n {
                line.push_str(c);
            } else {
                let pad = w[i] - c.chars().count();
                if right.get(i).copied().unwrap_or(false) {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(c);
                } else {
                    line.push_str(c);
                    line.push_str(&" ".repeat(pad));
                }
                line.push_str("  ");
            }
        }
        let _ = writeln!(out, "{line}");
    }
}

/// `ferry versions PATH [--at TIME] [--json]`.
pub fn run_versions(a: VersionsArgs) -> Result<u8, String> {
    let now = now_unix();
    let tz = TimeZone::system();
    let at = a.at.as_deref().map(|s| parse_at(s, now, &tz)).transpose()?;
    let suffix = a.suffix.as_deref().unwrap_or("").as_bytes().to_vec();
    let backup = a.backup_dir.as_deref().map(|d| (d, suffix.as_slice()));
    let (rep, _store, t, _bk) = lookup(&a.path, a.tx.s3_endpoint.as_deref(), backup)?;
    let root = &rep.root;
    let mut out = Vec::new();
    let local = |t: i64| local_time(t, &tz);
    let (files, one): (Vec<History>, bool) = match t {
        Target::File(h) => (vec![h], true),
        Target::Dir { files, .. } => (files.into_values().collect(), false),
    };
    if let Some(at) = at {
        // Each file as it was at TIME.
        let mut rows = vec![vec![
            "STATE".to_string(),
            "WRITTEN".into(),
            "SIZE".into(),
            "PATH".into(),
        ]];
        let mut any = false;
        for h in &files {
            let Some(p) = h.pick(Some(at)) else { continue };
            any = true;
            if a.json {
                json_state(&mut out, root, h, p);
                continue;
            }
            let state = match (p, &h.live) {
                (Pick::Live, _) => "current",
                (_, Some(_)) => "changed",
                (_, None) => "deleted",
            };
            rows.push(vec![
                state.into(),
                local(h.written(p)),
                h.meta(p).size.to_string(),
                location(root, &h.rel),
            ]);
        }
        if !any {
            eprintln!(
                "ferry: nothing of {} existed at {} (as far as its versions tell)",
                location(root, &rep.rel),
                local(at)
            );
        } else if !a.json {
            table(&mut out, &rows, &[false, false, true]);
        }
    } else if let (true, [h]) = (one, &files[..]) {
        if h.versions.is_empty() {
            eprintln!("ferry: no versions of {} kept", location(root, &h.rel));
        } else if a.json {
            for i in (0..h.versions.len()).rev() {
                json_line(&mut out, root, h, i);
            }
        } else {
            // Newest first: the current file, then each version with the
            // span it held.
            let mut rows = vec![vec![
                "WRITTEN".to_string(),
                "REPLACED".into(),
                "SIZE".into(),
                "VERSION".into(),
            ]];
            if let Some(m) = &h.live {
                rows.push(vec![
                    local(h.written(Pick::Live)),
                    "(current)".into(),
                    m.size.to_string(),
                    location(root, &h.rel),
                ]);
            }
            for (i, v) in h.versions.iter().enumerate().rev() {
                rows.push(vec![
                    local(h.written(Pick::Version(i))),
                    local(v.kept),
                    v.meta.size.to_string(),
                    h.where_text(root, Pick::Version(i)),
                ]);
            }
            table(&mut out, &rows, &[false, false, true]);
        }
    } else {
        let with: Vec<&History> = files.iter().filter(|h| !h.versions.is_empty()).collect();
        if with.is_empty() {
            eprintln!("ferry: no versions kept below {}", location(root, &rep.rel));
        } else if a.json {
            for h in with {
                for i in (0..h.versions.len()).rev() {
                    json_line(&mut out, root, h, i);
                }
            }
        } else {
            let mut rows = vec![vec![
                "LAST REPLACED".to_string(),
                "VERSIONS".into(),
                "NOW".into(),
                "PATH".into(),
            ]];
            for h in with {
                let newest = h.versions.iter().map(|v| v.kept).max().unwrap_or(0);
                rows.push(vec![
                    local(newest),
                    h.versions.len().to_string(),
                    if h.live.is_some() {
                        "present"
                    } else {
                        "deleted"
                    }
                    .into(),
                    location(root, &h.rel),
                ]);
            }
            table(&mut out, &rows, &[false, true, false]);
        }
    }
    let mut so = io::stdout().lock();
    match so.write_all(&out).and_then(|()| so.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(format!("stdout: {}", cause(&e))),
        _ => Ok(0),
    }
}

/// `YYYY-MM-DD HH:MM:SS` in the local time zone `tz`.
fn local_time(unix: i64, tz: &TimeZone) -> String {
    match Timestamp::from_second(unix) {
        Ok(t) => t
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%d %H:%M:%S")
            .to_string(),
        Err(_) => unix.to_string(),
    }
}

/// The time of `--at`, in Unix seconds, `now` being the clock and `tz`
/// the local time zone:
/// - `now`, `today` (its midnight), `yesterday` (this time yesterday),
///   `today 09:00`, `yesterday 17:30`;
/// - a time of day `04:55[:30]`: the last one that has passed (today's,
///   or yesterday's when today's is still to come);
/// - a local date and time `2026-11-25 16:33[:43]` (or with a `T`), a
///   local date `2026-11-25` (its midnight);
/// - RFC 3339 with a zone: `2026-11-25T16:33:43Z`, `...+01:00`;
/// - a version's stamp `20261125-163343` (UTC, as in its name);
/// - an age: `2h`, `90m`, `3d`, `1h30m`, `2w`, optionally followed by
///   `ago`.
pub fn parse_at(s: &str, now: i64, tz: &TimeZone) -> Result<i64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let bad = || {
        format!(
            "--at {s:?}: not a time (2026-11-25 16:33, 2026-11-25, 16:33, yesterday, 2h, 2026-11-25T16:33:43Z, 20261125-163343)"
        )
    };
    let now_z = Timestamp::from_second(now)
        .map_err(|e| format!("--at {s:?}: {e}"))?
        .to_zoned(tz.clone());
    let zoned = |dt: DateTime| -> Result<i64, String> {
        dt.to_zoned(tz.clone())
            .map(|z| z.timestamp().as_second())
            .map_err(|e| format!("--at {s:?}: {e}"))
    };
    let time_of = |x: &str| -> Option<Time> {
        let x = x.trim();
        // Only a time of day (jiff would take the time out of a date and
        // time as well).
        if !x.contains(':')
            || !x
                .chars()
                .all(|c| c.is_ascii_digit() || c == ':' || c == '.')
        {
            return None;
        }
        // `9:05` as well as `09:05`.
        let padded;
        let x = if x.find(':') == Some(1) {
            padded = format!("0{x}");
            padded.as_str()
        } else {
            x
        };
        x.parse::<Time>().ok()
    };
    if let Some(x) = ferry_engine::keep::parse_stamp(t.as_bytes()) {
        return Ok(x);
    }
    let mut words = lower.splitn(2, ' ');
    let (w0, rest) = (words.next().unwrap_or(""), words.next());
    let day = match w0 {
        "now" if rest.is_none() => return Ok(now),
        "today" => Some(now_z.date()),
        "yesterday" => Some(now_z.date().yesterday().map_err(|e| e.to_string())?),
        _ => None,
    };
    if let Some(d) = day {
        return match rest {
            Some(r) => zoned(d.to_datetime(time_of(r).ok_or_else(bad)?)),
            None if w0 == "today" => zoned(d.to_datetime(Time::midnight())),
            // This time yesterday.
            None => zoned(d.to_datetime(now_z.time())),
        };
    }
    let age = lower.strip_suffix("ago").map(str::trim).unwrap_or(&lower);
    if age.chars().next().is_some_and(|c| c.is_ascii_digit()) && !age.contains([':', '-']) {
        if let Ok(d) = crate::filter_args::parse_duration(age) {
            return Ok(now - d.as_secs() as i64);
        }
    }
    if let Some(tm) = time_of(t) {
        let today = zoned(now_z.date().to_datetime(tm))?;
        if today <= now {
            return Ok(today);
        }
        let y = now_z.date().yesterday().map_err(|e| e.to_string())?;
        return zoned(y.to_datetime(tm));
    }
    if let Ok(ts) = t.parse::<Timestamp>() {
        return Ok(ts.as_second());
    }
    if let Ok(dt) = t.parse::<DateTime>() {
        return zoned(dt);
    }
    if let Ok(d) = t.parse::<Date>() {
        return zoned(d.to_datetime(Time::midnight()));
    }
    Err(bad())
}

/// Where a restore writes.
enum Dest {
    /// Back at the file's own path in its replica.
    InPlace,
    /// Standard output (`--to -`, one file).
    Stdout,
    /// `--to PATH` (or PATH itself with `--from`): a local path, for one
    /// file its new path, for a directory the directory that receives
    /// the tree.
    Path(PathBuf),
}

/// What a restore does with what is at its target now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Replace {
    /// The file's own place in the replica: kept as a version there (a
    /// hard link or the store's own copy).
    InPlace,
    /// The same file in the tree synced to the replica (`--from`): kept
    /// as a version in the replica, by a copy.
    Twin,
    /// Another path (`--to`): never replaced.
    Never,
}

/// One file to put back: its history and the state taken.
struct Job1<'h> {
    h: &'h History,
    p: Pick,
}

/// Where a restore writes one file.
struct Out<'s> {
    store: &'s AnyStore,
    /// The target's root (shown in lines).
    root: &'s Root,
    /// The target file's path below `root`.
    rel: Vec<u8>,
}

/// A local `--to` target: its store and root, and for one file its
/// path below that root.
struct OutBase {
    store: AnyStore,
    root: Root,
    rel: Vec<u8>,
}

/// What a restore needs of the replica.
struct Ctx<'a> {
    rep: &'a Replica,
    store: &'a AnyStore,
    /// The backup directory given (`--backup-dir`): versions from there,
    /// and what a restore replaces kept there.
    bk: Option<&'a Backups>,
    now: i64,
    tz: &'a TimeZone,
}

impl Ctx<'_> {
    /// Open (with `create`, making what is missing) the directory of the
    /// source state of `j`: the version's directory, or the live one.
    fn source(&self, j: &Job1) -> io::Result<(AnyDir, CString, Meta, Vec<u8>)> {
        let root = open_root(self.store)?;
        match j.p {
            Pick::Version(i) => {
                let v = &j.h.versions[i];
                let d = match (v.backup, self.bk) {
                    (true, Some(b)) => live_dir(&b.store, open_root(&b.store)?, &v.dir, false)?,
                    _ => open_versions_dir(self.store, &root, &v.dir)?,
                }
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
                Ok((d, cstr(&v.vname)?, v.meta, v.path()))
            }
            Pick::Live => {
                let (pdir, name) = split_parent(&j.h.rel);
                let d = live_dir(self.store, root, pdir, false)?
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
                let m = j.h.live.expect("a live pick");
                Ok((d, cstr(name)?, m, j.h.rel.clone()))
            }
        }
    }

    /// Keep what `name` of `dir` (in `out`) is now, `cur`, as a version of
    /// `rel` in the replica: a link in place when `out` is the replica, a
    /// copy into its versions directory otherwise. Returns where it went.
    fn keep_current(
        &self,
        out: &Out,
        dir: &AnyDir,
        name: &CStr,
        rel: &[u8],
        cur: &Meta,
        how: Replace,
    ) -> io::Result<Vec<u8>> {
        if !self.store.can_keep(&KeepBase::Root(VERSIONS_DIR.to_vec())) {
            return Err(io::Error::other(
                "this store cannot keep the current file as a version",
            ));
        }
        let rule = self.bk.map_or(KeepRule::Versions, |b| b.rule.clone());
        let k = Keeper::new(rule, self.now);
        match how {
            Replace::InPlace => {
                return k.keep(self.store, dir, name, rel, &Planned::new(cur, 1), true)
            }
            Replace::Never => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "exists; --to never replaces a file",
                ))
            }
            Replace::Twin => {}
        }
        if !matches!(cur.kind, Kind::File | Kind::Symlink) {
            return Err(io::Error::other(format!(
                "{} there: not replaced",
                cur.kind.as_str()
            )));
        }
        // A copy into the replica's versions directory, under a temporary
        // name, then moved to its version's name (never over another).
        let (pdir, _) = split_parent(rel);
        let root = open_root(self.store)?;
        let mut vd = live_dir(self.store, root, VERSIONS_DIR, true)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        for part in pdir.split(|&c| c == b'/').filter(|p| !p.is_empty()) {
            let n = cstr(part)?;
            vd = match self.store.open_dir(&vd, &n) {
                Ok(x) => x,
                Err(e) if missing(&e) => self.store.make_dir(&vd, &n)?,
                Err(e) => return Err(e),
            };
        }
        let tmp = cstr(format!(".ferry-restore.{}.{}", std::process::id(), self.now).as_bytes())?;
        if cur.kind == Kind::Symlink {
            let target = out.store.read_link(dir, name)?;
            self.store.create_symlink(&vd, &tmp, &target, cur)?;
        } else {
            copier(out.store, self.store, |c| {
                c.copy_file(FileCopy {
                    sdir: dir,
                    sname: name,
                    ddir: &vd,
                    name: &tmp,
                    rel,
                    meta: cur,
                    old: None,
                })
                .map(|_| ())
            })?;
        }
        let kept = self
            .store
            .stat(&vd, &tmp)?
            .ok_or_else(|| io::Error::other("the copy of the current file went missing"))?;
        let r = k.keep(self.store, &vd, &tmp, rel, &Planned::new(&kept, 1), false);
        if r.is_err() {
            let _ = self.store.remove(&vd, &tmp, false);
        }
        r
    }
}

/// Run `f` with a copier from `src` to `dst` that keeps everything a
/// run keeps: mode, times, owner (as root), every extended attribute and
/// ACL both stores can keep; returns `f`'s answer and prints the note
/// about attributes that could not be kept.
fn copier<R>(
    src: &AnyStore,
    dst: &AnyStore,
    f: impl FnOnce(&Copier<AnyStore, AnyStore>) -> io::Result<R>,
) -> io::Result<R> {
    let xr = ferry_engine::xattr::XattrRun::new(
        ferry_engine::xattr::XattrSel::ALL,
        src.xattr_caps(),
        dst.xattr_caps(),
    );
    let moved = AtomicU64::new(0);
    let c = Copier {
        src,
        dst,
        fsync: true,
        bwlimit: None,
        moved: &moved,
        xattrs: xr.active(),
        delta: None,
        keep: None,
        mtime_step: ferry_engine::store::mtime_step(src, dst),
        // A version the store kept of its own file: its mode as it was.
        special: None,
        grow: None,
    };
    f(&c)
}

/// Put back one file: the state `j` of its history into `out` (its
/// directory created as needed). What is there now is kept first as a
/// version in the replica. Returns the line to print.
fn restore_one(
    cx: &Ctx,
    j: &Job1,
    out: &Out,
    how: Replace,
    dry_run: bool,
) -> Result<String, String> {
    let root = &cx.rep.root;
    let shown = location(out.root, &out.rel);
    let fail = |e: io::Error| format!("{shown}: not restored: {}", cause(&e));
    let meta = j.h.meta(j.p);
    let from = j.h.where_text(root, j.p);
    if meta.kind != Kind::File && meta.kind != Kind::Symlink {
        return Err(format!(
            "{from}: a {} cannot be restored",
            meta.kind.as_str()
        ));
    }
    let written = local_time(j.h.written(j.p), cx.tz);
    let what = match j.p {
        Pick::Live => format!("{from} (written {written}, current)"),
        Pick::Version(i) => format!(
            "{from} (written {written}, replaced {})",
            local_time(j.h.versions[i].kept, cx.tz)
        ),
    };
    let (pdir, name) = split_parent(&out.rel);
    let cname = cstr(name).map_err(fail)?;
    if dry_run {
        // What is there now, as far as it can be seen (a target that does
        // not exist yet has nothing).
        let current = open_root(out.store)
            .ok()
            .and_then(|r| live_dir(out.store, r, pdir, false).ok().flatten())
            .and_then(|d| out.store.stat(&d, &cname).ok().flatten());
        if current.is_some_and(|m| m.kind == Kind::Dir) {
            return Err(format!("{shown}: is a directory now; not replaced"));
        }
        if current.is_some() && how == Replace::Never {
            return Err(format!(
                "{shown}: not restored: exists; --to never replaces a file"
            ));
        }
        return Ok(format!(
            "would restore {shown} from {what}{}",
            if current.is_some() {
                "; the current file would be kept as a version"
            } else {
                ""
            }
        ));
    }
    let odir = live_dir(out.store, open_root(out.store).map_err(fail)?, pdir, true)
        .map_err(fail)?
        .ok_or_else(|| fail(io::Error::from(io::ErrorKind::NotFound)))?;
    let current = out.store.stat(&odir, &cname).map_err(fail)?;
    if current.is_some_and(|m| m.kind == Kind::Dir) {
        return Err(format!("{shown}: is a directory now; not replaced"));
    }
    let (sdir, sname, smeta, _) = cx.source(j).map_err(fail)?;
    // A file that holds that content already (same size, mtime and
    // bytes) is left as it is: a restore run twice keeps nothing twice.
    if let Some(cur) = &current {
        if cur.kind == Kind::File
            && smeta.kind == Kind::File
            && (cur.size, cur.mtime_sec, cur.mtime_nsec)
                == (smeta.size, smeta.mtime_sec, smeta.mtime_nsec)
            && same_bytes(cx.store, &sdir, &sname, out.store, &odir, &cname).unwrap_or(false)
        {
            return Ok(format!("{SAME}{shown} (it holds {what} already)"));
        }
    }
    // What the file is now goes into the history first: a restore loses
    // nothing.
    let mut kept_as = None;
    if let Some(cur) = &current {
        let p = cx
            .keep_current(out, &odir, &cname, &j.h.rel, cur, how)
            .map_err(fail)?;
        kept_as = Some(p);
    }
    copier(cx.store, out.store, |c| {
        if smeta.kind == Kind::Symlink {
            let target = cx.store.read_link(&sdir, &sname)?;
            out.store.create_symlink(&odir, &cname, &target, &smeta)?;
            c.new_entry_xattrs(&sdir, &sname, &odir, &cname, &smeta)
        } else {
            c.copy_file(FileCopy {
                sdir: &sdir,
                sname: &sname,
                ddir: &odir,
                name: &cname,
                rel: &out.rel,
                meta: &smeta,
                old: current.as_ref(),
            })
            .map(|_| ())
        }
    })
    .map_err(fail)?;
    let mut line = format!("restored {shown} from {what}");
    if let Some(p) = kept_as {
        // A backup directory outside the replica is shown whole.
        let at = match root {
            Root::Local(_) if p.starts_with(b"/") => text_name_string(&p),
            _ => location(root, &p),
        };
        line.push_str(&format!("; the file it replaced is kept as {at}"));
    }
    Ok(line)
}

/// The start of [`restore_one`]'s line for a file left as it is.
const SAME: &str = "unchanged ";

/// True when the two files hold the same bytes.
fn same_bytes(
    a: &AnyStore,
    ad: &AnyDir,
    an: &CStr,
    b: &AnyStore,
    bd: &AnyDir,
    bn: &CStr,
) -> io::Result<bool> {
    use ferry_engine::store::SourceFile;
    let mut ra = a.open_file(ad, an)?;
    let mut rb = b.open_file(bd, bn)?;
    let (mut x, mut y) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = ra.read(&mut x)?;
        let mut m = 0;
        while m < n {
            let k = rb.read(&mut y[m..n])?;
            if k == 0 {
                return Ok(false);
            }
            m += k;
        }
        if x[..n] != y[..n] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Write the state `j` of a file to standard output.
fn to_stdout(cx: &Ctx, j: &Job1) -> Result<(), String> {
    let meta = j.h.meta(j.p);
    let shown = location(&cx.rep.root, &j.h.rel);
    if meta.kind != Kind::File {
        return Err(format!(
            "{shown}: a {} at that time: --to - writes a file's content",
            meta.kind.as_str()
        ));
    }
    let fail = |e: io::Error| format!("{shown}: {}", cause(&e));
    let (d, n, _, _) = cx.source(j).map_err(fail)?;
    let mut r = cx.store.open_file(&d, &n).map_err(fail)?;
    let mut so = io::stdout().lock();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let k = ferry_engine::store::SourceFile::read(&mut r, &mut buf).map_err(fail)?;
        if k == 0 {
            break;
        }
        match so.write_all(&buf[..k]) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(format!("stdout: {}", cause(&e))),
            Ok(()) => {}
        }
    }
    so.flush().map_err(|e| format!("stdout: {}", cause(&e)))
}

/// The store and path of a local `--to` target: for a file, PATH (or
/// PATH/NAME when PATH is a directory); for a directory, PATH itself
/// (made when missing).
fn local_out(p: &Path, file_name: Option<&[u8]>, create: bool) -> Result<OutBase, String> {
    let typed = p.display().to_string();
    let abs = absolute(p).map_err(|e| format!("--to {typed}: {}", cause(&e)))?;
    let is_dir = std::fs::metadata(&abs).is_ok_and(|m| m.is_dir());
    let (dir, rel) = match file_name {
        Some(n) if is_dir => (abs, n.to_vec()),
        Some(_) => {
            let name = abs
                .file_name()
                .ok_or_else(|| format!("--to {typed}: not a file name"))?
                .as_bytes()
                .to_vec();
            (abs.parent().unwrap_or(Path::new("/")).to_path_buf(), name)
        }
        None => {
            if !is_dir && create {
                std::fs::create_dir(&abs).map_err(|e| format!("--to {typed}: {}", cause(&e)))?;
            }
            (abs, Vec::new())
        }
    };
    if create && !std::fs::metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return Err(format!(
            "--to {typed}: {}: no such directory",
            dir.display()
        ));
    }
    let root = Root::Local(dir);
    Ok(OutBase {
        store: open_store(&root)?,
        root,
        rel,
    })
}

/// `ferry restore PATH [--at TIME] [--to PATH|-] [--from DST] [-n]`.
pub fn run_restore(a: RestoreArgs) -> Result<u8, String> {
    let now = now_unix();
    let tz = TimeZone::system();
    let at = a.at.as_deref().map(|s| parse_at(s, now, &tz)).transpose()?;
    let endpoint = a.tx.s3_endpoint.as_deref();
    let typed = Location::parse(a.path.as_os_str()).to_string();
    let suffix = a.suffix.as_deref().unwrap_or("").as_bytes().to_vec();
    let backup = a.backup_dir.as_deref().map(|d| (d, suffix.as_slice()));
    let (rep, store, t, bk) = match &a.from {
        Some(_) if backup.is_some() => {
            return Err("--from and --backup-dir do not go together (yet)".into())
        }
        Some(dst) => {
            let (r, s, t) = lookup_from(dst, &a.path, endpoint)?;
            (r, s, t, None)
        }
        None => lookup(&a.path, endpoint, backup)?,
    };
    let dest = match (&a.to, &a.from) {
        (Some(p), _) if p.as_os_str() == "-" => Dest::Stdout,
        (Some(p), _) => Dest::Path(p.clone()),
        (None, Some(_)) => Dest::Path(a.path.clone()),
        (None, None) => Dest::InPlace,
    };
    if let Dest::Path(p) = &dest {
        if !Location::parse(p.as_os_str()).is_local() {
            return Err(format!(
                "--to {}: a local path (or - for standard output)",
                p.display()
            ));
        }
    }
    let how = match (&dest, &a.to) {
        (Dest::InPlace, _) => Replace::InPlace,
        (_, None) => Replace::Twin,
        _ => Replace::Never,
    };
    let cx = Ctx {
        rep: &rep,
        store: &store,
        bk: bk.as_ref(),
        now,
        tz: &tz,
    };
    let at_text = |t: i64| local_time(t, &tz);
    match t {
        Target::File(h) => {
            let shown = location(&rep.root, &h.rel);
            let Some(p) = h.pick(at) else {
                return Err(match at {
                    None => format!("{shown}: no versions kept"),
                    Some(at) => {
                        let first = if h.versions.is_empty() {
                            Pick::Live
                        } else {
                            Pick::Version(0)
                        };
                        format!(
                            "{shown}: did not exist at {} as far as its versions tell (the oldest state written {})",
                            at_text(at),
                            at_text(h.written(first))
                        )
                    }
                });
            };
            let j = Job1 { h: &h, p };
            let base;
            let out = match &dest {
                Dest::Stdout => {
                    if a.dry_run {
                        println!("would write {shown} to standard output");
                        return Ok(0);
                    }
                    to_stdout(&cx, &j)?;
                    return Ok(0);
                }
                Dest::InPlace if p == Pick::Live => {
                    println!(
                        "{shown}: already as it was at {} (the current file, written {})",
                        at_text(at.unwrap_or(now)),
                        at_text(h.written(p))
                    );
                    return Ok(0);
                }
                Dest::InPlace => Out {
                    store: &store,
                    root: &rep.root,
                    rel: h.rel.clone(),
                },
                Dest::Path(p) => {
                    let (_, name) = split_parent(&h.rel);
                    base = local_out(p, Some(name), !a.dry_run)?;
                    Out {
                        store: &base.store,
                        root: &base.root,
                        rel: base.rel.clone(),
                    }
                }
            };
            let line = restore_one(&cx, &j, &out, how, a.dry_run)?;
            println!("{line}");
            Ok(0)
        }
        Target::Dir { rel, files } => {
            let Some(at) = at else {
                return Err(format!(
                    "{typed}: is a directory: restoring a directory needs --at TIME (see `ferry versions {typed}`)"
                ));
            };
            let out_base = match &dest {
                Dest::Stdout => {
                    return Err(format!("{typed}: is a directory: --to - writes one file"))
                }
                Dest::InPlace => None,
                Dest::Path(p) => Some(local_out(p, None, !a.dry_run)?),
            };
            let (mut done, mut same, mut absent, mut failed) = (0u64, 0u64, 0u64, 0u64);
            for h in files.values() {
                let Some(p) = h.pick(Some(at)) else {
                    absent += 1;
                    continue;
                };
                let j = Job1 { h, p };
                let below = h.rel[rel.len()..]
                    .strip_prefix(b"/")
                    .unwrap_or(&h.rel[rel.len()..]);
                let out = match &out_base {
                    None if p == Pick::Live => {
                        same += 1;
                        continue;
                    }
                    None => Out {
                        store: &store,
                        root: &rep.root,
                        rel: h.rel.clone(),
                    },
                    Some(o) => Out {
                        store: &o.store,
                        root: &o.root,
                        rel: below.to_vec(),
                    },
                };
                match restore_one(&cx, &j, &out, how, a.dry_run) {
                    Ok(line) if line.starts_with(SAME) => same += 1,
                    Ok(line) => {
                        println!("{line}");
                        done += 1;
                    }
                    Err(e) => {
                        eprintln!("ferry: {e}");
                        failed += 1;
                    }
                }
            }
            let mut s = format!(
                "ferry: {} {done} file{} as of {}",
                if a.dry_run {
                    "would restore"
                } else {
                    "restored"
                },
                if done == 1 { "" } else { "s" },
                at_text(at)
            );
            if same > 0 {
                s.push_str(&format!(", {same} unchanged since"));
            }
            if absent > 0 {
                s.push_str(&format!(
                    ", {absent} that did not exist then left as they are"
                ));
            }
            if failed > 0 {
                s.push_str(&format!(", {failed} failed"));
            }
            eprintln!("{s}");
            Ok(if failed > 0 { 1 } else { 0 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_for_at() {
        let now = 1_795_624_423; // 2026-11-25 16:33:43 UTC, a Wednesday
        let utc = TimeZone::UTC;
        let at = |s| parse_at(s, now, &utc).unwrap();
        assert_eq!(at("20261125-163343"), now);
        assert_eq!(at("2026-11-25T16:33:43Z"), now);
        assert_eq!(at("2026-11-25T17:33:43+01:00"), now);
        assert_eq!(at("2026-11-25 16:33:43"), now);
        assert_eq!(at("2026-11-25 16:33"), now - 43);
        assert_eq!(at("2026-11-25"), now - (16 * 3600 + 33 * 60 + 43));
        assert_eq!(at("2h"), now - 7200);
        assert_eq!(at("2h ago"), now - 7200);
        assert_eq!(at("1h30m"), now - 5400);
        assert_eq!(at("3d"), now - 3 * 86_400);
        assert_eq!(at("now"), now);
        assert_eq!(at("yesterday"), now - 86_400);
        assert_eq!(at("Yesterday 16:00"), now - 86_400 - 33 * 60 - 43);
        assert_eq!(at("today"), now - (16 * 3600 + 33 * 60 + 43));
        // A time of day: the last that has passed.
        assert_eq!(at("16:00"), now - 33 * 60 - 43);
        assert_eq!(at("4:55"), now - (11 * 3600 + 38 * 60 + 43));
        assert_eq!(at("17:00"), now - 86_400 + 26 * 60 + 17);
        for bad in ["soon", "25:00", "2026-13-01", "yesterday noon", ""] {
            assert!(parse_at(bad, now, &utc).is_err(), "{bad}");
        }
        // Local times are the zone's: 16:33:43 UTC is 17:33:43 in UTC+1.
        let plus1 = TimeZone::fixed(jiff::tz::offset(1));
        assert_eq!(parse_at("2026-11-25 17:33:43", now, &plus1).unwrap(), now);
        assert_eq!(parse_at("17:33:43", now, &plus1).unwrap(), now);
        assert_eq!(local_time(now, &plus1), "2026-11-25 17:33:43");
    }

    #[test]
    fn paths_never_leave_the_replica() {
        for ok in [&b""[..], b"f", b"d/f", b".f/..g", b"a/...", b"a b/c"] {
            assert!(plain_rel(ok), "{:?}", String::from_utf8_lossy(ok));
        }
        for bad in [&b".."[..], b"d/../f", b"./f", b"d//f", b"d/", b"/d", b"d/."] {
            assert!(!plain_rel(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(1_795_624_423), "2026-11-25 16:33:43");
    }
}
