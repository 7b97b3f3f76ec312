//! Which directory a path is, by device and inode rather than by its text
//! (docs/CLI.md, "Overlapping locations"): a bind mount, a symlink or `..`
//! shows one directory under many names, and only its identity tells two
//! of them apart.
//!
//! [`chain`] gives a directory's identity and that of every directory
//! above it: above it by path (what `..` reaches, as a walk from elsewhere
//! sees it) and above it in its filesystem, which differs when the path
//! goes through a bind mount of a subdirectory (`mount --bind v/sub w`:
//! `w`'s parents by path are not `v`, but `v` holds `w`). The second comes
//! from `/proc/self/mountinfo`: another mount of the same filesystem that
//! shows the directory's filesystem parents. [`mounts_below`] lists the
//! mount points inside a directory, the places a walk of it can leave it.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A directory's identity: (device, inode).
pub type Id = (u64, u64);

/// The identity of the directory (or file) at `p`, symlinks followed;
/// `None` when it cannot be stat'ed (missing).
pub fn id_of(p: &Path) -> Option<Id> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone)]
struct Mount {
    /// `st_dev` of its filesystem (major:minor).
    dev: u64,
    /// The directory of its filesystem it shows (`/` for a whole mount).
    root: PathBuf,
    /// Where it is mounted.
    point: PathBuf,
}

/// `\040`-style escapes of mountinfo undone.
fn unescape(s: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let octal = s
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (s[i], octal) {
            let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// The mounts of this process's namespace, in mount order (a later one
/// at the same point covers an earlier one); empty where mountinfo
/// cannot be read.
fn mounts() -> Vec<Mount> {
    let Ok(text) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.split(|&c| c == b'\n')
        .filter_map(|line| {
            let f: Vec<&[u8]> = line.split(|&c| c == b' ').collect();
            if f.len() < 5 {
                return None;
            }
            let mm = std::str::from_utf8(f[2]).ok()?;
            let (ma, mi) = mm.split_once(':')?;
            let dev = rustix::fs::makedev(ma.parse().ok()?, mi.parse().ok()?);
            Some(Mount {
                dev,
                root: unescape(f[3]),
                point: unescape(f[4]),
            })
        })
        .collect()
}

/// The mount `p` (absolute, no symlinks) is in: the last one mounted on
/// the longest point above it.
fn mount_of<'m>(ms: &'m [Mount], p: &Path) -> Option<&'m Mount> {
    let mut best: Option<&Mount> = None;
    for m in ms {
        if p.starts_with(&m.point)
            && best.is_none_or(|b| m.point.as_os_str().len() >= b.point.as_os_str().len())
        {
            best = Some(m);
        }
    }
    best
}

/// `p`'s identity then that of each directory above it, each with a path
/// that shows it: first by path (`p` absolute, without symlinks: what
/// `canonicalize` gives; the parts that exist), then above it in its
/// filesystem where a bind mount hides them from its path.
pub fn chain(p: &Path) -> Vec<(Id, PathBuf)> {
    let mut out: Vec<(Id, PathBuf)> = Vec::new();
    for a in p.ancestors() {
        if let Some(id) = id_of(a) {
            if !out.iter().any(|(x, _)| *x == id) {
                out.push((id, a.to_path_buf()));
            }
        }
    }
    for (id, at) in fs_parents(p) {
        if !out.iter().any(|(x, _)| *x == id) {
            out.push((id, at));
        }
    }
    out
}

/// The directories above `p` in its own filesystem, each reached through
/// a mount that shows it (those no mount shows are left out).
pub fn fs_parents(p: &Path) -> Vec<(Id, PathBuf)> {
    let ms = mounts();
    let Some(m) = mount_of(&ms, p) else {
        return Vec::new();
    };
    let Ok(below) = p.strip_prefix(&m.point) else {
        return Vec::new();
    };
    let inside = m.root.join(below);
    let mut out = Vec::new();
    for a in inside.ancestors().skip(1) {
        // A mount of the same filesystem whose root is at or above `a`,
        // the most recent first.
        for m2 in ms.iter().rev().filter(|x| x.dev == m.dev) {
            let Ok(rest) = a.strip_prefix(&m2.root) else {
                continue;
            };
            let at = if rest.as_os_str().is_empty() {
                m2.point.clone()
            } else {
                m2.point.join(rest)
            };
            if let Ok(md) = std::fs::metadata(&at) {
                if md.dev() == m.dev && md.is_dir() {
                    out.push(((md.dev(), md.ino()), at));
                    break;
                }
            }
        }
    }
    out
}

/// The mount points strictly inside `p` (absolute, without symlinks).
pub fn mounts_below(p: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = mounts()
        .into_iter()
        .filter(|m| m.point != p && m.point.starts_with(p))
        .map(|m| m.point)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `p` made absolute and free of symlinks and `..` where it exists; the
/// rest (what does not exist yet) appended with `.` and `..` taken
/// lexically. Also the deepest part that exists (its identity chain is
/// that of `p`'s parents when `p` is missing).
pub fn resolve(p: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    use std::path::Component;
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    };
    let mut existing = PathBuf::from("/");
    let mut full = PathBuf::from("/");
    let mut missing = false;
    for c in abs.components() {
        match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir if missing => {
                full.pop();
            }
            _ if missing => full.push(c),
            _ => match existing.join(c).canonicalize() {
                Ok(x) => {
                    existing = x.clone();
                    full = x;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    missing = true;
                    full.push(c);
                }
                Err(e) => return Err(e),
            },
        }
    }
    Ok((full, existing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(b"/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape(b"/a\\134"), PathBuf::from("/a\\"));
        assert_eq!(unescape(b"/x\\04"), PathBuf::from("/x\\04"));
    }

    #[test]
    fn a_chain_starts_with_the_directory_and_ends_at_the_top() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().canonicalize().unwrap();
        std::fs::create_dir(p.join("d")).unwrap();
        let c = chain(&p.join("d"));
        assert_eq!(c[0].0, id_of(&p.join("d")).unwrap());
        assert_eq!(c[1].0, id_of(&p).unwrap());
        assert!(c
            .iter()
            .any(|(id, _)| *id == id_of(Path::new("/")).unwrap()));
        let (full, existing) = resolve(&p.join("d/x/../y")).unwrap();
        assert_eq!((full, existing), (p.join("d/y"), p.join("d")));
    }
}
