//! The executor's actions ([`Exec::execute`]), in the order the module
//! documentation of [`super`] gives: conflicts, directories, renames,
//! copies and metadata, deletions, files replacing directories.

use super::*;

impl<A: Store, B: Store> Exec<'_, A, B> {
    /// Carry the plan out (see the module doc for the order).
    pub(super) fn execute(&self, plan: &Plan) {
        let items = &plan.items;
        // Journal-only records first: they cost nothing.
        for it in items {
            match it.act {
                Act::Record => self.record(Update::Put(it.key.clone(), record_of(it))),
                Act::Forget => self.record(Update::Delete(it.key.clone())),
                _ => {}
            }
        }
        let (copies, deferred) = self.before_copies(items);
        self.run_copies(copies);
        self.deletions(items);
        self.replace_dirs(&deferred);
        // 7. (Also after a stop.) Read-only directories made writable get their mode back.
        self.relock_all();
    }

    /// Steps 1 to 3: conflicts (the loser moves aside), directories
    /// (parents first), renames; then the list of step 4: the copies to
    /// make, and apart the files that replace a directory (made once it
    /// is gone).
    fn before_copies(&self, items: &[Item]) -> (Vec<Copy>, Vec<Copy>) {
        // 1. Conflicts: the loser moves aside; its copy and the winner's
        // travel with the other copies.
        let mut copies: Vec<Copy> = Vec::new();
        let mut deferred: Vec<Copy> = Vec::new();
        for it in items {
            if self.stopping() {
                break;
            }
            if let Act::Conflict { loser, name } = &it.act {
                if let Some(c) = self.conflict(it, *loser, name) {
                    copies.extend(c);
                }
            }
        }
        // 2. Directories, parents first (key order).
        for it in items {
            if self.stopping() {
                break;
            }
            if let Act::Copy { from } = it.act {
                if it.side(from).is_some_and(|m| m.kind == Kind::Dir) {
                    self.mkdir(it, from);
                }
            }
        }
        // 3. Renames.
        for it in items {
            if self.stopping() {
                break;
            }
            if let Act::Rename { on, from } = it.act {
                if let Some(c) = self.rename(it, on, &items[from]) {
                    copies.push(c);
                }
            }
        }
        // 4. Copies and metadata.
        for it in items {
            match it.act {
                Act::Copy { from } => {
                    let m = *it.side(from).expect("copied entries exist");
                    if m.kind == Kind::Dir {
                        continue;
                    }
                    let c = Copy {
                        from,
                        src: it.key.clone(),
                        dst: it.key.clone(),
                        meta: m,
                        expect: it.side(from.other()).copied(),
                    };
                    if c.expect.is_some_and(|t| t.kind == Kind::Dir) {
                        deferred.push(c);
                    } else {
                        copies.push(c);
                    }
                }
                Act::Meta { from } => copies.push(Copy {
                    from,
                    src: it.key.clone(),
                    dst: Vec::new(),
                    meta: *it.side(from).expect("both"),
                    expect: it.side(from.other()).copied(),
                }),
                _ => {}
            }
        }
        (copies, deferred)
    }

    /// Step 5: deletions, files in parallel, then directories deepest
    /// first.
    fn deletions(&self, items: &[Item]) {
        let files: Vec<usize> = (0..items.len())
            .filter(|&i| match items[i].act {
                Act::Delete { on } => items[i].side(on).is_some_and(|m| m.kind != Kind::Dir),
                _ => false,
            })
            .collect();
        let pool: Pool<usize> = Pool::new();
        pool.push_all(files);
        pool.run(self.opts.jobs, |i, _| {
            if self.stopping() {
                return;
            }
            if let Act::Delete { on } = items[i].act {
                self.delete(&items[i], on);
            }
        });
        for it in items.iter().rev() {
            if self.stopping() {
                break;
            }
            if let Act::Delete { on } = it.act {
                if it.side(on).is_some_and(|m| m.kind == Kind::Dir) {
                    self.delete(it, on);
                }
            }
        }
    }

    /// Step 6: files replacing directories that are now empty.
    fn replace_dirs(&self, deferred: &[Copy]) {
        for c in deferred {
            if self.stopping() {
                break;
            }
            let to = c.from.other();
            let res = on_side!(self, to, |st, dc| {
                dc.at(st, &c.dst).and_then(|(d, n)| {
                    dc.forget(&c.dst);
                    self.unlocking(to, &c.dst, || {
                        st.rmdir(&d, &n).map_err(|e| op_err(e, None, "rmdir"))
                    })
                })
            });
            match res {
                Ok(()) => {
                    add(&self.stats.files_deleted, 1);
                    self.rep
                        .action(BiAction::Delete, to, &path_of(&c.dst), None, 0);
                    let c = Copy {
                        expect: None,
                        ..c.clone()
                    };
                    self.copy(&c);
                }
                Err(e) => self.fail(to, &c.dst, &e),
            }
        }
    }

    fn run_copies(&self, copies: Vec<Copy>) {
        let copies = &copies;
        let pool: Pool<usize> = Pool::new();
        pool.push_all((0..copies.len()).rev());
        pool.run(self.opts.jobs, |i, _| {
            if self.stopping() {
                return;
            }
            let c = &copies[i];
            if c.dst.is_empty() {
                self.set_meta(c);
            } else {
                self.copy(c);
            }
        });
    }

    /// Move the loser aside; returns the copies that complete the conflict.
    fn conflict(&self, it: &Item, loser: Side, name: &[u8]) -> Option<Vec<Copy>> {
        let winner = loser.other();
        let lm = *it.side(loser).expect("conflicts have both sides");
        let wm = *it.side(winner).expect("conflicts have both sides");
        let res = on_side!(self, loser, |st, dc| {
            (|| {
                let (d1, n1) = dc.at(st, &it.key)?;
                let (d2, n2) = dc.at(st, name)?;
                self.unlocking(loser, &it.key, || {
                    st.rename(&d1, &n1, &d2, &n2)
                        .map_err(|e| op_err(e, None, "rename"))
                })?;
                if lm.kind == Kind::Dir {
                    dc.forget(&it.key);
                }
                // The entry as the rename left it (a rename moves the
                // change time): what the journal records of it.
                st.stat(&d2, &n2)
            })()
        });
        let lm = match res {
            Ok(Some(m)) if m.kind == lm.kind => m,
            Ok(_) => lm,
            Err(e) => {
                self.fail(loser, &it.key, &e);
                return None;
            }
        };
        add(&self.counts.conflicts, 1);
        self.rep.action(
            BiAction::Conflict,
            loser,
            &path_of(&it.key),
            Some(&path_of(name)),
            size_of(&lm),
        );
        let mut out = vec![Copy {
            from: loser,
            src: name.to_vec(),
            dst: name.to_vec(),
            meta: lm,
            expect: None,
        }];
        if wm.kind == Kind::Dir {
            let tmp = Item {
                act: Act::Copy { from: winner },
                ..it.clone()
            };
            let tmp = match loser {
                Side::A => Item { a: None, ..tmp },
                Side::B => Item { b: None, ..tmp },
            };
            self.mkdir(&tmp, winner);
        } else {
            out.push(Copy {
                from: winner,
                src: it.key.clone(),
                dst: it.key.clone(),
                meta: wm,
                expect: None,
            });
        }
        Some(out)
    }

    /// Create a directory on the other side of `from` (replacing a file
    /// or symlink there that is unchanged since the last sync).
    fn mkdir(&self, it: &Item, from: Side) {
        let to = from.other();
        let m = *it.side(from).expect("dir exists");
        let old = it.side(to).copied();
        let res = on_side!(self, to, |st, dc| {
            (|| {
                let (d, n) = dc.at(st, &it.key)?;
                if let Some(o) = old.filter(|o| o.kind != Kind::Dir) {
                    if !still(st.stat(&d, &n)?.as_ref(), Some(&o)) {
                        return Err(changed_err());
                    }
                    self.unlocking(to, &it.key, || {
                        self.keep_or_remove(st, to, &d, &n, &it.key, &o)
                    })?;
                    add(&self.stats.files_deleted, 1);
                    self.rep
                        .action(BiAction::Delete, to, &path_of(&it.key), None, size_of(&o));
                }
                if old.is_some_and(|o| o.kind == Kind::Dir) {
                    return Ok(());
                }
                let made = self.unlocking(to, &it.key, || {
                    st.make_dir(&d, &n).map_err(|e| op_err(e, None, "mkdir"))
                });
                match made {
                    Ok(nd) => {
                        if st.features().dir_meta {
                            st.set_dir_meta(
                                &nd,
                                &self.special[to as usize].apply(&m),
                                MetaChange {
                                    mode: true,
                                    ..MetaChange::default()
                                },
                            )
                            .map_err(|e| op_err(e, None, "chmod"))?;
                        }
                        dc.map.lock().insert(it.key.clone(), Arc::new(nd));
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        if st.stat(&d, &n)?.map(|m| m.kind) != Some(Kind::Dir) {
                            return Err(e);
                        }
                    }
                    Err(e) => return Err(e),
                }
                Ok(())
            })()
        });
        match res {
            Ok(()) => {
                if !matches!(old, Some(o) if o.kind == Kind::Dir) {
                    add(&self.stats.dirs_created, 1);
                    self.rep
                        .action(BiAction::Mkdir, to, &path_of(&it.key), None, 0);
                }
                self.record(Update::Put(
                    it.key.clone(),
                    synced(from, dir_rec(Some(&m)), dir_rec(Some(&m))),
                ));
            }
            Err(e) => self.fail(to, &it.key, &e),
        }
    }

    /// Replay a rename on `on`; if the old entry changed there, copy instead.
    fn rename(&self, it: &Item, on: Side, old: &Item) -> Option<Copy> {
        let x = on.other();
        let xm = *it.side(x).expect("new path exists");
        let planned = old.side(on).copied();
        let res = on_side!(self, on, |st, dc| {
            (|| {
                let (d1, n1) = dc.at(st, &old.key)?;
                if !still(st.stat(&d1, &n1)?.as_ref(), planned.as_ref()) {
                    return Ok(None);
                }
                let (d2, n2) = dc.at(st, &it.key)?;
                self.unlocking(on, &old.key, || {
                    self.unlocking(on, &it.key, || {
                        st.rename(&d1, &n1, &d2, &n2)
                            .map_err(|e| op_err(e, None, "rename"))
                    })
                })?;
                st.stat(&d2, &n2)
            })()
        });
        match res {
            Ok(Some(now)) => {
                add(&self.counts.renamed, 1);
                self.rep.action(
                    BiAction::Rename,
                    on,
                    &path_of(&it.key),
                    Some(&path_of(&old.key)),
                    size_of(&xm),
                );
                self.record(Update::Put(it.key.clone(), synced(x, xm, now)));
                self.record(Update::Delete(old.key.clone()));
                None
            }
            // Changed there meanwhile (the next run sees it), or no rename
            // on this store: copy the new path instead.
            Ok(None) => Some(self.copy_of(it, x, xm)),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Some(self.copy_of(it, x, xm)),
            Err(e) => {
                self.fail(on, &it.key, &e);
                None
            }
        }
    }

    fn copy_of(&self, it: &Item, from: Side, m: Meta) -> Copy {
        Copy {
            from,
            src: it.key.clone(),
            dst: it.key.clone(),
            meta: m,
            expect: None,
        }
    }

    /// Copy one file or symlink; the target must still be `expect`.
    fn copy(&self, c: &Copy) {
        let to = c.from.other();
        if c.meta.kind == Kind::Symlink && !on_side!(self, to, |st, _dc| st.has_symlinks()) {
            self.skip_symlink(c.from, &c.src);
            return;
        }
        let copy = || {
            between!(self, c.from, |s, sd, d, dd| copy_one(
                &self.copier_to(s, d, to),
                sd,
                dd,
                c
            ))
        };
        // A read-only directory of ours on the target side is made
        // writable (not for an error met on the source side).
        let res = match copy() {
            Err(e)
                if e.kind() == io::ErrorKind::PermissionDenied
                    && op_of(&e).is_none_or(|(end, _)| end != Some(End::Src)) =>
            {
                let pk = parent_key(&c.dst).unwrap_or(b"");
                match self.unlock(to, pk) {
                    Ok(true) => copy(),
                    _ => Err(e),
                }
            }
            r => r,
        };
        match res {
            Ok((from, now, kept)) => {
                if let (Some(k), Some(old)) = (kept, &c.expect) {
                    self.kept(to, &c.dst, &k, old);
                }
                add(&self.stats.files_copied, 1);
                add(&self.stats.bytes_copied, from.size);
                let act = match (c.meta.kind, c.expect) {
                    (Kind::Symlink, _) => BiAction::Symlink,
                    (_, Some(_)) => BiAction::Update,
                    _ => BiAction::Copy,
                };
                self.rep.action(act, to, &path_of(&c.dst), None, from.size);
                self.record(Update::Put(c.dst.clone(), synced(c.from, from, now)));
            }
            Err(e) if self.vanished(c.from, &c.src, &e) => self.rep.skip(
                c.from,
                &path_of(&c.src),
                "vanished: removed before it was copied",
            ),
            Err(e) => {
                let on = match op_of(&e) {
                    Some((Some(End::Src), _)) => c.from,
                    _ => to,
                };
                self.fail(on, &c.dst, &e)
            }
        }
    }

    /// Whether `e`, met copying `key` from side `from`, is that entry gone
    /// there (an editor's swap file, a `*.part` renamed away): a note, as
    /// rsync's "vanished", not an error. Nothing is recorded of it (the
    /// next run sees it gone).
    fn vanished(&self, from: Side, key: &[u8], e: &io::Error) -> bool {
        if e.kind() != io::ErrorKind::NotFound
            || op_of(e).is_some_and(|(end, _)| end == Some(End::Dst))
        {
            return false;
        }
        on_side!(self, from, |st, dc| match dc.at(st, key) {
            Ok((d, n)) => matches!(st.stat(&d, &n), Ok(None)),
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        })
    }

    /// Give the other side `c.from`'s mtime and mode (same bytes).
    fn set_meta(&self, c: &Copy) {
        let to = c.from.other();
        let res = on_side!(self, to, |st, dc| {
            (|| {
                let (d, n) = dc.at(st, &c.src)?;
                if !still(st.stat(&d, &n)?.as_ref(), c.expect.as_ref()) {
                    return Err(changed_err());
                }
                st.set_meta(
                    &d,
                    &n,
                    &self.special[to as usize].apply(&c.meta),
                    MetaChange {
                        mtime: true,
                        mode: c.meta.kind != Kind::Symlink,
                        owner: false,
                    },
                )
                .map_err(|e| op_err(e, None, "chmod"))?;
                st.stat(&d, &n)?
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
            })()
        });
        match res {
            Ok(now) => {
                self.rep
                    .action(BiAction::Meta, to, &path_of(&c.src), None, size_of(&c.meta));
                let attrs = between!(self, c.from, |s, sd, d, dd| same_attrs(
                    &self.copier(s, d),
                    sd,
                    dd,
                    &c.src,
                    &c.meta
                ));
                // Extended attributes written move the ctime: the record
                // holds the entry as they left it (else the next run sees a
                // change of ours).
                let now = match attrs {
                    Ok(true) => on_side!(self, to, |st, dc| {
                        (|| {
                            let (d, n) = dc.at(st, &c.src)?;
                            st.stat(&d, &n)
                        })()
                    })
                    .ok()
                    .flatten()
                    .unwrap_or(now),
                    _ => now,
                };
                self.record(Update::Put(c.src.clone(), synced(c.from, c.meta, now)));
                if let Err(e) = attrs {
                    self.fail(to, &c.src, &e);
                }
            }
            Err(e) => self.fail(to, &c.src, &e),
        }
    }

    /// In a watch, before a deletion on `on` (one that `from`'s side made):
    /// `from`'s root is still the directory watched (one open and statx
    /// by its path), so that a root removed or unmounted while the run
    /// deletes stops the deletions it causes there. Said once.
    fn root_alive(&self, from: Side) -> bool {
        let Some(g) = &self.opts.guard else {
            return true;
        };
        let lost = &self.lost[from as usize];
        if lost.load(Ordering::Relaxed) {
            return false;
        }
        let name = self.opts.name(from);
        let i = from as usize;
        let root = on_side!(self, from, |st, _dc| st
            .open_root()
            .ok()
            .flatten()
            .map(|(_, m)| m));
        // This run's own removals there count as seen.
        let at_start = self.removals_at_start[i] + self.own[i].load(Ordering::Relaxed);
        match ferry_engine::may_remove(g, i, &name, root.as_ref(), at_start) {
            Ok(()) => true,
            Err(why) => {
                if !lost.swap(true, Ordering::Relaxed) {
                    self.fail(from, b"", &io::Error::other(why));
                }
                false
            }
        }
    }

    /// Delete an entry unchanged since the last sync (a directory only if empty).
    fn delete(&self, it: &Item, on: Side) {
        if !self.root_alive(on.other()) {
            return;
        }
        let planned = *it.side(on).expect("deleted entries exist");
        let res = on_side!(self, on, |st, dc| {
            (|| {
                let (d, n) = dc.at(st, &it.key)?;
                if planned.kind == Kind::Dir {
                    dc.forget(&it.key);
                    return self.unlocking(on, &it.key, || {
                        st.rmdir(&d, &n).map_err(|e| op_err(e, None, "rmdir"))
                    });
                }
                // Checked right before the act (by the store).
                self.unlocking(on, &it.key, || {
                    self.keep_or_remove(st, on, &d, &n, &it.key, &planned)
                })
            })()
        });
        match res {
            Ok(()) => {
                // (Seen by that side's watcher too: not someone else's.)
                self.own[on as usize].fetch_add(1, Ordering::Relaxed);
                if planned.kind != Kind::Dir {
                    self.deleted[on as usize].fetch_add(1, Ordering::Relaxed);
                }
                add(&self.stats.files_deleted, 1);
                self.rep.action(
                    BiAction::Delete,
                    on,
                    &path_of(&it.key),
                    None,
                    size_of(&planned),
                );
                self.record(Update::Delete(it.key.clone()));
            }
            // Something this run did not plan to delete is inside (an
            // excluded entry, or one that appeared): the directory stays.
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && planned.kind == Kind::Dir => {
                self.record(Update::Delete(it.key.clone()));
            }
            Err(e) => self.fail(on, &it.key, &e),
        }
    }
}

