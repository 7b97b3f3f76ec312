//! The local filesystem `Store`.
//!
//! Everything is relative to directory file descriptors: listing is
//! `getdents64` into a reused 256 KiB buffer plus one `statx` per entry on the
//! directory fd (no path resolution, no allocation per entry). Directories
//! with many entries are stat'ed by several threads at once, since on a warm
//! cache `statx` is CPU-bound in the kernel. Writes go to a temporary name in
//! the target directory and are renamed into place after their metadata is
//! set. Copies between local files try a reflink (FICLONE) for big files,
//! then `copy_file_range`, then fall back to a read/write loop; a source
//! with holes has only its data copied (`sparse.rs`).
//!
//! (Over 800 lines: one trait implementation, the local backend's Store methods and the syscalls
//! they share.)

use parking_lot::Mutex;
use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use rustix::fs::{
    self as rfs, AtFlags, FileType, Mode, OFlags, RawDir, StatxFlags, Timespec, Timestamps,
    UTIME_OMIT,
};
use rustix::io::Errno;

use crate::download;
use crate::xattr::{self, Target};
use crate::{sparse, special};
use ferry_engine::bwlimit::Limiter;
use ferry_engine::delta::{DiffSummary, OpSink, Signature};
use ferry_engine::entry::{Kind, ListEntry, Listing, Meta};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::store::{
    is_undo_name, temp_name, undo_name, Absent, Cleanup, Committing, DeltaRole, Features,
    ListError, MetaChange, Planned, Progress, Report, SourceFile, Store, RESERVED_LEN,
};
use ferry_engine::xattr::{XattrSel, Xattrs};

/// Directories with more entries than this are stat'ed by several threads.
const PARALLEL_STAT_MIN: usize = 4096;
/// Files at least this big try a reflink before `copy_file_range`.
const REFLINK_MIN: u64 = 1 << 20;
/// Largest single `copy_file_range` request: big enough to cost nothing
/// (16 calls per GiB), small enough for progress to move as bytes do.
const COPY_CHUNK: u64 = 64 << 20;
/// Buffer of the read/write fallback path.
const STREAM_BUF: usize = 1 << 20;

/// A local directory tree rooted at a path.
#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
    stat_threads: usize,
    umask: u32,
    owner: bool,
    euid: u32,
    egid: u32,
    reflink: AtomicBool,
    copy_range: AtomicBool,
    /// New files are written as `O_TMPFILE` and named with `linkat`: one
    /// directory operation instead of create + rename (docs/DESIGN.md).
    tmpfile: AtomicBool,
    /// Ranged downloads started (big files from an object store).
    downloads: AtomicU64,
    /// Bytes of interrupted downloads reused by resumed ones.
    resumed: AtomicU64,
    /// Bytes of downloads written with `O_DIRECT`.
    direct: AtomicU64,
    /// [`PosixStore::root_identities`](ferry_engine::store::PosixStore::root_identities) as last worked out, with the root's (device,
    /// inode) then: a watch's runs ask on every batch of events, and the
    /// answer (a read of `/proc/self/mountinfo`, a stat per directory
    /// above the root) changes only with the root.
    root_ids: Mutex<Option<((u64, u64), ferry_engine::walk::RootIds)>>,
    /// Only reads (`ferry ls`, `ferry versions`, a dry run, a server told
    /// so): rollback records a killed run left are never acted on or
    /// removed, only hidden ([`LocalStore::read_only`]).
    read_only: AtomicBool,
}

/// An open local directory.
#[derive(Debug)]
pub struct LocalDir {
    fd: OwnedFd,
    /// Group that new entries get when it is not ours (set-group-ID
    /// directory); found on first need (a directory only scanned never
    /// needs it).
    new_gid: OnceLock<Option<u32>>,
    /// Whether the directory hands a default ACL down to new entries;
    /// asked on first need (only runs keeping ACLs ask).
    hands_down: OnceLock<bool>,
}

