//! The receiver's side of a patch in place
//! ([`ferry_engine::delta::inplace`]) on a local tree, and the rollback of
//! a patch a killed run left half done.
//!
//! The rollback record (the same name as an append's,
//! [`undo_name`], a second format) holds the file's inode number, its old
//! and new size, its old mtime and mode, its name, and the old bytes of
//! every block about to be overwritten (as extents: offset, length, then
//! the bytes), ended by a blake3 of all that. It is written and synced
//! before the first byte is, kept locked while the patch runs, and removed
//! once the patched file is checked (and with `--fsync` synced). A record
//! found unlocked by a listing ([`crate::append::recover`]) is a run's that
//! died: the file it names, if it is still that inode at a size between
//! old and new, gets its old bytes back, its old size, mtime and mode, and
//! the record goes. A torn record (its hash does not match) was never
//! complete, so nothing was written yet: it just goes.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::thread::JoinHandle;

use ferry_engine::delta::inplace::{hash_blocks, Tracker};
use ferry_engine::delta::{self, InPlace, Layout};
use ferry_engine::entry::Meta;
use ferry_engine::piece::pread_full;
use ferry_engine::store::undo_name;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use crate::append::{create_record, mtime, open_checked, set_meta, still_ours, undo};

/// First bytes of a record of a patch in place.
pub(crate) const MAGIC: &[u8] = b"ferry-undo 2\n";
/// Bytes of a record's fixed fields after the magic: inode, old size, new
/// size, mtime seconds, nanoseconds, mode, name length.
const FIXED: usize = 8 + 8 + 8 + 8 + 4 + 4 + 4;
/// Bytes read or written at once.
const BUF: usize = 1 << 20;

/// A record's header: what it says but the old bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Head {
    ino: u64,
    old: u64,
    new: u64,
    sec: i64,
    nsec: u32,
    mode: u32,
    name: Vec<u8>,
    /// (offset, length) of each run of old bytes kept, in order.
    extents: Vec<(u64, u64)>,
}

impl Head {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAGIC.len() + FIXED + self.name.len() + 16 * 1024);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.ino.to_le_bytes());
        b.extend_from_slice(&self.old.to_le_bytes());
        b.extend_from_slice(&self.new.to_le_bytes());
        b.extend_from_slice(&self.sec.to_le_bytes());
        b.extend_from_slice(&self.nsec.to_le_bytes());
        b.extend_from_slice(&self.mode.to_le_bytes());
        b.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.name);
        b.extend_from_slice(&(self.extents.len() as u64).to_le_bytes());
        for (at, n) in &self.extents {
            b.extend_from_slice(&at.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
        b
    }

    /// The header at the start of `b` and its length; `None` when `b` does
    /// not hold a whole one.
    fn decode(b: &[u8]) -> Option<(Head, usize)> {
        let f = b.strip_prefix(MAGIC)?;
        let u64_at = |i: usize| {
            f.get(i..i + 8)
                .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
        };
        let u32_at = |i: usize| {
            f.get(i..i + 4)
                .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
        };
        let nl = u32_at(40)? as usize;
        let name = f.get(FIXED..FIXED + nl)?.to_vec();
        let count = u64_at(FIXED + nl)?;
        let mut extents = Vec::new();
        let mut at = FIXED + nl + 8;
        for _ in 0..count {
            extents.push((u64_at(at)?, u64_at(at + 8)?));
            at += 16;
        }
        let h = Head {
            ino: u64_at(0)?,
            old: u64_at(8)?,
            new: u64_at(16)?,
            sec: u64_at(24)? as i64,
            nsec: u32_at(32)?,
            mode: u32_at(36)?,
            name,
            extents,
        };
        Some((h, MAGIC.len() + at))
    }
}

