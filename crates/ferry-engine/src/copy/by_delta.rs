//! A copy by delta: the signature of the destination's old copy, the
//! ops against it, a patch in place, a growing file's tail appended.

use super::*;

impl<'a, S: Store, D: Store> Copier<'a, S, D> {
    /// Add `n` to one of the run's delta figures (when it keeps them).
    /// A delta that failed because of `e`: counted as sent whole after a
    /// failed delta, unless the connection is gone (the file then fails
    /// with it: nothing is sent whole).
    pub(super) fn failed_delta(&self, e: &io::Error) {
        if !crate::store::is_lost(e) {
            self.count(|c| &c.fallbacks, 1);
        }
    }

    pub(super) fn count(&self, which: impl Fn(&delta::Counts) -> &AtomicU64, n: u64) {
        if let Some(d) = self.delta {
            which(d.counts).fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether a changed file (`!fresh`) of `meta` goes by delta: at least
    /// [`delta::MIN_SIZE`] bytes, both stores taking part, at least one at
    /// the far end of a network link unless `--delta`. A source with holes
    /// goes whole (its copy keeps them; a rebuild would write them out).
    pub(super) fn by_delta(&self, meta: &Meta, fresh: bool) -> bool {
        let Some(d) = self.delta else {
            return false;
        };
        let (s, t) = (self.src.delta_role(), self.dst.delta_role());
        !(fresh
            || meta.sparse
            || meta.size < delta::MIN_SIZE
            || s == DeltaRole::None
            || t == DeltaRole::None
            || !(d.local || s == DeltaRole::Remote || t == DeltaRole::Remote))
    }

    /// A watch's growing file: when the destination's copy (`old`) is
    /// shorter than the source and its last [`VERIFY_TAIL`] bytes are the
    /// source's at the same place (all of its bytes, when an earlier copy
    /// was made while the file changed: [`crate::Guard::torn`]), only the
    /// source's bytes past it are appended, in place. The copy gets the
    /// listed mtime. `None`: not appended (the normal way then).
    pub(super) fn append_tail(
        &self,
        g: &crate::Guard,
        f: FileCopy<'_, '_, S, D>,
    ) -> io::Result<Option<Copied>> {
        let FileCopy {
            sdir,
            sname,
            ddir,
            name,
            rel,
            meta,
            old,
        } = f;
        let Some(old) = old else {
            return Ok(None);
        };
        if old.kind != Kind::File
            || old.size == 0
            || old.size >= meta.size
            || meta.sparse
            || self.keep.is_some()
            || self.xattrs.is_some()
            || self.src.features().approximate_meta
        {
            return Ok(None);
        }
        let Some(mut a) = self.dst.open_append(ddir, name, old)? else {
            return Ok(None);
        };
        let mut r = self
            .src
            .open_file(sdir, sname)
            .map_err(|e| op_err(e, Some(End::Src), "open"))?;
        let torn = g.is_torn(rel);
        let from = old.size.saturating_sub(VERIFY_TAIL);
        match self.same_range(&mut r, &mut *a, from, old.size) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            // A source read only as a stream (a remote `ferry serve`'s
            // file): copied the normal way.
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut buf = vec![0u8; 1 << 20];
        let mut at = old.size;
        while at < meta.size {
            let want = ((meta.size - at) as usize).min(buf.len());
            let n = self.src.read_at(&mut r, at, &mut buf[..want])?;
            if n == 0 {
                // Shorter now: copied whole (what was appended goes with
                // the old copy it replaces).
                return Ok(None);
            }
            if let Some(b) = self.bwlimit {
                b.acquire(n as u64);
            }
            a.append(&buf[..n])
                .map_err(|e| op_err(e, Some(End::Dst), "write"))?;
            self.moved
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            at += n as u64;
        }
        let step = self.mtime_step;
        let listed = (meta.size, meta.mtime_sec, cut_nsec(meta.mtime_nsec, step));
        let cut = |c: Option<(u64, i64, u32)>| c.map(|(z, s, ns)| (z, s, cut_nsec(ns, step)));
        let mut unchanged = cut(r.current()).is_none_or(|n| n == listed);
        // An old part copied while the file changed is checked whole once
        // the file holds still (the source unchanged across the check).
        if unchanged && torn {
            if !self.same_range(&mut r, &mut *a, 0, from)? {
                return Ok(None);
            }
            unchanged = cut(r.current()).is_none_or(|n| n == listed);
        }
        a.finish(&self.out(meta), self.fsync)
            .map_err(|e| op_err(e, Some(End::Dst), "utimes"))?;
        g.torn(rel, !unchanged);
        self.count(|c| &c.wire, meta.size - old.size);
        Ok(Some(Copied {
            bytes: meta.size - old.size,
            meta: *meta,
            kept: None,
        }))
    }

    /// Whether bytes `from..to` of the source `r` and of the destination
    /// file `a` are the same.
    pub(super) fn same_range(
        &self,
        r: &mut S::Reader,
        a: &mut dyn crate::store::AppendFile,
        from: u64,
        to: u64,
    ) -> io::Result<bool> {
        let mut x = vec![0u8; 256 << 10];
        let mut y = vec![0u8; 256 << 10];
        let mut at = from;
        while at < to {
            let want = ((to - at) as usize).min(x.len());
            let n = self.src.read_at(r, at, &mut x[..want])?;
            let m = a.read_at(at, &mut y[..want])?;
            if n != want || m != want || x[..n] != y[..m] {
                return Ok(false);
            }
            at += want as u64;
        }
        Ok(true)
    }

    /// The patch-in-place fast path ([`delta::inplace`]): a file going by
    /// delta whose destination (`old`, at least [`append_min`] bytes) is
    /// no longer than the source is patched where it is when few of its
    /// blocks differ (scattered edits, a grown tail). Not with
    /// `--backup-dir`/`--versions` (the kept copy is a hard link to the
    /// same file) nor `-X`/`-A`.
    pub(super) fn append(
        &self,
        sdir: &S::Dir,
        sname: &CStr,
        ddir: &D::Dir,
        name: &CStr,
        meta: &Meta,
        old: Option<&Meta>,
    ) -> Appended {
        let Some(old) = old else {
            return Appended::No;
        };
        if old.kind != Kind::File
            || old.size < append_min()
            || old.size > meta.size
            || self.keep.is_some()
            || self.xattrs.is_some()
            || !self.by_delta(meta, false)
        {
            return Appended::No;
        }
        let l = delta::Layout::new(old.size, meta.size);
        let key = delta::new_key();
        let ip = match self.dst.delta_inplace(ddir, name, old, &l, &key) {
            Ok(Some(a)) => a,
            Ok(None) => return Appended::No,
            Err(e) => {
                self.failed_delta(&e);
                return Appended::No;
            }
        };
        match self.patch_with(ip, sdir, sname, meta, &l, &key) {
            Ok(a) => a,
            Err(e) => {
                self.failed_delta(&e);
                Appended::No
            }
        }
    }

    /// [`Copier::append`] once the destination hashes its old copy.
    pub(super) fn patch_with(
        &self,
        mut ip: Box<dyn delta::InPlace + '_>,
        sdir: &S::Dir,
        sname: &CStr,
        meta: &Meta,
        l: &delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<Appended> {
        let mut r = Tracked::new(self.src.open_file(sdir, sname)?, self.moved);
        let h = self.src.inplace_hashes(&mut r, l, key)?;
        let Some(theirs) = ip.blocks()? else {
            return Ok(Appended::No);
        };
        let Some(changed) = delta::inplace::differing(&h.list, &theirs) else {
            return Ok(Appended::No);
        };
        if delta::inplace::too_many(l, changed.len()) {
            return Ok(Appended::No);
        }
        let new: Vec<u64> = changed.iter().map(|&i| h.list[i as usize]).collect();
        if !ip.begin(&changed, &new)? {
            // Nothing changed there: the normal delta.
            return Ok(Appended::No);
        }
        let block = l.block as usize;
        let mut buf = vec![0u8; (1usize << 20).max(block)];
        let mut literal = 0u64;
        // The changed blocks, runs of neighbours read and written at once.
        let mut i = 0;
        while i < changed.len() {
            let mut j = i + 1;
            while j < changed.len()
                && changed[j] == changed[j - 1] + 1
                && (j - i + 1) * block <= buf.len()
            {
                j += 1;
            }
            let (at, _) = l.span(changed[i] as usize);
            let (last, n) = l.span(changed[j - 1] as usize);
            let len = (last + n as u64 - at) as usize;
            if self.src.read_at(&mut r, at, &mut buf[..len])? != len {
                ip.abort();
                return Ok(Appended::No);
            }
            if let Some(b) = self.bwlimit {
                b.acquire(len as u64);
            }
            ip.write(at, &buf[..len])?;
            literal += len as u64;
            i = j;
        }
        // The tail.
        let mut at = l.old;
        while at < l.new {
            let want = ((l.new - at) as usize).min(buf.len());
            let n = self.src.read_at(&mut r, at, &mut buf[..want])?;
            if n != want {
                ip.abort();
                return Ok(Appended::No);
            }
            if let Some(b) = self.bwlimit {
                b.acquire(n as u64);
            }
            ip.write(at, &buf[..n])?;
            at += n as u64;
            literal += n as u64;
        }
        let step = self.mtime_step;
        let now = r
            .inner()
            .current()
            .map(|(size, sec, nsec)| (size, sec, cut_nsec(nsec, step)));
        let listed = (meta.size, meta.mtime_sec, cut_nsec(meta.mtime_nsec, step));
        if now.is_some_and(|n| n != listed) {
            // It changed while read: rolled back, and the normal way
            // copes with the change.
            ip.abort();
            return Ok(Appended::No);
        }
        if let Err(e) = ip.commit(&h.root, &self.out(meta), self.fsync) {
            if crate::store::is_lost(&e) {
                return Err(e);
            }
            // Rolled back: the file goes whole.
            self.count(|c| &c.fallbacks, 1);
            return Ok(Appended::Whole);
        }
        r.settle(meta.size);
        self.count(|c| &c.files, 1);
        self.count(|c| &c.literal, literal);
        self.count(|c| &c.matched, meta.size - literal);
        // The literal bytes, the block list and the changed blocks'
        // numbers that crossed, the key and the root.
        let list =
            delta::inplace::SHORT as u64 * h.list.len() as u64 + 4 * changed.len() as u64 + 2 * 32;
        self.count(|c| &c.wire, literal + list);
        Ok(Appended::Done(Copied {
            bytes: meta.size,
            meta: *meta,
            kept: None,
        }))
    }

    /// The signature of the destination's old copy of `name`, when this
    /// file goes by delta ([`Copier::by_delta`]).
    pub(super) fn signature(
        &self,
        ddir: &D::Dir,
        name: &CStr,
        meta: &Meta,
        fresh: bool,
    ) -> Option<Signature> {
        if !self.by_delta(meta, fresh) {
            return None;
        }
        match self.dst.delta_signature(ddir, name, delta::MIN_SIZE) {
            Ok(sig) => sig,
            Err(e) => {
                self.failed_delta(&e);
                None
            }
        }
    }

    /// Write the new content into `w` as the destination's old copy of
    /// `name` (described by `sig`) rebuilt with the ops of `r` against it.
    pub(super) fn delta_write(
        &self,
        ddir: &D::Dir,
        w: &mut D::Writer,
        name: &CStr,
        sig: &Signature,
        r: &mut Tracked<'_, S::Reader>,
    ) -> io::Result<DiffSummary> {
        self.dst.delta_write(ddir, w, name, sig, &mut |sink| {
            let mut t = Tally {
                sink,
                sig,
                limit: self.bwlimit,
                sum: DiffSummary::default(),
            };
            let got = self.src.delta_diff(r, sig, &mut t)?;
            Ok(DiffSummary {
                current: got.current,
                ..t.sum
            })
        })
    }
}
