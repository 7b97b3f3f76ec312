//! Keeping an entry a run replaces or removes (`--backup-dir`, `--suffix`,
//! `--versions`; see `ferry_engine::keep`) on a local filesystem.
//!
//! An entry about to be replaced is hard-linked at its kept path: the old
//! inode lives on there, and the commit's rename replaces the name
//! atomically, so the name never goes missing (one `linkat` per replaced
//! file). An entry about to be removed is renamed there. Where neither can
//! be done (another filesystem, one without hard links) the entry is
//! copied through a temporary with all a hard link would keep (data with
//! its holes, owner, mode, extended attributes and ACLs, times: see
//! [`copy`]); a removed one is then unlinked.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, RenameFlags, Timespec, Timestamps};
use rustix::io::Errno;

use ferry_engine::entry::Kind;
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::xattr::{XattrSel, Xattrs};

use crate::{sparse, xattr};

/// The kept path of `to`, for a store rooted at `root`.
pub(crate) fn target(root: &Path, to: &KeepTo<'_>) -> PathBuf {
    let base = match to.base {
        KeepBase::Root(p) if p.is_empty() => root.to_path_buf(),
        KeepBase::Root(p) => root.join(std::ffi::OsStr::from_bytes(p)),
        KeepBase::Abs(p) => PathBuf::from(std::ffi::OsStr::from_bytes(p)),
    };
    base.join(std::ffi::OsStr::from_bytes(to.path))
}

