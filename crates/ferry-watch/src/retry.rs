//! Paths that fail, retried with backoff and said once per state change.
//!
//! A run's entry errors go through [`Failures`]: the first error of a path
//! (or one with another cause) is said; the same error again, on a retry,
//! is not. After the run, [`Failures::end_run`] tells which paths of the
//! run's scope failed and which that failed before now went through
//! (healed, said once as a note by the loop). The loop retries each failing
//! path alone, 1 s after its first failure, then doubling up to 5 min, with
//! jitter ([`backoff`]): never a run per event its own failed attempt made.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::time::Duration;

use ferry_engine::{Action, Reporter};

use crate::{under, Work};

/// The first retry's delay.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest delay between two retries.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// The delay before retry number `tries` (0: the first): 1 s doubling up
/// to 5 min, each between 3/4 and 5/4 of it at random, so that paths that
/// failed together are not retried in step.
pub fn backoff(tries: u32) -> Duration {
    let base = RETRY_FIRST
        .saturating_mul(1u32 << tries.min(16))
        .min(RETRY_MAX);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(tries);
    let r = h.finish() % 1000;
    base.mul_f64(0.75 + r as f64 / 2000.0)
}

/// Whether the run of `work` covered `path`: a full run, or a scope
/// directory that is its parent, itself, or above it and deep.
pub fn covers(work: &Work, path: &[u8]) -> bool {
    if work.full {
        return true;
    }
    let parent = crate::parent(path);
    work.scope
        .dirs
        .iter()
        .any(|(d, deep)| *d == parent || d == path || (*deep && under(path, d)))
}

/// The paths failing now, with the error last said for each.
#[derive(Default)]
pub struct Failures {
    known: Mutex<HashMap<Vec<u8>, String>>,
    /// Paths that failed in the run under way.
    run: Mutex<Vec<Vec<u8>>>,
}

impl Failures {
    /// `path` failed with `msg`: true when it must be said (not failing
    /// before, or failing for another cause).
    pub fn failed(&self, path: &[u8], msg: String) -> bool {
        self.run.lock().push(path.to_vec());
        let mut k = self.known.lock();
        k.insert(path.to_vec(), msg.clone()).as_ref() != Some(&msg)
    }

    /// The run of `work` is over: the paths it failed on, and those
    /// failing before that it covered and did not fail on (healed; none
    /// when it did not go to its end: `complete` false, a signal stopped
    /// it).
    pub fn end_run(&self, work: &Work, complete: bool) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let mut failed = std::mem::take(&mut *self.run.lock());
        failed.sort();
        failed.dedup();
        let mut k = self.known.lock();
        let healed: Vec<Vec<u8>> = k
            .keys()
            .filter(|p| complete && covers(work, p) && failed.binary_search(p).is_err())
            .cloned()
            .collect();
        for p in &healed {
            k.remove(p);
        }
        (failed, healed)
    }
}

/// A [`Reporter`] that says each failing path's error once (see
/// [`Failures`]); everything else goes through.
pub struct Quiet<'a> {
    /// Where everything goes.
    pub inner: &'a dyn Reporter,
    /// The paths failing.
    pub failures: &'a Failures,
}

impl Reporter for Quiet<'_> {
    fn action(&self, action: Action, path: &[u8], size: u64) {
        self.inner.action(action, path, size)
    }
    fn error(&self, path: &[u8], err: &io::Error) {
        // An entry gone (removed while the run went on) is no failing
        // path: its removal is a change of its own.
        if err.kind() == io::ErrorKind::NotFound || self.failures.failed(path, err.to_string()) {
            self.inner.error(path, err)
        }
    }
    fn skip(&self, path: &[u8], why: &str) {
        self.inner.skip(path, why)
    }
    fn hard_link(&self, path: &[u8], to: &[u8]) {
        self.inner.hard_link(path, to)
    }
    fn kept(&self, path: &[u8], to: &[u8], size: u64) {
        self.inner.kept(path, to, size)
    }
    fn renamed(&self, path: &[u8], from: &[u8]) {
        self.inner.renamed(path, from)
    }
    fn note(&self, msg: &str) {
        self.inner.note(msg)
    }
    fn shows_actions(&self) -> bool {
        self.inner.shows_actions()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_minutes_with_jitter() {
        for t in 0..30 {
            let b = backoff(t);
            let base = Duration::from_secs(1u64 << t.min(9)).min(RETRY_MAX);
            assert!(
                b >= base.mul_f64(0.75) && b <= base.mul_f64(1.25),
                "{t}: {b:?}"
            );
        }
    }

    #[test]
    fn a_path_is_said_once_per_cause_and_heals_when_a_run_covers_it() {
        let f = Failures::default();
        let scoped = |d: &str| Work {
            scope: ferry_engine::Scope {
                dirs: vec![(d.as_bytes().to_vec(), false)],
                ..Default::default()
            },
            ..Work::default()
        };
        assert!(f.failed(b"a/x", "EPERM".into()));
        assert_eq!(
            f.end_run(&scoped("a"), true),
            (vec![b"a/x".to_vec()], vec![])
        );
        assert!(
            !f.failed(b"a/x", "EPERM".into()),
            "the same error: not said"
        );
        assert!(f.failed(b"a/x", "ENOSPC".into()), "another cause: said");
        f.end_run(&scoped("a"), true);
        // A run elsewhere does not heal it; one over its directory does.
        assert_eq!(f.end_run(&scoped("b"), true), (vec![], vec![]));
        assert_eq!(
            f.end_run(&scoped("a"), true),
            (vec![], vec![b"a/x".to_vec()])
        );
        assert!(f.failed(b"a/x", "EPERM".into()), "failing again: said");
    }
}