impl LocalDir {
    /// The directory's file descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A local file open for reading.
#[derive(Debug)]
pub struct LocalReader {
    fd: OwnedFd,
}

/// A local file being written under a temporary name.
#[derive(Debug)]
pub struct LocalWriter {
    fd: OwnedFd,
    /// `None`: an unnamed `O_TMPFILE`, given its name by `linkat` at commit.
    tmp: Option<TempName>,
    /// For big files only: the final name, in case the source is fetched
    /// as parallel ranges into a resumable partial (see `download`).
    big: Option<CString>,
    /// The partial download written, once complete.
    partial: Option<CString>,
    /// Permission bits asked for at creation (commit may be given others:
    /// a source's exact metadata known only once read).
    mode: u32,
    /// Owner and group were set before the attributes (a file
    /// capability is dropped by any later `chown`): commit leaves them.
    owned: bool,
    /// The source may have holes: only its data is copied (see `sparse`).
    sparse: bool,
    /// The final name exists ([`LocalStore::replacing`], `Store::expect`): an `O_TMPFILE` goes
    /// straight to a temporary name and a rename over it.
    replaces: bool,
    /// What the name must hold when the commit replaces it
    /// (`Store::expect`): `Some(None)` nothing, `Some(Some(p))` the entry
    /// planned; `None`: not asked (replaced whatever it holds).
    expect: Option<Option<Planned>>,
}

impl LocalWriter {
    /// The name of the resumable partial it writes, if it is one.
    pub fn partial_name(&self) -> Option<&CStr> {
        self.partial.as_deref()
    }

    fn new(fd: OwnedFd, tmp: Option<TempName>, name: &CStr, meta: &Meta) -> LocalWriter {
        LocalWriter {
            fd,
            tmp,
            big: (meta.size >= download::RANGED_MIN).then(|| name.to_owned()),
            partial: None,
            mode: meta.mode & 0o7777,
            owned: false,
            sparse: meta.sparse,
            replaces: false,
            expect: None,
        }
    }

    /// The file being written (a server writing what arrives at offsets).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

mod ext;
mod fs;
mod listing;
mod setup;

use fs::*;
pub(crate) use fs::{
    check_planned, gid, is_unsupported, pwrite_all, times, uid, write_all, EMPTY_META,
};
pub use fs::{free_space, path_bytes, stat_path};

impl Store for LocalStore {
    type Dir = LocalDir;
    type Reader = LocalReader;
    type Writer = LocalWriter;
    type Delta = LocalStore;
    type Xattrs = LocalStore;
    type Keep = LocalStore;
    type Posix = LocalStore;
    type Hashes = Absent;
    type Links = LocalStore;
    type Pipeline = LocalStore;

    fn features(&self) -> Features {
        Features {
            approximate_meta: false,
            latency_bound: false,
            preserves_owner: self.owner,
            local_modes: true,
            dir_meta: true,
            inodes: true,
            empty_dirs: true,
            dir_write_lanes: 2,
            mtime_step_ns: 1,
        }
    }

    fn delta(&self) -> Option<&LocalStore> {
        Some(self)
    }

    fn xattrs(&self) -> Option<&LocalStore> {
        Some(self)
    }

    fn keeper(&self) -> Option<&LocalStore> {
        Some(self)
    }

    fn posix(&self) -> Option<&LocalStore> {
        Some(self)
    }

    fn hashes(&self) -> Option<&Absent> {
        None
    }

    fn links(&self) -> Option<&LocalStore> {
        Some(self)
    }

    fn pipeline(&self) -> Option<&LocalStore> {
        Some(self)
    }

    fn cleanup(&self) -> Option<&dyn Cleanup> {
        None
    }

    fn refine(
        &self,
        _dir: &LocalDir,
        _list: &mut Listing,
        _which: &[usize],
        _errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        Ok(())
    }

