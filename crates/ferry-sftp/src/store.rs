//! [`SftpStore`]: the engine's `Store` over an SFTP session. SFTP names
//! everything by path, so a directory is its path; every operation is one
//! or a few requests, and the engine's workers keep many in flight
//! (`latency_bound`). Reading is in `read.rs`, writing in `write.rs`.

use parking_lot::RwLock;
use std::collections::VecDeque;
use std::ffi::CStr;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::store::{
    temp_name, Absent, Cleanup, Committing, Features, ListError, MetaChange, Planned, Report,
    SourceFile, Store, RESERVED_LEN,
};
use ferry_ssh::Target;

use crate::conn::{self, Conn};
use crate::read::SftpReader;
use crate::wire::{self as w, Attrs, Req, Set};
use crate::write::SftpWriter;

/// `READDIR`s of one directory in flight at first, and at most (the
/// server answers them in order, each with the next batch of names,
/// OpenSSH's of 100): twice as many after each full batch, so a small
/// directory costs a few requests and one of 10,000 names a few round
/// trips.
const READDIR_AHEAD: (usize, usize) = (2, 32);

/// A tree on another machine, reached over SFTP.
pub struct SftpStore {
    /// The session this run uses: made again by [`SftpStore::refresh`]
    /// (between runs of a watch) once it is lost.
    conn: RwLock<Arc<Conn>>,
    /// How it was reached (the key of this run's sessions).
    target: Target,
    pub(crate) root: Vec<u8>,
    /// Keep replaced entries by hard links (`hardlink@openssh.com`).
    pub(crate) hardlink: bool,
    /// Whether the server sets a symlink's own time (`lsetstat@openssh.com`
    /// offered and honoured: tried once per run on a link to be set).
    link_times: std::sync::OnceLock<bool>,
    /// The server offers `lsetstat@openssh.com` but refused it (said once
    /// at the end of the run).
    lsetstat_refused: std::sync::atomic::AtomicBool,
}

/// A directory: its path on the server.
pub struct SftpDir {
    pub(crate) path: Arc<[u8]>,
    /// Small files opened ahead of their reading
    /// ([`PipelineStore::open_ahead`](ferry_engine::store::PipelineStore::open_ahead)).
    ahead: crate::ahead::Map,
}

/// `dir/name` (a name alone in the login directory).
pub(crate) fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !p.is_empty() && !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// A path the server takes: the login directory is `.`.
fn here(p: &[u8]) -> &[u8] {
    if p.is_empty() {
        b"."
    } else {
        p
    }
}

/// A new temporary's path in `dir`.
pub(crate) fn temp_path(dir: &[u8]) -> Vec<u8> {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let id = (u64::from(std::process::id()) << 32) | (n & 0xffff_ffff);
    join(dir, &temp_name(id)[..RESERVED_LEN])
}

/// SFTP times are 32-bit seconds after the epoch.
pub(crate) fn secs(m: &Meta) -> u32 {
    m.mtime_sec.clamp(0, i64::from(u32::MAX)) as u32
}

/// The attributes of `m` that `what` selects.
pub(crate) fn set_of(m: &Meta, what: MetaChange) -> Set {
    Set {
        mode: (what.mode && m.kind != Kind::Symlink).then_some(m.mode & 0o7777),
        mtime: what.mtime.then(|| secs(m)),
        owner: None,
    }
}

/// [`SftpStore::replace`] over session `conn` (the store has no part in it).
pub(crate) fn replace_via(conn: &Conn, dir: &[u8], from: &[u8], to: &[u8]) -> io::Result<()> {
    let ok = |req: Req| conn.call(req)?.ok();
    if conn.ext.posix_rename {
        return ok(Req::ext("posix-rename@openssh.com").str(from).str(to));
    }
    let err = match ok(Req::path(w::RENAME, from).str(to)) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if conn.call(Req::path(w::LSTAT, to))?.attrs_if()?.is_none() {
        return Err(err);
    }
    let aside = temp_path(dir);
    ok(Req::path(w::RENAME, to).str(&aside))?;
    if let Err(e) = ok(Req::path(w::RENAME, from).str(to)) {
        let _ = ok(Req::path(w::RENAME, &aside).str(to));
        return Err(e);
    }
    // A reserved name: if this fails, the next run removes it.
    let _ = ok(Req::path(w::REMOVE, &aside));
    Ok(())
}

impl SftpStore {
    /// The tree at `path` on `target`'s host (connecting, or sharing this
    /// run's session to it). An empty path is the login directory.
    /// A leading `~` or `~user` is that home ([`Conn::expand`]).
    pub fn open(target: &Target, path: &[u8]) -> Result<SftpStore, ferry_ssh::SessionError> {
        SftpStore::connect(target)?.at(path)
    }

