//! Reading over SFTP: a file is opened, its size asked (`FSTAT`) beside the
//! first read, and read with several `READ`s in flight. A big file is also
//! a [`RangedSource`]: a local writer fetches its ranges over several
//! sessions at once into a resumable partial (ferry-local's download).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::piece::with_piece_buffer;
use ferry_engine::store::{RangedSource, SourceFile};

use crate::ahead::{open_req, read_req};
use crate::conn::Conn;
use crate::wire::{self as w, Reply, Req};

/// Reads of one file in flight.
const READ_AHEAD: usize = 8;
/// Reads in flight per range of a big file read in ranges (OpenSSH's own
/// client keeps 64 in flight).
const RANGED_AHEAD: usize = 32;

type Rx = Receiver<io::Result<Reply>>;

/// Reads in flight: offset, length, reply.
type Ahead = VecDeque<(u64, u32, Rx)>;

/// A file open for reading.
pub struct SftpReader {
    conn: Arc<Conn>,
    handle: Vec<u8>,
    ahead: Ahead,
    /// Offset of the next read to ask for.
    next: u64,
    /// The size when opened: reads stop there.
    size: u64,
    eof: bool,
    /// The reply holding the bytes being handed out, and where they are.
    body: Vec<u8>,
    span: (usize, usize),
    ranged: Option<Ranged>,
}

fn changed() -> io::Error {
    io::Error::other("the file changed while it was copied")
}

/// Open `path` for reading on `conn`: its handle.
fn open_read(conn: &Conn, path: &[u8]) -> io::Result<Vec<u8>> {
    conn.call(open_req(path))?.handle()
}

/// A read's reply: its offset, the reply, where its data is in the body.
type Got = (u64, Reply, (usize, usize));

/// The next reply of `ahead`, in order; a short one that stops before
/// `end` (the size known, or the end of the range) has its rest asked
/// again, first. `None` at the end of the file.
fn next_data(conn: &Conn, handle: &[u8], ahead: &mut Ahead, end: u64) -> io::Result<Option<Got>> {
    let Some((at, len, rx)) = ahead.pop_front() else {
        return Ok(None);
    };
    let reply = conn.wait(&rx)?;
    let Some((a, b)) = reply.data()? else {
        return Ok(None);
    };
    let n = (b - a) as u32;
    // A read that reached the size known is the file's end: no request
    // more for a small file (it grew if the read brought more than that).
    if n < len && n > 0 && at + u64::from(n) < end {
        let rest = read_req(conn, handle, at + u64::from(n), len - n)?;
        ahead.push_front((at + u64::from(n), len - n, rest));
    }
    Ok(Some((at, reply, (a, b))))
}

impl SftpReader {
    /// Open `path` on one of the sessions of `main` (files spread over
    /// them: [`Conn::next_small`]); a big file's ranges are read over all.
    pub(crate) fn open(main: &Arc<Conn>, path: Vec<u8>) -> io::Result<SftpReader> {
        let conn = &main.next_small(main.width());
        let handle = open_read(conn, &path)?;
        let mut r = SftpReader {
            conn: conn.clone(),
            handle,
            ahead: VecDeque::new(),
            next: 0,
            size: u64::MAX,
            eof: false,
            body: Vec::new(),
            span: (0, 0),
            ranged: None,
        };
        // The size and the first read, together.
        let stat = conn.start(Req::path(w::FSTAT, &r.handle))?;
        r.ask(conn.chunk)?;
        let a = conn.wait(&stat)?.attrs()?;
        r.size = a.size.unwrap_or(u64::MAX);
        if r.size >= ferry_local::download::RANGED_MIN && r.size != u64::MAX {
            r.ranged = Some(Ranged {
                conn: main.clone(),
                path,
                opened: (r.size, a.mtime),
                handles: Mutex::new(Vec::new()),
                turn: AtomicUsize::new(0),
                width: main.big_width(),
            });
        }
        Ok(r)
    }

    /// A small file opened ahead ([`crate::ahead`]): its listed size
    /// stands for the `FSTAT`.
    pub(crate) fn ahead(a: crate::ahead::Ahead) -> io::Result<SftpReader> {
        let (conn, size) = (a.conn.clone(), a.size);
        let (handle, len, rx) = a.take()?;
        Ok(SftpReader {
            conn,
            handle,
            ahead: VecDeque::from([(0, len, rx)]),
            next: u64::from(len),
            size,
            eof: false,
            body: Vec::new(),
            span: (0, 0),
            ranged: None,
        })
    }

