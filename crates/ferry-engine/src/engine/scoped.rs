//! Scoped runs: copy or sync only some directories of the tree (what a
//! watcher saw change), with the engine's own scan, plan and transfer.
//!
//! Each directory of a [`Scope`] is listed on both sides and planned like
//! any directory of a full run; its new subdirectories are copied whole
//! (they are `Create` steps), but subdirectories present on both sides are
//! walked only below a *deep* directory of the scope. The directories on
//! the way from the root to a scoped one are opened, not listed: they are
//! the scanned node's parents, so their metadata is set after the content
//! as in a full run. A scoped directory missing on either side (or no
//! directory there) is replaced by its nearest ancestor that is a
//! directory on both sides, whose plan then creates, replaces or deletes it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::{DirTask, Engine, Node, RunResult, Walker};
use crate::entry::{join, Kind, Meta};
use crate::report::Stats;
use crate::store::Store;
use crate::walk;

/// The directories a scoped run visits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Directories (paths from the root, `/`-separated, `""` for the root)
    /// whose entries are planned; `true`: also everything below it.
    pub dirs: Vec<(Vec<u8>, bool)>,
    /// Files (paths from the root) seen written: compared by content when
    /// their size and mtime match (an edit in place that kept the size and
    /// put the mtime back is still copied).
    pub written: Vec<Vec<u8>>,
}

/// `dir` is `rel` or one of its ancestors.
fn is_within(rel: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || rel == dir || (rel.starts_with(dir) && rel.get(dir.len()) == Some(&b'/'))
}

