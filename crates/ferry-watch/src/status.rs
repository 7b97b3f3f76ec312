//! What a watch is doing and has done, for `--status ADDR`: one state at
//! the top (in sync, syncing with what is left, degraded and why,
//! stopped), the counters, the conflicts, the failing paths, the recent
//! actions and errors, bytes per second over the last minutes. Served
//! (by [`crate::server`]) as a page (inline SVG chart, no external
//! assets), `/metrics` (Prometheus text format) and `/status.json`.
//!
//! Every figure on the page is one of the metrics, from the same snapshot:
//! the page shows it humanised (`4.0 KiB`, `1.2k`) and carries the exact
//! value in `data-value` beside its metric's name in `data-metric`.
//! Nothing ticks: the per-second series and a run's progress are read
//! when they are asked for.

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_engine::store::End;
use ferry_engine::{Action, Reporter, Stats};

use crate::{Change, Outcome, Work};

mod page;

pub use page::{bytes_h, count, dur_h};
use page::{js, num, plural, when};

/// Seconds of throughput kept for the chart.
const SERIES_SECS: u64 = 300;
/// Rows kept in each table.
const RECENT: usize = 50;

/// Figures the inotify trees update from their own threads, read when the
/// page is asked for: directories watched and not watched (the watch
/// limit), changes read from the kernel and not yet taken by the loop.
#[derive(Debug, Default)]
pub struct Gauges {
    watched: AtomicI64,
    unwatched: AtomicI64,
    queued: AtomicI64,
}

impl Gauges {
    /// A tree's count of watched directories went from `old` to `new`.
    pub fn watched(&self, old: usize, new: usize) {
        self.watched
            .fetch_add(new as i64 - old as i64, Ordering::Relaxed);
    }

    /// A tree's count of directories without a watch went from `old` to
    /// `new`.
    pub fn unwatched(&self, old: usize, new: usize) {
        self.unwatched
            .fetch_add(new as i64 - old as i64, Ordering::Relaxed);
    }

    /// `n` changes were read from the kernel (and sent to the loop).
    pub fn arrived(&self, n: usize) {
        self.queued.fetch_add(n as i64, Ordering::Relaxed);
    }

    /// `n` changes [`Gauges::arrived`] were taken by the loop.
    pub fn taken(&self, n: usize) {
        self.queued.fetch_sub(n as i64, Ordering::Relaxed);
    }

    fn get(a: &AtomicI64) -> u64 {
        a.load(Ordering::Relaxed).max(0) as u64
    }
}

/// A run in flight.
struct Run {
    start: Instant,
    stats: Arc<Stats>,
}

/// One row of the Recent table.
struct Rec {
    ms: u64,
    side: String,
    action: &'static str,
    path: String,
    size: u64,
}

/// One row of the Errors table (an entry that failed, a run refused).
struct ErrRec {
    ms: u64,
    side: String,
    path: String,
    msg: String,
}

/// One conflict (bisync): `path` on `side` kept as `other`.
struct Conflict {
    ms: u64,
    side: String,
    path: String,
    other: String,
}

#[derive(Default)]
struct Inner {
    what: String,
    started: u64,
    /// The loop's sides, by index (`SRC`, `A`, `B`...).
    sides: Vec<String>,
    runs: u64,
    full_runs: u64,
    files: u64,
    bytes: u64,
    /// Entries that failed.
    entry_errors: u64,
    /// Runs that did not happen (a refusal, a side unreachable).
    refused: u64,
    conflicts: u64,
    /// Changed paths waiting in the loop.
    queue: usize,
    run: Option<Run>,
    /// The scope of the run in flight: `None` for a full run.
    run_scope: Option<Vec<Vec<u8>>>,
    /// Paths that failed in the run in flight.
    run_failing: Vec<(String, String, u64, String)>,
    last_run_end: Option<u64>,
    last_latency: Option<Duration>,
    /// Sides whose root is gone, with since when.
    gone: BTreeMap<usize, u64>,
    /// An overflow waiting for the full run it causes to end.
    overflow: Option<u64>,
    /// The last run did not happen: when, why.
    refusal: Option<(u64, String)>,
    /// Paths that failed and have not been synced since, by (side,
    /// path): since when, why.
    failing: BTreeMap<(String, String), (u64, String)>,
    stopping: bool,
    stopped: bool,
    recent: VecDeque<Rec>,
    errs: VecDeque<ErrRec>,
    conflict_list: VecDeque<Conflict>,
    /// (unix second, bytes) of seconds that moved something.
    series: VecDeque<(u64, u64)>,
    /// The run in flight's bytes moved, as last added to `series`, and
    /// when (unix second).
    sampled: u64,
    sampled_sec: u64,
}

