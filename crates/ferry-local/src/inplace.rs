//! The receiver's side of a patch in place
//! ([`ferry_engine::delta::inplace`]) on a local tree, and the rollback of
//! a patch a killed run left half done.
//!
//! The rollback record ([`undo_name`], format 3) holds the file's inode
//! number, its old and new size, its old mtime and mode, its name, the
//! key of the block hashes, and for every block about to be overwritten
//! its offset, length and the new content's short hash, then the old
//! bytes of those blocks, a blake3 of all that, and last the file's ctime
//! as the run left it (rewritten after each write). It is written and
//! synced before the first byte is, kept locked while the patch runs, and
//! removed once the patched file is checked (and with `--fsync` synced).
//! A record found unlocked (`append::recover`) is a run's that
//! died: when the file it names is provably as that run left it (see
//! `restore`), it gets its old bytes back, its old size, mtime and
//! mode, and the record goes; otherwise only the record goes. A torn
//! record (its hash does not match) was never complete, so nothing was
//! written yet: it just goes.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::thread::JoinHandle;

use ferry_engine::delta::inplace::{hash_blocks, short, Tracker};
use ferry_engine::delta::{self, InPlace, Layout};
use ferry_engine::entry::Meta;
use ferry_engine::piece::pread_full;
use ferry_engine::store::undo_name;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use crate::append::{
    create_record, mtime, open_checked, plain_name, set_meta, still_ours, undo, Outcome,
};

/// First bytes of a record of a patch in place.
pub(crate) const MAGIC: &[u8] = b"ferry-undo 3\n";
/// First bytes of the record an older ferry wrote (no new hashes, no
/// ctime): never acted on.
pub(crate) const MAGIC_2: &[u8] = b"ferry-undo 2\n";
/// Bytes of a record's fixed fields after the magic: inode, old size, new
/// size, mtime seconds, nanoseconds, mode, name length.
const FIXED: usize = 8 + 8 + 8 + 8 + 4 + 4 + 4;
/// Bytes of a record's end: the blake3 of the rest, then the slot the run
/// rewrites around each write of the file: the file's ctime as the run
/// last left it (seconds, nanoseconds, 4 spare) and the write in flight
/// (offset, length; length 0: none).
const TRAILER: u64 = 32 + SLOT;
/// Bytes of the slot.
const SLOT: u64 = 32;
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
    /// The key of the block hashes.
    key: [u8; 32],
    /// (offset, length, new content's short hash) of each block about to
    /// be overwritten, in order: its old bytes follow the header in that
    /// order.
    blocks: Vec<(u64, u64, u32)>,
}