/// One file, symlink or metadata transfer.
#[derive(Clone, Debug)]
struct Copy {
    from: Side,
    src: Vec<u8>,
    /// Target key (empty: a metadata-only change of `src`).
    dst: Vec<u8>,
    /// The source entry as planned.
    meta: Meta,
    /// What the target holds as planned (`None`: nothing).
    expect: Option<Meta>,
}

/// Give `key` on the copier's destination side the attributes it has on
/// its source side (`-X`, `-A`; `meta`: the entry's metadata, as set).
fn same_attrs<S: Store, D: Store>(
    cp: &Copier<'_, S, D>,
    sd: &Dirs<S>,
    dd: &Dirs<D>,
    key: &[u8],
    meta: &Meta,
) -> io::Result<bool> {
    if cp.xattrs.is_none() {
        return Ok(false);
    }
    let (s, d) = (cp.src, cp.dst);
    let (sdir, sname) = sd.at(s, key)?;
    let (ddir, dname) = dd.at(d, key)?;
    match cp.xattr_diff(&sdir, Some(&sname), &ddir, Some(&dname), meta.kind)? {
        Some((want, have)) => cp
            .put_xattrs(&ddir, Some(&dname), meta, &want, Some(&have))
            .map(|()| true),
        None => Ok(false),
    }
}

