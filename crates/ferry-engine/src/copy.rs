//! One file copy, and the content compare of `--checksum`, for every
//! command that moves files (copy, sync, bisync): a [`Copier`] over a
//! source and a destination [`Store`] with the run's shared options.
//!
//! A copy goes through the destination's temporary + commit path (never
//! visible half-written), paced by `--bwlimit`, its bytes counted as they
//! move (progress), and checked against what was expected afterwards: a
//! source that changed while it was copied is copied once more against its
//! new state, and if it changed again the copy fails. A new empty file is
//! created in one step where the store can. With `-X`/`-A` the copy carries
//! the source's extended attributes and ACLs, given to the file before it
//! is named. A changed file both stores can send by delta goes that way
//! (`crate::delta`): the destination signs its old copy, the source's ops
//! rebuild the new one into the temporary; a delta that fails in any way
//! (a rebuilt file whose hash is not the source's) is sent whole instead.

use std::ffi::CStr;
use std::io;
use std::sync::atomic::AtomicU64;

use crate::bwlimit::Limiter;
use crate::delta::{self, DiffSummary, Signature, Tally};
use crate::entry::{Kind, Meta};
use crate::hash::{hash_bytes, Hash};
use crate::keep::Keeper;
use crate::special::SpecialBits;
use crate::store::{
    cut_nsec, op_err, op_of, Committing, DeltaRole, End, Planned, SourceFile, Store, StoreExt,
    Tracked,
};
use crate::xattr::{XattrRun, Xattrs};

/// What the patch-in-place fast path did.
enum Appended {
    /// Patched in place: the copy is done.
    Done(Copied),
    /// Not tried, or not patched in place: the normal way.
    No,
    /// Tried and rolled back (the whole hash did not match): send whole.
    Whole,
}

/// [`delta::APPEND_MIN`], or `FERRY_TEST_APPEND_MIN` (bytes) in tests
/// (the `fault-injection` feature, which release builds lack).
#[cfg(feature = "fault-injection")]
fn append_min() -> u64 {
    static MIN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("FERRY_TEST_APPEND_MIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(delta::APPEND_MIN)
            // Never below: a local stat looks for a record only from there
            // (ferry-local `append::RECORD_MIN`).
            .max(delta::MIN_SIZE)
    })
}

/// [`delta::APPEND_MIN`].
#[cfg(not(feature = "fault-injection"))]
fn append_min() -> u64 {
    delta::APPEND_MIN.max(delta::MIN_SIZE)
}

/// Buffer size of the content compare.
const COMPARE_BUF: usize = 256 * 1024;

/// Copies files from `src` to `dst`.
pub struct Copier<'a, S: Store, D: Store> {
    /// Where files are read.
    pub src: &'a S,
    /// Where files are written.
    pub dst: &'a D,
    /// Make each file durable before it is named (`--fsync`).
    pub fsync: bool,
    /// Bandwidth limit over all transfers together (`--bwlimit`).
    pub bwlimit: Option<&'a Limiter>,
    /// The run's count of bytes moved (what a progress display reads).
    pub moved: &'a AtomicU64,
    /// Extended attributes and ACLs to keep (`-X`, `-A`); `None`: none,
    /// and no call made for them.
    pub xattrs: Option<&'a XattrRun>,
    /// Changed files by delta where both stores can (`None`:
    /// `--whole-file`).
    pub delta: Option<delta::Use<'a>>,
    /// Keep the file a copy replaces, before it is replaced (`--backup-dir`,
    /// `--suffix`, `--versions`); `None`: replace it for good.
    pub keep: Option<&'a Keeper>,
    /// The step mtimes are compared to ([`crate::store::mtime_step`] of
    /// the two stores, which the engine cuts its listings to).
    pub mtime_step: u32,
    /// The run's rule for setuid, setgid and sticky bits from the source
    /// (see [`crate::special`]): applied to every mode the copy writes
    /// (the [`Copied::meta`] it returns is the source's, bits and all).
    /// `None`: modes written as they are.
    pub special: Option<&'a SpecialBits>,
    /// In a watch (its runs' shared state): a file that grows is taken as
    /// appended to (`Copier::append_tail`; a copy of a file that only
    /// grew while it was copied is committed as listed). `None`: a file
    /// that changed while copied is copied again, then fails.
    pub grow: Option<&'a crate::Guard>,
}

