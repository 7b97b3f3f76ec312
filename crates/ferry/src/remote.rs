//! What SRC and DST mean (docs/CLI.md, "Arguments"), for any pair of
//! locations: each is parsed once ([`Location`]) and resolved to the root
//! of a store ([`Root`]) by the rules of its backend. Two local paths
//! follow the local rules (`args::resolve`); with an object store on
//! either side this asks the server: whether `s3://b/key` names one object
//! or a prefix, whether a prefix has any objects at all. Every refusal is
//! a usage error (exit 2).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_backends::{AnyStore, Location, Remote, Root, SshRoot};
use ferry_engine::{Kind, Meta};
use ferry_local::stat_path;
use ferry_s3::{S3Config, S3Store};

use crate::args::{parent_and_name, Job};
use crate::output::cause;

/// What SRC turned out to be.
enum Src {
    Tree(Root),
    /// One file or object: where it is, its name there, and the name a
    /// directory DST gives it (the name typed).
    One(Root, OsString, OsString),
}

/// The message for a location no backend serves yet.
fn unsupported(loc: &Location) -> String {
    loc.supported()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

/// The root of the store at `loc`, as typed (a local path is not
/// resolved further: each command has its rules for that).
pub fn root_of(loc: &Location, endpoint: Option<&str>) -> Result<Root, String> {
    match loc {
        Location::Local(p) => Ok(Root::Local(p.clone())),
        Location::S3(u) => Ok(Root::S3(Box::new(
            S3Config::from_url(u, endpoint).map_err(|e| e.to_string())?,
        ))),
        Location::Shell { text, host, path } => {
            loc.supported().map_err(|_| unsupported(loc))?;
            ferry_backends::shell_root(text, host, path)
        }
    }
}

/// The root of a `host:path` location and a session to ask about it
/// (this run's connection to the host, made here: SSH, or SFTP).
fn ssh_of(loc: &Location, text: &str) -> Result<(SshRoot, Remote), String> {
    let root = root_of(loc, None)?;
    let s = ferry_backends::remote(&root).map_err(|e| format!("{text}: {e}"))?;
    let (Root::Ssh(r) | Root::Sftp(r)) = root else {
        unreachable!("a shell location")
    };
    Ok((r, s))
}

/// A remote path's parent and last component (`dir/` is `dir`; an empty
/// parent is the remote home).
fn split_remote(path: &[u8]) -> (Vec<u8>, OsString) {
    let mut p = path;
    while p.len() > 1 && p.ends_with(b"/") {
        p = &p[..p.len() - 1];
    }
    match p.iter().rposition(|b| *b == b'/') {
        Some(0) => (b"/".to_vec(), OsStr::from_bytes(&p[1..]).to_owned()),
        Some(i) => (p[..i].to_vec(), OsStr::from_bytes(&p[i + 1..]).to_owned()),
        None => (Vec::new(), OsStr::from_bytes(p).to_owned()),
    }
}

/// Stat a remote path, following a final symlink; `what` (SRC, DST)
/// names it in errors.
fn ssh_stat(s: &Remote, path: &[u8], what: &str, text: &str) -> Result<Option<Meta>, String> {
    s.stat_path(path, true)
        .map_err(|e| format!("{what} {text}: {}", cause(&e)))
}

/// The remote parent of a DST to be created must be a directory.
fn ssh_parent(s: &Remote, parent: &[u8], text: &str) -> Result<(), String> {
    let name = if parent.is_empty() {
        "(home)".into()
    } else {
        String::from_utf8_lossy(parent)
    };
    match ssh_stat(s, parent, "DST", text)? {
        Some(m) if m.kind == Kind::Dir => Ok(()),
        Some(_) => Err(format!("DST {text}: parent {name}: not a directory")),
        None => Err(format!(
            "DST {text}: parent directory {name}: no such directory"
        )),
    }
}

/// Resolve SRC and DST of a copy or sync. `force`: a missing (objectless)
/// SRC prefix is taken as an empty tree instead of refused.
pub fn resolve(src: &Path, dst: &Path, endpoint: Option<&str>, force: bool) -> Result<Job, String> {
    let (sl, dl) = (
        Location::parse(src.as_os_str()),
        Location::parse(dst.as_os_str()),
    );
    sl.supported().map_err(|e| format!("SRC {e}"))?;
    dl.supported().map_err(|e| format!("DST {e}"))?;
    if sl.is_local() && dl.is_local() {
        return crate::args::resolve(src, dst);
    }
    let job = match resolve_src(src, &sl, endpoint, force)? {
        Src::Tree(s) => Job {
            src: s,
            dst: dst_tree(dst, &dl, endpoint)?,
            one: None,
        },
        Src::One(s, name, typed) => {
            let (d, dname) = dst_one(dst, &dl, &typed, endpoint)?;
            Job {
                src: s,
                dst: d,
                one: Some((cname(&name, "SRC")?, cname(&dname, "DST")?)),
            }
        }
    };
    check_overlap(&job)?;
    Ok(job)
}

/// A name as a C string; `what` names it in the error.
pub fn cname(n: &OsStr, what: &str) -> Result<CString, String> {
    CString::new(n.as_bytes()).map_err(|_| format!("{what}: name contains NUL"))
}

/// `cfg` rooted at the parent prefix of its key, and the key's last segment.
fn split_key(cfg: &S3Config) -> (Box<S3Config>, String) {
    let key = cfg.prefix.trim_end_matches('/');
    let (parent, name) = key.rsplit_once('/').unwrap_or(("", key));
    let mut c = cfg.clone();
    c.prefix = parent.to_string();
    (Box::new(c), name.to_string())
}

fn s3_error(what: &str, url: &str, e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::NotFound {
        // A listing answers 404 only for the bucket.
        format!("{what} {url}: no such bucket")
    } else {
        format!("{what} {url}: {}", cause(e))
    }
}

fn resolve_src(
    src: &Path,
    loc: &Location,
    endpoint: Option<&str>,
    force: bool,
) -> Result<Src, String> {
    if let Location::S3(u) = loc {
        let u = u.as_str();
        let cfg = S3Config::from_url(u, endpoint).map_err(|e| e.to_string())?;
        let store = S3Store::new(&cfg, 1).map_err(|e| e.to_string())?;
        // `s3://b/key/` (or the bucket) is always a prefix; `s3://b/key`
        // is the object `key` when there is one.
        let object = if u.ends_with('/') || cfg.prefix.is_empty() {
            None
        } else {
            store.root_object().map_err(|e| s3_error("SRC", u, &e))?
        };
        let prefixed = store
            .root_has_objects()
            .map_err(|e| s3_error("SRC", u, &e))?;
        if object.is_some() {
            let key = cfg.prefix.trim_end_matches('/');
            if prefixed {
                eprintln!(
                    "ferry: note: s3://{b}/{key} is both an object and a prefix (s3://{b}/{key}/...): copying the object (end SRC with / for the prefix)",
                    b = cfg.bucket
                );
            }
            let (parent, name) = split_key(&cfg);
            return Ok(Src::One(
                Root::S3(parent),
                OsString::from(&name),
                OsString::from(name),
            ));
        }
        if !prefixed && !cfg.prefix.is_empty() && !force {
            return Err(format!(
                "SRC {u}: no such prefix (no objects; --force to take it as empty)"
            ));
        }
        return Ok(Src::Tree(Root::S3(Box::new(cfg))));
    }
    if let Location::Shell { text, .. } = loc {
        let (r, s) = ssh_of(loc, text)?;
        return match ssh_stat(&s, &r.path, "SRC", text)? {
            None => Err(format!("SRC {text}: no such file or directory")),
            Some(m) if m.kind == Kind::Dir => Ok(Src::Tree(s.root(r))),
            Some(m) if m.kind == Kind::File => {
                let (parent, name) = split_remote(&r.path);
                Ok(Src::One(s.root(r.at(parent)), name.clone(), name))
            }
            Some(_) => Err(format!("SRC {text}: not a regular file or directory")),
        };
    }
    let m = stat_path(src, true).map_err(|e| format!("SRC {}: {}", src.display(), cause(&e)))?;
    let abs = src
        .canonicalize()
        .map_err(|e| format!("SRC {}: {}", src.display(), cause(&e)))?;
    match m.kind {
        Kind::Dir => Ok(Src::Tree(Root::Local(abs))),
        Kind::File => {
            // A symlink is followed: the file it names is read, under the
            // name typed.
            let typed = src.file_name().unwrap_or_default().to_owned();
            let name = abs.file_name().unwrap_or_default().to_owned();
            let dir = abs
                .parent()
                .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
            Ok(Src::One(Root::Local(dir), name, typed))
        }
        _ => Err(format!(
            "SRC {}: not a regular file or directory",
            src.display()
        )),
    }
}

/// DST of a tree: a prefix, or a local directory (created if missing).
fn dst_tree(dst: &Path, loc: &Location, endpoint: Option<&str>) -> Result<Root, String> {
    if let Location::S3(u) = loc {
        return Ok(Root::S3(Box::new(
            S3Config::from_url(u, endpoint).map_err(|e| e.to_string())?,
        )));
    }
    if let Location::Shell { text, .. } = loc {
        let (r, s) = ssh_of(loc, text)?;
        return match ssh_stat(&s, &r.path, "DST", text)? {
            Some(m) if m.kind == Kind::Dir => Ok(s.root(r)),
            Some(_) => Err(format!(
                "DST {text}: exists and is not a directory (SRC is a directory tree)"
            )),
            None => {
                ssh_parent(&s, &split_remote(&r.path).0, text)?;
                Ok(s.root(r))
            }
        };
    }
    match stat_path(dst, true) {
        Ok(m) if m.kind != Kind::Dir => Err(format!(
            "DST {}: exists and is not a directory (SRC is a directory tree)",
            dst.display()
        )),
        Ok(_) => {
            Ok(Root::Local(dst.canonicalize().map_err(|e| {
                format!("DST {}: {}", dst.display(), cause(&e))
            })?))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let (parent, name) = parent_and_name("DST", dst)?;
            Ok(Root::Local(parent.join(name)))
        }
        Err(e) => Err(format!("DST {}: {}", dst.display(), cause(&e))),
    }
}

/// DST of one file or object `name`: a file path or key, or a directory
/// (prefix) to put it in, under `name`.
fn dst_one(
    dst: &Path,
    loc: &Location,
    name: &OsStr,
    endpoint: Option<&str>,
) -> Result<(Root, OsString), String> {
    let into = dst.as_os_str().as_bytes().ends_with(b"/");
    if let Location::S3(u) = loc {
        let u = u.as_str();
        let cfg = S3Config::from_url(u, endpoint).map_err(|e| e.to_string())?;
        let into = into || cfg.prefix.is_empty() || {
            // A key that is a prefix already is a directory: into it, not
            // beside it (an object and a prefix of one name cannot both be
            // a file tree's).
            let store = S3Store::new(&cfg, 1).map_err(|e| e.to_string())?;
            store
                .root_has_objects()
                .map_err(|e| s3_error("DST", u, &e))?
        };
        if into {
            return Ok((Root::S3(Box::new(cfg)), name.to_owned()));
        }
        let (parent, key) = split_key(&cfg);
        return Ok((Root::S3(parent), OsString::from(key)));
    }
    if let Location::Shell { text, .. } = loc {
        let (r, s) = ssh_of(loc, text)?;
        let (parent, file) = split_remote(&r.path);
        return match ssh_stat(&s, &r.path, "DST", text)? {
            Some(m) if m.kind == Kind::Dir => Ok((s.root(r), name.to_owned())),
            Some(m) if m.kind == Kind::File => Ok((s.root(r.at(parent)), file)),
            Some(_) => Err(format!("DST {text}: not a regular file or directory")),
            None if into => Err(format!(
                "DST {text}: no such directory (create it, or name the target file)"
            )),
            None => {
                ssh_parent(&s, &parent, text)?;
                Ok((s.root(r.at(parent)), file))
            }
        };
    }
    match stat_path(dst, true) {
        Ok(m) if m.kind == Kind::Dir => {
            let abs = dst
                .canonicalize()
                .map_err(|e| format!("DST {}: {}", dst.display(), cause(&e)))?;
            Ok((Root::Local(abs), name.to_owned()))
        }
        Ok(m) if m.kind != Kind::File => Err(format!(
            "DST {}: not a regular file or directory",
            dst.display()
        )),
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(format!("DST {}: {}", dst.display(), cause(&e)))
        }
        _ if into => Err(format!(
            "DST {}: no such directory (create it, or name the target file)",
            dst.display()
        )),
        _ => {
            let (parent, file) = parent_and_name("DST", dst)?;
            Ok((Root::Local(parent), file))
        }
    }
}

