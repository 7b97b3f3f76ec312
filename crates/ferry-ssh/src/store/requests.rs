//! [`SshStore`]'s own requests: opening it, its connection (made again
//! when lost), and the request shapes the `Store` methods share.

use super::*;
impl SshStore {
    /// The tree at `path` on `target`'s host (connecting, or sharing this
    /// run's connection to it).
    pub fn open(target: &Target, path: &[u8]) -> Result<SshStore, crate::SessionError> {
        Self::open_walking(target, path, false)
    }

    /// [`SshStore::open`]; with `walk`, for a run that walks the tree at
    /// `path`: the ferry there lists it ahead, from its start
    /// ([`conn::connect_walking`]).
    pub fn open_walking(
        target: &Target,
        path: &[u8],
        walk: bool,
    ) -> Result<SshStore, crate::SessionError> {
        Ok(SshStore {
            conn: RwLock::new(conn::connect_walking(target, walk.then_some(path))?),
            target: target.clone(),
            path: path.to_vec(),
            open_xattrs: AtomicU8::new(0),
            refused: AtomicBool::new(false),
            pushes: Default::default(),
            ahead: Arc::default(),
            walk,
            walk_root: AtomicBool::new(walk),
            expected: Mutex::default(),
        })
    }

    /// The connection of this run (the current one).
    pub(super) fn conn(&self) -> Arc<Conn> {
        self.conn.read().clone()
    }

    /// Before a run of a watch: when the connection was lost (ssh or
    /// `ferry serve` gone), make a new one (same target, options, remote
    /// ferry and protocol check as the first) and use it from now on:
    /// `Ok(true)`. Dirs, readers and writers of the lost one keep failing.
    /// `Err`: the host cannot be reached again (one line); the next run
    /// tries again. Never called in the middle of a run.
    pub fn refresh(&self) -> Result<bool, crate::SessionError> {
        let old = self.conn();
        if old.alive().is_ok() {
            return Ok(false);
        }
        let new = conn::reconnect(&self.target, &old)?;
        *self.conn.write() = new;
        Ok(true)
    }

    /// The tree watched by the remote ferry, on a connection of its own,
    /// for `--watch` (`poll`: how often it is polled while it cannot be).
    pub fn watcher(&self, poll: std::time::Duration) -> crate::watch::RemoteWatch {
        crate::watch::RemoteWatch::new(self.conn().target().clone(), self.path.clone(), poll)
    }

    /// Metadata of `path` on the remote (following a final symlink when
    /// `follow`), `None` when it does not exist.
    pub fn stat_path(&self, path: &[u8], follow: bool) -> io::Result<Option<Meta>> {
        meta_of(self.conn().call(&Req::StatPath { path, follow })?.get()?)
    }

    /// [`SshStore::stat_path`] of `path` (a final symlink followed) and,
    /// when it is a directory, its tree opened in the same round trip
    /// ([`Req::StatRoot`]): the first store rooted there opens its root
    /// without another request.
    ///
    /// For a run that walks the tree ([`SshStore::open_walking`]), its
    /// listing is asked right behind (the server opens it in the order the
    /// requests come, protocol 15), one round trip for both; taken by the
    /// walk's first listing of the root, unless a change was asked for
    /// in between (`conn::changes`) or it is older than 3 s (`conn::FRESH`).
    /// On a connection made for that walk both were asked in its first
    /// write (`conn::First`): their answers come with the hello's.
    pub fn stat_root(&self, path: &[u8]) -> io::Result<Option<Meta>> {
        let conn = self.conn();
        // Asked in the connection's first write, when it was made for this
        // run's walk of `path` (`conn::First`).
        let (dir, r, listing) = match conn.take_first(path).filter(|_| self.walk) {
            Some(f) => (f.dir, conn.wait(&f.stat)?, Some((f.at, f.asked, f.list))),
            None => {
                let dir = conn.handle();
                let asked = std::time::Instant::now();
                let rx = conn.start(&Req::StatRoot { path, dir })?;
                let listing = if self.walk && path == self.path.as_slice() {
                    Some((conn::changes(), asked, conn.start(&Req::List { dir })?))
                } else {
                    None
                };
                (dir, conn.wait(&rx)?, listing)
            }
        };
        match r.get()? {
            Resp::Root { meta, opened } => {
                let meta = meta.map(|m| m.0);
                if let (true, Some(m)) = (opened, meta) {
                    conn.opened_root(path, dir, m, listing);
                }
                Ok(meta)
            }
            r => Err(unexpected(&r)),
        }
    }

