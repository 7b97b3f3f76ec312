//! Big files from a [`RangedSource`] (objects in S3) into a local file:
//! several ranged reads in flight, each written at its offset, and resumable.
//!
//! The file is a named partial, `.ferry-part-<hash of the name>.~ferry~`, in the
//! target directory. Received ranges go into a [`RangeSet`] (in-order
//! completions extend its prefix in O(1); out-of-order ones wait in its
//! fallback map). Every `SYNC_EVERY` bytes, and when a run fails, the file
//! is `fdatasync`ed and only then the set is saved in an extended attribute
//! of the file with the content's identity (size + ETag): the attribute never
//! claims bytes that are not on disk. A later download of the same name and
//! identity fetches only the missing ranges; another identity starts over.
//! Where extended attributes are not supported, downloads still work but do
//! not resume.
//!
//! Bytes go to disk with `O_DIRECT` where the filesystem allows it: whole
//! 4 KiB blocks straight from the receive buffer to the device, no
//! page-cache copy (a buffered write of new pages costs the CPU far more
//! than a direct one), no writeback left behind,
//! and the `fdatasync` before each record only flushes the device cache.
//! The unaligned edges of a piece (the object's last bytes, a range
//! resumed mid-block) go through the page cache on a second descriptor;
//! the kernel keeps the two coherent.

use parking_lot::Mutex;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{self as rfs, Mode, OFlags, XattrFlags};
use rustix::io::Errno;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::piece::DIRECT_ALIGN;
use ferry_engine::store::{self, Progress, RangedSource};

use crate::range::RangeSet;

/// Files at least this big are fetched as parallel ranges.
pub const RANGED_MIN: u64 = 32 << 20;
/// Bytes per ranged read (each streams through a 1 MiB buffer, so this
/// costs no memory; bigger means fewer requests).
pub const CHUNK: u64 = 32 << 20;
/// Ranged reads in flight per file.
pub const STREAMS: usize = 4;
/// Make received bytes durable and record them after this many bytes or
/// this long, whichever comes first: each record waits for the disk
/// (`fdatasync`); a kill loses at most what came since the last one.
const SYNC_EVERY: u64 = 128 << 20;
const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Sizes of a download (tests use small ones).
#[derive(Clone, Copy)]
struct Tuning {
    chunk: u64,
    sync_every: u64,
    sync_interval: Duration,
}
/// The extended attribute holding the resume state.
const XATTR: &CStr = c"user.ferry.partial";

/// The name of the partial download of `name`.
pub fn partial_name(name: &CStr) -> CString {
    // FNV-1a: stable across runs and versions (the name must be found again).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name.to_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    store::partial_name(h)
}

/// A finished download: the open partial, its name, its size, and how many
/// bytes an earlier run had already fetched.
pub struct Downloaded {
    /// The partial file, complete.
    pub fd: OwnedFd,
    /// Its name in the target directory.
    pub name: CString,
    /// Its size.
    pub size: u64,
    /// Bytes reused from an interrupted earlier download.
    pub resumed: u64,
    /// Bytes written with `O_DIRECT` (the rest went through the page cache).
    pub direct: u64,
}

/// Download `src` into the partial of `name` in `dir`. On failure the partial
/// and its recorded ranges stay for the next run. The bytes written with
/// `O_DIRECT` are added to `direct` as they go, also those of a download
/// that fails (`Downloaded::direct` has only this one's).
pub fn download(
    dir: BorrowedFd<'_>,
    name: &CStr,
    src: &dyn RangedSource,
    limit: Option<&Limiter>,
    progress: Option<&Progress<'_>>,
    direct: &AtomicU64,
) -> io::Result<Downloaded> {
    let t = Tuning {
        chunk: CHUNK,
        sync_every: SYNC_EVERY,
        sync_interval: SYNC_INTERVAL,
    };
    download_with(dir, name, src, limit, progress, t, Some(direct))
}

