//! The system calls behind the local store: metadata from `statx`,
//! renames that never replace, removal of trees, temporaries' names and
//! the small write helpers the other modules share.

use super::*;

/// Open a subdirectory without following a symlink in its place.
pub(super) fn open_subdir(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    Ok(rfs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Who hears of each entry [`remove_tree`] removes: its path below the
/// removed directory (the buffer, as it descends) and size.
pub(super) type Removed<'a, 'b> = Option<(&'a mut Vec<u8>, &'a mut (dyn FnMut(&[u8], u64) + 'b))>;

/// Remove a directory tree below `parent`, making directories writable when
/// needed. Returns the number of entries removed (the directory included);
/// `tell` hears of each (a file's size costs a stat then).
pub(super) fn remove_tree(
    parent: BorrowedFd<'_>,
    name: &CStr,
    mut tell: Removed<'_, '_>,
) -> io::Result<u64> {
    let fd = open_subdir(parent, name)?;
    // Never through a mount point (a bind mount can show SRC, or a root's
    // parent, here; and a mount point cannot be removed anyway).
    if let Ok(st) = rfs::statx(&fd, c"", AtFlags::EMPTY_PATH, StatxFlags::empty()) {
        let m = rfs::StatxAttributes::MOUNT_ROOT;
        if st.stx_attributes_mask.contains(m) && st.stx_attributes.contains(m) {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "is a mount point: ferry never deletes through one (not removed)",
            ));
        }
    }
    let mut names: Vec<(CString, bool)> = Vec::new();
    {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut iter = RawDir::new(&fd, &mut buf[..]);
        while let Some(ent) = iter.next() {
            let ent = ent?;
            let n = ent.file_name();
            if n.to_bytes() == b"." || n.to_bytes() == b".." {
                continue;
            }
            names.push((n.to_owned(), ent.file_type() == FileType::Directory));
        }
    }
    let mut count = 0;
    let mut made_writable = false;
    for (n, is_dir) in names {
        // The entry's path below the removed directory, while it is handled.
        let base = tell.as_mut().map(|(path, _)| {
            let len = path.len();
            if len > 0 {
                path.push(b'/');
            }
            path.extend_from_slice(n.to_bytes());
            len
        });
        loop {
            let r = if is_dir {
                remove_tree(
                    fd.as_fd(),
                    &n,
                    tell.as_mut().map(|(p, t)| (&mut **p, &mut **t)),
                )
            } else {
                let size = match &tell {
                    Some(_) => rfs::statat(&fd, &n, AtFlags::SYMLINK_NOFOLLOW)
                        .map_or(0, |st| st.st_size as u64),
                    None => 0,
                };
                rfs::unlinkat(&fd, &n, AtFlags::empty())
                    .map(|_| {
                        if let Some((path, t)) = tell.as_mut() {
                            t(path, size);
                        }
                        1
                    })
                    .map_err(Into::into)
            };
            match r {
                Ok(c) => {
                    count += c;
                    break;
                }
                Err(e)
                    if !made_writable && e.raw_os_error() == Some(Errno::ACCESS.raw_os_error()) =>
                {
                    rfs::fchmod(&fd, Mode::from_raw_mode(0o700))?;
                    made_writable = true;
                }
                Err(e) if !is_dir && e.raw_os_error() == Some(Errno::ISDIR.raw_os_error()) => {
                    count += remove_tree(
                        fd.as_fd(),
                        &n,
                        tell.as_mut().map(|(p, t)| (&mut **p, &mut **t)),
                    )?;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => return Err(e),
            }
        }
        if let (Some((path, _)), Some(len)) = (tell.as_mut(), base) {
            path.truncate(len);
        }
    }
    drop(fd);
    rfs::unlinkat(parent, name, AtFlags::REMOVEDIR)?;
    if let Some((path, t)) = tell.as_mut() {
        t(path, 0);
    }
    Ok(count + 1)
}

pub(super) fn stat_chunk(
    dir: BorrowedFd<'_>,
    names: &[u8],
    part: &mut [ListEntry],
    base: usize,
    failed: &mut Vec<(usize, io::Error)>,
) {
    for (i, e) in part.iter_mut().enumerate() {
        let ino = e.meta.ino;
        let (off, len) = e.name_span();
        let name = CStr::from_bytes_with_nul(&names[off..off + len + 1]).expect("NUL-terminated");
        if let Err(err) = LocalStore::stat_into(dir, name, &mut e.meta) {
            failed.push((base + i, err));
        } else if e.meta.ino == 0 {
            e.meta.ino = ino;
        }
    }
}

/// The group new entries of `dir` get when it is not the creator's (only
/// the owner-preserving, root, case asks): a set-group-ID directory hands
/// down its own. An fstat that fails answers `None` (then a chown follows,
/// which is merely redundant).
pub(super) fn new_gid(dir: &LocalDir) -> Option<u32> {
    *dir.new_gid.get_or_init(|| {
        rfs::fstat(&dir.fd)
            .ok()
            .and_then(|st| (st.st_mode & 0o2000 != 0).then_some(st.st_gid))
    })
}

pub(crate) const EMPTY_META: Meta = Meta {
    kind: Kind::Other,
    size: 0,
    mtime_sec: 0,
    mtime_nsec: 0,
    mode: 0,
    uid: 0,
    gid: 0,
    ino: 0,
    version: 0,
    rdev: 0,
    sparse: false,
    nlink: 0,
    dev: 0,
    ctime: 0,
};

pub(super) fn kind_from_mode(mode: u32) -> Kind {
    match mode & 0o170000 {
        0o100000 => Kind::File,
        0o040000 => Kind::Dir,
        0o120000 => Kind::Symlink,
        0o010000 => Kind::Fifo,
        0o020000 => Kind::CharDev,
        0o060000 => Kind::BlockDev,
        0o140000 => Kind::Socket,
        _ => Kind::Other,
    }
}

/// Whether a file may have holes: its blocks hold fewer bytes than its
/// size. A file without holes has at least its size rounded up to the
/// filesystem's block; one hole takes a whole block away, so the test
/// catches every hole (where no space is reserved past the end). Not
/// `blocks < size / 512`, which rounds the size down: a one-block hole in a
/// file whose last block is nearly empty passed for dense, and its copy
/// (`copy_file_range`, which reads holes as zeros) filled the hole. (A small
/// file kept inside its inode has no blocks and passes too; its copy then
/// costs two `lseek`s more.)
pub(super) fn maybe_sparse(kind: Kind, size: u64, blocks: u64) -> bool {
    kind == Kind::File && blocks.saturating_mul(512) < size
}

pub(super) fn meta_from_statx(st: &rfs::Statx) -> Meta {
    let mode = st.stx_mode as u32;
    let kind = kind_from_mode(mode);
    let blocks = StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::BLOCKS);
    Meta {
        kind,
        size: st.stx_size,
        mtime_sec: st.stx_mtime.tv_sec,
        mtime_nsec: st.stx_mtime.tv_nsec,
        mode: mode & 0o7777,
        uid: st.stx_uid,
        gid: st.stx_gid,
        ino: st.stx_ino,
        version: 0,
        rdev: rfs::makedev(st.stx_rdev_major, st.stx_rdev_minor),
        sparse: blocks && maybe_sparse(kind, st.stx_size, st.stx_blocks),
        nlink: st.stx_nlink,
        dev: rfs::makedev(st.stx_dev_major, st.stx_dev_minor),
        ctime: match StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::CTIME) {
            true => ctime_ns(st.stx_ctime.tv_sec, st.stx_ctime.tv_nsec),
            false => 0,
        },
    }
}

pub(super) fn meta_from_stat(st: &rfs::Stat) -> Meta {
    let mode = st.st_mode;
    let kind = kind_from_mode(mode);
    Meta {
        kind,
        size: st.st_size as u64,
        mtime_sec: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec as u32,
        mode: mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        ino: st.st_ino,
        version: 0,
        rdev: st.st_rdev,
        sparse: maybe_sparse(kind, st.st_size as u64, st.st_blocks as u64),
        nlink: st.st_nlink as u32,
        dev: st.st_dev,
        ctime: ctime_ns(st.st_ctime, st.st_ctime_nsec as u32),
    }
}

/// A change time as [`Meta::ctime`] holds it: nanoseconds since the
/// epoch (never 0 for a real one: 0 is "unknown").
pub(super) fn ctime_ns(sec: i64, nsec: u32) -> u64 {
    (sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(nsec as u64)
        | 1 << 63
}

/// Stat a path (not following a final symlink) into a [`Meta`].
pub fn stat_path(path: &Path, follow: bool) -> io::Result<Meta> {
    let flags = if follow {
        AtFlags::empty()
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    let st = rfs::statat(rfs::CWD, path, flags)?;
    Ok(meta_from_stat(&st))
}

/// The checks of files listed with several names, and the acts that follow
/// them, one at a time in this process: [`Planned::holds`] takes such a file
/// as it is while it still has another name, so two of its names replaced or
/// removed at once must not both be checked before either is gone (the last
/// name is checked in full: size and mtime).
static SEVERAL: parking_lot::Mutex<()> = parking_lot::const_mutex(());

/// Held from a check of a file listed with several names until the act on
/// it is done ([`SEVERAL`]).
pub(crate) type Checked = Option<parking_lot::MutexGuard<'static, ()>>;

/// Fail with `changed` unless `name` of `dir` still is the entry planned
/// (one `statx`). The caller holds what it returns until its rename, unlink
/// or link is done.
pub(crate) fn check_planned(dir: BorrowedFd<'_>, name: &CStr, at: &Planned) -> io::Result<Checked> {
    let one = (at.meta.nlink > 1).then(|| SEVERAL.lock());
    let mut m = EMPTY_META;
    let now = match LocalStore::stat_into(dir, name, &mut m) {
        Ok(()) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    if at.holds(now.as_ref()) {
        Ok(one)
    } else {
        Err(ferry_engine::store::changed())
    }
}

/// Rename the finished file `from` of `dir` to `name`, as `expect` says
/// (`LocalWriter::expect`): over the entry planned, checked right before;
/// onto a name planned free, never over anything (`RENAME_NOREPLACE`);
/// over whatever is there when nothing was asked.
pub(super) fn place(
    dir: BorrowedFd<'_>,
    from: &CStr,
    name: &CStr,
    expect: Option<Option<Planned>>,
) -> io::Result<()> {
    match expect {
        None => Ok(rfs::renameat(dir, from, dir, name)?),
        Some(Some(p)) => {
            let _one = check_planned(dir, name, &p)?;
            Ok(rfs::renameat(dir, from, dir, name)?)
        }
        Some(None) => match rename_noreplace(dir, from, dir, name) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(ferry_engine::store::changed())
            }
            r => r,
        },
    }
}

/// Rename `from` of `from_dir` to `to` of `to_dir`, never over an entry
/// there (`AlreadyExists`): `RENAME_NOREPLACE`; on a filesystem without
/// it, a link (which never replaces) then an unlink; without links either
/// (FAT), the name checked free right before a plain rename.
pub(super) fn rename_noreplace(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    let exists = || io::Error::from(io::ErrorKind::AlreadyExists);
    match rfs::renameat_with(from_dir, from, to_dir, to, rfs::RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => Err(exists()),
        Err(Errno::INVAL) | Err(Errno::NOSYS) => {
            match rfs::linkat(from_dir, from, to_dir, to, AtFlags::empty()) {
                Ok(()) => {
                    rfs::unlinkat(from_dir, from, AtFlags::empty())?;
                    Ok(())
                }
                Err(Errno::EXIST) => Err(exists()),
                // Directories cannot be linked; nor can anything on FAT.
                Err(Errno::PERM | Errno::NOTSUP | Errno::MLINK | Errno::NOSYS) => {
                    match rfs::statx(to_dir, to, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::TYPE) {
                        Err(Errno::NOENT) => Ok(rfs::renameat(from_dir, from, to_dir, to)?),
                        Ok(_) => Err(exists()),
                        Err(e) => Err(e.into()),
                    }
                }
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

pub(crate) fn times(meta: &Meta) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: meta.mtime_sec,
            tv_nsec: meta.mtime_nsec as _,
        },
    }
}

pub(crate) fn uid(u: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(u)
}

pub(crate) fn gid(g: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(g)
}

/// Errors that mean a copy syscall cannot copy between these files.
pub(crate) fn is_unsupported(e: Errno) -> bool {
    matches!(
        e,
        Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::BADF | Errno::PERM
    )
}

pub(crate) fn pwrite_all(fd: BorrowedFd<'_>, data: &[u8], at: u64) -> io::Result<()> {
    let mut n = 0;
    while n < data.len() {
        match rustix::io::pwrite(fd, &data[n..], at + n as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => n += k,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(crate) fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::write(fd, buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(super) fn current_umask() -> u32 {
    let old = rustix::process::umask(Mode::from_raw_mode(0o022));
    rustix::process::umask(old);
    old.as_raw_mode()
}

thread_local! {
    pub(super) static DIRBUF: RefCell<Vec<MaybeUninit<u8>>> = RefCell::new(vec![MaybeUninit::uninit(); 256 * 1024]);
    pub(super) static STREAMBUF: RefCell<Vec<u8>> = RefCell::new(vec![0u8; STREAM_BUF]);
}

/// A local file appended to in place ([`Store::open_append`]).
pub(super) struct LocalAppend {
    pub(super) fd: OwnedFd,
    pub(super) end: u64,
    /// Its owner and group, when the store keeps owners.
    pub(super) owner: Option<(u32, u32)>,
    /// Its permission bits.
    pub(super) mode: u32,
}

impl ferry_engine::store::AppendFile for LocalAppend {
    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match rustix::io::pread(&self.fd, &mut buf[n..], at + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
    }

    fn append(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match rustix::io::pwrite(&self.fd, buf, self.end) {
                Ok(k) => {
                    buf = &buf[k..];
                    self.end += k as u64;
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn finish(self: Box<Self>, meta: &Meta, fsync: bool) -> io::Result<()> {
        if self.owner.is_some_and(|o| o != (meta.uid, meta.gid)) {
            rfs::fchown(&self.fd, Some(uid(meta.uid)), Some(gid(meta.gid)))?;
        }
        // After a chown, which drops setuid and setgid bits.
        if self.mode != meta.mode & 0o7777 || self.owner.is_some_and(|o| o != (meta.uid, meta.gid))
        {
            rfs::fchmod(&self.fd, Mode::from_raw_mode(meta.mode & 0o7777))?;
        }
        if fsync {
            rfs::fsync(&self.fd)?;
        }
        rfs::futimens(&self.fd, &times(meta))?;
        Ok(())
    }
}

/// A reserved temporary name (`store::temp_name`): our pid and a counter,
/// unique per process and call, recognisable by the next run as a leftover.
#[derive(Debug)]
pub(super) struct TempName {
    buf: [u8; RESERVED_LEN + 1],
}

pub(super) static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Our pid, asked once (std asks the kernel on every call).
pub(super) fn pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

impl TempName {
    pub(super) fn new() -> TempName {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        TempName {
            buf: temp_name((u64::from(pid()) << 32) | (n & 0xffff_ffff)),
        }
    }

    pub(super) fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_with_nul(&self.buf).expect("NUL-terminated")
    }
}

/// A path as bytes (helper for callers turning `Path`s into listing keys).
pub fn path_bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

/// Bytes and inodes free for this user on the filesystem of `fd`.
pub fn free_space(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    let s = rfs::fstatvfs(fd).ok()?;
    Some((s.f_bavail.saturating_mul(s.f_frsize), s.f_favail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hole_is_seen_whatever_the_last_block_holds() {
        // 24,863 bytes in 4 KiB blocks: 7 blocks (56 sectors) dense; with a one-block
        // hole, 6 blocks (48 sectors), which `blocks < size / 512` (48 < 48) called dense.
        assert!(maybe_sparse(Kind::File, 24_863, 48));
        assert!(!maybe_sparse(Kind::File, 24_863, 56));
        // Exact multiples, the smallest file, a file kept in its inode.
        assert!(maybe_sparse(Kind::File, 8192, 8));
        assert!(!maybe_sparse(Kind::File, 8192, 16));
        assert!(!maybe_sparse(Kind::File, 1, 8));
        assert!(maybe_sparse(Kind::File, 60, 0));
        assert!(!maybe_sparse(Kind::File, 0, 0));
        assert!(!maybe_sparse(Kind::Dir, 4096, 0));
    }
}
