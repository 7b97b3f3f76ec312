//! Opening a local store (its root, umask, owner rights, identities) and
//! the helpers its operations share.

use super::*;

impl LocalStore {
    /// A store rooted at `root` (which need not exist yet). `stat_threads`
    /// bounds the threads used to stat one large directory.
    pub fn new(root: impl Into<PathBuf>, stat_threads: usize) -> LocalStore {
        LocalStore {
            root: root.into(),
            stat_threads: stat_threads.max(1),
            umask: current_umask(),
            owner: rustix::process::geteuid().is_root(),
            euid: rustix::process::geteuid().as_raw(),
            egid: rustix::process::getegid().as_raw(),
            reflink: AtomicBool::new(true),
            copy_range: AtomicBool::new(true),
            tmpfile: AtomicBool::new(Path::new("/proc/self/fd").is_dir()),
            downloads: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            root_ids: Mutex::new(None),
            read_only: AtomicBool::new(false),
        }
    }

    /// This store as one that only reads (`yes`): rollback records a
    /// killed run left are never acted on or removed, only hidden
    /// (`crate::append`).
    pub fn read_only(self, yes: bool) -> LocalStore {
        self.read_only.store(yes, Ordering::Relaxed);
        self
    }

    /// From now on this store only reads (a server told so by its client).
    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Relaxed);
    }

    /// Whether this store only reads ([`LocalStore::read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Relaxed)
    }

    /// [`PosixStore::root_identities`](ferry_engine::store::PosixStore::root_identities) worked out afresh.
    pub(super) fn work_out_root_ids(&self) -> Option<ferry_engine::walk::RootIds> {
        let (root, _) = crate::ident::resolve(&self.root).ok()?;
        let ids = crate::ident::chain(&root)
            .into_iter()
            .map(|(id, p)| (id, p.into_os_string().into_vec()))
            .collect();
        Some(ferry_engine::walk::RootIds {
            root: root.into_os_string().into_vec(),
            ids,
        })
    }

    /// Bytes that resumed downloads did not fetch again.
    pub fn resumed_bytes(&self) -> u64 {
        self.resumed.load(Ordering::Relaxed)
    }

    /// Bytes of downloads written with `O_DIRECT` (past the page cache).
    pub fn direct_bytes(&self) -> u64 {
        self.direct.load(Ordering::Relaxed)
    }

    /// A writer of `name` in `dir` (content `meta.size` bytes, identity
    /// `ident`) that writes into its resumable partial, for a writer
    /// elsewhere that sends ranges (`ferry serve` receiving a push): with
    /// the ranges an earlier run recorded. Committed like a finished
    /// download; dropped without [`Store::abort`], the partial stays.
    pub fn partial_writer(
        &self,
        dir: &LocalDir,
        name: &CStr,
        meta: &Meta,
        ident: &str,
    ) -> io::Result<(LocalWriter, crate::range::RangeSet)> {
        let p = download::open_partial(dir.fd(), name, meta.size, ident)?;
        let w = LocalWriter {
            fd: p.fd,
            tmp: None,
            big: None,
            partial: Some(p.name),
            mode: meta.mode & 0o7777,
            owned: false,
            sparse: false,
            replaces: false,
            expect: None,
        };
        Ok((w, p.ranges))
    }

    /// The root path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(super) fn stat_into(dir: BorrowedFd<'_>, name: &CStr, meta: &mut Meta) -> io::Result<()> {
        let st = rfs::statx(
            dir,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::TYPE
                | StatxFlags::MODE
                | StatxFlags::UID
                | StatxFlags::GID
                | StatxFlags::MTIME
                | StatxFlags::CTIME
                | StatxFlags::INO
                | StatxFlags::NLINK
                | StatxFlags::SIZE
                | StatxFlags::BLOCKS,
        )?;
        *meta = meta_from_statx(&st);
        Ok(())
    }

    pub(super) fn copy_fd(
        &self,
        out: BorrowedFd<'_>,
        src: BorrowedFd<'_>,
        size: u64,
        sparse: bool,
        limit: Option<&Limiter>,
        progress: Option<&Progress<'_>>,
    ) -> io::Result<Option<u64>> {
        let moved = |n: u64| {
            if let Some(p) = progress {
                p.add(n)
            }
        };
        // A paced copy moves its bytes itself, so the pacing is real I/O.
        if limit.is_none() && size >= REFLINK_MIN && self.reflink.load(Ordering::Relaxed) {
            match rfs::ioctl_ficlone(out, src) {
                Ok(()) => {
                    let n = rfs::fstat(out)?.st_size as u64;
                    moved(n);
                    return Ok(Some(n));
                }
                Err(e) if is_unsupported(e) => self.reflink.store(false, Ordering::Relaxed),
                Err(e) => return Err(e.into()),
            }
        }
        if sparse {
            return sparse::copy_data(out, src, size, limit, progress, &self.copy_range).map(Some);
        }
        if !self.copy_range.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let chunk = limit.map_or(COPY_CHUNK, |l| l.chunk() as u64);
        let mut total = 0u64;
        loop {
            // Ask for one byte more than expected: a longer result means the
            // file grew while we copied it.
            let want = (size + 1 - total.min(size)).min(chunk) as usize;
            let r = rfs::copy_file_range(src, None, out, None, want);
            if let (Some(l), Ok(n)) = (limit, &r) {
                l.acquire(*n as u64);
            }
            match r {
                Ok(0) => {
                    if total == 0 && size > 0 {
                        // Some filesystems (procfs-like) report 0: stream instead.
                        return Ok(None);
                    }
                    return Ok(Some(total));
                }
                Ok(n) => {
                    total += n as u64;
                    moved(n as u64);
                    // A short count that lands exactly on the expected size is
                    // end of file: skip the extra call that would return 0.
                    if total > size || (total == size && n < want) {
                        return Ok(Some(total));
                    }
                }
                Err(e) if total == 0 && is_unsupported(e) => {
                    if e != Errno::XDEV {
                        self.copy_range.store(false, Ordering::Relaxed);
                    }
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Creating with `mode` under our umask does not give exactly `mode`
    /// (or a chown may have cleared set-id bits).
    pub(super) fn need_chmod(&self, mode: u32) -> bool {
        mode & self.umask & 0o777 != 0 || mode & 0o7000 != 0
    }

    /// A new file in `dir` would not already have this owner and group.
    pub(super) fn need_chown(&self, dir: &LocalDir, meta: &Meta) -> bool {
        self.owner && (meta.uid != self.euid || meta.gid != new_gid(dir).unwrap_or(self.egid))
    }

    /// Entries created in `dir` start with an ACL that a run keeping ACLs
    /// (`sel`) must compare: the directory hands a default ACL down.
    pub(super) fn inherits(&self, dir: &LocalDir, sel: XattrSel) -> bool {
        sel.acls && *dir.hands_down.get_or_init(|| xattr::hands_down(dir.fd()))
    }

    /// A hint before the commit of `w` without a planned entry to check
    /// (`ferry serve` for a client that sent none): the name exists, so
    /// the commit skips the attempt that only works for a new name.
    pub fn replacing(&self, w: &mut LocalWriter) {
        w.replaces = true;
    }

    /// [`Store::stat`] once a record was handled: the file as it is now.
    pub(super) fn stat_again(&self, dir: &LocalDir, name: &CStr) -> io::Result<Option<Meta>> {
        let mut meta = EMPTY_META;
        match Self::stat_into(dir.fd.as_fd(), name, &mut meta) {
            Ok(()) => Ok(Some(meta)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn wrap_dir(&self, fd: OwnedFd) -> io::Result<LocalDir> {
        Ok(LocalDir {
            fd,
            new_gid: OnceLock::new(),
            hands_down: OnceLock::new(),
        })
    }
}