fn download_with(
    dir: BorrowedFd<'_>,
    name: &CStr,
    src: &dyn RangedSource,
    limit: Option<&Limiter>,
    moved: Option<&Progress<'_>>,
    t: Tuning,
    counted: Option<&AtomicU64>,
) -> io::Result<Downloaded> {
    let (size, ident) = src.identity()?;
    let Partial {
        fd,
        name: pname,
        ranges,
        resumable,
    } = open_partial(dir, name, size, &ident)?;
    let resumed = ranges.total();
    let direct = Direct::open(dir, &pname, fd.as_fd());
    // Whatever way this returns, what went direct is counted.
    struct Count<'a>(&'a Direct, Option<&'a AtomicU64>);
    impl Drop for Count<'_> {
        fn drop(&mut self) {
            if let Some(c) = self.1 {
                c.fetch_add(self.0.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }
    let _count = Count(&direct, counted);
    let mut pieces = Vec::new();
    for (a, b) in ranges.missing(size) {
        let mut at = a;
        while at < b {
            // On multiples of the chunk size, so that after a resume
            // mid-block only the first piece starts unaligned.
            let end = ((at / t.chunk + 1) * t.chunk).min(b);
            pieces.push((at, end));
            at = end;
        }
    }
    let next = AtomicUsize::new(0);
    let progress = Mutex::new((ranges, 0u64, Instant::now()));
    let failed: Mutex<Option<io::Error>> = Mutex::new(None);
    let saving = Mutex::new(());
    let save = |set: &RangeSet| -> io::Result<()> {
        let _one = saving.lock();
        record(fd.as_fd(), size, &ident, set)
    };
    std::thread::scope(|scope| {
        for _ in 0..STREAMS.min(pieces.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pieces.len() || failed.lock().is_some() {
                    return;
                }
                let (a, b) = pieces[i];
                // Each piece is on disk before it counts as received.
                let mut put = |off: u64, data: &[u8]| -> io::Result<()> {
                    direct.write(fd.as_fd(), data, off)?;
                    if let Some(m) = moved {
                        m.add(data.len() as u64);
                    }
                    let end = off + data.len() as u64;
                    let snapshot = {
                        let mut p = progress.lock();
                        p.0.insert(off, end);
                        p.1 += data.len() as u64;
                        if resumable && (p.1 >= t.sync_every || p.2.elapsed() >= t.sync_interval) {
                            p.1 = 0;
                            p.2 = Instant::now();
                            Some(p.0.clone())
                        } else {
                            None
                        }
                    };
                    if let Some(set) = snapshot {
                        // Best effort: a failed record only costs a refetch.
                        let _ = save(&set);
                    }
                    Ok(())
                };
                if let Err(e) = src.read_range(a, b - a, &mut put, limit) {
                    failed.lock().get_or_insert(e);
                    return;
                }
            });
        }
    });
    let (ranges, _, _) = progress.into_inner();
    if let Some(e) = failed.into_inner() {
        if store::is_no_space(&e) {
            // It cannot complete here: what it holds would keep the disk
            // full for nothing. Gone before the error is told (whose
            // message says what is free then).
            give_up(dir, &pname, fd.as_fd());
            return Err(e);
        }
        if resumable {
            let _ = save(&ranges);
        }
        return Err(e);
    }
    debug_assert!(ranges.is_complete(size));
    forget_record(fd.as_fd())?;
    Ok(Downloaded {
        fd,
        name: pname,
        size,
        resumed,
        direct: direct.bytes.load(Ordering::Relaxed),
    })
}

/// Remove the partial `name` in `dir`, open as `fd`, of a transfer that
/// cannot complete for lack of space: emptied first (its blocks are freed
/// at once, though other descriptors of it are open), then unlinked if
/// the name is still that file.
pub fn give_up(dir: BorrowedFd<'_>, name: &CStr, fd: BorrowedFd<'_>) {
    let _ = rfs::ftruncate(fd, 0);
    let same = match (
        rfs::fstat(fd),
        rfs::statat(dir, name, rfs::AtFlags::SYMLINK_NOFOLLOW),
    ) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    };
    if same {
        let _ = rfs::unlinkat(dir, name, rfs::AtFlags::empty());
    }
}

/// The partial of a name, open for writing at offsets.
pub struct Partial {
    /// The partial file, `size` long.
    pub fd: OwnedFd,
    /// Its name in the directory.
    pub name: CString,
    /// What an earlier run recorded as on disk, for the same size and
    /// identity (else nothing: the file was emptied).
    pub ranges: RangeSet,
    /// False when its record could not be read (no extended attributes
    /// here): nothing will be resumed.
    pub resumable: bool,
}

