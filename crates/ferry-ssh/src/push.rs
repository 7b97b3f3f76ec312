//! Big local files pushed in ranges over several connections
//! ([`Conn::width`]) into a resumable partial on the server, as big pulls
//! and S3 downloads are fetched.
//!
//! The first connection opens the partial ([`Req::PartOpen`]: the ranges an
//! earlier run of the same content recorded come back), the others open it
//! by path ([`Req::PartAttach`]). Each connection's thread takes the next
//! missing piece, reads it from the local file at its offset and sends it
//! as [`Req::WriteAt`] frames; every [`SYNC_EVERY`] bytes it asks its server
//! to flush ([`Req::PartSync`]; also every two seconds), and only then are
//! its pieces counted as written and recorded on the first connection
//! ([`Req::PartRecord`]): the record never claims bytes that are not on
//! disk. The last pieces are not flushed (the commit follows; a kill before
//! it sends them again). A killed push leaves the
//! partial and its record; a rerun of the same content (size, mtime, inode)
//! sends only what is missing. The commit renames the partial into place.

use parking_lot::Mutex;
use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::entry::Meta;
use ferry_engine::store::{is_no_space, Progress};
use ferry_local::range::RangeSet;

use crate::conn::{unexpected, Conn};
use crate::proto::{Out, Req, Resp, CHUNK, M};

/// Byte ranges `[start, end)`.
type Ranges = [(u64, u64)];

/// Size of the pieces handed to the connections.
const PIECE: u64 = 8 << 20;
/// Bytes a connection sends between two flushes (and records), and the
/// longest time between them (a slow link still makes progress on record).
/// Few: a flush waits for the disk, which a copy otherwise leaves to the
/// kernel's writeback.
const SYNC_EVERY: u64 = 256 << 20;
const SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// The identity of a local file's content a partial is resumed for.
pub(crate) fn identity(meta: &Meta) -> String {
    format!(
        "push {} {}.{:09} {}",
        meta.size, meta.mtime_sec, meta.mtime_nsec, meta.ino
    )
}

/// Where a pushed file goes: the directory's handle and path there, its
/// name, and the handle it is written as.
pub(crate) struct Target<'a> {
    pub dir: u64,
    pub dir_path: &'a [u8],
    pub name: &'a CStr,
    pub file: u64,
}

/// What the connections pushing one file share: its descriptor, the
/// pieces to send and the next one to take, the first failure, the pace.
struct Share<'a> {
    fd: BorrowedFd<'a>,
    pieces: &'a [(u64, u64)],
    next: &'a AtomicUsize,
    failed: &'a Mutex<Option<io::Error>>,
    limit: Option<&'a Limiter>,
    progress: Option<&'a Progress<'a>>,
}

/// Push `meta.size` bytes of `fd` to `to` as its handle `to.file` of
/// `conn`: the bytes sent now and the bytes an earlier run had sent.
/// Committed (or aborted, which keeps the partial) with that handle on
/// `conn` afterwards.
pub(crate) fn push(
    conn: &Arc<Conn>,
    to: Target<'_>,
    meta: &Meta,
    fd: BorrowedFd<'_>,
    limit: Option<&Limiter>,
    progress: Option<&Progress<'_>>,
) -> io::Result<(u64, u64)> {
    let (size, file) = (meta.size, to.file);
    let ident = identity(meta);
    let done = match conn
        .call(&Req::PartOpen {
            dir: to.dir,
            name: to.name.to_bytes(),
            meta: M(*meta),
            ident: &ident,
            file,
        })?
        .get()?
    {
        Resp::Ranges(r) => r,
        r => return Err(unexpected(&r)),
    };
    let mut set = RangeSet::new();
    for (a, b) in done {
        set.insert(a.min(size), b.min(size));
    }
    let resumed = set.total();
    let earlier = set.clone();
    let mut pieces = Vec::new();
    for (a, b) in set.missing(size) {
        let mut at = a;
        while at < b {
            let end = ((at / PIECE + 1) * PIECE).min(b);
            pieces.push((at, end));
            at = end;
        }
    }
    let path = crate::store::join(
        to.dir_path,
        ferry_local::download::partial_name(to.name).to_bytes(),
    );
    let width = conn.width().min(pieces.len()).max(1);
    let next = AtomicUsize::new(0);
    let written = Mutex::new(set);
    let failed: Mutex<Option<io::Error>> = Mutex::new(None);
    let share = Share {
        fd,
        pieces: &pieces,
        next: &next,
        failed: &failed,
        limit,
        progress,
    };
    spread(conn, file, &share, &written, &path, width);
    if let Some(e) = failed.into_inner() {
        if !is_no_space(&e) {
            // The partial's own connection may have met a full disk that
            // the others only saw as the partial gone: that is the cause.
            let own = conn
                .call(&Req::PartSync {
                    file,
                    flush: false,
                    close: false,
                })
                .and_then(|b| b.get().map(|_| ()));
            if let Err(full) = own {
                if is_no_space(&full) {
                    return Err(full);
                }
            }
        }
        return Err(e);
    }
    if resumed > 0 {
        let again = check_resumed(conn, &path, file, fd, &earlier)?;
        RESENT.fetch_add(again, Ordering::Relaxed);
    }
    Ok((size - resumed, resumed))
}

