//! The append fast path of a delta: a big file that only grew at its end
//! is appended to in place instead of rebuilt into a new temporary (a
//! rebuild writes the whole file again, seconds per GiB).
//!
//! Both ends hash at once: the receiver blake3 of its whole old file, the
//! sender blake3 of its first old-size bytes in the pass that goes on to
//! its whole-file hash. Equal prefix hashes and a destination that is a
//! regular file with one link: the receiver writes a rollback record (a
//! hidden [`undo_name`](crate::store::undo_name) file in the same
//! directory naming the file, its old size, mtime and mode, synced), then
//! the tail at the old end, checks the whole-file hash (its own hasher
//! continued with the tail), sets the metadata, syncs and removes the
//! record. A hash that does not match rolls the file back (truncated to
//! its old size, its old mtime) and the file is sent whole; a prefix that
//! differs goes the normal delta way. A run killed between record and
//! removal leaves the record: the next listing of that directory rolls the
//! file back before anything reads it.

use std::io;
use std::os::fd::BorrowedFd;

use crate::entry::Meta;
use crate::piece::pread_full;
use crate::store::SourceFile;

/// Files whose destination is at least this big (and shorter than the
/// source) are tried as an append in place.
pub const APPEND_MIN: u64 = 64 << 20;

/// Bytes read and hashed as one piece: a power of two, so the pieces
/// after the first fall on blake3's subtree boundaries.
const PIECE: usize = 8 << 20;

/// The sender's hashes of a file for an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendHashes {
    /// blake3 of the first (old size) bytes.
    pub prefix: [u8; 32],
    /// blake3 of the whole content.
    pub whole: [u8; 32],
}

/// The receiver's side of one append in place, made by
/// [`Store::delta_append`](crate::store::Store::delta_append) (which
/// started hashing the old file). Dropped without [`Appender::commit`],
/// whatever was written is rolled back.
pub trait Appender: Send {
    /// The old file's hash compared with `prefix` (the sender's hash of
    /// its first old-size bytes): `true` when equal and the file can be
    /// appended to in place (a regular file with one link, unchanged since
    /// it was listed): then the rollback record is written and the
    /// appender takes the tail. `false`: nothing was changed.
    fn begin(&mut self, prefix: &[u8; 32]) -> io::Result<bool>;
    /// The next bytes of the tail, in order.
    fn write(&mut self, data: &[u8]) -> io::Result<()>;
    /// The end: the file's whole hash checked against `hash`, `meta` set,
    /// the file synced with `fsync` (`--fsync`: a kill loses nothing the
    /// page cache holds; the record itself is always synced), the record
    /// removed. On a hash that does not match the file is rolled back and
    /// the error is [`super::mismatch`].
    fn commit(self: Box<Self>, hash: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()>;
    /// Give up: what was written is rolled back.
    fn abort(self: Box<Self>);
}

/// blake3 of the first `size` bytes of `fd`, hashed on every core
/// (blake3's rayon hashing) straight from the page cache through a shared
/// read-only mapping (a `pread` copy cost as much CPU as the hash); with
/// `mark`, also the hash of the first `mark` bytes (`mark <= size`).
/// Returns the hasher (to go on with) and that hash. Each piece's pages
/// are mapped in first (`MADV_POPULATE_READ`), which fails instead of
/// faulting on a file cut shorter meanwhile: that is an error (it changed),
/// and only a truncation in the instant between that and the hash of the
/// piece can still end the process (`SIGBUS`, as with any mapped read).
pub fn hash_fd(
    fd: BorrowedFd<'_>,
    size: u64,
    mark: Option<u64>,
) -> io::Result<(blake3::Hasher, Option<[u8; 32]>)> {
    let mut h = blake3::Hasher::new();
    let mut marked = None;
    if mark == Some(0) {
        marked = Some(*h.finalize().as_bytes());
    }
    if size == 0 {
        return Ok((h, marked));
    }
    let st = rustix::fs::fstat(fd)?;
    if (st.st_size as u64) < size {
        return Err(shorter(size, st.st_size as u64));
    }
    let map = Map::new(fd, size)?;
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(PIECE as u64) as usize;
        let b = map.piece(at, n)?;
        match mark {
            Some(m) if marked.is_none() && m > at && m <= at + n as u64 => {
                let k = (m - at) as usize;
                h.update_rayon(&b[..k]);
                marked = Some(*h.finalize().as_bytes());
                h.update_rayon(&b[k..]);
            }
            _ => {
                h.update_rayon(b);
            }
        }
        at += n as u64;
    }
    Ok((h, marked))
}

fn shorter(size: u64, got: u64) -> io::Error {
    io::Error::other(format!(
        "changed while hashed (size {size} expected, {got} there)"
    ))
}

