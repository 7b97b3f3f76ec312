//! The extensions the SSH store has (`ferry serve` at the far end is a
//! local store there): deltas made at the far end, extended attributes and
//! ACLs, keeping replaced entries, the POSIX-only operations, symlinks,
//! and the pipeline (opens sent ahead, commits not waited for, an empty
//! file made in one request).

use super::*;
use ferry_engine::store::{
    DeltaStore, KeepStore, LinkStore, PipelineStore, PosixStore, XattrStore,
};

impl DeltaStore<SshStore> for SshStore {
    fn role(&self) -> DeltaRole {
        DeltaRole::Remote
    }
    fn delta_signature(
        &self,
        dir: &SshDir,
        name: &CStr,
        min: u64,
    ) -> io::Result<Option<Signature>> {
        self.sign(dir, name, min)
    }
    fn delta_write(
        &self,
        dir: &SshDir,
        w: &mut SshWriter,
        old: &CStr,
        sig: &Signature,
        feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
    ) -> io::Result<DiffSummary> {
        self.patch(dir, w, old, sig, feed)
    }
    fn delta_diff(
        &self,
        r: &mut dyn SourceFile,
        sig: &Signature,
        sink: &mut dyn OpSink,
    ) -> io::Result<DiffSummary> {
        self.diff(r, sig, sink)
    }
    fn delta_inplace<'a>(
        &'a self,
        dir: &'a SshDir,
        name: &CStr,
        old: &Meta,
        l: &ferry_engine::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<Option<Box<dyn ferry_engine::delta::InPlace + 'a>>> {
        self.inplace(dir, name, old, l, key)
    }
    fn inplace_hashes(
        &self,
        r: &mut dyn SourceFile,
        l: &ferry_engine::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<ferry_engine::delta::PatchHashes> {
        self.block_hashes(r, l, key)
    }
    fn read_at(&self, r: &mut dyn SourceFile, at: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.read_at_(r, at, buf)
    }
    fn open_append<'a>(
        &'a self,
        _dir: &'a SshDir,
        _name: &CStr,
        _old: &Meta,
    ) -> io::Result<Option<Box<dyn ferry_engine::store::AppendFile + 'a>>> {
        // Not over `ferry serve` yet: a growing file goes the usual way.
        Ok(None)
    }
}

impl XattrStore<SshStore> for SshStore {
    fn caps(&self) -> XattrSel {
        XattrSel::ALL
    }
    fn get_xattrs(
        &self,
        dir: &SshDir,
        name: Option<&CStr>,
        kind: Kind,
        sel: XattrSel,
        out: &mut Xattrs,
    ) -> io::Result<()> {
        self.xattrs(dir.id, name.map(CStr::to_bytes), kind, sel_bits(sel), out)
    }
    fn reader_xattrs(&self, r: &SshReader, sel: XattrSel, out: &mut Xattrs) -> io::Result<()> {
        let bits = sel_bits(sel);
        if r.xattrs.0 == bits {
            out.clone_from(&r.xattrs.1);
            return Ok(());
        }
        // Opened before the run asked: by name, this once; the next opens
        // bring them.
        self.open_xattrs.store(bits, Ordering::Relaxed);
        self.xattrs(r.at.0, Some(&r.at.1), Kind::File, bits, out)
    }
    fn set_xattrs(
        &self,
        dir: &SshDir,
        name: Option<&CStr>,
        meta: &Meta,
        sel: XattrSel,
        want: &Xattrs,
        have: Option<&Xattrs>,
    ) -> io::Result<()> {
        self.ok(&Req::SetXattrs {
            dir: dir.id,
            name: name.map(CStr::to_bytes),
            meta: M(*meta),
            sel: sel_bits(sel),
            want: attrs(want),
            have: have.map(attrs),
        })
    }
    fn set_writer_xattrs(
        &self,
        _dir: &SshDir,
        w: &mut SshWriter,
        _meta: &Meta,
        sel: XattrSel,
        want: &Xattrs,
    ) -> io::Result<()> {
        if self.refused.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        // Sent with the commit, which sets them before the file is named.
        w.xattrs = Some((sel_bits(sel), want.clone()));
        Ok(())
    }
}

