//! The patch-in-place path of a delta: a big file whose destination is no
//! longer than the source (scattered edits at fixed offsets, a grown tail,
//! or both) is patched where it is instead of rebuilt into a new temporary
//! (a rebuild writes the whole file again, seconds per GiB).
//!
//! Both ends hash at once, in blocks at fixed offsets ([`Layout`]), keyed
//! HighwayHash-256 ([`block_hash`]) under a key drawn for the file: the receiver the blocks of its
//! old file, the sender the same blocks of its first old-size bytes and
//! the tail beyond in blocks counted from the old end. The receiver's
//! block hashes (truncated to [`SHORT`] bytes) go to the sender's side, which
//! picks the blocks that differ; too many ([`too_many`]) and the normal
//! delta runs. Otherwise the receiver writes a rollback record holding the
//! old bytes of every block to be overwritten (synced), the differing
//! blocks are written in place and the tail appended, and the whole file
//! is checked without reading it again: the sender's [`root`] over the
//! full hashes of every block of its new content against the receiver's,
//! made of its own hashes of the blocks it kept and the hashes of the
//! bytes it wrote. A mismatch rolls the file back (old bytes, old size,
//! old mtime and mode) and the file is sent whole. A run killed between
//! record and removal leaves the record: the next listing of that
//! directory rolls the file back before anything reads it.

use parking_lot::Mutex;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::entry::Meta;
use crate::piece::pread_full;
use crate::store::SourceFile;

/// Smallest block of a patch in place.
pub const MIN_PATCH_BLOCK: u64 = 8 << 10;
/// Blocks of a file at most (log2): the block grows with the file, in
/// powers of two.
const MAX_BLOCKS_LOG: u32 = 17;
/// Differing bytes at most for a patch in place (also at most an eighth of
/// the file): beyond, the in-place writes and the record approach a rebuild.
pub const MAX_PATCH_BYTES: u64 = 256 << 20;
/// Blocks hashed as one piece of work.
const BLOCKS_PER_PIECE: usize = 1024;

/// Where the blocks of a patch in place lie: the first `old` bytes cut in
/// `block`s from 0 (the last one may be short), then the tail
/// `old..new` cut in `block`s from `old`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Block size (a power of two).
    pub block: u64,
    /// Size of the destination's old file.
    pub old: u64,
    /// Size of the new content.
    pub new: u64,
}

impl Layout {
    /// The layout of an old file of `old` bytes patched to `new` bytes
    /// (`old <= new`), the block chosen from `new`.
    pub fn new(old: u64, new: u64) -> Layout {
        Layout {
            block: patch_block(new),
            old,
            new,
        }
    }

    /// Blocks of the old size (compared between the ends).
    pub fn head(&self) -> usize {
        self.old.div_ceil(self.block) as usize
    }

    /// Blocks of the tail.
    pub fn tail(&self) -> usize {
        self.new.saturating_sub(self.old).div_ceil(self.block) as usize
    }

    /// All blocks of the new content.
    pub fn blocks(&self) -> usize {
        self.head() + self.tail()
    }

    /// Offset and length of block `k` (head blocks first, then the tail's).
    pub fn span(&self, k: usize) -> (u64, usize) {
        let h = self.head();
        let (at, end) = if k < h {
            let at = k as u64 * self.block;
            (at, self.old)
        } else {
            (self.old + (k - h) as u64 * self.block, self.new)
        };
        (at, (end - at).min(self.block) as usize)
    }
}

/// The block size of a patch in place of a file of `size` bytes: a power
/// of two, at least [`MIN_PATCH_BLOCK`], for at most 2^17 blocks (a
/// 1 GiB file: 8 KiB blocks, a 512 KiB list on the wire).
pub fn patch_block(size: u64) -> u64 {
    size.div_ceil(1 << MAX_BLOCKS_LOG)
        .next_power_of_two()
        .max(MIN_PATCH_BLOCK)
}