/// Roll back what the record open as `rfd` in `dir` names, when it is
/// whole (its hash matches) and the file it names is still the one
/// patched; the record itself is left to the caller.
pub(crate) fn restore(dir: BorrowedFd<'_>, rfd: BorrowedFd<'_>) -> io::Result<()> {
    let len = rfs::fstat(rfd)?.st_size as u64;
    if len < 32 {
        return Ok(());
    }
    let body = len - 32;
    // Pass 1: the hash of the whole record.
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; BUF];
    let mut at = 0;
    while at < body {
        let want = ((body - at) as usize).min(BUF);
        let n = pread_full(rfd, &mut buf[..want], at)?;
        if n < want {
            return Ok(());
        }
        h.update(&buf[..n]);
        at += n as u64;
    }
    let mut sum = [0u8; 32];
    if pread_full(rfd, &mut sum, body)? != 32 || *h.finalize().as_bytes() != sum {
        // Torn: never complete, nothing was written.
        return Ok(());
    }
    // The header (its length not known before it is read).
    let mut want = (64usize << 10).min(body as usize);
    let (head, hlen) = loop {
        let mut b = vec![0u8; want];
        let n = pread_full(rfd, &mut b, 0)?;
        if let Some(x) = Head::decode(&b[..n]) {
            break x;
        }
        if want as u64 >= body {
            return Ok(());
        }
        want = (want * 4).min(body as usize);
    };
    let Some((fd, st)) = still_ours(dir, &head.name, head.ino, head.old, head.new)? else {
        return Ok(());
    };
    // Pass 2: the old bytes back where they were.
    let mut from = hlen as u64;
    for &(to, n) in &head.extents {
        let mut done = 0;
        while done < n {
            let k = ((n - done) as usize).min(BUF);
            if pread_full(rfd, &mut buf[..k], from)? != k {
                return Err(io::Error::other("rollback record cut short"));
            }
            crate::local::pwrite_all(fd.as_fd(), &buf[..k], to + done)?;
            done += k as u64;
            from += k as u64;
        }
    }
    undo(
        fd.as_fd(),
        head.old,
        head.mode,
        st.st_mode,
        &mtime(head.sec, head.nsec),
    )
}

/// One patch in place of a local file.
pub struct LocalPatch {
    dir: OwnedFd,
    name: CString,
    fd: OwnedFd,
    /// The file as it was: inode, size, mtime, mode.
    old: (u64, u64, i64, u32, u32),
    l: Layout,
    key: [u8; 32],
    hashing: Option<JoinHandle<io::Result<Vec<[u8; 32]>>>>,
    tracker: Option<Tracker>,
    /// The record written (its name, held locked).
    record: Option<(CString, OwnedFd)>,
    /// Bytes written so far.
    written: u64,
    /// This process sets owners (root).
    owner: bool,
    /// Tests: die (kill) once this many bytes are written.
    die_after: Option<u64>,
}

impl LocalPatch {
    /// The patch of `name` of `dir`, listed as `old`, to layout `l`, its
    /// old blocks' hashes under `key` started by a thread of their own;
    /// `None` when it cannot be patched in place (not a regular file with
    /// one link that this process may write, or changed since listed).
    pub fn start(
        dir: BorrowedFd<'_>,
        name: &CStr,
        old: &Meta,
        owner: bool,
        l: &Layout,
        key: &[u8; 32],
    ) -> io::Result<Option<LocalPatch>> {
        if old.size != l.old || l.new < l.old {
            return Ok(None);
        }
        let Some((fd, st)) = open_checked(dir, name, old)? else {
            return Ok(None);
        };
        let hfd = fd.try_clone()?;
        let (hl, hkey) = (*l, *key);
        let hashing = std::thread::spawn(move || hash_blocks(hfd.as_fd(), &hl, hl.head(), &hkey));
        let die_after = std::env::var("FERRY_TEST_APPEND_DIE")
            .ok()
            .and_then(|v| v.parse().ok());
        Ok(Some(LocalPatch {
            dir: dir.try_clone_to_owned()?,
            name: name.to_owned(),
            fd,
            old: (
                st.st_ino,
                st.st_size as u64,
                st.st_mtime,
                st.st_mtime_nsec as u32,
                st.st_mode,
            ),
            l: *l,
            key: *key,
            hashing: Some(hashing),
            tracker: None,
            record: None,
            written: 0,
            owner,
            die_after,
        }))
    }

