//! `--watch`: one full run, then runs of what changed, until SIGINT/SIGTERM.
//!
//! Local sides are watched with inotify ([`inotify::Tree`], one thread per
//! tree blocked in `read()`); sides that cannot notify are polled: a full
//! run every `--poll` interval. The loop ([`watch`]) coalesces changes per
//! path and hands each batch to a [`Target`] as a [`Work`]: for one-way
//! sync ([`sync::SyncTarget`]) the renames seen and the directories to
//! re-plan with the engine's scoped run; bisync runs whole. The loop blocks
//! on its channel with no timeout while nothing is pending: a settle timer
//! runs only while a file is still being written, a poll timer only while a
//! side is polled (or a local side is degraded).
//!
//! A side may also notify through a [`Source`] (an ssh side whose remote
//! ferry watches its own tree and streams the changes back): its thread
//! sends changes as a local tree's does, and [`Msg::Polled`] while it
//! cannot (its connection lost), so that the side is polled meanwhile.

pub mod inotify;
pub mod retry;
mod run_loop;
pub mod server;
pub mod signals;
pub mod status;
pub mod sync;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::time::{Duration, Instant};

pub use ferry_engine::watch::{Change, Msg, NotWatched, Source};
pub use ferry_engine::Scope;
pub use status::{Status, Tee};

use run_loop::Loop;

/// One batch of work for a [`Target`].
#[derive(Debug, Default, Clone)]
pub struct Work {
    /// Compare everything (first run, overflow, a root back, a poll).
    pub full: bool,
    /// Otherwise: the directories to re-plan.
    pub scope: Scope,
    /// Renames seen, in order: from, to, is a directory.
    pub renames: Vec<(Vec<u8>, Vec<u8>, bool)>,
}

/// How a run went.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Entries that failed.
    pub errors: u64,
    /// Why the run as a whole did not happen (a refusal, an unreachable
    /// side): said, and the loop goes on.
    pub failed: Option<String>,
    /// `failed` is a refusal (`--max-delete`, an empty SRC, another root):
    /// the same run would be refused again, so it is not retried (the next
    /// change there, or the next rescan, runs again); a refused scoped run
    /// sets no full run.
    pub refused: bool,
    /// Paths the run failed on: each is retried alone, with backoff
    /// ([`retry::backoff`]).
    pub failing: Vec<Vec<u8>>,
    /// Paths failing before that this run went through (said once).
    pub healed: Vec<Vec<u8>>,
}

/// What the loop runs.
pub trait Target {
    /// Do one batch of work.
    fn run(&mut self, work: &Work) -> Outcome;
}

/// Settings of the loop.
#[derive(Debug, Clone)]
pub struct Config {
    /// Local roots watched with inotify (side = index).
    pub local: Vec<PathBuf>,
    /// Poll a side that cannot notify at this interval (a full run).
    pub poll: Option<Duration>,
    /// How long a file that is written and not closed must be quiet.
    pub settle: Duration,
    /// Interval for degraded sides (local directories without a watch, a
    /// [`Source`] that cannot notify or lost its watch).
    pub degraded_poll: Duration,
    /// Where the local trees count the removals they see, as they come
    /// (a run in flight stops its removals when one comes).
    pub guard: Option<std::sync::Arc<ferry_engine::Guard>>,
    /// The guard's side (0: SRC or A, 1: B) of each of `local`, when it is
    /// not its index (a bisync whose side A is remote).
    pub guard_sides: Vec<usize>,
    /// A full run this long after the last one (`--rescan`): what no
    /// event told (edits made in DST, events the kernel never sent) is
    /// corrected. `None`: never.
    pub rescan: Option<Duration>,
}

/// The longest a path written without a close waits: a log file written
/// all the time is still copied this often.
fn max_wait(settle: Duration) -> Duration {
    (settle * 20).max(Duration::from_secs(2))
}

/// How long removals must have stopped before a run may mirror them:
/// `settle`, and at least a second (an `rm -rf` of a root preempted on a
/// busy machine pauses, and must not look finished before the root goes).
pub fn removal_quiet(settle: Duration) -> Duration {
    settle.max(Duration::from_secs(1))
}

struct Item {
    ready: bool,
    deep: bool,
    /// The directory itself (its metadata), not its parent.
    own: bool,
    /// Written (not only closed, moved, its metadata changed): its content
    /// is compared even if its size and mtime match.
    written: bool,
    first: Instant,
    last: Instant,
}

/// Changes coalesced per path until they are run.
///
/// Removals are held: while entries are being removed (the last removal
/// less than [`removal_quiet`] ago), nothing runs, full or scoped, so the removal
/// of a whole root (`rm -rf SRC`: its entries first, the root last) is
/// seen as the root gone before any run could mirror the removals inside
/// it. Once removals are quiet, the run checks that the root is the one
/// watched (its device and inode, `ferry_engine::Guard`) before it does
/// anything.
#[derive(Default)]
struct Pending {
    items: HashMap<(usize, Vec<u8>), Item>,
    renames: Vec<(Vec<u8>, Vec<u8>, bool)>,
    full: bool,
    full_since: Option<Instant>,
    gone: Vec<usize>,
    /// When the last removal was seen.
    removed: Option<Instant>,
    /// A change came since the last run was taken (not only retries or
    /// rescans): a failed run is then said again.
    prompted: bool,
    /// What the last full run taken swallowed: given back if it is
    /// refused, to run scoped (so that a refused full run does not
    /// swallow changes elsewhere).
    swallowed: Vec<((usize, Vec<u8>), Item)>,
}