    /// Ask for the next `len` bytes.
    fn ask(&mut self, len: u32) -> io::Result<()> {
        let rx = read_req(&self.conn, &self.handle, self.next, len)?;
        self.ahead.push_back((self.next, len, rx));
        self.next += u64::from(len);
        Ok(())
    }
}

impl SourceFile for SftpReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let (a, b) = self.span;
            if a < b {
                let n = (b - a).min(buf.len());
                buf[..n].copy_from_slice(&self.body[a..a + n]);
                self.span.0 += n;
                return Ok(n);
            }
            if self.eof {
                return Ok(0);
            }
            while self.ahead.len() < READ_AHEAD && self.next < self.size {
                let len = (self.size - self.next).min(u64::from(self.conn.chunk)) as u32;
                self.ask(len)?;
            }
            match next_data(&self.conn, &self.handle, &mut self.ahead, self.size)? {
                Some((_, reply, span)) => {
                    self.body = reply.body;
                    self.span = span;
                }
                None => {
                    self.eof = true;
                    self.ahead.clear();
                }
            }
        }
    }
    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    fn ranged(&self) -> Option<&dyn RangedSource> {
        self.ranged.as_ref().map(|r| r as &dyn RangedSource)
    }
}

impl Drop for SftpReader {
    fn drop(&mut self) {
        self.conn.send(Req::path(w::CLOSE, &self.handle));
    }
}

/// A file open on one session.
type Handle = (Arc<Conn>, Vec<u8>);

/// A big file read in ranges over several sessions.
struct Ranged {
    conn: Arc<Conn>,
    path: Vec<u8>,
    /// Size and mtime when opened: the content ranges are read from.
    opened: (u64, u32),
    /// Its handle on each session, opened when first needed.
    handles: Mutex<Vec<Option<Handle>>>,
    /// The session of the next range.
    turn: AtomicUsize,
    width: usize,
}

impl Ranged {
    fn next(&self) -> io::Result<Handle> {
        let k = self.turn.fetch_add(1, Ordering::Relaxed) % self.width;
        let mut hs = self.handles.lock();
        if hs.len() <= k {
            hs.resize(k + 1, None);
        }
        if let Some(h) = &hs[k] {
            return Ok(h.clone());
        }
        let c = self.conn.nth(k);
        let h = (c.clone(), open_read(&c, &self.path)?);
        hs[k] = Some(h.clone());
        Ok(h)
    }
}

impl RangedSource for Ranged {
    fn identity(&self) -> io::Result<(u64, String)> {
        Ok((self.opened.0, format!("sftp:{}", self.opened.1)))
    }

    fn read_range(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
        limit: Option<&Limiter>,
    ) -> io::Result<()> {
        let (c, h) = self.next()?;
        // The path still names the content opened (a replaced file's
        // handle would read the old one): asked beside the first reads,
        // checked before any byte is handed over.
        let stat = c.start(Req::path(w::STAT, &self.path))?;
        let (end, mut next) = (offset + len, offset);
        let mut ahead = Ahead::new();
        let mut checked = false;
        loop {
            while next < end && ahead.len() < RANGED_AHEAD {
                let n = (end - next).min(u64::from(c.chunk)) as u32;
                ahead.push_back((next, n, read_req(&c, &h, next, n)?));
                next += u64::from(n);
            }
            if !checked {
                let a = c.wait(&stat)?.attrs()?;
                if (a.size.unwrap_or(0), a.mtime) != self.opened {
                    return Err(changed());
                }
                checked = true;
            }
            if ahead.is_empty() {
                return Ok(());
            }
            let Some((at, reply, (a, b))) = next_data(&c, &h, &mut ahead, end)? else {
                return Err(changed());
            };
            // Into the aligned piece buffer: the local writer hands it to
            // the disk with O_DIRECT.
            with_piece_buffer(|buf| {
                buf[..b - a].copy_from_slice(&reply.body[a..b]);
                out(at, &buf[..b - a])
            })?;
            if let Some(l) = limit {
                l.acquire((b - a) as u64);
            }
        }
    }
}

impl Drop for Ranged {
    fn drop(&mut self) {
        for (c, h) in self.handles.get_mut().iter().flatten() {
            c.send(Req::path(w::CLOSE, h));
        }
    }
}