impl KeepStore<SshStore> for SshStore {
    fn keeps_at(&self, _base: &KeepBase) -> bool {
        true
    }
    fn keep(&self, dir: &SshDir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
        // `ferry serve` keeps it as a local run would (a hard link when
        // replacing, a rename when removing): one round trip.
        let (abs, base) = match to.base {
            KeepBase::Root(b) => (false, b),
            KeepBase::Abs(b) => (true, b),
        };
        self.ok(&Req::Keep {
            dir: dir.id,
            name: name.to_bytes(),
            root: &self.path,
            abs,
            base,
            path: to.path,
            overwrite: to.overwrite,
            replacing: to.replacing,
            planned: to.planned.as_ref().map(P::from),
        })
    }
}

impl PosixStore<SshStore> for SshStore {
    fn hard_links(&self) -> bool {
        true
    }
    fn link(
        &self,
        from_dir: &SshDir,
        from_name: &CStr,
        dir: &SshDir,
        name: &CStr,
    ) -> io::Result<()> {
        self.ok(&Req::Link {
            from_dir: from_dir.id,
            from_name: from_name.to_bytes(),
            dir: dir.id,
            name: name.to_bytes(),
        })
    }
    fn special(&self) -> bool {
        true
    }
    fn create_special(
        &self,
        dir: &SshDir,
        name: &CStr,
        meta: &Meta,
        replace: bool,
    ) -> io::Result<()> {
        self.ok(&Req::Special {
            dir: dir.id,
            name: name.to_bytes(),
            meta: M(*meta),
            replace,
        })
    }
    fn is_own_legacy_partial(&self, dir: &SshDir, name: &CStr) -> bool {
        self.yes(&Req::OwnLegacyPartial {
            dir: dir.id,
            name: name.to_bytes(),
        })
        .unwrap_or(false)
    }
    fn make_writable(&self, dir: &SshDir) -> io::Result<bool> {
        self.yes(&Req::MakeWritable { dir: dir.id })
    }
    fn root_identities(&self) -> Option<ferry_engine::walk::RootIds> {
        None
    }
}

impl LinkStore<SshStore> for SshStore {
    fn read_link(&self, dir: &SshDir, name: &CStr) -> io::Result<Vec<u8>> {
        match self
            .conn()
            .call(&Req::ReadLink {
                dir: dir.id,
                name: name.to_bytes(),
            })?
            .get()?
        {
            Resp::Bytes(b) => Ok(b.to_vec()),
            r => Err(unexpected(&r)),
        }
    }
    fn create_symlink(
        &self,
        dir: &SshDir,
        name: &CStr,
        target: &[u8],
        meta: &Meta,
    ) -> io::Result<()> {
        self.ok(&Req::Symlink {
            dir: dir.id,
            name: name.to_bytes(),
            target,
            meta: M(*meta),
        })
    }
    fn sets_symlink_times(&self, _dir: &SshDir, _name: &CStr, _now: &Meta) -> bool {
        true
    }
}