/// The watch's state as the status page shows it.
#[derive(Default)]
pub struct Status {
    inner: Mutex<Inner>,
    gauges: Arc<Gauges>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn push<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == RECENT {
        q.pop_front();
    }
    q.push_back(v);
}

/// Add `bytes` moved in second `sec` to the chart's series.
fn add(series: &mut VecDeque<(u64, u64)>, sec: u64, bytes: u64) {
    if bytes == 0 {
        return;
    }
    match series.iter_mut().rev().find(|(s, _)| *s <= sec) {
        Some((s, b)) if *s == sec => *b += bytes,
        _ => {
            let at = series.partition_point(|(s, _)| *s < sec);
            series.insert(at, (sec, bytes));
        }
    }
    while series.front().is_some_and(|(s, _)| s + SERIES_SECS < sec) {
        series.pop_front();
    }
}

/// The bytes the run in flight moved since the last look, added to the
/// chart at `sec` (a long copy shows as it moves, not when it ends).
/// False when the run counts nothing (its target keeps no stats here).
fn sample(i: &mut Inner, sec: u64) -> bool {
    let Some(r) = &i.run else {
        return false;
    };
    let s = &r.stats;
    let v = s
        .bytes_moved
        .load(Ordering::Relaxed)
        .max(s.bytes_copied.load(Ordering::Relaxed));
    let d = v.saturating_sub(i.sampled);
    i.sampled = v;
    // Spread over the seconds since the last look (the page may be asked
    // for seldom): a steady copy draws a flat line.
    let from = i.sampled_sec.clamp(sec.saturating_sub(SERIES_SECS), sec);
    i.sampled_sec = sec;
    let n = (sec - from).max(1);
    for k in 0..n {
        let part = d / n + u64::from(k < d % n);
        add(&mut i.series, sec + 1 + k - n, part);
    }
    v > 0
}

fn under(p: &str, dir: &str) -> bool {
    dir.is_empty() || p == dir || (p.starts_with(dir) && p.as_bytes().get(dir.len()) == Some(&b'/'))
}

/// The state at the top of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nothing waiting, nothing failing.
    InSync,
    /// A run in flight or changes waiting.
    Syncing,
    /// Something keeps the replicas from being in sync: see the reasons.
    Degraded,
    /// SIGINT/SIGTERM: stopping after the entry in flight, or stopped.
    Stopped,
}

impl State {
    /// The label of `ferry_watch_state`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::InSync => "in_sync",
            State::Syncing => "syncing",
            State::Degraded => "degraded",
            State::Stopped => "stopped",
        }
    }
    const ALL: [State; 4] = [
        State::InSync,
        State::Syncing,
        State::Degraded,
        State::Stopped,
    ];
}

