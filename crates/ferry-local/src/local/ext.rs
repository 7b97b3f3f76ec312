//! The extensions the local store has: deltas, extended attributes and
//! ACLs, keeping replaced entries, the POSIX-only operations, symlinks,
//! and the one shortcut it takes (an empty file made under its name).

use super::*;
use ferry_engine::store::{
    DeltaStore, KeepStore, LinkStore, PipelineStore, PosixStore, XattrStore,
};

impl DeltaStore<LocalStore> for LocalStore {
    fn role(&self) -> DeltaRole {
        DeltaRole::Local
    }

    fn delta_signature(
        &self,
        dir: &LocalDir,
        name: &CStr,
        min: u64,
    ) -> io::Result<Option<Signature>> {
        crate::delta::signature(self, dir, name, min)
    }

    fn delta_write(
        &self,
        dir: &LocalDir,
        w: &mut LocalWriter,
        old: &CStr,
        sig: &Signature,
        feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
    ) -> io::Result<DiffSummary> {
        crate::delta::rebuild(dir, w.fd(), old, sig, feed)
    }

    fn delta_inplace<'a>(
        &'a self,
        dir: &'a LocalDir,
        name: &CStr,
        old: &Meta,
        l: &ferry_engine::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<Option<Box<dyn ferry_engine::delta::InPlace + 'a>>> {
        let p = crate::inplace::LocalPatch::start(dir.fd(), name, old, self.owner, l, key)?;
        Ok(p.map(|p| Box::new(p) as Box<dyn ferry_engine::delta::InPlace>))
    }

    fn open_append<'a>(
        &'a self,
        dir: &'a LocalDir,
        name: &CStr,
        old: &Meta,
    ) -> io::Result<Option<Box<dyn ferry_engine::store::AppendFile + 'a>>> {
        let fd = match rfs::openat(
            &dir.fd,
            name,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::LOOP | Errno::ISDIR | Errno::TXTBSY) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let st = rfs::fstat(&fd)?;
        let now = (
            st.st_ino,
            st.st_size as u64,
            st.st_mtime as i64,
            st.st_mtime_nsec as u32,
            st.st_nlink,
        );
        let is_file = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile;
        if !is_file || now != (old.ino, old.size, old.mtime_sec, old.mtime_nsec, 1) {
            return Ok(None);
        }
        Ok(Some(Box::new(LocalAppend {
            fd,
            end: old.size,
            owner: self.owner.then_some((st.st_uid, st.st_gid)),
            mode: st.st_mode & 0o7777,
        })))
    }

    fn delta_diff(
        &self,
        r: &mut dyn SourceFile,
        sig: &Signature,
        sink: &mut dyn OpSink,
    ) -> io::Result<DiffSummary> {
        ferry_engine::delta::diff(r, sig, sink)
    }

    fn inplace_hashes(
        &self,
        r: &mut dyn SourceFile,
        l: &ferry_engine::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<ferry_engine::delta::PatchHashes> {
        ferry_engine::delta::inplace::source_patch_hashes(r, l, key)
    }

    fn read_at(&self, r: &mut dyn SourceFile, at: u64, buf: &mut [u8]) -> io::Result<usize> {
        ferry_engine::delta::inplace::source_read_at(r, at, buf)
    }
}

impl XattrStore<LocalStore> for LocalStore {
    fn caps(&self) -> XattrSel {
        XattrSel::ALL
    }

    fn get_xattrs(
        &self,
        dir: &LocalDir,
        name: Option<&CStr>,
        kind: Kind,
        sel: XattrSel,
        out: &mut Xattrs,
    ) -> io::Result<()> {
        let t = Target::of(dir.fd(), name);
        xattr::read(t, kind, sel, self.owner, out)
    }

    fn reader_xattrs(&self, r: &LocalReader, sel: XattrSel, out: &mut Xattrs) -> io::Result<()> {
        xattr::read(Target::Fd(r.fd.as_fd()), Kind::File, sel, self.owner, out)
    }

