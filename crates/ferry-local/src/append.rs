//! The rollback of a patch in place ([`crate::inplace`]) or an append
//! (the path patches grew from) that a killed run left half done, and the
//! pieces both kinds of record share.
//!
//! An append's rollback record (format 1, still recovered: a run of an
//! older ferry may have left one), `.ferry-undo-<16 hex>.~ferry~` beside the file
//! ([`ferry_engine::store::undo_name`]), holds the file's inode number, its old and new size,
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

use ferry_engine::delta;
use ferry_engine::entry::Meta;
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
    #[cfg(test)]
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

    /// A format-1 record (an append's, as an older ferry wrote them) found
    /// by a listing: the file goes back to its old size, mtime and mode.
    #[test]
    fn a_format_1_record_left_by_an_older_run_rolls_the_file_back() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![7u8; 5000]).unwrap();
        let r = Record {
            ino: std::fs::metadata(&p).unwrap().ino(),
            old: 3000,
            new: 5000,
            sec: 1_600_000_000,
            nsec: 5,
            mode: 0o100640,
            name: b"f".to_vec(),
        };
        let rec = ferry_engine::store::undo_name(b"f");
        let rec_path = d.path().join(rec.to_str().unwrap());
        std::fs::write(&rec_path, r.encode()).unwrap();
        let dir = rfs::open(d.path(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
        assert!(recover(dir.as_fd(), &rec).unwrap());
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.len(), 3000);
        assert_eq!((md.mtime(), md.mtime_nsec()), (1_600_000_000, 5));
        assert_eq!(md.permissions().mode() & 0o7777, 0o640);
        assert!(!rec_path.exists());
    }
}
