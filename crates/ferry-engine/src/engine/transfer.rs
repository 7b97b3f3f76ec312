//! Transfer: a worker's batch of files copied (commits in flight, opens sent ahead), and the single-file run.

use super::*;

impl<'a, S: Store, D: Store> Engine<'a, S, D> {
    /// Transfer one file (`check`: compare content first, `--checksum`).
    pub(super) fn transfer(
        &self,
        node: &Node<S, D>,
        name: &CStr,
        meta: &Meta,
        dst_meta: Option<Meta>,
        check: bool,
    ) -> Outcome {
        match self.transfer_start(node, name, meta, dst_meta, check, false) {
            Transfer::Over(out) => out,
            t @ Transfer::Committing { .. } => self.transfer_end(node, t),
        }
    }

    /// [`Engine::transfer`] up to the commit; with `nowait`, a commit the store confirms later
    /// ([`PipelineStore::commit_nowait`](crate::store::PipelineStore::commit_nowait)) is returned
    /// unconfirmed, for [`Engine::transfer_end`] to wait for and report.
    pub(super) fn transfer_start<'n>(
        &'n self,
        node: &'n Node<S, D>,
        name: &CStr,
        meta: &Meta,
        dst_meta: Option<Meta>,
        check: bool,
        nowait: bool,
    ) -> Transfer<'n> {
        let path = self.path(node, name.to_bytes());
        if check {
            let (Some(d), Some(dm)) = (&node.dst, dst_meta) else {
                return Transfer::Over(Outcome::Failed);
            };
            match self
                .copier()
                .same_content(&node.src, name, d, name, meta.size)
            {
                Ok(true) => {
                    Stats::add(&self.stats.unchanged, 1);
                    let c = meta_change(meta, &dm, self.plan.owner);
                    self.set_meta(node, name, meta, c);
                    return Transfer::Over(Outcome::Same);
                }
                Ok(false) => {}
                Err(e) => {
                    self.fail_or_vanished(node, name, &path, &e);
                    return Transfer::Over(Outcome::Failed);
                }
            }
        }
        let action = if dst_meta.is_some() {
            Action::Update
        } else {
            Action::Copy
        };
        if self.dry_run {
            if let Some(dm) = &dst_meta {
                let _ = self.keep_old(node.dst.as_ref(), name, &path, dm, true);
            }
            self.rep.action(action, &path, meta.size);
            Stats::add(&self.stats.files_copied, 1);
            Stats::add(&self.stats.bytes_copied, meta.size);
            return Transfer::Over(Outcome::Copied);
        }
        let Some(d) = &node.dst else {
            return Transfer::Over(Outcome::Failed);
        };
        let cp = self.copier();
        let started = if nowait {
            cp.copy_file_nowait(FileCopy {
                sdir: &node.src,
                sname: name,
                ddir: d,
                name,
                rel: &path,
                meta,
                old: dst_meta.as_ref(),
            })
        } else {
            cp.copy_file(FileCopy {
                sdir: &node.src,
                sname: name,
                ddir: d,
                name,
                rel: &path,
                meta,
                old: dst_meta.as_ref(),
            })
            .map(|c| (c, Committing::done(Ok(()))))
        };
        match started {
            Ok((copied, commit)) => Transfer::Committing {
                path,
                action,
                copied,
                dst_meta,
                commit,
            },
            Err(e) => {
                self.fail_or_vanished(node, name, &path, &e);
                Transfer::Over(Outcome::Failed)
            }
        }
    }

    /// Files a watch saw written that look the same by size and mtime (an
    /// edit in place that kept the size and put the mtime back) are
    /// compared by content ([`Scope::written`]).
    pub(super) fn check_written(&self, rel: &[u8], src_list: &Listing, steps: &mut [Step]) {
        let se = src_list.entries();
        for step in steps.iter_mut() {
            if let Step::Same { s, d, .. } = *step {
                if se[s].meta.kind == Kind::File
                    && self
                        .written
                        .binary_search(&join(rel, src_list.name(&se[s])))
                        .is_ok()
                {
                    *step = Step::Check { s, d };
                }
            }
        }
    }

    /// A file that failed at `path`: an error, except in a watch when it
    /// is gone from the source (an editor's swap file, a `*.part` renamed
    /// or removed before it could be copied): then a skip saying it
    /// vanished, as rsync's note does (its removal is the watch's next
    /// change).
    pub(super) fn fail_or_vanished(
        &self,
        node: &Node<S, D>,
        name: &CStr,
        path: &[u8],
        e: &io::Error,
    ) {
        if self.guard.is_some()
            && e.kind() == io::ErrorKind::NotFound
            && matches!(self.src.stat(&node.src, name), Ok(None))
        {
            self.rep
                .skip(path, "vanished: removed before it was copied");
        } else {
            self.fail(path, e);
        }
    }

    /// Tell the source which files of `batch` are about to be opened, in order
    /// ([`PipelineStore::open_ahead`](crate::store::PipelineStore::open_ahead)): those copied
    /// without a compare first, not empty, not waiting for another name of their file (`-H`).
    pub(super) fn open_ahead(&self, node: &Node<S, D>, batch: &FileBatch) {
        if self.dry_run || node.dst.is_none() || batch.files.len() < 2 {
            return;
        }
        let files: Vec<(&CStr, u64)> = batch
            .files
            .entries()
            .iter()
            .zip(&batch.check)
            .filter(|(f, check)| {
                !**check && f.meta.size > 0 && !(self.links.is_some() && f.meta.nlink > 1)
            })
            .map(|(f, _)| (batch.files.cname(f), f.meta.size))
            .collect();
        if files.len() > 1 {
            self.src.open_ahead(&node.src, &files);
        }
    }

    /// Wait for the commit of a transfer [`Engine::transfer_start`] began,
    /// and report it: copied once the store confirmed it, else one error.
    pub(super) fn transfer_end(&self, node: &Node<S, D>, t: Transfer<'_>) -> Outcome {
        let (path, action, c, dst_meta, commit) = match t {
            Transfer::Over(out) => return out,
            Transfer::Committing {
                path,
                action,
                copied,
                dst_meta,
                commit,
            } => (path, action, copied, dst_meta, commit),
        };
        match commit.wait().map_err(|e| match &node.dst {
            Some(d) => self.copier().full_disk(d, c.meta.size, e),
            None => e,
        }) {
            Ok(()) => {
                if let (Some(to), Some(dm)) = (&c.kept, &dst_meta) {
                    self.kept(&path, to, dm.size);
                }
                let n = c.bytes;
                node.dirty.store(true, Ordering::Relaxed);
                Stats::add(&self.stats.files_copied, 1);
                Stats::add(&self.stats.bytes_copied, n);
                self.rep.action(action, &path, n);
                Outcome::Copied
            }
            Err(e) => {
                self.fail(&path, &e);
                Outcome::Failed
            }
        }
    }

    /// The file copy and content compare of this run.
    pub(super) fn copier(&self) -> Copier<'_, S, D> {
        Copier {
            src: self.src,
            dst: self.dst,
            fsync: self.opts.fsync,
            bwlimit: self.opts.bwlimit.as_ref(),
            moved: &self.stats.bytes_moved,
            xattrs: if self.counting {
                None
            } else {
                self.xattrs.active()
            },
            delta: crate::delta::Use::of(self.opts.delta, &self.stats.delta),
            mtime_step: self.mtime_step,
            special: Some(&self.special),
            keep: if self.counting {
                None
            } else {
                self.opts.keep.as_deref()
            },
            grow: self.guard,
        }
    }

    /// Copy or sync a single file `src_name` (in the source root directory)
    /// to `dst_name` (in the destination root directory).
    pub fn run_file(&self, src_name: &CStr, dst_name: &CStr) -> io::Result<RunResult> {
        let start = Instant::now();
        let (sdir, _) = self
            .src
            .open_root()?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let (ddir, _) = self
            .dst
            .open_root()?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        // One entry on each side: stat it, never list its whole directory.
        let sm = self
            .src
            .stat(&sdir, src_name)?
            .map(|m| self.special.apply(&m))
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let dm = self.dst.stat(&ddir, dst_name)?;
        Stats::add(&self.stats.entries_scanned, 1);
        let path = dst_name.to_bytes();
        let changed = match dm {
            None => true,
            Some(dm) if dm.kind != Kind::File => true,
            Some(dm) if dm.size != sm.size => true,
            Some(_) if self.checksum => !self
                .copier()
                .same_content(&sdir, src_name, &ddir, dst_name, sm.size)?,
            Some(dm) => !sm.same_mtime(&dm),
        };
        if !changed {
            Stats::add(&self.stats.unchanged, 1);
            let dm = dm.expect("unchanged implies present");
            let c = meta_change(&sm, &dm, self.plan.owner);
            let p = || path.to_vec();
            self.fix_unchanged(&sdir, src_name, Some(&ddir), dst_name, &p, (&sm, c));
            self.xattr_note();
            return Ok(self.stats.summary(start.elapsed()));
        }
        let action = if dm.is_some() {
            Action::Update
        } else {
            Action::Copy
        };
        if self.dry_run {
            if let Some(dm) = &dm {
                let _ = self.keep_old(Some(&ddir), dst_name, path, dm, true);
            }
            self.rep.action(action, path, sm.size);
            Stats::add(&self.stats.files_copied, 1);
            Stats::add(&self.stats.bytes_copied, sm.size);
            return Ok(self.stats.summary(start.elapsed()));
        }
        let res = self.copier().copy_file(FileCopy {
            sdir: &sdir,
            sname: src_name,
            ddir: &ddir,
            name: dst_name,
            rel: path,
            meta: &sm,
            old: dm.as_ref(),
        });
        match res {
            Ok(c) => {
                if let (Some(to), Some(dm)) = (&c.kept, &dm) {
                    self.kept(path, to, dm.size);
                }
                let n = c.bytes;
                Stats::add(&self.stats.files_copied, 1);
                Stats::add(&self.stats.bytes_copied, n);
                self.rep.action(action, path, n);
            }
            Err(e) => self.fail(path, &e),
        }
        self.xattr_note();
        Ok(self.stats.summary(start.elapsed()))
    }
}