    fn set_xattrs(
        &self,
        dir: &LocalDir,
        name: Option<&CStr>,
        meta: &Meta,
        sel: XattrSel,
        want: &Xattrs,
        have: Option<&Xattrs>,
    ) -> io::Result<()> {
        let t = Target::of(dir.fd(), name);
        let mode = (meta.kind != Kind::Symlink).then_some(meta.mode);
        let mut got = Xattrs::new();
        let have = match have {
            Some(h) => h,
            // New: a directory or file may have inherited an ACL.
            None if meta.kind != Kind::Symlink && self.inherits(dir, sel) => {
                xattr::read(t, meta.kind, sel, self.owner, &mut got)?;
                &got
            }
            None => &got,
        };
        if want == have {
            return Ok(());
        }
        xattr::write(t, want, have, mode)
    }

    fn set_writer_xattrs(
        &self,
        dir: &LocalDir,
        w: &mut LocalWriter,
        meta: &Meta,
        sel: XattrSel,
        want: &Xattrs,
    ) -> io::Result<()> {
        let t = Target::Fd(w.fd.as_fd());
        let mut have = Xattrs::new();
        if self.inherits(dir, sel) {
            xattr::read(t, Kind::File, sel, self.owner, &mut have)?;
        }
        if want == &have {
            return Ok(());
        }
        // A file capability is dropped by a later chown: owner first.
        if want.get(b"security.capability").is_some() && self.need_chown(dir, meta) {
            rfs::fchown(&w.fd, Some(uid(meta.uid)), Some(gid(meta.gid)))?;
            w.owned = true;
        }
        xattr::write(t, want, &have, Some(meta.mode))
    }
}

impl KeepStore<LocalStore> for LocalStore {
    fn keeps_at(&self, _base: &KeepBase) -> bool {
        true
    }

    fn keep(&self, dir: &LocalDir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
        crate::keep::keep(&self.root, dir.fd.as_fd(), name, to)
    }
}

impl PosixStore<LocalStore> for LocalStore {
    fn hard_links(&self) -> bool {
        true
    }

    fn link(
        &self,
        from_dir: &LocalDir,
        from_name: &CStr,
        dir: &LocalDir,
        name: &CStr,
    ) -> io::Result<()> {
        match rfs::linkat(&from_dir.fd, from_name, &dir.fd, name, AtFlags::empty()) {
            Err(Errno::EXIST) => {}
            r => return Ok(r?),
        }
        // Replacing an existing entry: link under a temporary name, then
        // rename over it (atomic replace). The caller never links a name
        // to the file it already is (rename would then leave both names).
        let t = TempName::new();
        rfs::linkat(
            &from_dir.fd,
            from_name,
            &dir.fd,
            t.as_cstr(),
            AtFlags::empty(),
        )?;
        if let Err(e) = rfs::renameat(&dir.fd, t.as_cstr(), &dir.fd, name) {
            let _ = rfs::unlinkat(&dir.fd, t.as_cstr(), AtFlags::empty());
            return Err(e.into());
        }
        Ok(())
    }

    fn special(&self) -> bool {
        true
    }

    fn create_special(
        &self,
        dir: &LocalDir,
        name: &CStr,
        meta: &Meta,
        replace: bool,
    ) -> io::Result<()> {
        let tmp = replace.then(TempName::new);
        special::make_node(
            dir.fd(),
            name,
            tmp.as_ref().map(TempName::as_cstr),
            meta,
            self.need_chown(dir, meta),
            self.need_chmod(meta.mode),
        )
    }

    fn is_own_legacy_partial(&self, dir: &LocalDir, name: &CStr) -> bool {
        download::has_resume_record(dir.fd(), name)
    }

    fn make_writable(&self, dir: &LocalDir) -> io::Result<bool> {
        // Root writes anywhere; a directory that is not ours cannot be
        // changed (the operations that follow report the real cause).
        if self.owner {
            return Ok(false);
        }
        let st = rfs::fstat(&dir.fd)?;
        if st.st_mode & 0o200 != 0 || st.st_uid != self.euid {
            return Ok(false);
        }
        rfs::fchmod(&dir.fd, Mode::from_raw_mode((st.st_mode & 0o7777) | 0o300))?;
        Ok(true)
    }

