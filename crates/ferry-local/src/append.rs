//! The recovery of a patch in place ([`crate::inplace`]) that a killed
//! run left half done, and the pieces rollback records share.
//!
//! A record, `.ferry-undo-<16 hex>.~ferry~` beside its file
//! ([`ferry_engine::store::undo_name`]), is found by a listing of its
//! directory or a stat of its file (`recover`), unlocked: a run's that
//! died. It is acted on only when ferry could have written it and the
//! file is exactly as that run left it (docs/DESIGN.md, "Rollback
//! records"): a regular file with one link, owned by the file's owner (or
//! by root), naming a plain entry of its own directory (the one its name
//! is made from), that file still the same inode with one link, the ctime
//! the run last saw and each block either its old or its new bytes. Then
//! the file gets its old bytes, size, mtime and mode back (never a
//! setuid, setgid or sticky bit it does not have); otherwise the file is
//! left alone and one line says why. Either way the record goes, except
//! in a store that only reads ([`crate::LocalStore::read_only`]). Records of older formats
//! (an append's, format 1; a patch's without hashes, format 2) prove
//! nothing: never acted on.

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

/// What became of a record found by a listing.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The file it names got its old bytes, size, mtime and mode back.
    Restored,
    /// Torn: never complete, so nothing was written.
    Torn,
    /// Not acted on, for this reason (the file is left as it is).
    Stale(&'static str),
}

/// A name a record may give: a plain entry of its own directory.
pub(crate) fn plain_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

/// The smallest file that can have a record: a patch in place needs an
/// old copy of at least [`ferry_engine::delta::APPEND_MIN`] (tests lower
/// it to 1 MiB, never below).
pub(crate) const RECORD_MIN: u64 = 1 << 20;

/// [`recover`] the record `rec` of `dir` if there is one: `true` when
/// there was (whatever became of it).
pub(crate) fn recover_any(dir: BorrowedFd<'_>, rec: &CStr) -> bool {
    match rfs::accessat(dir, rec, rfs::Access::EXISTS, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => false,
        _ => {
            let _ = recover(dir, rec);
            true
        }
    }
}

/// Roll back what the record `rec` of directory `dir` names, unless a live
/// run holds it; the record is removed (and `true` returned) unless it is
/// live. Never called for a store that only reads
/// ([`crate::LocalStore::read_only`]). A record is acted on
/// only when ferry could have written it (see [`crate::inplace`]);
/// otherwise, or when the file is no longer as the killed run left it,
/// the file is left alone and one line says so.
pub(crate) fn recover(dir: BorrowedFd<'_>, rec: &CStr) -> io::Result<bool> {
    let rfd = match rfs::openat(
        dir,
        rec,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    let rst = rfs::fstat(&rfd)?;
    if FileType::from_raw_mode(rst.st_mode) != FileType::RegularFile {
        return Err(io::Error::other("a rollback record that is not a file"));
    }
    match rfs::flock(&rfd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    let mut b = vec![0u8; 64 << 10];
    let n = ferry_engine::piece::pread_full(rfd.as_fd(), &mut b, 0)?;
    let out = if rst.st_nlink != 1 {
        Outcome::Stale("the record has other links")
    } else if b[..n].starts_with(crate::inplace::MAGIC) {
        crate::inplace::restore(dir, rec, rfd.as_fd(), &rst, false)?
    } else if b[..n].starts_with(crate::inplace::MAGIC_2) || Record::decode(&b[..n]).is_some() {
        // Written by an older ferry: it holds nothing that proves the
        // file is still as that run left it.
        Outcome::Stale(
            "written by an older ferry, it cannot prove the file is as the killed run left it",
        )
    } else {
        Outcome::Torn
    };
    if let Outcome::Stale(why) = out {
        eprintln!(
            "ferry: {}: rollback record {} not acted on ({why}): file left as it is, record removed",
            record_file(dir, rec, &b[..n]),
            rec.to_bytes().escape_ascii()
        );
    }
    match rfs::unlinkat(dir, rec, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// The name of the file a record's bytes `b` say it names, for a message
/// (escaped; the directory's path when known).
fn record_file(dir: BorrowedFd<'_>, _rec: &CStr, b: &[u8]) -> String {
    let name = crate::inplace::named(b)
        .or_else(|| Record::decode(b).map(|r| r.name))
        .unwrap_or_else(|| b"?".to_vec());
    let at = rfs::readlinkat(
        rfs::CWD,
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir)),
        Vec::new(),
    )
    .map(|p| p.into_bytes())
    .unwrap_or_default();
    let mut p = at;
    if !p.is_empty() && !p.ends_with(b"/") {
        p.push(b'/');
    }
    p.extend_from_slice(&name);
    p.escape_ascii().to_string()
}

/// The file `name` of `dir` opened to be rolled back, with its `fstat`,
/// when it is still inode `ino`, a regular file with one link owned by
/// the record's owner (`rec_uid`; root's records may name anyone's file),
/// at a size between `old` and `new`; why not otherwise.
pub(crate) fn still_ours(
    dir: BorrowedFd<'_>,
    name: &[u8],
    rec_uid: u32,
    (ino, old, new): (u64, u64, u64),
) -> io::Result<Result<(OwnedFd, rfs::Stat), &'static str>> {
    let Ok(name) = CString::new(name) else {
        return Ok(Err("a name with a NUL"));
    };
    // Looked at before it is opened: a device or fifo is never opened.
    match rfs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile => {
            return Ok(Err("it names something other than a regular file"))
        }
        Ok(st) if st.st_ino != ino => return Ok(Err("the file was replaced since")),
        Ok(_) => {}
        Err(Errno::NOENT) => return Ok(Err("the file is gone")),
        Err(e) => return Err(e.into()),
    }
    let fd = match rfs::openat(
        dir,
        &name,
        OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(Err("the file is gone")),
        Err(e) => return Err(e.into()),
    };
    let st = rfs::fstat(&fd)?;
    let size = st.st_size as u64;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Ok(Err("it names something other than a regular file"));
    }
    if st.st_ino != ino {
        return Ok(Err("the file was replaced since"));
    }
    if st.st_nlink != 1 {
        return Ok(Err("the file has other links"));
    }
    if rec_uid != 0 && rec_uid != st.st_uid {
        return Ok(Err("the record is not its file's owner's"));
    }
    if size < old || size > new {
        return Ok(Err("the file changed since"));
    }
    Ok(Ok((fd, st)))
}

