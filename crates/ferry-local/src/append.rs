//! The receiver's side of an append in place
//! ([`ferry_engine::delta::append`]) on a local tree, and the rollback of
//! an append a killed run left half done.
//!
//! The rollback record, `.ferry-undo-<16 hex>.~ferry~` beside the file
//! ([`undo_name`]), holds the file's inode number, its old and new size,
//! its old mtime and mode, its name and a checksum of all that; it is
//! written and synced before the first byte of the tail, kept locked
//! (`flock`) while the append runs, and removed once the appended file is
//! checked (and with `--fsync` synced). A record found unlocked by a listing of its directory
//! ([`recover`]) is a run's that died: the file it names, if it is still
//! that inode at a size between old and new, is truncated back to its old
//! size and given its old mtime and mode, and the record goes.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::thread::JoinHandle;

use ferry_engine::delta::{self, Appender};
use ferry_engine::entry::Meta;
use ferry_engine::store::undo_name;
use rustix::fs::{self as rfs, AtFlags, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::local::{gid, times, uid};

/// First bytes of a record.
const MAGIC: &[u8] = b"ferry-undo 1\n";
/// Bytes of a record's fixed fields after the magic.
const FIXED: usize = 8 + 8 + 8 + 8 + 4 + 4 + 4;

/// What a record says.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    ino: u64,
    old: u64,
    new: u64,
    sec: i64,
    nsec: u32,
    mode: u32,
    name: Vec<u8>,
}

