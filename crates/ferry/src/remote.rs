//! What SRC and DST mean when one of them is `s3://` (docs/CLI.md,
//! "Arguments"). Unlike local paths this asks the server: whether
//! `s3://b/key` names one object or a prefix, whether a prefix has any
//! objects at all. Every refusal is a usage error (exit 2).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_engine::local::stat_path;
use ferry_engine::Kind;
use ferry_s3::{S3Config, S3Store};

use crate::args::{is_s3, parent_and_name, Loc};
use crate::output::cause;

/// A copy or sync with an S3 side, resolved.
#[derive(Debug)]
pub struct RemoteJob {
    /// The source tree, or the directory (prefix) holding the one file.
    pub src: Loc,
    /// The destination tree, or the directory (prefix) to hold the file.
    pub dst: Loc,
    /// One file or object: its name in `src` and its name in `dst`.
    pub one: Option<(CString, CString)>,
}

/// What SRC turned out to be.
enum Src {
    Tree(Loc),
    /// One file or object: where it is, its name there, and the name a
    /// directory DST gives it (the name typed).
    One(Loc, OsString, OsString),
}

/// Resolve SRC and DST of a copy or sync where one of them (or both) is
/// `s3://`. `force`: a missing (objectless) SRC prefix is taken as an empty
/// tree instead of refused.
pub fn resolve(
    src: &Path,
    dst: &Path,
    endpoint: Option<&str>,
    force: bool,
) -> Result<RemoteJob, String> {
    let job = match resolve_src(src, endpoint, force)? {
        Src::Tree(s) => RemoteJob {
            src: s,
            dst: dst_tree(dst, endpoint)?,
            one: None,
        },
        Src::One(s, name, typed) => {
            let (d, dname) = dst_one(dst, &typed, endpoint)?;
            let c = |n: &OsStr, what: &str| {
                CString::new(n.as_bytes()).map_err(|_| format!("{what}: name contains NUL"))
            };
            RemoteJob {
                src: s,
                dst: d,
                one: Some((c(&name, "SRC")?, c(&dname, "DST")?)),
            }
        }
    };
    check_overlap(&job)?;
    Ok(job)
}

/// The text of an `s3://` argument.
fn url(p: &Path) -> &str {
    p.to_str().expect("s3:// URLs are UTF-8 (checked by is_s3)")
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

fn resolve_src(src: &Path, endpoint: Option<&str>, force: bool) -> Result<Src, String> {
    if is_s3(src) {
        let u = url(src);
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
                Loc::S3(parent),
                OsString::from(&name),
                OsString::from(name),
            ));
        }
        if !prefixed && !cfg.prefix.is_empty() && !force {
            return Err(format!(
                "SRC {u}: no such prefix (no objects; --force to take it as empty)"
            ));
        }
        return Ok(Src::Tree(Loc::S3(Box::new(cfg))));
    }
    let m = stat_path(src, true).map_err(|e| format!("SRC {}: {}", src.display(), cause(&e)))?;
    let abs = src
        .canonicalize()
        .map_err(|e| format!("SRC {}: {}", src.display(), cause(&e)))?;
    match m.kind {
        Kind::Dir => Ok(Src::Tree(Loc::Local(abs))),
        Kind::File => {
            // A symlink is followed: the file it names is read, under the
            // name typed.
            let typed = src.file_name().unwrap_or_default().to_owned();
            let name = abs.file_name().unwrap_or_default().to_owned();
            let dir = abs
                .parent()
                .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
            Ok(Src::One(Loc::Local(dir), name, typed))
        }
        _ => Err(format!(
            "SRC {}: not a regular file or directory",
            src.display()
        )),
    }
}

/// DST of a tree: a prefix, or a local directory (created if missing).
fn dst_tree(dst: &Path, endpoint: Option<&str>) -> Result<Loc, String> {
    if is_s3(dst) {
        return Ok(Loc::S3(Box::new(
            S3Config::from_url(url(dst), endpoint).map_err(|e| e.to_string())?,
        )));
    }
    match stat_path(dst, true) {
        Ok(m) if m.kind != Kind::Dir => Err(format!(
            "DST {}: exists and is not a directory (SRC is a directory tree)",
            dst.display()
        )),
        Ok(_) => {
            Ok(Loc::Local(dst.canonicalize().map_err(|e| {
                format!("DST {}: {}", dst.display(), cause(&e))
            })?))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let (parent, name) = parent_and_name("DST", dst)?;
            Ok(Loc::Local(parent.join(name)))
        }
        Err(e) => Err(format!("DST {}: {}", dst.display(), cause(&e))),
    }
}

/// DST of one file or object `name`: a file path or key, or a directory
/// (prefix) to put it in, under `name`.
fn dst_one(dst: &Path, name: &OsStr, endpoint: Option<&str>) -> Result<(Loc, OsString), String> {
    let into = dst.as_os_str().as_bytes().ends_with(b"/");
    if is_s3(dst) {
        let u = url(dst);
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
            return Ok((Loc::S3(Box::new(cfg)), name.to_owned()));
        }
        let (parent, key) = split_key(&cfg);
        return Ok((Loc::S3(parent), OsString::from(key)));
    }
    match stat_path(dst, true) {
        Ok(m) if m.kind == Kind::Dir => {
            let abs = dst
                .canonicalize()
                .map_err(|e| format!("DST {}: {}", dst.display(), cause(&e)))?;
            Ok((Loc::Local(abs), name.to_owned()))
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
            Ok((Loc::Local(parent), file))
        }
    }
}

/// Refuse S3 trees that overlap, and a copy of an object onto itself.
fn check_overlap(job: &RemoteJob) -> Result<(), String> {
    let (Loc::S3(a), Loc::S3(b)) = (&job.src, &job.dst) else {
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
