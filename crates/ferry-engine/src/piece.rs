//! The buffer a [`RangedSource`](crate::store::RangedSource) reads its
//! pieces into: aligned so that a local writer can hand them to the device
//! with `O_DIRECT`, reused by each thread, on a transparent huge page where
//! the kernel grants one. Part of the contract between ranged sources (S3)
//! and writers (local), so it lives here, with neither.

use rustix::mm as rfs_mm;

use crate::store::RANGE_PIECE;

/// Alignment of direct writes (file offset, length and memory): the page
/// size, which covers every logical block size in use.
pub const DIRECT_ALIGN: usize = 4096;
/// Bytes kept per thread for [`with_piece_buffer`]: one transparent huge
/// page (x86-64, arm64 with 4 KiB pages).
const HUGE_PAGE: usize = 2 << 20;

thread_local! {
    static PIECE_BUF: std::cell::RefCell<Option<Vec<u8>>> = const { std::cell::RefCell::new(None) };
}

/// Run `f` with a buffer of [`RANGE_PIECE`] bytes for the pieces of
/// [`RangedSource::read_range`](crate::store::RangedSource::read_range): aligned for `O_DIRECT` writes, kept by the
/// thread from one call to the next (not allocated and zeroed per range),
/// and on a transparent huge page where the kernel grants one: a direct
/// write pins the buffer's pages for the device, and one huge page costs
/// far less to pin than 256 small ones.
pub fn with_piece_buffer<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    let mut raw = PIECE_BUF
        .with(|b| b.borrow_mut().take())
        .unwrap_or_else(|| {
            let mut raw: Vec<u8> = Vec::with_capacity(2 * HUGE_PAGE);
            let skew = raw.as_ptr().align_offset(HUGE_PAGE);
            advise_huge(raw.as_mut_ptr().wrapping_add(skew));
            // Zeroed only now: the advice holds before the first touch.
            raw.resize(skew + RANGE_PIECE, 0);
            raw
        });
    let skew = raw.as_ptr().align_offset(HUGE_PAGE);
    let out = f(&mut raw[skew..skew + RANGE_PIECE]);
    PIECE_BUF.with(|b| *b.borrow_mut() = Some(raw));
    out
}

/// Ask for transparent huge pages on the `HUGE_PAGE` bytes at `at` (a hint:
/// refused or ignored, the buffer works the same on small pages).
#[allow(unsafe_code)]
fn advise_huge(at: *mut u8) {
    // SAFETY: `at` starts a range of `HUGE_PAGE` bytes inside one live
    // allocation (capacity `2 * HUGE_PAGE`, `at` aligned within its first
    // half); MADV_HUGEPAGE changes how pages are backed, never contents.
    let _ = unsafe { rfs_mm::madvise(at.cast(), HUGE_PAGE, rfs_mm::Advice::LinuxHugepage) };
}

/// `pread` from `at` until `buf` is full or the end of the file (retrying
/// after a signal): the bytes read, fewer than `buf` only at the end.
pub fn pread_full(
    fd: std::os::fd::BorrowedFd<'_>,
    buf: &mut [u8],
    at: u64,
) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::pread(fd, &mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piece_buffers_are_aligned_and_kept_by_the_thread() {
        let first = with_piece_buffer(|b| {
            assert_eq!(b.len(), RANGE_PIECE);
            assert!(b.as_ptr().addr().is_multiple_of(DIRECT_ALIGN));
            b.fill(7);
            b.as_ptr().addr()
        });
        // The same memory next time on this thread, another on another one.
        assert_eq!(with_piece_buffer(|b| b.as_ptr().addr()), first);
        let other = std::thread::spawn(|| with_piece_buffer(|b| b.as_ptr().addr()));
        assert_ne!(other.join().unwrap(), first);
    }
}
