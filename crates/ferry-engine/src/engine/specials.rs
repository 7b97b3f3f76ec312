//! Specials: symlinks, fifos and device nodes, and the entries skipped with a note.

use super::*;

impl<'a, S: Store, D: Store> Engine<'a, S, D> {
    /// Create or replace a symlink (`dst_meta`: an existing symlink to
    /// compare; `old`: the entry it replaces, kept first).
    pub(super) fn symlink(
        &self,
        node: &Node<S, D>,
        name: &CStr,
        meta: &Meta,
        dst_meta: Option<Meta>,
        old: Option<Meta>,
    ) {
        let path = self.path(node, name.to_bytes());
        if !self.dst.has_symlinks() {
            return self.rep.skip(
                &path,
                "symlink in SRC: the destination cannot store symlinks",
            );
        }
        let target = match self.src.read_link(&node.src, name) {
            Ok(t) => t,
            Err(e) => return self.fail(&path, &e),
        };
        if let (Some(dm), Some(d)) = (dst_meta, &node.dst) {
            match self.dst.read_link(d, name) {
                Ok(t) if t == target => {
                    Stats::add(&self.stats.unchanged, 1);
                    let mut c = meta_change(meta, &dm, self.plan.owner);
                    // A link's time where it cannot be set stays as made
                    // (asked in a dry run too: the store asks without writing).
                    c.mtime = c.mtime && self.dst.sets_symlink_times(d, name, &dm);
                    self.set_meta(node, name, meta, c);
                    return;
                }
                Ok(_) => {}
                Err(e) => return self.fail(&path, &e),
            }
        }
        if let Some(old) = old {
            // create_symlink replaces atomically: the old entry is linked
            // where it is kept first.
            if let Err(e) = self.keep_old(node.dst.as_ref(), name, &path, &old, true) {
                return self.fail(&path, &e);
            }
        }
        self.rep.action(Action::Symlink, &path, 0);
        Stats::add(&self.stats.symlinks_created, 1);
        if self.dry_run {
            return;
        }
        if let Some(d) = &node.dst {
            match self
                .dst
                .create_symlink(d, name, &target, meta)
                .and_then(|()| {
                    node.dirty.store(true, Ordering::Relaxed);
                    self.copier()
                        .new_entry_xattrs(&node.src, name, d, name, meta)
                }) {
                Ok(()) => {}
                Err(e) => self.fail(&path, &e),
            }
        }
    }

    /// Say why a source entry that is not copied is skipped: a socket or
    /// an unknown type (a note each), or a fifo or device node for a
    /// destination that cannot store them (one note per run, then `skip`
    /// actions).
    pub(super) fn skip_special(&self, path: &[u8], meta: &Meta) {
        match meta.kind {
            Kind::Socket => self.rep.skip(path, SOCKET_SKIP),
            k if k.is_node() => {
                if self.nodes_noted.swap(true, Ordering::Relaxed) {
                    self.rep.action(Action::Skip, path, 0);
                } else {
                    self.rep.skip(path, NODE_SKIP);
                }
            }
            _ => self.rep.skip(path, OTHER_SKIP),
        }
    }

    /// The source has an entry that is not copied (`meta`) where the
    /// destination has another (`dm`): that one is stale. Sync removes it
    /// (then the skip note), copy reports it (copy never deletes).
    pub(super) fn stale_at_special(&self, node: &Node<S, D>, name: &CStr, meta: &Meta, dm: &Meta) {
        let path = self.path(node, name.to_bytes());
        if self.opts.mode == Mode::Copy {
            let err = io::Error::other(format!(
                "is a {} in the source (not copied) but a {} in the destination; copy never deletes (use sync)",
                kind_word(meta.kind),
                kind_word(dm.kind)
            ));
            return self.fail(&path, &err);
        }
        if self.delete(node, name, dm) {
            self.skip_special(&path, meta);
        }
    }

    /// Create or replace a fifo or device node (`dst_meta`: the entry it
    /// replaces, a file, symlink or node of another kind or device).
    pub(super) fn special(
        &self,
        node: &Node<S, D>,
        name: &CStr,
        meta: &Meta,
        dst_meta: Option<Meta>,
    ) {
        let path = self.path(node, name.to_bytes());
        if !self.dst.supports_special() {
            return self.skip_special(&path, meta);
        }
        if let Some(old) = dst_meta {
            if let Err(e) = self.keep_old(node.dst.as_ref(), name, &path, &old, true) {
                return self.fail(&path, &e);
            }
        }
        self.rep.action(Action::Mknod, &path, 0);
        Stats::add(&self.stats.specials_created, 1);
        if self.dry_run {
            return;
        }
        if let Some(d) = &node.dst {
            match self.dst.create_special(d, name, meta, dst_meta.is_some()) {
                Ok(()) => node.dirty.store(true, Ordering::Relaxed),
                Err(e) => self.fail(&path, &e),
            }
        }
    }
}