    /// [`InPlace::blocks`] (the old file checked unchanged since the start).
    pub fn blocks_here(&mut self) -> io::Result<Vec<u64>> {
        if let Some(t) = self.hashing.take() {
            let h = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("hashing panicked")))?;
            self.tracker = Some(Tracker::new(self.l, self.key, h));
        }
        let t = self
            .tracker
            .as_ref()
            .ok_or_else(|| io::Error::other("patch in place: no hashes"))?;
        let st = rfs::fstat(&self.fd)?;
        let (_, size, sec, nsec, _) = self.old;
        if (st.st_size as u64, st.st_mtime, st.st_mtime_nsec as u32) != (size, sec, nsec)
            || st.st_nlink != 1
        {
            return Err(io::Error::other(
                "changed while hashed for a patch in place",
            ));
        }
        Ok(t.list())
    }

    /// [`InPlace::begin`]: the record with the old bytes of `changed`.
    pub fn begin_here(&mut self, changed: &[u32]) -> io::Result<bool> {
        let t = self
            .tracker
            .as_mut()
            .ok_or_else(|| io::Error::other("patch in place: no hashes"))?;
        t.expect(changed)?;
        // Runs of neighbouring blocks, one extent each.
        let mut extents: Vec<(u64, u64)> = Vec::new();
        for &i in changed {
            let (at, n) = self.l.span(i as usize);
            match extents.last_mut() {
                Some((a, m)) if *a + *m == at => *m += n as u64,
                _ => extents.push((at, n as u64)),
            }
        }
        let (ino, old, sec, nsec, mode) = self.old;
        let head = Head {
            ino,
            old,
            new: self.l.new,
            sec,
            nsec,
            mode,
            name: self.name.to_bytes().to_vec(),
            extents,
        };
        let rec = undo_name(self.name.to_bytes());
        let Some(rfd) = create_record(self.dir.as_fd(), &rec)? else {
            return Ok(false);
        };
        let res = (|| -> io::Result<()> {
            let mut h = blake3::Hasher::new();
            let b = head.encode();
            h.update(&b);
            let mut out = Out {
                fd: rfd.as_fd(),
                buf: b,
            };
            let mut buf = vec![0u8; BUF];
            for &(at, n) in &head.extents {
                let mut done = 0;
                while done < n {
                    let k = ((n - done) as usize).min(BUF);
                    if pread_full(self.fd.as_fd(), &mut buf[..k], at + done)? != k {
                        return Err(io::Error::other("changed while patched in place"));
                    }
                    h.update(&buf[..k]);
                    out.put(&buf[..k])?;
                    done += k as u64;
                }
            }
            out.put(h.finalize().as_bytes())?;
            out.flush()?;
            rfs::fsync(&rfd)?;
            rfs::fsync(&self.dir)?;
            Ok(())
        })();
        if let Err(e) = res {
            drop(rfd);
            let _ = rfs::unlinkat(&self.dir, &rec, AtFlags::empty());
            return Err(e);
        }
        self.record = Some((rec, rfd));
        Ok(true)
    }

    /// [`InPlace::write`].
    pub fn write_here(&mut self, at: u64, data: &[u8]) -> io::Result<()> {
        let Some(t) = self.tracker.as_mut().filter(|_| self.record.is_some()) else {
            return Err(io::Error::other("patch in place: not begun"));
        };
        t.write(at, data)?;
        if let Some(d) = self.die_after {
            // Tests: a run killed half way.
            let k = (d.saturating_sub(self.written) as usize).min(data.len());
            if k < data.len() {
                crate::local::pwrite_all(self.fd.as_fd(), &data[..k], at)?;
                let me = rustix::process::getpid();
                let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
                std::process::abort();
            }
        }
        crate::local::pwrite_all(self.fd.as_fd(), data, at)?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn finish(&mut self, root: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()> {
        let got = self.tracker.as_ref().and_then(Tracker::root);
        if self.record.is_none() || got != Some(*root) {
            return Err(delta::mismatch());
        }
        set_meta(self.fd.as_fd(), meta, self.owner, fsync)?;
        if let Some((rec, rfd)) = self.record.take() {
            rfs::unlinkat(&self.dir, &rec, AtFlags::empty())?;
            drop(rfd);
        }
        Ok(())
    }

    /// [`InPlace::commit`] without the box.
    pub fn commit_here(&mut self, root: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()> {
        let r = self.finish(root, meta, fsync);
        if r.is_err() {
            self.roll_back();
        }
        r
    }

    /// The file as it was, the record removed (nothing when none was
    /// written; kept for the next run when the rollback fails).
    fn roll_back(&mut self) {
        if let Some((rec, rfd)) = self.record.take() {
            let Ok(r) = rfs::openat(
                &self.dir,
                &rec,
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                return;
            };
            if restore(self.dir.as_fd(), r.as_fd()).is_ok() {
                let _ = rfs::unlinkat(&self.dir, &rec, AtFlags::empty());
            }
            drop(rfd);
        }
    }
}

impl Drop for LocalPatch {
    fn drop(&mut self) {
        if let Some(t) = self.hashing.take() {
            let _ = t.join();
        }
        self.roll_back();
    }
}

impl InPlace for LocalPatch {
    fn blocks(&mut self) -> io::Result<Option<Vec<u64>>> {
        self.blocks_here().map(Some)
    }
    fn begin(&mut self, changed: &[u32]) -> io::Result<bool> {
        self.begin_here(changed)
    }
    fn write(&mut self, at: u64, data: &[u8]) -> io::Result<()> {
        self.write_here(at, data)
    }
    fn commit(mut self: Box<Self>, root: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()> {
        self.commit_here(root, meta, fsync)
    }
    fn abort(self: Box<Self>) {}
}

/// Bytes written to a record in buffers of [`BUF`].
struct Out<'a> {
    fd: BorrowedFd<'a>,
    buf: Vec<u8>,
}

impl Out<'_> {
    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        if self.buf.len() + b.len() > BUF {
            self.flush()?;
        }
        if b.len() >= BUF {
            return crate::local::write_all(self.fd, b);
        }
        self.buf.extend_from_slice(b);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        crate::local::write_all(self.fd, &self.buf)?;
        self.buf.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_short_ones_are_refused() {
        let h = Head {
            ino: 7,
            old: 1 << 30,
            new: (1 << 30) + 5,
            sec: -3,
            nsec: 999,
            mode: 0o100644,
            name: b"a\xffb".to_vec(),
            extents: vec![(0, 8192), (1 << 20, 16384)],
        };
        let mut b = h.encode();
        let n = b.len();
        b.extend_from_slice(b"more");
        assert_eq!(Head::decode(&b), Some((h, n)));
        for k in 0..n {
            assert!(Head::decode(&b[..k]).is_none());
        }
    }

    use ferry_engine::delta::inplace::{differing, fd_patch_hashes};
    use ferry_engine::entry::Kind;
    use proptest::prelude::*;

    /// The metadata of `name` in `dir` as a listing gives it.
    fn meta_of(dir: BorrowedFd<'_>, name: &CStr) -> Meta {
        let st = rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).unwrap();
        Meta {
            kind: Kind::File,
            size: st.st_size as u64,
            mtime_sec: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec as u32,
            mode: st.st_mode,
            ino: st.st_ino,
            ..crate::local::EMPTY_META
        }
    }

    /// A patch of `old` to `new` in a fresh directory, `cut` of its
    /// writes done; then committed (`commit`), or left as a killed run
    /// leaves it and rolled back by the recovery a listing runs. Returns
    /// the file's bytes and mtime after, and what is left in the directory.
    fn patch(
        old: &[u8],
        new: &[u8],
        cut: usize,
        commit: bool,
    ) -> (Vec<u8>, (i64, u32), Vec<std::ffi::OsString>, bool) {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), old).unwrap();
        let dir = rfs::open(d.path(), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
        let f = rfs::openat(&dir, c"f", OFlags::WRONLY, Mode::empty()).unwrap();
        let then = mtime(1_500_000_000, 123);
        rfs::futimens(&f, &crate::local::times(&then)).unwrap();
        drop(f);
        let m = meta_of(dir.as_fd(), c"f");
        let l = Layout::new(old.len() as u64, new.len() as u64);
        let key = delta::new_key();
        let mut p = LocalPatch::start(dir.as_fd(), c"f", &m, false, &l, &key)
            .unwrap()
            .unwrap();
        let ours = p.blocks_here().unwrap();
        let mut src = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut src, new).unwrap();
        let theirs = fd_patch_hashes(src.as_fd(), &l, &key).unwrap();
        let changed = differing(&theirs.list, &ours).unwrap();
        assert!(p.begin_here(&changed).unwrap());
        let mut writes: Vec<(u64, usize)> = changed.iter().map(|&i| l.span(i as usize)).collect();
        let mut at = l.old;
        while at < l.new {
            let n = ((l.new - at) as usize).min(7000);
            writes.push((at, n));
            at += n as u64;
        }
        let done = cut.min(writes.len());
        for &(at, n) in &writes[..done] {
            p.write_here(at, &new[at as usize..at as usize + n])
                .unwrap();
        }
        let meta = Meta {
            size: new.len() as u64,
            mtime_sec: 1_600_000_000,
            mtime_nsec: 7,
            mode: m.mode,
            ..m
        };
        let committed = commit && done == writes.len();
        if committed {
            p.commit_here(&theirs.root, &meta, false).unwrap();
        } else if commit {
            // Not every block came: refused, rolled back.
            assert!(p.commit_here(&theirs.root, &meta, false).is_err());
        } else {
            // Killed: the record stays, its lock gone with the process.
            let (rec, rfd) = p.record.take().unwrap();
            drop(rfd);
            drop(p);
            assert!(crate::append::recover(dir.as_fd(), &rec).unwrap());
        }
        let m = meta_of(dir.as_fd(), c"f");
        let left = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "f")
            .collect();
        let bytes = std::fs::read(d.path().join("f")).unwrap();
        (bytes, (m.mtime_sec, m.mtime_nsec), left, committed)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Random edits at fixed offsets (and a tail): committed, the file
        /// is the new content with the new mtime; killed at any point and
        /// recovered, it is the old content with the old mtime; nothing is
        /// left beside it.
        #[test]
        fn patched_in_place_or_rolled_back(
            size in 1usize..120_000,
            edits in prop::collection::vec((any::<prop::sample::Index>(), 1usize..5000, any::<u8>()), 0..6),
            tail in prop_oneof![Just(0usize), 1usize..40_000],
            cut in 0usize..60,
            commit in any::<bool>(),
            seed in any::<u32>(),
        ) {
            let old: Vec<u8> = (0..size as u32)
                .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect();
            let mut new = old.clone();
            for (at, n, b) in &edits {
                let at = at.index(size);
                let end = (at + n).min(size);
                for x in &mut new[at..end] {
                    *x ^= b | 1;
                }
            }
            new.extend((0..tail).map(|i| (i as u8).wrapping_mul(31)));
            let (bytes, mt, left, committed) = patch(&old, &new, cut, commit);
            prop_assert!(left.is_empty(), "{:?}", left);
            prop_assert!(committed || !commit || cut < 40);
            if committed {
                prop_assert!(bytes == new);
                prop_assert_eq!(mt, (1_600_000_000, 7));
            } else {
                prop_assert!(bytes == old);
                prop_assert_eq!(mt, (1_500_000_000, 123));
            }
        }
    }
}
