//! Plan: a directory's steps ([`plan_dir`]) and what each one starts: files batched for the workers, subdirectories queued.

use super::*;

impl<'a, S: Store, D: Store> Engine<'a, S, D> {
    /// List both sides of a directory, plan, and act.
    pub(super) fn scan(&self, node: &Arc<Node<S, D>>, q: &Q<'_, S, D>) {
        if let Some(dir) = self.plan_node(node, q) {
            self.act(node, q, dir);
        }
    }

    /// `node`'s directory listed, filtered and planned ([`plan_dir`]);
    /// `None` when nothing is to be done there (said, and the directory
    /// done, or the run stopped).
    pub(super) fn plan_node(&self, node: &Arc<Node<S, D>>, q: &Q<'_, S, D>) -> Option<PlannedDir> {
        let Lists {
            src: mut src_list,
            mut errors,
            dst: mut dst_list,
            mut derr,
        } = self.list_both(node)?;
        if let Some((dir, name)) = &self.backup_in {
            if *dir == node.rel && src_list.entries().iter().any(|e| src_list.name(e) == name) {
                self.left_out(1, &join(dir, name), "the --backup-dir inside DST");
            }
            self.drop_untouched(&node.rel, &mut src_list, false);
            self.drop_untouched(&node.rel, &mut dst_list, false);
        }
        self.reserve_source_names(node, &src_list);
        if node.parent.is_none()
            && src_list
                .entries()
                .iter()
                .any(|e| keep::is_versions_dir(src_list.name(e)))
        {
            self.left_out(0, keep::VERSIONS_DIR, "the directory of kept versions");
        }
        if let Some(f) = &self.opts.filter {
            if let Err(e) = self.filter_pair(
                f,
                node,
                &mut src_list,
                &mut errors,
                &mut dst_list,
                &mut derr,
            ) {
                self.fail(&node.rel, &e);
                self.done(node);
                return None;
            }
        }
        if self.aliased("SRC", &node.rel, &src_list) || self.aliased("DST", &node.rel, &dst_list) {
            q.stop();
            return None;
        }
        for e in derr {
            self.fail(&self.path(node, &e.name), &e.err);
        }
        // With mtime rules the filter made the listings exact already.
        let exact = self.opts.filter.as_ref().is_some_and(Filter::needs_mtime);
        if (self.src.features().approximate_meta || self.dst.features().approximate_meta)
            && !self.counting
            && !exact
        {
            self.refine(node, &mut src_list, &mut dst_list);
        }
        if let Some(d) = &node.dst {
            self.drop_legacy_partials(node, d, &mut dst_list);
        }
        // Entries no path can name are there all the same: SRC is not empty.
        let unnamed = errors.iter().any(ListError::for_dir);
        if node.parent.is_none() && !unnamed && self.empty_src_refused(&src_list, &dst_list) {
            self.done(node);
            return None;
        }
        Stats::add(&self.stats.entries_scanned, src_list.len() as u64);
        Stats::add(&self.stats.dst_entries, dst_list.len() as u64);
        if src_list.is_empty()
            && errors.is_empty()
            && node.parent.is_some()
            && !self.dst.features().empty_dirs
        {
            // Said, not counted as made: nothing can be stored for it.
            self.rep.skip(
                &node.rel,
                "empty directory: the destination keeps no empty directories",
            );
        }
        // Names the source could not read are left alone in the destination.
        let unreadable: Vec<Vec<u8>> = errors.iter().map(|e| e.name.clone()).collect();
        let held = self.held(&node.rel, unnamed);
        for e in errors {
            self.fail(&self.path(node, &e.name), &e.err);
        }

        if self.mtime_step > 1 {
            coarsen(&mut src_list, self.mtime_step);
            coarsen(&mut dst_list, self.mtime_step);
        }
        self.special.fix_list(&mut src_list);
        let mut steps = Vec::with_capacity(src_list.len().max(dst_list.len()));
        plan_dir(&src_list, &dst_list, &self.plan, &mut steps);
        if !self.written.is_empty() {
            self.check_written(&node.rel, &src_list, &mut steps);
        }
        self.unlock_if_needed(node, &steps);
        Some(PlannedDir {
            src: src_list,
            dst: dst_list,
            steps,
            unreadable,
            held,
        })
    }