/// Open (or create, mode 0600) the partial of `name` in `dir` for content
/// of `size` bytes and identity `ident`, keeping the ranges an earlier run
/// recorded for that same content.
pub fn open_partial(
    dir: BorrowedFd<'_>,
    name: &CStr,
    size: u64,
    ident: &str,
) -> io::Result<Partial> {
    let pname = partial_name(name);
    let fd = rfs::openat(
        dir,
        &pname,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut ranges = RangeSet::new();
    let mut resumable = true;
    match load_state(fd.as_fd()) {
        Ok(Some((s, id, rs))) if s == size && id == ident => {
            for (a, b) in rs {
                ranges.insert(a.min(size), b.min(size));
            }
        }
        Ok(_) => {}
        Err(_) => resumable = false,
    }
    if ranges.total() == 0 {
        rfs::ftruncate(&fd, 0)?;
    }
    rfs::ftruncate(&fd, size)?;
    Ok(Partial {
        fd,
        name: pname,
        ranges,
        resumable,
    })
}

/// Record that `set` of the partial `fd` (content `size`, `ident`) is
/// written: flushed to disk first, so the record never claims bytes that
/// are not there.
pub fn record(fd: BorrowedFd<'_>, size: u64, ident: &str, set: &RangeSet) -> io::Result<()> {
    rfs::fdatasync(fd)?;
    save_state(fd, size, ident, set)
}

/// Drop the record of a complete partial (before it is renamed into place).
pub fn forget_record(fd: BorrowedFd<'_>) -> io::Result<()> {
    match rfs::fremovexattr(fd, XATTR) {
        Ok(()) | Err(Errno::NODATA) | Err(Errno::OPNOTSUPP) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A second descriptor of the partial, opened with `O_DIRECT`, while direct
/// writes work.
pub struct Direct {
    fd: Option<OwnedFd>,
    /// Cleared when the filesystem refuses a direct write.
    on: AtomicBool,
    /// Bytes written through it.
    bytes: AtomicU64,
}

impl Direct {
    /// `O_DIRECT` on `name` in `dir`, when the filesystem is a local one
    /// known to do it well and the name is still the file `fd` (nothing
    /// replaced it in between). Elsewhere (NFS, FUSE, tmpfs...) a direct
    /// write may be a synchronous round trip or refused: the page cache.
    pub(crate) fn open(dir: BorrowedFd<'_>, name: &CStr, fd: BorrowedFd<'_>) -> Direct {
        Direct::open_with(dir, name, fd, OFlags::NOFOLLOW)
    }

    /// `O_DIRECT` on the file open as `fd` itself (through `/proc/self/fd`:
    /// an unnamed temporary too), where `Direct::open` would give it.
    pub fn reopen(fd: BorrowedFd<'_>) -> Direct {
        use std::os::fd::AsRawFd;
        let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL");
        Direct::open_with(fd, &path, fd, OFlags::empty())
    }

    fn open_with(dir: BorrowedFd<'_>, name: &CStr, fd: BorrowedFd<'_>, follow: OFlags) -> Direct {
        // ext2/3/4, XFS, Btrfs, F2FS.
        const LOCAL: [u64; 4] = [0xEF53, 0x5846_5342, 0x9123_683E, 0xF2F5_2010];
        let local = rfs::fstatfs(fd).is_ok_and(|s| LOCAL.contains(&(s.f_type as u64)));
        let dfd = local
            .then(|| {
                rfs::openat(
                    dir,
                    name,
                    OFlags::WRONLY | OFlags::DIRECT | follow | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .ok()
            })
            .flatten()
            .filter(|d| match (rfs::fstat(d), rfs::fstat(fd)) {
                (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
                _ => false,
            });
        Direct {
            on: AtomicBool::new(dfd.is_some()),
            fd: dfd,
            bytes: AtomicU64::new(0),
        }
    }

    /// Write `data` at `off`: the whole aligned blocks in the middle
    /// directly when `data` sits aligned in memory, the rest through `fd`.
    pub fn write(&self, fd: BorrowedFd<'_>, data: &[u8], off: u64) -> io::Result<()> {
        const A: u64 = DIRECT_ALIGN as u64;
        let dfd = match &self.fd {
            Some(d) if self.on.load(Ordering::Relaxed) => d,
            _ => return pwrite_all(fd, data, off),
        };
        let head = ((A - off % A) % A).min(data.len() as u64) as usize;
        let body = (data.len() - head) / DIRECT_ALIGN * DIRECT_ALIGN;
        let mid = &data[head..head + body];
        if body == 0 || mid.as_ptr().align_offset(DIRECT_ALIGN) != 0 {
            return pwrite_all(fd, data, off);
        }
        pwrite_all(fd, &data[..head], off)?;
        let mut done = 0;
        while done < body {
            match rustix::io::pwrite(dfd, &mid[done..], off + (head + done) as u64) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) if n.is_multiple_of(DIRECT_ALIGN) => done += n,
                Ok(n) => {
                    // A short, unaligned write: the rest the buffered way.
                    done += n;
                    break;
                }
                Err(Errno::INTR) => {}
                // The filesystem (or this file) does not take direct writes
                // after all: from now on the page cache.
                Err(Errno::INVAL) => {
                    self.on.store(false, Ordering::Relaxed);
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.bytes.fetch_add(done as u64, Ordering::Relaxed);
        pwrite_all(fd, &data[head + done..], off + (head + done) as u64)
    }
}

impl Direct {
    /// Bytes written past the page cache so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// As [`Direct::write`], for `data` wherever it sits in memory (a
    /// frame read off a stream): its whole blocks are first copied into an
    /// aligned buffer of this thread. One copy in memory costs far less
    /// than the page cache's (its pages allocated, charged, written back).
    pub fn write_copied(&self, fd: BorrowedFd<'_>, data: &[u8], off: u64) -> io::Result<()> {
        const A: usize = DIRECT_ALIGN;
        const PIECE: usize = 1 << 20;
        if !self.on.load(Ordering::Relaxed) || data.len() < 2 * A {
            return self.write(fd, data, off);
        }
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        BUF.with(|b| {
            let mut raw = b.borrow_mut();
            if raw.len() < PIECE + 2 * A {
                *raw = vec![0u8; PIECE + 2 * A];
            }
            let base = raw.as_ptr().align_offset(A);
            let mut done = 0;
            while done < data.len() {
                let n = (data.len() - done).min(PIECE);
                let at = off + done as u64;
                // Placed so the bytes at aligned file offsets sit at
                // aligned addresses.
                let skew = base + (at % A as u64) as usize;
                raw[skew..skew + n].copy_from_slice(&data[done..done + n]);
                self.write(fd, &raw[skew..skew + n], at)?;
                done += n;
            }
            Ok(())
        })
    }
}

fn pwrite_all(fd: BorrowedFd<'_>, mut buf: &[u8], mut at: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::pwrite(fd, buf, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                at += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `ferry-partial 1\n<size>\n<identity>\n<start> <end>\n...`
fn encode(size: u64, ident: &str, set: &RangeSet) -> Vec<u8> {
    let mut s = format!("ferry-partial 1\n{size}\n{ident}\n");
    for (a, b) in set.ranges() {
        s.push_str(&format!("{a} {b}\n"));
    }
    s.into_bytes()
}

type State = (u64, String, Vec<(u64, u64)>);

fn decode(buf: &[u8]) -> Option<State> {
    let s = std::str::from_utf8(buf).ok()?;
    let mut lines = s.lines();
    if lines.next()? != "ferry-partial 1" {
        return None;
    }
    let size = lines.next()?.parse().ok()?;
    let ident = lines.next()?.to_string();
    let mut ranges = Vec::new();
    for l in lines {
        let (a, b) = l.split_once(' ')?;
        ranges.push((a.parse().ok()?, b.parse().ok()?));
    }
    Some((size, ident, ranges))
}

fn save_state(fd: BorrowedFd<'_>, size: u64, ident: &str, set: &RangeSet) -> io::Result<()> {
    rfs::fsetxattr(fd, XATTR, &encode(size, ident, set), XattrFlags::empty())?;
    Ok(())
}

/// True when `name` in `dir` is a regular file carrying a decodable resume
/// record: a partial download ferry wrote (older versions named them
/// `.ferry-tmp.part.<16 hex>`; a user's file of that name has no record).
pub fn has_resume_record(dir: BorrowedFd<'_>, name: &CStr) -> bool {
    let Ok(fd) = rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    rfs::fstat(&fd).is_ok_and(|st| st.st_mode & 0o170000 == 0o100000)
        && matches!(load_state(fd.as_fd()), Ok(Some(_)))
}

/// The recorded state; `Ok(None)` when there is none (or it is unreadable),
/// an error when extended attributes are not supported here.
fn load_state(fd: BorrowedFd<'_>) -> io::Result<Option<State>> {
    let mut buf = vec![0u8; 64 << 10];
    match rfs::fgetxattr(fd, XATTR, &mut buf[..]) {
        Ok(n) => Ok(decode(&buf[..n])),
        Err(Errno::NODATA) | Err(Errno::RANGE) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_engine::ranged::{Fetch, Sink};
    use std::sync::atomic::AtomicU64;

    /// An in-memory object whose reads at or past `fail_from` fail.
    struct Fake {
        data: Vec<u8>,
        ident: String,
        served: AtomicU64,
        fail_from: u64,
        piece: u64,
    }

    impl Fetch for Fake {
        fn identity(&self) -> io::Result<(u64, String)> {
            Ok((self.data.len() as u64, self.ident.clone()))
        }
        fn fetch(&self, sink: &mut Sink<'_>) -> io::Result<()> {
            // In pieces of `piece` bytes, like a network stream; pieces of
            // whole blocks end on block boundaries and come from an aligned
            // buffer, like the S3 reader's.
            let mut raw = vec![0u8; self.piece as usize + DIRECT_ALIGN];
            let skew = raw.as_ptr().align_offset(DIRECT_ALIGN);
            let buf = &mut raw[skew..];
            let a = DIRECT_ALIGN as u64;
            while sink.at() < sink.end() {
                let at = sink.at();
                if at >= self.fail_from {
                    return Err(io::Error::other("connection reset"));
                }
                let mut step = self.piece;
                if self.piece.is_multiple_of(a) && !at.is_multiple_of(a) {
                    step = a - at % a;
                }
                let end = (at + step).min(sink.end()).min(self.fail_from);
                let n = (end - at) as usize;
                buf[..n].copy_from_slice(&self.data[at as usize..end as usize]);
                sink.put(&buf[..n])?;
                self.served.fetch_add(end - at, Ordering::SeqCst);
            }
            Ok(())
        }
        fn again(&self, e: io::Error, _: u32) -> io::Result<()> {
            Err(e)
        }
    }

    fn fake(len: usize, ident: &str, fail_from: u64) -> Fake {
        let mut x = 0x9e37_79b9_u32;
        let data = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        Fake {
            data,
            ident: ident.into(),
            served: AtomicU64::new(0),
            fail_from,
            piece: 1000,
        }
    }

    fn dir() -> (tempfile::TempDir, OwnedFd) {
        // Next to the sources, not in /tmp: tmpfs may lack user xattrs.
        let t = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let fd = rfs::open(t.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        (t, fd)
    }

    fn contents(fd: &OwnedFd, size: u64) -> Vec<u8> {
        let mut v = vec![0u8; size as usize];
        let n = rustix::io::pread(fd, &mut v[..], 0).unwrap();
        assert_eq!(n as u64, size);
        v
    }

    const T: Tuning = Tuning {
        chunk: 64 << 10,
        sync_every: 256 << 10,
        sync_interval: Duration::from_secs(3600),
    };

    #[test]
    fn interrupted_download_resumes_with_missing_ranges_only() {
        let (_t, d) = dir();
        let len = 10 * T.chunk as usize + 12345;
        // Bytes before 9.5 chunks arrive; the connection dies there.
        let cut = 9 * T.chunk + T.chunk / 2;
        let src = fake(len, "etag-1", cut);
        let err = download_with(d.as_fd(), c"big.bin", &src, None, None, T, None)
            .err()
            .unwrap();
        assert!(err.to_string().contains("connection reset"));
        let src2 = fake(len, "etag-1", u64::MAX);
        let got = download_with(d.as_fd(), c"big.bin", &src2, None, None, T, None).unwrap();
        assert_eq!(got.size, len as u64);
        assert_eq!(contents(&got.fd, got.size), src2.data);
        // Resume state is recorded every `sync_every` bytes and on failure:
        // everything the first run wrote is reused.
        assert_eq!(got.resumed, cut);
        assert_eq!(src2.served.load(Ordering::SeqCst), len as u64 - got.resumed);
        assert!(store::is_partial_name(got.name.to_bytes()));
        // The finished file carries no resume state.
        assert!(matches!(load_state(got.fd.as_fd()), Ok(None)));
    }

    #[test]
    fn aligned_pieces_go_direct_and_edges_buffered() {
        let (_t, d) = dir();
        // Unaligned end; the first run breaks mid-block, so the second one
        // starts its missing range there.
        let len = 10 * T.chunk as usize + 12345;
        let cut = 6 * T.chunk + 5000 + 3;
        let mut src = fake(len, "etag-1", cut);
        src.piece = 16 << 10;
        // What went direct before the failure is counted too.
        let counted = AtomicU64::new(0);
        assert!(download_with(d.as_fd(), c"d.bin", &src, None, None, T, Some(&counted)).is_err());
        let mut src2 = fake(len, "etag-1", u64::MAX);
        src2.piece = 16 << 10;
        let got = download_with(d.as_fd(), c"d.bin", &src2, None, None, T, None).unwrap();
        assert_eq!(got.resumed, cut);
        assert_eq!(contents(&got.fd, got.size), src2.data);
        // Where the filesystem takes O_DIRECT, all but the edges went direct.
        if Direct::open(d.as_fd(), &got.name, got.fd.as_fd())
            .fd
            .is_some()
        {
            let fetched = len as u64 - cut;
            assert!(got.direct > 0 && got.direct <= fetched);
            let before = counted.load(Ordering::Relaxed);
            assert!(before > 0 && before <= cut, "{before}");
            assert!(fetched - got.direct < 2 * DIRECT_ALIGN as u64);
        }
    }

    #[test]
    fn data_anywhere_in_memory_is_written_direct_and_byte_equal() {
        let (_t, d) = dir();
        let fd = rfs::openat(
            d.as_fd(),
            c"w.bin",
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        let direct = Direct::reopen(fd.as_fd());
        let len = 3 * (1 << 20) + 777;
        let data: Vec<u8> = (0..len + 3).map(|i| (i * 7 + i / 4096) as u8).collect();
        // Unaligned in memory (one byte in) and pieces at unaligned offsets,
        // out of order, as several connections' frames arrive.
        let src = &data[1..1 + len];
        let cuts = [0, 5000, 1 << 20, (2 << 20) + 3, len];
        for w in cuts.windows(2).rev() {
            let (a, b) = (w[0], w[1]);
            direct
                .write_copied(fd.as_fd(), &src[a..b], a as u64)
                .unwrap();
        }
        assert_eq!(contents(&fd, len as u64), src);
        if direct.fd.is_some() {
            // All but the edges of each piece went past the page cache.
            assert!(direct.bytes() > 0);
            assert!(len as u64 - direct.bytes() < 8 * DIRECT_ALIGN as u64);
        }
    }

    #[test]
    fn changed_content_starts_over() {
        let (_t, d) = dir();
        let len = 3 * T.chunk as usize;
        let src = fake(len, "etag-1", 2 * T.chunk);
        assert!(download_with(d.as_fd(), c"f", &src, None, None, T, None).is_err());
        let mut src2 = fake(len, "etag-2", u64::MAX);
        src2.data.reverse();
        let got = download_with(d.as_fd(), c"f", &src2, None, None, T, None).unwrap();
        assert_eq!(got.resumed, 0);
        assert_eq!(src2.served.load(Ordering::SeqCst), len as u64);
        assert_eq!(contents(&got.fd, got.size), src2.data);
    }

    #[test]
    fn state_round_trip_and_garbage() {
        let mut set = RangeSet::new();
        set.insert(0, 10);
        set.insert(20, 30);
        let enc = encode(100, "\"abc-2\"", &set);
        assert_eq!(
            decode(&enc),
            Some((100, "\"abc-2\"".to_string(), vec![(0, 10), (20, 30)]))
        );
        assert_eq!(decode(b"garbage"), None);
        assert_eq!(decode(b"ferry-partial 1\nx\n"), None);
    }

    #[test]
    fn partial_names_are_stable_and_distinct() {
        assert_eq!(partial_name(c"a"), partial_name(c"a"));
        assert_ne!(partial_name(c"a"), partial_name(c"b"));
    }
}