/// Send `share`'s pieces over `width` connections to the host at once,
/// each (but `conn`'s own) writing the partial at `path` through a handle
/// of its own; the ranges flushed there are added to `written`, and the
/// partial's record (handle `file`) made of them.
fn spread(
    conn: &Arc<Conn>,
    file: u64,
    share: &Share<'_>,
    written: &Mutex<RangeSet>,
    path: &[u8],
    width: usize,
) {
    std::thread::scope(|scope| {
        for k in 0..width {
            scope.spawn(move || {
                let c = conn.nth(k);
                let own = !Arc::ptr_eq(&c, conn);
                let h = if own {
                    let h = c.handle();
                    if let Err(e) = c.send(&Req::PartAttach { path, file: h }) {
                        fail(share.failed, e);
                        return;
                    }
                    h
                } else {
                    file
                };
                let r = send_pieces(&c, h, share, |got| {
                    let snapshot = {
                        let mut w = written.lock();
                        for &(a, b) in got {
                            w.insert(a, b);
                        }
                        w.ranges()
                    };
                    // Best effort: a record not made costs a resend.
                    let _ = conn.send(&Req::PartRecord {
                        file,
                        ranges: snapshot,
                    });
                });
                // (send_pieces flushed what it sent: this only lets go.)
                let closed = match own {
                    true => c
                        .call(&Req::PartSync {
                            file: h,
                            flush: false,
                            close: true,
                        })
                        .and_then(|b| b.get().map(|_| ())),
                    false => Ok(()),
                };
                if let Err(e) = r.and(closed) {
                    fail(share.failed, e);
                }
            });
        }
    });
}

/// Bytes of resumed pushes sent again: they differed from the source
/// when checked at the end.
pub(crate) static RESENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Reads of a resumed partial in flight when it is checked.
const CHECK_AHEAD: usize = 16;

