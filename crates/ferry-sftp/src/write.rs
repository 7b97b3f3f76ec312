//! Writing over SFTP: a file is written under a temporary name, given its
//! mode and mtime (`FSETSTAT`), closed and renamed into place. A small
//! file is sent whole at commit (open, then write + setstat + close in
//! flight together, then the rename); a bigger one streams with several
//! `WRITE`s in flight.
//!
//! A big local file (`RANGED_MIN` and up) goes in 32 MiB ranges over
//! several sessions at once into a named partial,
//! `.ferry-part-<hash of its path>.~ferry~`, beside a record of the ranges
//! that arrived (another reserved name, rewritten after each range, after
//! `fsync@openssh.com` of the partial where offered): a run killed midway
//! is resumed by the next, which sends only the missing ranges of the same
//! source (size and mtime).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_engine::bwlimit::Limiter;
use ferry_engine::entry::Meta;
use ferry_engine::store::{changed, partial_name, MetaChange, Planned, Progress, SourceFile};
use ferry_local::download::{CHUNK as RANGE, RANGED_MIN};
use ferry_local::range::RangeSet;

use crate::conn::Conn;
use crate::store::{join, set_of, temp_path, SftpStore};
use crate::wire::{self as w, Reply, Req, Set};

mod ranged;

use ranged::{Ranged, Track};

/// Writes of one file in flight.
const WRITE_AHEAD: usize = 16;
/// Writes in flight per session of a big file's ranged upload: the
/// server's pipe and ssh's channel window stay full across ranges
/// (OpenSSH's own client keeps 64 requests in flight).
const RANGED_AHEAD: usize = 64;
/// A ranged upload's partial made durable (`fsync@openssh.com`) and its
/// record rewritten after this many bytes more and [`SYNC_INTERVAL`]: a
/// kill loses about that much of the transfer. Each sync has the server
/// write back what came since (work a copy that ends sooner leaves to the
/// kernel's writeback later): every 128 MiB alone made a 1 GiB push
/// 10-15% slower on loopback.
const SYNC_INTERVAL: Duration = Duration::from_secs(2);
const SYNC_EVERY: u64 = 128 << 20;
/// First line of a partial's record.
const RECORD: &str = "ferry sftp partial 1";

pub(crate) type Rx = Receiver<io::Result<Reply>>;

/// A file being written.
pub struct SftpWriter {
    /// The session its requests go over (files spread over several:
    /// [`Conn::next_small`]).
    conn: Arc<Conn>,
    /// Its directory, and the path it is created for (a partial's name
    /// comes from it).
    dir: Vec<u8>,
    path: Vec<u8>,
    /// Its temporary's (or partial's) path.
    temp: Vec<u8>,
    /// A small file's content, sent whole at commit.
    whole: Option<Vec<u8>>,
    /// The open temporary of a bigger one, and its writes in flight.
    handle: Option<Vec<u8>>,
    acks: VecDeque<Rx>,
    /// A resumable partial's record, removed at commit.
    record: Option<Vec<u8>>,
    /// The entry the plan saw at the name (`Store::expect`): the commit
    /// replaces it only while the name still holds it (one LSTAT right
    /// before the rename; see [`check_planned`]).
    pub(crate) planned: Option<Planned>,
}

/// A writer's commit handed to [`crate::pipe`].
pub(crate) struct FlightParts {
    pub conn: Arc<Conn>,
    pub dir: Vec<u8>,
    pub temp: Vec<u8>,
    /// The temporary's handle and the writes in flight to it, or (not
    /// opened yet) the whole content.
    pub open: Result<(Vec<u8>, VecDeque<Rx>), Vec<u8>>,
}

/// Big uploads resumed, and the bytes they did not send again, for `-v`.
static RESUMED: AtomicU64 = AtomicU64::new(0);
static RESUMED_BYTES: AtomicU64 = AtomicU64::new(0);
/// Bytes of resumed uploads that differed from the source when checked at
/// the end (a source changed in place keeping its size and mtime), sent
/// again.
static RESENT_BYTES: AtomicU64 = AtomicU64::new(0);

/// READs in flight when a resumed upload is checked.
const CHECK_AHEAD: usize = 32;

