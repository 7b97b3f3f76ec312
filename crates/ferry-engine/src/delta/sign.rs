//! The receiver's side of a delta's first step: checksums of its old file,
//! block by block. The file is read once, in order, by the calling thread
//! while the blocks already read are hashed by workers on every core.

use parking_lot::Mutex;
use std::io;
use std::sync::mpsc;

use super::{strong_len, Signature};
use crate::piece::pread_full;
use crate::store::SourceFile;

/// Added to every byte in the weak checksum (rsync's `CHAR_OFFSET` idea:
/// runs of zeros still move the sums).
const OFFSET: u32 = 31;
/// Bytes read and hashed as one piece of work, about.
const CHUNK: usize = 4 << 20;

/// The weak checksum of `data`: rsync's two 16-bit sums, `s1` the sum of
/// the bytes, `s2` the sum of the running `s1`s, as `s2 << 16 | s1`.
pub fn weak(data: &[u8]) -> u32 {
    Rolling::new(data).value()
}

/// The strong hash of a block under `key` (blake3 keyed), its first `len`
/// bytes (little-endian; the rest zero).
pub fn strong(key: &[u8; 32], data: &[u8], len: u8) -> u64 {
    let h = blake3::keyed_hash(key, data);
    let mut b = [0u8; 8];
    let n = usize::from(len).min(8);
    b[..n].copy_from_slice(&h.as_bytes()[..n]);
    u64::from_le_bytes(b)
}

/// The weak checksum of a window that slides one byte at a time.
#[derive(Clone, Copy, Debug)]
pub struct Rolling {
    s1: u32,
    s2: u32,
    len: u32,
}

impl Rolling {
    /// The sums of `data`, 64 bytes at a time: over a run of 64 bytes the
    /// running sum adds 64 times the `s1` before it plus the bytes weighted
    /// 64..1, as zlib's vectorized Adler-32 does. The bytes are widened to
    /// 16 bits first, which lets the compiler use multiply-add
    /// instructions on whole vectors.
    pub fn new(data: &[u8]) -> Rolling {
        const C: usize = 64;
        let (mut s1, mut s2) = (0u32, 0u32);
        let mut chunks = data.chunks_exact(C);
        for c in &mut chunks {
            s2 = s2.wrapping_add(s1.wrapping_mul(C as u32));
            let mut w = [0u16; C];
            for (w, &x) in w.iter_mut().zip(c) {
                *w = u16::from(x);
            }
            let (mut a, mut b) = (0u32, 0u32);
            for (j, &x) in w.iter().enumerate() {
                a += u32::from(x);
                b += u32::from(x) * (C - j) as u32;
            }
            s1 = s1.wrapping_add(a);
            s2 = s2.wrapping_add(b);
        }
        for &x in chunks.remainder() {
            s1 = s1.wrapping_add(u32::from(x));
            s2 = s2.wrapping_add(s1);
        }
        let n = data.len() as u32;
        // Each byte counts OFFSET more: n times in s1, n(n+1)/2 in s2.
        let tri = (u64::from(n) * (u64::from(n) + 1) / 2) as u32;
        Rolling {
            s1: s1.wrapping_add(OFFSET.wrapping_mul(n)),
            s2: s2.wrapping_add(OFFSET.wrapping_mul(tri)),
            len: n,
        }
    }

    /// Slide the window one byte: `out` leaves at the front, `inn` comes
    /// in at the back.
    #[inline(always)]
    pub fn roll(&mut self, out: u8, inn: u8) {
        let (o, i) = (u32::from(out), u32::from(inn));
        self.s1 = self.s1.wrapping_sub(o).wrapping_add(i);
        self.s2 = self
            .s2
            .wrapping_sub(self.len.wrapping_mul(o + OFFSET))
            .wrapping_add(self.s1);
    }

    /// The checksum.
    #[inline(always)]
    pub fn value(&self) -> u32 {
        (self.s2 << 16) | (self.s1 & 0xffff)
    }
}

/// The signature of the `size` bytes `r` yields, cut in `block`s, strong
/// hashes under `key`. A local file (one with a descriptor) is read by
/// `threads` workers at once, each reading a piece with `pread` and hashing
/// it while it is in the cache (the file read once, on every core);
/// anything else is read once, in order, in pieces of a few MiB that
/// `threads` workers hash as they arrive. A file that turns out shorter or
/// longer than `size` is an error (it changed while read).
pub fn sign(
    r: &mut dyn SourceFile,
    size: u64,
    block: u32,
    key: [u8; 32],
    threads: usize,
) -> io::Result<Signature> {
    let n = Signature::blocks_of(size, block) as usize;
    let sl = strong_len(size, block);
    let (weak, strong) = match r.as_fd() {
        Some(fd) => sign_at(fd, size, block, &key, sl, threads.max(1))?,
        None => sign_stream(r, size, block, &key, sl, threads.max(1))?,
    };
    debug_assert_eq!(weak.len(), n);
    Ok(Signature {
        block,
        size,
        key,
        strong_len: sl,
        weak,
        strong,
    })
}

/// Bytes read by one `pread` of [`sign_at`]: small enough to stay in the
/// cache while both sums run over it.
const AT_PIECE: usize = 1 << 20;

