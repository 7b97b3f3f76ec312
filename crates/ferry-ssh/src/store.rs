//! [`SshStore`]: the engine's `Store` over a connection to `ferry serve`.
//! Every operation is one request; the engine's workers keep many in
//! flight (`latency_bound`). A small file is read with its open and
//! written with its commit (one request each); a big one is read ahead
//! several chunks at a time and written as a stream of chunks that get no
//! reply, its errors coming back on its commit.
//!
//! A big file read into a store that fetches ranges (the local one) is a
//! [`RangedSource`]: its ranges are read over [`Conn::width`] connections
//! at once, and the local writer's resumable partial keeps what arrived
//! when a run is killed, as for objects in S3.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, RwLock};

use ferry_engine::bwlimit::Limiter;
use ferry_engine::delta::{DiffSummary, OpSink, Signature};
use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::piece::with_piece_buffer;
use ferry_engine::store::{
    Absent, Cleanup, Committing, DeltaRole, Features, ListError, MetaChange, Planned, RangedSource,
    SourceFile, Store,
};
use ferry_engine::xattr::{XattrSel, Xattrs};

use crate::conn::{self, unexpected, Conn, Target};

mod delta;
use crate::proto::{
    attrs, sel_bits, what_bits, xattrs_of, Expect, Req, Resp, CHUNK, INLINE_MAX, K, M, P,
};
use crate::push;

/// Chunks of a big file requested ahead of the reader.
const READ_AHEAD: usize = 4;
/// Bytes of small files opened ahead ([`Store::open_ahead`]) at most, per
/// hint and in all (their content comes with the reply and waits in
/// memory until the file is read).
const AHEAD_HINT: u64 = 2 << 20;
const AHEAD_MAX: u64 = 64 << 20;

/// A tree on another machine, served by `ferry serve` there.
pub struct SshStore {
    /// The connection this run uses: made again by [`SshStore::refresh`]
    /// (between runs of a watch) once it is lost.
    conn: RwLock<Arc<Conn>>,
    /// How it was reached first (the key of this run's connections).
    target: Target,
    path: Vec<u8>,
    /// The attributes a run reads of the files it opens ([`sel_bits`]),
    /// learned from its first [`Store::reader_xattrs`]: later opens bring
    /// them back with the file.
    open_xattrs: AtomicU8,
    /// The remote filesystem refused a committed file's attributes: the
    /// next files' are refused here, so the run's note counts them.
    refused: AtomicBool,
    /// Ranged pushes: how many, bytes sent, bytes an earlier run had sent.
    pushes: [AtomicU64; 3],
    /// Bytes of files opened ahead and not read yet.
    ahead: Arc<AtomicU64>,
}

/// An open remote directory (a handle of the server's) and its path there
/// (big files are opened by path on other connections).
pub struct SshDir {
    conn: Arc<Conn>,
    id: u64,
    path: Arc<[u8]>,
    /// Opens sent ahead ([`Store::open_ahead`]), by name.
    ahead: Mutex<HashMap<Vec<u8>, Ahead>>,
}

/// An open sent ahead of [`Store::open_file`]: the handle it names, the
/// attributes it asked for, its reply to come. Its listed size counts
/// against [`AHEAD_MAX`] until it is taken or dropped.
struct Ahead {
    conn: Arc<Conn>,
    file: u64,
    sel: u8,
    rx: Receiver<io::Result<Vec<u8>>>,
    size: u64,
    held: Arc<AtomicU64>,
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.held.fetch_sub(self.size, Ordering::Relaxed);
    }
}

/// `dir/name`.
pub(crate) fn join(dir: &[u8], name: &[u8]) -> Arc<[u8]> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !p.is_empty() && !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p.into()
}

impl Drop for SshDir {
    fn drop(&mut self) {
        let _ = self.conn.send(&Req::Close { handle: self.id });
    }
}

