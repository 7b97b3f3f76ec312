//! Scan: the two listings of a directory, made ready to plan (filters, exact metadata where listings are approximate, names left out, leftovers of killed runs).

use super::*;

impl<'a, S: Store, D: Store> Engine<'a, S, D> {
    /// Both listings of `node`'s directory (the source's with its
    /// per-entry errors, the destination's: empty where it has none); `None`
    /// when one could not be listed (said, and the directory done).
    pub(super) fn list_both(&self, node: &Arc<Node<S, D>>) -> Option<Lists> {
        let mut src_list = Listing::new();
        let mut errors: Vec<ListError> = Vec::new();
        // The filter decides on both listings together (`filter_pair`).
        // A listing made ahead of the run is the same listing, made earlier.
        // Taken for the directory as it is now: the root's metadata is the
        // run's own, a subdirectory is stated in its parent first.
        let name = || CString::new(node.rel.rsplit(|&b| b == b'/').next().unwrap_or(b"")).ok();
        let pre = |side: usize, now: Option<Meta>| {
            let p = self.prefetch[side].filter(|p| p.has(&node.rel))?;
            p.take(&node.rel, &now?)
        };
        let src_now = || match &node.parent {
            None => Some(node.src_meta),
            Some(up) => self.src.stat(&up.src, &name()?).ok().flatten(),
        };
        let dst_now = || match (&node.parent, &node.dst_meta) {
            (None, m) => *m,
            (Some(up), _) => self.dst.stat(up.dst.as_ref()?, &name()?).ok().flatten(),
        };
        if let Some((l, errs)) = self.prefetch[0].and_then(|_| pre(0, src_now())) {
            (src_list, errors) = (l, errs);
        } else if let Err(e) = walk::list(
            self.src,
            &node.src,
            &node.rel,
            None,
            &mut src_list,
            &mut |_, e| errors.push(e),
        ) {
            // Without a complete source listing nothing may be deleted here.
            self.fail(&node.rel, &e);
            self.done(node);
            return None;
        }
        let mut dst_list = Listing::new();
        let mut derr = Vec::new();
        if let (Some(d), Some(_)) = (&node.dst, &node.dst_meta) {
            if let Some((l, errs)) = self.prefetch[1].and_then(|_| pre(1, dst_now())) {
                (dst_list, derr) = (l, errs);
            } else if let Err(e) =
                walk::list(self.dst, d, &node.rel, None, &mut dst_list, &mut |_, e| {
                    derr.push(e)
                })
            {
                self.fail(&node.rel, &e);
                self.done(node);
                return None;
            }
        }
        Some(Lists {
            src: src_list,
            errors,
            dst: dst_list,
            derr,
        })
    }

    /// Leave out of the listing of directory `rel` (of the source, or of
    /// the destination: `dst`) what the run never touches: the backup
    /// directory inside the destination, and in the destination the names
    /// `--suffix` protects (`.ferry-versions` is left out by the plan).
    pub(super) fn drop_untouched(&self, rel: &[u8], list: &mut Listing, dst: bool) {
        if let Some((dir, name)) = &self.backup_in {
            if dir == rel {
                list.retain_names(|n| n != name.as_slice());
            }
        }
        if let (true, Some(k)) = (dst, self.opts.keep.as_deref()) {
            if list.entries().iter().any(|e| k.protects(list.name(e))) {
                list.retain_names(|n| !k.protects(n));
            }
        }
    }

    /// With `--suffix` alone, the source's names that end in the suffix
    /// are synced like any other: no keep may take them ([`Keeper::reserve`]).
    pub(super) fn reserve_source_names(&self, node: &Node<S, D>, src_list: &Listing) {
        if let Some(k) = self.opts.keep.as_deref() {
            for e in src_list.entries() {
                let name = src_list.name(e);
                if k.protects(name) {
                    k.reserve(&self.path(node, name));
                }
            }
        }
    }

    /// Say once that SRC's `path`, named like `what`, is left out (`which`:
    /// 0 for `.ferry-versions`, 1 for the backup directory).
    pub(super) fn left_out(&self, which: usize, path: &[u8], what: &str) {
        if !self.left_out_noted[which].swap(true, Ordering::Relaxed) {
            self.rep.note(&format!(
                "SRC {}: left out of the run ({what} has this name: ferry never copies or deletes it)",
                String::from_utf8_lossy(path)
            ));
        }
    }