/// Refuse S3 trees that overlap, and a copy of an object onto itself;
/// remote trees on one host whose paths, as typed, overlap.
fn check_overlap(job: &Job) -> Result<(), String> {
    if let (Root::Ssh(a) | Root::Sftp(a), Root::Ssh(b) | Root::Sftp(b)) = (&job.src, &job.dst) {
        let (pa, pb) = (job.src.id(), job.dst.id());
        let inside = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}/"));
        if a.host == b.host
            && a.port == b.port
            && job.one.is_none()
            && (inside(&pa, &pb) || inside(&pb, &pa))
        {
            return Err(format!("SRC {pa} and DST {pb} overlap"));
        }
        if a.host == b.host && a.port == b.port && job.one.is_none() {
            // Another path to one directory there (a symlink, `..`): by
            // device and inode, as the server answers.
            let s = ferry_backends::remote(&job.src).map_err(|e| format!("SRC {pa}: {e}"))?;
            return remote_overlap(&s, (&a.path, &pa), (&b.path, &pb));
        }
        return Ok(());
    }
    let (Root::S3(a), Root::S3(b)) = (&job.src, &job.dst) else {
        return Ok(());
    };
    let (pa, pb) = (
        a.prefix.trim_end_matches('/'),
        b.prefix.trim_end_matches('/'),
    );
    if let Some((sn, dn)) = &job.one {
        if a.bucket == b.bucket && pa == pb && sn == dn {
            let key = [pa, &sn.to_string_lossy()].join("/");
            return Err(format!(
                "SRC and DST are the same object: s3://{}/{}",
                a.bucket,
                key.trim_start_matches('/')
            ));
        }
        return Ok(());
    }
    let inside = |x: &str, y: &str| y.is_empty() || x == y || x.starts_with(&format!("{y}/"));
    if a.bucket == b.bucket && (inside(pa, pb) || inside(pb, pa)) {
        return Err(format!(
            "SRC s3://{}/{pa} and DST s3://{}/{pb} overlap",
            a.bucket, b.bucket
        ));
    }
    Ok(())
}