/// A remote file open for reading.
pub struct SshReader {
    conn: Arc<Conn>,
    /// The server's handle of a big file (a small one came whole).
    file: Option<u64>,
    /// The reply holding the bytes being handed out, and where they are in it.
    body: Vec<u8>,
    span: (usize, usize),
    /// Chunk reads in flight, in order, and the offset of the next one.
    ahead: VecDeque<Receiver<io::Result<Vec<u8>>>>,
    next: u64,
    eof: bool,
    current: Option<(u64, i64, u32)>,
    /// A big file's ranged reads.
    ranged: Option<Ranged>,
    /// The attributes that came with the open (`sel_bits`, values), and
    /// where the file is (directory handle, name) to ask for them otherwise.
    xattrs: (u8, Xattrs),
    at: (u64, Vec<u8>),
}

/// A file open on one connection: the connection and the handle.
type Handle = (Arc<Conn>, u64);

/// A big remote file read in ranges over several connections.
struct Ranged {
    conn: Arc<Conn>,
    /// Its path there, its handle on the first connection.
    path: Arc<[u8]>,
    file: u64,
    /// Size, mtime and inode when opened: the content ranges are read from.
    opened: (u64, i64, u32, u64),
    /// Its handles on the other connections, opened when first needed.
    others: Mutex<Vec<Option<Handle>>>,
    /// The connection of the next range.
    turn: AtomicUsize,
    width: usize,
}

impl Ranged {
    /// The connection and handle for the next range.
    fn next(&self) -> io::Result<Handle> {
        let k = self.turn.fetch_add(1, Ordering::Relaxed) % self.width;
        if k == 0 {
            return Ok((self.conn.clone(), self.file));
        }
        let mut others = self.others.lock().unwrap();
        if others.len() < k {
            others.resize(k, None);
        }
        if let Some(h) = &others[k - 1] {
            return Ok(h.clone());
        }
        let c = self.conn.nth(k);
        if Arc::ptr_eq(&c, &self.conn) {
            return Ok((c, self.file));
        }
        let file = c.handle();
        let body = c.call(&Req::OpenPath {
            path: &self.path,
            file,
        })?;
        match body.get()? {
            Resp::Opened {
                current: Some((size, s, ns)),
                ino,
                ..
            } if (size, s, ns, ino) == self.opened => {}
            Resp::Opened { .. } => {
                let _ = c.send(&Req::Close { handle: file });
                return Err(changed());
            }
            r => return Err(unexpected(&r)),
        }
        others[k - 1] = Some((c.clone(), file));
        Ok((c, file))
    }
}

fn changed() -> io::Error {
    io::Error::other("the file changed while it was copied")
}

impl RangedSource for Ranged {
    fn identity(&self) -> io::Result<(u64, String)> {
        let (size, s, ns, ino) = self.opened;
        Ok((size, format!("ssh:{s}.{ns:09}:{ino}")))
    }

    fn read_range(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
        limit: Option<&Limiter>,
    ) -> io::Result<()> {
        let (conn, file) = self.next()?;
        // The path still names the content opened (a replaced file's
        // handle would read the old one): one round trip per range.
        let now = meta_of(
            conn.call(&Req::StatPath {
                path: &self.path,
                follow: false,
            })?
            .get()?,
        )?;
        match now {
            Some(m) if (m.size, m.mtime_sec, m.mtime_nsec, m.ino) == self.opened => {}
            _ => return Err(changed()),
        }
        let end = offset + len;
        let mut ahead = VecDeque::new();
        let mut next = offset;
        while next < end || !ahead.is_empty() {
            while next < end && ahead.len() < READ_AHEAD {
                let n = (end - next).min(CHUNK as u64) as u32;
                let rx = conn.start(&Req::Read {
                    file,
                    offset: next,
                    len: n,
                })?;
                ahead.push_back((next, n, rx));
                next += u64::from(n);
            }
            let (at, n, rx) = ahead.pop_front().expect("a read in flight");
            let body = conn.wait(&rx)?;
            let (data, zeros) = match body.get()? {
                Resp::Data { data, zeros, .. } => (data, zeros),
                r => return Err(unexpected(&r)),
            };
            let len = if zeros.is_empty() && placed(data, at) {
                // Read into its place ([`proto::read_placed`]): the local
                // writer hands it to the disk with O_DIRECT from there.
                if data.len() < n as usize {
                    return Err(changed());
                }
                out(at, data)?;
                data.len()
            } else {
                // Into the aligned piece buffer, for the same.
                with_piece_buffer(|b| {
                    let len = expand(data, &zeros, b);
                    if len < n as usize {
                        return Err(changed());
                    }
                    out(at, &b[..len])?;
                    Ok(len)
                })?
            };
            conn.recycle(body.0);
            if let Some(l) = limit {
                l.acquire(len as u64);
            }
        }
        Ok(())
    }
}

