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

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_engine::store::End;
use ferry_engine::{Action, Reporter, Stats};

use crate::{Change, Outcome, Work};

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
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
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

    /// The page.
    pub fn page(&self) -> String {
        let snap = self.snap();
        let now = now_ms();
        let m = |name: &str| {
            snap.metrics
                .iter()
                .find(|x| x.0 == name)
                .map_or(0.0, |x| x.3)
        };
        self.with(|i| {
            let mut h = String::with_capacity(16 << 10);
            h.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"2\"><meta name=\"viewport\" content=\"width=device-width\"><title>ferry watch</title><style>\
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 1.5em;color:#222;max-width:70em}\
h1{font-size:1.3em;margin:0}h2{font-size:1.05em;margin:1.2em 0 .3em}\
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd;vertical-align:top}\
.num{text-align:right;font-variant-numeric:tabular-nums}.path{font-family:monospace;word-break:break-all}\
#state{padding:.6em 1em;border-radius:6px;margin:.8em 0;font-size:1.15em}\
.in_sync{background:#e3f4e1;border-left:6px solid #2e8b3a}.syncing{background:#e4eefb;border-left:6px solid #2a6fdb}\
.degraded{background:#fdecd9;border-left:6px solid #d9822b}.stopped{background:#eee;border-left:6px solid #777}\
#state ul{margin:.3em 0 0;font-size:.85em}svg{background:#f7f7f7}.muted{color:#777}.bad{color:#b3261e}\
</style></head><body>");
            let _ = write!(h, "<h1>ferry watch</h1><p id=\"what\" class=\"path\">{}</p>", esc(&i.what));
            // The state.
            let st = snap.state.as_str();
            let title = match snap.state {
                State::InSync => "In sync".to_string(),
                State::Syncing => "Syncing".to_string(),
                State::Degraded => "Degraded".to_string(),
                State::Stopped if i.stopped => "Stopped".to_string(),
                State::Stopped => "Stopping after the entry in flight".to_string(),
            };
            let _ = write!(h, "<div id=\"state\" class=\"{st}\" data-state=\"{st}\"><b>{title}</b>");
            if let Some((files, bytes, eta)) = snap.progress {
                let _ = write!(
                    h,
                    " <span id=\"progress\">run in flight: <span data-metric=\"ferry_watch_run_remaining_files\" data-value=\"{files}\">{}</span> {}, <span data-metric=\"ferry_watch_run_remaining_bytes\" data-value=\"{bytes}\">{}</span> left to copy (of what it has found so far), ETA <span data-metric=\"ferry_watch_run_eta_seconds\" data-value=\"{}\">{}</span></span>",
                    count(files),
                    if files == 1 { "file" } else { "files" },
                    bytes_h(bytes),
                    num(m("ferry_watch_run_eta_seconds")),
                    eta.map_or("unknown".to_string(), dur_h)
                );
            } else if snap.state == State::InSync {
                let _ = write!(
                    h,
                    " <span class=\"muted\">last run ended {}</span>",
                    i.last_run_end.map_or("-".to_string(), when)
                );
            }
            let q = m("ferry_watch_queue_length") as u64;
            if q > 0 {
                let _ = write!(h, " <span>(<span data-metric=\"ferry_watch_queue_length\" data-value=\"{q}\">{}</span> changed paths waiting)</span>", count(q));
            }
            if !snap.reasons.is_empty() {
                h.push_str("<ul id=\"reasons\">");
                for r in &snap.reasons {
                    let _ = write!(h, "<li>{}</li>", esc(r));
                }
                h.push_str("</ul>");
            }
            if i.conflicts > 0 {
                let _ = write!(
                    h,
                    "<div id=\"conflict-note\">{} since the watch began: both versions are kept (below)</div>",
                    plural(i.conflicts, "conflict", "conflicts")
                );
            }
            h.push_str("</div>");
            // The counters.
            let lat = i.last_latency.map_or("-".to_string(), dur_h);
            #[rustfmt::skip]
            let rows: [(&str, &str, String); 13] = [
                ("files moved", "ferry_watch_transferred_files_total", count(i.files)),
                ("bytes moved", "ferry_watch_transferred_bytes_total", bytes_h(i.bytes)),
                ("errors", "ferry_watch_errors_total", count(i.entry_errors + i.refused)),
                ("of which runs refused", "ferry_watch_refused_runs_total", count(i.refused)),
                ("failing paths", "ferry_watch_failing_paths", count(i.failing.len() as u64)),
                ("conflicts", "ferry_watch_conflicts_total", count(i.conflicts)),
                ("queue (changed paths waiting)", "ferry_watch_queue_length", count(q)),
                ("runs", "ferry_watch_runs_total", count(i.runs)),
                ("of which full runs", "ferry_watch_full_runs_total", count(i.full_runs)),
                ("directories watched", "ferry_watch_watched_directories", count(m("ferry_watch_watched_directories") as u64)),
                ("directories without a watch", "ferry_watch_unwatched_directories", count(m("ferry_watch_unwatched_directories") as u64)),
                ("last change to synced", "ferry_watch_last_change_latency_seconds", lat),
                ("last run ended", "ferry_watch_last_run_end_time_seconds", i.last_run_end.map_or("-".to_string(), when)),
            ];
            h.push_str("<table id=\"counters\">");
            for (label, name, shown) in rows {
                let v = num(m(name));
                let _ = write!(h, "<tr><th>{label}</th><td class=\"num\" data-metric=\"{name}\" data-value=\"{v}\" title=\"{name} {v}\">{}</td></tr>", esc(&shown));
            }
            h.push_str("</table>");
            h.push_str("<h2>Throughput, last 5 minutes</h2>");
            chart(&mut h, &i.series, now / 1000);
            // Conflicts, failing paths.
            if !i.conflict_list.is_empty() {
                h.push_str("<h2>Conflicts</h2><table id=\"conflicts\"><tr><th>time</th><th>side</th><th>path</th><th>the other version kept as</th></tr>");
                for c in i.conflict_list.iter().rev() {
                    let _ = write!(h, "<tr><td>{}</td><td>{}</td><td class=\"path\">{}</td><td class=\"path\">{}</td></tr>", when(c.ms), esc(&c.side), esc(&c.path), esc(&c.other));
                }
                h.push_str("</table>");
            }
            if !i.failing.is_empty() {
                h.push_str("<h2>Failing paths</h2><table id=\"failing\"><tr><th>since</th><th>side</th><th>path</th><th>error</th></tr>");
                for ((side, path), (t, msg)) in &i.failing {
                    let _ = write!(h, "<tr><td>{}</td><td>{}</td><td class=\"path\">{}</td><td class=\"bad\">{}</td></tr>", when(*t), esc(side), esc(path), esc(msg));
                }
                h.push_str("</table>");
            }
            h.push_str("<h2>Recent</h2><table id=\"recent\"><tr><th>time</th><th>side</th><th>action</th><th>path</th><th class=\"num\">size</th></tr>");
            for r in i.recent.iter().rev() {
                let _ = write!(h, "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"path\">{}</td><td class=\"num\" title=\"{} bytes\">{}</td></tr>", when(r.ms), esc(&r.side), r.action, esc(&r.path), r.size, if r.size > 0 || matches!(r.action, "copy" | "update") { bytes_h(r.size) } else { String::new() });
            }
            h.push_str("</table><h2>Errors</h2><table id=\"errors\"><tr><th>time</th><th>side</th><th>path</th><th>error</th></tr>");
            for e in i.errs.iter().rev() {
                let _ = write!(h, "<tr><td>{}</td><td>{}</td><td class=\"path\">{}</td><td class=\"bad\">{}</td></tr>", when(e.ms), esc(&e.side), esc(&e.path), esc(&e.msg));
            }
            let _ = write!(h, "</table><p class=\"muted\">watching since <span data-metric=\"ferry_watch_start_time_seconds\" data-value=\"{}\">{}</span>; times are the host's local time; this page reloads every 2 s. Also: <a href=\"metrics\">/metrics</a>, <a href=\"status.json\">/status.json</a>.</p></body></html>", i.started / 1000, when(i.started));
            h
        })
    }
}