/// True when `changed` head blocks are too many to patch in place: their
/// bytes more than an eighth of the file or [`MAX_PATCH_BYTES`].
pub fn too_many(l: &Layout, changed: usize) -> bool {
    let bytes = changed as u64 * l.block;
    bytes > (l.new / 8).min(MAX_PATCH_BYTES)
}

/// The sender's hashes for a patch in place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchHashes {
    /// The head blocks' hashes, truncated ([`short`]).
    pub list: Vec<u64>,
    /// [`root`] of the full hashes of every block of the new content.
    pub root: [u8; 32],
}

/// Bytes of a block hash on the wire: a changed block passes for
/// unchanged with odds of 2^-32 (the key is secret to the ends, so no
/// content can be made to), and then the whole-file check fails and the
/// file goes whole; 4 bytes keep the list of a 1 GiB file at 512 KiB.
pub const SHORT: usize = 4;

/// A block hash as it travels: its first [`SHORT`] bytes.
pub fn short(h: &[u8; 32]) -> u64 {
    u64::from(u32::from_le_bytes(h[..SHORT].try_into().expect("4 bytes")))
}

/// The strong hash of one block of a patch in place: HighwayHash-256 keyed
/// with the file's `key`. A keyed hash made so that nobody who does not
/// know the key can find collisions (the key is drawn at random per file
/// and stays between the ends), at 3-4x blake3's speed here: both ends of
/// a patch hash a whole file each, which was most of an append's time
/// (`cargo bench -p ferry-engine --bench blockhash`).
pub fn block_hash(key: &[u8; 32], data: &[u8]) -> [u8; 32] {
    let mut h = BlockHasher::new(key);
    h.update(data);
    h.finalize()
}

/// [`block_hash`] of bytes that come in pieces.
#[derive(Clone, Debug)]
pub struct BlockHasher(highway::HighwayHasher);

impl BlockHasher {
    /// A hasher under `key`.
    pub fn new(key: &[u8; 32]) -> BlockHasher {
        let w = |i: usize| u64::from_le_bytes(key[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        BlockHasher(highway::HighwayHasher::new(highway::Key([
            w(0),
            w(1),
            w(2),
            w(3),
        ])))
    }

    /// Hash `data` next.
    pub fn update(&mut self, data: &[u8]) {
        use highway::HighwayHash;
        self.0.append(data);
    }

    /// The hash of everything given.
    pub fn finalize(self) -> [u8; 32] {
        use highway::HighwayHash;
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(8).zip(self.0.finalize256()) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        out
    }
}

/// The whole-file hash of a patch: blake3 over the full block hashes of
/// the new content, in order.
pub fn root(hashes: &[[u8; 32]]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for b in hashes {
        h.update(b);
    }
    *h.finalize().as_bytes()
}

/// A list of truncated hashes as bytes (little-endian, [`SHORT`] each).
pub fn encode_list(list: &[u64]) -> Vec<u8> {
    list.iter()
        .flat_map(|h| (*h as u32).to_le_bytes())
        .collect()
}

/// [`encode_list`]'s bytes back to the list.
pub fn decode_list(b: &[u8]) -> io::Result<Vec<u64>> {
    if !b.len().is_multiple_of(SHORT) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "patch in place: bad block list",
        ));
    }
    Ok(b.chunks_exact(SHORT)
        .map(|c| u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))))
        .collect())
}

/// The head blocks whose hashes differ between `ours` and `theirs` (two
/// lists of the same layout), in order; `None` when the lists do not
/// match in length.
pub fn differing(ours: &[u64], theirs: &[u64]) -> Option<Vec<u32>> {
    if ours.len() != theirs.len() {
        return None;
    }
    Some(
        ours.iter()
            .zip(theirs)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i as u32)
            .collect(),
    )
}