    fn root_identities(&self) -> Option<ferry_engine::walk::RootIds> {
        // One stat says whether the root is still the one last worked out.
        let now = std::fs::metadata(&self.root).ok().map(|m| {
            (
                std::os::unix::fs::MetadataExt::dev(&m),
                std::os::unix::fs::MetadataExt::ino(&m),
            )
        });
        let mut cached = self.root_ids.lock();
        if let (Some(id), Some((at, ids))) = (now, cached.as_ref()) {
            if id == *at {
                return Some(ids.clone());
            }
        }
        let ids = self.work_out_root_ids()?;
        *cached = now.map(|id| (id, ids.clone()));
        Some(ids)
    }
}

impl LinkStore<LocalStore> for LocalStore {
    fn read_link(&self, dir: &LocalDir, name: &CStr) -> io::Result<Vec<u8>> {
        Ok(rfs::readlinkat(&dir.fd, name, Vec::new())?.into_bytes())
    }

    fn create_symlink(
        &self,
        dir: &LocalDir,
        name: &CStr,
        target: &[u8],
        meta: &Meta,
    ) -> io::Result<()> {
        let tmp = TempName::new();
        let target = CString::new(target)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in link target"))?;
        rfs::symlinkat(target.as_c_str(), &dir.fd, tmp.as_cstr())?;
        let res = (|| -> io::Result<()> {
            if self.owner {
                rfs::chownat(
                    &dir.fd,
                    tmp.as_cstr(),
                    Some(uid(meta.uid)),
                    Some(gid(meta.gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )?;
            }
            rfs::utimensat(
                &dir.fd,
                tmp.as_cstr(),
                &times(meta),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
            rfs::renameat(&dir.fd, tmp.as_cstr(), &dir.fd, name)?;
            Ok(())
        })();
        if res.is_err() {
            let _ = rfs::unlinkat(&dir.fd, tmp.as_cstr(), AtFlags::empty());
        }
        res
    }

    fn sets_symlink_times(&self, _dir: &LocalDir, _name: &CStr, _now: &Meta) -> bool {
        true
    }
}

// Opens and commits are system calls here: nothing to send ahead or leave
// unconfirmed; only an empty file is made in one go.
impl PipelineStore<LocalStore> for LocalStore {
    /// Opened as any directory (no request of its own to save).
    fn open_dir_to_list(&self, parent: &LocalDir, name: &CStr) -> io::Result<LocalDir> {
        Store::open_dir(self, parent, name)
    }
    fn expect_dirs(&self, _root: &LocalDir, _dirs: &[Vec<u8>]) {}
    fn open_ahead(&self, _dir: &LocalDir, _files: &[(&CStr, u64)]) {}

    fn commit_nowait<'a>(
        &'a self,
        dir: &'a LocalDir,
        w: LocalWriter,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> Committing<'a> {
        Committing::done(self.commit(dir, w, name, meta, fsync))
    }

    fn meta_after_commit(&self, _written: &Meta) -> Option<Meta> {
        None
    }

    fn create_empty(
        &self,
        dir: &LocalDir,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<bool> {
        // Created under its name: with no bytes there is nothing half-written
        // to see. A kill before futimens leaves a wrong mtime, which the next
        // run sees and fixes.
        let fd = match rfs::openat(
            &dir.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(meta.mode & 0o777),
        ) {
            Ok(fd) => fd,
            Err(Errno::EXIST) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let res = (|| -> io::Result<()> {
            if self.need_chown(dir, meta) {
                rfs::fchown(&fd, Some(uid(meta.uid)), Some(gid(meta.gid)))?;
            }
            if self.need_chmod(meta.mode) {
                rfs::fchmod(&fd, Mode::from_raw_mode(meta.mode))?;
            }
            rfs::futimens(&fd, &times(meta))?;
            if fsync {
                rfs::fsync(&fd)?;
            }
            Ok(())
        })();
        if let Err(e) = res {
            drop(fd);
            let _ = rfs::unlinkat(&dir.fd, name, AtFlags::empty());
            return Err(e);
        }
        Ok(true)
    }
}
