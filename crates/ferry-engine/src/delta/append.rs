//! What the patches in place ([`super::inplace`]) share with the append
//! path they grew from: the size from which a file is tried in place, and
//! a read-only mapping of a file for hashing it on every core straight
//! from the page cache (a `pread` copy cost as much CPU as the hash).

use std::io;
use std::os::fd::BorrowedFd;

/// Files whose destination is at least this big (and no longer than the
/// source) are tried as a patch in place.
pub const APPEND_MIN: u64 = 64 << 20;

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
        // in (callers pass page-aligned offsets: [`Map::range`]).
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