/// A read-only shared mapping of a file's first `len` bytes.
pub(crate) struct Map {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

impl Map {
    #[allow(unsafe_code)]
    pub(crate) fn new(fd: BorrowedFd<'_>, len: u64) -> io::Result<Map> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        let len = usize::try_from(len).map_err(|_| io::Error::other("file too big to map"))?;
        // SAFETY: a new mapping at an address the kernel picks; it aliases
        // no Rust object and lives until `Map` is dropped.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        Ok(Map { ptr, len })
    }

    /// `n` bytes from `at`, their pages mapped in first (an error when the
    /// file is shorter now).
    #[allow(unsafe_code)]
    fn piece(&self, at: u64, n: usize) -> io::Result<&[u8]> {
        use rustix::mm::{madvise, Advice};
        let at = at as usize;
        assert!(at + n <= self.len);
        // SAFETY: the range lies within the mapping.
        let p = unsafe { self.ptr.cast::<u8>().add(at) };
        // Pages are what madvise takes: from the page this piece starts
        // in (pieces start on multiples of `PIECE`, a multiple of the page).
        // SAFETY: advice on pages of our own mapping changes no contents.
        match unsafe { madvise(p.cast(), n, Advice::LinuxPopulateRead) } {
            Ok(()) => {}
            Err(rustix::io::Errno::FAULT) => {
                return Err(io::Error::other("changed while hashed (cut shorter)"))
            }
            // An older kernel: the pages fault in as they are read.
            Err(_) => {}
        }
        // SAFETY: within the mapping, which outlives the borrow of `self`;
        // the file's bytes may change under it (then the hashes differ and
        // the append is refused or rolled back), never its length without
        // the check above failing first, but for the instant after it.
        Ok(unsafe { std::slice::from_raw_parts(p, n) })
    }
}

// SAFETY: a read-only mapping: its pages are read by any thread as a
// shared slice is (`piece`/`range` hand out `&[u8]`), and unmapped once.
#[allow(unsafe_code)]
unsafe impl Sync for Map {}
// SAFETY: as above; the pointer is the mapping's, owned by `Map`.
#[allow(unsafe_code)]
unsafe impl Send for Map {}

impl Map {
    /// [`Map::piece`] from any offset: the pages from the one `at` lies
    /// in are mapped in first.
    #[allow(unsafe_code)]
    pub(crate) fn range(&self, at: u64, n: usize) -> io::Result<&[u8]> {
        let page = rustix::param::page_size() as u64;
        let start = at - at % page;
        let b = self.piece(start, n + (at - start) as usize)?;
        Ok(&b[(at - start) as usize..])
    }
}

impl Drop for Map {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: our mapping, no slice of it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

/// The sender's [`AppendHashes`] of `r` (not read yet), which must hold
/// exactly `size` bytes, in one pass; afterwards `r` reads on from
/// `prefix`. Only a file with a descriptor: `Unsupported` otherwise.
pub fn source_hashes(r: &mut dyn SourceFile, prefix: u64, size: u64) -> io::Result<AppendHashes> {
    let Some(fd) = r.as_fd() else {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    };
    fd_hashes(fd, prefix, size)
}

/// [`source_hashes`] of an open descriptor (its position set to `prefix`).
pub fn fd_hashes(fd: BorrowedFd<'_>, prefix: u64, size: u64) -> io::Result<AppendHashes> {
    let (h, p) = hash_fd(fd, size, Some(prefix))?;
    // Longer than it was: it changed.
    let mut one = [0u8; 1];
    if pread_full(fd, &mut one, size)? > 0 {
        return Err(io::Error::other(format!(
            "changed while hashed (size {size} expected, more read)"
        )));
    }
    rustix::fs::seek(fd, rustix::fs::SeekFrom::Start(prefix))?;
    Ok(AppendHashes {
        prefix: p.expect("prefix within the file"),
        whole: *h.finalize().as_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn hashes_in_pieces_equal_one_pass_and_the_hasher_goes_on() {
        let data: Vec<u8> = (0..(PIECE * 2 + 12345) as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        for prefix in [
            1u64,
            1024,
            PIECE as u64,
            PIECE as u64 + 777,
            data.len() as u64,
        ] {
            let h = fd_hashes(f.as_fd(), prefix, data.len() as u64).unwrap();
            assert_eq!(h.prefix, *blake3::hash(&data[..prefix as usize]).as_bytes());
            assert_eq!(h.whole, *blake3::hash(&data).as_bytes());
        }
        let old = PIECE + 999;
        let (mut h, none) = hash_fd(f.as_fd(), old as u64, None).unwrap();
        assert!(none.is_none());
        h.update(&data[old..]);
        assert_eq!(h.finalize(), blake3::hash(&data));
        assert!(fd_hashes(f.as_fd(), 10, data.len() as u64 - 1).is_err());
        assert!(fd_hashes(f.as_fd(), 10, data.len() as u64 + 1).is_err());
    }
}
