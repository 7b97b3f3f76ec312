//! The local backend: a directory on this machine.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_engine::class::cause;
use ferry_engine::keep::VERSIONS_DIR;
use ferry_engine::{Kind, Meta};
use ferry_local::{stat_path, LocalStore};

use crate::resolve::cname;
use crate::{
    identity, AnyStore, Backend, Backends, Error, Job, Jobs, Location, Opts, Root, Src, Watch,
};

/// The local backend.
pub struct Local;

fn refused(msg: String) -> Error {
    Error::Refused(msg)
}

/// `what p: cause`.
fn at(what: &str, p: &Path, e: &io::Error) -> Error {
    refused(format!("{what} {}: {}", p.display(), cause(e)))
}

impl Backend for Local {
    type Root = PathBuf;

    const SCHEMES: &'static [&'static str] = &[];

    fn parse(_: &Backends, loc: &Location) -> Option<Result<PathBuf, Error>> {
        loc.local_path().map(|p| Ok(p.to_path_buf()))
    }

    fn timeout(_: Option<std::time::Duration>) -> Option<std::time::Duration> {
        None
    }

    fn id(r: &PathBuf) -> String {
        r.to_string_lossy().into_owned()
    }

    fn local_path(r: &PathBuf) -> Option<&Path> {
        Some(r)
    }

    fn location(r: &PathBuf, _: &[u8]) -> Vec<u8> {
        r.as_os_str().as_bytes().to_vec()
    }

    fn open(reg: &Backends, r: &PathBuf, o: &Opts) -> Result<AnyStore, Error> {
        let s = LocalStore::new(r, o.jobs).read_only(reg.settings().read_only);
        Ok(AnyStore::Local(s))
    }

    fn pair(
        _: &Backends,
        (src, _): (&Path, &PathBuf),
        (dst, _): (&Path, &PathBuf),
    ) -> Option<Result<Job, Error>> {
        Some(resolve(src, dst))
    }

    fn src(_: &Backends, src: &Path, _: PathBuf, _: bool) -> Result<Src, Error> {
        let m = stat_path(src, true).map_err(|e| at("SRC", src, &e))?;
        let abs = src.canonicalize().map_err(|e| at("SRC", src, &e))?;
        match m.kind {
            Kind::Dir => Ok(Src::Tree(Root::Local(abs))),
            Kind::File => {
                // A symlink is followed: the file it names is read, under
                // the name typed.
                let typed = src.file_name().unwrap_or_default().to_owned();
                let name = abs.file_name().unwrap_or_default().to_owned();
                let dir = abs
                    .parent()
                    .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
                Ok(Src::One(Root::Local(dir), name, typed))
            }
            _ => Err(refused(format!(
                "SRC {}: not a regular file or directory",
                src.display()
            ))),
        }
    }

    fn dst_tree(_: &Backends, dst: &Path, _: PathBuf) -> Result<Root, Error> {
        match stat_path(dst, true) {
            Ok(m) if m.kind != Kind::Dir => Err(refused(format!(
                "DST {}: exists and is not a directory (SRC is a directory tree)",
                dst.display()
            ))),
            Ok(_) => Ok(Root::Local(
                dst.canonicalize().map_err(|e| at("DST", dst, &e))?,
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (parent, name) = parent_and_name("DST", dst)?;
                Ok(Root::Local(parent.join(name)))
            }
            Err(e) => Err(at("DST", dst, &e)),
        }
    }

    fn dst_one(
        _: &Backends,
        dst: &Path,
        _: PathBuf,
        name: &OsStr,
    ) -> Result<(Root, OsString), Error> {
        let into = dst.as_os_str().as_bytes().ends_with(b"/");
        match stat_path(dst, true) {
            Ok(m) if m.kind == Kind::Dir => {
                let abs = dst.canonicalize().map_err(|e| at("DST", dst, &e))?;
                Ok((Root::Local(abs), name.to_owned()))
            }
            Ok(m) if m.kind != Kind::File => Err(refused(format!(
                "DST {}: not a regular file or directory",
                dst.display()
            ))),
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(at("DST", dst, &e)),
            _ if into => Err(refused(format!(
                "DST {}: no such directory (create it, or name the target file)",
                dst.display()
            ))),
            _ => {
                let (parent, file) = parent_and_name("DST", dst)?;
                Ok((Root::Local(parent), file))
            }
        }
    }

    fn replica(p: &Path, _: PathBuf, what: &str) -> Result<Root, Error> {
        let abs = match stat_path(p, true) {
            Ok(m) if m.kind != Kind::Dir => {
                return Err(refused(format!("{what} {}: not a directory", p.display())))
            }
            Ok(_) => p.canonicalize().map_err(|e| at(what, p, &e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (parent, name) = parent_and_name(what, p)?;
                parent.join(name)
            }
            Err(e) => return Err(at(what, p, &e)),
        };
        Ok(Root::Local(abs))
    }

    fn overlap(_: &Backends, job: &Job, src: &PathBuf, dst: &PathBuf) -> Result<(), Error> {
        // (Local pairs are resolved by `pair`, which checks them; this
        // holds for any local pair made otherwise.)
        if job.one.is_some() {
            return Ok(());
        }
        identity::roots(src, dst, ("SRC", "DST"))
    }

    fn same_replicas(a: &PathBuf, b: &PathBuf) -> Result<(), Error> {
        identity::roots(a, b, ("A", "B"))
    }

    fn jobs(_: &PathBuf) -> Jobs {
        Jobs::Cores
    }

    fn ls_entry(loc: &Location, _: &AnyStore) -> io::Result<Option<Meta>> {
        let Some(p) = loc.local_path() else {
            return Ok(None);
        };
        let meta = stat_path(p, true)?;
        Ok((meta.kind != Kind::Dir).then_some(meta))
    }

    fn keeps(_: &AnyStore) -> &'static str {
        "this backend keeps no such attributes"
    }

    fn watch(r: &PathBuf, _: &AnyStore, _: std::time::Duration) -> Watch {
        Watch::Local(r.clone())
    }

    fn refresh(_: &AnyStore) -> Result<bool, Error> {
        Ok(false)
    }

    fn find_replica(
        _: &Backends,
        p: &PathBuf,
        typed: &str,
    ) -> Result<Option<(Root, Vec<u8>)>, Error> {
        let abs = absolute(p).map_err(|e| refused(format!("{typed}: {}", cause(&e))))?;
        for c in abs.ancestors() {
            let v = c.join(OsStr::from_bytes(VERSIONS_DIR));
            if std::fs::symlink_metadata(&v).is_ok_and(|m| m.is_dir()) {
                let rel = abs.strip_prefix(c).unwrap_or(Path::new(""));
                return Ok(Some((
                    Root::Local(c.to_path_buf()),
                    rel.as_os_str().as_bytes().to_vec(),
                )));
            }
        }
        Ok(None)
    }
}