impl Drop for Ranged {
    fn drop(&mut self) {
        for (c, f) in self.others.get_mut().unwrap().iter().flatten() {
            let _ = c.send(&Req::Close { handle: *f });
        }
    }
}

/// Whether `data`, the bytes of file offset `at`, sit in memory as
/// aligned as that offset is in the file (for an `O_DIRECT` write).
fn placed(data: &[u8], at: u64) -> bool {
    const A: usize = ferry_engine::piece::DIRECT_ALIGN;
    data.as_ptr() as usize % A == (at % A as u64) as usize
}

/// Put the content of a [`Resp::Data`] into `out`: `data` with the runs
/// of `zeros` put in; returns its length.
pub(crate) fn expand(data: &[u8], zeros: &[(u32, u32)], out: &mut [u8]) -> usize {
    let (mut o, mut d) = (0usize, 0usize);
    for &(at, len) in zeros {
        let k = at as usize - o;
        out[o..at as usize].copy_from_slice(&data[d..d + k]);
        d += k;
        out[at as usize..at as usize + len as usize].fill(0);
        o = at as usize + len as usize;
    }
    out[o..o + data.len() - d].copy_from_slice(&data[d..]);
    o + data.len() - d
}

/// A remote file being written.
pub struct SshWriter {
    file: u64,
    /// A small file's content, sent whole with its commit.
    whole: Option<Vec<u8>>,
    /// The source may have holes: only its data is sent, at its offsets.
    sparse: bool,
    /// Its attributes ([`sel_bits`], values), sent with its commit.
    xattrs: Option<(u8, Xattrs)>,
    /// A big file not started yet: its name and metadata. Started by
    /// [`Store::write_from`], as a ranged push ([`crate::push`]) when the
    /// source is a local file, else as one stream.
    later: Option<(CString, Meta)>,
    /// The name exists (`Store::replacing`): said with the commit, so the
    /// remote store skips a first attempt that only works for a new name.
    replacing: bool,
    /// What the commit may replace (`Store::expect`): checked by the
    /// remote store right before its rename.
    expect: Expect,
}

impl SshStore {
    /// The tree at `path` on `target`'s host (connecting, or sharing this
    /// run's connection to it).
    pub fn open(target: &Target, path: &[u8]) -> Result<SshStore, crate::SessionError> {
        Ok(SshStore {
            conn: RwLock::new(conn::connect(target)?),
            target: target.clone(),
            path: path.to_vec(),
            open_xattrs: AtomicU8::new(0),
            refused: AtomicBool::new(false),
            pushes: Default::default(),
            ahead: Arc::default(),
        })
    }