impl PipelineStore<SshStore> for SshStore {
    fn open_dir_to_list(&self, parent: &SshDir, name: &CStr) -> io::Result<SshDir> {
        if let Some(d) = self.take_expected(&join(&parent.path, name.to_bytes())) {
            return Ok(d);
        }
        // Its `List` right behind its `OpenDir`: `ferry serve` opens
        // directories in the order the requests come (protocol 14), so the
        // listing finds the handle, and both replies come in one round
        // trip. The open's answer is waited for, as `open_dir` does: its
        // error is this call's (the listing's, of a handle never made, is
        // dropped).
        let conn = self.conn();
        let new = conn.handle();
        let opened = conn.start(&Req::OpenDir {
            dir: parent.id,
            name: name.to_bytes(),
            new,
        })?;
        let listed = conn.start(&Req::List { dir: new }).ok();
        match conn.wait(&opened)?.get()? {
            Resp::Ok => {}
            r => return Err(unexpected(&r)),
        }
        let mut d = self.dir(new, join(&parent.path, name.to_bytes()));
        // (The connection both went on, if the store has another since.)
        d.conn = conn;
        *d.listing.lock() = listed;
        Ok(d)
    }
    fn expect_dirs(&self, root: &SshDir, dirs: &[Vec<u8>]) {
        // Each `OpenDir` names its parent's handle, opened by the request
        // before it (`ferry serve` opens directories in the order the
        // requests come), and its `List` comes right behind: the tree's
        // levels in one round trip. A directory whose parent is not here
        // is left to the walk.
        let conn = root.conn.clone();
        let mut map = self.expected.lock();
        // The last hint's directories not taken: closed.
        map.clear();
        let mut ids: HashMap<Vec<u8>, u64> = HashMap::new();
        // Those asked in the connection's first flight, for this root (the
        // same directories by the same rules, asked earlier).
        if !dirs.is_empty() {
            for f in conn.take_first_dirs(&root.path, root.id) {
                let path = join(&root.path, &f.rel);
                let e = self.expected(&conn, f.handle, &path, f.opened, Some(f.listed), f.asked);
                ids.insert(f.rel, f.handle);
                map.insert(path, e);
            }
        }
        for rel in dirs {
            if map.len() >= EXPECT_DIRS {
                break;
            }
            let Some((parent, name)) = conn::chained(rel, root.id, |p| ids.get(p).copied()) else {
                continue;
            };
            let path = join(&root.path, rel);
            if map.contains_key(&path) {
                continue;
            }
            let new = conn.handle();
            let Ok(opened) = conn.start(&Req::OpenDirAhead {
                dir: parent,
                name,
                new,
            }) else {
                return;
            };
            let listed = conn.start(&Req::List { dir: new }).ok();
            let e = self.expected(&conn, new, &path, opened, listed, std::time::Instant::now());
            ids.insert(rel.clone(), new);
            map.insert(path, e);
        }
    }
    fn open_ahead(&self, dir: &SshDir, files: &[(&CStr, u64)]) {
        // Small files only (they come whole with their open), up to
        // AHEAD_HINT per hint and AHEAD_MAX in all.
        let conn = self.conn();
        let sel = self.open_xattrs.load(Ordering::Relaxed);
        let mut map = dir.ahead.lock();
        let mut sum = 0u64;
        for &(name, size) in files {
            if size > INLINE_MAX {
                continue;
            }
            if sum + size > AHEAD_HINT {
                break;
            }
            if self.ahead.fetch_add(size, Ordering::Relaxed) + size > AHEAD_MAX {
                self.ahead.fetch_sub(size, Ordering::Relaxed);
                break;
            }
            sum += size;
            let file = conn.handle();
            let rx = conn.start(&Req::Open {
                dir: dir.id,
                name: name.to_bytes(),
                file,
                xattrs: sel,
            });
            let Ok(rx) = rx else {
                self.ahead.fetch_sub(size, Ordering::Relaxed);
                break;
            };
            let a = Ahead {
                conn: conn.clone(),
                file,
                sel,
                rx,
                size,
                held: self.ahead.clone(),
            };
            map.insert(name.to_bytes().to_vec(), a);
        }
    }
    fn commit_nowait<'a>(
        &'a self,
        dir: &'a SshDir,
        w: SshWriter,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> Committing<'a> {
        // Sent now; the reply is taken by the connection's reader thread
        // and waited for by whoever reports the file.
        let conn = self.conn();
        match start_commit(&conn, dir, &w, name, meta, fsync) {
            Ok(rx) => Committing::later(move || self.confirmed(conn.wait(&rx)?)),
            Err(e) => Committing::done(Err(e)),
        }
    }
    fn meta_after_commit(&self, _written: &Meta) -> Option<Meta> {
        None
    }
    fn create_empty(
        &self,
        dir: &SshDir,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<bool> {
        self.yes(&Req::CreateEmpty {
            dir: dir.id,
            name: name.to_bytes(),
            meta: M(*meta),
            fsync,
        })
    }
}
