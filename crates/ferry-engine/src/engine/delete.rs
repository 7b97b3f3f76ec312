//! Delete: removals in the destination, within `--max-delete`, held while SRC changes, kept first where the run keeps what it replaces.

use super::*;

impl<'a, S: Store, D: Store> Engine<'a, S, D> {
    /// The removals a run may make, given what its counting pass counted
    /// (`full`: over the whole tree); a refusal when it counted more. In a
    /// watch, the removals of the window's earlier runs are taken from
    /// the limit first, and `P%` is of the entries the last full run saw.
    pub(super) fn allowance(
        &self,
        limit: MaxDelete,
        counted: &Stats,
        full: bool,
    ) -> io::Result<u64> {
        let Some(g) = self.guard else {
            return self.check_limit(limit, counted);
        };
        if full {
            g.set_dst_total(counted.dst_entries.load(Ordering::Relaxed));
        }
        let would = counted.files_deleted.load(Ordering::Relaxed);
        let total = match g.dst_total() {
            0 => counted.dst_entries.load(Ordering::Relaxed),
            n => n,
        };
        let before = g.removed(1, Instant::now());
        let allowed = limit.allowed(total).saturating_sub(before);
        if would > allowed {
            let of = match limit {
                MaxDelete::Percent(_) => format!(" of {total} entries"),
                MaxDelete::Count(_) => String::new(),
            };
            let less = match before {
                0 => String::new(),
                n => format!(
                    ", less the {n} removed by this watch's runs of the last {} minutes",
                    g.window().as_secs() / 60
                ),
            };
            return Err(refused(format!(
                "refusing to delete {would} entries in DST (--max-delete {limit}{of}{less}); nothing was changed"
            )));
        }
        Ok(allowed)
    }

    /// Count what a run removed into the watch's window.
    pub(super) fn count_removed(&self, before: u64) {
        if let Some(g) = self.guard {
            g.add_removed(
                1,
                self.stats
                    .files_deleted
                    .load(Ordering::Relaxed)
                    .saturating_sub(before),
            );
        }
    }

    /// Removals allowed by `limit` given what a (dry) walk counted; a
    /// refusal when it counted more.
    pub(super) fn check_limit(&self, limit: MaxDelete, stats: &Stats) -> io::Result<u64> {
        let would = stats.files_deleted.load(Ordering::Relaxed);
        let total = stats.dst_entries.load(Ordering::Relaxed);
        let allowed = limit.allowed(total);
        if would > allowed {
            let what = match limit {
                MaxDelete::Percent(_) => format!(
                    "{would} of {total} entries in DST (--max-delete {limit} allows {allowed})"
                ),
                MaxDelete::Count(_) => format!("{would} entries in DST (--max-delete {limit})"),
            };
            return Err(refused(format!(
                "refusing to delete {what}; nothing was changed"
            )));
        }
        Ok(allowed)
    }

    /// True when nothing in directory `rel` may be deleted: it, or a
    /// directory above it, listed entries no path can name (`unnamed`: this
    /// one did; it is noted for the directories below).
    pub(super) fn held(&self, rel: &[u8], unnamed: bool) -> bool {
        let mut h = self.held.lock();
        if unnamed {
            h.push(rel.to_vec());
            return true;
        }
        h.iter().any(|d| {
            d.is_empty() || rel == &d[..] || (rel.starts_with(d) && rel.get(d.len()) == Some(&b'/'))
        })
    }

