//! Reading over SFTP: a file is opened, its size asked (`FSTAT`) beside the
//! first read, and read with several `READ`s in flight. A big file is also
//! a [`RangedSource`]: a local writer fetches its ranges over several
//! sessions at once into a resumable partial (ferry-local's download).

use parking_lot::Mutex;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use ferry_engine::piece::with_piece_buffer;
use ferry_engine::ranged::{changed, give, pipelined, Fetch, Sink, Window};
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

/// A file open for reading.
pub struct SftpReader {
    conn: Arc<Conn>,
    handle: Vec<u8>,
    /// Reads in flight; they stop at the size when opened.
    ahead: Window<Rx>,
    eof: bool,
    /// The reply holding the bytes being handed out, and where they are.
    body: Vec<u8>,
    span: (usize, usize),
    ranged: Option<Ranged>,
}

/// Open `path` for reading on `conn`: its handle.
fn open_read(conn: &Conn, path: &[u8]) -> io::Result<Vec<u8>> {
    conn.call(open_req(path))?.handle()
}

/// A read's reply: its offset, the reply, where its data is in the body.
type Got = (u64, Reply, (usize, usize));

/// The next reply of `ahead`, in order; a short one that stops before
/// its end (the size known) has its rest asked again, first. `None` at
/// the end of the file.
fn next_data(conn: &Conn, handle: &[u8], ahead: &mut Window<Rx>) -> io::Result<Option<Got>> {
    let Some((at, len, rx)) = ahead.pop() else {
        return Ok(None);
    };
    let reply = conn.wait(&rx)?;
    let Some((a, b)) = reply.data()? else {
        return Ok(None);
    };
    let n = (b - a) as u32;
    // A read that reached the size known is the file's end: no request
    // more for a small file (it grew if the read brought more than that).
    if n < len && n > 0 && at + u64::from(n) < ahead.end() {
        let rest = read_req(conn, handle, at + u64::from(n), len - n)?;
        ahead.again(at + u64::from(n), len - n, rest);
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
            ahead: Window::new(0, u64::MAX, READ_AHEAD, conn.chunk),
            eof: false,
            body: Vec::new(),
            span: (0, 0),
            ranged: None,
        };
        // The size and the first read, together.
        let stat = conn.start(Req::path(w::FSTAT, &r.handle))?;
        let handle = &r.handle;
        r.ahead.ask_next(|at, n| read_req(conn, handle, at, n))?;
        let a = conn.wait(&stat)?.attrs()?;
        let size = a.size.unwrap_or(u64::MAX);
        r.ahead.set_end(size);
        if size >= ferry_local::download::RANGED_MIN && size != u64::MAX {
            r.ranged = Some(Ranged {
                conn: main.clone(),
                path,
                opened: (size, a.mtime),
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
        let mut ahead = Window::new(0, size, READ_AHEAD, conn.chunk);
        ahead.push(0, len, rx);
        Ok(SftpReader {
            conn,
            handle,
            ahead,
            eof: false,
            body: Vec::new(),
            span: (0, 0),
            ranged: None,
        })
    }
}

impl SourceFile for SftpReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(n) = give(&self.body, &mut self.span, buf) {
                return Ok(n);
            }
            if self.eof {
                return Ok(0);
            }
            let (conn, handle) = (&self.conn, &self.handle);
            self.ahead.fill(|at, n| read_req(conn, handle, at, n))?;
            match next_data(conn, handle, &mut self.ahead)? {
                Some((_, reply, span)) => {
                    self.body = reply.body;
                    self.span = span;
                }
                None => {
                    self.eof = true;
                    self.ahead.stop();
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

impl Fetch for Ranged {
    fn identity(&self) -> io::Result<(u64, String)> {
        Ok((self.opened.0, format!("sftp:{}", self.opened.1)))
    }

    fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()> {
        let (c, h) = self.next()?;
        // The path still names the content opened (a replaced file's
        // handle would read the old one): asked beside the first reads,
        // checked before any byte is handed over.
        let stat = c.start(Req::path(w::STAT, &self.path))?;
        let check = || {
            let a = c.wait(&stat)?.attrs()?;
            if (a.size.unwrap_or(0), a.mtime) != self.opened {
                return Err(changed());
            }
            Ok(())
        };
        let ask = |at, n| read_req(&c, &h, at, n);
        let take = |rx: Rx, _, sink: &mut Sink<'_>| {
            let reply = c.wait(&rx)?;
            let Some((a, b)) = reply.data()? else {
                return Err(changed());
            };
            // Into the aligned piece buffer: the local writer hands it to
            // the disk with O_DIRECT.
            with_piece_buffer(|buf| {
                buf[..b - a].copy_from_slice(&reply.body[a..b]);
                sink.put(&buf[..b - a])
            })
        };
        pipelined(sink, RANGED_AHEAD, c.chunk, ask, check, take)
    }

    fn again(&self, e: io::Error, _: u32) -> io::Result<()> {
        // A lost session is not made again mid-file: the local writer's
        // partial keeps what arrived for the next run.
        Err(e)
    }
}

impl Drop for Ranged {
    fn drop(&mut self) {
        for (c, h) in self.handles.get_mut().iter().flatten() {
            c.send(Req::path(w::CLOSE, h));
        }
    }
}
