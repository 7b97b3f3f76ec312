//! Finish: a directory done once all its entries are; its metadata and attributes set last, and those of unchanged entries fixed.

use super::*;

impl<'a, S: Store, D: Store> Engine<'a, S, D> {
    /// A child of `node` finished; the last one sets the directory's metadata.
    pub(super) fn done(&self, node: &Arc<Node<S, D>>) {
        if node.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let refused = node.parent.is_none() && self.refusal.lock().is_some();
        if refused {
            // Nothing is changed, not even the root's metadata.
        } else if let (false, Some(d)) = (self.dry_run, &node.dst) {
            let mut what = match &node.dst_meta {
                None => MetaChange::ALL,
                Some(m) => {
                    let mut c = meta_change(&node.src_meta, m, self.plan.owner);
                    c.mtime |= node.dirty.load(Ordering::Relaxed);
                    c.mode |= node.unlocked.load(Ordering::Relaxed);
                    c
                }
            };
            let mut meta = node.src_meta;
            if !self.src.features().dir_meta {
                // A prefix has no times or owner to copy, but a mode: the
                // one it lists (0755). A new directory (made 0700) gets it,
                // and so does one whose mode differs (left 0700 by a killed
                // run, or changed): directories converge like files. The
                // root only when made by this run (see `run_tree`); one
                // made writable for the run gets its own back.
                let unlocked = node.unlocked.load(Ordering::Relaxed);
                what = MetaChange {
                    mode: match &node.dst_meta {
                        None => true,
                        Some(m) => {
                            unlocked || (node.parent.is_some() && m.mode != node.src_meta.mode)
                        }
                    },
                    ..MetaChange::default()
                };
                // The root keeps its own mode (only unlocked for the run);
                // other directories take the listed one.
                if let (true, Some(m), None) = (unlocked, &node.dst_meta, &node.parent) {
                    meta.mode = m.mode;
                }
            }
            what.owner &= self.plan.owner;
            if !what.is_empty() {
                if let Err(e) = self.dst.set_dir_meta(d, &meta, what) {
                    self.fail(&node.rel, &e);
                }
            }
            // Attributes last: a directory's ACL may deny us what its
            // content needed, and setting the mode first keeps the mask.
            if let Err(e) = self.dir_xattrs(node, d).and_then(|x| match x {
                Some((want, have)) => self.copier().put_xattrs(d, None, &meta, &want, Some(&have)),
                None => Ok(()),
            }) {
                self.fail(&node.rel, &e);
            }
        } else if self.dry_run {
            if let Some(m) = &node.dst_meta {
                let c = meta_change(&node.src_meta, m, self.plan.owner);
                let attrs = match &node.dst {
                    Some(d) => self.dir_xattrs(node, d).unwrap_or_else(|e| {
                        self.fail(&node.rel, &e);
                        None
                    }),
                    None => None,
                };
                if c.mode || c.owner || attrs.is_some() {
                    self.rep.action(Action::Meta, &node.rel, 0);
                }
            }
        }
        if let Some(p) = &node.parent {
            self.done(p);
        }
    }

    /// The attributes of a directory pair, when they differ (see
    /// [`Copier::xattr_diff`]).
    pub(super) fn dir_xattrs(
        &self,
        node: &Node<S, D>,
        d: &D::Dir,
    ) -> io::Result<Option<(crate::xattr::Xattrs, crate::xattr::Xattrs)>> {
        self.copier()
            .xattr_diff(&node.src, None, d, None, Kind::Dir)
    }

    /// Bring an entry of `node` whose content is unchanged up to date: its
    /// metadata (`what`), and with `-X`/`-A` its attributes.
    pub(super) fn set_meta(&self, node: &Node<S, D>, name: &CStr, meta: &Meta, what: MetaChange) {
        let path = || self.path(node, name.to_bytes());
        self.fix_unchanged(
            &node.src,
            name,
            node.dst.as_ref(),
            name,
            &path,
            (meta, what),
        );
    }

    /// Bring `dname` of `ddir`, whose content equals `sname` of `sdir`, up
    /// to date: its metadata (`what`) and, with `-X`/`-A`, its attributes
    /// (listed on both sides, written only where they differ). One `meta`
    /// action when anything changes; `path` names it. `meta`: the
    /// source's metadata.
    pub(super) fn fix_unchanged(
        &self,
        sdir: &S::Dir,
        sname: &CStr,
        ddir: Option<&D::Dir>,
        dname: &CStr,
        path: &dyn Fn() -> Vec<u8>,
        (meta, what): (&Meta, MetaChange),
    ) {
        let cp = self.copier();
        let attrs = match (cp.xattrs, ddir) {
            (Some(_), Some(d)) => cp
                .xattr_diff(sdir, Some(sname), d, Some(dname), meta.kind)
                .unwrap_or_else(|e| {
                    self.fail(&path(), &e);
                    None
                }),
            _ => None,
        };
        if what.is_empty() && attrs.is_none() {
            return;
        }
        let path = path();
        self.rep.action(Action::Meta, &path, 0);
        let Some(d) = ddir.filter(|_| !self.dry_run) else {
            return;
        };
        let res = (|| {
            if !what.is_empty() {
                self.dst.set_meta(d, dname, meta, what)?;
            }
            match &attrs {
                Some((want, have)) => cp.put_xattrs(d, Some(dname), meta, want, Some(have)),
                None => Ok(()),
            }
        })();
        if let Err(e) = res {
            self.fail(&path, &e);
        }
    }
}