/// The receiver's side of one patch in place, made by
/// [`DeltaStore::delta_inplace`](crate::store::DeltaStore::delta_inplace) (which
/// started hashing the old file). Dropped without [`InPlace::commit`],
/// whatever was written is rolled back.
pub trait InPlace: Send {
    /// The old file's head block hashes, truncated ([`short`]), waiting
    /// for them; `None` when it cannot be patched in place after all
    /// (changed since listed, not a regular file with one link).
    fn blocks(&mut self) -> io::Result<Option<Vec<u64>>>;
    /// The rollback record written and synced, holding the old bytes of
    /// the head blocks `changed` (in order) and the new content's short
    /// hashes of them (`new`, in the same order: a recovery checks that
    /// each block is still either): `true` when begun, `false` when
    /// another run holds the file (nothing was changed).
    fn begin(&mut self, changed: &[u32], new: &[u64]) -> io::Result<bool>;
    /// Bytes at `at`: whole changed head blocks (a run of them, from a
    /// block's start), or the tail's next bytes in order from the old end.
    fn write(&mut self, at: u64, data: &[u8]) -> io::Result<()>;
    /// The end: the [`root`] of the new content checked against `root`,
    /// `meta` set, the file synced with `fsync` (the record is always
    /// synced), the record removed. On a hash that does not match the
    /// file is rolled back and the error is [`super::mismatch`].
    fn commit(self: Box<Self>, root: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()>;
    /// Give up: what was written is rolled back.
    fn abort(self: Box<Self>);
}

/// The full hashes of blocks `0..count` of `l` in the file `fd` (which
/// must hold them all), keyed with `key`, on every core, straight from the
/// page cache through a shared read-only mapping.
pub fn hash_blocks(
    fd: BorrowedFd<'_>,
    l: &Layout,
    count: usize,
    key: &[u8; 32],
) -> io::Result<Vec<[u8; 32]>> {
    let mut out = vec![[0u8; 32]; count];
    if count == 0 {
        return Ok(out);
    }
    let (last_at, last_len) = l.span(count - 1);
    let len = last_at + last_len as u64;
    let st = rustix::fs::fstat(fd)?;
    if (st.st_size as u64) < len {
        return Err(io::Error::other(format!(
            "changed while hashed (size {len} expected, {} there)",
            st.st_size
        )));
    }
    let map = super::append::Map::new(fd, len)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let work = Mutex::new(out.chunks_mut(BLOCKS_PER_PIECE).enumerate());
    let stop = AtomicBool::new(false);
    let run = || -> io::Result<()> {
        loop {
            let next = work.lock().next();
            let Some((p, hs)) = next else { return Ok(()) };
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let first = p * BLOCKS_PER_PIECE;
            let (a, _) = l.span(first);
            let (z, zl) = l.span(first + hs.len() - 1);
            let piece = match map.range(a, (z + zl as u64 - a) as usize) {
                Ok(b) => b,
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            };
            for (i, h) in hs.iter_mut().enumerate() {
                let (at, n) = l.span(first + i);
                let s = (at - a) as usize;
                *h = block_hash(key, &piece[s..s + n]);
            }
        }
    };
    let res: Vec<io::Result<()>> = std::thread::scope(|s| {
        let others: Vec<_> = (1..threads).map(|_| s.spawn(run)).collect();
        let mine = run();
        std::iter::once(mine)
            .chain(others.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("hashing panicked")))
            }))
            .collect()
    });
    for r in res {
        r?;
    }
    Ok(out)
}

/// The sender's [`PatchHashes`] of the `l.new` bytes of `fd` (exactly
/// that many: a file longer or shorter changed).
pub fn fd_patch_hashes(fd: BorrowedFd<'_>, l: &Layout, key: &[u8; 32]) -> io::Result<PatchHashes> {
    let all = hash_blocks(fd, l, l.blocks(), key)?;
    let mut one = [0u8; 1];
    if pread_full(fd, &mut one, l.new)? > 0 {
        return Err(io::Error::other(format!(
            "changed while hashed (size {} expected, more read)",
            l.new
        )));
    }
    Ok(PatchHashes {
        list: all[..l.head()].iter().map(short).collect(),
        root: root(&all),
    })
}

