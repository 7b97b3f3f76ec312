//! Delta transfers on a local tree (`ferry_engine::delta`): the signature
//! of a file's old copy, and a new copy rebuilt from it and the sender's
//! ops into a writer's temporary.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::mpsc;

use ferry_engine::delta::{self, DiffSummary, OpSink, Patcher, Signature};
use ferry_engine::entry::Kind;
use ferry_engine::store::{SourceFile, Store};
use rustix::fs::{self as rfs, Mode, OFlags};

use ferry_engine::piece::DIRECT_ALIGN;

use crate::download::Direct;
use crate::local::{LocalDir, LocalStore};

/// Threads hashing a signature's blocks at most.
const SIGN_THREADS: usize = 4;

/// The signature of `name` in `dir`, `None` unless it is a regular file of
/// at least `min` bytes. Read once, hashed on every core.
pub(crate) fn signature(
    store: &LocalStore,
    dir: &LocalDir,
    name: &CStr,
    min: u64,
) -> io::Result<Option<Signature>> {
    match store.stat(dir, name)? {
        Some(m) if m.kind == Kind::File && m.size >= min => {}
        _ => return Ok(None),
    }
    let mut r = store.open_file(dir, name)?;
    let Some((size, ..)) = r.current() else {
        return Ok(None);
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(SIGN_THREADS));
    let block = delta::block_size(size);
    delta::sign(&mut r, size, block, delta::new_key(), threads).map(Some)
}

/// Rebuild into `out` (a writer's descriptor, written from its start) the
/// content made of `old` in `dir` (which `sig` describes) and the ops that
/// `feed` hands over; the content's hash is checked at their end.
pub(crate) fn rebuild(
    dir: &LocalDir,
    out: BorrowedFd<'_>,
    old: &CStr,
    sig: &Signature,
    feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
) -> io::Result<DiffSummary> {
    let fd = rfs::openat(
        dir.fd(),
        old,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // The writer's thread hashes what it writes: the rebuilt file is
    // checked as written, beside the reading of the old copy.
    let mut p = Patcher::new(File::from(fd), sig.block, sig.size)?.unhashed();
    let mut w = SeqOut::hashed(out)?;
    let sum = feed(&mut p.sink(|b| w.write(b)))?;
    let got = w.finish_hash()?;
    let n = p.check(got)?;
    if n != sum.size {
        return Err(delta::mismatch());
    }
    Ok(sum)
}

/// Bytes gathered before a write.
const OUT_BUF: usize = 1 << 20;
/// Buffers between the one filling and the writer thread.
const OUT_BUFS: usize = 3;

/// An aligned buffer: `raw[skew..skew + len]`.
struct Buf {
    raw: Vec<u8>,
    skew: usize,
    len: usize,
}

/// A new file written in order from its start, through aligned buffers
/// that a thread of its own writes while the next one fills: their whole
/// aligned blocks go to the device with `O_DIRECT` where the filesystem
/// takes it (a buffered write into new pages of the page cache costs
/// several times the CPU), the rest through the page cache. With
/// [`SeqOut::hashed`] another thread hashes the bytes, in order, before
/// they go to the writer.
pub struct SeqOut {
    cur: Buf,
    full: Option<mpsc::SyncSender<(Buf, u64)>>,
    free: mpsc::Receiver<Buf>,
    made: usize,
    /// Buffers made at most.
    bufs: usize,
    off: u64,
    writer: Option<std::thread::JoinHandle<io::Result<()>>>,
    hasher: Option<std::thread::JoinHandle<[u8; 32]>>,
    hash: Option<[u8; 32]>,
}

impl SeqOut {
    /// For the file open as `fd`, written from its start.
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<SeqOut> {
        SeqOut::start(fd, false)
    }

    /// As [`SeqOut::new`], the bytes written also hashed (blake3) by a
    /// thread of their own: [`SeqOut::finish_hash`].
    pub fn hashed(fd: BorrowedFd<'_>) -> io::Result<SeqOut> {
        SeqOut::start(fd, true)
    }

    fn start(fd: BorrowedFd<'_>, hash: bool) -> io::Result<SeqOut> {
        let fd = fd.try_clone_to_owned()?;
        let (full, rx) = mpsc::sync_channel::<(Buf, u64)>(OUT_BUFS - 1);
        let (back, free) = mpsc::channel();
        // The hash in a thread of its own, ahead of the writes: hashed in
        // the writing thread, the device sat idle while each buffer was
        // hashed (a quarter of a rebuild's time at ~800 MB/s).
        let (rx, hasher) = if hash {
            let (tx, hashed) = mpsc::sync_channel::<(Buf, u64)>(OUT_BUFS - 1);
            let hasher = std::thread::spawn(move || {
                let mut h = blake3::Hasher::new();
                for (b, off) in rx {
                    h.update(&b.raw[b.skew..b.skew + b.len]);
                    if tx.send((b, off)).is_err() {
                        // The writer stopped: its error is the one told.
                        break;
                    }
                }
                *h.finalize().as_bytes()
            });
            (hashed, Some(hasher))
        } else {
            (rx, None)
        };
        let writer = std::thread::spawn(move || {
            let direct = Direct::reopen(fd.as_fd());
            for (b, off) in rx {
                direct.write(fd.as_fd(), &b.raw[b.skew..b.skew + b.len], off)?;
                let _ = back.send(b);
            }
            Ok(())
        });
        Ok(SeqOut {
            cur: buf(),
            full: Some(full),
            free,
            made: 1,
            bufs: if hash { 2 * OUT_BUFS } else { OUT_BUFS },
            off: 0,
            writer: Some(writer),
            hasher,
            hash: None,
        })
    }

    /// Append `data`.
    pub fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let b = &mut self.cur;
            let n = (OUT_BUF - b.len).min(data.len());
            b.raw[b.skew + b.len..b.skew + b.len + n].copy_from_slice(&data[..n]);
            b.len += n;
            data = &data[n..];
            if b.len == OUT_BUF {
                self.hand_over()?;
            }
        }
        Ok(())
    }

    fn hand_over(&mut self) -> io::Result<()> {
        let next = match self.free.try_recv() {
            Ok(b) => b,
            Err(_) if self.made < self.bufs => {
                self.made += 1;
                buf()
            }
            Err(_) => match self.free.recv() {
                Ok(b) => b,
                Err(_) => {
                    // The writer stopped: its error.
                    self.full = None;
                    return self.finish().and(Err(io::Error::other("write stopped")));
                }
            },
        };
        let mut b = std::mem::replace(&mut self.cur, next);
        let len = b.len as u64;
        self.cur.len = 0;
        let sent = match &self.full {
            Some(tx) => tx.send((b, self.off)).is_ok(),
            None => {
                b.len = 0;
                false
            }
        };
        self.off += len;
        if !sent {
            // The writer stopped: its error.
            return self.finish().and(Err(io::Error::other("write stopped")));
        }
        Ok(())
    }

    /// Write what is gathered and wait for the writes: the first error of
    /// any of them.
    pub fn finish(&mut self) -> io::Result<()> {
        if self.cur.len > 0 && self.full.is_some() {
            self.hand_over()?;
        }
        self.full = None;
        // The hasher first: it ends once the last buffer went to the writer.
        let hashed = self.hasher.take().map(|h| h.join());
        if let Some(w) = self.writer.take() {
            w.join()
                .unwrap_or_else(|_| Err(io::Error::other("writer panicked")))?;
        }
        if let Some(h) = hashed {
            self.hash = Some(h.map_err(|_| io::Error::other("delta: hashing panicked"))?);
        }
        Ok(())
    }

    /// [`SeqOut::finish`], then the blake3 hash of every byte written (a
    /// [`SeqOut::hashed`] writer).
    pub fn finish_hash(&mut self) -> io::Result<[u8; 32]> {
        self.finish()?;
        self.hash
            .ok_or_else(|| io::Error::other("delta: the writer kept no hash"))
    }
}

