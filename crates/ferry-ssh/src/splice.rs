//! A big file's bytes moved into the ssh stream without being copied by
//! ferry: `splice(2)` from the file into a pipe of this process (the page
//! cache's pages are referenced, not copied), then from that pipe into the
//! stream's pipe (the references move) after the frame's head. Only ssh (or
//! sshd) then reads them, once, to encrypt them. Without it each MiB was
//! read into a buffer, copied into a frame and written into the pipe: three
//! passes over the bytes on the end that both shares its cores with the
//! cipher.
//!
//! The sender fills a pipe ([`Pipe::fill`]) itself, so it learns there
//! how many bytes the file had (a short read is the end of the file, as a
//! `pread` would say) before the frame is built; the writer thread only
//! moves the pipe's content into the stream ([`Sink::take`]). A file
//! whose filesystem cannot splice, or a pipe that cannot be made big
//! enough (the user's pipe limit), goes the copying way.

use parking_lot::{Condvar, Mutex};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::io::Errno;
use rustix::pipe::{self, PipeFlags, SpliceFlags};

/// Pipes a process keeps for frames in flight at most: a sender waits for
/// one when they are all queued.
const PIPES: usize = 8;

/// Frames of content up to this many bytes go through a pipe: its room.
pub const PIPE_ROOM: usize = crate::proto::CHUNK;

/// The most bytes of a file at `offset` a pipe takes at once: each page of
/// the file takes one of its [`PIPE_ROOM`]` / 4096` slots, so a range
/// that starts inside a page takes one more (a splice into a full pipe
/// would wait for a reader).
pub fn room(offset: u64) -> usize {
    PIPE_ROOM - (offset % 4096) as usize
}

/// This process's pipes for [`Out::Piped`](crate::proto::Out::Piped) frames.
pub struct Pool {
    state: Mutex<PoolState>,
    cv: Condvar,
}

struct PoolState {
    free: Vec<(OwnedFd, OwnedFd)>,
    /// Pipes made (free or in use).
    made: usize,
    /// A pipe could not be given [`PIPE_ROOM`]: no more are tried.
    refused: bool,
}

static POOL: std::sync::OnceLock<Arc<Pool>> = std::sync::OnceLock::new();

/// Whether `FERRY_NO_SPLICE` turns splicing off (a comparison in one build;
/// the copying way is kept working by the tests).
fn disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("FERRY_NO_SPLICE").is_some_and(|v| !v.is_empty()))
}

/// A pipe of this process's pool, `None` when none can be had with
/// [`PIPE_ROOM`] bytes of room (then the caller copies). Waits while all
/// are in use.
pub fn pipe() -> Option<Pipe> {
    if disabled() {
        return None;
    }
    let pool = POOL
        .get_or_init(|| {
            Arc::new(Pool {
                state: Mutex::new(PoolState {
                    free: Vec::new(),
                    made: 0,
                    refused: false,
                }),
                cv: Condvar::new(),
            })
        })
        .clone();
    let mut s = pool.state.lock();
    loop {
        if let Some(p) = s.free.pop() {
            drop(s);
            return Some(Pipe {
                ends: Some(p),
                held: 0,
                pool,
            });
        }
        if s.refused {
            return None;
        }
        if s.made < PIPES {
            s.made += 1;
            drop(s);
            return match make() {
                Some(p) => Some(Pipe {
                    ends: Some(p),
                    held: 0,
                    pool,
                }),
                None => {
                    let mut s = pool.state.lock();
                    s.made -= 1;
                    s.refused = true;
                    pool.cv.notify_all();
                    None
                }
            };
        }
        pool.cv.wait(&mut s);
    }
}

fn make() -> Option<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe::pipe_with(PipeFlags::CLOEXEC).ok()?;
    match pipe::fcntl_setpipe_size(&w, PIPE_ROOM) {
        Ok(n) if n >= PIPE_ROOM => Some((r, w)),
        _ => None,
    }
}

/// A pipe of the pool holding a frame's content: back to the pool when
/// dropped empty, closed when dropped with bytes in it.
pub struct Pipe {
    ends: Option<(OwnedFd, OwnedFd)>,
    /// Bytes in it.
    held: usize,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Pipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pipe({} bytes)", self.held)
    }
}

/// The file cannot be spliced from (its filesystem has no `splice_read`).
fn unsupported(e: Errno) -> bool {
    matches!(e, Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP)
}

