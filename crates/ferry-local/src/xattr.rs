//! Extended attributes and POSIX ACLs of local entries (`-X`, `-A`).
//!
//! An entry is reached through a descriptor (a file being read or written,
//! a directory) or by name in an open directory; a name goes through
//! `/proc/self/fd/<dir>/<name>` with the `l*xattr` calls, so one syscall
//! lists it without opening it and a symlink is never followed. Names and
//! values are read into per-thread buffers of the kernel's maxima (64 KiB
//! each), so an entry without attributes costs one `listxattr` and no
//! allocation.
//!
//! Which attributes are kept ([`keeps`]): with `-X`, `user.*` (not on
//! symlinks, where Linux refuses them) and, as root, every other namespace
//! but `system.*`; with `-A`, `system.posix_acl_access` (not on symlinks)
//! and `system.posix_acl_default` (directories). ACLs are copied as the
//! kernel's raw values, entry for entry.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use ferry_engine::entry::Kind;
use ferry_engine::xattr::{XattrSel, Xattrs};
use rustix::fs::{self as rfs, Mode, XattrFlags};
use rustix::io::Errno;

/// Largest attribute list and value Linux hands out (`XATTR_LIST_MAX`,
/// `XATTR_SIZE_MAX`).
const MAX: usize = 64 << 10;
/// The access ACL (its entries for owner, group and others mirror the mode).
pub(crate) const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// A directory's default ACL, handed down to entries created in it.
pub(crate) const ACL_DEFAULT: &CStr = c"system.posix_acl_default";

thread_local! {
    static NAMES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static VALUE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Where an entry's attributes are.
#[derive(Clone, Copy)]
pub(crate) enum Target<'a> {
    /// An open file or directory.
    Fd(BorrowedFd<'a>),
    /// Entry `name` of the open directory (not followed if a symlink).
    At(BorrowedFd<'a>, &'a CStr),
}

impl<'a> Target<'a> {
    /// Entry `name` of `dir`, or `dir` itself when `None`.
    pub(crate) fn of(dir: BorrowedFd<'a>, name: Option<&'a CStr>) -> Target<'a> {
        match name {
            Some(n) => Target::At(dir, n),
            None => Target::Fd(dir),
        }
    }
}

/// `/proc/self/fd/<dir>/<name>`: the entry by a path, for the `l*xattr` calls.
fn proc_path(dir: BorrowedFd<'_>, name: &CStr) -> CString {
    let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    p.extend_from_slice(name.to_bytes());
    CString::new(p).expect("no NUL in a name")
}

/// Whether an attribute `name` of an entry of `kind` is kept under `sel`
/// by a process that is root (`root`) or not.
pub(crate) fn keeps(name: &[u8], kind: Kind, sel: XattrSel, root: bool) -> bool {
    if let Some(acl) = name.strip_prefix(b"system.posix_acl_") {
        return sel.acls
            && match acl {
                b"access" => kind != Kind::Symlink,
                b"default" => kind == Kind::Dir,
                _ => false,
            };
    }
    if !sel.xattrs || name.starts_with(b"system.") {
        return false;
    }
    if name.starts_with(b"user.") {
        return kind != Kind::Symlink;
    }
    // trusted.*, security.* and the rest: only root may write them.
    root
}

fn buf(cell: &RefCell<Vec<u8>>) -> std::cell::RefMut<'_, Vec<u8>> {
    let mut b = cell.borrow_mut();
    if b.len() < MAX {
        b.resize(MAX, 0);
    }
    b
}

fn list(t: Target<'_>, out: &mut [u8]) -> Result<usize, Errno> {
    match t {
        Target::Fd(fd) => rfs::flistxattr(fd, out),
        Target::At(dir, name) => rfs::llistxattr(proc_path(dir, name).as_c_str(), out),
    }
}

fn get(t: Target<'_>, name: &CStr, out: &mut [u8]) -> Result<usize, Errno> {
    match t {
        Target::Fd(fd) => rfs::fgetxattr(fd, name, out),
        Target::At(dir, n) => rfs::lgetxattr(proc_path(dir, n).as_c_str(), name, out),
    }
}

fn set(t: Target<'_>, name: &CStr, value: &[u8]) -> Result<(), Errno> {
    match t {
        Target::Fd(fd) => rfs::fsetxattr(fd, name, value, XattrFlags::empty()),
        Target::At(dir, n) => rfs::lsetxattr(
            proc_path(dir, n).as_c_str(),
            name,
            value,
            XattrFlags::empty(),
        ),
    }
}

fn remove(t: Target<'_>, name: &CStr) -> Result<(), Errno> {
    match t {
        Target::Fd(fd) => rfs::fremovexattr(fd, name),
        Target::At(dir, n) => rfs::lremovexattr(proc_path(dir, n).as_c_str(), name),
    }
}