/// A metric's value as the text format writes it: integers without a
/// fraction.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.6}")
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", count(n), if n == 1 { one } else { many })
}

/// A count, humanised: `950`, `1.2k`, `3.4M`.
pub fn count(n: u64) -> String {
    match n {
        0..1000 => n.to_string(),
        1000..999_950 => format!("{:.1}k", n as f64 / 1e3),
        999_950..999_950_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.1}G", n as f64 / 1e9),
    }
}

/// Bytes, humanised (binary units): `512 B`, `4.0 KiB`, `1.2 GiB`.
pub fn bytes_h(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1023.95 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A duration, humanised: `0.4 ms`, `31.7 ms`, `2.3 s`, `4 min 5 s`, `2 h 3 min`.
pub fn dur_h(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{} min {} s", s as u64 / 60, s as u64 % 60)
    } else {
        format!("{} h {} min", s as u64 / 3600, s as u64 / 60 % 60)
    }
}

/// A unix time in ms as the host's local date and time, with its zone:
/// `2026-11-27 10:42:03 CET`.
fn when(ms: u64) -> String {
    let Ok(t) = jiff::Timestamp::from_millisecond(ms as i64) else {
        return ms.to_string();
    };
    t.to_zoned(jiff::tz::TimeZone::system())
        .strftime("%Y-%m-%d %H:%M:%S %Z")
        .to_string()
}