    /// A session with `target`'s host, rooted at the login directory.
    pub fn connect(target: &Target) -> Result<SftpStore, ferry_ssh::SessionError> {
        let conn = conn::connect(target)?;
        Ok(SftpStore {
            hardlink: conn.ext.hardlink,
            link_times: std::sync::OnceLock::new(),
            lsetstat_refused: std::sync::atomic::AtomicBool::new(false),
            conn: RwLock::new(conn),
            target: target.clone(),
            root: Vec::new(),
        })
    }

    /// The same session rooted at `path` (a leading `~` or `~user` is
    /// that home: [`Conn::expand`]); `Err`: the one line why not.
    pub fn at(mut self, path: &[u8]) -> Result<SftpStore, ferry_ssh::SessionError> {
        self.root = self
            .conn()
            .expand(path)
            .map_err(|e| format!("{}: {e}", self.target.host))?
            .into_owned();
        Ok(self)
    }

    /// The session of this run (the current one).
    pub(crate) fn conn(&self) -> Arc<Conn> {
        self.conn.read().clone()
    }

    /// Before a run of a watch: when the session was lost (ssh or the
    /// SFTP server gone), make a new one to the same target and use it
    /// from now on: `Ok(true)`. Readers and writers of the lost one keep
    /// failing. `Err`: the host cannot be reached again (one line); the
    /// next run tries again. Never called in the middle of a run.
    pub fn refresh(&self) -> Result<bool, ferry_ssh::SessionError> {
        let old = self.conn();
        if old.alive().is_ok() {
            return Ok(false);
        }
        let new = conn::reconnect(&self.target, &old)?;
        *self.conn.write() = new;
        Ok(true)
    }

    /// The store as on a server without `hardlink@openssh.com` (entries
    /// kept before they are replaced are renamed): for tests.
    #[doc(hidden)]
    pub fn without_hardlink(mut self) -> SftpStore {
        self.hardlink = false;
        self
    }

    /// Metadata of `path` (following a final symlink when `follow`),
    /// `None` when it does not exist. A leading `~` is a home, as in
    /// [`SftpStore::open`].
    pub fn stat_path(&self, path: &[u8], follow: bool) -> io::Result<Option<Meta>> {
        let t = if follow { w::STAT } else { w::LSTAT };
        let conn = self.conn();
        let path = conn.expand(path)?;
        Ok(conn
            .call(Req::path(t, here(&path)))?
            .attrs_if()?
            .map(|a| a.meta()))
    }

