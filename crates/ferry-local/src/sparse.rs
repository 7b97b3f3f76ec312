//! Copying a file with holes: only its data is copied, so the holes stay
//! holes in the copy (as `cp` does by default).
//!
//! The listing tells which files may have holes ([`Meta::sparse`]: fewer
//! blocks than their size fills), so other files pay nothing. For those,
//! `lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)` on the source find each data
//! segment, which is copied at its offset (`copy_file_range` with explicit
//! offsets, else `pread`/`pwrite`); the new file, empty when it was
//! created, is then given the source's size with `ftruncate`, so holes at
//! the start, in the middle and at the end all read as zeros without
//! taking space. A filesystem without `SEEK_DATA` reports the whole file
//! as one data segment: the copy is then a plain one.
//!
//! [`Meta::sparse`]: ferry_engine::entry::Meta::sparse

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{self as rfs, SeekFrom};
use rustix::io::Errno;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::store::Progress;

use crate::local::is_unsupported;

/// Largest single request, as for dense copies.
const CHUNK: u64 = 64 << 20;
/// Buffer of the `pread`/`pwrite` fallback.
const BUF: usize = 1 << 20;

/// Copy the data segments of `src` into the empty file `out` at their
/// offsets and give `out` the source's size. `size`: the size listed; as
/// for dense copies the copy reads at most one byte past it, so a file
/// that grew returns more than `size` (and one that shrank is caught by
/// the caller's check of the source afterwards). `copy_range` is the
/// store's flag for `copy_file_range` (cleared where it is not supported).
/// Returns the size given to `out`.
pub(crate) fn copy_data(
    out: BorrowedFd<'_>,
    src: BorrowedFd<'_>,
    size: u64,
    limit: Option<&Limiter>,
    progress: Option<&Progress<'_>>,
    copy_range: &AtomicBool,
) -> io::Result<u64> {
    let stop = size.saturating_add(1);
    let mut seg = Segments {
        out,
        src,
        limit,
        progress,
        copy_range,
        buf: Vec::new(),
    };
    let mut off = 0u64;
    let mut end = 0u64;
    while off < stop {
        let data = match rfs::seek(src, SeekFrom::Data(off)) {
            Ok(d) => d,
            // No data at or after `off`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if data >= stop {
            break;
        }
        let hole = match rfs::seek(src, SeekFrom::Hole(data)) {
            Ok(h) => h,
            // The file shrank under us: the caller's check sees it.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let want = hole.min(stop) - data;
        let n = seg.copy(data, want)?;
        end = data + n;
        if n < want {
            break;
        }
        off = hole;
    }
    let total = end.max(size);
    rfs::ftruncate(out, total)?;
    Ok(total)
}

/// What copying one data segment needs.
struct Segments<'a, 'p> {
    out: BorrowedFd<'a>,
    src: BorrowedFd<'a>,
    limit: Option<&'a Limiter>,
    progress: Option<&'a Progress<'p>>,
    copy_range: &'a AtomicBool,
    buf: Vec<u8>,
}

impl Segments<'_, '_> {
    /// Copy `[at, at + len)` to the same offsets; fewer bytes only at the
    /// source's end.
    fn copy(&mut self, at: u64, len: u64) -> io::Result<u64> {
        let chunk = self.limit.map_or(CHUNK, |l| l.chunk() as u64);
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(chunk);
            let n = match self.copy_range.load(Ordering::Relaxed) {
                true => {
                    let (mut i, mut o) = (at + done, at + done);
                    match rfs::copy_file_range(
                        self.src,
                        Some(&mut i),
                        self.out,
                        Some(&mut o),
                        want as usize,
                    ) {
                        Ok(n) => n as u64,
                        Err(e) if done == 0 && is_unsupported(e) => {
                            if e != Errno::XDEV {
                                self.copy_range.store(false, Ordering::Relaxed);
                            }
                            self.copy_range_off();
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                false => self.pcopy(at + done, want)?,
            };
            if n == 0 {
                break;
            }
            if let Some(l) = self.limit {
                l.acquire(n);
            }
            if let Some(p) = self.progress {
                p.add(n);
            }
            done += n;
        }
        Ok(done)
    }

    /// From now on this copy goes through `pread`/`pwrite` (the store's
    /// flag stays set for a cross-device failure, which other pairs of
    /// files may not have).
    fn copy_range_off(&mut self) {
        self.copy_range = &NO_COPY_RANGE;
    }

    /// One `pread` and its `pwrite`s at offset `at`, up to `len` bytes.
    fn pcopy(&mut self, at: u64, len: u64) -> io::Result<u64> {
        if self.buf.is_empty() {
            self.buf = vec![0u8; BUF];
        }
        let want = (len as usize).min(self.buf.len());
        let n = loop {
            match rustix::io::pread(self.src, &mut self.buf[..want], at) {
                Err(Errno::INTR) => continue,
                r => break r?,
            }
        };
        let mut w = 0;
        while w < n {
            match rustix::io::pwrite(self.out, &self.buf[w..n], at + w as u64) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => w += k,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n as u64)
    }
}

static NO_COPY_RANGE: AtomicBool = AtomicBool::new(false);

/// Block size of the zero test of streamed data.
const BLOCK: usize = 4096;

/// The runs of `buf` that hold data, as `(start, end)`: the bytes outside
/// them are whole `BLOCK`-aligned blocks of zeros (a tail shorter than a
/// block counts as a block). What a stream without `SEEK_DATA` (bytes from
/// another machine) tells of its holes.
pub fn data_runs(buf: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let zero = |i: usize| buf[i..(i + BLOCK).min(buf.len())].iter().all(|b| *b == 0);
        while at < buf.len() && zero(at) {
            at += BLOCK;
        }
        if at >= buf.len() {
            return None;
        }
        let start = at;
        while at < buf.len() && !zero(at) {
            at += BLOCK;
        }
        Some((start, at.min(buf.len())))
    })
}

/// Write streamed bytes `buf` at the position of `out` (a file written
/// from its start), its blocks of zeros skipped so they stay holes;
/// [`end_stream`] gives the file its size.
pub(crate) fn write_skipping_zeros(out: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()> {
    let pos = rfs::seek(out, SeekFrom::Current(0))?;
    let mut end = 0;
    for (a, b) in data_runs(buf) {
        rfs::seek(out, SeekFrom::Start(pos + a as u64))?;
        crate::local::write_all(out, &buf[a..b])?;
        end = b;
    }
    if end < buf.len() {
        rfs::seek(out, SeekFrom::Start(pos + buf.len() as u64))?;
    }
    Ok(())
}

/// The end of a stream of `total` bytes: a file written with
/// [`write_skipping_zeros`] (`sparse`) gets its size, its trailing zeros
/// a hole.
pub(crate) fn end_stream(out: BorrowedFd<'_>, sparse: bool, total: u64) -> io::Result<u64> {
    if sparse {
        rfs::ftruncate(out, total)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;

    fn map(f: &std::fs::File) -> Vec<(u64, u64)> {
        let size = f.metadata().unwrap().len();
        let mut out = Vec::new();
        let mut off = 0;
        while off < size {
            let Ok(d) = rfs::seek(f.as_fd(), SeekFrom::Data(off)) else {
                break;
            };
            let h = rfs::seek(f.as_fd(), SeekFrom::Hole(d)).unwrap();
            out.push((d, h));
            off = h;
        }
        out
    }

    /// Holes at the start, in the middle and at the end, with `copy_file_range` and with
    /// `pread`/`pwrite`; a file that grew past the listed size is copied one byte past it.
    #[test]
    fn data_segments_are_copied_holes_kept() {
        let dir = tempfile::tempdir().unwrap();
        let src = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("src"))
            .unwrap();
        src.write_all_at(&[7u8; 10_000], 1 << 20).unwrap();
        src.write_all_at(&[9u8; 5000], 3 << 20).unwrap();
        let size = 5 << 20;
        src.set_len(size).unwrap();
        let holes = map(&src);
        if holes.len() != 2 {
            eprintln!("note: the filesystem reports no holes ({holes:?}): test not run");
            return;
        }
        for cfr in [true, false] {
            let out = tempfile::tempfile_in(dir.path()).unwrap();
            let flag = AtomicBool::new(cfr);
            let n = copy_data(out.as_fd(), src.as_fd(), size, None, None, &flag).unwrap();
            assert_eq!(n, size);
            assert_eq!(map(&out), holes, "copy_file_range: {cfr}");
            assert_eq!(
                std::fs::read(format!(
                    "/proc/self/fd/{}",
                    std::os::fd::AsRawFd::as_raw_fd(&out)
                ))
                .unwrap(),
                std::fs::read(dir.path().join("src")).unwrap()
            );
        }
        // Listed smaller than it is: one byte past the listed size, so growth shows.
        let out = tempfile::tempfile_in(dir.path()).unwrap();
        let flag = AtomicBool::new(true);
        let n = copy_data(out.as_fd(), src.as_fd(), (3 << 20) + 100, None, None, &flag).unwrap();
        assert_eq!(n, (3 << 20) + 101);
    }
}