/// The bytes at the end of a destination's old part compared with the
/// source's before only the tail is appended (`--append-verify`'s check).
const VERIFY_TAIL: u64 = 64 << 10;

/// A committed copy.
#[derive(Clone, Debug)]
pub struct Copied {
    /// Bytes copied.
    pub bytes: u64,
    /// The source's metadata the copy was committed with: the listed one,
    /// made exact by the reader (a store listing approximate metadata) or
    /// updated by a source that changed before the second attempt.
    pub meta: Meta,
    /// Where the file it replaced was kept (see [`Keeper::keep`]), when
    /// it was.
    pub kept: Option<Vec<u8>>,
}

/// One file to copy ([`Copier::copy_file`]): `sname` of `sdir`, listed
/// as `meta`, to `name` of `ddir`; `rel`: the destination's path below its
/// root (where a kept copy of what it replaces goes); `old`: the
/// destination's entry of that name as listed (`None`: there is none).
pub struct FileCopy<'x, 'd, S: Store, D: Store> {
    /// The source's directory.
    pub sdir: &'x S::Dir,
    /// The source's name there.
    pub sname: &'x CStr,
    /// The destination's directory (a commit in flight borrows it).
    pub ddir: &'d D::Dir,
    /// The destination's name there.
    pub name: &'x CStr,
    /// The destination's path below its root.
    pub rel: &'x [u8],
    /// The source as listed.
    pub meta: &'x Meta,
    /// The destination's entry of that name, as listed.
    pub old: Option<&'x Meta>,
}

impl<S: Store, D: Store> Clone for FileCopy<'_, '_, S, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: Store, D: Store> Copy for FileCopy<'_, '_, S, D> {}

impl<'a, S: Store, D: Store> Copier<'a, S, D> {
    /// `m` as it is written to the destination (see [`Copier::special`]).
    fn out(&self, m: &Meta) -> Meta {
        self.special.map_or(*m, |s| s.apply(m))
    }

    /// Copy `sname` of `sdir` to `name` in `ddir` through a temporary, set
    /// its metadata, rename it into place. `meta`: the source as listed;
    /// `rel`: the destination's path below its root (where a kept copy of
    /// what it replaces goes); `old`: the destination's entry of that name
    /// (`None`: there is none).
    ///
    /// A source that can tell its current size and mtime cheaply (a local
    /// file: one `fstat` of the open descriptor, after the copy) is checked
    /// against what was expected: a file that changed while it was copied
    /// (or since it was listed) is copied once more against its new state,
    /// and if it changed again the copy fails. Either way a copy that may
    /// be torn is dropped, never given the source's mtime.
    pub fn copy_file(&self, f: FileCopy<'_, '_, S, D>) -> io::Result<Copied> {
        self.copy_file_as(f, false)
            .map(|(c, _)| c)
            .map_err(|e| self.full_disk(f.ddir, f.meta.size, e))
    }

