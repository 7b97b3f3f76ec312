//! Overlap of local locations by device and inode, never by path text
//! (docs/CLI.md, "Overlapping locations"): a bind mount, a symlink or `..`
//! shows one directory under another name. Checked before a run starts:
//! the roots (SRC and DST, A and B) with every directory above them (by
//! path and in their filesystem, see `ferry_local::ident`), the mounts
//! inside them, and every directory a run writes to besides its
//! destination (`--backup-dir`, `.ferry-versions`). During the run the
//! walk checks each directory it lists (`ferry_engine::walk::Aliases`).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_engine::keep::{KeepBase, KeepRule, Keeper, VERSIONS_DIR};
use ferry_local::ident::{self, Id};

use ferry_engine::class::cause;

use crate::Error;

const WHY: &str = "same device and inode: a bind mount or another path to it";

/// Refuse roots `src` and `dst` (named `sn`, `dn`; absolute, without
/// symlinks; `dst` may not exist yet) that are one directory, one inside
/// the other, or that hold a mount showing the other, or either's parent.
fn roots_(src: &Path, dst: &Path, (sn, dn): (&str, &str)) -> Result<(), String> {
    let (cs, cd) = (ident::chain(src), ident::chain(dst));
    let (sid, did) = (ident::id_of(src), ident::id_of(dst));
    if sid.is_some() && sid == did {
        return Err(format!(
            "{sn} {} and {dn} {} are the same directory ({WHY})",
            src.display(),
            dst.display()
        ));
    }
    for (inner, outer, n_in, n_out, id_out, chain) in
        [(dst, src, dn, sn, sid, &cd), (src, dst, sn, dn, did, &cs)]
    {
        if let Some((_, at)) = id_out.and_then(|o| chain.iter().find(|(id, _)| *id == o)) {
            return Err(format!(
                "{n_in} {} is inside {n_out} {}: {} is the same directory as {n_out} ({WHY})",
                inner.display(),
                outer.display(),
                at.display()
            ));
        }
    }
    // Mounts inside either tree that show a root, a directory above one,
    // or a directory inside the other root.
    for (root, n, other, on, oid) in [(src, sn, dst, dn, did), (dst, dn, src, sn, sid)] {
        if ident::id_of(root).is_none() {
            continue;
        }
        for m in ident::mounts_below(root) {
            let Some(mid) = ident::id_of(&m) else {
                continue;
            };
            if let Some((_, at)) = cs.iter().chain(cd.iter()).find(|(id, _)| *id == mid) {
                return Err(format!(
                    "{n} {}: {} inside it is the same directory as {} ({WHY}), which is or holds {sn} or {dn}",
                    root.display(),
                    m.display(),
                    at.display()
                ));
            }
            if let Some(o) = oid {
                if ident::fs_parents(&m).iter().any(|(id, _)| *id == o) {
                    return Err(format!(
                        "{n} {}: {} inside it is a mount of a directory inside {on} {} ({WHY})",
                        root.display(),
                        m.display(),
                        other.display()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The directory keeper `k` writes to for a local destination rooted at
/// `root` (`None`: beside each file, in the destination itself).
fn write_dir(k: &Keeper, root: &Path) -> Option<PathBuf> {
    let os = |b: &[u8]| Path::new(std::ffi::OsStr::from_bytes(b)).to_path_buf();
    match &k.rule {
        KeepRule::BackupDir {
            base: KeepBase::Root(r),
            ..
        } => Some(root.join(os(r))),
        KeepRule::BackupDir {
            base: KeepBase::Abs(p),
            ..
        } => Some(os(p)),
        KeepRule::Versions => Some(root.join(os(VERSIONS_DIR))),
        KeepRule::Suffix(_) => None,
    }
}

/// A directory resolved for the checks: its path (absolute, without
/// symlinks where it exists), its identity, the identities above it.
struct Resolved {
    path: PathBuf,
    id: Option<Id>,
    above: Vec<(Id, PathBuf)>,
}

fn resolve(p: &Path, what: &str) -> Result<Resolved, String> {
    let (path, existing) =
        ident::resolve(p).map_err(|e| format!("{what} {}: {}", p.display(), cause(&e)))?;
    let id = ident::id_of(&path).filter(|_| path == existing);
    let above = ident::chain(&existing)
        .into_iter()
        .filter(|(x, _)| Some(*x) != id)
        .collect();
    Ok(Resolved { path, id, above })
}

impl Resolved {
    /// `self` is `o` (by identity, or by path where either is missing).
    fn same(&self, o: &Resolved) -> bool {
        self.id.is_some() && self.id == o.id || self.path == o.path
    }
    /// `self` is inside `o`.
    fn inside(&self, o: &Resolved) -> bool {
        o.id.is_some_and(|x| self.above.iter().any(|(y, _)| *y == x))
            || (self.path != o.path && self.path.starts_with(&o.path))
    }
}

/// Check (and settle) where keeper `k` of flag `flag` writes, for the
/// local destination `own` (its name and root): never in, or around, a
/// location the run only reads (`others`: SRC, the other replica), never
/// the destination itself or around it; inside the destination only where
/// the run leaves it out, so a backup directory found inside it by
/// identity (`../d/bak`, a symlink) is made a path below it, which the
/// run leaves out. An error is a usage error (exit 2, nothing changed).
fn keep_dir_(
    k: &mut Keeper,
    flag: &str,
    own: (&str, &Path),
    others: &[(&str, &Path)],
) -> Result<(), String> {
    let (on, root) = own;
    let Some(typed) = write_dir(k, root) else {
        return Ok(());
    };
    let shown = typed.display().to_string();
    let dir = resolve(&typed, flag)?;
    for (n, o) in others {
        let o_r = resolve(o, n)?;
        let why = if dir.same(&o_r) {
            "is"
        } else if dir.inside(&o_r) {
            "is inside"
        } else if o_r.inside(&dir) {
            "holds"
        } else {
            continue;
        };
        return Err(format!(
            "{flag} {shown}: {why} {n} {} ({WHY}); {n} is never written: give a directory outside it",
            o.display()
        ));
    }
    let r = resolve(root, on)?;
    if dir.same(&r) || r.inside(&dir) {
        let why = if dir.same(&r) { "is" } else { "holds" };
        return Err(format!(
            "{flag} {shown}: {why} {on} {} itself ({WHY}): give another directory",
            root.display()
        ));
    }
    if !dir.inside(&r) {
        return Ok(());
    }
    // Inside the destination: its path below the root, by path or by the
    // identity of a directory on its path.
    let rel = dir.path.strip_prefix(&r.path).ok().or_else(|| {
        let rid = r.id?;
        dir.path
            .ancestors()
            .find(|a| ident::id_of(a) == Some(rid))
            .and_then(|a| dir.path.strip_prefix(a).ok())
    });
    let Some(rel) = rel.map(|p| p.as_os_str().as_bytes().to_vec()) else {
        return Err(format!(
            "{flag} {shown}: is inside {on} {} through another mount ({WHY}): give it as a path below {on}",
            root.display()
        ));
    };
    match &mut k.rule {
        KeepRule::Versions if rel == VERSIONS_DIR => Ok(()),
        KeepRule::BackupDir {
            base: KeepBase::Root(b),
            ..
        } if *b == rel => Ok(()),
        KeepRule::BackupDir {
            base: base @ KeepBase::Abs(_),
            ..
        } => {
            // Left out of the run, as a relative one is.
            *base = KeepBase::Root(rel);
            Ok(())
        }
        _ => Err(format!(
            "{flag} {shown}: leads to {} elsewhere inside {on} {} (a symlink), which the run would sync: give a directory of its own",
            dir.path.display(),
            root.display()
        )),
    }
}

/// One file copied (`src`, its full path) to `dst_dir`/`dst_name`: refuse a
/// keeper that would keep the old `dst_name` over SRC itself (`--backup-dir`
/// naming SRC's directory: SRC is never written).
fn keep_file_(k: &Keeper, dst_dir: &Path, dst_name: &[u8], src: &Path) -> Result<(), String> {
    let KeepRule::BackupDir { suffix, .. } = &k.rule else {
        return Ok(());
    };
    let Some(dir) = write_dir(k, dst_dir) else {
        return Ok(());
    };
    let mut name = dst_name.to_vec();
    name.extend_from_slice(suffix);
    let at = dir.join(std::ffi::OsStr::from_bytes(&name));
    let (kept, s) = (resolve(&at, "--backup-dir")?, resolve(src, "SRC")?);
    if kept.same(&s) {
        return Err(format!(
            "--backup-dir {}: the old DST would be kept at {}, which is SRC ({WHY}); SRC is never written: give another directory",
            dir.display(),
            at.display()
        ));
    }
    Ok(())
}

/// Refuse two keepers (of replicas rooted at `ra`, `rb`) that write to one
/// directory, or one inside the other: each side's kept files would
/// overwrite or hold the other's.
fn distinct_(ka: &Keeper, ra: &Path, kb: &Keeper, rb: &Path) -> Result<(), String> {
    let (Some(x), Some(y)) = (write_dir(ka, ra), write_dir(kb, rb)) else {
        return Ok(());
    };
    let (dx, dy) = (resolve(&x, "A")?, resolve(&y, "B")?);
    if dx.same(&dy) {
        return Err(format!(
            "--backup-dir: {} would be the backup directory of both A and B (their kept files would overwrite each other; {WHY}): give each its own with --backup-dir1 and --backup-dir2",
            x.display()
        ));
    }
    if dx.inside(&dy) || dy.inside(&dx) {
        return Err(format!(
            "--backup-dir: {} (A's) and {} (B's) are one inside the other ({WHY}): their kept files would mix: give each its own with --backup-dir1 and --backup-dir2",
            x.display(),
            y.display()
        ));
    }
    Ok(())
}

/// Refuse roots `src` and `dst` (named `sn`, `dn`; absolute, without
/// symlinks; `dst` may not exist yet) that are one directory, one inside
/// the other, or that hold a mount showing the other, or either's parent.
pub fn roots(src: &Path, dst: &Path, names: (&str, &str)) -> Result<(), Error> {
    roots_(src, dst, names).map_err(Error::Refused)
}

/// The directory keeper `k` writes to (`flag` names it), for the local
/// replica `own` (its name, its root), compared with `own` and `others`
/// by identity: see `keep_dir_`.
pub fn keep_dir(
    k: &mut Keeper,
    flag: &str,
    own: (&str, &Path),
    others: &[(&str, &Path)],
) -> Result<(), Error> {
    keep_dir_(k, flag, own, others).map_err(Error::Refused)
}

/// A one-file run's backup directory: see `keep_file_`.
pub fn keep_file(k: &Keeper, dst_dir: &Path, dst_name: &[u8], src: &Path) -> Result<(), Error> {
    keep_file_(k, dst_dir, dst_name, src).map_err(Error::Refused)
}

/// Two replicas' backup directories, never one: see `distinct_`.
pub fn distinct(ka: &Keeper, ra: &Path, kb: &Keeper, rb: &Path) -> Result<(), Error> {
    distinct_(ka, ra, kb, rb).map_err(Error::Refused)
}
