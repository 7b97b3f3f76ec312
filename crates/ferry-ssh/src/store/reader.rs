//! [`SshReader`]: a remote file read over its connection, small files
//! whole with their open, big ones read ahead in chunks or fetched in
//! ranges over several connections ([`Ranged`]).

use super::*;
use ferry_engine::ranged::{changed, give, pipelined, Fetch, Sink};
/// A remote file open for reading.
pub struct SshReader {
    pub(super) conn: Arc<Conn>,
    /// The server's handle of a big file (a small one came whole).
    pub(super) file: Option<u64>,
    /// The reply holding the bytes being handed out, and where they are in it.
    pub(super) body: Vec<u8>,
    pub(super) span: (usize, usize),
    /// Chunk reads in flight, in order, and the offset of the next one.
    pub(super) ahead: VecDeque<Receiver<io::Result<Vec<u8>>>>,
    pub(super) next: u64,
    pub(super) eof: bool,
    pub(super) current: Option<(u64, i64, u32)>,
    /// A big file's ranged reads.
    pub(super) ranged: Option<Ranged>,
    /// The attributes that came with the open (`sel_bits`, values), and
    /// where the file is (directory handle, name) to ask for them otherwise.
    pub(super) xattrs: (u8, Xattrs),
    pub(super) at: (u64, Vec<u8>),
}

/// A file open on one connection: the connection and the handle.
type Handle = (Arc<Conn>, u64);

/// A big remote file read in ranges over several connections.
pub(super) struct Ranged {
    pub(super) conn: Arc<Conn>,
    /// Its path there, its handle on the first connection.
    pub(super) path: Arc<[u8]>,
    pub(super) file: u64,
    /// Size, mtime and inode when opened: the content ranges are read from.
    pub(super) opened: (u64, i64, u32, u64),
    /// Its handles on the other connections, opened when first needed.
    pub(super) others: Mutex<Vec<Option<Handle>>>,
    /// The connection of the next range.
    pub(super) turn: AtomicUsize,
    pub(super) width: usize,
}

impl Ranged {
    /// The connection and handle for the next range.
    fn next(&self) -> io::Result<Handle> {
        let k = self.turn.fetch_add(1, Ordering::Relaxed) % self.width;
        if k == 0 {
            return Ok((self.conn.clone(), self.file));
        }
        let mut others = self.others.lock();
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

impl Fetch for Ranged {
    fn identity(&self) -> io::Result<(u64, String)> {
        let (size, s, ns, ino) = self.opened;
        Ok((size, format!("ssh:{s}.{ns:09}:{ino}")))
    }

    fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()> {
        let (conn, file) = self.next()?;
        // The path still names the content opened (a replaced file's
        // handle would read the old one): asked beside the first reads,
        // checked before any byte is handed over.
        let stat = conn.start(&Req::StatPath {
            path: &self.path,
            follow: false,
        })?;
        let check = || match meta_of(conn.wait(&stat)?.get()?)? {
            Some(m) if (m.size, m.mtime_sec, m.mtime_nsec, m.ino) == self.opened => Ok(()),
            _ => Err(changed()),
        };
        let ask = |offset, len| conn.start(&Req::Read { file, offset, len });
        let take = |rx: Receiver<_>, _, sink: &mut Sink<'_>| {
            let body = conn.wait(&rx)?;
            let (data, zeros) = match body.get()? {
                Resp::Data { data, zeros, .. } => (data, zeros),
                r => return Err(unexpected(&r)),
            };
            if zeros.is_empty() && placed(data, sink.at()) {
                // Read into its place ([`proto::read_placed`]): the local
                // writer hands it to the disk with O_DIRECT from there.
                sink.put(data)?;
            } else {
                // Into the aligned piece buffer, for the same.
                with_piece_buffer(|b| {
                    let len = expand(data, &zeros, b);
                    sink.put(&b[..len])
                })?;
            }
            conn.recycle(body.0);
            Ok(())
        };
        pipelined(sink, READ_AHEAD, CHUNK as u32, ask, check, take)
    }

    fn again(&self, e: io::Error, _: u32) -> io::Result<()> {
        // A lost connection is not made again mid-file: the local writer's
        // partial keeps what arrived for the next run.
        Err(e)
    }
}

impl Drop for Ranged {
    fn drop(&mut self) {
        for (c, f) in self.others.get_mut().iter().flatten() {
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
            if let Some(n) = give(&self.body, &mut self.span, buf) {
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