    /// The connection of this run (the current one).
    fn conn(&self) -> Arc<Conn> {
        self.conn.read().unwrap().clone()
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
        *self.conn.write().unwrap() = new;
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

    fn dir(&self, id: u64, path: Arc<[u8]>) -> SshDir {
        SshDir {
            conn: self.conn(),
            id,
            path,
            ahead: Mutex::default(),
        }
    }

    fn ok(&self, req: &Req<'_>) -> io::Result<()> {
        match self.conn().call(req)?.get()? {
            Resp::Ok => Ok(()),
            r => Err(unexpected(&r)),
        }
    }

    /// The reply to a commit ([`Req::Put`] or [`Req::Commit`]):
    /// `Bool(false)` is a file committed without the attributes the remote
    /// filesystem refused.
    fn confirmed(&self, body: conn::Body) -> io::Result<()> {
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
    fn send_sparse(
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
    fn xattrs(
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

    fn yes(&self, req: &Req<'_>) -> io::Result<bool> {
        match self.conn().call(req)?.get()? {
            Resp::Bool(b) => Ok(b),
            r => Err(unexpected(&r)),
        }
    }

    fn root(&self, create: bool) -> io::Result<Option<(SshDir, Meta)>> {
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

fn meta_of(r: Resp<'_>) -> io::Result<Option<Meta>> {
    match r {
        Resp::Meta(m) => Ok(m.map(|m| m.0)),
        r => Err(unexpected(&r)),
    }
}

/// Where `part` (a slice of `whole`) starts in it.
fn offset_in(whole: &[u8], part: &[u8]) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}

impl SshReader {
    /// Keep [`READ_AHEAD`] chunk reads in flight.
    fn fill(&mut self, file: u64) -> io::Result<()> {
        while !self.eof && self.ahead.len() < READ_AHEAD {
            let rx = self.conn.start(&Req::Read {
                file,
                offset: self.next,
                len: CHUNK as u32,
            })?;
            self.ahead.push_back(rx);
            self.next += CHUNK as u64;
        }
        Ok(())
    }
}

impl SourceFile for SshReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let (a, b) = self.span;
            if a < b {
                let n = (b - a).min(buf.len());
                buf[..n].copy_from_slice(&self.body[a..a + n]);
                self.span.0 += n;
                return Ok(n);
            }
            let Some(file) = self.file else {
                return Ok(0);
            };
            if self.eof && self.ahead.is_empty() {
                return Ok(0);
            }
            self.fill(file)?;
            let rx = self.ahead.pop_front().expect("a read in flight");
            let body = self.conn.wait(&rx)?;
            let (span, short, current, full) = match body.get()? {
                Resp::Data {
                    data,
                    current,
                    zeros,
                } if zeros.is_empty() => (
                    (
                        offset_in(&body.0, data),
                        offset_in(&body.0, data) + data.len(),
                    ),
                    data.len() < CHUNK,
                    current,
                    None,
                ),
                Resp::Data {
                    data,
                    current,
                    zeros,
                } => {
                    // Holes: their zeros put back (a local writer skips them).
                    let mut full = vec![0u8; CHUNK + 1];
                    let n = expand(data, &zeros, &mut full);
                    full.truncate(n);
                    ((0, n), n < CHUNK, current, Some(full))
                }
                r => return Err(unexpected(&r)),
            };
            if short && !self.eof {
                // The end: reads past it come back empty and are dropped.
                self.eof = true;
                self.current = current;
                self.ahead.clear();
            }
            let old = std::mem::replace(&mut self.body, full.unwrap_or(body.0));
            self.conn.recycle(old);
            self.span = span;
        }
    }
    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    fn current(&self) -> Option<(u64, i64, u32)> {
        self.current
    }
    fn ranged(&self) -> Option<&dyn RangedSource> {
        self.ranged.as_ref().map(|r| r as &dyn RangedSource)
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl Drop for SshReader {
    fn drop(&mut self) {
        if let Some(f) = self.file {
            let _ = self.conn.send(&Req::Close { handle: f });
        }
        // The last reply's buffer, for the next file's.
        self.conn.recycle(std::mem::take(&mut self.body));
    }
}

mod ext;

impl Store for SshStore {
    type Dir = SshDir;
    type Reader = SshReader;
    type Writer = SshWriter;
    type Delta = SshStore;
    type Xattrs = SshStore;
    type Keep = SshStore;
    type Posix = SshStore;
    type Hashes = Absent;

    fn features(&self) -> Features {
        Features {
            approximate_meta: false,
            latency_bound: true,
            preserves_owner: self.conn().root,
            local_modes: false,
            dir_meta: true,
            inodes: true,
            empty_dirs: true,
            symlinks: true,
            dir_write_lanes: usize::MAX,
            mtime_step_ns: 1,
        }
    }
    fn delta(&self) -> Option<&SshStore> {
        Some(self)
    }
    fn xattrs(&self) -> Option<&SshStore> {
        Some(self)
    }
    fn keeper(&self) -> Option<&SshStore> {
        Some(self)
    }
    fn posix(&self) -> Option<&SshStore> {
        Some(self)
    }
    fn hashes(&self) -> Option<&Absent> {
        None
    }
    fn cleanup(&self) -> Option<&dyn Cleanup> {
        None
    }
    fn refine(
        &self,
        _dir: &SshDir,
        _list: &mut Listing,
        _which: &[usize],
        _errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        Ok(())
    }
    fn meta_after_commit(&self, _written: &Meta) -> Option<Meta> {
        None
    }
    fn sets_symlink_times(&self, _dir: &SshDir, _name: &CStr, _now: &Meta) -> bool {
        true
    }
    fn warnings(&self, _role: &str) -> Vec<String> {
        Vec::new()
    }

    fn open_root(&self) -> io::Result<Option<(SshDir, Meta)>> {
        self.root(false)
    }

    fn create_root(&self) -> io::Result<SshDir> {
        self.root(true)?
            .map(|(d, _)| d)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn list(
        &self,
        dir: &SshDir,
        _rel: &[u8],
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        out.clear();
        let body = self.conn().call(&Req::List { dir: dir.id })?;
        let Resp::Listing {
            names,
            metas,
            errors: errs,
        } = body.get()?
        else {
            return Err(io::Error::other("unexpected reply to a listing"));
        };
        for (name, m) in names.split(|b| *b == 0).zip(metas) {
            out.push(name, m.0);
        }
        for (name, e) in errs {
            errors.push(ListError {
                name: name.to_vec(),
                err: e.into(),
            });
        }
        Ok(())
    }

    fn stat(&self, dir: &SshDir, name: &CStr) -> io::Result<Option<Meta>> {
        meta_of(
            self.conn()
                .call(&Req::Stat {
                    dir: dir.id,
                    name: name.to_bytes(),
                })?
                .get()?,
        )
    }

    fn open_dir(&self, parent: &SshDir, name: &CStr) -> io::Result<SshDir> {
        let new = self.conn().handle();
        self.ok(&Req::OpenDir {
            dir: parent.id,
            name: name.to_bytes(),
            new,
        })?;
        Ok(self.dir(new, join(&parent.path, name.to_bytes())))
    }

    fn make_dir(&self, parent: &SshDir, name: &CStr) -> io::Result<SshDir> {
        let new = self.conn().handle();
        self.ok(&Req::MakeDir {
            dir: parent.id,
            name: name.to_bytes(),
            new,
        })?;
        Ok(self.dir(new, join(&parent.path, name.to_bytes())))
    }

    fn set_dir_meta(&self, dir: &SshDir, meta: &Meta, what: MetaChange) -> io::Result<()> {
        self.ok(&Req::SetDirMeta {
            dir: dir.id,
            meta: M(*meta),
            what: what_bits(what),
        })
    }

    fn open_file(&self, dir: &SshDir, name: &CStr) -> io::Result<SshReader> {
        let ahead = dir.ahead.lock().unwrap().remove(name.to_bytes());
        let (file, sel, body) = match ahead {
            Some(a) => (a.file, a.sel, a.conn.wait(&a.rx)?),
            None => {
                let file = self.conn().handle();
                let sel = self.open_xattrs.load(Ordering::Relaxed);
                let body = self.conn().call(&Req::Open {
                    dir: dir.id,
                    name: name.to_bytes(),
                    file,
                    xattrs: sel,
                })?;
                (file, sel, body)
            }
        };
        let mut x = Xattrs::new();
        let (span, current, big) = match body.get()? {
            Resp::Opened {
                data: Some(d),
                current,
                xattrs,
                ..
            } => {
                xattrs_of(&xattrs, &mut x);
                (
                    (offset_in(&body.0, d), offset_in(&body.0, d) + d.len()),
                    current,
                    None,
                )
            }
            Resp::Opened {
                data: None,
                current,
                ino,
                sparse,
                xattrs,
            } => {
                xattrs_of(&xattrs, &mut x);
                // A file with holes is read in order, its holes not sent,
                // so a local writer keeps them.
                let opened = current.map(|(z, s, ns)| (z, s, ns, ino));
                ((0, 0), None, Some(opened.filter(|_| !sparse)))
            }
            r => return Err(unexpected(&r)),
        };
        let ranged = big.flatten().map(|opened| Ranged {
            conn: self.conn(),
            path: join(&dir.path, name.to_bytes()),
            file,
            opened,
            others: Mutex::new(Vec::new()),
            turn: AtomicUsize::new(0),
            width: self.conn().width(),
        });
        let big = big.is_some();
        Ok(SshReader {
            conn: self.conn(),
            file: big.then_some(file),
            body: body.0,
            span,
            ahead: VecDeque::new(),
            next: 0,
            eof: !big,
            current,
            ranged,
            xattrs: (sel, x),
            at: (dir.id, name.to_bytes().to_vec()),
        })
    }

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

    fn create_file(&self, dir: &SshDir, name: &CStr, meta: &Meta) -> io::Result<SshWriter> {
        self.conn().alive()?;
        let file = self.conn().handle();
        if meta.size <= INLINE_MAX {
            // Holes of a small file travel as zeros, which the remote
            // writer skips.
            return Ok(SshWriter {
                file,
                whole: Some(Vec::with_capacity(meta.size as usize + 1)),
                sparse: false,
                xattrs: None,
                later: None,
                replacing: false,
                expect: None,
            });
        }
        if meta.size >= ferry_local::download::RANGED_MIN && !meta.sparse {
            return Ok(SshWriter {
                file,
                whole: None,
                sparse: false,
                xattrs: None,
                later: Some((name.to_owned(), *meta)),
                replacing: false,
                expect: None,
            });
        }
        self.conn().send(&Req::Create {
            dir: dir.id,
            name: name.to_bytes(),
            meta: M(*meta),
            file,
        })?;
        Ok(SshWriter {
            file,
            whole: None,
            sparse: meta.sparse,
            xattrs: None,
            later: None,
            replacing: false,
            expect: None,
        })
    }

    fn write_from(
        &self,
        dir: &SshDir,
        w: &mut SshWriter,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        if let Some((name, meta)) = w.later.take() {
            if let Some(fd) = src.as_fd() {
                let to = push::Target {
                    dir: dir.id,
                    dir_path: &dir.path,
                    name: &name,
                    file: w.file,
                };
                let (sent, resumed) =
                    push::push(&self.conn(), to, &meta, fd, limit, src.progress())?;
                for (c, n) in self.pushes.iter().zip([1, sent, resumed]) {
                    c.fetch_add(n, Ordering::Relaxed);
                }
                // A file that grew meanwhile shows as longer than listed.
                return Ok(rustix::fs::fstat(fd).map_or(size, |st| st.st_size as u64));
            }
            self.conn().send(&Req::Create {
                dir: dir.id,
                name: name.to_bytes(),
                meta: M(meta),
                file: w.file,
            })?;
        }
        if w.sparse {
            return self.send_sparse(w.file, src, size, limit);
        }
        let mut chunk = Vec::new();
        let whole = w.whole.is_some();
        let buf = match &mut w.whole {
            Some(b) => b,
            None => &mut chunk,
        };
        let cap = limit.map_or(CHUNK, |l| l.chunk().clamp(1, CHUNK));
        let mut total = 0u64;
        loop {
            // One byte past the size at most: growth shows without a
            // second pass.
            let want = ((size - total.min(size)) as usize)
                .saturating_add(1)
                .min(cap);
            let start = if whole { buf.len() } else { 0 };
            if !whole {
                buf.clear();
            }
            buf.resize(start + want, 0);
            let mut n = 0;
            while n < want {
                match src.read(&mut buf[start + n..start + want])? {
                    0 => break,
                    k => n += k,
                }
            }
            buf.truncate(start + n);
            if n > 0 && !whole {
                self.conn().send(&Req::Write {
                    file: w.file,
                    data: buf,
                })?;
            }
            if let Some(l) = limit {
                l.acquire(n as u64);
            }
            total += n as u64;
            if n < want || total > size {
                return Ok(total);
            }
        }
    }

    fn commit(
        &self,
        dir: &SshDir,
        w: SshWriter,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<()> {
        let conn = self.conn();
        let rx = start_commit(&conn, dir, &w, name, meta, fsync)?;
        self.confirmed(conn.wait(&rx)?)
    }

    fn expect(&self, w: &mut SshWriter, at: Option<&Planned>) {
        w.replacing = at.is_some();
        w.expect = Some(at.map(P::from));
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

    fn abort(&self, dir: &SshDir, w: SshWriter) {
        // (A big file not started has nothing there.)
        if w.whole.is_none() && w.later.is_none() {
            let _ = self.conn().send(&Req::Abort {
                dir: dir.id,
                file: w.file,
            });
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

    fn set_meta(&self, dir: &SshDir, name: &CStr, meta: &Meta, what: MetaChange) -> io::Result<()> {
        self.ok(&Req::SetMeta {
            dir: dir.id,
            name: name.to_bytes(),
            meta: M(*meta),
            what: what_bits(what),
        })
    }

    fn remove(&self, dir: &SshDir, name: &CStr, is_dir: bool) -> io::Result<u64> {
        match self
            .conn()
            .call(&Req::Remove {
                dir: dir.id,
                name: name.to_bytes(),
                is_dir,
            })?
            .get()?
        {
            Resp::Count(n) => Ok(n),
            r => Err(unexpected(&r)),
        }
    }

    fn remove_planned(&self, dir: &SshDir, name: &CStr, at: &Planned) -> io::Result<u64> {
        // Checked by the remote store right before its unlink.
        match self
            .conn()
            .call(&Req::RemovePlanned {
                dir: dir.id,
                name: name.to_bytes(),
                at: at.into(),
            })?
            .get()?
        {
            Resp::Count(n) => Ok(n),
            r => Err(unexpected(&r)),
        }
    }

    fn remove_each(
        &self,
        dir: &SshDir,
        name: &CStr,
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64> {
        match self
            .conn()
            .call(&Req::RemoveEach {
                dir: dir.id,
                name: name.to_bytes(),
            })?
            .get()?
        {
            Resp::Removed(v) => {
                for (p, z) in &v {
                    each(p, *z);
                }
                Ok(v.len() as u64)
            }
            r => Err(unexpected(&r)),
        }
    }

    fn rename(
        &self,
        from_dir: &SshDir,
        from_name: &CStr,
        to_dir: &SshDir,
        to_name: &CStr,
    ) -> io::Result<()> {
        self.ok(&Req::Rename {
            from_dir: from_dir.id,
            from: from_name.to_bytes(),
            to_dir: to_dir.id,
            to: to_name.to_bytes(),
        })
    }

    fn rmdir(&self, dir: &SshDir, name: &CStr) -> io::Result<()> {
        self.ok(&Req::Rmdir {
            dir: dir.id,
            name: name.to_bytes(),
        })
    }

    fn notes(&self, role: &str) -> Vec<String> {
        let [n, sent, resumed] = self.pushes.each_ref().map(|c| c.load(Ordering::Relaxed));
        if n == 0 {
            return Vec::new();
        }
        let again = crate::push::RESENT.load(Ordering::Relaxed);
        vec![format!(
            "ssh {role}: {n} big files pushed in ranges over up to {} connections: {sent} bytes sent, {resumed} bytes of interrupted pushes reused, {again} bytes sent again (checked at the end: they differed from the source)",
            self.conn().width()
        )]
    }

    fn free_space(&self, dir: &SshDir) -> Option<(u64, u64)> {
        match dir
            .conn
            .call(&Req::Space { dir: dir.id })
            .ok()?
            .get()
            .ok()?
        {
            Resp::Space { bytes, inodes } => Some((bytes, inodes)),
            _ => None,
        }
    }

    fn open_ahead(&self, dir: &SshDir, files: &[(&CStr, u64)]) {
        // Small files only (they come whole with their open), up to
        // AHEAD_HINT per hint and AHEAD_MAX in all.
        let conn = self.conn();
        let sel = self.open_xattrs.load(Ordering::Relaxed);
        let mut map = dir.ahead.lock().unwrap();
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
}

/// Send the commit of `w` as `name` in `dir`: a small file whole
/// ([`Req::Put`]), a big one's end ([`Req::Commit`]); its reply comes on
/// the receiver.
fn start_commit(
    conn: &Conn,
    dir: &SshDir,
    w: &SshWriter,
    name: &CStr,
    meta: &Meta,
    fsync: bool,
) -> io::Result<Receiver<io::Result<Vec<u8>>>> {
    let xattrs = w.xattrs.as_ref().map(|(sel, x)| (*sel, attrs(x)));
    match &w.whole {
        Some(data) => conn.start(&Req::Put {
            dir: dir.id,
            name: name.to_bytes(),
            meta: M(*meta),
            fsync,
            data,
            xattrs,
            replacing: w.replacing,
            expect: w.expect,
        }),
        None => conn.start(&Req::Commit {
            dir: dir.id,
            file: w.file,
            name: name.to_bytes(),
            meta: M(*meta),
            fsync,
            xattrs,
            replacing: w.replacing,
            expect: w.expect,
        }),
    }
}