/// Everything the page, the metrics and the JSON show, taken at once.
struct Snap {
    state: State,
    reasons: Vec<String>,
    /// (name, type, help, value): the metrics, in order.
    metrics: Vec<(&'static str, &'static str, &'static str, f64)>,
    /// Of a run in flight: files left, bytes left, ETA, full.
    progress: Option<(u64, u64, Option<Duration>)>,
}

impl Status {
    /// A status for a watch of `what` (e.g. `SRC -> DST`).
    pub fn new(what: &str) -> Status {
        Status {
            inner: Mutex::new(Inner {
                what: what.to_string(),
                started: now_ms(),
                ..Inner::default()
            }),
            gauges: Arc::default(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock())
    }

    /// The names of the loop's sides, by index (its local roots first,
    /// then its sources), for the reasons of a degraded state.
    pub fn sides(&self, names: Vec<String>) {
        self.with(|i| i.sides = names);
    }

    /// What the inotify trees update.
    pub fn gauges(&self) -> Arc<Gauges> {
        self.gauges.clone()
    }

    /// Directories watched (a tree that does not report to [`Gauges`]).
    pub fn watched(&self, n: usize) {
        self.gauges.watched(0, n);
    }

    /// Paths waiting in the loop.
    pub fn queue(&self, n: usize) {
        self.with(|i| i.queue = n);
    }

    /// A change as the loop takes it: a root gone or back, an overflow.
    pub fn change(&self, c: &Change) {
        let ms = now_ms();
        self.with(|i| match c {
            Change::Gone(s) => {
                i.gone.entry(*s).or_insert(ms);
            }
            Change::Back(s) => {
                i.gone.remove(s);
            }
            Change::Overflow(_) => {
                i.overflow.get_or_insert(ms);
            }
            _ => {}
        });
    }

    /// SIGINT/SIGTERM: the watch stops after the run in flight.
    pub fn stopping(&self) {
        self.with(|i| i.stopping = true);
    }

    /// The loop ended.
    pub fn stopped(&self) {
        self.with(|i| {
            i.stopping = true;
            i.stopped = true;
        });
    }

    /// A run begins (`queued`: paths still waiting).
    pub fn run_started(&self, w: &Work, queued: usize) {
        self.with(|i| {
            i.run = Some(Run {
                start: Instant::now(),
                stats: Arc::default(),
            });
            i.sampled = 0;
            i.sampled_sec = now_ms() / 1000;
            i.run_scope = (!w.full).then(|| {
                let mut s: Vec<Vec<u8>> = w.scope.dirs.iter().map(|d| d.0.clone()).collect();
                s.extend(w.renames.iter().flat_map(|r| [r.0.clone(), r.1.clone()]));
                s
            });
            i.run_failing.clear();
            i.queue = queued;
            i.full_runs += u64::from(w.full);
        });
    }

    /// The counters of the run in flight, for its progress (a target
    /// hands them to its engine); fresh ones outside a run.
    pub fn run_stats(&self) -> Arc<Stats> {
        self.with(|i| i.run.as_ref().map(|r| r.stats.clone()).unwrap_or_default())
    }

    /// New counters for the run in flight (what it counted so far was an
    /// attempt given up), as [`Status::run_stats`].
    pub fn fresh_run_stats(&self) -> Arc<Stats> {
        self.with(|i| {
            sample(i, now_ms() / 1000);
            i.sampled = 0;
            match &mut i.run {
                Some(r) => {
                    r.stats = Arc::default();
                    r.stats.clone()
                }
                None => Arc::default(),
            }
        })
    }

    /// A run ended, `latency` after the oldest change it covered reached
    /// the kernel's queue (see `docs/CLI.md`).
    pub fn run_done(&self, latency: Duration, out: &Outcome, queued: usize) {
        let ms = now_ms();
        self.with(|i| {
            let full = i.run_scope.is_none();
            sample(i, ms / 1000);
            i.run = None;
            i.runs += 1;
            i.queue = queued;
            i.last_latency = Some(latency);
            i.last_run_end = Some(ms);
            match &out.failed {
                Some(f) => {
                    i.refused += 1;
                    i.refusal = Some((ms, f.clone()));
                    push(
                        &mut i.errs,
                        ErrRec {
                            ms,
                            side: String::new(),
                            path: String::new(),
                            msg: f.clone(),
                        },
                    );
                }
                None => {
                    i.refusal = None;
                    if full {
                        i.overflow = None;
                    }
                }
            }
            // The paths this run covered and did not fail are synced now.
            if out.failed.is_none() {
                match i.run_scope.take() {
                    None => i.failing.clear(),
                    Some(scope) => {
                        let scope: Vec<String> = scope
                            .iter()
                            .map(|d| String::from_utf8_lossy(d).into_owned())
                            .collect();
                        i.failing
                            .retain(|(_, p), _| !scope.iter().any(|d| under(p, d)));
                    }
                }
            }
            for (side, path, t, msg) in std::mem::take(&mut i.run_failing) {
                i.failing.insert((side, path), (t, msg));
            }
        });
    }

    /// `action` was done on `side` at `path` (`size` bytes; `other`: where
    /// a conflict's other version went).
    pub fn record(
        &self,
        side: &str,
        action: &'static str,
        path: &[u8],
        size: u64,
        other: Option<&[u8]>,
    ) {
        let ms = now_ms();
        self.with(|i| {
            let path = String::from_utf8_lossy(path).into_owned();
            if matches!(action, "copy" | "update") {
                i.files += 1;
                i.bytes += size;
                // A target that does not count into the run's stats: its
                // copies count whole, when done.
                if !sample(i, ms / 1000) {
                    add(&mut i.series, ms / 1000, size);
                }
            }
            if action == "conflict" {
                i.conflicts += 1;
                push(
                    &mut i.conflict_list,
                    Conflict {
                        ms,
                        side: side.to_string(),
                        path: path.clone(),
                        other: other
                            .map(|o| String::from_utf8_lossy(o).into_owned())
                            .unwrap_or_default(),
                    },
                );
            }
            push(
                &mut i.recent,
                Rec {
                    ms,
                    side: side.to_string(),
                    action,
                    path,
                    size,
                },
            );
        });
    }

    /// An entry failed on `side` at `path`.
    pub fn failure(&self, side: &str, path: &[u8], msg: String) {
        let ms = now_ms();
        self.with(|i| {
            i.entry_errors += 1;
            let path = String::from_utf8_lossy(path).into_owned();
            i.run_failing
                .push((side.to_string(), path.clone(), ms, msg.clone()));
            push(
                &mut i.errs,
                ErrRec {
                    ms,
                    side: side.to_string(),
                    path,
                    msg,
                },
            );
        });
    }

    /// The state.
    pub fn state(&self) -> State {
        self.snap().state
    }

    fn snap(&self) -> Snap {
        let g = &self.gauges;
        let (watched, unwatched, arrived) = (
            Gauges::get(&g.watched),
            Gauges::get(&g.unwatched),
            Gauges::get(&g.queued),
        );
        self.with(|i| {
            sample(i, now_ms() / 1000);
            let mut reasons = Vec::new();
            let side = |s: usize| i.sides.get(s).cloned().unwrap_or_else(|| format!("side {s}"));
            for (s, t) in &i.gone {
                reasons.push(format!(
                    "root gone: {} (since {}): nothing is synced, nothing deleted, until it is back",
                    side(*s),
                    when(*t)
                ));
            }
            if let Some((t, why)) = &i.refusal {
                reasons.push(format!("the last run did not happen ({}): {why}", when(*t)));
            }
            if let Some(t) = i.overflow {
                reasons.push(format!(
                    "the kernel's event queue overflowed ({}): the whole tree is compared again",
                    when(t)
                ));
            }
            if unwatched > 0 {
                reasons.push(format!(
                    "the inotify watch limit is reached: {} without a watch, rescanned on a timer (fs.inotify.max_user_watches)",
                    plural(unwatched, "directory", "directories")
                ));
            }
            if !i.failing.is_empty() {
                reasons.push(format!(
                    "{} failing (below): tried again at the next run of their directory",
                    plural(i.failing.len() as u64, "path", "paths")
                ));
            }
            let queue = i.queue as u64 + arrived;
            let state = if i.stopping {
                State::Stopped
            } else if !reasons.is_empty() {
                State::Degraded
            } else if i.run.is_some() || queue > 0 {
                State::Syncing
            } else {
                State::InSync
            };
            let progress = i.run.as_ref().map(|r| {
                let ld = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
                let s = &r.stats;
                let files = ld(&s.files_planned).saturating_sub(ld(&s.files_copied));
                let moved = ld(&s.bytes_moved);
                let bytes = ld(&s.bytes_planned).saturating_sub(moved);
                let secs = r.start.elapsed().as_secs_f64();
                let eta = (moved > 0 && secs > 0.0 && bytes > 0)
                    .then(|| Duration::from_secs_f64(bytes as f64 * secs / moved as f64));
                (files, bytes, eta)
            });
            let (pf, pb, eta) = progress.unwrap_or((0, 0, None));
            let lat = i.last_latency.map_or(0.0, |d| d.as_secs_f64());
            #[rustfmt::skip]
            let metrics = vec![
                ("ferry_watch_transferred_files_total", "counter", "Files copied or updated.", i.files as f64),
                ("ferry_watch_transferred_bytes_total", "counter", "Bytes of files copied or updated.", i.bytes as f64),
                ("ferry_watch_errors_total", "counter", "Entries that failed, and runs that did not happen (ferry_watch_refused_runs_total).", (i.entry_errors + i.refused) as f64),
                ("ferry_watch_refused_runs_total", "counter", "Runs that did not happen: refused (an empty SRC, the delete limit) or a side unreachable.", i.refused as f64),
                ("ferry_watch_conflicts_total", "counter", "Conflicts (bisync): both sides changed, one version kept under a conflict name.", i.conflicts as f64),
                ("ferry_watch_failing_paths", "gauge", "Paths that failed and have not been synced since.", i.failing.len() as f64),
                ("ferry_watch_queue_length", "gauge", "Changed paths waiting for a run: those the loop holds, and, during a run, those of the changes read from the kernel it has not taken yet (one per batch read).", queue as f64),
                ("ferry_watch_runs_total", "counter", "Runs (scoped and full).", i.runs as f64),
                ("ferry_watch_full_runs_total", "counter", "Full runs (the first, after an overflow, a root back, a poll).", i.full_runs as f64),
                ("ferry_watch_watched_directories", "gauge", "Directories with an inotify watch.", watched as f64),
                ("ferry_watch_unwatched_directories", "gauge", "Directories without a watch (the watch limit): rescanned on a timer.", unwatched as f64),
                ("ferry_watch_roots_gone", "gauge", "Watched roots that are gone.", i.gone.len() as f64),
                ("ferry_watch_running", "gauge", "1 while a run is in progress.", f64::from(u8::from(i.run.is_some()))),
                ("ferry_watch_run_remaining_files", "gauge", "Files the run in flight has found to copy and not copied yet.", pf as f64),
                ("ferry_watch_run_remaining_bytes", "gauge", "Bytes the run in flight has found to copy and not copied yet.", pb as f64),
                ("ferry_watch_run_eta_seconds", "gauge", "Time left for the run in flight at its rate so far (0: unknown).", eta.map_or(0.0, |d| d.as_secs_f64().round())),
                ("ferry_watch_last_change_latency_seconds", "gauge", "From when the oldest change of the last run reached the kernel's event queue to the run's end.", lat),
                ("ferry_watch_last_run_end_time_seconds", "gauge", "When the last run ended (unix time; 0: none yet).", i.last_run_end.map_or(0.0, |t| (t / 1000) as f64)),
                ("ferry_watch_start_time_seconds", "gauge", "When the watch began (unix time).", (i.started / 1000) as f64),
            ];
            Snap {
                state,
                reasons,
                metrics,
                progress,
            }
        })
    }

    /// `/metrics`: Prometheus text exposition format 0.0.4.
    pub fn metrics(&self) -> String {
        let snap = self.snap();
        let mut s = String::new();
        let _ = write!(
            s,
            "# HELP ferry_watch_state The watch's state: 1 for the one it is in.\n# TYPE ferry_watch_state gauge\n"
        );
        for st in State::ALL {
            let _ = writeln!(
                s,
                "ferry_watch_state{{state=\"{}\"}} {}",
                st.as_str(),
                u8::from(st == snap.state)
            );
        }
        for (name, kind, help, v) in &snap.metrics {
            let _ = write!(
                s,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}\n",
                num(*v)
            );
        }
        s
    }