/// A local path made absolute, its directories resolved (as many as
/// exist), its last component kept as typed (a symlink is not followed).
pub fn absolute(p: &Path) -> io::Result<PathBuf> {
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

/// The canonical parent directory of a path that does not exist yet (the
/// parent must) and its last component; `what` names the path in errors.
pub fn parent_and_name(what: &str, p: &Path) -> Result<(PathBuf, OsString), Error> {
    let name = p
        .file_name()
        .ok_or_else(|| refused(format!("{what} {}: not a valid target name", p.display())))?;
    let parent = match p.parent() {
        Some(q) if !q.as_os_str().is_empty() => q,
        _ => Path::new("."),
    };
    let abs = parent.canonicalize().map_err(|e| {
        refused(format!(
            "{what} {}: parent directory {}: {}",
            p.display(),
            parent.display(),
            cause(&e)
        ))
    })?;
    Ok((abs, name.to_owned()))
}

/// Decide what a local SRC and DST mean, or refuse (see docs/CLI.md).
fn resolve(src: &Path, dst: &Path) -> Result<Job, Error> {
    let sm = stat_path(src, true).map_err(|e| at("SRC", src, &e))?;
    let src_abs = src.canonicalize().map_err(|e| at("SRC", src, &e))?;
    let dm = match stat_path(dst, true) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(at("DST", dst, &e)),
    };
    let dst_abs = match dm {
        Some(_) => dst.canonicalize().map_err(|e| at("DST", dst, &e))?,
        None => {
            let (parent, name) = parent_and_name("DST", dst)?;
            parent.join(name)
        }
    };
    if src_abs == dst_abs {
        return Err(refused(format!(
            "SRC and DST are the same: {}",
            src_abs.display()
        )));
    }
    match sm.kind {
        Kind::Dir => tree_pair(dst, src_abs, dst_abs, dm),
        Kind::File => {
            if let Some(m) = dm {
                if m.kind == Kind::Dir {
                    return Err(refused(format!(
                        "DST {}: is a directory but SRC is a file; give the target file path (e.g. {}/{})",
                        dst.display(),
                        dst.display(),
                        src_abs.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
                    )));
                }
            }
            let split = |p: &Path| -> (PathBuf, OsString) {
                (
                    p.parent()
                        .map(Path::to_path_buf)
                        .unwrap_or_else(|| PathBuf::from("/")),
                    p.file_name().unwrap_or_default().to_owned(),
                )
            };
            let (src_dir, src_name) = split(&src_abs);
            let (dst_dir, dst_name) = split(&dst_abs);
            let names = (cname(&src_name, "SRC")?, cname(&dst_name, "DST")?);
            Ok(Job {
                src: Root::Local(src_dir),
                dst: Root::Local(dst_dir),
                one: Some(names),
            })
        }
        _ => Err(refused(format!(
            "SRC {}: not a regular file or directory",
            src.display()
        ))),
    }
}

/// Two local trees: refused when one is inside the other (by path, then
/// by identity) or DST is not a directory.
fn tree_pair(
    dst: &Path,
    src_abs: PathBuf,
    dst_abs: PathBuf,
    dm: Option<Meta>,
) -> Result<Job, Error> {
    if dst_abs.starts_with(&src_abs) {
        return Err(refused(format!(
            "DST {} is inside SRC {}",
            dst_abs.display(),
            src_abs.display()
        )));
    }
    if src_abs.starts_with(&dst_abs) {
        return Err(refused(format!(
            "SRC {} is inside DST {}",
            src_abs.display(),
            dst_abs.display()
        )));
    }
    identity::roots(&src_abs, &dst_abs, ("SRC", "DST"))?;
    if let Some(m) = dm {
        if m.kind != Kind::Dir {
            return Err(refused(format!(
                "DST {}: exists and is not a directory (SRC is a directory)",
                dst.display()
            )));
        }
    }
    Ok(Job {
        src: Root::Local(src_abs),
        dst: Root::Local(dst_abs),
        one: None,
    })
}