/// [`fd_patch_hashes`] of a source file (one with a descriptor:
/// `Unsupported` otherwise).
pub fn source_patch_hashes(
    r: &mut dyn SourceFile,
    l: &Layout,
    key: &[u8; 32],
) -> io::Result<PatchHashes> {
    let Some(fd) = r.as_fd() else {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    };
    fd_patch_hashes(fd, l, key)
}

/// Read `buf.len()` bytes at `at` of a source file (one with a
/// descriptor: `Unsupported` otherwise); fewer only at its end.
pub fn source_read_at(r: &mut dyn SourceFile, at: u64, buf: &mut [u8]) -> io::Result<usize> {
    let Some(fd) = r.as_fd() else {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    };
    pread_full(fd, buf, at)
}

/// The receiver's running hashes of a patch: the old file's full head
/// hashes, replaced as changed blocks are written, and the tail's, made as
/// it is written; [`Tracker::root`] once every changed block and the
/// whole tail came. Writes anywhere else are refused (the record covers
/// only the changed blocks).
#[derive(Debug)]
pub struct Tracker {
    l: Layout,
    key: [u8; 32],
    hashes: Vec<[u8; 32]>,
    /// Per head block: 0 unchanged, 1 changed and not written yet, 2 written.
    state: Vec<u8>,
    pending: usize,
    tail: Vec<[u8; 32]>,
    piece: BlockHasher,
    in_piece: u64,
    tail_done: u64,
}

impl Tracker {
    /// A tracker of `l` under `key` with the old file's full head hashes.
    pub fn new(l: Layout, key: [u8; 32], head: Vec<[u8; 32]>) -> Tracker {
        let n = head.len();
        Tracker {
            l,
            key,
            hashes: head,
            state: vec![0; n],
            pending: 0,
            tail: Vec::with_capacity(l.tail()),
            piece: BlockHasher::new(&key),
            in_piece: 0,
            tail_done: 0,
        }
    }

    /// The head blocks' truncated hashes.
    pub fn list(&self) -> Vec<u64> {
        self.hashes.iter().map(short).collect()
    }

    /// Mark `changed` as to be written; an error when out of range or not
    /// in order.
    pub fn expect(&mut self, changed: &[u32]) -> io::Result<()> {
        let mut last = None;
        for &i in changed {
            if i as usize >= self.state.len() || last.is_some_and(|l| l >= i) {
                return Err(io::Error::other("patch in place: bad changed block"));
            }
            last = Some(i);
            self.state[i as usize] = 1;
        }
        self.pending = changed.len();
        Ok(())
    }

    /// Check that `data` may be written at `at` and take its hashes.
    pub fn write(&mut self, at: u64, data: &[u8]) -> io::Result<()> {
        let bad = || io::Error::other("patch in place: a write outside the changed blocks");
        if at < self.l.old {
            if !at.is_multiple_of(self.l.block) || at + data.len() as u64 > self.l.old {
                return Err(bad());
            }
            let mut k = (at / self.l.block) as usize;
            let mut off = 0;
            while off < data.len() {
                let (_, n) = self.l.span(k);
                if self.state[k] != 1 || off + n > data.len() {
                    return Err(bad());
                }
                self.hashes[k] = block_hash(&self.key, &data[off..off + n]);
                self.state[k] = 2;
                self.pending -= 1;
                off += n;
                k += 1;
            }
            return Ok(());
        }
        if at != self.l.old + self.tail_done || at + data.len() as u64 > self.l.new {
            return Err(bad());
        }
        let mut d = data;
        while !d.is_empty() {
            let k = ((self.l.block - self.in_piece) as usize).min(d.len());
            self.piece.update(&d[..k]);
            self.in_piece += k as u64;
            self.tail_done += k as u64;
            d = &d[k..];
            if self.in_piece == self.l.block || self.l.old + self.tail_done == self.l.new {
                let h = std::mem::replace(&mut self.piece, BlockHasher::new(&self.key));
                self.tail.push(h.finalize());
                self.in_piece = 0;
            }
        }
        Ok(())
    }