    /// The steps of a planned directory done: files batched for the
    /// workers, subdirectories queued, the rest here.
    pub(super) fn act(&self, node: &Arc<Node<S, D>>, q: &Q<'_, S, D>, dir: PlannedDir) {
        let PlannedDir {
            src: src_list,
            dst: dst_list,
            steps,
            unreadable,
            held,
        } = dir;
        let mut batch = FileBatch::default();
        let mut subdirs: Vec<DirTask<S, D>> = Vec::new();
        let se = src_list.entries();
        let de = dst_list.entries();
        for step in steps {
            if self.halted.load(Ordering::Relaxed) || self.stopping() {
                q.stop();
                return;
            }
            match step {
                Step::Create { s } => {
                    let m = se[s].meta;
                    match m.kind {
                        Kind::Dir => subdirs.push(self.dir_task(
                            node,
                            src_list.cname(&se[s]),
                            m,
                            DstAt::Nothing,
                        )),
                        Kind::Symlink => self.symlink(node, src_list.cname(&se[s]), &m, None, None),
                        k if k.is_node() => self.special(node, src_list.cname(&se[s]), &m, None),
                        _ => {
                            self.add_file(node, &mut batch, src_list.cname(&se[s]), m, None, false)
                        }
                    }
                }
                Step::Update { s, d } => self.add_file(
                    node,
                    &mut batch,
                    src_list.cname(&se[s]),
                    se[s].meta,
                    Some(de[d].meta),
                    false,
                ),
                Step::Check { s, d } => self.add_file(
                    node,
                    &mut batch,
                    src_list.cname(&se[s]),
                    se[s].meta,
                    Some(de[d].meta),
                    true,
                ),
                Step::Same { s, d, meta } => {
                    let (name, sm) = (src_list.cname(&se[s]), se[s].meta);
                    match &self.links {
                        Some(l) => self.group_file(
                            l,
                            node,
                            &mut batch,
                            name,
                            (sm, Some(de[d].meta)),
                            How::Same(meta),
                        ),
                        None => self.same(node, name, &sm, meta),
                    }
                }
                Step::CheckLink { s, d } => self.symlink(
                    node,
                    src_list.cname(&se[s]),
                    &se[s].meta,
                    Some(de[d].meta),
                    Some(de[d].meta),
                ),
                Step::Recurse { s, d } if self.recurses(node, src_list.name(&se[s])) => subdirs
                    .push(self.dir_task(
                        node,
                        src_list.cname(&se[s]),
                        se[s].meta,
                        DstAt::Dir(de[d].meta),
                    )),
                Step::Recurse { .. } => {}
                Step::Replace { s, d } => {
                    let name = src_list.cname(&se[s]);
                    self.replace(node, &mut batch, &mut subdirs, name, se[s].meta, de[d].meta)
                }
                Step::Delete { d } => {
                    let name = dst_list.name(&de[d]);
                    let protected = self.opts.keep.as_ref().is_some_and(|k| k.protects(name));
                    if !held && !unreadable.iter().any(|u| u == name) && !protected {
                        self.delete(node, dst_list.cname(&de[d]), &de[d].meta);
                    }
                }
                Step::RemoveTemp { d } => {
                    self.remove_temp(node, dst_list.cname(&de[d]), de[d].meta.kind)
                }
                Step::Skip { s } => {
                    let m = se[s].meta;
                    self.skip_special(&self.path(node, src_list.name(&se[s])), &m);
                }
                Step::ReplaceBySpecial { s, d } => {
                    self.stale_at_special(node, src_list.cname(&se[s]), &se[s].meta, &de[d].meta)
                }
            }
            if batch.full(self.batch_files) {
                self.queue_batch(node, &mut batch, q);
            }
        }
        self.queue_batch(node, &mut batch, q);
        if !subdirs.is_empty() {
            node.pending.fetch_add(subdirs.len(), Ordering::AcqRel);
            q.dirs(subdirs);
        }
        self.done(node);
    }