/// After a resumed push, the check of the whole file: the ranges an
/// earlier run sent (`earlier`) are read back from the partial at `path`
/// and compared with the source `fd`; every piece that differs (the
/// source changed in place keeping its size, mtime and inode, which name
/// it in the record) is written again through `file` and flushed. The
/// bytes written again.
fn check_resumed(
    conn: &Arc<Conn>,
    path: &[u8],
    file: u64,
    fd: BorrowedFd<'_>,
    earlier: &RangeSet,
) -> io::Result<u64> {
    let h = conn.handle();
    match conn.call(&Req::OpenPath { path, file: h })?.get()? {
        Resp::Opened { .. } => {}
        r => return Err(unexpected(&r)),
    }
    let mut pieces = Vec::new();
    for (a, b) in earlier.ranges() {
        let mut at = a;
        while at < b {
            let end = (at + CHUNK as u64).min(b);
            pieces.push((at, end));
            at = end;
        }
    }
    let (mut theirs, mut mine) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut differ = Vec::new();
    let mut ahead = std::collections::VecDeque::new();
    let mut next = 0;
    let res = (|| -> io::Result<()> {
        loop {
            while ahead.len() < CHECK_AHEAD && next < pieces.len() {
                let (a, b) = pieces[next];
                let rx = conn.start(&Req::Read {
                    file: h,
                    offset: a,
                    len: (b - a) as u32,
                })?;
                ahead.push_back(((a, b), rx));
                next += 1;
            }
            let Some(((a, b), rx)) = ahead.pop_front() else {
                return Ok(());
            };
            let body = conn.wait(&rx)?;
            let got = match body.get()? {
                Resp::Data { data, zeros, .. } => crate::store::expand(data, &zeros, &mut theirs),
                r => return Err(unexpected(&r)),
            };
            let n = (b - a) as usize;
            let mut had = 0;
            while had < n {
                match rustix::io::pread(fd, &mut mine[had..n], a + had as u64) {
                    Ok(0) => break,
                    Ok(k) => had += k,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if had < n {
                return Err(shrank());
            }
            if got != n || theirs[..n] != mine[..n] {
                differ.push((a, b));
            }
        }
    })();
    for (_, rx) in ahead {
        let _ = conn.wait(&rx);
    }
    let _ = conn.send(&Req::Close { handle: h });
    res?;
    let mut again = 0;
    for (a, b) in differ {
        let n = (b - a) as usize;
        let mut had = 0;
        while had < n {
            match rustix::io::pread(fd, &mut mine[had..n], a + had as u64) {
                Ok(0) => return Err(shrank()),
                Ok(k) => had += k,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        conn.send(&Req::WriteAt {
            file,
            offset: a,
            data: &mine[..n],
        })?;
        again += n as u64;
    }
    if again > 0 {
        conn.call(&Req::PartSync {
            file,
            flush: false,
            close: false,
        })?
        .get()?;
    }
    Ok(again)
}

/// Keep `e` as why the push failed: the first error, unless a full disk
/// comes later (the partial is then removed there, and the other
/// connections' errors, a partial gone, follow from it).
fn fail(failed: &Mutex<Option<io::Error>>, e: io::Error) {
    let mut f = failed.lock();
    match &*f {
        Some(old) if !is_no_space(&e) || is_no_space(old) => {}
        _ => *f = Some(e),
    }
}

/// One connection's share: the next pieces, read from the file and sent
/// as handle `h` of `c`, flushed there every [`SYNC_EVERY`] bytes and at
/// the end, then handed to `synced`.
fn send_pieces(
    c: &Conn,
    h: u64,
    share: &Share<'_>,
    mut synced: impl FnMut(&Ranges),
) -> io::Result<()> {
    let Share {
        fd,
        pieces,
        next,
        failed,
        limit,
        progress,
    } = *share;
    let cap = limit.map_or(CHUNK, |l| l.chunk().clamp(1, CHUNK));
    // Only for a file that cannot be spliced from.
    let mut buf = Vec::new();
    let mut unsynced: Vec<(u64, u64)> = Vec::new();
    let (mut since, mut last) = (0u64, std::time::Instant::now());
    let flush = |unsynced: &mut Vec<(u64, u64)>, synced: &mut dyn FnMut(&Ranges)| {
        c.call(&Req::PartSync {
            file: h,
            flush: true,
            close: false,
        })?
        .get()?;
        synced(unsynced);
        unsynced.clear();
        io::Result::Ok(())
    };
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= pieces.len() || failed.lock().is_some() {
            break;
        }
        let (a, b) = pieces[i];
        let mut at = a;
        while at < b {
            let want = ((b - at) as usize).min(cap);
            let n = match spliced(c, h, fd, at, want)? {
                Some(n) => n,
                None => {
                    if buf.is_empty() {
                        buf = vec![0u8; cap];
                    }
                    let n = loop {
                        match rustix::io::pread(fd, &mut buf[..want], at) {
                            Err(rustix::io::Errno::INTR) => continue,
                            r => break r?,
                        }
                    };
                    if n > 0 {
                        c.send(&Req::WriteAt {
                            file: h,
                            offset: at,
                            data: &buf[..n],
                        })?;
                    }
                    n
                }
            };
            if n == 0 {
                return Err(shrank());
            }
            if let Some(l) = limit {
                l.acquire(n as u64);
            }
            if let Some(p) = progress {
                p.add(n as u64);
            }
            at += n as u64;
        }
        unsynced.push((a, b));
        since += b - a;
        if since >= SYNC_EVERY || last.elapsed() >= SYNC_INTERVAL {
            (since, last) = (0, std::time::Instant::now());
            flush(&mut unsynced, &mut synced)?;
        }
    }
    Ok(())
}

fn shrank() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the source file shrank while being copied",
    )
}

/// Send up to `want` bytes of `fd` at `at` as handle `h` of `c` through a
/// pipe ([`crate::splice`]: the bytes are not copied here): how many went
/// (0: the end of the file), or `None` when no pipe can be had or the file
/// cannot be spliced from (nothing sent: read and send them).
fn spliced(
    c: &Conn,
    h: u64,
    fd: BorrowedFd<'_>,
    at: u64,
    want: usize,
) -> io::Result<Option<usize>> {
    let Some(mut pipe) = crate::splice::pipe() else {
        return Ok(None);
    };
    let n = match pipe.fill(fd, at, want) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => return Ok(None),
        Err(e) => return Err(e),
    };
    if n > 0 {
        c.send_out(Out::Piped {
            head: crate::proto::write_at_head(h, at, n),
            pipe,
            tail: Vec::new(),
        })?;
    }
    Ok(Some(n))
}