/// A round maximum for the chart's scale, at or above `v`: 1, 2 or 5 times
/// a power of 10 of the binary unit it is shown in (`500 KiB`, `2 MiB`).
fn nice(v: u64) -> u64 {
    let mut unit = 1u64;
    while v / unit >= 1024 && unit < 1 << 50 {
        unit <<= 10;
    }
    nice10(v.div_ceil(unit)).saturating_mul(unit)
}

/// 1, 2 or 5 times a power of 10, at or above `v`.
fn nice10(v: u64) -> u64 {
    let mut p = 1u64;
    loop {
        for m in [1, 2, 5] {
            if p.saturating_mul(m) >= v {
                return p.saturating_mul(m);
            }
        }
        p = p.saturating_mul(10);
    }
}

/// The throughput chart: one point per second of the last 5 minutes,
/// seconds without transfers at zero; its scale is that of what it shows.
fn chart(h: &mut String, series: &VecDeque<(u64, u64)>, now: u64) {
    let (w, ht) = (600.0, 150.0);
    let start = now.saturating_sub(SERIES_SECS);
    let shown = || series.iter().filter(|s| s.0 >= start && s.0 <= now);
    let max = nice(shown().map(|s| s.1).max().unwrap_or(0).max(1));
    let mut pts = String::new();
    let mut it = shown().peekable();
    for sec in start..=now {
        while it.peek().is_some_and(|s| s.0 < sec) {
            it.next();
        }
        let v = match it.peek() {
            Some(s) if s.0 == sec => s.1,
            _ => 0,
        };
        let x = (sec - start) as f64 * w / SERIES_SECS as f64;
        let y = ht - v as f64 * (ht - 10.0) / max as f64;
        let _ = write!(pts, "{x:.1},{y:.1} ");
    }
    let _ = write!(
        h,
        "<svg id=\"throughput\" width=\"{w}\" height=\"{}\" viewBox=\"0 0 {w} {}\" role=\"img\" aria-label=\"bytes per second, last 5 minutes\" data-max=\"{max}\"><line x1=\"0\" x2=\"{w}\" y1=\"10\" y2=\"10\" stroke=\"#ddd\"/><line x1=\"0\" x2=\"{w}\" y1=\"{}\" y2=\"{}\" stroke=\"#eee\"/><polyline fill=\"none\" stroke=\"#2a6fdb\" stroke-width=\"1.5\" points=\"{}\"/><text x=\"4\" y=\"22\" font-size=\"11\">{}/s</text><text x=\"4\" y=\"{}\" font-size=\"11\">-5 min</text><text x=\"{}\" y=\"{}\" font-size=\"11\">now</text></svg>",
        ht + 14.0,
        ht + 14.0,
        10.0 + (ht - 10.0) / 2.0,
        10.0 + (ht - 10.0) / 2.0,
        pts.trim_end(),
        bytes_h(max),
        ht + 12.0,
        w - 24.0,
        ht + 12.0
    );
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn js(s: &str) -> String {
    let mut o = Vec::new();
    ferry_engine::encode::json_string(&mut o, s);
    String::from_utf8(o).unwrap_or_default()
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
mod tests {
    use super::*;

    /// Every figure the page shows names its metric and carries its
    /// exact value.
    fn page_figures(page: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut rest = page;
        while let Some(i) = rest.find("data-metric=\"") {
            rest = &rest[i + 13..];
            let name = rest[..rest.find('"').unwrap()].to_string();
            let j = rest.find("data-value=\"").unwrap();
            let v = &rest[j + 12..];
            out.push((name, v[..v.find('"').unwrap()].to_string()));
        }
        out
    }

    fn metric(text: &str, name: &str) -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
            .to_string()
    }

    #[test]
    fn every_figure_on_the_page_is_a_metric_with_the_same_value() {
        let s = Status::new("a -> b");
        s.watched(3);
        s.run_started(
            &Work {
                full: true,
                ..Work::default()
            },
            0,
        );
        s.record("DST", "copy", b"x", 5000, None);
        s.failure("DST", b"y", "open: Permission denied".into());
        s.run_done(Duration::from_millis(12), &Outcome::default(), 0);
        s.run_started(&Work::default(), 0);
        s.run_done(
            Duration::from_millis(3),
            &Outcome {
                failed: Some("refused: SRC is empty".into()),
                refused: true,
                ..Outcome::default()
            },
            0,
        );
        let (page, text) = (s.page(), s.metrics());
        let figs = page_figures(&page);
        assert!(figs.len() >= 13, "{figs:?}");
        for (name, v) in figs {
            assert_eq!(metric(&text, &name), v, "{name}");
        }
        // The refusal counts as an error, and in its own counter.
        assert_eq!(metric(&text, "ferry_watch_errors_total"), "2");
        assert_eq!(metric(&text, "ferry_watch_refused_runs_total"), "1");
        assert_eq!(metric(&text, "ferry_watch_failing_paths"), "1");
        assert_eq!(metric(&text, "ferry_watch_state{state=\"degraded\"}"), "1");
        assert!(page.contains("data-state=\"degraded\"") && page.contains("SRC is empty"));
        assert!(page.contains("4.9 KiB"), "humanised");
    }

    #[test]
    fn a_path_that_fails_is_listed_until_a_run_of_its_directory_succeeds() {
        let s = Status::new("a -> b");
        s.run_started(&Work::default(), 0);
        s.failure("DST", b"d/f", "x".into());
        s.run_done(Duration::ZERO, &Outcome::default(), 0);
        assert_eq!(s.state(), State::Degraded);
        // A run of another directory: still failing.
        let mut w = Work::default();
        w.scope.dirs.push((b"e".to_vec(), false));
        s.run_started(&w, 0);
        s.run_done(Duration::ZERO, &Outcome::default(), 0);
        assert_eq!(s.state(), State::Degraded);
        let mut w = Work::default();
        w.scope.dirs.push((b"d".to_vec(), false));
        s.run_started(&w, 0);
        s.run_done(Duration::ZERO, &Outcome::default(), 0);
        assert_eq!(s.state(), State::InSync);
    }

    #[test]
    fn states() {
        let s = Status::new("a -> b");
        assert_eq!(s.state(), State::InSync);
        s.run_started(&Work::default(), 0);
        assert_eq!(s.state(), State::Syncing);
        s.run_done(Duration::ZERO, &Outcome::default(), 0);
        s.change(&Change::Gone(0));
        assert_eq!(s.state(), State::Degraded);
        s.change(&Change::Back(0));
        assert_eq!(s.state(), State::InSync);
        s.change(&Change::Overflow(0));
        assert_eq!(s.state(), State::Degraded);
        s.run_started(
            &Work {
                full: true,
                ..Work::default()
            },
            0,
        );
        s.run_done(Duration::ZERO, &Outcome::default(), 0);
        assert_eq!(s.state(), State::InSync);
        s.gauges().arrived(2);
        assert_eq!(s.state(), State::Syncing);
        s.gauges().taken(2);
        s.stopping();
        assert_eq!(s.state(), State::Stopped);
    }

    #[test]
    fn a_run_in_flight_shows_what_is_left_and_feeds_the_chart_as_it_moves() {
        let s = Status::new("a -> b");
        s.run_started(&Work::default(), 0);
        let st = s.run_stats();
        Stats::add(&st.files_planned, 3);
        Stats::add(&st.bytes_planned, 3 << 20);
        Stats::add(&st.files_copied, 1);
        Stats::add(&st.bytes_moved, 1 << 20);
        let text = s.metrics();
        assert_eq!(metric(&text, "ferry_watch_run_remaining_files"), "2");
        assert_eq!(
            metric(&text, "ferry_watch_run_remaining_bytes"),
            (2u64 << 20).to_string()
        );
        assert_eq!(metric(&text, "ferry_watch_state{state=\"syncing\"}"), "1");
        let page = s.page();
        assert!(page.contains("2.0 MiB</span> left"), "{page}");
        // The mebibyte moved is on the chart before the copy ends.
        assert_eq!(
            s.with(|i| i.series.iter().map(|x| x.1).sum::<u64>()),
            1 << 20
        );
        // Spread over the seconds it took, in order.
        s.with(|i| {
            i.sampled_sec -= 4;
            Stats::add(&st.bytes_moved, 4000);
            sample(i, now_ms() / 1000);
            assert!(
                i.series.iter().filter(|x| x.1 == 1000).count() >= 3,
                "{:?}",
                i.series
            );
            assert!(i
                .series
                .iter()
                .zip(i.series.iter().skip(1))
                .all(|(a, b)| a.0 < b.0));
        });
    }

    #[test]
    fn hostile_names_are_shown_escaped_everywhere() {
        let s = Status::new("<i>a</i> -> b");
        let name: &[u8] = b"<script>alert(1)</script>\n\"&'\xff";
        s.run_started(&Work::default(), 0);
        s.record("DST", "copy", name, 1, None);
        s.failure("DST", name, "<em>".into());
        s.record("B", "conflict", name, 1, Some(name));
        s.run_done(Duration::ZERO, &Outcome::default(), 0);
        let page = s.page();
        assert!(!page.contains("<script>") && !page.contains("<em>") && !page.contains("<i>"));
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;\n&quot;&amp;&#39;\u{fffd}"),
            "{page}"
        );
        let json = s.json();
        assert!(json.contains("\\n\\\"&'\u{fffd}"), "{json}");
        assert!(!json.contains('\n'), "one line: {json}");
    }

    #[test]
    fn an_engine_error_names_its_side_and_operation() {
        let e =
            ferry_engine::store::op_err(io::Error::from_raw_os_error(1), Some(End::Dst), "rename");
        assert_eq!(
            side_of(&e),
            ("DST", "rename: Operation not permitted".to_string())
        );
        assert_eq!(
            side_of(&io::Error::from_raw_os_error(2)).1,
            "No such file or directory"
        );
    }

    #[test]
    fn humanised() {
        assert_eq!(count(999), "999");
        assert_eq!(count(1234), "1.2k");
        assert_eq!(count(6927), "6.9k");
        assert_eq!(bytes_h(1023), "1023 B");
        assert_eq!(bytes_h(4099), "4.0 KiB");
        assert_eq!(bytes_h(200 << 20), "200.0 MiB");
        assert_eq!(dur_h(Duration::from_micros(31_700)), "31.7 ms");
        assert_eq!(dur_h(Duration::from_secs(125)), "2 min 5 s");
    }

    #[test]
    fn the_charts_scale_follows_what_it_shows() {
        let mut series = VecDeque::new();
        series.push_back((1000, 50 << 20));
        series.push_back((1400, 3000));
        let mut h = String::new();
        // The 50 MiB second is out of the window: the scale is 3000's.
        chart(&mut h, &series, 1400);
        assert!(
            h.contains("data-max=\"5120\"") && h.contains(">5.0 KiB/s<"),
            "{h}"
        );
        assert_eq!(nice(262_144), 500 << 10);
        assert_eq!(nice(1000), 1000);
        assert_eq!(nice(3 << 20), 5 << 20);
    }
}