/// Copy `c.src` to `c.dst` (the engine's file copy: temporary + commit, so
/// never visible half-written, paced and counted); returns the source's
/// metadata the copy was made from, the target's afterwards, and where
/// the entry it replaced was kept (the copier's keeper, if any: when it
/// cannot keep, nothing is replaced).
fn copy_one<S: Store, D: Store>(
    cp: &Copier<'_, S, D>,
    sd: &Dirs<S>,
    dd: &Dirs<D>,
    c: &Copy,
) -> io::Result<(Meta, Meta, Option<Vec<u8>>)> {
    let (s, d) = (cp.src, cp.dst);
    let (sdir, sname) = sd.at(s, &c.src)?;
    let (ddir, dname) = dd.at(d, &c.dst)?;
    // The target must still be what the plan saw: absent, or unchanged
    // since the last sync.
    if !still(d.stat(&ddir, &dname)?.as_ref(), c.expect.as_ref()) {
        return Err(changed_err());
    }
    let mut from = c.meta;
    let rel = path_of(&c.dst);
    let kept;
    if c.meta.kind == Kind::Symlink {
        let target = s.read_link(&sdir, &sname)?;
        // The entry a symlink replaces is kept first (left in place where
        // the store can: the new link replaces it in one step).
        kept = match (cp.keep, &c.expect) {
            (Some(k), Some(old)) => Some(k.keep(
                d,
                &ddir,
                &dname,
                &rel,
                &Planned::new(old, cp.mtime_step),
                true,
            )?),
            _ => None,
        };
        d.create_symlink(&ddir, &dname, &target, &c.meta)?;
        cp.new_entry_xattrs(&sdir, &sname, &ddir, &dname, &c.meta)?;
    } else {
        let done = cp.copy_file(FileCopy {
            sdir: &sdir,
            sname: &sname,
            ddir: &ddir,
            name: &dname,
            rel: &rel,
            meta: &c.meta,
            old: c.expect.as_ref(),
        })?;
        from = done.meta;
        kept = done.kept;
        if let Some(m) = d.meta_after_commit(&from) {
            return Ok((from, m, kept));
        }
    }
    let now = d
        .stat(&ddir, &dname)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "vanished after the copy"))?;
    Ok((from, now, kept))
}
