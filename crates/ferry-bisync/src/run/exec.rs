//! The executor's means ([`Exec`]): copiers, keepers, failures, read-only
//! directories made writable and set back, journal records, the rename
//! check and the dry run's report.

use super::*;

/// True when two files (or two symlinks) hold the same bytes: the
/// engine's content compare (a store's hash spares reading its side).
pub(super) fn same_content<S: Store, D: Store>(
    cp: &Copier<'_, S, D>,
    sd: &Dirs<S>,
    skey: &[u8],
    dd: &Dirs<D>,
    dkey: &[u8],
) -> io::Result<bool> {
    let (s, d) = (cp.src, cp.dst);
    let (sdir, sname) = sd.at(s, skey)?;
    let (ddir, dname) = dd.at(d, dkey)?;
    let sm = s
        .stat(&sdir, &sname)?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    if sm.kind == Kind::Symlink {
        return Ok(s.read_link(&sdir, &sname)? == d.read_link(&ddir, &dname)?);
    }
    cp.same_content(&sdir, &sname, &ddir, &dname, sm.size)
}

impl<A: Store, B: Store> Exec<'_, A, B> {
    /// The engine's file copy from `s` to `d` with this run's options.
    pub(super) fn copier<'x, S: Store, D: Store>(&'x self, s: &'x S, d: &'x D) -> Copier<'x, S, D> {
        Copier {
            src: s,
            dst: d,
            fsync: self.opts.fsync,
            bwlimit: self.opts.bwlimit.as_ref(),
            moved: &self.stats.bytes_moved,
            xattrs: self.xattrs.active(),
            delta: ferry_engine::delta::Use::of(self.opts.delta, &self.stats.delta),
            keep: None,
            mtime_step: ferry_engine::store::mtime_step(s, d),
            special: None,
            grow: None,
        }
    }

    /// The copier that writes to side `to`, keeping what it replaces there
    /// with `to`'s keeper.
    pub(super) fn copier_to<'x, S: Store, D: Store>(
        &'x self,
        s: &'x S,
        d: &'x D,
        to: Side,
    ) -> Copier<'x, S, D> {
        Copier {
            keep: self.keeper(to),
            special: Some(&self.special[to as usize]),
            ..self.copier(s, d)
        }
    }

    /// The step mtimes are compared to between the two sides.
    pub(super) fn step(&self) -> u32 {
        ferry_engine::store::mtime_step(self.a, self.b)
    }

    /// Side `on`'s keeper, if it keeps what is replaced or deleted.
    pub(super) fn keeper(&self, on: Side) -> Option<&Keeper> {
        self.opts.keep[on as usize].as_ref()
    }

    /// Report (and count) an entry of `on` kept at `to` before it was
    /// replaced or deleted (or, in a dry run, where it would be kept).
    pub(super) fn kept(&self, on: Side, key: &[u8], to: &[u8], m: &Meta) {
        add(&self.counts.kept, 1);
        add(&self.counts.bytes_kept, size_of(m));
        self.rep
            .action(BiAction::Keep, on, &path_of(key), Some(to), size_of(m));
    }

    /// A dry run's line for an entry of `on` that would be kept.
    pub(super) fn dry_kept(&self, on: Side, key: &[u8], m: &Meta) {
        if let Some(k) = self.keeper(on) {
            self.kept(on, key, &k.place(&path_of(key)), m);
        }
    }

    /// Keep the entry `n` of `d` on `on` (at `key`, as planned: `m`) before
    /// it is removed: the keeper moves it away (it is gone afterwards).
    /// Without a keeper it is removed for good.
    pub(super) fn keep_or_remove<S: Store>(
        &self,
        st: &S,
        on: Side,
        d: &S::Dir,
        n: &std::ffi::CStr,
        key: &[u8],
        m: &Meta,
    ) -> io::Result<()> {
        match self.keeper(on) {
            Some(k) => {
                let to = k.keep(
                    st,
                    d,
                    n,
                    &path_of(key),
                    &Planned::new(m, self.step()),
                    false,
                )?;
                self.kept(on, key, &to, m);
                Ok(())
            }
            // Only while it is still what the plan saw (one stat where the
            // store checks: a write made since is never lost).
            None => st
                .remove_planned(d, n, &Planned::new(m, self.step()))
                .map(|_| ())
                .map_err(|e| op_err(e, None, "unlink")),
        }
    }

    /// A signal came: begin no further entry (see [`Options::stopping`]).
    pub(super) fn stopping(&self) -> bool {
        self.opts.stopping()
    }

    /// Report a failure of the act on side `on` at `key`.
    pub(super) fn fail(&self, on: Side, key: &[u8], e: &io::Error) {
        add(&self.stats.errors, 1);
        self.rep.error_on(on, &path_of(key), e);
    }

    /// Run `act`, an act on side `on` in the directory holding `key`; if
    /// it is refused for want of permission, make that directory writable
    /// once (a read-only directory of ours, as a non-root user: what
    /// copy and sync do) and run it again. Its mode is set back at the end
    /// of the run ([`Exec::relock_all`]).
    pub(super) fn unlocking<T>(
        &self,
        on: Side,
        key: &[u8],
        act: impl Fn() -> io::Result<T>,
    ) -> io::Result<T> {
        match act() {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                let pk = parent_key(key).unwrap_or(b"");
                match self.unlock(on, pk) {
                    Ok(true) => act(),
                    _ => Err(e),
                }
            }
            r => r,
        }
    }

    /// Make directory `key` of side `on` writable (see
    /// [`Exec::unlocking`]); true when it is (or was made so by this run).
    pub(super) fn unlock(&self, on: Side, key: &[u8]) -> io::Result<bool> {
        let mut relock = self.relock.lock();
        if relock.iter().any(|(s, k, _)| *s == on && k == key) {
            return Ok(true);
        }
        on_side!(self, on, |st, dc| {
            let meta = if key.is_empty() {
                st.open_root()?.map(|(_, m)| m)
            } else {
                let (d, n) = dc.at(st, key)?;
                st.stat(&d, &n)?
            };
            let Some(meta) = meta else {
                return Ok(false);
            };
            let d = dc.dir(st, key)?;
            if !st.make_writable(&d)? {
                return Ok(false);
            }
            relock.push((on, key.to_vec(), meta));
            Ok(true)
        })
    }

    /// Set back the mode of the directories [`Exec::unlock`] changed.
    pub(super) fn relock_all(&self) {
        let dirs = std::mem::take(&mut *self.relock.lock());
        for (on, key, meta) in dirs.iter().rev() {
            let res = on_side!(self, *on, |st, dc| dc.dir(st, key).and_then(|d| {
                let what = MetaChange {
                    mode: true,
                    ..MetaChange::default()
                };
                st.set_dir_meta(&d, meta, what)
                    .map_err(|e| op_err(e, None, "chmod"))
            }));
            if let Err(e) = res {
                self.fail(*on, key, &e);
            }
        }
    }

    pub(super) fn record(&self, u: Update) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(u);
        }
    }

    /// True when an entry is at `key` on side `on` (a failure to look
    /// counts as none: a rename onto an entry there fails, never replaces).
    pub(super) fn exists(&self, on: Side, key: &[u8]) -> bool {
        on_side!(self, on, |st, dc| dc
            .at(st, key)
            .and_then(|(d, n)| st.stat(&d, &n))
            .is_ok_and(|m| m.is_some()))
    }

    /// Prove rename candidates (in parallel): the new path on side X must
    /// hold the bytes of the old path on the other side, which is the
    /// synced copy of what X had there (an inode, or a size and mtime, are
    /// no proof: a new file can reuse a deleted file's inode).
    pub(super) fn verify_renames(&self, cands: &[Candidate]) -> Vec<bool> {
        let ok: Vec<std::sync::atomic::AtomicBool> = cands
            .iter()
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        let pool: Pool<usize> = Pool::new();
        pool.push_all(0..cands.len());
        pool.run(self.opts.jobs, |i, _| {
            let (x, new, old) = &cands[i];
            let same = between!(self, *x, |s, sd, d, dd| same_content(
                &self.copier(s, d),
                sd,
                new,
                dd,
                old
            ));
            ok[i].store(same.unwrap_or(false), Ordering::Relaxed);
        });
        ok.into_iter().map(|b| b.into_inner()).collect()
    }

    /// Report every planned action (`--dry-run`): the lines and counts of
    /// the real run when nothing fails, in the order of [`Exec::execute`].
    pub(super) fn report_dry(&self, plan: &Plan) {
        let items = &plan.items;
        let p = |k: &[u8]| path_of(k);
        // 1. Conflicts: the loser moves aside, then each side gets the
        // other's version.
        for it in items {
            if let Act::Conflict { loser, name } = &it.act {
                let winner = loser.other();
                let lm = *it.side(*loser).expect("conflicts have both sides");
                let wm = *it.side(winner).expect("conflicts have both sides");
                add(&self.counts.conflicts, 1);
                self.rep.action(
                    BiAction::Conflict,
                    *loser,
                    &p(&it.key),
                    Some(&p(name)),
                    size_of(&lm),
                );
                self.dry_copy(*loser, name, &lm, None);
                if wm.kind == Kind::Dir {
                    add(&self.stats.dirs_created, 1);
                    self.rep
                        .action(BiAction::Mkdir, *loser, &p(&it.key), None, 0);
                } else {
                    self.dry_copy(winner, &it.key, &wm, None);
                }
            }
        }
        // 2. Directories.
        for it in items {
            if let Act::Copy { from } = it.act {
                if it.side(from).is_some_and(|m| m.kind == Kind::Dir) {
                    let to = from.other();
                    match it.side(to) {
                        Some(o) if o.kind == Kind::Dir => {}
                        old => {
                            if let Some(o) = old {
                                self.dry_kept(to, &it.key, o);
                                add(&self.stats.files_deleted, 1);
                                self.rep.action(
                                    BiAction::Delete,
                                    to,
                                    &p(&it.key),
                                    None,
                                    size_of(o),
                                );
                            }
                            add(&self.stats.dirs_created, 1);
                            self.rep.action(BiAction::Mkdir, to, &p(&it.key), None, 0);
                        }
                    }
                }
            }
        }
        // 3. Renames.
        for it in items {
            if let Act::Rename { on, from } = it.act {
                let m = it.side(on.other()).expect("new path exists");
                add(&self.counts.renamed, 1);
                let old = p(&items[from].key);
                self.rep
                    .action(BiAction::Rename, on, &p(&it.key), Some(&old), size_of(m));
            }
        }
        // 4. Copies and metadata (a file replacing a directory waits for 6).
        for it in items {
            match it.act {
                Act::Copy { from } => {
                    let m = it.side(from).expect("copied entries exist");
                    let over = it.side(from.other());
                    if m.kind != Kind::Dir && !over.is_some_and(|o| o.kind == Kind::Dir) {
                        self.dry_copy(from, &it.key, m, over);
                    }
                }
                Act::Meta { from } => {
                    let m = it.side(from).expect("both");
                    self.rep
                        .action(BiAction::Meta, from.other(), &p(&it.key), None, size_of(m))
                }
                _ => {}
            }
        }
        // 5. Deletions: files, then directories deepest first.
        let deleted = |it: &Item, dirs: bool| match it.act {
            Act::Delete { on } => it
                .side(on)
                .filter(|m| (m.kind == Kind::Dir) == dirs)
                .map(|m| (on, *m)),
            _ => None,
        };
        for it in items {
            if let Some((on, m)) = deleted(it, false) {
                self.dry_kept(on, &it.key, &m);
                add(&self.stats.files_deleted, 1);
                self.rep
                    .action(BiAction::Delete, on, &p(&it.key), None, size_of(&m));
            }
        }
        for it in items.iter().rev() {
            if let Some((on, _)) = deleted(it, true) {
                add(&self.stats.files_deleted, 1);
                self.rep.action(BiAction::Delete, on, &p(&it.key), None, 0);
            }
        }
        // 6. Files replacing directories (now empty).
        for it in items {
            if let Act::Copy { from } = it.act {
                let m = it.side(from).expect("copied entries exist");
                let to = from.other();
                if m.kind != Kind::Dir && it.side(to).is_some_and(|o| o.kind == Kind::Dir) {
                    add(&self.stats.files_deleted, 1);
                    self.rep.action(BiAction::Delete, to, &p(&it.key), None, 0);
                    self.dry_copy(from, &it.key, m, None);
                }
            }
        }
    }

    /// What [`Exec::copy`] reports for a copy of `m` from `from` to `key`
    /// on the other side (`over`: the entry there it replaces, kept first
    /// if that side keeps).
    pub(super) fn dry_copy(&self, from: Side, key: &[u8], m: &Meta, over: Option<&Meta>) {
        let to = from.other();
        if m.kind == Kind::Symlink && !on_side!(self, to, |st, _dc| st.has_symlinks()) {
            self.skip_symlink(from, key);
            return;
        }
        if let Some(o) = over {
            self.dry_kept(to, key, o);
        }
        add(&self.stats.files_copied, 1);
        add(&self.stats.bytes_copied, m.size);
        let act = match (m.kind, over) {
            (Kind::Symlink, _) => BiAction::Symlink,
            (_, Some(_)) => BiAction::Update,
            _ => BiAction::Copy,
        };
        self.rep.action(act, to, &path_of(key), None, m.size);
    }

    /// A symlink on `on` that the other side cannot hold.
    pub(super) fn skip_symlink(&self, on: Side, key: &[u8]) {
        self.rep.skip(
            on,
            &path_of(key),
            &format!(
                "symlink, which {} cannot store: not synced",
                self.opts.name(on.other())
            ),
        );
    }

    /// Remove temporaries a killed run left (they are ferry's, never a user's).
    pub(super) fn remove_temps(&self, temps: &[Vec<(Vec<u8>, Meta)>; 2]) {
        for (side, list) in [(Side::A, &temps[0]), (Side::B, &temps[1])] {
            for (key, m) in list {
                let res = on_side!(self, side, |st, dc| dc
                    .at(st, key)
                    .and_then(|(d, n)| st.remove(&d, &n, m.kind == Kind::Dir))
                    .map_err(|e| op_err(e, None, "unlink")));
                if let Err(e) = res {
                    if e.kind() != io::ErrorKind::NotFound {
                        self.fail(side, key, &e);
                    }
                }
            }
        }
    }
}