    /// [`Copier::copy_file`] up to a commit started with
    /// [`PipelineStore::commit_nowait`](crate::store::PipelineStore::commit_nowait) (a copy by
    /// delta, whose failure shows on its commit, still waits for it): the copy as it will be once
    /// [`Committing::wait`] confirms it. Nothing may be reported as copied before that.
    pub fn copy_file_nowait<'d>(
        &self,
        f: FileCopy<'_, 'd, S, D>,
    ) -> io::Result<(Copied, Committing<'d>)>
    where
        'a: 'd,
    {
        self.copy_file_as(f, true)
            .map(|(c, w)| (c, w.unwrap_or_else(|| Committing::done(Ok(())))))
            .map_err(|e| self.full_disk(f.ddir, f.meta.size, e))
    }

    /// `e`, the failure of writing a file of `size` bytes into `ddir`: when
    /// the disk there is full, one error saying what the file needs and
    /// what is free (asked now: the store has removed what the file had
    /// written).
    pub fn full_disk(&self, ddir: &D::Dir, size: u64, e: io::Error) -> io::Error {
        if !crate::store::is_no_space(&e) || matches!(op_of(&e), Some((_, "write"))) {
            return e;
        }
        let free = self.dst.free_space(ddir);
        if let Some((bytes, inodes)) = free {
            if inodes > 0 && bytes >= size.saturating_add(1 << 20) {
                // Room here: the disk that was full is another one (where
                // a replaced file is kept): its error says so itself.
                return e;
            }
        }
        crate::store::no_space(End::Dst, size, free)
    }

    /// `copy_file`; with `nowait`, the commit of a whole copy is started
    /// and returned, not waited for.
    fn copy_file_as<'d>(
        &self,
        f: FileCopy<'_, 'd, S, D>,
        nowait: bool,
    ) -> io::Result<(Copied, Option<Committing<'d>>)>
    where
        'a: 'd,
    {
        let FileCopy {
            sdir,
            sname,
            ddir,
            name,
            rel: _,
            meta,
            old,
        } = f;
        let fresh = old.is_none();
        // An empty file has no content to hide while half-written: the
        // store may create it under its name directly, without reading the
        // source (whose listed metadata must then be exact).
        if fresh
            && meta.size == 0
            && !self.src.features().approximate_meta
            && self
                .dst
                .create_empty(ddir, name, &self.out(meta), self.fsync)?
        {
            self.new_entry_xattrs(sdir, sname, ddir, name, meta)?;
            let c = Copied {
                bytes: 0,
                meta: *meta,
                kept: None,
            };
            return Ok((c, None));
        }
        let mut want = *meta;
        let mut seen = (meta.size, meta.mtime_sec, meta.mtime_nsec);
        let mut whole = false;
        if let Some(g) = self.grow {
            if let Some(c) = self.append_tail(g, f)? {
                return Ok((c, None));
            }
        }
        match self.append(sdir, sname, ddir, name, meta, old) {
            Appended::Done(c) => return Ok((c, None)),
            Appended::No => {}
            Appended::Whole => whole = true,
        }
        let mut sig = if whole {
            None
        } else {
            self.signature(ddir, name, meta, fresh)
        };
        let mut tries = 0;
        while tries < 2 {
            let nowait = nowait && sig.is_none();
            match self.copy_once(FileCopy { meta: &want, ..f }, sig.as_ref(), nowait) {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(now)) => {
                    tries += 1;
                    seen = now;
                    want = Meta {
                        size: now.0,
                        mtime_sec: now.1,
                        mtime_nsec: now.2,
                        ..want
                    };
                }
                Err(e) if sig.is_some() && !crate::store::is_lost(&e) => {
                    // The delta failed (its rebuilt file did not match, the
                    // old copy could not be read): the file goes whole.
                    sig = None;
                    self.count(|c| &c.fallbacks, 1);
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other(format!(
            "changed while being copied (size {} when listed, {} now), not copied: the next run copies it again",
            meta.size, seen.0
        )))
    }

    /// One attempt of `copy_file`: `Ok(Ok(copied))` when committed (with
    /// `nowait`, when its commit is started: returned with it),
    /// `Ok(Err(now))` when the source changed (nothing committed; `now`:
    /// its current size and mtime).
    #[allow(clippy::type_complexity)]
    fn copy_once<'d>(
        &self,
        f: FileCopy<'_, 'd, S, D>,
        sig: Option<&Signature>,
        nowait: bool,
    ) -> io::Result<Result<(Copied, Option<Committing<'d>>), (u64, i64, u32)>>
    where
        'a: 'd,
    {
        let FileCopy {
            sdir,
            sname,
            ddir,
            name,
            rel,
            meta,
            old,
        } = f;
        let r = self
            .src
            .open_file(sdir, sname)
            .map_err(|e| op_err(e, Some(End::Src), "open"))?;
        let mut r = Tracked::new(r, self.moved);
        // The source's attributes, from the descriptor just opened (one
        // call for a file that has none).
        let mut attrs = Xattrs::new();
        if let Some(x) = self.xattrs {
            self.src.reader_xattrs(r.inner(), x.sel, &mut attrs)?;
        }
        let mut w = self
            .dst
            .create_file(ddir, name, &self.out(meta))
            .map_err(|e| op_err(e, Some(End::Dst), "create"))?;
        let wrote = match sig {
            None => self
                .dst
                .write_from(ddir, &mut w, &mut r, meta.size, self.bwlimit)
                .map(|n| (n, None)),
            Some(sig) => self
                .delta_write(ddir, &mut w, name, sig, &mut r)
                .map(|d| (d.size, Some(d))),
        };
        let (n, delta) = match wrote {
            Ok(x) => x,
            Err(e) => {
                self.dst.abort(ddir, w);
                return Err(e);
            }
        };
        // Bytes no one counted on the way (a server-side copy).
        r.settle(n);
        let (exact, now) = self.source_after(r.inner(), meta, delta.as_ref());
        drop(r);
        let meta = exact.as_ref().unwrap_or(meta);
        match self.source_held(now, n, meta, rel) {
            Ok(None) => {}
            Ok(Some(now)) => {
                self.dst.abort(ddir, w);
                return Ok(Err(now));
            }
            Err(e) => {
                self.dst.abort(ddir, w);
                return Err(e);
            }
        }
        if let Some(x) = self.xattrs {
            let res = self
                .dst
                .set_writer_xattrs(ddir, &mut w, &self.out(meta), x.sel, &attrs);
            if let Err(e) = x.settle(res) {
                self.dst.abort(ddir, w);
                return Err(e);
            }
        }
        // What the file replaces is kept first (a hard link where the store
        // can: the name never goes missing); if it cannot be kept, nothing
        // is replaced.
        let mut kept = None;
        if let (Some(k), Some(old)) = (self.keep, old) {
            match k.keep(
                self.dst,
                ddir,
                name,
                rel,
                &Planned::new(old, self.mtime_step),
                true,
            ) {
                Ok(to) => kept = Some(to),
                Err(e) => {
                    self.dst.abort(ddir, w);
                    return Err(e);
                }
            }
        }
        // A file or symlink it replaces (kept as a hard link, or not kept)
        // has the name still, and must still be the one listed when the
        // commit replaces it; a name listed free (or a directory removed
        // before) must still be free: else nothing is replaced (a write
        // made there meanwhile is never lost).
        let planned = old
            .filter(|m| m.kind != Kind::Dir)
            .map(|m| Planned::new(m, self.mtime_step));
        self.dst.expect(&mut w, planned.as_ref());
        let committing = if nowait {
            let dst: &'a D = self.dst;
            Some(dst.commit_nowait(ddir, w, name, &self.out(meta), self.fsync))
        } else {
            self.dst
                .commit(ddir, w, name, &self.out(meta), self.fsync)
                .map_err(|e| op_err(e, Some(End::Dst), "rename"))?;
            None
        };
        self.count_copy(delta.as_ref(), sig, n);
        let c = Copied {
            bytes: n,
            meta: *meta,
            kept,
        };
        Ok(Ok((c, committing)))
    }

    /// What the source `r` says after it was read (`meta`: as listed):
    /// its exact metadata, where it was listed approximate, and its size
    /// and mtime now, where the store can tell.
    fn source_after(
        &self,
        r: &S::Reader,
        meta: &Meta,
        delta: Option<&DiffSummary>,
    ) -> (Option<Meta>, Option<(u64, i64, u32)>) {
        // A source listed with approximate metadata knows it exactly now.
        let exact = r.meta().map(|m| Meta {
            kind: meta.kind,
            uid: meta.uid,
            gid: meta.gid,
            ino: meta.ino,
            version: meta.version,
            ..m
        });
        let now = if self.src.features().approximate_meta {
            None
        } else {
            delta.and_then(|d| d.current).or_else(|| r.current())
        };
        (exact, now)
    }

    /// Whether the `n` bytes read of a source listed as `meta` are the
    /// file (`now`: its size and mtime after the read, where known):
    /// `Ok(None)` when they are, `Ok(Some(now))` when it changed (nothing
    /// is to be committed), an error when it changed and the store cannot
    /// tell how.
    fn source_held(
        &self,
        now: Option<(u64, i64, u32)>,
        n: u64,
        meta: &Meta,
        rel: &[u8],
    ) -> io::Result<Option<(u64, i64, u32)>> {
        // Mtimes are compared cut to the run's step (the engine's listings
        // are): the source's now too, or every file with a fraction of a
        // second would look changed and go twice.
        let step = self.mtime_step;
        let now = now.map(|(size, sec, nsec)| (size, sec, cut_nsec(nsec, step)));
        if let Some(now) = now {
            let listed = (n, meta.mtime_sec, cut_nsec(meta.mtime_nsec, step));
            // In a watch, a file that only grew while it was copied is
            // taken as appended to: the bytes read, with the listed mtime,
            // are committed (the watch appends the rest next; until a run
            // copies it unchanged, the whole old part is checked then).
            // (The copy reads one byte past the listed size to see growth,
            // and may take more: what it read is what it commits.)
            let grew = self.grow.is_some() && n >= meta.size && now.0 >= n && now.0 > meta.size;
            if (now != listed || n != meta.size) && !grew {
                return Ok(Some(now));
            }
            if let Some(g) = self.grow {
                g.torn(rel, grew);
            }
        } else if n != meta.size {
            return Err(io::Error::other(format!(
                "changed while being copied (size {} when listed, {}{} read)",
                meta.size,
                n,
                if n > meta.size { "+" } else { "" }
            )));
        }
        Ok(None)
    }

    /// The delta figures of a file copied (`n` bytes written; `delta`:
    /// how, when it went by delta against `sig`).
    fn count_copy(&self, delta: Option<&DiffSummary>, sig: Option<&Signature>, n: u64) {
        match (delta, sig) {
            (Some(d), Some(sig)) => {
                self.count(|c| &c.files, 1);
                self.count(|c| &c.literal, d.literal);
                self.count(|c| &c.matched, d.matched);
                self.count(|c| &c.wire, sig.encoded_len() as u64 + d.ops);
            }
            _ => self.count(|c| &c.wire, n),
        }
    }

    /// The attributes of source entry `sname` of `sdir` and of destination
    /// entry `dname` of `ddir` (`None`: the directories themselves), when
    /// they differ: `(source's, destination's)`. `None` when they are
    /// equal or the run keeps none (then nothing is read).
    pub fn xattr_diff(
        &self,
        sdir: &S::Dir,
        sname: Option<&CStr>,
        ddir: &D::Dir,
        dname: Option<&CStr>,
        kind: Kind,
    ) -> io::Result<Option<(Xattrs, Xattrs)>> {
        let Some(x) = self.xattrs else {
            return Ok(None);
        };
        let (mut want, mut have) = (Xattrs::new(), Xattrs::new());
        self.src.get_xattrs(sdir, sname, kind, x.sel, &mut want)?;
        self.dst.get_xattrs(ddir, dname, kind, x.sel, &mut have)?;
        Ok((want != have).then_some((want, have)))
    }

    /// Give destination entry `dname` of `ddir` (the directory itself when
    /// `None`) the attributes `want` where it has `have` (`None`: just
    /// made), after its other metadata (`meta`). A destination that keeps
    /// no attributes at all is counted for the run's note, not an error.
    pub fn put_xattrs(
        &self,
        ddir: &D::Dir,
        dname: Option<&CStr>,
        meta: &Meta,
        want: &Xattrs,
        have: Option<&Xattrs>,
    ) -> io::Result<()> {
        let Some(x) = self.xattrs else {
            return Ok(());
        };
        x.settle(
            self.dst
                .set_xattrs(ddir, dname, &self.out(meta), x.sel, want, have),
        )
    }

    /// Give an entry this run just made at `dname` of `ddir` (a symlink, an
    /// empty file created under its name) the attributes of `sname` of
    /// `sdir`. One call on the source for an entry that has none.
    pub fn new_entry_xattrs(
        &self,
        sdir: &S::Dir,
        sname: &CStr,
        ddir: &D::Dir,
        dname: &CStr,
        meta: &Meta,
    ) -> io::Result<()> {
        let Some(x) = self.xattrs else {
            return Ok(());
        };
        let mut want = Xattrs::new();
        self.src
            .get_xattrs(sdir, Some(sname), meta.kind, x.sel, &mut want)?;
        self.put_xattrs(ddir, Some(dname), meta, &want, None)
    }

    /// True when `sname` of `sdir` and `dname` of `ddir` hold the same
    /// bytes (`size`: the size both have). Hashes a store keeps spare
    /// reading its side: two of one kind are compared, one is matched by
    /// hashing the other side's bytes. Then a store's own fingerprint of
    /// the file (an S3 multipart ETag) is matched against the other side's
    /// bytes; else both sides are read and compared.
    pub fn same_content(
        &self,
        sdir: &S::Dir,
        sname: &CStr,
        ddir: &D::Dir,
        dname: &CStr,
        size: u64,
    ) -> io::Result<bool> {
        let (sk, dk) = (self.src.hash_kinds(), self.dst.hash_kinds());
        let common = sk.intersection(dk).first();
        let sh = match common.or(sk.first()) {
            Some(k) => self.src.hash(sdir, sname, k)?,
            None => None,
        };
        let dh = match common.or(dk.first()) {
            Some(k) => self.dst.hash(ddir, dname, k)?,
            None => None,
        };
        let open_src = || self.src.open_file(sdir, sname);
        let open_dst = || self.dst.open_file(ddir, dname);
        match (sh, dh) {
            (Some(a), Some(b)) if a.kind() == b.kind() => return Ok(a == b),
            (_, Some(h)) => return hashed_equal(&mut open_src()?, h, size),
            (Some(h), None) => return hashed_equal(&mut open_dst()?, h, size),
            (None, None) => {}
        }
        let mut boxed_src = || Ok(Box::new(open_src()?) as Box<dyn SourceFile>);
        if let Some(same) = self.dst.matches_bytes(ddir, dname, size, &mut boxed_src)? {
            return Ok(same);
        }
        let mut boxed_dst = || Ok(Box::new(open_dst()?) as Box<dyn SourceFile>);
        if let Some(same) = self.src.matches_bytes(sdir, sname, size, &mut boxed_dst)? {
            return Ok(same);
        }
        let mut a = self.src.open_file(sdir, sname)?;
        let mut b = self.dst.open_file(ddir, dname)?;
        same_bytes(&mut a, &mut b, size)
    }
}

/// True when `r` yields `size` bytes whose hash is `want`.
fn hashed_equal(r: &mut dyn SourceFile, want: Hash, size: u64) -> io::Result<bool> {
    let (got, n) = hash_bytes(r, want.kind())?;
    Ok(n == size && got == want)
}

/// True when two readers yield the same bytes (read side by side in blocks
/// of up to 256 KiB). `size`: the size they are expected to have, which
/// sizes the buffers (a small file costs no big allocation to clear).
pub fn same_bytes(a: &mut dyn SourceFile, b: &mut dyn SourceFile, size: u64) -> io::Result<bool> {
    let len = usize::try_from(size.saturating_add(1)).map_or(COMPARE_BUF, |n| n.min(COMPARE_BUF));
    let mut ba = vec![0u8; len];
    let mut bb = vec![0u8; len];
    loop {
        let n = read_full(a, &mut ba)?;
        let m = read_full(b, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        // A short block is the end of both (no read after the end).
        if n < len {
            return Ok(true);
        }
    }
}

/// Fill `buf`; fewer bytes only at the end of the file.
fn read_full(r: &mut dyn SourceFile, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let k = r.read(&mut buf[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(n)
}

mod by_delta;
#[cfg(test)]
mod tests;