    /// The directory at `path` opened and listed ahead of the walk
    /// ([`PipelineStore::expect_dirs`](ferry_engine::store::PipelineStore::expect_dirs)),
    /// when it was, on this run's connection, at most [`conn::FRESH`] ago,
    /// and its open succeeded; otherwise (dropped: closed) the walk opens
    /// it as usual. A run changes nothing in a directory before its walk
    /// has listed it (what it writes, removes or links is in directories
    /// it planned; `.ferry-versions` and a backup directory inside DST are
    /// never walked), so that listing is one made a moment earlier, as a
    /// listing made ahead there is ([`Req::ListAhead`]).
    ///
    /// And it must be the directory the walk found: the one its parent's
    /// listing names (device and inode), not one renamed there since, nor
    /// one that was there before and was renamed away (the walk would
    /// then write where the name no longer is).
    pub(super) fn take_expected(&self, path: &[u8]) -> Option<SshDir> {
        let e = self.expected.lock().remove(path)?;
        if !Arc::ptr_eq(&e.dir.conn, &self.conn()) || e.asked.elapsed() > conn::FRESH {
            return None;
        }
        match e.dir.conn.wait(&e.opened).ok()?.get().ok()? {
            Resp::DirOpened { dev, ino } if e.listed == Some((dev, ino)) => Some(e.dir),
            _ => None,
        }
    }

    /// Directory `path`, opened ahead as `handle` on `conn` at `asked`
    /// (`opened`: that open's reply) with its listing asked behind, as
    /// [`SshStore::take_expected`] takes it.
    pub(super) fn expected(
        &self,
        conn: &Arc<Conn>,
        handle: u64,
        path: &[u8],
        opened: Receiver<io::Result<Vec<u8>>>,
        listing: Option<Receiver<io::Result<Vec<u8>>>>,
        asked: std::time::Instant,
    ) -> Expected {
        let mut d = self.dir(handle, path.into());
        d.conn = conn.clone();
        *d.listing.lock() = listing;
        Expected {
            dir: d,
            opened,
            asked,
            listed: None,
        }
    }

    /// A listing of `dir` was read: the identity of each subdirectory
    /// opened ahead ([`SshStore::take_expected`]).
    pub(super) fn saw_dirs(&self, dir: &SshDir, list: &Listing) {
        let mut map = self.expected.lock();
        if map.is_empty() {
            return;
        }
        for e in list.entries() {
            if e.meta.kind != Kind::Dir {
                continue;
            }
            if let Some(x) = map.get_mut(&*join(&dir.path, list.name(e))) {
                x.listed = Some((e.meta.dev, e.meta.ino));
            }
        }
    }

    pub(super) fn dir(&self, id: u64, path: Arc<[u8]>) -> SshDir {
        SshDir {
            conn: self.conn(),
            id,
            path,
            ahead: Mutex::default(),
            listing: Mutex::default(),
        }
    }

    pub(super) fn ok(&self, req: &Req<'_>) -> io::Result<()> {
        match self.conn().call(req)?.get()? {
            Resp::Ok => Ok(()),
            r => Err(unexpected(&r)),
        }
    }

    /// The reply to a commit ([`Req::Put`] or [`Req::Commit`]):
    /// `Bool(false)` is a file committed without the attributes the remote
    /// filesystem refused.
    pub(super) fn confirmed(&self, body: conn::Body) -> io::Result<()> {
        match body.get()? {
            Resp::Ok => Ok(()),
            Resp::Bool(false) => {
                self.refused.store(true, Ordering::Relaxed);
                Ok(())
            }
            r => Err(unexpected(&r)),
        }
    }