fn components(rel: &[u8]) -> impl Iterator<Item = &[u8]> {
    rel.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

impl<'a, S: Store, D: Store> Engine<'a, S, D> {
    /// Whether a scan of `node` walks into its subdirectory `name`, present
    /// on both sides: always in a full run; in a scoped run only below a
    /// deep directory (a deep directory itself is a task of its own).
    pub(super) fn recurses(&self, node: &Node<S, D>, name: &[u8]) -> bool {
        match &self.scope {
            None => true,
            Some(deep) => {
                let rel = join(&node.rel, name);
                deep.iter().any(|d| rel != *d && is_within(&rel, d))
            }
        }
    }

    /// Copy or sync the directories of `scope` only (see the module's
    /// documentation). A destination root that does not exist yet makes
    /// this a full run. Every safety rule of a full run holds: the roots
    /// are opened and checked by the same function (`open_roots`: in a
    /// watch, their identity), an empty source root is refused whenever
    /// the root is in the scope, and with `--max-delete` a counting pass
    /// of the same scope plans first: over the limit (in a watch, less
    /// what the window's earlier runs removed), nothing is changed.
    pub fn run_scoped(&self, scope: &Scope) -> io::Result<RunResult> {
        let start = Instant::now();
        if self.dst.open_root()?.is_none() {
            return self.run_tree();
        }
        if let Some(limit) = self.opts.max_delete {
            if !self.dry_run {
                let stats = Stats::default();
                self.counter(&stats).scoped_walk(scope)?;
                let allowed = self.allowance(limit, &stats, false)?;
                self.budget.store(allowed, Ordering::Relaxed);
            }
        }
        let before = self.stats.files_deleted.load(Ordering::Relaxed);
        let walked = self.scoped_walk(scope);
        self.count_removed(before);
        walked?;
        Ok(self.stats.summary(start.elapsed()))
    }

    /// An engine like this one (the same pass: counting or not, the same
    /// allowance) that walks only below the `deep` directories.
    fn scoped_like(&self, deep: Vec<Vec<u8>>) -> Engine<'_, S, D> {
        let mut e = Engine::new(self.src, self.dst, self.opts, self.stats, self.rep);
        e.dry_run = self.dry_run;
        e.counting = self.counting;
        e.checksum = self.checksum;
        e.plan.checksum = self.plan.checksum;
        if self.links.is_none() {
            e.links = None;
        }
        e.budget = AtomicU64::new(self.budget.load(Ordering::Relaxed));
        e.guard = self.guard;
        e.removals_at_start = self.removals_at_start;
        e.scope = Some(deep);
        e
    }

    /// One walk of the directories of `scope` (see `run_scoped`).
    fn scoped_walk(&self, scope: &Scope) -> io::Result<()> {
        let ((src_root, mut src_meta), dst) = self.open_roots()?;
        let Some((dst_root, dst_meta)) = dst else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "destination vanished during the run",
            ));
        };
        self.special.fix(&mut src_meta);
        // Where each scoped directory is scanned, once; then the ones that
        // a deep directory's walk reaches anyway are left to it.
        let mut targets: Vec<(Vec<u8>, bool)> = Vec::new();
        for (rel, deep) in &scope.dirs {
            // Never synced: `.ferry-versions`, a backup directory inside DST.
            if self.untouched_path(rel) {
                continue;
            }
            let (at, whole) = self.resolve(&src_root, &dst_root, rel)?;
            let deep = *deep && whole;
            match targets.iter_mut().find(|(r, _)| *r == at) {
                Some(t) => t.1 |= deep,
                None => targets.push((at, deep)),
            }
        }
        let deep: Vec<Vec<u8>> = targets
            .iter()
            .filter(|t| t.1)
            .map(|t| t.0.clone())
            .collect();
        targets.retain(|(r, _)| !deep.iter().any(|d| r != d && is_within(r, d)));
        targets.sort();
        let mut e = self.scoped_like(deep);
        e.written = scope.written.clone();
        e.written.sort();
        let root = Arc::new(Node {
            rel: Vec::new(),
            src: src_root,
            dst: Some(dst_root),
            src_meta,
            dst_meta: Some(dst_meta),
            pending: AtomicUsize::new(1),
            dirty: AtomicBool::new(false),
            unlocked: AtomicBool::new(false),
            parent: None,
            lanes: Mutex::new((0, Vec::new().into())),
        });
        let mut nodes: HashMap<Vec<u8>, Arc<Node<S, D>>> = HashMap::new();
        nodes.insert(Vec::new(), root);
        let mut tasks = Vec::new();
        for (rel, _) in &targets {
            match e.chain(&mut nodes, rel) {
                Ok(n) => tasks.push(n),
                Err(err) => e.fail(rel, &err),
            }
        }
        // Each node holds one count for itself: a scanned node gives it
        // back at the end of its scan, the others (opened on the way) now.
        let scanned: Vec<&[u8]> = tasks.iter().map(|n| n.rel.as_slice()).collect();
        let passed: Vec<Arc<Node<S, D>>> = nodes
            .iter()
            .filter(|(r, _)| !scanned.contains(&r.as_slice()))
            .map(|(_, n)| n.clone())
            .collect();
        drop(nodes);
        for n in &passed {
            e.done(n);
        }
        drop(passed);
        walk::walk(
            &Walker(&e),
            self.opts.jobs,
            tasks.into_iter().map(DirTask::Scan).collect(),
        );
        if let Some(msg) = e.refusal.lock().take() {
            return Err(super::refused(msg));
        }
        // (`e` copied the files: the attributes' note is its own.)
        e.xattr_note();
        Ok(())
    }

    /// The directory to scan for `rel`: `rel` itself when it is a directory
    /// on both sides, else its nearest ancestor that is; `true` when it is
    /// `rel` itself.
    fn resolve(
        &self,
        src_root: &S::Dir,
        dst_root: &D::Dir,
        rel: &[u8],
    ) -> io::Result<(Vec<u8>, bool)> {
        let mut at: Vec<u8> = Vec::new();
        let mut dirs: Option<(S::Dir, D::Dir)> = None;
        for c in components(rel) {
            let name = CString::new(c).map_err(io::Error::other)?;
            let (s, d) = match &dirs {
                Some((s, d)) => (s, d),
                None => (src_root, dst_root),
            };
            let both = matches!(self.src.stat(s, &name)?, Some(m) if m.kind == Kind::Dir)
                && matches!(self.dst.stat(d, &name)?, Some(m) if m.kind == Kind::Dir);
            if !both {
                return Ok((at, false));
            }
            let next = (self.src.open_dir(s, &name)?, self.dst.open_dir(d, &name)?);
            dirs = Some(next);
            at = join(&at, c);
        }
        Ok((at, true))
    }

    /// The node of directory `rel`, opening (and counting in their parents)
    /// the nodes on the way from the root that `nodes` lacks.
    fn chain(
        &self,
        nodes: &mut HashMap<Vec<u8>, Arc<Node<S, D>>>,
        rel: &[u8],
    ) -> io::Result<Arc<Node<S, D>>> {
        let mut cur = nodes[&Vec::new()].clone();
        for c in components(rel) {
            let path = join(&cur.rel, c);
            if let Some(n) = nodes.get(&path) {
                cur = n.clone();
                continue;
            }
            let name = CString::new(c).map_err(io::Error::other)?;
            let pd = cur.dst.as_ref().expect("scoped nodes exist on both sides");
            let not_dir = || io::Error::other("no longer a directory on both sides");
            let mut sm: Meta = self.src.stat(&cur.src, &name)?.ok_or_else(not_dir)?;
            self.special.fix(&mut sm);
            let dm: Meta = self.dst.stat(pd, &name)?.ok_or_else(not_dir)?;
            if sm.kind != Kind::Dir || dm.kind != Kind::Dir {
                return Err(not_dir());
            }
            let node = Arc::new(Node {
                rel: path.clone(),
                src: self.src.open_dir(&cur.src, &name)?,
                dst: Some(self.dst.open_dir(pd, &name)?),
                src_meta: sm,
                dst_meta: Some(dm),
                pending: AtomicUsize::new(1),
                dirty: AtomicBool::new(false),
                unlocked: AtomicBool::new(false),
                parent: Some(cur.clone()),
                lanes: Mutex::new((0, Vec::new().into())),
            });
            cur.pending.fetch_add(1, Ordering::AcqRel);
            nodes.insert(path, node.clone());
            cur = node;
        }
        Ok(cur)
    }
}

#[cfg(test)]
mod tests {
    use super::is_within;

    #[test]
    fn within_is_by_whole_components() {
        assert!(is_within(b"a/b", b""));
        assert!(is_within(b"a/b", b"a"));
        assert!(is_within(b"a/b", b"a/b"));
        assert!(!is_within(b"ab/c", b"a"));
        assert!(!is_within(b"a", b"a/b"));
    }
}