    /// `/status.json`: the state, its reasons, the metrics by name, the
    /// tables.
    pub fn json(&self) -> String {
        let snap = self.snap();
        self.with(|i| {
            let mut s = String::from("{");
            let _ = write!(
                s,
                "\"what\":{},\"state\":\"{}\",\"reasons\":[",
                js(&i.what),
                snap.state.as_str()
            );
            for (n, r) in snap.reasons.iter().enumerate() {
                let _ = write!(s, "{}{}", if n > 0 { "," } else { "" }, js(r));
            }
            s.push_str("],\"metrics\":{");
            for (n, (name, _, _, v)) in snap.metrics.iter().enumerate() {
                let _ = write!(s, "{}\"{name}\":{}", if n > 0 { "," } else { "" }, num(*v));
            }
            s.push_str("},\"recent\":[");
            for (n, r) in i.recent.iter().enumerate() {
                let _ = write!(
                    s,
                    "{}{{\"t_ms\":{},\"side\":{},\"type\":\"{}\",\"path\":{},\"size\":{}}}",
                    if n > 0 { "," } else { "" },
                    r.ms,
                    js(&r.side),
                    r.action,
                    js(&r.path),
                    r.size
                );
            }
            s.push_str("],\"errors\":[");
            for (n, e) in i.errs.iter().enumerate() {
                let _ = write!(
                    s,
                    "{}{{\"t_ms\":{},\"side\":{},\"path\":{},\"error\":{}}}",
                    if n > 0 { "," } else { "" },
                    e.ms,
                    js(&e.side),
                    js(&e.path),
                    js(&e.msg)
                );
            }
            s.push_str("],\"failing\":[");
            for (n, ((side, path), (t, msg))) in i.failing.iter().enumerate() {
                let _ = write!(
                    s,
                    "{}{{\"since_ms\":{t},\"side\":{},\"path\":{},\"error\":{}}}",
                    if n > 0 { "," } else { "" },
                    js(side),
                    js(path),
                    js(msg)
                );
            }
            s.push_str("],\"conflicts\":[");
            for (n, c) in i.conflict_list.iter().enumerate() {
                let _ = write!(
                    s,
                    "{}{{\"t_ms\":{},\"side\":{},\"path\":{},\"kept_as\":{}}}",
                    if n > 0 { "," } else { "" },
                    c.ms,
                    js(&c.side),
                    js(&c.path),
                    js(&c.other)
                );
            }
            s.push_str("]}");
            s
        })
    }
}

/// The side an engine error names (`SRC`, `DST`; empty when it does not
/// say), and the error with the operation that met it.
fn side_of(err: &io::Error) -> (&'static str, String) {
    // `No such file or directory`, without Rust's ` (os error 2)`.
    let text = err.to_string();
    let text = match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    };
    match ferry_engine::store::op_of(err) {
        Some((end, op)) => (
            match end {
                Some(End::Src) => "SRC",
                Some(End::Dst) => "DST",
                None => "",
            },
            format!("{op}: {text}"),
        ),
        None => ("", text),
    }
}