/// (device, inode) of a remote directory and of each directory above it
/// (`p/..`, `p/../..`, ...: the server resolves symlinks on the way).
fn remote_chain(s: &Remote, p: &[u8]) -> Vec<(u64, u64)> {
    let mut at = if p.is_empty() {
        b".".to_vec()
    } else {
        p.to_vec()
    };
    let mut out: Vec<(u64, u64)> = Vec::new();
    for _ in 0..256 {
        let id = match s.stat_path(&at, true) {
            Ok(Some(m)) if m.ino != 0 => (m.dev, m.ino),
            _ => break,
        };
        if out.contains(&id) {
            break;
        }
        out.push(id);
        at.extend_from_slice(b"/..");
    }
    out
}

/// Refuse remote roots on one server (`path`, shown as `id`) that are the
/// same directory or one inside the other, by identity.
fn remote_overlap(s: &Remote, src: (&[u8], &str), dst: (&[u8], &str)) -> Result<(), String> {
    let (cs, cd) = (remote_chain(s, src.0), remote_chain(s, dst.0));
    let why = "same device and inode: another path to it";
    match (cs.first(), cd.first()) {
        (Some(x), Some(y)) if x == y => Err(format!(
            "SRC {} and DST {} are the same directory ({why})",
            src.1, dst.1
        )),
        (Some(x), _) if cd.contains(x) => {
            Err(format!("DST {} is inside SRC {} ({why})", dst.1, src.1))
        }
        (_, Some(y)) if cs.contains(y) => {
            Err(format!("SRC {} is inside DST {} ({why})", src.1, dst.1))
        }
        _ => Ok(()),
    }
}