/// The file `fd` (now of mode `now_mode`) back to `size` bytes, mode
/// `mode` and mtime `m`, synced. No mode bit is gained but the permission
/// bits: setuid, setgid and sticky only where the file still has them.
pub(crate) fn undo(
    fd: BorrowedFd<'_>,
    size: u64,
    mode: u32,
    now_mode: u32,
    m: &Meta,
) -> io::Result<()> {
    rfs::ftruncate(fd, size)?;
    let want = safe_mode(mode, now_mode);
    if now_mode & 0o7777 != want {
        rfs::fchmod(fd, Mode::from_raw_mode(want))?;
    }
    rfs::futimens(fd, &times(m))?;
    rfs::fsync(fd)?;
    Ok(())
}

/// The mode a rollback gives back: `old`'s permission bits, its setuid,
/// setgid and sticky bits only where `now` has them too.
pub(crate) fn safe_mode(old: u32, now: u32) -> u32 {
    (old & 0o777) | (old & now & 0o7000)
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
    /// by a listing: it holds nothing that proves the file is as the
    /// killed run left it, so the file is left alone; the record goes.
    #[test]
    fn a_format_1_record_left_by_an_older_run_is_not_acted_on() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![7u8; 5000]).unwrap();
        let before = std::fs::metadata(&p).unwrap();
        let r = Record {
            ino: before.ino(),
            old: 3000,
            new: 5000,
            sec: 1_600_000_000,
            nsec: 5,
            mode: 0o104777,
            name: b"f".to_vec(),
        };
        let rec = ferry_engine::store::undo_name(b"f");
        let rec_path = d.path().join(rec.to_str().unwrap());
        std::fs::write(&rec_path, r.encode()).unwrap();
        let dir = rfs::open(d.path(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
        assert!(recover(dir.as_fd(), &rec).unwrap());
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.len(), 5000);
        assert_eq!(md.mtime(), before.mtime());
        assert_eq!(md.permissions().mode(), before.permissions().mode());
        assert!(!rec_path.exists());
    }

    #[test]
    fn a_rollback_never_gains_a_set_id_or_sticky_bit() {
        assert_eq!(safe_mode(0o104755, 0o100644), 0o755);
        assert_eq!(safe_mode(0o106755, 0o102644), 0o2755);
        assert_eq!(safe_mode(0o100600, 0o101777), 0o600);
        let bad: [&[u8]; 6] = [b"", b".", b"..", b"../v", b"a/b", b"a\0b"];
        for bad in bad {
            assert!(!plain_name(bad), "{bad:?}");
        }
        assert!(plain_name(b"..a") && plain_name(b"f"));
    }
}
