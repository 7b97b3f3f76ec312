//! Fifos and device nodes (`mknodat`), made as `rsync -a` and `cp -a` make
//! them: the node's type, device number, mode, owner (as root) and mtime.
//! Only root may make device nodes; a fifo anyone may.

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode};
use rustix::io::Errno;

use ferry_engine::entry::{Kind, Meta};

use crate::local::{gid, times, uid};

/// Make the node `meta` describes at `name` in `dir`: under `tmp` first and
/// renamed over `name` when given (replacing an entry atomically), else at
/// `name` directly. `chown`/`chmod`: the owner, or the exact mode, needs
/// setting after creation (mknod applies the umask).
pub(crate) fn make_node(
    dir: BorrowedFd<'_>,
    name: &CStr,
    tmp: Option<&CStr>,
    meta: &Meta,
    chown: bool,
    chmod: bool,
) -> io::Result<()> {
    let (ft, what) = match meta.kind {
        Kind::Fifo => (FileType::Fifo, "fifo"),
        Kind::CharDev => (FileType::CharacterDevice, "character device"),
        Kind::BlockDev => (FileType::BlockDevice, "block device"),
        k => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a {} cannot be created", k.as_str()),
            ))
        }
    };
    let rdev = if meta.kind == Kind::Fifo {
        0
    } else {
        meta.rdev
    };
    let at = tmp.unwrap_or(name);
    match rfs::mknodat(dir, at, ft, Mode::from_raw_mode(meta.mode & 0o777), rdev) {
        Ok(()) => {}
        Err(Errno::PERM) if meta.kind != Kind::Fifo => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{what} {},{} not created: Operation not permitted (EPERM: only root can create device nodes)",
                    rfs::major(rdev),
                    rfs::minor(rdev)
                ),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    let res = (|| -> io::Result<()> {
        if chown {
            rfs::chownat(
                dir,
                at,
                Some(uid(meta.uid)),
                Some(gid(meta.gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if chmod {
            rfs::chmodat(dir, at, Mode::from_raw_mode(meta.mode), AtFlags::empty())?;
        }
        rfs::utimensat(dir, at, &times(meta), AtFlags::SYMLINK_NOFOLLOW)?;
        if let Some(t) = tmp {
            rfs::renameat(dir, t, dir, name)?;
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = rfs::unlinkat(dir, at, AtFlags::empty());
    }
    res
}