/// `ls`: the one entry `loc` names when it is not a tree (a local file, an
/// object `s3://b/key` with no object under `key/`), `None` for a tree.
/// With neither object nor objects under an `s3://` key the tree is empty:
/// S3 cannot tell an empty tree from a missing one.
pub fn ls_entry(loc: &Location, store: &AnyStore) -> io::Result<Option<Meta>> {
    match (loc, store) {
        (Location::S3(url), AnyStore::S3(s)) => {
            let keyed = !url.ends_with('/') && parse_key(url).is_some_and(|k| !k.is_empty());
            if keyed && !s.root_has_objects()? {
                return s.root_object();
            }
            Ok(None)
        }
        (Location::Shell { path, .. }, AnyStore::Ssh(s)) => {
            let meta = s
                .stat_path(path.as_bytes(), true)?
                .ok_or_else(|| io::Error::from_raw_os_error(2))?;
            Ok((meta.kind != Kind::Dir).then_some(meta))
        }
        (Location::Shell { path, .. }, AnyStore::Sftp(s)) => {
            let meta = s
                .stat_path(path.as_bytes(), true)?
                .ok_or_else(|| io::Error::from_raw_os_error(2))?;
            Ok((meta.kind != Kind::Dir).then_some(meta))
        }
        (Location::Local(p), AnyStore::Local(_)) => {
            let meta = stat_path(p, true)?;
            Ok((meta.kind != Kind::Dir).then_some(meta))
        }
        _ => Ok(None),
    }
}

/// The key part of an `s3://bucket/key` URL.
fn parse_key(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("s3://")?;
    Some(
        rest.split_once('/')
            .map_or("", |(_, k)| k.trim_start_matches('/')),
    )
}