fn changed(size: u64, total: u64) -> io::Error {
    io::Error::other(format!(
        "changed while its delta signature was made (size {size} expected, {total}{} read)",
        if total > size { "+" } else { "" }
    ))
}

/// [`sign`] of a file read with `pread` by `threads` workers, each taking
/// the next piece.
fn sign_at(
    fd: std::os::fd::BorrowedFd<'_>,
    size: u64,
    block: u32,
    key: &[u8; 32],
    sl: u8,
    threads: usize,
) -> io::Result<(Vec<u32>, Vec<u64>)> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let n = Signature::blocks_of(size, block) as usize;
    let b = block as usize;
    let piece = (AT_PIECE / b).max(1) * b;
    let pieces = size.div_ceil(piece as u64);
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let out = Mutex::new((vec![0u32; n], vec![0u64; n]));
    let work = || -> io::Result<()> {
        let mut buf = vec![0u8; piece];
        let (mut ws, mut ss) = (Vec::new(), Vec::new());
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= pieces || stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let at = i * piece as u64;
            let want = (size - at).min(piece as u64) as usize;
            let got = pread_full(fd, &mut buf[..want], at)?;
            if got < want {
                stop.store(true, Ordering::Relaxed);
                return Err(changed(size, at + got as u64));
            }
            let first = (at / u64::from(block)) as usize;
            sum_blocks(&buf[..want], b, key, sl, (first, &out), (&mut ws, &mut ss));
        }
    };
    let res: Vec<io::Result<()>> = std::thread::scope(|s| {
        let others: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mine = work();
        std::iter::once(mine)
            .chain(others.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("delta: hashing panicked")))
            }))
            .collect()
    });
    for r in res {
        r?;
    }
    // Longer than it was: it changed.
    let mut one = [0u8; 1];
    if pread_full(fd, &mut one, size)? > 0 {
        return Err(changed(size, size + 1));
    }
    Ok(out.into_inner())
}

/// Weak and strong sums of a signature's blocks, filled by the workers.
type Sums = (Vec<u32>, Vec<u64>);

/// The sums of the `block`-byte blocks of `buf` (blocks `first` on of
/// the file) into `out`, through the scratch vectors `tmp`.
fn sum_blocks(
    buf: &[u8],
    block: usize,
    key: &[u8; 32],
    sl: u8,
    (first, out): (usize, &Mutex<Sums>),
    (ws, ss): (&mut Vec<u32>, &mut Vec<u64>),
) {
    ws.clear();
    ss.clear();
    for c in buf.chunks(block) {
        ws.push(weak(c));
        ss.push(strong(key, c, sl));
    }
    let mut o = out.lock();
    o.0[first..first + ws.len()].copy_from_slice(ws);
    o.1[first..first + ss.len()].copy_from_slice(ss);
}

/// [`sign`] of a stream: read in order by the calling thread, hashed by
/// `threads` workers.
fn sign_stream(
    r: &mut dyn SourceFile,
    size: u64,
    block: u32,
    key: &[u8; 32],
    sl: u8,
    threads: usize,
) -> io::Result<(Vec<u32>, Vec<u64>)> {
    let n = Signature::blocks_of(size, block) as usize;
    let out = Mutex::new((vec![0u32; n], vec![0u64; n]));
    let per = (CHUNK / block as usize).max(1);
    let piece = per * block as usize;
    // Filled pieces go to the workers; emptied buffers come back.
    let (full_tx, full_rx) = mpsc::sync_channel::<(usize, Vec<u8>)>(threads);
    let full_rx = Mutex::new(full_rx);
    let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
    let mut total = 0u64;
    std::thread::scope(|s| -> io::Result<()> {
        for _ in 0..threads {
            let (rx, free, out) = (&full_rx, free_tx.clone(), &out);
            s.spawn(move || loop {
                let job = rx.lock().recv();
                let Ok((first, buf)) = job else { return };
                let (mut ws, mut ss) = (Vec::with_capacity(per), Vec::with_capacity(per));
                sum_blocks(
                    &buf,
                    block as usize,
                    key,
                    sl,
                    (first, out),
                    (&mut ws, &mut ss),
                );
                let _ = free.send(buf);
            });
        }
        let mut first = 0usize;
        let mut made = 0usize;
        loop {
            let mut buf = match free_rx.try_recv() {
                Ok(b) => b,
                Err(_) if made < threads + 2 => {
                    made += 1;
                    vec![0u8; piece]
                }
                Err(_) => free_rx
                    .recv()
                    .map_err(|_| io::Error::other("delta: hashing stopped"))?,
            };
            // Full length again (a short last piece is never reused).
            buf.resize(piece, 0);
            let got = read_full(r, &mut buf)?;
            total += got as u64;
            if total > size {
                break;
            }
            if got == 0 {
                break;
            }
            buf.truncate(got);
            let blocks = got.div_ceil(block as usize);
            if full_tx.send((first, buf)).is_err() {
                break;
            }
            first += blocks;
            if got < piece {
                break;
            }
        }
        drop(full_tx);
        Ok(())
    })?;
    if total != size {
        return Err(changed(size, total));
    }
    Ok(out.into_inner())
}

/// Fill `buf`; fewer bytes only at the end of the input.
pub fn read_full(r: &mut dyn SourceFile, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
