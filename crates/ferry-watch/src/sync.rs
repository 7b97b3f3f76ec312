//! One-way copy/sync as a watch [`Target`]: renames replayed on the
//! destination with `Store::rename`, then the engine's scoped run over the
//! directories that changed (or its full run).

use std::ffi::CString;
use std::io;

use ferry_engine::{Engine, Guard, Kind, Mode, Options, Refused, Reporter, Store};

use crate::{Outcome, Target, Work};

/// copy/sync from `src` to `dst`.
pub struct SyncTarget<'a, S: Store, D: Store> {
    /// The source store.
    pub src: &'a S,
    /// The destination store.
    pub dst: &'a D,
    /// The run's options.
    pub opts: &'a Options,
    /// Where actions and errors go.
    pub rep: &'a dyn Reporter,
    /// Turns a run's error into its one line.
    pub describe: &'a dyn Fn(&io::Error) -> String,
    /// What every run checks first, full or scoped: the roots are the ones
    /// watched, and `--max-delete` over the window of the watch's runs.
    pub guard: &'a Guard,
    /// Where a run's progress is shown (its counters are the status's).
    pub live: Option<&'a crate::Status>,
    /// The paths failing (retried by the loop): `rep` goes through a
    /// [`crate::retry::Quiet`] of them, which says each error once.
    pub failures: &'a crate::retry::Failures,
}

/// The directory of `rel` opened from the root, component by component;
/// `None` if some component is missing or no directory.
fn open_rel<T: Store>(s: &T, rel: &[u8]) -> io::Result<Option<T::Dir>> {
    let Some((mut d, _)) = s.open_root()? else {
        return Ok(None);
    };
    for c in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        let name = CString::new(c).map_err(io::Error::other)?;
        match s.stat(&d, &name)? {
            Some(m) if m.kind == Kind::Dir => d = s.open_dir(&d, &name)?,
            _ => return Ok(None),
        }
    }
    Ok(Some(d))
}

fn split(p: &[u8]) -> (&[u8], &[u8]) {
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (&[][..], p),
    }
}

impl<S: Store, D: Store> SyncTarget<'_, S, D> {
    /// Replay the rename `from` → `to` on the destination when the source
    /// has `to` and not `from`, and the destination has `from` of the same
    /// kind and not `to` (the store's rename never replaces). True when done.
    fn rename(&self, from: &[u8], to: &[u8]) -> io::Result<bool> {
        let ((fd, fname), (td, tname)) = (split(from), split(to));
        let (fname, tname) = (
            CString::new(fname).map_err(io::Error::other)?,
            CString::new(tname).map_err(io::Error::other)?,
        );
        let (Some(sf), Some(st)) = (open_rel(self.src, fd)?, open_rel(self.src, td)?) else {
            return Ok(false);
        };
        let (Some(df), Some(dt)) = (open_rel(self.dst, fd)?, open_rel(self.dst, td)?) else {
            return Ok(false);
        };
        let (Some(sm), None) = (self.src.stat(&st, &tname)?, self.src.stat(&sf, &fname)?) else {
            return Ok(false);
        };
        let (Some(dm), None) = (self.dst.stat(&df, &fname)?, self.dst.stat(&dt, &tname)?) else {
            return Ok(false);
        };
        if sm.kind != dm.kind {
            return Ok(false);
        }
        match self.dst.rename(&df, &fname, &dt, &tname) {
            Ok(()) => {
                self.rep.renamed(to, from);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl<S: Store, D: Store> Target for SyncTarget<'_, S, D> {
    fn run(&mut self, work: &Work) -> Outcome {
        let stats = self.live.map(|s| s.run_stats()).unwrap_or_default();
        let e = Engine::new(self.src, self.dst, self.opts, &stats, self.rep).guarded(self.guard);
        let failed = |e: &io::Error| {
            Some(match Refused::of(e) {
                Some(r) => format!("{r} (watching on)"),
                None => format!("{} (watching on)", (self.describe)(e)),
            })
        };
        // The roots are the ones watched before anything is done, the
        // renames below included (the run checks them again).
        if let Err(err) = e.check_roots() {
            return Outcome {
                refused: Refused::of(&err).is_some(),
                failed: failed(&err),
                ..Outcome::default()
            };
        }
        let mut scope = work.scope.clone();
        if !work.full {
            for (from, to, isdir) in &work.renames {
                // copy never removes a name from DST: no rename there.
                let done = self.opts.mode == Mode::Sync
                    && match self.rename(from, to) {
                        Ok(d) => d,
                        Err(e) => {
                            self.rep.error(to, &e);
                            false
                        }
                    };
                // A directory not renamed there is compared whole.
                if !done && *isdir {
                    scope.dirs.push((to.clone(), true));
                }
            }
        }
        // Versions kept by this run are named by its time.
        if let Some(k) = &self.opts.keep {
            k.restamp(ferry_engine::keep::clock_now());
        }
        let res = if work.full {
            e.run_tree()
        } else {
            e.run_scoped(&scope)
        };
        let errors = stats.errors.load(std::sync::atomic::Ordering::Relaxed);
        let (failing, healed) = self.failures.end_run(work, !self.guard.stopping());
        let mut out = Outcome {
            errors,
            failing,
            healed,
            ..Outcome::default()
        };
        if let Err(e) = res {
            out.refused = Refused::of(&e).is_some();
            out.failed = failed(&e);
        }
        out
    }
}