fn parent(p: &[u8]) -> Vec<u8> {
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => p[..i].to_vec(),
        None => Vec::new(),
    }
}

fn under(p: &[u8], dir: &[u8]) -> bool {
    p == dir || (p.starts_with(dir) && p.get(dir.len()) == Some(&b'/'))
}

impl Pending {
    fn touch(
        &mut self,
        side: usize,
        path: Vec<u8>,
        ready: bool,
        deep: bool,
        own: bool,
        now: Instant,
    ) {
        let it = self.items.entry((side, path)).or_insert(Item {
            ready,
            deep,
            own,
            written: false,
            first: now,
            last: now,
        });
        it.last = now;
        it.written |= !ready;
        // A write after a close makes it unfinished again.
        it.ready = ready;
        it.deep |= deep;
        it.own |= own;
    }

    /// Take in one change; notes to say go to `note`.
    fn add(&mut self, c: Change, now: Instant, note: &mut dyn FnMut(&'static str, String)) {
        self.prompted = true;
        match c {
            Change::Entry(s, p, ready) => self.touch(s, p, ready, false, false, now),
            Change::Removed(s, p) => {
                self.touch(s, p, true, false, false, now);
                self.removed = Some(now);
            }
            Change::Dir(s, p) => self.touch(s, p, true, false, true, now),
            Change::Deep(s, p) => self.touch(s, p, true, true, true, now),
            Change::Rename(s, from, to, isdir) => {
                if isdir {
                    // Pending paths inside move with their directory.
                    let moved: Vec<(usize, Vec<u8>)> = self
                        .items
                        .keys()
                        .filter(|(side, p)| *side == s && under(p, &from) && p != &from)
                        .cloned()
                        .collect();
                    for k in moved {
                        let it = self.items.remove(&k).expect("listed");
                        let mut q = to.clone();
                        q.extend_from_slice(&k.1[from.len()..]);
                        self.items.insert((s, q), it);
                    }
                }
                self.touch(s, from.clone(), true, false, false, now);
                self.touch(s, to.clone(), true, false, false, now);
                self.renames.push((from, to, isdir));
            }
            Change::Overflow(_) => {
                note(
                    "overflow",
                    "the kernel's event queue overflowed (fs.inotify.max_queued_events): events were lost, so the whole tree is compared again".into(),
                );
                self.set_full(now);
            }
            Change::Gone(s) => {
                note(
                    "gone",
                    "a watched root is gone: nothing is synced (and nothing deleted) until it is back".into(),
                );
                if !self.gone.contains(&s) {
                    self.gone.push(s);
                }
            }
            Change::Back(s) => {
                note(
                    "back",
                    "a watched root is back: the whole tree is compared again".into(),
                );
                self.gone.retain(|&g| g != s);
                self.set_full(now);
            }
        }
    }

    /// The last full run taken was refused: what it swallowed runs
    /// scoped, at once.
    fn give_back(&mut self) {
        for (k, mut it) in std::mem::take(&mut self.swallowed) {
            it.ready = true;
            self.items.entry(k).or_insert(it);
        }
    }

    /// A path that failed is due for a retry: its directory (or itself,
    /// whole, if it is one) runs again; the root (a failure of the run's
    /// own, such as removals stopped because the root is changing): a
    /// full run.
    fn retry(&mut self, path: Vec<u8>, now: Instant) {
        if path.is_empty() {
            self.set_full(now);
        } else {
            self.touch(0, path, true, true, true, now);
        }
    }

    fn set_full(&mut self, now: Instant) {
        self.full = true;
        self.full_since.get_or_insert(now);
    }

    /// The end of the hold on removals, while it lasts.
    fn held(&self, now: Instant, settle: Duration) -> Option<Instant> {
        self.removed
            .map(|t| t + removal_quiet(settle))
            .filter(|&end| now < end)
    }

    /// When the next item becomes ready, if none is.
    fn deadline(&self, settle: Duration) -> Option<Instant> {
        if !self.gone.is_empty() {
            return None;
        }
        if let Some(end) = self.held(Instant::now(), settle) {
            return Some(end);
        }
        if self.full || self.items.values().any(|i| i.ready) {
            return Some(Instant::now());
        }
        self.items
            .values()
            .map(|i| (i.last + settle).min(i.first + max_wait(settle)))
            .min()
    }

    /// The work ready at `now` (taken out), with the time of its oldest
    /// change.
    fn take(&mut self, now: Instant, settle: Duration) -> Option<(Work, Instant)> {
        if !self.gone.is_empty() || self.held(now, settle).is_some() {
            return None;
        }
        if self.full {
            let since = self.full_since.take().unwrap_or(now);
            let oldest = self.items.values().map(|i| i.first).min().unwrap_or(since);
            self.swallowed = self.items.drain().collect();
            self.renames.clear();
            self.full = false;
            return Some((
                Work {
                    full: true,
                    ..Work::default()
                },
                oldest.min(since),
            ));
        }
        let is_ready =
            |i: &Item| i.ready || now >= i.last + settle || now >= i.first + max_wait(settle);
        if !self.items.values().any(is_ready) {
            return None;
        }
        let keys: Vec<(usize, Vec<u8>)> = self
            .items
            .iter()
            .filter(|(_, i)| is_ready(i))
            .map(|(k, _)| k.clone())
            .collect();
        let mut work = Work {
            renames: std::mem::take(&mut self.renames),
            ..Work::default()
        };
        let mut oldest = now;
        for k in keys {
            let it = self.items.remove(&k).expect("listed");
            oldest = oldest.min(it.first);
            if it.written && !it.own {
                work.scope.written.push(k.1.clone());
            }
            let (dir, deep) = if it.own || it.deep {
                (k.1, it.deep)
            } else {
                (parent(&k.1), false)
            };
            match work.scope.dirs.iter_mut().find(|d| d.0 == dir) {
                Some(d) => d.1 |= deep,
                None => work.scope.dirs.push((dir, deep)),
            }
        }
        Some((work, oldest))
    }
}

/// Run `target` once whole, then on every change until a signal; returns
/// the exit code (0 after SIGINT/SIGTERM).
pub fn watch(cfg: &Config, target: &mut dyn Target, status: &Status, note: &dyn Fn(&str)) -> u8 {
    watch_with(cfg, Vec::new(), target, status, note)
}

/// [`watch`], with `sources` notifying for the sides after the local ones
/// (side `cfg.local.len() + i`).
pub fn watch_with(
    cfg: &Config,
    sources: Vec<Box<dyn Source>>,
    target: &mut dyn Target,
    status: &Status,
    note: &dyn Fn(&str),
) -> u8 {
    let (tx, rx) = channel::<Msg>();
    let guard = cfg.guard.clone();
    let on_stop = move || {
        eprintln!(
            "ferry: note: stopping after the entry in flight (a second signal stops at once)"
        );
        if let Some(g) = guard {
            g.stop();
        }
    };
    if let Err(e) = signals::forward(tx.clone(), on_stop) {
        note(&format!("signals: {e}"));
        return 2;
    }
    for (side, root) in cfg.local.iter().enumerate() {
        let guard = cfg
            .guard
            .clone()
            .map(|g| (g, cfg.guard_sides.get(side).copied().unwrap_or(side)));
        if let Err(e) = start_tree(side, root, cfg.degraded_poll, guard, tx.clone(), status) {
            note(&format!("{}: inotify: {e}", root.display()));
            return 2;
        }
    }
    let mut l = Loop::new(cfg, status, note);
    for (i, s) in sources.into_iter().enumerate() {
        let side = cfg.local.len() + i;
        if let Err(why) = s.start(side, tx.clone()) {
            note(&format!(
                "note: {why}: polled every {:?}",
                cfg.poll.unwrap_or(cfg.degraded_poll)
            ));
            l.polled.push(side);
        }
    }
    drop(tx);
    let mut first = Some(Instant::now());
    loop {
        // The removals seen until now, every event queued read: a run
        // taken below starts from them (what its removals are checked
        // against), and their changes are among the messages taken in next
        // (a removal among them holds the run).
        if let Some(g) = &cfg.guard {
            g.mark();
        }
        // What arrived during the last run, before deciding the next.
        while let Ok(m) = rx.try_recv() {
            l.take(m);
        }
        if l.stop {
            return l.code();
        }
        let now = Instant::now();
        l.due(now);
        // The first run, then whatever is ready.
        let job = match first.take() {
            Some(t) => Some((
                Work {
                    full: true,
                    ..Work::default()
                },
                t,
            )),
            None => l.pending.take(now, cfg.settle),
        };
        if let Some((work, since)) = job {
            l.run(target, work, since);
            continue;
        }
        if let Some(code) = l.wait(&rx) {
            return code;
        }
    }
}

fn start_tree(
    side: usize,
    root: &std::path::Path,
    poll: Duration,
    guard: Option<(std::sync::Arc<ferry_engine::Guard>, usize)>,
    tx: Sender<Msg>,
    status: &Status,
) -> std::io::Result<()> {
    let mut tree = inotify::Tree::new(side, root, poll)?;
    if let Some((g, gside)) = guard {
        tree.count_removals(g, gside);
    }
    tree.report_to(status.gauges());
    std::thread::Builder::new()
        .name(format!("ferry-inotify-{side}"))
        .spawn(move || tree.run(tx))?;
    Ok(())
}

#[cfg(test)]
mod tests;