/// The attributes `sel` keeps of the entry at `t` (of `kind`) into `out`.
/// A filesystem without attributes has none.
pub(crate) fn read(
    t: Target<'_>,
    kind: Kind,
    sel: XattrSel,
    root: bool,
    out: &mut Xattrs,
) -> io::Result<()> {
    out.clear();
    NAMES.with(|names| {
        let mut names = buf(names);
        let n = match list(t, &mut names[..]) {
            Ok(n) => n,
            Err(Errno::OPNOTSUPP) => return Ok(()),
            Err(e) => return Err(io::Error::from(e)),
        };
        if n == 0 {
            return Ok(());
        }
        VALUE.with(|value| {
            let mut value = buf(value);
            for name in names[..n].split_inclusive(|&c| c == 0) {
                let Ok(cname) = CStr::from_bytes_with_nul(name) else {
                    continue;
                };
                if !keeps(cname.to_bytes(), kind, sel, root) {
                    continue;
                }
                match get(t, cname, &mut value[..]) {
                    Ok(len) => out.push(cname.to_bytes(), &value[..len]),
                    // Removed since it was listed.
                    Err(Errno::NODATA) => {}
                    Err(e) => {
                        return Err(io::Error::new(
                            io::Error::from(e).kind(),
                            format!(
                                "reading extended attribute {}: {}",
                                cname.to_string_lossy(),
                                io::Error::from(e)
                            ),
                        ))
                    }
                }
            }
            out.sort();
            Ok(())
        })
    })
}

/// Turn the attributes of the entry at `t` from `have` into `want`.
/// Removing an access ACL leaves the mode's group bits as the ACL's mask:
/// `mode` (the entry's permission bits, not for symlinks) is set again then.
pub(crate) fn write(
    t: Target<'_>,
    want: &Xattrs,
    have: &Xattrs,
    mode: Option<u32>,
) -> io::Result<()> {
    let (removals, sets) = want.diff(have);
    let fail = |what: &str, name: &[u8], e: Errno| {
        let e = io::Error::from(e);
        io::Error::new(
            e.kind(),
            format!(
                "{what} extended attribute {}: {e}",
                String::from_utf8_lossy(name)
            ),
        )
    };
    let mut acl_removed = false;
    for name in removals {
        let c = CString::new(name).expect("no NUL in a listed name");
        match remove(t, &c) {
            Ok(()) | Err(Errno::NODATA) => acl_removed |= name == ACL_ACCESS,
            Err(e) => return Err(fail("removing", name, e)),
        }
    }
    for (name, value) in sets {
        let c = CString::new(name).expect("no NUL in a listed name");
        set(t, &c, value).map_err(|e| fail("setting", name, e))?;
    }
    if let (true, Some(mode)) = (acl_removed, mode) {
        let mode = Mode::from_raw_mode(mode);
        match t {
            Target::Fd(fd) => rfs::fchmod(fd, mode)?,
            Target::At(dir, name) => rfs::chmodat(dir, name, mode, rfs::AtFlags::empty())?,
        }
    }
    Ok(())
}

/// True when directory `dir` hands a default ACL down to what is created
/// in it (new entries then start with an access ACL).
pub(crate) fn hands_down(dir: BorrowedFd<'_>) -> bool {
    // A size query (empty buffer): any answer but "no such attribute" (or
    // none supported) means there is one (a default ACL is never empty).
    matches!(
        rfs::fgetxattr(dir, ACL_DEFAULT, &mut [0u8; 0][..]),
        Ok(_) | Err(Errno::RANGE)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_each_flag_selects_by_kind_and_privilege() {
        let x = XattrSel {
            xattrs: true,
            acls: false,
        };
        let a = XattrSel {
            xattrs: false,
            acls: true,
        };
        for root in [false, true] {
            assert!(keeps(b"user.a", Kind::File, x, root));
            assert!(keeps(b"user.a", Kind::Dir, x, root));
            assert!(
                !keeps(b"user.a", Kind::Symlink, x, root),
                "Linux refuses user.* on symlinks"
            );
            assert!(!keeps(b"user.a", Kind::File, a, root));
            assert_eq!(keeps(b"trusted.a", Kind::File, x, root), root);
            assert_eq!(keeps(b"security.capability", Kind::File, x, root), root);
            assert_eq!(keeps(b"trusted.a", Kind::Symlink, x, root), root);
            assert!(!keeps(b"system.posix_acl_access", Kind::File, x, root));
            assert!(keeps(b"system.posix_acl_access", Kind::File, a, root));
            assert!(keeps(b"system.posix_acl_access", Kind::Dir, a, root));
            assert!(!keeps(b"system.posix_acl_access", Kind::Symlink, a, root));
            assert!(keeps(b"system.posix_acl_default", Kind::Dir, a, root));
            assert!(!keeps(b"system.posix_acl_default", Kind::File, a, root));
            assert!(!keeps(b"system.nfs4_acl", Kind::File, XattrSel::ALL, root));
        }
    }
}