    fn open_root(&self) -> io::Result<Option<(LocalDir, Meta)>> {
        let fd = match rfs::open(
            &self.root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut meta = EMPTY_META;
        Self::stat_into(fd.as_fd(), c"", &mut meta).or_else(|_| {
            let st = rfs::fstat(&fd)?;
            meta = meta_from_stat(&st);
            Ok::<(), io::Error>(())
        })?;
        Ok(Some((self.wrap_dir(fd)?, meta)))
    }

    fn create_root(&self) -> io::Result<LocalDir> {
        match rfs::mkdir(&self.root, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = rfs::open(
            &self.root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        self.wrap_dir(fd)
    }

    fn list(
        &self,
        dir: &LocalDir,
        rel: &[u8],
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        self.list_dir(dir, rel, out, errors)
    }

    fn stat(&self, dir: &LocalDir, name: &CStr) -> io::Result<Option<Meta>> {
        let mut meta = EMPTY_META;
        match Self::stat_into(dir.fd.as_fd(), name, &mut meta) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        // As a listing does: what a killed run left half patched is rolled
        // back before anything reads the file (a single-file run stats
        // its file instead of listing), and the file stat'ed again. Only a
        // file big enough to have been patched in place can have a record.
        if meta.kind == Kind::File
            && meta.size >= crate::append::RECORD_MIN
            && !self.is_read_only()
            && !is_undo_name(name.to_bytes())
            && crate::append::recover_any(dir.fd(), &undo_name(name.to_bytes()))
        {
            return self.stat_again(dir, name);
        }
        Ok(Some(meta))
    }

    fn open_dir(&self, parent: &LocalDir, name: &CStr) -> io::Result<LocalDir> {
        self.wrap_dir(open_subdir(parent.fd.as_fd(), name)?)
    }

    fn make_dir(&self, parent: &LocalDir, name: &CStr) -> io::Result<LocalDir> {
        rfs::mkdirat(&parent.fd, name, Mode::from_raw_mode(0o700))?;
        let fd = open_subdir(parent.fd.as_fd(), name)?;
        // A new directory inherits set-group-ID (and so the group) from its parent.
        Ok(LocalDir {
            fd,
            new_gid: parent
                .new_gid
                .get()
                .map(|g| OnceLock::from(*g))
                .unwrap_or_default(),
            hands_down: OnceLock::new(),
        })
    }

    fn set_dir_meta(&self, dir: &LocalDir, meta: &Meta, what: MetaChange) -> io::Result<()> {
        if what.owner && self.owner {
            rfs::fchown(&dir.fd, Some(uid(meta.uid)), Some(gid(meta.gid)))?;
        }
        if what.mode || (what.owner && self.owner && meta.mode & 0o7000 != 0) {
            rfs::fchmod(&dir.fd, Mode::from_raw_mode(meta.mode))?;
        }
        if what.mtime {
            rfs::futimens(&dir.fd, &times(meta))?;
        }
        Ok(())
    }

    fn open_file(&self, dir: &LocalDir, name: &CStr) -> io::Result<LocalReader> {
        let fd = rfs::openat(
            &dir.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(LocalReader { fd })
    }

    fn create_file(&self, dir: &LocalDir, name: &CStr, meta: &Meta) -> io::Result<LocalWriter> {
        let mode = Mode::from_raw_mode(meta.mode & 0o777);
        if self.tmpfile.load(Ordering::Relaxed) {
            // An unnamed file in the target directory: nothing to see, and
            // nothing to clean up after a kill, until `linkat` names it.
            match rfs::openat(
                &dir.fd,
                c".",
                OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                mode,
            ) {
                Ok(fd) => return Ok(LocalWriter::new(fd, None, name, meta)),
                Err(e) if is_unsupported(e) || e == Errno::ISDIR || e == Errno::NOENT => {
                    self.tmpfile.store(false, Ordering::Relaxed)
                }
                Err(e) => return Err(e.into()),
            }
        }
        let tmp = TempName::new();
        let fd = rfs::openat(
            &dir.fd,
            tmp.as_cstr(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            mode,
        )?;
        Ok(LocalWriter::new(fd, Some(tmp), name, meta))
    }

    fn write_from(
        &self,
        dir: &LocalDir,
        w: &mut LocalWriter,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        if let (Some(name), Some(r)) = (&w.big, src.ranged()) {
            self.downloads.fetch_add(1, Ordering::Relaxed);
            let d = download::download(dir.fd(), name, r, limit, src.progress(), &self.direct)?;
            self.resumed.fetch_add(d.resumed, Ordering::Relaxed);
            w.fd = d.fd;
            w.tmp = None;
            w.partial = Some(d.name);
            return Ok(d.size);
        }
        if let Some(sfd) = src.as_fd() {
            if let Some(n) =
                self.copy_fd(w.fd.as_fd(), sfd, size, w.sparse, limit, src.progress())?
            {
                return Ok(n);
            }
        }
        STREAMBUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            let cap = limit.map_or(buf.len(), |l| l.chunk().min(buf.len()));
            let mut total = 0u64;
            loop {
                let want = ((size - total.min(size)) as usize)
                    .saturating_add(1)
                    .min(cap);
                // Network sources hand over a few KiB per read: gather a
                // full buffer first, so each write syscall carries `want`
                // bytes (few, large syscalls).
                let mut n = 0;
                while n < want {
                    match src.read(&mut buf[n..want])? {
                        0 => break,
                        k => n += k,
                    }
                }
                if n == 0 {
                    return sparse::end_stream(w.fd.as_fd(), w.sparse, total);
                }
                if w.sparse {
                    sparse::write_skipping_zeros(w.fd.as_fd(), &buf[..n])?;
                } else {
                    write_all(w.fd.as_fd(), &buf[..n])?;
                }
                if let Some(l) = limit {
                    l.acquire(n as u64);
                }
                total += n as u64;
                if total > size || n < want {
                    return sparse::end_stream(w.fd.as_fd(), w.sparse, total);
                }
            }
        })
    }

    fn commit(
        &self,
        dir: &LocalDir,
        w: LocalWriter,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<()> {
        let res = (|| -> io::Result<()> {
            if !w.owned && self.need_chown(dir, meta) {
                rfs::fchown(&w.fd, Some(uid(meta.uid)), Some(gid(meta.gid)))?;
            }
            // A partial download was created 0600.
            if self.need_chmod(meta.mode) || w.partial.is_some() || w.mode != meta.mode & 0o7777 {
                rfs::fchmod(&w.fd, Mode::from_raw_mode(meta.mode))?;
            }
            rfs::futimens(&w.fd, &times(meta))?;
            if fsync {
                rfs::fsync(&w.fd)?;
            }
            Ok(())
        })();
        let LocalWriter {
            fd,
            tmp,
            partial,
            replaces,
            expect,
            ..
        } = w;
        if let Some(p) = partial {
            drop(fd);
            if let Err(e) = res.and_then(|()| place(dir.fd(), &p, name, expect)) {
                let _ = rfs::unlinkat(&dir.fd, &p, AtFlags::empty());
                return Err(e);
            }
            return Ok(());
        }
        if let Err(e) = res {
            drop(fd);
            if let Some(t) = &tmp {
                let _ = rfs::unlinkat(&dir.fd, t.as_cstr(), AtFlags::empty());
            }
            return Err(e);
        }
        let tmp = match tmp {
            Some(t) => t,
            None => {
                // Name the finished file. `/proc/self/fd` needs no capability
                // (AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH).
                let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
                // A name known to exist would only fail with EEXIST.
                let first = match replaces && !matches!(expect, Some(None)) {
                    true => Err(Errno::EXIST),
                    false => rfs::linkat(
                        rfs::CWD,
                        proc_path.as_str(),
                        &dir.fd,
                        name,
                        AtFlags::SYMLINK_FOLLOW,
                    ),
                };
                match first {
                    Ok(()) => return Ok(()),
                    // Planned free, taken since: nothing is replaced.
                    Err(Errno::EXIST) if matches!(expect, Some(None)) => {
                        return Err(ferry_engine::store::changed())
                    }
                    // Replacing an existing entry: link under a temporary
                    // name, then rename over it (atomic replace).
                    Err(Errno::EXIST) => {
                        let t = TempName::new();
                        rfs::linkat(
                            rfs::CWD,
                            proc_path.as_str(),
                            &dir.fd,
                            t.as_cstr(),
                            AtFlags::SYMLINK_FOLLOW,
                        )?;
                        t
                    }
                    Err(e) => {
                        // No usable /proc: named temporaries from now on.
                        self.tmpfile.store(false, Ordering::Relaxed);
                        return Err(e.into());
                    }
                }
            }
        };
        drop(fd);
        if let Err(e) = place(dir.fd(), tmp.as_cstr(), name, expect) {
            let _ = rfs::unlinkat(&dir.fd, tmp.as_cstr(), AtFlags::empty());
            return Err(e);
        }
        Ok(())
    }

    fn expect(&self, w: &mut LocalWriter, at: Option<&Planned>) {
        w.replaces = at.is_some();
        w.expect = Some(at.copied());
    }

    fn remove_planned(&self, dir: &LocalDir, name: &CStr, at: &Planned) -> io::Result<u64> {
        let _one = check_planned(dir.fd(), name, at)?;
        rfs::unlinkat(&dir.fd, name, AtFlags::empty())?;
        Ok(1)
    }

    fn abort(&self, dir: &LocalDir, w: LocalWriter) {
        // A failed ranged download never got here as `partial`: its file
        // stays for the next run to resume. A complete one that is not
        // wanted (the object changed since it was listed) goes.
        let LocalWriter {
            fd, tmp, partial, ..
        } = w;
        drop(fd);
        if let Some(tmp) = tmp {
            let _ = rfs::unlinkat(&dir.fd, tmp.as_cstr(), AtFlags::empty());
        }
        if let Some(p) = partial {
            let _ = rfs::unlinkat(&dir.fd, &p, AtFlags::empty());
        }
    }

    fn set_meta(
        &self,
        dir: &LocalDir,
        name: &CStr,
        meta: &Meta,
        what: MetaChange,
    ) -> io::Result<()> {
        let link = meta.kind == Kind::Symlink;
        if what.owner && self.owner {
            rfs::chownat(
                &dir.fd,
                name,
                Some(uid(meta.uid)),
                Some(gid(meta.gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if !link && (what.mode || (what.owner && self.owner && meta.mode & 0o7000 != 0)) {
            rfs::chmodat(
                &dir.fd,
                name,
                Mode::from_raw_mode(meta.mode),
                AtFlags::empty(),
            )?;
        }
        if what.mtime {
            rfs::utimensat(&dir.fd, name, &times(meta), AtFlags::SYMLINK_NOFOLLOW)?;
        }
        Ok(())
    }

    fn free_space(&self, dir: &LocalDir) -> Option<(u64, u64)> {
        free_space(dir.fd.as_fd())
    }

    fn remove(&self, dir: &LocalDir, name: &CStr, is_dir: bool) -> io::Result<u64> {
        if !is_dir {
            rfs::unlinkat(&dir.fd, name, AtFlags::empty())?;
            return Ok(1);
        }
        remove_tree(dir.fd.as_fd(), name, None)
    }

    fn remove_each(
        &self,
        dir: &LocalDir,
        name: &CStr,
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64> {
        remove_tree(dir.fd.as_fd(), name, Some((&mut Vec::new(), each)))
    }

    fn rename(
        &self,
        from_dir: &LocalDir,
        from_name: &CStr,
        to_dir: &LocalDir,
        to_name: &CStr,
    ) -> io::Result<()> {
        rename_noreplace(from_dir.fd(), from_name, to_dir.fd(), to_name)
    }

    fn rmdir(&self, dir: &LocalDir, name: &CStr) -> io::Result<()> {
        Ok(rfs::unlinkat(&dir.fd, name, AtFlags::REMOVEDIR)?)
    }

    fn report(&self, _role: &str) -> Report {
        let notes = match self.downloads.load(Ordering::Relaxed) {
            0 => Vec::new(),
            _ => vec![format!(
                "{} bytes of interrupted downloads reused, {} bytes of downloads written with O_DIRECT",
                self.resumed_bytes(),
                self.direct_bytes()
            )],
        };
        Report {
            warnings: Vec::new(),
            notes,
        }
    }
}

impl SourceFile for LocalReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match rustix::io::read(&self.fd, &mut *buf) {
                Err(Errno::INTR) => continue,
                r => return r.map_err(Into::into),
            }
        }
    }

    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn current(&self) -> Option<(u64, i64, u32)> {
        let st = rfs::fstat(&self.fd).ok()?;
        Some((st.st_size as u64, st.st_mtime, st.st_mtime_nsec as u32))
    }
}