impl Record {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAGIC.len() + FIXED + self.name.len() + 8);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.ino.to_le_bytes());
        b.extend_from_slice(&self.old.to_le_bytes());
        b.extend_from_slice(&self.new.to_le_bytes());
        b.extend_from_slice(&self.sec.to_le_bytes());
        b.extend_from_slice(&self.nsec.to_le_bytes());
        b.extend_from_slice(&self.mode.to_le_bytes());
        b.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.name);
        let sum = blake3::hash(&b);
        b.extend_from_slice(&sum.as_bytes()[..8]);
        b
    }

    /// A record from its bytes; `None` when torn or not one.
    fn decode(b: &[u8]) -> Option<Record> {
        let body = b.get(..b.len().checked_sub(8)?)?;
        if blake3::hash(body).as_bytes()[..8] != b[body.len()..] || !body.starts_with(MAGIC) {
            return None;
        }
        let f = &body[MAGIC.len()..];
        let u64_at = |i: usize| u64::from_le_bytes(f[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(f[i..i + 4].try_into().unwrap());
        if f.len() < FIXED || f.len() != FIXED + u32_at(40) as usize {
            return None;
        }
        Some(Record {
            ino: u64_at(0),
            old: u64_at(8),
            new: u64_at(16),
            sec: u64_at(24) as i64,
            nsec: u32_at(32),
            mode: u32_at(36),
            name: f[FIXED..].to_vec(),
        })
    }
}

pub(crate) fn mtime(sec: i64, nsec: u32) -> Meta {
    Meta {
        mtime_sec: sec,
        mtime_nsec: nsec,
        ..crate::local::EMPTY_META
    }
}

/// Roll back what the record `rec` of directory `dir` names, unless a live
/// append holds it; the record is removed (and `true` returned) unless it
/// is live.
pub(crate) fn recover(dir: BorrowedFd<'_>, rec: &CStr) -> io::Result<bool> {
    let rfd = match rfs::openat(
        dir,
        rec,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    match rfs::flock(&rfd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    let mut b = vec![0u8; 64 << 10];
    let n = ferry_engine::piece::pread_full(rfd.as_fd(), &mut b, 0)?;
    // A torn record was never complete: the file was not touched yet.
    if b[..n].starts_with(crate::inplace::MAGIC) {
        crate::inplace::restore(dir, rfd.as_fd())?;
    } else if let Some(r) = Record::decode(&b[..n]) {
        roll_back(dir, &r)?;
    }
    match rfs::unlinkat(dir, rec, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// The file `name` of `dir` opened to be rolled back, with its `fstat`,
/// when it is still inode `ino`, a regular file, at a size between `old`
/// and `new`; `None` when gone or replaced (nothing of ours to undo).
pub(crate) fn still_ours(
    dir: BorrowedFd<'_>,
    name: &[u8],
    ino: u64,
    old: u64,
    new: u64,
) -> io::Result<Option<(OwnedFd, rfs::Stat)>> {
    let Ok(name) = CString::new(name) else {
        return Ok(None);
    };
    let Ok(fd) = rfs::openat(
        dir,
        &name,
        OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Ok(None);
    };
    let st = rfs::fstat(&fd)?;
    let size = st.st_size as u64;
    if st.st_ino != ino
        || FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || size < old
        || size > new
    {
        return Ok(None);
    }
    Ok(Some((fd, st)))
}

/// Truncate the file `r` names back to its old size, with its old mtime
/// and mode, when it is still the file appended to.
fn roll_back(dir: BorrowedFd<'_>, r: &Record) -> io::Result<()> {
    let Some((fd, st)) = still_ours(dir, &r.name, r.ino, r.old, r.new)? else {
        return Ok(());
    };
    undo(fd.as_fd(), r.old, r.mode, st.st_mode, &mtime(r.sec, r.nsec))
}

pub(crate) fn undo(
    fd: BorrowedFd<'_>,
    size: u64,
    mode: u32,
    now_mode: u32,
    m: &Meta,
) -> io::Result<()> {
    rfs::ftruncate(fd, size)?;
    if now_mode & 0o7777 != mode & 0o7777 {
        rfs::fchmod(fd, Mode::from_raw_mode(mode & 0o7777))?;
    }
    rfs::futimens(fd, &times(m))?;
    rfs::fsync(fd)?;
    Ok(())
}

/// `name` of `dir` opened to be written in place, with its `fstat`, when
/// it is still `old` as listed and may be: a regular file with one link
/// that this process may write; `None` otherwise.
pub(crate) fn open_checked(
    dir: BorrowedFd<'_>,
    name: &CStr,
    old: &Meta,
) -> io::Result<Option<(OwnedFd, rfs::Stat)>> {
    let Ok(fd) = rfs::openat(
        dir,
        name,
        OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Ok(None);
    };
    let st = rfs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || st.st_nlink != 1
        || st.st_size as u64 != old.size
        || (st.st_mtime, st.st_mtime_nsec as u32) != (old.mtime_sec, old.mtime_nsec)
        || (old.ino != 0 && st.st_ino != old.ino)
    {
        return Ok(None);
    }
    Ok(Some((fd, st)))
}

/// Create the rollback record `rec` of `dir`, held locked (a stale one
/// rolled back first): `None` when a live run holds one.
pub(crate) fn create_record(dir: BorrowedFd<'_>, rec: &CStr) -> io::Result<Option<OwnedFd>> {
    let mut tries = 0;
    let fd = loop {
        match rfs::openat(
            dir,
            rec,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => break fd,
            Err(Errno::EXIST) if tries == 0 => {
                tries += 1;
                if !recover(dir, rec)? {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    if let Err(e) = rfs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        drop(fd);
        let _ = rfs::unlinkat(dir, rec, AtFlags::empty());
        return Err(e.into());
    }
    Ok(Some(fd))
}

/// Give a file written in place its new metadata `meta` (owners when
/// `owner`), synced with `fsync`; a size other than `meta.size` is a
/// mismatch.
pub(crate) fn set_meta(
    fd: BorrowedFd<'_>,
    meta: &Meta,
    owner: bool,
    fsync: bool,
) -> io::Result<()> {
    let st = rfs::fstat(fd)?;
    if st.st_size as u64 != meta.size {
        return Err(delta::mismatch());
    }
    if owner && (st.st_uid != meta.uid || st.st_gid != meta.gid) {
        rfs::fchown(fd, Some(uid(meta.uid)), Some(gid(meta.gid)))?;
    }
    if owner || st.st_mode & 0o7777 != meta.mode & 0o7777 {
        rfs::fchmod(fd, Mode::from_raw_mode(meta.mode & 0o7777))?;
    }
    rfs::futimens(fd, &times(meta))?;
    if fsync {
        rfs::fsync(fd)?;
    }
    Ok(())
}

/// One append in place to a local file.
pub struct LocalAppend {
    dir: OwnedFd,
    name: CString,
    fd: OwnedFd,
    /// The file as it was: inode, size, mtime, mode.
    old: (u64, u64, i64, u32, u32),
    hashing: Option<JoinHandle<io::Result<blake3::Hasher>>>,
    hasher: Option<blake3::Hasher>,
    /// The record written (its name, held locked).
    record: Option<(CString, OwnedFd)>,
    /// Bytes of the tail written.
    at: u64,
    /// This process sets owners (root).
    owner: bool,
    /// Tests: die (abort) once this many bytes of the tail are written.
    die_after: Option<u64>,
}

impl LocalAppend {
    /// The append to `name` of `dir`, listed as `old`, its old content's
    /// hash started by a thread of its own; `None` when it cannot be
    /// appended to in place (not a regular file with one link that this
    /// process may write, or changed since listed).
    pub fn start(
        dir: BorrowedFd<'_>,
        name: &CStr,
        old: &Meta,
        owner: bool,
    ) -> io::Result<Option<LocalAppend>> {
        let Some((fd, st)) = open_checked(dir, name, old)? else {
            return Ok(None);
        };
        let size = st.st_size as u64;
        let hfd = fd.try_clone()?;
        let hashing = std::thread::spawn(move || {
            delta::append::hash_fd(hfd.as_fd(), size, None).map(|(h, _)| h)
        });
        let die_after = std::env::var("FERRY_TEST_APPEND_DIE")
            .ok()
            .and_then(|v| v.parse().ok());
        Ok(Some(LocalAppend {
            dir: dir.try_clone_to_owned()?,
            name: name.to_owned(),
            fd,
            old: (
                st.st_ino,
                size,
                st.st_mtime,
                st.st_mtime_nsec as u32,
                st.st_mode,
            ),
            hashing: Some(hashing),
            hasher: None,
            record: None,
            at: 0,
            owner,
            die_after,
        }))
    }

    /// The old content's blake3 (waiting for it), checked unchanged since
    /// the start.
    pub fn old_hash(&mut self) -> io::Result<[u8; 32]> {
        if let Some(t) = self.hashing.take() {
            let h = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("hashing panicked")))?;
            self.hasher = Some(h);
        }
        let h = self
            .hasher
            .as_ref()
            .ok_or_else(|| io::Error::other("append: no hash"))?;
        let st = rfs::fstat(&self.fd)?;
        let (_, size, sec, nsec, _) = self.old;
        if (st.st_size as u64, st.st_mtime, st.st_mtime_nsec as u32) != (size, sec, nsec)
            || st.st_nlink != 1
        {
            return Err(io::Error::other("changed while hashed for an append"));
        }
        Ok(*h.finalize().as_bytes())
    }

    /// Write and sync the rollback record (a stale one of the same file
    /// rolled back first): `false` when another run holds one.
    fn write_record(&mut self, new: u64) -> io::Result<bool> {
        let rec = undo_name(self.name.to_bytes());
        let (ino, old, sec, nsec, mode) = self.old;
        let r = Record {
            ino,
            old,
            new,
            sec,
            nsec,
            mode,
            name: self.name.to_bytes().to_vec(),
        };
        let Some(fd) = create_record(self.dir.as_fd(), &rec)? else {
            return Ok(false);
        };
        let res = (|| -> io::Result<()> {
            crate::local::write_all(fd.as_fd(), &r.encode())?;
            rfs::fsync(&fd)?;
            rfs::fsync(&self.dir)?;
            Ok(())
        })();
        if let Err(e) = res {
            drop(fd);
            let _ = rfs::unlinkat(&self.dir, &rec, AtFlags::empty());
            return Err(e);
        }
        self.record = Some((rec, fd));
        Ok(true)
    }

    /// [`Appender::begin`], the new size told.
    pub fn begin_sized(&mut self, prefix: &[u8; 32], new: u64) -> io::Result<bool> {
        if self.old_hash()? != *prefix {
            return Ok(false);
        }
        self.write_record(new)
    }

    /// The file as it was, the record removed (nothing when none was
    /// written).
    fn roll_back(&mut self) {
        if let Some((rec, rfd)) = self.record.take() {
            let (_, size, sec, nsec, mode) = self.old;
            let now = rfs::fstat(&self.fd).map_or(mode, |s| s.st_mode);
            // Not undone (an I/O error): the record stays for the next run.
            if undo(self.fd.as_fd(), size, mode, now, &mtime(sec, nsec)).is_ok() {
                let _ = rfs::unlinkat(&self.dir, &rec, AtFlags::empty());
            }
            drop(rfd);
        }
    }

    fn finish(&mut self, hash: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()> {
        let h = self
            .hasher
            .take()
            .ok_or_else(|| io::Error::other("append: no hash"))?;
        if self.record.is_none() || *h.finalize().as_bytes() != *hash {
            return Err(delta::mismatch());
        }
        set_meta(self.fd.as_fd(), meta, self.owner, fsync)?;
        if let Some((rec, rfd)) = self.record.take() {
            rfs::unlinkat(&self.dir, &rec, AtFlags::empty())?;
            drop(rfd);
        }
        Ok(())
    }

    /// [`Appender::commit`] without the box.
    pub fn commit_here(&mut self, hash: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()> {
        let r = self.finish(hash, meta, fsync);
        if r.is_err() {
            self.roll_back();
        }
        r
    }

    /// [`Appender::write`].
    pub fn write_here(&mut self, data: &[u8]) -> io::Result<()> {
        if self.record.is_none() {
            return Err(io::Error::other("append: not begun"));
        }
        let at = self.old.1 + self.at;
        if let Some(d) = self.die_after {
            // Tests: a run killed half way through the tail.
            let k = (d.saturating_sub(self.at) as usize).min(data.len());
            if k < data.len() {
                crate::local::pwrite_all(self.fd.as_fd(), &data[..k], at)?;
                let me = rustix::process::getpid();
                let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
                std::process::abort();
            }
        }
        crate::local::pwrite_all(self.fd.as_fd(), data, at)?;
        if let Some(h) = &mut self.hasher {
            h.update(data);
        }
        self.at += data.len() as u64;
        Ok(())
    }
}

impl Drop for LocalAppend {
    fn drop(&mut self) {
        if let Some(t) = self.hashing.take() {
            let _ = t.join();
        }
        self.roll_back();
    }
}

/// [`LocalAppend`] as the engine's [`Appender`], with the new size known
/// (for the record) from the source's listing.
pub(crate) struct Boxed {
    pub(crate) a: LocalAppend,
    pub(crate) new: u64,
}

impl Appender for Boxed {
    fn begin(&mut self, prefix: &[u8; 32]) -> io::Result<bool> {
        self.a.begin_sized(prefix, self.new)
    }
    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.a.write_here(data)
    }
    fn commit(mut self: Box<Self>, hash: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()> {
        self.a.commit_here(hash, meta, fsync)
    }
    fn abort(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_ones_are_refused() {
        let r = Record {
            ino: 7,
            old: 1 << 30,
            new: (1 << 30) + 5,
            sec: -3,
            nsec: 999,
            mode: 0o100644,
            name: b"a\xffb".to_vec(),
        };
        let b = r.encode();
        assert_eq!(Record::decode(&b), Some(r));
        for n in 0..b.len() {
            assert_eq!(Record::decode(&b[..n]), None);
        }
        let mut bad = b.clone();
        bad[20] ^= 1;
        assert_eq!(Record::decode(&bad), None);
    }
}
