//! `ferry versions PATH` and `ferry restore PATH [--at TIME]`, and the
//! pruning of kept versions after each run with `--versions` (see
//! `ferry_engine::versions` for the policy and docs/CLI.md, "Versions").
//!
//! PATH is anywhere in a replica: its root is the nearest directory above
//! PATH (or PATH itself) that holds `.ferry-versions`, found locally with
//! a stat per level, over ssh/sftp with one remote stat per level, on S3
//! with one listing per level.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use ferry_backends::{AnyDir, AnyStore, Location, Opts, Root};
use ferry_engine::copy::Copier;
use ferry_engine::encode::{json_name, json_string, text_name_string};
use ferry_engine::keep::{split_parent, KeepBase, KeepRule, Keeper, VERSIONS_DIR};
use ferry_engine::versions::{collect, has_versions_dir, keeps_all, open_versions_dir, Version};
use ferry_engine::{Kind, Listing, Meta, Store};
use ferry_s3::S3Config;
use jiff::civil::{Date, DateTime};
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

/// A replica found above PATH: its root and PATH below it.
struct Replica {
    root: Root,
    rel: Vec<u8>,
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
            "{typed}: no .ferry-versions directory in it or above it (versions are kept with --versions)"
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

/// What PATH names in its replica.
enum Target {
    /// A file (`live`: as it is now, `None` when deleted) and its
    /// versions, newest first.
    File {
        rel: Vec<u8>,
        live: Option<Meta>,
        versions: Vec<Version>,
    },
    /// A directory: the versions of every file below it.
    Dir { versions: Vec<Version> },
}

/// Look PATH up in its replica; `Ok(None)` when it names nothing known
/// (neither a live entry nor one with versions).
fn target(store: &AnyStore, rel: &[u8], notes: &mut Vec<String>) -> io::Result<Option<Target>> {
    let open_root = || -> io::Result<AnyDir> {
        match store.open_root()? {
            Some((d, _)) => Ok(d),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    };
    let deep = |sub: &[u8], notes: &mut Vec<String>| -> io::Result<Vec<Version>> {
        let mut v = Vec::new();
        if let Some(d) = open_versions_dir(store, &open_root()?, sub)? {
            collect(store, &d, sub, None, true, &mut v, notes);
        }
        Ok(v)
    };
    if rel.is_empty() {
        return Ok(Some(Target::Dir {
            versions: deep(b"", notes)?,
        }));
    }
    let (pdir, name) = split_parent(rel);
    let live = match live_dir(store, open_root()?, pdir, false)? {
        Some(d) => store.stat(&d, &cstr(name)?)?,
        None => None,
    };
    if live.is_some_and(|m| m.kind == Kind::Dir) {
        return Ok(Some(Target::Dir {
            versions: deep(rel, notes)?,
        }));
    }
    let mut versions = Vec::new();
    if let Some(d) = open_versions_dir(store, &open_root()?, pdir)? {
        collect(store, &d, pdir, Some(name), false, &mut versions, notes);
    }
    versions.sort_by_key(|v| std::cmp::Reverse((v.kept, v.n)));
    if live.is_some() || !versions.is_empty() {
        return Ok(Some(Target::File {
            rel: rel.to_vec(),
            live,
            versions,
        }));
    }
    // A deleted directory with versions below it, or a directory an
    // object store knows only by the objects under it.
    let below = deep(rel, notes)?;
    if !below.is_empty() {
        return Ok(Some(Target::Dir { versions: below }));
    }
    if let Some(d) = live_dir(store, open_root()?, rel, false)? {
        let mut l = Listing::new();
        let mut errors = Vec::new();
        if store.list(&d, rel, &mut l, &mut errors).is_ok() && !l.is_empty() {
            return Ok(Some(Target::Dir { versions: below }));
        }
    }
    Ok(None)
}

/// Find PATH's replica, open its store and look PATH up; every failure
/// is one line (exit 2).
fn lookup(path: &Path, endpoint: Option<&str>) -> Result<(Replica, AnyStore, Target), String> {
    let typed = Location::parse(path.as_os_str()).to_string();
    let rep = find_replica(path, endpoint)?;
    let store = ferry_backends::open(
        &rep.root,
        &Opts {
            jobs: 4,
            lazy_meta: false,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut notes = Vec::new();
    let t = target(&store, &rep.rel, &mut notes).map_err(|e| format!("{typed}: {}", cause(&e)))?;
    for n in notes {
        eprintln!("ferry: note: {}", text_name_string(n.as_bytes()));
    }
    match t {
        Some(t) => Ok((rep, store, t)),
        None => Err(format!(
            "{typed}: no such file or directory, and no versions of it kept in {}",
            location(&rep.root, VERSIONS_DIR)
        )),
    }
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

/// One version as a JSON object: paths as the other JSON outputs give
/// names (a string; with `KEY_bytes` in base64 when not UTF-8).
fn json_line(out: &mut Vec<u8>, root: &Root, v: &Version) {
    out.extend_from_slice(b"{\"type\":\"version\",");
    json_name(out, "path", &v.rel());
    out.extend_from_slice(b",\"kept\":");
    json_string(out, &format!("{}Z", utc(v.kept).replace(' ', "T")));
    let _ = write!(
        out,
        ",\"kept_unix\":{},\"size\":{},\"mtime_ns\":{},\"mode\":{},",
        v.kept,
        v.meta.size,
        v.meta.mtime_ns(),
        v.meta.mode
    );
    json_name(out, "where", &location_bytes(root, &v.path()));
    out.push(b',');
    json_name(out, "root", &location_bytes(root, b""));
    out.extend_from_slice(b"}\n");
}

/// `ferry versions PATH [--json]`.
pub fn run_versions(a: VersionsArgs) -> Result<u8, String> {
    let (rep, _store, t) = lookup(&a.path, a.tx.s3_endpoint.as_deref())?;
    let root = &rep.root;
    let mut out = Vec::new();
    match t {
        Target::File { rel, versions, .. } => {
            if versions.is_empty() {
                eprintln!("ferry: no versions of {} kept", location(root, &rel));
            }
            for v in &versions {
                if a.json {
                    json_line(&mut out, root, v);
                } else {
                    let _ = writeln!(
                        out,
                        "{}  {:>12}  {}  {}",
                        utc(v.kept),
                        v.meta.size,
                        utc(v.meta.mtime_sec),
                        location(root, &v.path())
                    );
                }
            }
        }
        Target::Dir { mut versions } => {
            if versions.is_empty() {
                eprintln!("ferry: no versions kept below {}", location(root, &rep.rel));
            }
            versions.sort_by(|a, b| (a.rel(), b.kept, b.n).cmp(&(b.rel(), a.kept, a.n)));
            if a.json {
                for v in &versions {
                    json_line(&mut out, root, v);
                }
            } else {
                let mut by_file: BTreeMap<Vec<u8>, (usize, i64)> = BTreeMap::new();
                for v in &versions {
                    let e = by_file.entry(v.rel()).or_insert((0, v.kept));
                    e.0 += 1;
                    e.1 = e.1.max(v.kept);
                }
                for (rel, (n, newest)) in by_file {
                    let _ = writeln!(
                        out,
                        "{}  {:>4} version{}  {}",
                        utc(newest),
                        n,
                        if n == 1 { " " } else { "s" },
                        location(root, &rel)
                    );
                }
            }
        }
    }
    let mut so = io::stdout().lock();
    match so.write_all(&out).and_then(|()| so.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(format!("stdout: {}", cause(&e))),
        _ => Ok(0),
    }
}

/// The time of `--at`, in Unix seconds: a stamp `20261125-163343`, an age
/// (`2h`: that long before `now`), RFC 3339, or a civil date and time
/// taken as UTC (as `ferry versions` shows them; a date alone: its
/// midnight).
pub fn parse_at(s: &str, now: i64) -> Result<i64, String> {
    let t = s.trim();
    if let Some(x) = ferry_engine::keep::parse_stamp(t.as_bytes()) {
        return Ok(x);
    }
    if let Ok(d) = crate::filter_args::parse_duration(t) {
        return Ok(now - d.as_secs() as i64);
    }
    if let Ok(ts) = t.parse::<Timestamp>() {
        return Ok(ts.as_second());
    }
    let utc = |dt: DateTime| {
        dt.to_zoned(TimeZone::UTC)
            .map(|z| z.timestamp().as_second())
            .map_err(|e| format!("--at {s:?}: {e}"))
    };
    if let Ok(dt) = t.parse::<DateTime>() {
        return utc(dt);
    }
    if let Ok(d) = t.parse::<Date>() {
        return utc(d.to_datetime(jiff::civil::Time::midnight()));
    }
    Err(format!(
        "--at {s:?}: not a time (2026-11-25T16:33:43Z, '2026-11-25 16:33' UTC, 2026-11-25, 20261125-163343) or an age (2h, 3d)"
    ))
}

/// `ferry restore PATH [--at TIME] [-n]`.
pub fn run_restore(a: RestoreArgs) -> Result<u8, String> {
    let now = now_unix();
    let at = a.at.as_deref().map(|s| parse_at(s, now)).transpose()?;
    let typed = Location::parse(a.path.as_os_str()).to_string();
    let (rep, store, t) = lookup(&a.path, a.tx.s3_endpoint.as_deref())?;
    let root = &rep.root;
    let Target::File {
        rel,
        live,
        versions,
    } = t
    else {
        return Err(format!(
            "{typed}: is a directory: restore puts back one file (see `ferry versions {typed}`)"
        ));
    };
    let shown = location(root, &rel);
    let Some(v) = versions.iter().find(|v| at.is_none_or(|at| v.kept <= at)) else {
        return Err(match (versions.last(), at) {
            (None, _) => format!("{shown}: no versions kept"),
            (Some(oldest), Some(at)) => format!(
                "{shown}: no version kept at or before {} UTC (the oldest was kept {} UTC)",
                utc(at),
                utc(oldest.kept)
            ),
            (Some(_), None) => unreachable!("a version without --at"),
        });
    };
    let from = location(root, &v.path());
    if v.meta.kind != Kind::File && v.meta.kind != Kind::Symlink {
        return Err(format!(
            "{from}: a {} cannot be restored",
            v.meta.kind.as_str()
        ));
    }
    if live.is_some_and(|m| m.kind == Kind::Dir) {
        return Err(format!("{shown}: is a directory now; not replaced"));
    }
    if a.dry_run {
        println!(
            "would restore {shown} from {from} (kept {} UTC){}",
            utc(v.kept),
            if live.is_some() {
                "; the current file would be kept as a version"
            } else {
                ""
            }
        );
        return Ok(0);
    }
    let fail = |e: io::Error| format!("{shown}: not restored: {}", cause(&e));
    let open_root = || -> io::Result<AnyDir> {
        match store.open_root()? {
            Some((d, _)) => Ok(d),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    };
    let vdir = open_versions_dir(&store, &open_root().map_err(fail)?, &v.dir)
        .map_err(fail)?
        .ok_or_else(|| fail(io::Error::from(io::ErrorKind::NotFound)))?;
    let (pdir, name) = split_parent(&rel);
    let dir = live_dir(&store, open_root().map_err(fail)?, pdir, true)
        .map_err(fail)?
        .ok_or_else(|| fail(io::Error::from(io::ErrorKind::NotFound)))?;
    let cname = cstr(name).map_err(fail)?;
    let vname = cstr(&v.vname).map_err(fail)?;
    // What the file is now goes into the history first: a restore loses
    // nothing.
    let current = store.stat(&dir, &cname).map_err(fail)?;
    let mut kept_as = None;
    if let Some(cur) = &current {
        if !store.can_keep(&KeepBase::Root(VERSIONS_DIR.to_vec())) {
            return Err(format!(
                "{shown}: not restored: this store cannot keep the current file as a version"
            ));
        }
        let k = Keeper::new(KeepRule::Versions, now);
        let p = k
            .keep(&store, &dir, &cname, &rel, cur, true, 1)
            .map_err(|e| format!("{shown}: not restored: {}", cause(&e)))?;
        kept_as = Some(p);
    }
    // Put back everything a run keeps: mode, times, owner (as root) by the
    // commit, and every extended attribute and ACL the store can keep.
    let caps = store.xattr_caps();
    let xr = ferry_engine::xattr::XattrRun::new(ferry_engine::xattr::XattrSel::ALL, caps, caps);
    let moved = AtomicU64::new(0);
    let c = Copier {
        src: &store,
        dst: &store,
        fsync: true,
        bwlimit: None,
        moved: &moved,
        xattrs: xr.active(),
        delta: None,
        keep: None,
        mtime_step: ferry_engine::store::mtime_step(&store, &store),
        // A version the store kept of its own file: its mode as it was.
        special: None,
    };
    if v.meta.kind == Kind::Symlink {
        let target = store.read_link(&vdir, &vname).map_err(fail)?;
        store
            .create_symlink(&dir, &cname, &target, &v.meta)
            .map_err(fail)?;
        c.new_entry_xattrs(&vdir, &vname, &dir, &cname, &v.meta)
            .map_err(fail)?;
    } else {
        c.copy_file(&vdir, &vname, &dir, &cname, &rel, &v.meta, current.as_ref())
            .map_err(fail)?;
    }
    if let Some(n) = xr.note(&location(root, &rel)) {
        eprintln!("ferry: note: {n}");
    }
    let mut line = format!("restored {shown} from {from} (kept {} UTC)", utc(v.kept));
    if let Some(p) = kept_as {
        line.push_str(&format!(
            "; the file it replaced is kept as {}",
            location(root, &p)
        ));
    }
    println!("{line}");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_for_at() {
        let now = 1_795_624_423; // 2026-11-25 16:33:43 UTC
        let at = |s| parse_at(s, now).unwrap();
        assert_eq!(at("20261125-163343"), now);
        assert_eq!(at("2026-11-25T16:33:43Z"), now);
        assert_eq!(at("2026-11-25 16:33:43"), now);
        assert_eq!(at("2026-11-25 16:33"), now - 43);
        assert_eq!(at("2026-11-25"), now - (16 * 3600 + 33 * 60 + 43));
        assert_eq!(at("2h"), now - 7200);
        assert_eq!(at("3d"), now - 3 * 86_400);
        assert!(parse_at("yesterday", now).is_err());
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(1_795_624_423), "2026-11-25 16:33:43");
    }
}