/// Keep `name` of `dir` at `to` (see the module's comment).
pub(crate) fn keep(
    root: &Path,
    dir: BorrowedFd<'_>,
    name: &CStr,
    to: &KeepTo<'_>,
) -> io::Result<()> {
    let t = target(root, to);
    let tc = CString::new(t.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the kept path"))?;
    // An entry is kept only while it is what the run listed (one `statx`);
    // one replaced is checked again by the commit that replaces it (its
    // change time aside: the link made here moved it, see `Planned::holds`).
    let _one = match &to.planned {
        Some(p) => crate::local::check_planned(dir, name, p)?,
        None => None,
    };
    let mut made_parents = false;
    loop {
        let res = if to.replacing {
            link(dir, name, &tc, &t, to.overwrite)
        } else {
            rename(dir, name, rfs::CWD, &tc, to.overwrite)
        };
        match res {
            Ok(()) => return Ok(()),
            Err(Errno::NOENT) if !made_parents => {
                // The first entry kept in that directory: make its parents
                // (only now, so an unreplaced tree costs no mkdir).
                if let Some(p) = t.parent() {
                    std::fs::create_dir_all(p)?;
                }
                made_parents = true;
            }
            Err(Errno::EXIST) if !to.overwrite => {
                return Err(io::Error::from(io::ErrorKind::AlreadyExists))
            }
            // Another filesystem, hard links not allowed there, or a
            // filesystem without RENAME_NOREPLACE: copy.
            Err(
                Errno::XDEV
                | Errno::PERM
                | Errno::MLINK
                | Errno::NOTSUP
                | Errno::INVAL
                | Errno::NOSYS,
            ) => {
                copy(dir, name, &t, to.overwrite)?;
                if !to.replacing {
                    rfs::unlinkat(dir, name, AtFlags::empty())?;
                }
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Rename `from` of `fdir` to `to` of `tdir`; unless `overwrite`, never
/// over an existing entry (`EXIST`). A filesystem without
/// `RENAME_NOREPLACE` (NFS, FUSE: `EINVAL`) gets a hard link (which never
/// replaces) and an unlink of the old name; one without hard links either
/// a check of the name just before the rename.
fn rename(
    fdir: BorrowedFd<'_>,
    from: &CStr,
    tdir: BorrowedFd<'_>,
    to: &CStr,
    overwrite: bool,
) -> Result<(), Errno> {
    if overwrite {
        return rfs::renameat(fdir, from, tdir, to);
    }
    match rfs::renameat_with(fdir, from, tdir, to, RenameFlags::NOREPLACE) {
        Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
            match rfs::linkat(fdir, from, tdir, to, AtFlags::empty()) {
                Ok(()) => rfs::unlinkat(fdir, from, AtFlags::empty()),
                Err(Errno::PERM | Errno::OPNOTSUPP | Errno::MLINK) => {
                    match rfs::statat(tdir, to, AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(_) => Err(Errno::EXIST),
                        Err(Errno::NOENT) => rfs::renameat(fdir, from, tdir, to),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        }
        r => r,
    }
}

/// Hard-link `name` at `t`; an entry there is replaced when `overwrite`
/// (atomically: linked beside it, then renamed over it).
fn link(
    dir: BorrowedFd<'_>,
    name: &CStr,
    tc: &CStr,
    t: &Path,
    overwrite: bool,
) -> Result<(), Errno> {
    match rfs::linkat(dir, name, rfs::CWD, tc, AtFlags::empty()) {
        Err(Errno::EXIST) if overwrite => {
            let tmp = temp_beside(t);
            rfs::linkat(dir, name, rfs::CWD, &tmp, AtFlags::empty())?;
            rfs::renameat(rfs::CWD, &tmp, rfs::CWD, tc).inspect_err(|_| {
                let _ = rfs::unlinkat(rfs::CWD, &tmp, AtFlags::empty());
            })
        }
        r => r,
    }
}

fn temp_beside(t: &Path) -> CString {
    let id = std::process::id() as u64
        ^ (t.as_os_str().len() as u64) << 32
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
    let n = ferry_engine::store::temp_name(id);
    let n = &n[..ferry_engine::store::RESERVED_LEN];
    let p = t.with_file_name(std::ffi::OsStr::from_bytes(n));
    CString::new(p.as_os_str().as_bytes()).expect("no NUL")
}

/// Copy `name` (a file, symlink, fifo or device) to `t` through a
/// temporary beside `t`, as faithful as the hard link it stands for: a
/// file's data with its holes (`sparse.rs`: a sparse file stays sparse),
/// as root its owner, its mode, its extended attributes and ACLs (all this
/// process may read and write, whatever `-X`/`-A` say: a kept entry is the
/// entry as it was; a target filesystem that keeps none at all gets none),
/// and its times.
fn copy(dir: BorrowedFd<'_>, name: &CStr, t: &Path, overwrite: bool) -> io::Result<()> {
    let st = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let tc = CString::new(t.as_os_str().as_bytes()).expect("no NUL");
    // A taken name costs one stat, not a copy (the rename below still
    // never replaces).
    if !overwrite && rfs::statat(rfs::CWD, &tc, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
        return Err(io::Error::from(io::ErrorKind::AlreadyExists));
    }
    let tmp = temp_beside(t);
    let kind = FileType::from_raw_mode(st.st_mode);
    let root = rustix::process::geteuid().is_root();
    let tdir = rfs::open(
        t.parent().unwrap_or(Path::new("/")),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let tname = CString::new(
        Path::new(std::ffi::OsStr::from_bytes(tmp.as_bytes()))
            .file_name()
            .unwrap_or_default()
            .as_bytes(),
    )
    .expect("no NUL");
    let made = (|| -> io::Result<()> {
        let mut attrs = Xattrs::new();
        let (src_fd, dst_fd) = make_entry(dir, name, &tmp, kind, &st)?;
        // Owner first (a chown clears set-id bits and file capabilities),
        // then the mode, then the attributes (an ACL's mask is the mode's
        // group bits, as in the source), the times last.
        if root {
            let _ = rfs::chownat(
                rfs::CWD,
                &tmp,
                Some(rustix::fs::Uid::from_raw(st.st_uid)),
                Some(rustix::fs::Gid::from_raw(st.st_gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            );
        }
        if let Some(w) = &dst_fd {
            rfs::fchmod(w.as_fd(), Mode::from_raw_mode(st.st_mode & 0o7777))?;
        }
        let xkind = if kind == FileType::Symlink {
            Kind::Symlink
        } else {
            Kind::File
        };
        let from = match &src_fd {
            Some(fd) => xattr::Target::Fd(fd.as_fd()),
            None => xattr::Target::At(dir, name),
        };
        xattr::read(from, xkind, XattrSel::ALL, root, &mut attrs)?;
        if !attrs.is_empty() {
            let to = match &dst_fd {
                Some(fd) => xattr::Target::Fd(fd.as_fd()),
                None => xattr::Target::At(tdir.as_fd(), &tname),
            };
            match xattr::write(to, &attrs, &Xattrs::new(), None) {
                // The target filesystem keeps no attributes at all.
                Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
                r => r?,
            }
        }
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: st.st_atime as _,
                tv_nsec: st.st_atime_nsec as _,
            },
            last_modification: Timespec {
                tv_sec: st.st_mtime as _,
                tv_nsec: st.st_mtime_nsec as _,
            },
        };
        rfs::utimensat(rfs::CWD, &tmp, &times, AtFlags::SYMLINK_NOFOLLOW)?;
        drop((src_fd, dst_fd));
        match rename(rfs::CWD, &tmp, rfs::CWD, &tc, overwrite) {
            Err(Errno::EXIST) => Err(io::Error::from(io::ErrorKind::AlreadyExists)),
            r => Ok(r?),
        }
    })();
    if made.is_err() {
        let _ = rfs::unlinkat(rfs::CWD, &tmp, AtFlags::empty());
    }
    made
}

/// Make `tmp` a copy of entry `name` of `dir` (of `kind`, stat'd as `st`):
/// a file's data with its holes, a symlink's target, a fifo or device
/// node. A file's two descriptors (source, copy) are returned open for
/// its attributes and mode.
fn make_entry(
    dir: BorrowedFd<'_>,
    name: &CStr,
    tmp: &CStr,
    kind: FileType,
    st: &rfs::Stat,
) -> io::Result<(Option<OwnedFd>, Option<OwnedFd>)> {
    let fds = match kind {
        FileType::RegularFile => {
            let src = rfs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )?;
            let dst = rfs::openat(
                rfs::CWD,
                tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            let copy_range = AtomicBool::new(true);
            sparse::copy_data(
                dst.as_fd(),
                src.as_fd(),
                st.st_size as u64,
                None,
                None,
                &copy_range,
            )?;
            (Some(src), Some(dst))
        }
        FileType::Symlink => {
            let target = rfs::readlinkat(dir, name, Vec::new())?;
            rfs::symlinkat(&target, rfs::CWD, tmp)?;
            (None, None)
        }
        FileType::Fifo | FileType::CharacterDevice | FileType::BlockDevice => {
            rfs::mknodat(
                rfs::CWD,
                tmp,
                kind,
                Mode::from_raw_mode(st.st_mode & 0o7777),
                st.st_rdev,
            )?;
            (None, None)
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "cannot keep this kind of entry on another filesystem",
            ))
        }
    };
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn dirfd(p: &Path) -> rustix::fd::OwnedFd {
        rfs::open(p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    #[test]
    fn replaced_files_are_linked_removed_ones_renamed() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("dst");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/a"), b"old a").unwrap();
        std::fs::write(root.join("d/b"), b"old b").unwrap();
        let d = dirfd(&root.join("d"));
        let base = KeepBase::Root(b"../old".to_vec());
        let to = |path: &'static [u8], replacing| KeepTo {
            base: &base,
            path,
            overwrite: true,
            replacing,
            planned: None,
        };
        keep(&root, d.as_fd(), c"a", &to(b"d/a", true)).unwrap();
        keep(&root, d.as_fd(), c"b", &to(b"d/b", false)).unwrap();
        let old = t.path().join("old/d");
        assert_eq!(std::fs::read(old.join("a")).unwrap(), b"old a");
        assert_eq!(std::fs::metadata(root.join("d/a")).unwrap().nlink(), 2);
        assert_eq!(std::fs::read(old.join("b")).unwrap(), b"old b");
        assert!(!root.join("d/b").exists());
        // Overwrite replaces an older kept entry; without it, AlreadyExists.
        std::fs::write(root.join("d/b"), b"new b").unwrap();
        let no = KeepTo {
            overwrite: false,
            ..to(b"d/b", false)
        };
        let e = keep(&root, d.as_fd(), c"b", &no).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        keep(&root, d.as_fd(), c"b", &to(b"d/b", true)).unwrap();
        assert_eq!(std::fs::read(old.join("b")).unwrap(), b"new b");
        assert_eq!(std::fs::read(root.join("d/b")).unwrap(), b"new b");
    }

    #[test]
    fn another_filesystem_is_a_copy_with_metadata() {
        // /dev/shm is a tmpfs, another filesystem than /tmp's here (if not,
        // the link path is taken and the test still checks the result).
        let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("dst");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("f"), b"bytes").unwrap();
        std::os::unix::fs::symlink("target", root.join("l")).unwrap();
        let f = std::fs::File::options()
            .write(true)
            .open(root.join("f"))
            .unwrap();
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
            .unwrap();
        let d = dirfd(&root);
        let base = KeepBase::Abs(shm.path().as_os_str().as_bytes().to_vec());
        for (n, p, replacing) in [(c"f", &b"k/f"[..], false), (c"l", &b"k/l"[..], true)] {
            let to = KeepTo {
                base: &base,
                path: p,
                overwrite: false,
                replacing,
                planned: None,
            };
            keep(&root, d.as_fd(), n, &to).unwrap();
        }
        let kept = shm.path().join("k/f");
        assert_eq!(std::fs::read(&kept).unwrap(), b"bytes");
        // Holes stay holes, attributes come along.
        let big = root.join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(64 << 20).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"data at 32 MiB", 32 << 20).unwrap();
        let bc = CString::new(big.as_os_str().as_bytes()).unwrap();
        let attr_ok = rfs::setxattr(&bc, c"user.k", b"v", rfs::XattrFlags::empty()).is_ok();
        let to = KeepTo {
            base: &base,
            path: b"k/big",
            overwrite: false,
            replacing: true,
            planned: None,
        };
        keep(&root, d.as_fd(), c"big", &to).unwrap();
        let kb = shm.path().join("k/big");
        let m = std::fs::metadata(&kb).unwrap();
        assert_eq!(m.len(), 64 << 20);
        assert!(m.blocks() * 512 < 1 << 20, "{} blocks", m.blocks());
        let mut buf = [0u8; 14];
        std::os::unix::fs::FileExt::read_exact_at(
            &std::fs::File::open(&kb).unwrap(),
            &mut buf,
            32 << 20,
        )
        .unwrap();
        assert_eq!(&buf, b"data at 32 MiB");
        if attr_ok {
            let kc = CString::new(kb.as_os_str().as_bytes()).unwrap();
            let mut v = [0u8; 8];
            assert_eq!(rfs::getxattr(&kc, c"user.k", &mut v[..]).ok(), Some(1));
        }
        // A taken name: AlreadyExists, nothing replaced.
        let e = keep(&root, d.as_fd(), c"big", &to).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::metadata(&kept).unwrap().mtime(), 1_000_000);
        assert!(!root.join("f").exists());
        assert_eq!(
            std::fs::read_link(shm.path().join("k/l")).unwrap(),
            Path::new("target")
        );
        assert!(root.join("l").symlink_metadata().is_ok());
    }
}