impl Pipe {
    fn read_end(&self) -> BorrowedFd<'_> {
        self.ends.as_ref().expect("open").0.as_fd()
    }

    /// Splice up to `len` bytes of `fd` at `offset` into the pipe, at most
    /// [`room`]`(offset)`: the bytes it now holds, fewer than that only at
    /// the end of the file. `Unsupported` when the file cannot be spliced
    /// from (nothing moved: read it instead).
    pub fn fill(&mut self, fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<usize> {
        let len = len.min(room(offset));
        let w = self.ends.as_ref().expect("open").1.as_fd();
        let mut off = offset;
        while self.held < len {
            match pipe::splice(
                fd,
                Some(&mut off),
                w,
                None,
                len - self.held,
                SpliceFlags::empty(),
            ) {
                Ok(0) => break,
                Ok(n) => self.held += n,
                Err(Errno::INTR) => {}
                Err(e) if self.held == 0 && unsupported(e) => {
                    return Err(io::ErrorKind::Unsupported.into());
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(self.held)
    }

    /// Bytes it holds.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        let mut s = self.pool.state.lock();
        match self.ends.take() {
            Some(p) if self.held == 0 => s.free.push(p),
            _ => s.made -= 1,
        }
        self.pool.cv.notify_one();
    }
}

/// A stream a writer thread writes frames to, which can take the content
/// of a [`Pipe`].
pub trait Sink: Write {
    /// The stream's descriptor, when it has one (splice needs one).
    fn fd(&self) -> Option<BorrowedFd<'_>>;

    /// Move all of `p`'s bytes into the stream (after what was written).
    fn take(&mut self, p: &mut Pipe) -> io::Result<()> {
        if let Some(out) = self.fd() {
            match splice_out(p, out) {
                Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
                r => return r,
            }
        }
        copy_out(p, self)
    }
}

/// Splice `p`'s bytes into `out`; `Unsupported` (before any moved) when
/// `out` cannot be spliced into.
fn splice_out(p: &mut Pipe, out: BorrowedFd<'_>) -> io::Result<()> {
    let r = p.ends.as_ref().expect("open").0.as_fd();
    while p.held > 0 {
        match pipe::splice(r, None, out, None, p.held, SpliceFlags::MORE) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => p.held -= n,
            Err(Errno::INTR) => {}
            Err(e) if unsupported(e) => return Err(io::ErrorKind::Unsupported.into()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Read `p`'s bytes and write them to `w` (a stream that cannot be
/// spliced into).
fn copy_out(p: &mut Pipe, w: &mut (impl Write + ?Sized)) -> io::Result<()> {
    let mut buf = vec![0u8; p.held.min(256 << 10)];
    while p.held > 0 {
        let want = p.held.min(buf.len());
        let n = match rustix::io::read(p.read_end(), &mut buf[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        p.held -= n;
        w.write_all(&buf[..n])?;
    }
    Ok(())
}

impl Sink for std::fs::File {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}

impl Sink for std::process::ChildStdin {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}

impl Sink for Vec<u8> {
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_goes_through_a_pipe_and_ends_short_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let Some(mut p) = pipe() else {
            return; // no pipe of that room here: the copying way is used
        };
        // A range inside the file: all of it (less a page's start, where
        // it starts inside one).
        assert_eq!(p.fill(f.as_fd(), 5, PIPE_ROOM).unwrap(), PIPE_ROOM - 5);
        let mut out = Vec::new();
        out.take(&mut p).unwrap();
        assert_eq!(out, data[5..PIPE_ROOM]);
        assert_eq!(p.fill(f.as_fd(), 8192, PIPE_ROOM).unwrap(), PIPE_ROOM);
        let mut out = Vec::new();
        out.take(&mut p).unwrap();
        assert_eq!(out, data[8192..8192 + PIPE_ROOM]);
        assert!(p.is_empty());
        drop(p);
        // Into a file descriptor (spliced), the last bytes: short.
        let mut p = pipe().unwrap();
        let at = (data.len() - 1000) as u64;
        assert_eq!(p.fill(f.as_fd(), at, PIPE_ROOM).unwrap(), 1000);
        let outp = dir.path().join("out");
        let mut o = std::fs::File::create(&outp).unwrap();
        o.write_all(b"head").unwrap();
        o.take(&mut p).unwrap();
        drop(o);
        let got = std::fs::read(&outp).unwrap();
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..], &data[data.len() - 1000..]);
        // Past the end: nothing.
        assert_eq!(p.fill(f.as_fd(), data.len() as u64, 10).unwrap(), 0);
    }

    #[test]
    fn a_pipe_dropped_with_bytes_in_it_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 10_000]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let Some(mut p) = pipe() else { return };
        assert_eq!(p.fill(f.as_fd(), 0, 10_000).unwrap(), 10_000);
        drop(p);
        // Every pipe handed out afterwards starts empty.
        let mut all: Vec<Pipe> = (0..PIPES).map_while(|_| pipe()).collect();
        for p in &mut all {
            assert!(p.is_empty());
            assert_eq!(p.fill(f.as_fd(), 9_990, 100).unwrap(), 10);
            let mut out = Vec::new();
            out.take(p).unwrap();
            assert_eq!(out, vec![7u8; 10]);
        }
    }
}