/// A reporter that records into a [`Status`] and passes everything on
/// (one-way sync: actions are done on DST).
pub struct Tee<'a> {
    /// Where actions and errors are shown.
    pub inner: &'a dyn Reporter,
    /// Where they are counted.
    pub status: &'a Status,
}

impl Reporter for Tee<'_> {
    fn action(&self, a: Action, path: &[u8], size: u64) {
        self.status.record("DST", a.as_str(), path, size, None);
        self.inner.action(a, path, size);
    }
    fn error(&self, path: &[u8], err: &io::Error) {
        let (side, msg) = side_of(err);
        self.status.failure(side, path, msg);
        self.inner.error(path, err);
    }
    fn skip(&self, path: &[u8], why: &str) {
        self.status
            .record("SRC", Action::Skip.as_str(), path, 0, None);
        self.inner.skip(path, why);
    }
    fn hard_link(&self, path: &[u8], to: &[u8]) {
        self.status
            .record("DST", Action::HardLink.as_str(), path, 0, None);
        self.inner.hard_link(path, to);
    }
    fn kept(&self, path: &[u8], to: &[u8], size: u64) {
        self.status
            .record("DST", Action::Keep.as_str(), path, size, None);
        self.inner.kept(path, to, size);
    }
    fn renamed(&self, path: &[u8], from: &[u8]) {
        self.status
            .record("DST", Action::Rename.as_str(), path, 0, Some(from));
        self.inner.renamed(path, from);
    }
    fn note(&self, msg: &str) {
        self.inner.note(msg);
    }
    fn shows_actions(&self) -> bool {
        self.inner.shows_actions()
    }
}

pub use crate::server::serve;

#[cfg(test)]
mod tests;