impl Head {
    fn encode(&self) -> Vec<u8> {
        let mut b =
            Vec::with_capacity(MAGIC.len() + FIXED + self.name.len() + 40 + 20 * self.blocks.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.ino.to_le_bytes());
        b.extend_from_slice(&self.old.to_le_bytes());
        b.extend_from_slice(&self.new.to_le_bytes());
        b.extend_from_slice(&self.sec.to_le_bytes());
        b.extend_from_slice(&self.nsec.to_le_bytes());
        b.extend_from_slice(&self.mode.to_le_bytes());
        b.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.name);
        b.extend_from_slice(&self.key);
        b.extend_from_slice(&(self.blocks.len() as u64).to_le_bytes());
        for (at, n, h) in &self.blocks {
            b.extend_from_slice(&at.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
            b.extend_from_slice(&h.to_le_bytes());
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
        let key: [u8; 32] = f.get(FIXED + nl..FIXED + nl + 32)?.try_into().ok()?;
        let count = u64_at(FIXED + nl + 32)?;
        let mut blocks = Vec::new();
        let mut at = FIXED + nl + 40;
        for _ in 0..count {
            blocks.push((u64_at(at)?, u64_at(at + 8)?, u32_at(at + 16)?));
            at += 20;
        }
        let h = Head {
            ino: u64_at(0)?,
            old: u64_at(8)?,
            new: u64_at(16)?,
            sec: u64_at(24)? as i64,
            nsec: u32_at(32)?,
            mode: u32_at(36)?,
            name,
            key,
            blocks,
        };
        Some((h, MAGIC.len() + at))
    }
}

/// The name a record's first bytes `b` give (for a message).
pub(crate) fn named(b: &[u8]) -> Option<Vec<u8>> {
    let f = b.strip_prefix(MAGIC)?;
    let nl = u32::from_le_bytes(f.get(40..44)?.try_into().ok()?) as usize;
    f.get(FIXED..FIXED + nl).map(<[u8]>::to_vec)
}

/// The slot of a file whose ctime is `st`'s, no write in flight.
fn slot_bytes(st: &rfs::Stat) -> [u8; SLOT as usize] {
    let mut b = [0u8; SLOT as usize];
    b[..8].copy_from_slice(&st.st_ctime.to_le_bytes());
    b[8..12].copy_from_slice(&(st.st_ctime_nsec as u32).to_le_bytes());
    b
}

/// Roll back what the record `rec` (open as `rfd`, `rst` its `fstat`) of
/// `dir` names, when it is whole (its hash matches), names a plain entry
/// of `dir` (the one `rec` is named after), and that file is still the
/// one patched, exactly as the killed run left it: the same inode, a
/// regular file with one link owned by the record's owner (root's records
/// may name anyone's file), a size between old and new, the ctime the run
/// last saw (not with `trusted`: the run itself rolls back), and each
/// block the record covers either its old bytes or the new ones (their
/// hash). The record itself is left to the caller.
pub(crate) fn restore(
    dir: BorrowedFd<'_>,
    rec: &CStr,
    rfd: BorrowedFd<'_>,
    rst: &rfs::Stat,
    trusted: bool,
) -> io::Result<Outcome> {
    let mut buf = vec![0u8; BUF];
    let Some(Record {
        head,
        hlen,
        body,
        left,
        fly_at,
        fly_len,
    }) = read_record(rfd, rst.st_size as u64, &mut buf)?
    else {
        return Ok(Outcome::Torn);
    };
    if !plain_name(&head.name) || undo_name(&head.name).as_c_str() != rec {
        return Ok(Outcome::Stale("it names another entry than its own file"));
    }
    let (fd, st) = match still_ours(dir, &head.name, rst.st_uid, (head.ino, head.old, head.new))? {
        Ok(x) => x,
        Err(why) => return Ok(Outcome::Stale(why)),
    };
    const CHANGED: Outcome = Outcome::Stale("the file changed since the run was killed");
    // No write in flight: the file's ctime is the one the run left (a
    // write in flight changed it: then only the bytes tell).
    if !trusted && fly_len == 0 && slot_bytes(&st)[..16] != left[..16] {
        return Ok(CHANGED);
    }
    // The pages of the write in flight: their new bytes' hashes.
    let fly_end = fly_at.saturating_add(fly_len);
    let pages = fly_pages_len(fly_at, fly_len, head.old);
    let mut fly = vec![0u8; pages];
    if pread_full(rfd, &mut fly, body + TRAILER)? != pages {
        return Ok(Outcome::Stale("the record is cut short"));
    }
    // Each block still its old bytes or the new ones; in the write in
    // flight, each page.
    let most = head.blocks.iter().map(|b| b.1).max().unwrap_or(0);
    if most > 64 << 20 {
        return Ok(Outcome::Stale("not a record ferry wrote"));
    }
    buf.resize(buf.len().max(most as usize), 0);
    let mut cur = vec![0u8; buf.len()];
    let mut from = hlen as u64;
    let mut new = Vec::with_capacity(head.blocks.len());
    for &(to, n, hash) in &head.blocks {
        let k = n as usize;
        if pread_full(rfd, &mut buf[..k], from)? != k {
            return Ok(Outcome::Stale("the record is cut short"));
        }
        if pread_full(fd.as_fd(), &mut cur[..k], to)? != k {
            return Ok(CHANGED);
        }
        let is_old = buf[..k] == cur[..k];
        if !is_old && fly_len > 0 && to < fly_end && fly_at < to + n {
            if to < fly_at || to + n > fly_end {
                return Ok(CHANGED);
            }
            // A kill in the middle of this write: each page old or new.
            for (pat, c) in pages_of(to, n) {
                let o = (pat - to) as usize;
                let i = (pat / PAGE - fly_at / PAGE) as usize;
                let want = fly.get(i * 4..i * 4 + 4);
                let got = page_hash(&head.key, &cur[o..o + c]).to_le_bytes();
                if buf[o..o + c] != cur[o..o + c] && want != Some(&got[..]) {
                    return Ok(CHANGED);
                }
            }
            new.push(true);
        } else if !is_old {
            let mut hasher = delta::inplace::BlockHasher::new(&head.key);
            hasher.update(&cur[..k]);
            if short(&hasher.finalize()) != u64::from(hash) {
                return Ok(CHANGED);
            }
            new.push(true);
        } else {
            new.push(false);
        }
        from += n;
    }
    // The old bytes back where new ones are.
    let mut from = hlen as u64;
    for (&(to, n, _), &put) in head.blocks.iter().zip(&new) {
        let k = n as usize;
        if put {
            if pread_full(rfd, &mut buf[..k], from)? != k {
                return Err(io::Error::other("rollback record cut short"));
            }
            crate::local::pwrite_all(fd.as_fd(), &buf[..k], to)?;
        }
        from += n;
    }
    undo(
        fd.as_fd(),
        head.old,
        head.mode,
        st.st_mode,
        &mtime(head.sec, head.nsec),
    )?;
    Ok(Outcome::Restored)
}

/// A rollback record read whole and its hash checked: its header (and the
/// header's length), where its body ends, the slot the run last wrote (the
/// file's ctime then, the write in flight).
struct Record {
    head: Head,
    hlen: usize,
    body: u64,
    left: [u8; SLOT as usize],
    fly_at: u64,
    fly_len: u64,
}

/// The record `rfd` of `len` bytes ([`Record`]), read with `buf`; `None`
/// when it is torn (cut short, or its hash not its bytes').
fn read_record(rfd: BorrowedFd<'_>, len: u64, buf: &mut [u8]) -> io::Result<Option<Record>> {
    // The header (its length not known before it is read); one cut
    // short was never complete, so nothing was written.
    let mut want = (64usize << 10).min(len as usize);
    let (head, hlen) = loop {
        let mut b = vec![0u8; want];
        let n = pread_full(rfd, &mut b, 0)?;
        if let Some(x) = Head::decode(&b[..n]) {
            break x;
        }
        if want as u64 >= len {
            return Ok(None);
        }
        want = (want * 4).min(len as usize);
    };
    let body = head
        .blocks
        .iter()
        .try_fold(hlen as u64, |a, &(_, n, _)| a.checked_add(n));
    let Some(body) = body.filter(|b| b.saturating_add(TRAILER) <= len) else {
        return Ok(None);
    };
    // The hash of the whole record.
    let mut h = blake3::Hasher::new();
    let mut at = 0;
    while at < body {
        let want = ((body - at) as usize).min(BUF);
        let n = pread_full(rfd, &mut buf[..want], at)?;
        if n < want {
            return Ok(None);
        }
        h.update(&buf[..n]);
        at += n as u64;
    }
    let mut sum = [0u8; 32];
    if pread_full(rfd, &mut sum, body)? != 32 || *h.finalize().as_bytes() != sum {
        return Ok(None);
    }
    let mut left = [0u8; SLOT as usize];
    if pread_full(rfd, &mut left, body + 32)? != left.len() {
        return Ok(None);
    }
    let (fly_at, fly_len) = (
        u64::from_le_bytes(left[16..24].try_into().unwrap()),
        u64::from_le_bytes(left[24..32].try_into().unwrap()),
    );
    Ok(Some(Record {
        head,
        hlen,
        body,
        left,
        fly_at,
        fly_len,
    }))
}

/// Bytes of a page of the write in flight.
const PAGE: u64 = 4096;

/// The pages of `n` bytes at `at`: (offset, length), cut at multiples of
/// [`PAGE`].
fn pages_of(at: u64, n: u64) -> impl Iterator<Item = (u64, usize)> {
    let end = at + n;
    let mut p = at;
    std::iter::from_fn(move || {
        if p >= end {
            return None;
        }
        let next = ((p / PAGE + 1) * PAGE).min(end);
        let r = (p, (next - p) as usize);
        p = next;
        Some(r)
    })
}

/// Bytes of the page hashes of a write of `len` bytes at `at` (its part
/// before `old`: the tail is cut by a rollback anyway).
fn fly_pages_len(at: u64, len: u64, old: u64) -> usize {
    let end = at.saturating_add(len).min(old);
    if at >= end {
        return 0;
    }
    4 * pages_of(at, end - at).count()
}

/// A page's hash in the record: the first 4 bytes of its block hash.
fn page_hash(key: &[u8; 32], data: &[u8]) -> u32 {
    let mut h = delta::inplace::BlockHasher::new(key);
    h.update(data);
    short(&h.finalize()) as u32
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
    /// The record written (its name, held locked) and the offset of its
    /// ctime as the run left the file.
    record: Option<(CString, OwnedFd, u64)>,
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
    /// one link that this process may write and owns unless root, or
    /// changed since listed).
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
        // The record will be this process's: a recovery trusts it only
        // for a file of its owner (or as root's).
        let me = rustix::process::geteuid();
        if !me.is_root() && st.st_uid != me.as_raw() {
            return Ok(None);
        }
        let hfd = fd.try_clone()?;
        let (hl, hkey) = (*l, *key);
        let hashing = std::thread::spawn(move || hash_blocks(hfd.as_fd(), &hl, hl.head(), &hkey));
        // Tests: die after so many bytes (the `fault-injection` feature,
        // which release builds lack).
        #[cfg(feature = "fault-injection")]
        let die_after = std::env::var("FERRY_TEST_APPEND_DIE")
            .ok()
            .and_then(|v| v.parse().ok());
        #[cfg(not(feature = "fault-injection"))]
        let die_after = None;
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

    /// [`InPlace::begin`]: the record with the old bytes of `changed` and
    /// the new content's short hashes of them (`new`).
    pub fn begin_here(&mut self, changed: &[u32], new: &[u64]) -> io::Result<bool> {
        let t = self
            .tracker
            .as_mut()
            .ok_or_else(|| io::Error::other("patch in place: no hashes"))?;
        if new.len() != changed.len() {
            return Err(io::Error::other("patch in place: bad changed block"));
        }
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
            key: self.key,
            blocks: changed
                .iter()
                .zip(new)
                .map(|(&i, &h)| {
                    let (at, n) = self.l.span(i as usize);
                    (at, n as u64, h as u32)
                })
                .collect(),
        };
        let rec = undo_name(self.name.to_bytes());
        let Some(rfd) = create_record(self.dir.as_fd(), &rec)? else {
            return Ok(false);
        };
        let res = (|| -> io::Result<u64> {
            let mut h = blake3::Hasher::new();
            let b = head.encode();
            h.update(&b);
            let mut out = Out {
                fd: rfd.as_fd(),
                buf: b,
                at: 0,
            };
            let mut buf = vec![0u8; BUF];
            for &(at, n) in &extents {
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
            let at = out.at + out.buf.len() as u64;
            // The file's ctime as it is (nothing written yet), and room
            // for the page hashes of a write in flight (written before
            // each write: a full disk fails here, not then).
            out.put(&slot_bytes(&rfs::fstat(&self.fd)?))?;
            let most = (BUF as u64).max(self.l.block);
            out.put(&vec![0u8; 4 * (most / PAGE + 2) as usize])?;
            out.flush()?;
            rfs::fsync(&rfd)?;
            rfs::fsync(&self.dir)?;
            Ok(at)
        })();
        let at = match res {
            Ok(at) => at,
            Err(e) => {
                drop(rfd);
                let _ = rfs::unlinkat(&self.dir, &rec, AtFlags::empty());
                return Err(e);
            }
        };
        self.record = Some((rec, rfd, at));
        Ok(true)
    }

    /// The file's ctime after a write of ours, in the record, no write in
    /// flight: a recovery that finds another ctime knows someone else
    /// changed the file since.
    fn mark(&self) -> io::Result<()> {
        if let Some((_, rfd, at)) = &self.record {
            let c = slot_bytes(&rfs::fstat(&self.fd)?);
            crate::local::pwrite_all(rfd.as_fd(), &c, *at)?;
        }
        Ok(())
    }

    /// The write of `data` at `at` in flight, in the record: the hash of
    /// each page it writes before the old end (after the record's slot),
    /// then where it writes (in the slot). A run killed during it leaves
    /// each page old or new (the kernel copies whole pages), so a
    /// recovery still tells a later write apart.
    fn in_flight(&self, at: u64, data: &[u8]) -> io::Result<()> {
        if let Some((_, rfd, slot)) = &self.record {
            let head = (self.old.1.saturating_sub(at) as usize).min(data.len());
            if head > 0 {
                let hs: Vec<u8> = pages_of(at, head as u64)
                    .flat_map(|(p, n)| {
                        let o = (p - at) as usize;
                        page_hash(&self.key, &data[o..o + n]).to_le_bytes()
                    })
                    .collect();
                crate::local::pwrite_all(rfd.as_fd(), &hs, *slot + SLOT)?;
            }
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&at.to_le_bytes());
            b[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
            crate::local::pwrite_all(rfd.as_fd(), &b, *slot + 16)?;
        }
        Ok(())
    }

    /// [`InPlace::write`].
    pub fn write_here(&mut self, at: u64, data: &[u8]) -> io::Result<()> {
        let Some(t) = self.tracker.as_mut().filter(|_| self.record.is_some()) else {
            return Err(io::Error::other("patch in place: not begun"));
        };
        t.write(at, data)?;
        if let Some(d) = self.die_after {
            // Tests: a run killed half way: between two writes (at a
            // write's start), or in the middle of one.
            let k = (d.saturating_sub(self.written) as usize).min(data.len());
            if k < data.len() {
                // As the kernel leaves a write a fatal signal cuts: whole
                // pages.
                let k = (((at + k as u64) / PAGE * PAGE).saturating_sub(at) as usize).min(k);
                if k > 0 {
                    self.in_flight(at, data)?;
                    crate::local::pwrite_all(self.fd.as_fd(), &data[..k], at)?;
                }
                let me = rustix::process::getpid();
                let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
                std::process::abort();
            }
        }
        self.in_flight(at, data)?;
        crate::local::pwrite_all(self.fd.as_fd(), data, at)?;
        self.mark()?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn finish(&mut self, root: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()> {
        let got = self.tracker.as_ref().and_then(Tracker::root);
        if self.record.is_none() || got != Some(*root) {
            return Err(delta::mismatch());
        }
        set_meta(self.fd.as_fd(), meta, self.owner, fsync)?;
        if let Some((rec, rfd, _)) = self.record.take() {
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
        if let Some((rec, rfd, _)) = self.record.take() {
            let Ok(r) = rfs::openat(
                &self.dir,
                &rec,
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                return;
            };
            let Ok(rst) = rfs::fstat(&r) else { return };
            match restore(self.dir.as_fd(), &rec, r.as_fd(), &rst, true) {
                Ok(Outcome::Stale(why)) => {
                    eprintln!(
                        "ferry: {}: not rolled back ({why}): file left as it is",
                        self.name.to_bytes().escape_ascii()
                    );
                    let _ = rfs::unlinkat(&self.dir, &rec, AtFlags::empty());
                }
                Ok(_) => {
                    let _ = rfs::unlinkat(&self.dir, &rec, AtFlags::empty());
                }
                Err(_) => {}
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
    fn begin(&mut self, changed: &[u32], new: &[u64]) -> io::Result<bool> {
        self.begin_here(changed, new)
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
    /// Bytes written out so far.
    at: u64,
}

impl Out<'_> {
    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        if self.buf.len() + b.len() > BUF {
            self.flush()?;
        }
        if b.len() >= BUF {
            self.at += b.len() as u64;
            return crate::local::write_all(self.fd, b);
        }
        self.buf.extend_from_slice(b);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        crate::local::write_all(self.fd, &self.buf)?;
        self.at += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