    /// Take `n` removals from the `--max-delete` allowance; an error (and
    /// nothing taken) when fewer are left.
    pub(super) fn take_removals(&self, n: u64) -> io::Result<()> {
        self.budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(n))
            .map(|_| ())
            .map_err(|_| io::Error::other("not removed: the --max-delete limit is reached"))
    }

    /// Keep the destination entry `name` of `dir` (at `path`, listed as
    /// `meta`) before the run replaces it (`replacing`) or removes it, when
    /// the run keeps what it replaces (`Options::keep`; a directory is
    /// never kept whole, its entries are). In a dry run (`dir` may then be
    /// `None`) it is only said. `Ok(true)`: kept (and, unless `replacing`,
    /// gone from `dir`); `Ok(false)`: nothing to keep. An error: nothing
    /// was kept, the entry must be left as it is.
    pub(super) fn keep_old(
        &self,
        dir: Option<&D::Dir>,
        name: &CStr,
        path: &[u8],
        meta: &Meta,
        replacing: bool,
    ) -> io::Result<bool> {
        let Some(k) = self.opts.keep.as_deref() else {
            return Ok(false);
        };
        if meta.kind == Kind::Dir {
            return Ok(false);
        }
        let to = match dir {
            Some(d) if !self.dry_run => k.keep(
                self.dst,
                d,
                name,
                path,
                &crate::store::Planned::new(meta, self.mtime_step),
                replacing,
            )?,
            Some(d) => k.place_in(self.dst, d, path),
            _ => {
                let (base, at) = k.target(path, 1);
                keep::shown(&base, &at)
            }
        };
        self.kept(path, &to, meta.size);
        Ok(true)
    }

    /// Count and report an entry kept at `to`.
    pub(super) fn kept(&self, path: &[u8], to: &[u8], size: u64) {
        Stats::add(&self.stats.files_kept, 1);
        Stats::add(&self.stats.bytes_kept, size);
        self.rep.kept(path, to, size);
    }

    /// Remove the destination entry `name` of `dir` (not a directory),
    /// kept first when the run keeps what it removes.
    pub(super) fn remove_file(
        &self,
        dir: &D::Dir,
        name: &CStr,
        path: &[u8],
        meta: &Meta,
    ) -> io::Result<()> {
        if !self.keep_old(Some(dir), name, path, meta, false)? {
            // Only while it is still what was listed (else reported, left
            // for the next run).
            let at = crate::store::Planned::new(meta, self.mtime_step);
            self.dst.remove_planned(dir, name, &at)?;
        }
        Ok(())
    }

    /// Remove a destination entry; false when it failed (already reported).
    /// Each entry removed (every one of a directory tree) is one `Delete`
    /// action, with its size, and one in `files_deleted`: in a dry run too,
    /// so that its records, its summary and `--max-delete` see what the
    /// real run removes.
    pub(super) fn delete(&self, node: &Node<S, D>, name: &CStr, meta: &Meta) -> bool {
        let path = self.path(node, name.to_bytes());
        let is_dir = meta.kind == Kind::Dir;
        let size = if is_dir { 0 } else { meta.size };
        let deleted = |rel: &[u8], size: u64| {
            Stats::add(&self.stats.files_deleted, 1);
            self.rep.action(Action::Delete, rel, size);
        };
        if self.dry_run {
            match (&node.dst, is_dir) {
                (Some(d), true) => match self.count_tree(d, &path, name, &deleted) {
                    Ok(n) => Stats::add(&self.stats.dst_entries, n - 1),
                    Err(e) => {
                        if Refused::of(&e).is_none() {
                            self.fail(&path, &e);
                        }
                        return false;
                    }
                },
                _ => {
                    let _ = self.keep_old(None, name, &path, meta, false);
                    deleted(&path, size)
                }
            }
            return true;
        }
        let Some(d) = &node.dst else { return true };
        if !self.src_root_alive() {
            return false;
        }
        let limited = self.budget.load(Ordering::Relaxed) != u64::MAX;
        let res = if !is_dir {
            self.take_removals(u64::from(limited))
                .and_then(|()| self.remove_file(d, name, &path, meta))
                .map(|()| deleted(&path, size))
        } else if self.opts.filter.is_some() || limited || self.opts.keep.is_some() {
            // Entry by entry: what the filter excludes stays, each removal
            // takes its share of the allowance, each entry is kept first.
            self.delete_each(d, &path, name, &deleted)
        } else if !self.rep.shows_actions() {
            // Nobody sees the entries: counted, not stat'ed one by one.
            self.dst.remove(d, name, true).map(|n| {
                Stats::add(&self.stats.files_deleted, n);
            })
        } else {
            let mut full = path.clone();
            self.dst
                .remove_each(d, name, &mut |sub, size| {
                    full.truncate(path.len());
                    if !sub.is_empty() {
                        full.push(b'/');
                        full.extend_from_slice(sub);
                    }
                    deleted(&full, size);
                })
                .map(|_| ())
        };
        // Whatever was removed before a failure is gone: the directory
        // changed either way.
        node.dirty.store(true, Ordering::Relaxed);
        match res {
            Ok(()) => true,
            // A root met again below: the run is refused (said once).
            Err(e) if Refused::of(&e).is_some() => false,
            Err(e) => {
                self.fail(&path, &e);
                false
            }
        }
    }

    /// Open destination directory `name` (at `rel`) and list it: the open
    /// directory, its listing and the entries that could not be read.
    pub(super) fn list_dst_dir(
        &self,
        parent: &D::Dir,
        rel: &[u8],
        name: &CStr,
    ) -> io::Result<(D::Dir, Listing, Vec<ListError>)> {
        let dir = self.dst.open_dir(parent, name)?;
        let mut list = Listing::new();
        let mut errs = Vec::new();
        self.dst.list(&dir, rel, &mut list, &mut errs)?;
        // What the run never touches is never deleted.
        list.retain_names(|n| !keep::is_versions_dir(n));
        self.drop_untouched(rel, &mut list, true);
        // What the filter leaves out is never deleted.
        if let Some(f) = &self.opts.filter {
            f.apply(self.dst, &dir, rel, &mut list, &mut errs, |_, _| ())?;
        }
        if self.aliased("DST", rel, &list) {
            return Err(refused("run refused".to_string()));
        }
        Ok((dir, list, errs))
    }

    /// What a removal of the destination directory `name` would remove,
    /// the directory included (what the filter excludes is kept), each
    /// entry told to `deleted` (path, size), the directory last; returns
    /// how many.
    pub(super) fn count_tree(
        &self,
        parent: &D::Dir,
        rel: &[u8],
        name: &CStr,
        deleted: &dyn Fn(&[u8], u64),
    ) -> io::Result<u64> {
        let (dir, list, errs) = self.list_dst_dir(parent, rel, name)?;
        let mut n = 1 + errs.len() as u64;
        for e in list.entries() {
            let path = join(rel, list.name(e));
            n += if e.meta.kind == Kind::Dir {
                self.count_tree(&dir, &path, list.cname(e), deleted)?
            } else {
                let _ = self.keep_old(None, list.cname(e), &path, &e.meta, false);
                deleted(&path, e.meta.size);
                1
            };
        }
        deleted(rel, 0);
        Ok(n)
    }

    /// Remove a destination-only directory entry by entry, telling
    /// `deleted` of each (path, size): what the filter excludes is kept
    /// (excluded entries are never deleted; the directory itself stays if
    /// any remain inside), and under `--max-delete` each removal takes its
    /// share of the allowance first.
    pub(super) fn delete_each(
        &self,
        parent: &D::Dir,
        rel: &[u8],
        name: &CStr,
        deleted: &dyn Fn(&[u8], u64),
    ) -> io::Result<()> {
        let (dir, list, errs) = self.list_dst_dir(parent, rel, name)?;
        if let Some(e) = errs.into_iter().next() {
            return Err(e.err);
        }
        let mut unlocked = false;
        for e in list.entries() {
            let child = list.cname(e);
            let path = join(rel, child.to_bytes());
            if e.meta.kind == Kind::Dir {
                self.delete_each(&dir, &path, child, deleted)?;
                continue;
            }
            self.take_removals(1)?;
            loop {
                match self.remove_file(&dir, child, &path, &e.meta) {
                    Ok(()) => deleted(&path, e.meta.size),
                    // A read-only directory (non-root): made writable once.
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied && !unlocked => {
                        unlocked = true;
                        if self.dst.make_writable(&dir)? {
                            continue;
                        }
                        return Err(e);
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                break;
            }
        }
        drop(dir);
        self.take_removals(1)?;
        match self.dst.rmdir(parent, name) {
            Ok(()) => {
                deleted(rel, 0);
                Ok(())
            }
            // Excluded (or protected, or never synced) entries remain,
            // and so does the directory.
            Err(e)
                if (self.opts.filter.is_some() || self.opts.keep.is_some())
                    && e.kind() == io::ErrorKind::DirectoryNotEmpty =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}