fn buf() -> Buf {
    let raw = vec![0u8; OUT_BUF + DIRECT_ALIGN];
    let skew = raw.as_ptr().align_offset(DIRECT_ALIGN);
    Buf { raw, skew, len: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Read;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Whatever the sizes of the writes, the file holds every byte in
        /// order and the hash is that of the file.
        #[test]
        fn hashed_writes_land_in_order_with_their_hash(
            seed in any::<u64>(),
            sizes in prop::collection::vec(0usize..(3 << 20), 0..8),
        ) {
            let mut xof = blake3::Hasher::new().update(&seed.to_le_bytes()).finalize_xof();
            let mut all = Vec::new();
            let mut f = tempfile::tempfile().unwrap();
            let mut w = SeqOut::hashed(f.as_fd()).unwrap();
            for n in sizes {
                let mut part = vec![0u8; n];
                xof.fill(&mut part);
                w.write(&part).unwrap();
                all.extend_from_slice(&part);
            }
            let h = w.finish_hash().unwrap();
            prop_assert_eq!(h, *blake3::hash(&all).as_bytes());
            let mut got = Vec::new();
            f.read_to_end(&mut got).unwrap();
            prop_assert!(got == all, "file differs");
        }
    }

    /// Writes that fail (`/dev/full`): the error comes back (from a write
    /// or the finish), nothing hangs, no hash is given.
    #[test]
    fn a_failing_write_is_an_error_not_a_hang() {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut w = SeqOut::hashed(f.as_fd()).unwrap();
        let data = vec![7u8; 1 << 20];
        let mut failed = false;
        for _ in 0..32 {
            if w.write(&data).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed || w.finish_hash().is_err());
    }
}