/// After a resumed upload, the check of the whole file: the ranges an
/// earlier run sent (`resumed`) are read back from the partial `part`
/// and compared with the source `fd`; every piece that differs (the
/// source changed in place keeping its size and mtime, which name it in
/// the record) is written again through `h0`. The bytes written again.
fn check_resumed(
    conn: &Conn,
    part: &[u8],
    h0: &[u8],
    fd: BorrowedFd<'_>,
    resumed: &RangeSet,
) -> io::Result<u64> {
    let h = open_read_if(conn, part)?.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    let chunk = u64::from(conn.chunk);
    let mut pieces = Vec::new();
    for (a, b) in resumed.ranges() {
        let mut at = a;
        while at < b {
            let end = (at + chunk).min(b);
            pieces.push((at, end));
            at = end;
        }
    }
    let mut next = 0;
    let mut inflight: VecDeque<((u64, u64), Rx)> = VecDeque::new();
    let mut differ = Vec::new();
    let mut mine = vec![0u8; chunk as usize];
    let res = (|| -> io::Result<()> {
        loop {
            while inflight.len() < CHECK_AHEAD && next < pieces.len() {
                let (a, b) = pieces[next];
                let req = Req::path(w::READ, &h).u64(a).u32((b - a) as u32);
                inflight.push_back(((a, b), conn.start(req)?));
                next += 1;
            }
            let Some(((a, b), rx)) = inflight.pop_front() else {
                return Ok(());
            };
            let r = conn.wait(&rx)?;
            let theirs = match r.data()? {
                Some((x, y)) => &r.body[x..y],
                None => &[][..],
            };
            let n = (b - a) as usize;
            let mut got = 0;
            while got < n {
                match rustix::io::pread(fd, &mut mine[got..n], a + got as u64) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if theirs != &mine[..got] || got < n {
                differ.push((a, b));
            }
        }
    })();
    let _ = drain(conn, &mut inflight.drain(..).map(|(_, rx)| rx).collect());
    conn.send(Req::path(w::CLOSE, &h));
    res?;
    let mut acks = VecDeque::new();
    let mut again = 0u64;
    for (a, b) in differ {
        let (req, n) = write_from_fd(h0, fd, a, (b - a) as usize)?;
        if n as u64 != b - a {
            return Err(changed());
        }
        acks.push_back(conn.start(req)?);
        again += n as u64;
        if acks.len() >= WRITE_AHEAD {
            let rx = acks.pop_front().expect("in flight");
            conn.wait(&rx)?.ok()?;
        }
    }
    drain(conn, &mut acks)?;
    RESENT_BYTES.fetch_add(again, Ordering::Relaxed);
    Ok(again)
}

/// The `OPEN` for writing of `path` (created private).
pub(crate) fn open_req(path: &[u8], flags: u32) -> Req {
    let set = Set {
        mode: Some(0o600),
        ..Set::default()
    };
    Req::path(w::OPEN, path).u32(w::F_WRITE | flags).attrs(&set)
}

fn open_write(conn: &Conn, path: &[u8], flags: u32) -> io::Result<Vec<u8>> {
    conn.call(open_req(path, flags))?.handle()
}

pub(crate) fn write_req(conn: &Conn, handle: &[u8], at: u64, data: &[u8]) -> io::Result<Rx> {
    conn.start(Req::path(w::WRITE, handle).u64(at).str(data))
}

/// Wait for every reply of `acks`: the first error, if any.
fn drain(conn: &Conn, acks: &mut VecDeque<Rx>) -> io::Result<()> {
    let mut first = Ok(());
    for rx in acks.drain(..) {
        let r = conn.wait(&rx).and_then(|r| r.ok());
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// FNV-1a of `b`: the partial's name of a path.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &c| {
        (h ^ u64::from(c)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The ranges a partial's record names, when it is of source `ident`.
fn parse_record(text: &[u8], ident: &str) -> Option<RangeSet> {
    let text = std::str::from_utf8(text).ok()?;
    let mut lines = text.lines();
    if lines.next()? != RECORD || lines.next()? != ident {
        return None;
    }
    let mut set = RangeSet::new();
    for l in lines {
        if l == "end" {
            return Some(set);
        }
        let (a, b) = l.split_once('-')?;
        let (a, b) = (a.parse().ok()?, b.parse().ok()?);
        if a >= b {
            return None;
        }
        set.insert(a, b);
    }
    // No end line: a record cut short is not trusted.
    None
}

fn record_text(ident: &str, set: &RangeSet) -> Vec<u8> {
    let mut t = format!("{RECORD}\n{ident}\n");
    for (a, b) in set.ranges() {
        t.push_str(&format!("{a}-{b}\n"));
    }
    t.push_str("end\n");
    t.into_bytes()
}

/// The whole of a small file at `path`, `None` when it does not exist.
fn read_small(conn: &Conn, path: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let h = match open_read_if(conn, path)? {
        Some(h) => h,
        None => return Ok(None),
    };
    let r = conn.call(Req::path(w::READ, &h).u64(0).u32(conn.chunk));
    conn.send(Req::path(w::CLOSE, &h));
    let r = r?;
    Ok(Some(match r.data()? {
        Some((a, b)) => r.body[a..b].to_vec(),
        None => Vec::new(),
    }))
}

fn open_read_if(conn: &Conn, path: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let r = conn.call(crate::ahead::open_req(path))?;
    match r.handle() {
        Ok(h) => Ok(Some(h)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replace the small file `path` with `data` (one write: a record cut
/// short by a kill is told by its missing end line).
fn write_small(conn: &Conn, path: &[u8], data: &[u8]) -> io::Result<()> {
    let h = open_write(conn, path, w::F_CREAT | w::F_TRUNC)?;
    let wrote = write_req(conn, &h, 0, data).and_then(|rx| conn.wait(&rx)?.ok());
    let closed = conn.call(Req::path(w::CLOSE, &h)).and_then(|r| r.ok());
    wrote.and(closed)
}

/// The `WRITE` of up to `want` bytes of local file `fd` from `at`, read
/// straight into the request (no copy more): the request and its bytes,
/// 0 at the file's end.
fn write_from_fd(
    handle: &[u8],
    fd: BorrowedFd<'_>,
    at: u64,
    want: usize,
) -> io::Result<(Req, usize)> {
    let mut r = Req::path(w::WRITE, handle).u64(at).u32(0);
    let start = r.0.len();
    r.0.resize(start + want, 0);
    let n = loop {
        match rustix::io::pread(fd, &mut r.0[start..], at) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    r.0.truncate(start + n);
    r.0[start - 4..start].copy_from_slice(&(n as u32).to_be_bytes());
    Ok((r, n))
}

/// What a killed run sent of this same source (`ident`), when its
/// partial and record (`at`) are still there and the record is trusted;
/// a record not trusted is removed (it goes before the partial is
/// emptied: it is rewritten in place later and must not outlive its
/// content).
fn resumable(
    conn: &Conn,
    at: (&[u8], &[u8]),
    ident: &str,
    size: u64,
) -> io::Result<Option<RangeSet>> {
    let (part, record) = at;
    let old = read_small(conn, record)?;
    let had = match &old {
        Some(t) => parse_record(t, ident).filter(|set| {
            let stat = conn
                .call(Req::path(w::LSTAT, part))
                .and_then(|r| r.attrs_if());
            matches!(stat, Ok(Some(a)) if a.size.unwrap_or(0) <= size && set.total() > 0)
        }),
        None => None,
    };
    if old.is_some() && had.is_none() {
        let _ = conn.call(Req::path(w::REMOVE, record));
    }
    Ok(had)
}

/// The ranges of a `size`-byte file not `done` yet, in pieces of
/// [`RANGE`] at most.
fn ranges_to_send(done: &RangeSet, size: u64) -> Vec<(u64, u64)> {
    done.missing(size)
        .into_iter()
        .flat_map(|(a, b)| {
            (a..b)
                .step_by(RANGE as usize)
                .map(move |x| (x, (x + RANGE).min(b)))
        })
        .collect()
}

impl SftpWriter {
    pub(crate) fn create(
        s: &SftpStore,
        dir: &[u8],
        name: &[u8],
        meta: &Meta,
    ) -> io::Result<SftpWriter> {
        let main = s.conn();
        main.alive()?;
        // A big file goes in ranges over all the sessions (from the first).
        let conn = if meta.size >= RANGED_MIN {
            main
        } else {
            main.next_small(main.small_width())
        };
        Ok(SftpWriter {
            dir: dir.to_vec(),
            path: join(dir, name),
            temp: temp_path(dir),
            whole: (meta.size <= u64::from(conn.chunk))
                .then(|| Vec::with_capacity(meta.size as usize + 1)),
            handle: None,
            acks: VecDeque::new(),
            record: None,
            planned: None,
            conn,
        })
    }

    pub(crate) fn write_from(
        &mut self,
        s: &SftpStore,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        let chunk = self.conn.chunk as usize;
        let cap = limit.map_or(chunk, |l| l.chunk().clamp(1, chunk));
        if self.whole.is_none() && size >= RANGED_MIN {
            if let Some(fd) = src.as_fd() {
                let fd = fd.try_clone_to_owned()?;
                return self.ranged(s, std::os::fd::AsFd::as_fd(&fd), src, size, limit);
            }
        }
        if self.whole.is_none() {
            self.handle = Some(open_write(&self.conn, &self.temp, w::F_CREAT | w::F_EXCL)?);
        }
        let mut buf = Vec::new();
        let mut total = 0u64;
        loop {
            // One byte past the size at most: growth shows without a
            // second pass.
            let want = ((size - total.min(size)) as usize)
                .saturating_add(1)
                .min(cap);
            let b = self.whole.as_mut().unwrap_or(&mut buf);
            let start = if self.handle.is_some() { 0 } else { b.len() };
            b.truncate(start);
            b.resize(start + want, 0);
            let mut n = 0;
            while n < want {
                match src.read(&mut b[start + n..start + want])? {
                    0 => break,
                    k => n += k,
                }
            }
            b.truncate(start + n);
            if let (Some(h), true) = (&self.handle, n > 0) {
                self.acks.push_back(write_req(&self.conn, h, total, b)?);
                if self.acks.len() >= WRITE_AHEAD {
                    let rx = self.acks.pop_front().expect("in flight");
                    self.conn.wait(&rx)?.ok()?;
                }
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

    /// A big local file in ranges over several sessions, into a partial
    /// resumed where a killed run left it.
    fn ranged(
        &mut self,
        s: &SftpStore,
        fd: BorrowedFd<'_>,
        src: &dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        self.conn = s.conn();
        let conn = &s.conn();
        let st = rustix::fs::fstat(fd)?;
        let ident = format!("{size} {}.{:09}", st.st_mtime, st.st_mtime_nsec);
        let key = fnv(&self.path);
        let part = join(&self.dir, partial_name(key).as_bytes());
        let record = join(
            &self.dir,
            partial_name(key ^ 0x9e37_79b9_7f4a_7c15).as_bytes(),
        );
        let had = resumable(conn, (&part, &record), &ident, size)?;
        let flags = w::F_CREAT | if had.is_some() { 0 } else { w::F_TRUNC };
        let h0 = open_write(conn, &part, flags)?;
        self.temp = part.clone();
        self.handle = Some(h0.clone());
        self.record = Some(record.clone());
        let done = had.unwrap_or_default();
        let resumed = done.clone();
        if done.total() > 0 {
            RESUMED.fetch_add(1, Ordering::Relaxed);
            RESUMED_BYTES.fetch_add(done.total(), Ordering::Relaxed);
            if let Some(p) = src.progress() {
                p.add(done.total());
            }
        }
        let todo = ranges_to_send(&done, size);
        let progress = src.progress();
        let next = AtomicUsize::new(0);
        let take = || todo.get(next.fetch_add(1, Ordering::Relaxed)).copied();
        let run = Ranged {
            conn,
            h0: &h0,
            record: &record,
            ident: &ident,
            size,
            track: Mutex::new(Track {
                done,
                since: 0,
                last: Instant::now(),
                sync: None,
                rec: None,
            }),
        };
        let width = conn.big_width().min(todo.len()).max(1);
        let work = |k: usize| -> io::Result<()> {
            let c = conn.nth(k);
            let h = if std::sync::Arc::ptr_eq(&c, conn) {
                h0.clone()
            } else {
                open_write(&c, &part, 0)?
            };
            let res = run.send(&c, &h, fd, take, progress, limit);
            if !std::sync::Arc::ptr_eq(&c, conn) {
                let closed = c.call(Req::path(w::CLOSE, &h)).and_then(|r| r.ok());
                return res.and(closed);
            }
            res
        };
        let results: Vec<io::Result<()>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (1..width).map(|k| sc.spawn(move || work(k))).collect();
            let mut v = vec![work(0)];
            v.extend(hs.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("a writer thread panicked")))
            }));
            v
        });
        if let Some(e) = results.into_iter().find_map(Result::err) {
            let e = s.full_disk(&self.dir, size, e);
            if ferry_engine::store::is_no_space(&e) {
                // It cannot complete there: what it holds would keep the
                // disk full for nothing. The record goes now, the partial
                // with the abort that follows (its handle closed first).
                run.close();
                let _ = conn.call(Req::path(w::REMOVE, &record));
                self.record = None;
                return Err(e);
            }
            // Kept for the next run: the record written last says what
            // of it is sure.
            run.keep();
            run.close();
            return Err(e);
        }
        run.close();
        if resumed.total() > 0 {
            check_resumed(conn, &part, &h0, fd, &resumed)?;
        }
        Ok(size)
    }

    pub(crate) fn commit(
        mut self,
        s: &SftpStore,
        path: &[u8],
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<()> {
        let conn = &self.conn.clone();
        let mut acks = std::mem::take(&mut self.acks);
        let res = (|| {
            let h = match (&self.handle, &self.whole) {
                (Some(h), _) => h.clone(),
                (None, whole) => {
                    let h = open_write(conn, &self.temp, w::F_CREAT | w::F_EXCL)?;
                    self.handle = Some(h.clone());
                    for (i, part) in whole
                        .as_deref()
                        .unwrap_or_default()
                        .chunks(conn.chunk as usize)
                        .enumerate()
                    {
                        acks.push_back(write_req(
                            conn,
                            &h,
                            (i * conn.chunk as usize) as u64,
                            part,
                        )?);
                    }
                    h
                }
            };
            acks.push_back(
                conn.start(Req::path(w::FSETSTAT, &h).attrs(&set_of(meta, MetaChange::ALL)))?,
            );
            if fsync && conn.ext.fsync {
                acks.push_back(conn.start(Req::ext("fsync@openssh.com").str(&h))?);
            }
            self.handle = None;
            acks.push_back(conn.start(Req::path(w::CLOSE, &h))?);
            drain(conn, &mut acks)?;
            if let Some(p) = &self.planned {
                check_planned(conn, path, p)?;
            }
            s.replace_on(conn, &self.dir, &self.temp, path)
        })();
        match res {
            Ok(()) => {
                if let Some(r) = &self.record {
                    let _ = s.ok(Req::path(w::REMOVE, r));
                }
                Ok(())
            }
            Err(e) => {
                let _ = drain(conn, &mut acks);
                self.abort();
                Err(e)
            }
        }
    }

    /// What [`crate::pipe`] commits without waiting: a small file's
    /// content not sent yet, or the open temporary of a bigger one with
    /// its writes in flight. The writer back for a resumable partial
    /// (committed the waiting way).
    #[allow(clippy::result_large_err)]
    pub(crate) fn into_flight(self) -> Result<FlightParts, SftpWriter> {
        // A replace checked at the act: the waiting way (one LSTAT before
        // its rename).
        if self.record.is_some()
            || self.planned.is_some()
            || (self.handle.is_none() == self.whole.is_none())
        {
            return Err(self);
        }
        Ok(FlightParts {
            conn: self.conn,
            dir: self.dir,
            temp: self.temp,
            open: match (self.handle, self.whole) {
                (Some(h), _) => Ok((h, self.acks)),
                (None, whole) => Err(whole.unwrap_or_default()),
            },
        })
    }

    pub(crate) fn abort(self) {
        if let Some(h) = &self.handle {
            let _ = self.conn.call(Req::path(w::CLOSE, h));
        }
        // A resumable partial stays for the next run.
        if self.record.is_none() {
            let _ = self
                .conn
                .call(Req::path(w::REMOVE, &self.temp))
                .and_then(|r| r.ok());
        }
    }
}

/// Fail with [`changed`] unless `path` still holds the entry planned `p`:
/// its kind, size and mtime (to the second, SFTP's precision), by one LSTAT
/// over `conn`. SFTP has no atomic condition: a write landing between this
/// LSTAT and the rename or remove right after it is not seen (a window of
/// one round trip).
pub(crate) fn check_planned(conn: &Conn, path: &[u8], p: &Planned) -> io::Result<()> {
    let now = conn.call(Req::path(w::LSTAT, path))?.attrs_if()?;
    if p.holds(now.map(|a| a.meta()).as_ref()) {
        Ok(())
    } else {
        Err(changed())
    }
}

/// Make the empty file `path` with `meta`, unless it exists (`false`).
pub(crate) fn create_empty(
    s: &SftpStore,
    path: &[u8],
    meta: &Meta,
    fsync: bool,
) -> io::Result<bool> {
    let conn = &s.conn();
    let h = match open_write(conn, path, w::F_CREAT | w::F_EXCL) {
        Ok(h) => h,
        Err(e) if e.kind() == io::ErrorKind::Other => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut acks = VecDeque::new();
    acks.push_back(conn.start(Req::path(w::FSETSTAT, &h).attrs(&set_of(meta, MetaChange::ALL)))?);
    if fsync && conn.ext.fsync {
        acks.push_back(conn.start(Req::ext("fsync@openssh.com").str(&h))?);
    }
    acks.push_back(conn.start(Req::path(w::CLOSE, &h))?);
    drain(conn, &mut acks)?;
    Ok(true)
}

/// Lines for `-v`.
pub(crate) fn notes(role: &str) -> Vec<String> {
    let n = RESUMED.load(Ordering::Relaxed);
    if n == 0 {
        return Vec::new();
    }
    let again = RESENT_BYTES.load(Ordering::Relaxed);
    vec![format!(
        "{role}: {n} upload(s) resumed, {} bytes not sent again, {again} bytes sent again (checked at the end: they differed from the source)",
        RESUMED_BYTES.load(Ordering::Relaxed)
    )]
}

#[cfg(test)]
mod tests;