    /// The [`root`] of the new content, once everything came (`None`
    /// before).
    pub fn root(&self) -> Option<[u8; 32]> {
        if self.pending != 0 || self.l.old + self.tail_done != self.l.new {
            return None;
        }
        let mut all = self.hashes.clone();
        all.extend_from_slice(&self.tail);
        Some(root(&all))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn file(data: &[u8]) -> std::fs::File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(data).unwrap();
        f
    }

    fn data(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    #[test]
    fn blocks_grow_with_the_file_in_powers_of_two() {
        assert_eq!(patch_block(0), MIN_PATCH_BLOCK);
        assert_eq!(patch_block(1 << 30), 8 << 10);
        assert_eq!(patch_block((1 << 30) + 1), 16 << 10);
        assert_eq!(patch_block(1 << 40), 8 << 20);
        let l = Layout::new(100_000, 130_000);
        assert_eq!((l.head(), l.tail(), l.blocks()), (13, 4, 17));
        assert_eq!(l.span(12), (12 * 8192, 100_000 - 12 * 8192));
        assert_eq!(l.span(13), (100_000, 8192));
        assert_eq!(l.span(16), (100_000 + 3 * 8192, 30_000 - 3 * 8192));
    }

    /// The receiver's tracker, fed the changed blocks and the tail, makes
    /// the sender's root; a block written twice, outside the changed ones
    /// or off its start is refused.
    #[test]
    fn the_tracker_makes_the_senders_root() {
        let old = data(100_000, 1);
        let mut new = old.clone();
        new[9000] ^= 1;
        new[99_999] ^= 1;
        new.extend_from_slice(&data(30_000, 2));
        let l = Layout::new(old.len() as u64, new.len() as u64);
        let key = [7u8; 32];
        let theirs = fd_patch_hashes(file(&new).as_fd(), &l, &key).unwrap();
        let head = hash_blocks(file(&old).as_fd(), &l, l.head(), &key).unwrap();
        let mut t = Tracker::new(l, key, head);
        let changed = differing(&t.list(), &theirs.list).unwrap();
        assert_eq!(changed, vec![1, 12]);
        t.expect(&changed).unwrap();
        assert!(t.write(0, &new[..8192]).is_err());
        assert!(t.write(8193, &new[8193..16384]).is_err());
        t.write(8192, &new[8192..16384]).unwrap();
        assert!(t.write(8192, &new[8192..16384]).is_err());
        assert!(t.root().is_none());
        t.write(12 * 8192, &new[12 * 8192..100_000]).unwrap();
        assert!(t.write(100_001, &new[100_001..100_002]).is_err());
        for c in new[100_000..].chunks(5000) {
            let at = c.as_ptr() as usize - new.as_ptr() as usize;
            t.write(at as u64, c).unwrap();
        }
        assert_eq!(t.root(), Some(theirs.root));
        // Another key: other hashes.
        let other = fd_patch_hashes(file(&new).as_fd(), &l, &[8u8; 32]).unwrap();
        assert_ne!(other.root, theirs.root);
        // A file of another size than expected: changed.
        let l2 = Layout {
            new: l.new + 1,
            ..l
        };
        assert!(fd_patch_hashes(file(&new).as_fd(), &l2, &key).is_err());
        let l3 = Layout {
            new: l.new - 1,
            ..l
        };
        assert!(fd_patch_hashes(file(&new).as_fd(), &l3, &key).is_err());
    }
}