    /// Send the data of `src` (up to one byte past `size`) to file `file`
    /// at its offsets, holes left out, then its size: the data segments of
    /// a local file (`SEEK_DATA`), else the blocks of a stream that are not
    /// zeros. Returns the bytes the file has.
    pub(super) fn send_sparse(
        &self,
        file: u64,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        let cap = limit.map_or(CHUNK, |l| l.chunk().clamp(1, CHUNK));
        let stop = size.saturating_add(1);
        let mut buf = vec![0u8; cap];
        let send = |at: u64, data: &[u8]| -> io::Result<()> {
            for (a, b) in ferry_local::data_runs(data) {
                self.conn().send(&Req::WriteAt {
                    file,
                    offset: at + a as u64,
                    data: &data[a..b],
                })?;
            }
            if let Some(l) = limit {
                l.acquire(data.len() as u64);
            }
            Ok(())
        };
        let mut total = 0u64;
        if let Some(fd) = src.as_fd() {
            use rustix::fs::SeekFrom;
            let mut off = 0u64;
            while off < stop {
                let data = match rustix::fs::seek(fd, SeekFrom::Data(off)) {
                    Ok(d) if d < stop => d,
                    Ok(_) | Err(rustix::io::Errno::NXIO) => break,
                    Err(e) => return Err(e.into()),
                };
                let hole = match rustix::fs::seek(fd, SeekFrom::Hole(data)) {
                    Ok(h) => h.min(stop),
                    Err(rustix::io::Errno::NXIO) => break,
                    Err(e) => return Err(e.into()),
                };
                let mut at = data;
                while at < hole {
                    let want = ((hole - at) as usize).min(cap);
                    let n = loop {
                        match rustix::io::pread(fd, &mut buf[..want], at) {
                            Err(rustix::io::Errno::INTR) => continue,
                            r => break r?,
                        }
                    };
                    if n == 0 {
                        break;
                    }
                    send(at, &buf[..n])?;
                    if let Some(p) = src.progress() {
                        p.add(n as u64);
                    }
                    at += n as u64;
                    total = at;
                }
                if at < hole {
                    break;
                }
                off = hole;
            }
            // Holes at the end: the size listed.
            total = total.max(size);
        } else {
            loop {
                let want = ((stop - total) as usize).min(cap);
                let mut n = 0;
                while n < want {
                    match src.read(&mut buf[n..want])? {
                        0 => break,
                        k => n += k,
                    }
                }
                send(total, &buf[..n])?;
                total += n as u64;
                if n < want || total >= stop {
                    break;
                }
            }
        }
        self.conn().send(&Req::SetLen { file, size: total })?;
        Ok(total)
    }

    /// [`Req::GetXattrs`] of `name` in directory handle `dir`, into `out`.
    pub(super) fn xattrs(
        &self,
        dir: u64,
        name: Option<&[u8]>,
        kind: Kind,
        sel: u8,
        out: &mut Xattrs,
    ) -> io::Result<()> {
        let body = self.conn().call(&Req::GetXattrs {
            dir,
            name,
            kind: K(kind),
            sel,
        })?;
        match body.get()? {
            Resp::Xattrs(a) => {
                xattrs_of(&a, out);
                Ok(())
            }
            r => Err(unexpected(&r)),
        }
    }

    pub(super) fn yes(&self, req: &Req<'_>) -> io::Result<bool> {
        match self.conn().call(req)?.get()? {
            Resp::Bool(b) => Ok(b),
            r => Err(unexpected(&r)),
        }
    }

    pub(super) fn root(&self, create: bool) -> io::Result<Option<(SshDir, Meta)>> {
        let conn = self.conn();
        // Opened already while the location was resolved; else, for the
        // walk's root (the first time), as `stat_root` opens it (from the
        // first write's answers when the connection was made for this
        // walk): missing is `None`, with no second request.
        let first = !create && self.walk_root.swap(false, Ordering::Relaxed);
        let mut opened = (!create).then(|| conn.take_root(&self.path)).flatten();
        if opened.is_none() && first {
            if self.stat_root(&self.path)?.is_none() {
                return Ok(None);
            }
            opened = conn.take_root(&self.path);
        }
        if let Some((id, m, listing)) = opened {
            let d = self.dir(id, self.path.as_slice().into());
            // Asked with the open: the walk's first listing of the root,
            // when nothing was asked to change since, and it is fresh.
            if let Some((_, _, rx)) = listing
                .filter(|(at, when, _)| *at == conn::changes() && when.elapsed() <= conn::FRESH)
            {
                *d.listing.lock() = Some(rx);
            }
            return Ok(Some((d, m)));
        }
        let id = self.conn().handle();
        let m = meta_of(
            self.conn()
                .call(&Req::Root {
                    path: &self.path,
                    dir: id,
                    create,
                })?
                .get()?,
        )?;
        Ok(m.map(|m| (self.dir(id, self.path.as_slice().into()), m)))
    }
}

pub(super) fn meta_of(r: Resp<'_>) -> io::Result<Option<Meta>> {
    match r {
        Resp::Meta(m) => Ok(m.map(|m| m.0)),
        r => Err(unexpected(&r)),
    }
}

/// Where `part` (a slice of `whole`) starts in it.
pub(super) fn offset_in(whole: &[u8], part: &[u8]) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}