    /// `e`, a write into directory `dir` that needed `need` bytes, told
    /// as a full disk when it is one: SFTP version 3 has no code for that
    /// (OpenSSH's sftp-server answers `SSH_FX_FAILURE`, "Failure"), so on
    /// that answer the server's free space is asked (`statvfs@openssh.com`)
    /// and, when less than `need` or no inode is left, the error says so.
    pub(crate) fn full_disk(&self, dir: &[u8], need: u64, e: io::Error) -> io::Error {
        let conn = self.conn();
        if !conn.ext.statvfs || w::status_code(&e) != Some(w::FX_FAILURE) {
            return e;
        }
        match self.statvfs(dir) {
            // Within 1 MiB of what it needs: the temporaries of the other
            // files that failed at the same time are gone by now, so the
            // space seen free may be a little more than the file needed.
            Ok((bytes, inodes)) if bytes < need.saturating_add(1 << 20) || inodes == 0 => {
                io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!(
                    "No space left on device ({e}; {bytes} bytes and {inodes} inodes free there)"
                ),
                )
            }
            _ => e,
        }
    }

    /// Bytes and inodes free for this user on the filesystem of `dir`
    /// (`statvfs@openssh.com`).
    fn statvfs(&self, dir: &[u8]) -> io::Result<(u64, u64)> {
        let conn = self.conn();
        if !conn.ext.statvfs {
            return Err(io::ErrorKind::Unsupported.into());
        }
        let reply = conn.call(Req::ext("statvfs@openssh.com").str(here(dir)))?;
        let mut r = reply.extended()?;
        let (_bsize, frsize) = (r.u64()?, r.u64()?);
        let (_blocks, _bfree, bavail) = (r.u64()?, r.u64()?, r.u64()?);
        let (_files, _ffree, favail) = (r.u64()?, r.u64()?, r.u64()?);
        Ok((bavail.saturating_mul(frsize), favail))
    }

    pub(crate) fn ok(&self, req: Req) -> io::Result<()> {
        self.conn().call(req)?.ok()
    }

    fn lstat(&self, path: &[u8]) -> io::Result<Option<Attrs>> {
        self.conn().call(Req::path(w::LSTAT, path))?.attrs_if()
    }

    fn dir(&self, path: Vec<u8>) -> SftpDir {
        SftpDir {
            path: path.into(),
            ahead: Default::default(),
        }
    }

    /// Rename `from` to `to`, replacing `to` (a file or symlink)
    /// atomically where the server offers `posix-rename@openssh.com`.
    /// Elsewhere SFTP's rename never replaces: the old `to` is moved aside
    /// to a temporary name first, put back if the rename fails, and
    /// removed after it.
    pub(crate) fn replace(&self, dir: &[u8], from: &[u8], to: &[u8]) -> io::Result<()> {
        self.replace_on(&self.conn(), dir, from, to)
    }

    /// [`SftpStore::replace`] over session `conn`.
    pub(crate) fn replace_on(
        &self,
        conn: &Conn,
        dir: &[u8],
        from: &[u8],
        to: &[u8],
    ) -> io::Result<()> {
        replace_via(conn, dir, from, to)
    }

    /// Every entry of directory `path`, as the server lists them (names
    /// with their attributes: no request per entry).
    fn read_dir(&self, path: &[u8], mut each: impl FnMut(&[u8], Attrs)) -> io::Result<()> {
        let h = self
            .conn()
            .call(Req::path(w::OPENDIR, here(path)))?
            .handle()?;
        let res = (|| {
            let mut ahead = VecDeque::new();
            let mut want = READDIR_AHEAD.0;
            loop {
                while ahead.len() < want {
                    ahead.push_back(self.conn().start(Req::path(w::READDIR, &h))?);
                }
                let rx = ahead.pop_front().expect("in flight");
                let reply = self.conn().wait(&rx)?;
                match reply.names()? {
                    Some(v) => {
                        want = (want * 2).min(READDIR_AHEAD.1);
                        for (name, a) in v {
                            if name != b"." && name != b".." {
                                each(name, a);
                            }
                        }
                    }
                    // The end (the reads still in flight answer the same).
                    None => return Ok(()),
                }
            }
        })();
        self.conn().send(Req::path(w::CLOSE, &h));
        res
    }

    /// Remove the tree `path` (a directory), telling `each` about every
    /// entry removed (its path below `rel`, its size); the files of one
    /// directory are removed with all their requests in flight.
    fn remove_tree(
        &self,
        path: &[u8],
        rel: &[u8],
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64> {
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        self.read_dir(path, |name, a| {
            let m = a.meta();
            if m.kind == Kind::Dir {
                dirs.push(name.to_vec());
            } else {
                files.push((name.to_vec(), m.size));
            }
        })?;
        let mut n = 0;
        for d in dirs {
            n += self.remove_tree(&join(path, &d), &join(rel, &d), each)?;
        }
        let started = files
            .iter()
            .map(|(f, _)| self.conn().start(Req::path(w::REMOVE, &join(path, f))))
            .collect::<Vec<_>>();
        let mut first = None;
        for ((f, size), rx) in files.iter().zip(started) {
            match rx.and_then(|rx| self.conn().wait(&rx)?.ok()) {
                Ok(()) => {
                    each(&join(rel, f), *size);
                    n += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first {
            return Err(e);
        }
        self.rmdir_path(path)?;
        each(rel, 0);
        Ok(n + 1)
    }

    /// `lsetstat@openssh.com` of symlink `path`: the time of `set` (a
    /// link's mode is its own on Linux, never set). A refusal (an answer,
    /// not a lost session) is noted and the link's time left as made.
    fn lsetstat(&self, path: &[u8], set: &Set) -> io::Result<()> {
        let times = Set {
            mode: None,
            owner: None,
            ..*set
        };
        match self.ok(Req::ext("lsetstat@openssh.com").str(path).attrs(&times)) {
            Err(e) if w::status_code(&e).is_some() => {
                self.lsetstat_refused.store(true, Ordering::Relaxed);
                Ok(())
            }
            r => r,
        }
    }

    /// `RMDIR`, its failure told apart: SFTP says only "failure" for a
    /// directory that is not empty.
    fn rmdir_path(&self, path: &[u8]) -> io::Result<()> {
        match self.ok(Req::path(w::RMDIR, path)) {
            Err(e) if e.kind() == io::ErrorKind::Other => {
                let mut any = false;
                if self.read_dir(path, |_, _| any = true).is_ok() && any {
                    return Err(io::Error::new(
                        io::ErrorKind::DirectoryNotEmpty,
                        format!("{}: directory not empty", String::from_utf8_lossy(path)),
                    ));
                }
                Err(e)
            }
            r => r,
        }
    }

    /// `SETSTAT` of a path, or of a symlink itself (`lsetstat@openssh.com`;
    /// a symlink's time is left as made where the server cannot).
    pub(crate) fn set_path(&self, path: &[u8], kind: Kind, set: &Set) -> io::Result<()> {
        if kind == Kind::Symlink {
            if set.mtime.is_none()
                || !self.conn().ext.lsetstat
                || self.lsetstat_refused.load(Ordering::Relaxed)
            {
                return Ok(());
            }
            return self.lsetstat(path, set);
        }
        self.ok(Req::path(w::SETSTAT, path).attrs(set))
    }
}

impl Store for SftpStore {
    type Dir = SftpDir;
    type Reader = SftpReader;
    type Writer = SftpWriter;
    type Delta = Absent;
    type Xattrs = Absent;
    type Keep = SftpStore;
    type Posix = Absent;
    type Hashes = Absent;
    type Links = SftpStore;
    type Pipeline = SftpStore;

    fn features(&self) -> Features {
        Features {
            approximate_meta: false,
            latency_bound: true,
            preserves_owner: false,
            local_modes: false,
            dir_meta: true,
            inodes: false,
            empty_dirs: true,
            dir_write_lanes: usize::MAX,
            mtime_step_ns: 1_000_000_000,
        }
    }
    fn delta(&self) -> Option<&Absent> {
        None
    }
    fn xattrs(&self) -> Option<&Absent> {
        None
    }
    fn keeper(&self) -> Option<&SftpStore> {
        Some(self)
    }
    fn posix(&self) -> Option<&Absent> {
        None
    }
    fn hashes(&self) -> Option<&Absent> {
        None
    }
    fn links(&self) -> Option<&SftpStore> {
        Some(self)
    }
    fn pipeline(&self) -> Option<&SftpStore> {
        Some(self)
    }
    fn cleanup(&self) -> Option<&dyn Cleanup> {
        None
    }
    fn refine(
        &self,
        _dir: &SftpDir,
        _list: &mut Listing,
        _which: &[usize],
        _errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        Ok(())
    }

    fn open_root(&self) -> io::Result<Option<(SftpDir, Meta)>> {
        match self.stat_path(&self.root, true)? {
            None => Ok(None),
            Some(m) if m.kind == Kind::Dir => Ok(Some((self.dir(self.root.clone()), m))),
            Some(_) => Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{}: not a directory", String::from_utf8_lossy(&self.root)),
            )),
        }
    }

    fn create_root(&self) -> io::Result<SftpDir> {
        match self.ok(Req::path(w::MKDIR, here(&self.root)).attrs(&Set::default())) {
            Ok(()) => {}
            Err(e) => match self.stat_path(&self.root, true)? {
                Some(m) if m.kind == Kind::Dir => {}
                _ => return Err(e),
            },
        }
        Ok(self.dir(self.root.clone()))
    }

    fn list(
        &self,
        dir: &SftpDir,
        _rel: &[u8],
        out: &mut Listing,
        _errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        out.clear();
        self.read_dir(&dir.path, |name, a| out.push(name, a.meta()))?;
        out.sort();
        Ok(())
    }

    fn stat(&self, dir: &SftpDir, name: &CStr) -> io::Result<Option<Meta>> {
        Ok(self
            .lstat(&join(&dir.path, name.to_bytes()))?
            .map(|a| a.meta()))
    }

    fn open_dir(&self, parent: &SftpDir, name: &CStr) -> io::Result<SftpDir> {
        let p = join(&parent.path, name.to_bytes());
        match self
            .conn()
            .call(Req::path(w::STAT, &p))?
            .attrs()?
            .meta()
            .kind
        {
            Kind::Dir => Ok(self.dir(p)),
            _ => Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{}: not a directory", String::from_utf8_lossy(&p)),
            )),
        }
    }

    fn make_dir(&self, parent: &SftpDir, name: &CStr) -> io::Result<SftpDir> {
        let p = join(&parent.path, name.to_bytes());
        let set = Set {
            mode: Some(0o700),
            ..Set::default()
        };
        if let Err(e) = self.ok(Req::path(w::MKDIR, &p).attrs(&set)) {
            if e.kind() == io::ErrorKind::Other && self.lstat(&p)?.is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists", String::from_utf8_lossy(&p)),
                ));
            }
            return Err(e);
        }
        Ok(self.dir(p))
    }

    fn set_dir_meta(&self, dir: &SftpDir, meta: &Meta, what: MetaChange) -> io::Result<()> {
        let set = set_of(meta, what);
        if set.mode.is_none() && set.mtime.is_none() {
            return Ok(());
        }
        self.ok(Req::path(w::SETSTAT, here(&dir.path)).attrs(&set))
    }

    fn open_file(&self, dir: &SftpDir, name: &CStr) -> io::Result<SftpReader> {
        if let Some(a) = crate::ahead::take(&dir.ahead, name) {
            return SftpReader::ahead(a);
        }
        SftpReader::open(&self.conn(), join(&dir.path, name.to_bytes()))
    }

    fn create_file(&self, dir: &SftpDir, name: &CStr, meta: &Meta) -> io::Result<SftpWriter> {
        SftpWriter::create(self, &dir.path, name.to_bytes(), meta)
            .map_err(|e| self.full_disk(&dir.path, meta.size, e))
    }

    fn write_from(
        &self,
        dir: &SftpDir,
        wr: &mut SftpWriter,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        wr.write_from(self, src, size, limit)
            .map_err(|e| self.full_disk(&dir.path, size, e))
    }

    fn commit(
        &self,
        dir: &SftpDir,
        wr: SftpWriter,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<()> {
        wr.commit(self, &join(&dir.path, name.to_bytes()), meta, fsync)
            .map_err(|e| self.full_disk(&dir.path, meta.size, e))
    }

    fn expect(&self, wr: &mut SftpWriter, at: Option<&Planned>) {
        wr.planned = at.copied();
    }

    fn remove_planned(&self, dir: &SftpDir, name: &CStr, at: &Planned) -> io::Result<u64> {
        let p = join(&dir.path, name.to_bytes());
        let conn = self.conn();
        crate::write::check_planned(&conn, &p, at)?;
        conn.call(Req::path(w::REMOVE, &p))?.ok()?;
        Ok(1)
    }

    fn abort(&self, _dir: &SftpDir, wr: SftpWriter) {
        wr.abort();
    }

    fn set_meta(
        &self,
        dir: &SftpDir,
        name: &CStr,
        meta: &Meta,
        what: MetaChange,
    ) -> io::Result<()> {
        let set = set_of(meta, what);
        if set.mode.is_none() && set.mtime.is_none() {
            return Ok(());
        }
        self.set_path(&join(&dir.path, name.to_bytes()), meta.kind, &set)
    }

    fn remove(&self, dir: &SftpDir, name: &CStr, _is_dir: bool) -> io::Result<u64> {
        self.remove_each(dir, name, &mut |_, _| {})
    }

    fn remove_each(
        &self,
        dir: &SftpDir,
        name: &CStr,
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64> {
        let p = join(&dir.path, name.to_bytes());
        let Some(a) = self.lstat(&p)? else {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        };
        let m = a.meta();
        if m.kind == Kind::Dir {
            return self.remove_tree(&p, b"", each);
        }
        self.ok(Req::path(w::REMOVE, &p))?;
        each(b"", m.size);
        Ok(1)
    }

    fn rename(
        &self,
        from_dir: &SftpDir,
        from_name: &CStr,
        to_dir: &SftpDir,
        to_name: &CStr,
    ) -> io::Result<()> {
        let to = join(&to_dir.path, to_name.to_bytes());
        // SFTP's own rename never replaces an entry.
        match self.ok(Req::path(w::RENAME, &join(&from_dir.path, from_name.to_bytes())).str(&to)) {
            Err(e) if e.kind() == io::ErrorKind::Other && self.lstat(&to)?.is_some() => {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists", String::from_utf8_lossy(&to)),
                ))
            }
            r => r,
        }
    }

    fn rmdir(&self, dir: &SftpDir, name: &CStr) -> io::Result<()> {
        self.rmdir_path(&join(&dir.path, name.to_bytes()))
    }

    fn free_space(&self, dir: &SftpDir) -> Option<(u64, u64)> {
        self.statvfs(&dir.path).ok()
    }

    fn report(&self, role: &str) -> Report {
        let warnings = match self.lsetstat_refused.load(Ordering::Relaxed) {
            false => Vec::new(),
            true => vec![format!(
                "note: {}: the SFTP server offers lsetstat@openssh.com but refused it: symlinks there keep the time they were made",
                self.conn().host
            )],
        };
        Report {
            warnings,
            notes: crate::write::notes(role),
        }
    }
}

mod ext;
