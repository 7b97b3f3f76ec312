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

use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::delta::{DiffSummary, OpSink, Signature};
use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::piece::with_piece_buffer;
use ferry_engine::store::{
    Absent, Cleanup, Committing, DeltaRole, Features, ListError, MetaChange, Planned, RangedSource,
    Report, SourceFile, Store,
};
use ferry_engine::xattr::{XattrSel, Xattrs};

use crate::conn::{self, unexpected, Conn, Target};

mod delta;
mod reader;
mod requests;
use crate::proto::{
    attrs, sel_bits, what_bits, xattrs_of, Expect, Req, Resp, CHUNK, INLINE_MAX, K, M, P,
};
use crate::push;
pub(crate) use reader::expand;
use reader::Ranged;
pub use reader::SshReader;
use requests::{meta_of, offset_in};

/// Chunks of a big file requested ahead of the reader.
const READ_AHEAD: usize = 4;
/// Bytes of small files opened ahead
/// ([`PipelineStore::open_ahead`](ferry_engine::store::PipelineStore::open_ahead)) at most, per
/// hint and in all (their content comes with the reply and waits in memory until the file is read).
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
    /// The run walks the tree at `path`: its root's listing is asked right
    /// behind its [`Req::StatRoot`].
    walk: bool,
    /// The first [`Store::open_root`] of a store opened for a walk that
    /// no location's resolving opened (a bisync's replica): it takes what
    /// the connection's first write asked (`StatRoot`, `List`), as
    /// [`SshStore::stat_root`] does, not a `Root` of its own. Once.
    walk_root: AtomicBool,
    /// Directories opened and listed ahead of the walk, by path
    /// ([`PipelineStore::expect_dirs`](ferry_engine::store::PipelineStore::expect_dirs)).
    expected: Mutex<HashMap<Arc<[u8]>, Expected>>,
}

/// Directories opened and listed ahead of the walk at most, per run: each
/// holds a descriptor there until the walk is done with it (the server's
/// limit is often 1024).
const EXPECT_DIRS: usize = 256;

/// A directory opened and listed ahead of the walk: the handle (closed
/// when dropped unused), the open's reply to come (its listing's is the
/// handle's), when they were asked, and the directory's device and inode
/// as its parent's listing gives them (once the walk has that listing).
struct Expected {
    dir: SshDir,
    opened: Receiver<io::Result<Vec<u8>>>,
    asked: std::time::Instant,
    listed: Option<(u64, u64)>,
}

/// An open remote directory (a handle of the server's) and its path there
/// (big files are opened by path on other connections).
pub struct SshDir {
    conn: Arc<Conn>,
    id: u64,
    path: Arc<[u8]>,
    /// Opens sent ahead
    /// ([`PipelineStore::open_ahead`](ferry_engine::store::PipelineStore::open_ahead)), by name.
    ahead: Mutex<HashMap<Vec<u8>, Ahead>>,
    /// Its listing, asked right behind its open
    /// ([`PipelineStore::open_dir_to_list`](ferry_engine::store::PipelineStore::open_dir_to_list)),
    /// until [`Store::list`] takes it.
    listing: Mutex<Option<Receiver<io::Result<Vec<u8>>>>>,
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
        self.conn.close_dir(self.id);
    }
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
    type Links = SshStore;
    type Pipeline = SshStore;

    fn features(&self) -> Features {
        Features {
            approximate_meta: false,
            latency_bound: true,
            preserves_owner: self.conn().root,
            local_modes: false,
            dir_meta: true,
            inodes: true,
            empty_dirs: true,
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
    fn links(&self) -> Option<&SshStore> {
        Some(self)
    }
    fn pipeline(&self) -> Option<&SshStore> {
        Some(self)
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
        let asked = dir.listing.lock().take();
        let body = match asked {
            Some(rx) => dir.conn.wait(&rx)?,
            None => self.conn().call(&Req::List { dir: dir.id })?,
        };
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
        self.saw_dirs(dir, out);
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
        let ahead = dir.ahead.lock().remove(name.to_bytes());
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

    fn abort(&self, dir: &SshDir, w: SshWriter) {
        // (A big file not started has nothing there.)
        if w.whole.is_none() && w.later.is_none() {
            let _ = self.conn().send(&Req::Abort {
                dir: dir.id,
                file: w.file,
            });
        }
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

    fn report(&self, role: &str) -> Report {
        let [n, sent, resumed] = self.pushes.each_ref().map(|c| c.load(Ordering::Relaxed));
        let notes = match n {
            0 => Vec::new(),
            _ => vec![format!(
                "ssh {role}: {n} big files pushed in ranges over up to {} connections: {sent} bytes sent, {resumed} bytes of interrupted pushes reused, {} bytes sent again (checked at the end: they differed from the source)",
                self.conn().width(),
                crate::push::RESENT.load(Ordering::Relaxed)
            )],
        };
        Report {
            warnings: Vec::new(),
            notes,
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