    /// True for a path below the root that the run never touches:
    /// `.ferry-versions` or the backup directory inside the destination,
    /// or anything below them.
    pub(super) fn untouched_path(&self, rel: &[u8]) -> bool {
        let mut at: Vec<u8> = Vec::new();
        for c in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            if keep::is_versions_dir(c) {
                return true;
            }
            if let Some((dir, name)) = &self.backup_in {
                if *dir == at && c == name.as_slice() {
                    return true;
                }
            }
            at = join(&at, c);
        }
        false
    }

    /// The refusal of listing `list` of directory `rel` on `side` when a
    /// subdirectory in it is a root, or above one, seen again.
    pub(super) fn aliased(&self, side: &str, rel: &[u8], list: &Listing) -> bool {
        match self.aliases.as_ref().and_then(|a| a.check(side, rel, list)) {
            Some(msg) => {
                self.refuse(msg);
                true
            }
            None => false,
        }
    }

    /// `sync` of an empty source root (an unmounted mount point looks like
    /// this) into a destination that has entries would delete them all:
    /// refused unless `--force`. True when refused (nothing was changed).
    pub(super) fn empty_src_refused(&self, src: &Listing, dst: &Listing) -> bool {
        let live = |l: &Listing| {
            l.entries()
                .iter()
                .filter(|e| !is_temp_name(l.name(e)))
                .count()
        };
        if self.opts.mode != Mode::Sync || self.opts.force || live(src) > 0 {
            return false;
        }
        let n = live(dst);
        if n == 0 {
            return false;
        }
        let (entries, them) = if n == 1 {
            ("entry", "it")
        } else {
            ("entries", "them")
        };
        *self.refusal.lock() = Some(format!(
            "SRC is empty and DST has {n} {entries} at its top level: refusing to delete {them} (if SRC is an unmounted mount point, mount it; --force deletes {them})"
        ));
        true
    }

    /// Partial downloads older versions named `.ferry-tmp.part.<16 hex>`:
    /// ferry's own when they carry its resume record, then removed (and
    /// left out of the listing); any other entry of such a name is a user's.
    pub(super) fn drop_legacy_partials(&self, node: &Node<S, D>, d: &D::Dir, list: &mut Listing) {
        let mut own: Vec<Vec<u8>> = Vec::new();
        for e in list.entries() {
            if is_legacy_partial_name(list.name(e)) && e.meta.kind == Kind::File {
                let c = list.cname(e);
                if self.dst.is_own_legacy_partial(d, c) {
                    self.remove_temp(node, c, Kind::File);
                    own.push(c.to_bytes().to_vec());
                }
            }
        }
        if !own.is_empty() {
            list.retain_names(|n| !own.iter().any(|o| o == n));
        }
    }

    /// Remove a stale temporary of ferry's (counted in the summary).
    pub(super) fn remove_temp(&self, node: &Node<S, D>, name: &CStr, kind: Kind) {
        if self.dry_run {
            Stats::add(&self.stats.temps_removed, 1);
            return;
        }
        let Some(d) = &node.dst else { return };
        match self.dst.remove(d, name, kind == Kind::Dir) {
            Ok(_) => Stats::add(&self.stats.temps_removed, 1),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => self.fail(&self.path(node, name.to_bytes()), &e),
        }
    }

    /// An existing destination directory that is read-only (a copy of a
    /// read-only source directory, as a non-root user) is made writable
    /// when its plan changes entries in it; its mode is set back when the
    /// directory completes (`done`). A run killed in between leaves it
    /// writable, and the next run restores it.
    pub(super) fn unlock_if_needed(&self, node: &Node<S, D>, steps: &[Step]) {
        let (Some(d), Some(m)) = (&node.dst, &node.dst_meta) else {
            return;
        };
        if self.dry_run || m.mode & 0o200 != 0 {
            return;
        }
        let changes = steps.iter().any(|s| {
            !matches!(
                s,
                Step::Same { .. } | Step::Recurse { .. } | Step::Skip { .. }
            )
        });
        if !changes {
            return;
        }
        match self.dst.make_writable(d) {
            Ok(true) => node.unlocked.store(true, Ordering::Relaxed),
            Ok(false) => {}
            Err(e) => self.fail(&node.rel, &e),
        }
    }

    /// With a store that lists approximate metadata (S3 without a HEAD per
    /// object): make exact the files present on both sides with the same
    /// size, the only ones compared by mtime and mode. Files to create take
    /// theirs from the reader as they are copied; a size change needs no
    /// compare. An entry whose metadata cannot be read is left alone on
    /// both sides (reported).
    pub(super) fn refine(&self, node: &Node<S, D>, src: &mut Listing, dst: &mut Listing) {
        let (mut ws, mut wd) = (Vec::new(), Vec::new());
        same_names(src, dst, |i, j| {
            let (a, b) = (&src.entries()[i].meta, &dst.entries()[j].meta);
            if a.kind == Kind::File && b.kind == Kind::File && a.size == b.size {
                ws.push(i);
                wd.push(j);
            }
        });
        if ws.is_empty() {
            return;
        }
        let mut bad: Vec<Vec<u8>> = Vec::new();
        let mut errors = Vec::new();
        if self.src.features().approximate_meta {
            if let Err(e) = self.src.refine(&node.src, src, &ws, &mut errors) {
                self.fail(&node.rel, &e);
                bad.extend(ws.iter().map(|&i| src.name(&src.entries()[i]).to_vec()));
            }
        }
        if let (true, Some(d)) = (self.dst.features().approximate_meta, &node.dst) {
            if let Err(e) = self.dst.refine(d, dst, &wd, &mut errors) {
                self.fail(&node.rel, &e);
                bad.extend(wd.iter().map(|&j| dst.name(&dst.entries()[j]).to_vec()));
            }
        }
        for e in errors {
            self.fail(&self.path(node, &e.name), &e.err);
            bad.push(e.name);
        }
        if !bad.is_empty() {
            bad.sort();
            src.retain_names(|n| bad.binary_search_by(|b| b.as_slice().cmp(n)).is_err());
            dst.retain_names(|n| bad.binary_search_by(|b| b.as_slice().cmp(n)).is_err());
        }
    }

    /// Open (or create) the directory pair of a subdirectory task.
    pub(super) fn open_node(
        &self,
        parent: &Arc<Node<S, D>>,
        name: &CStr,
        src_meta: Meta,
        at: DstAt,
    ) -> Option<Arc<Node<S, D>>> {
        let rel = self.path(parent, name.to_bytes());
        // Both sides are listed next (`scan`): a network store asks for the
        // listing with the open, one round trip for both.
        let src = match self.src.open_dir_to_list(&parent.src, name) {
            Ok(d) => d,
            Err(e) => {
                self.fail(&rel, &e);
                return None;
            }
        };
        let (dst, dst_meta) = match (at, &parent.dst) {
            (DstAt::Dir(m), Some(pd)) => match self.dst.open_dir_to_list(pd, name) {
                Ok(d) => (Some(d), Some(m)),
                Err(e) => {
                    self.fail(&rel, &e);
                    return None;
                }
            },
            // Dry run: report the directory that would be made (replacing
            // whatever is there); everything below it is new.
            (_, None) | (_, Some(_)) if self.dry_run => {
                if let DstAt::Other(m) = at {
                    let _ = self.keep_old(None, name, &rel, &m, false);
                    self.rep.action(Action::Delete, &rel, m.size);
                    Stats::add(&self.stats.files_deleted, 1);
                }
                if self.dst.features().empty_dirs {
                    self.rep.action(Action::Mkdir, &rel, 0);
                    Stats::add(&self.stats.dirs_created, 1);
                }
                (None, None)
            }
            (_, None) => (None, None),
            (at, Some(pd)) => {
                if let DstAt::Other(m) = at {
                    if let Err(e) = self
                        .take_removals(1)
                        .and_then(|()| self.remove_file(pd, name, &rel, &m))
                    {
                        self.fail(&rel, &e);
                        return None;
                    }
                    Stats::add(&self.stats.files_deleted, 1);
                    self.rep.action(Action::Delete, &rel, m.size);
                }
                match self.dst.make_dir(pd, name) {
                    Ok(d) => {
                        parent.dirty.store(true, Ordering::Relaxed);
                        // An object store makes nothing: the prefix exists
                        // once an object is under it.
                        if self.dst.features().empty_dirs {
                            Stats::add(&self.stats.dirs_created, 1);
                            self.rep.action(Action::Mkdir, &rel, 0);
                        }
                        (Some(d), None)
                    }
                    Err(e) => {
                        self.fail(&rel, &e);
                        return None;
                    }
                }
            }
        };
        Some(Arc::new(Node {
            rel,
            src,
            dst,
            src_meta,
            dst_meta,
            pending: AtomicUsize::new(1),
            dirty: AtomicBool::new(false),
            unlocked: AtomicBool::new(false),
            parent: Some(parent.clone()),
            lanes: Mutex::new((0, VecDeque::new())),
        }))
    }

    /// Leave out of both listings of a directory what the filter does
    /// ([`Filter::retain_pair`]); a file whose metadata could not be made
    /// exact is left alone on both sides (reported in its side's errors).
    pub(super) fn filter_pair(
        &self,
        f: &Filter,
        node: &Node<S, D>,
        src: &mut Listing,
        serr: &mut Vec<ListError>,
        dst: &mut Listing,
        derr: &mut Vec<ListError>,
    ) -> io::Result<()> {
        let bad_src = f.prepare(self.src, &node.src, &node.rel, src, serr)?;
        let bad_dst = match &node.dst {
            Some(d) => f.prepare(self.dst, d, &node.rel, dst, derr)?,
            None => Vec::new(),
        };
        drop_names(dst, &bad_src);
        drop_names(src, &bad_dst);
        f.retain_pair(&node.rel, src, dst);
        Ok(())
    }
}