    /// [`Step::Replace`]: the source's `sm` where the destination has an
    /// entry of another kind, `dm`.
    pub(super) fn replace(
        &self,
        node: &Arc<Node<S, D>>,
        batch: &mut FileBatch,
        subdirs: &mut Vec<DirTask<S, D>>,
        name: &CStr,
        sm: Meta,
        dm: Meta,
    ) {
        if dm.kind == Kind::Dir {
            if self.opts.mode == Mode::Copy {
                let err = io::Error::other(format!(
                    "is a {} in the source but a directory in the destination; copy never deletes (use sync)",
                    sm.kind.as_str()
                ));
                self.fail(&self.path(node, name.to_bytes()), &err);
                return;
            }
            if sm.kind.is_node() && !self.dst.supports_special() {
                self.stale_at_special(node, name, &sm, &dm);
                return;
            }
            if !self.delete(node, name, &dm) {
                return;
            }
            match sm.kind {
                Kind::Symlink => self.symlink(node, name, &sm, None, None),
                k if k.is_node() => self.special(node, name, &sm, None),
                _ => self.add_file(node, batch, name, sm, None, false),
            }
        } else {
            match sm.kind {
                Kind::Dir => subdirs.push(self.dir_task(node, name, sm, DstAt::Other(dm))),
                // rename() replaces a file or symlink atomically.
                Kind::Symlink => self.symlink(node, name, &sm, None, Some(dm)),
                k if k.is_node() && !self.dst.supports_special() => {
                    self.stale_at_special(node, name, &sm, &dm)
                }
                k if k.is_node() => self.special(node, name, &sm, Some(dm)),
                _ => self.add_file(node, batch, name, sm, Some(dm), false),
            }
        }
    }

    pub(super) fn dir_task(
        &self,
        node: &Arc<Node<S, D>>,
        name: &CStr,
        src_meta: Meta,
        dst: DstAt,
    ) -> DirTask<S, D> {
        DirTask::Dir {
            parent: node.clone(),
            name: name.to_owned(),
            src_meta,
            dst,
        }
    }

    /// A file to transfer (`dm`: the destination's entry of that name;
    /// `check`: compare content first): batched, or with `-H` first
    /// matched with the other names of its file (`engine/links.rs`).
    pub(super) fn add_file(
        &self,
        node: &Arc<Node<S, D>>,
        batch: &mut FileBatch,
        name: &CStr,
        sm: Meta,
        dm: Option<Meta>,
        check: bool,
    ) {
        match &self.links {
            Some(l) => self.group_file(l, node, batch, name, (sm, dm), How::Transfer { check }),
            None => batch.add(name.to_bytes(), sm, dm, check),
        }
    }

    /// A file the same on both sides: counted, its metadata fixed.
    pub(super) fn same(&self, node: &Node<S, D>, name: &CStr, sm: &Meta, meta: MetaChange) {
        Stats::add(&self.stats.unchanged, 1);
        self.set_meta(node, name, sm, meta);
    }

    pub(super) fn queue_batch(
        &self,
        node: &Arc<Node<S, D>>,
        batch: &mut FileBatch,
        q: &Q<'_, S, D>,
    ) {
        if batch.files.is_empty() {
            return;
        }
        let b = std::mem::take(batch);
        Stats::add(&self.stats.files_planned, b.files.len() as u64);
        Stats::add(&self.stats.bytes_planned, b.bytes);
        node.pending.fetch_add(1, Ordering::AcqRel);
        {
            let mut l = node.lanes.lock();
            if l.0 >= self.lanes {
                l.1.push_back(b);
                return;
            }
            l.0 += 1;
        }
        q.work(Files {
            node: node.clone(),
            batch: b,
        });
    }
}
