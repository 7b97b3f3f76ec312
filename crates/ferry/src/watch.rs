//! `--watch` for copy, sync and bisync: the flags turned into a
//! `ferry_watch::Config`, the stores opened once, the status server
//! started; the loop itself is `ferry_watch::watch`.

use std::sync::Arc;

use ferry_backends::{AnyStore, Backends, Job, Opts, Root, Watch};
use ferry_engine::Store;
use ferry_watch::{Config, Outcome, Source, Status, Target, Tee, Work};

use crate::args::{KeepArgs, WatchArgs};
use crate::output::{cause, CliReporter, Unreachable};

/// The loop's settings and sources: `local` roots are watched with
/// inotify here, a side whose backend has a [`Source`] (an ssh side
/// served by ferry: the ferry there) by it; any other side is polled (one
/// note says which and why).
fn config(
    reg: &Backends,
    w: &WatchArgs,
    sides: &[(&str, &Root, &AnyStore)],
    guard: &Arc<ferry_engine::Guard>,
    status: &Status,
) -> (Config, Vec<Box<dyn Source>>) {
    let mut local = Vec::new();
    let mut sources: Vec<Box<dyn Source>> = Vec::new();
    // The loop's sides: the local roots, then the sources.
    let (mut names, mut sourced) = (Vec::new(), Vec::new());
    let mut guard_sides = Vec::new();
    let mut polled = false;
    for (i, &(label, r, s)) in sides.iter().enumerate() {
        let name = format!("{label} {}", r.id());
        match reg.watch(r, s, w.poll) {
            Watch::Local(p) => {
                local.push(p);
                names.push(name);
                guard_sides.push(i);
            }
            Watch::Source(src) => {
                sources.push(src);
                sourced.push(name);
            }
            Watch::Polled(why) => {
                polled = true;
                say(&format!(
                    "note: {} is polled every {:?} ({why})",
                    r.id(),
                    w.poll
                ));
            }
        }
    }
    names.extend(sourced);
    status.sides(names);
    let cfg = Config {
        poll: polled.then_some(w.poll),
        local,
        settle: w.settle,
        degraded_poll: w.poll,
        rescan: (!w.rescan.is_zero()).then_some(w.rescan),
        guard: Some(guard.clone()),
        guard_sides,
    };
    (cfg, sources)
}

/// The status page's token: `--status-token`, `--status-token-file`
/// (its first line), or `FERRY_STATUS_TOKEN`.
fn status_token(w: &WatchArgs) -> Result<Option<String>, String> {
    if let Some(t) = &w.status_token {
        return Ok(Some(t.clone()));
    }
    let (t, from) = if let Some(f) = &w.status_token_file {
        let text = std::fs::read_to_string(f)
            .map_err(|e| format!("--status-token-file {}: {}", f.display(), cause(&e)))?;
        // Like ssh with a private key: say when others can read it.
        if let Ok(m) = std::fs::metadata(f) {
            use std::os::unix::fs::PermissionsExt;
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                say(&format!(
                    "note: --status-token-file {}: readable by other users (mode {mode:04o}): chmod 600 it",
                    f.display()
                ));
            }
        }
        (
            text.lines().next().unwrap_or("").trim().to_string(),
            format!("--status-token-file {}", f.display()),
        )
    } else {
        match std::env::var("FERRY_STATUS_TOKEN") {
            Ok(t) => (t.trim().to_string(), "FERRY_STATUS_TOKEN".to_string()),
            Err(_) => return Ok(None),
        }
    };
    if t.is_empty() {
        return Err(format!("{from}: the token is empty"));
    }
    Ok(Some(t))
}

/// Start the status server if asked; a non-loopback address needs a token.
fn status_server(w: &WatchArgs, what: &str) -> Result<Arc<Status>, String> {
    let status = Arc::new(Status::new(what));
    if let Some(addr) = w.status {
        let token = status_token(w)?;
        if !addr.ip().is_loopback() && token.is_none() {
            return Err(format!(
                "--status {addr}: not a loopback address; give a token (--status-token-file FILE, FERRY_STATUS_TOKEN, or --status-token TOKEN) to serve it there"
            ));
        }
        let bound = ferry_watch::status::serve(addr, token, status.clone())
            .map_err(|e| format!("--status {addr}: {}", cause(&e)))?;
        eprintln!("ferry: status on http://{bound}/ (metrics: /metrics)");
    }
    Ok(status)
}

fn say(msg: &str) {
    eprintln!(
        "ferry: {}",
        ferry_engine::encode::text_name_string(msg.as_bytes())
    );
}

/// A target whose JSON lines and action lines are written out after each
/// run, for scripts and journals reading them as they come.
/// With `--versions` and a retention policy, kept versions are pruned after
/// each run that kept one: in the directories it kept them in, and the
/// whole tree (a walk of every version) after the first run and then at
/// most every [`PRUNE_EVERY`], after a run; never on a timer: an idle
/// watch costs nothing.
struct Flushed<'a, T: Target> {
    t: T,
    reg: &'a Backends,
    rep: &'a CliReporter,
    prune: Option<&'a KeepArgs>,
    /// When the whole tree was last pruned (`None`: not yet).
    pruned: Option<std::time::Instant>,
    /// The replicas pruned (DST, or A and B).
    roots: Vec<&'a Root>,
    /// The run's sides: one whose connection was lost is connected again
    /// before the next run ([`refresh`]).
    sides: Vec<(&'a Root, &'a AnyStore)>,
}

/// Before a run: connect again each ssh/sftp side whose connection was
/// lost (never in the middle of a run). `Ok(true)`: one was made again,
/// and a change there (or a run's undone work) may have been missed
/// while it was gone: this run is a full one. `Err`: one line saying why
/// a side cannot be reached; the run fails, the next one tries again.
fn refresh(reg: &Backends, sides: &[(&Root, &AnyStore)]) -> Result<bool, String> {
    let mut again = false;
    for (r, s) in sides {
        again |= reg.refresh(r, s)?;
    }
    Ok(again)
}

/// How often, at most, a watch prunes its whole versions tree (its runs
/// prune where they kept).
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

impl<'a, T: Target> Flushed<'a, T> {
    /// `t`'s runs over `sides`, pruning the versions of `roots`.
    fn new(
        t: T,
        (reg, rep): (&'a Backends, &'a CliReporter),
        keep: &'a KeepArgs,
        roots: Vec<&'a Root>,
        sides: Vec<(&'a Root, &'a AnyStore)>,
    ) -> Self {
        Flushed {
            t,
            reg,
            rep,
            prune: keep.versions.then_some(keep),
            pruned: None,
            roots,
            sides,
        }
    }
}

impl<T: Target> Target for Flushed<'_, T> {
    fn run(&mut self, w: &Work) -> Outcome {
        let full;
        let w = match refresh(self.reg, &self.sides) {
            Ok(false) => w,
            Ok(true) => {
                full = Work {
                    full: true,
                    ..Work::default()
                };
                &full
            }
            Err(why) => {
                self.rep.flush();
                return Outcome {
                    failed: Some(format!("{why} (watching on)")),
                    ..Outcome::default()
                };
            }
        };
        let o = self.t.run(w);
        if let Some(keep) = self.prune {
            let (reg, roots) = (self.reg, &self.roots);
            let dirs = self.rep.take_kept_dirs();
            if self.pruned.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
                crate::versions::after_run(reg, roots, keep, false, self.rep);
                self.pruned = Some(std::time::Instant::now());
            } else if !dirs.is_empty() {
                crate::versions::after_run_in(reg, roots, keep, &dirs, self.rep);
            }
        }
        self.rep.flush();
        o
    }
}

/// `copy --watch` / `sync --watch`.
pub fn sync(
    reg: &Backends,
    w: &WatchArgs,
    keep: &KeepArgs,
    job: &Job,
    opts: &ferry_engine::Options,
    rep: &CliReporter,
) -> Result<u8, String> {
    if job.one.is_some() {
        return Err("--watch needs a directory (or prefix) as SRC, not one file".into());
    }
    if opts.dry_run {
        return Err("--watch and --dry-run do not go together".into());
    }
    let o = Opts {
        jobs: opts.jobs,
        lazy_meta: true,
        walk: false,
    };
    let s = reg.open(&job.src, &o)?;
    let d = reg.open(&job.dst, &o)?;
    crate::check_keep(opts, &d, &job.dst).map_err(|e| e.to_string())?;
    let status = status_server(w, &format!("{} -> {}", job.src.id(), job.dst.id()))?;
    let gate = Unreachable::new(rep);
    // The status sees every error; each is said once (`retry::Quiet`).
    let failures = ferry_watch::retry::Failures::default();
    let quiet = ferry_watch::retry::Quiet {
        inner: &gate,
        failures: &failures,
    };
    let tee = Tee {
        inner: &quiet,
        status: &status,
    };
    let describe = |e: &std::io::Error| cause(e);
    // The roots' identity as the watch starts: every run checks it.
    let guard = Arc::new(ferry_engine::Guard::default());
    if let Ok(Some((_, m))) = s.open_root() {
        guard.seen(0, &m);
    }
    if let Ok(Some((_, m))) = d.open_root() {
        guard.seen(1, &m);
    }
    let mut target = Flushed::new(
        ferry_watch::sync::SyncTarget::<AnyStore, AnyStore> {
            src: &s,
            dst: &d,
            opts,
            rep: &tee,
            describe: &describe,
            guard: &guard,
            live: Some(&status),
            failures: &failures,
        },
        (reg, rep),
        keep,
        vec![&job.dst],
        vec![(&job.src, &s), (&job.dst, &d)],
    );
    // Only SRC is watched: DST is ferry's to write.
    let (cfg, sources) = config(reg, w, &[("SRC", &job.src, &s)], &guard, &status);
    let code = ferry_watch::watch_with(&cfg, sources, &mut target, &status, &say);
    status.stopped();
    gate.finish();
    Ok(code)
}

/// bisync as a watch target: a whole bisync run first (with `--resync`
/// if asked), and whenever the loop asks for one (an overflow, a root
/// back, a poll, a reconnected side, a scoped run that failed); otherwise
/// a scoped bisync of the directories that changed
/// ([`ferry_bisync::run_scoped`]), or a whole one when it cannot tell.
struct Bisync<'a> {
    a: &'a AnyStore,
    b: &'a AnyStore,
    journal: Option<&'a mut ferry_bisync::Journal>,
    opts: ferry_bisync::Options,
    rep: &'a Unreachable<'a>,
    status: &'a Status,
    cli: &'a CliReporter,
    /// The paths failing (each error said once, retried by the loop).
    failures: ferry_watch::retry::Failures,
}

/// A bisync reporter that says each failing path's error once
/// (`ferry_watch::retry::Failures`).
struct QuietBi<'a> {
    inner: &'a dyn ferry_bisync::BiReporter,
    failures: &'a ferry_watch::retry::Failures,
}

impl ferry_bisync::BiReporter for QuietBi<'_> {
    fn action(
        &self,
        act: ferry_bisync::BiAction,
        on: ferry_bisync::Side,
        path: &[u8],
        other: Option<&[u8]>,
        size: u64,
    ) {
        self.inner.action(act, on, path, other, size)
    }

    fn error(&self, path: &[u8], err: &std::io::Error) {
        // An entry gone is no failing path (its removal is a change).
        if err.kind() == std::io::ErrorKind::NotFound || self.failures.failed(path, err.to_string())
        {
            self.inner.error(path, err)
        }
    }

    fn error_on(&self, on: ferry_bisync::Side, path: &[u8], err: &std::io::Error) {
        if err.kind() == std::io::ErrorKind::NotFound
            || self
                .failures
                .failed(path, format!("{}: {err}", on.as_str()))
        {
            self.inner.error_on(on, path, err)
        }
    }

    fn skip(&self, on: ferry_bisync::Side, path: &[u8], why: &str) {
        self.inner.skip(on, path, why)
    }

    fn note(&self, msg: &str) {
        self.inner.note(msg)
    }
}

impl Bisync<'_> {
    /// The scoped run of `w`: `None` when a whole run must do it.
    fn scoped(
        &mut self,
        w: &Work,
        stats: &ferry_engine::Stats,
        rep: &dyn ferry_bisync::BiReporter,
    ) -> Option<Result<ferry_bisync::Outcome, ferry_bisync::Refused>> {
        if w.full || self.opts.resync {
            return None;
        }
        let j = self.journal.as_deref_mut()?;
        let mut dirs = w.scope.dirs.clone();
        // A renamed directory's new place is compared whole.
        for (_, to, isdir) in &w.renames {
            if *isdir {
                dirs.push((to.clone(), true));
            }
        }
        ferry_bisync::run_scoped(self.a, self.b, j, &self.opts, rep, stats, &dirs).transpose()
    }
}

/// A bisync reporter that records into the [`Status`] (each action and
/// error with its side, conflicts apart) and passes everything on.
struct BiTee<'a> {
    inner: &'a dyn ferry_bisync::BiReporter,
    status: &'a Status,
}

impl ferry_bisync::BiReporter for BiTee<'_> {
    fn action(
        &self,
        act: ferry_bisync::BiAction,
        on: ferry_bisync::Side,
        path: &[u8],
        other: Option<&[u8]>,
        size: u64,
    ) {
        self.status
            .record(on.as_str(), act.as_str(), path, size, other);
        ferry_bisync::BiReporter::action(self.inner, act, on, path, other, size)
    }

    fn error(&self, path: &[u8], err: &std::io::Error) {
        self.status.failure("", path, cause(err));
        ferry_bisync::BiReporter::error(self.inner, path, err)
    }

    fn error_on(&self, on: ferry_bisync::Side, path: &[u8], err: &std::io::Error) {
        let msg = match ferry_engine::store::op_of(err) {
            Some((_, op)) => format!("{op}: {}", cause(err)),
            None => cause(err),
        };
        self.status.failure(on.as_str(), path, msg);
        ferry_bisync::BiReporter::error_on(self.inner, on, path, err)
    }

    fn skip(&self, on: ferry_bisync::Side, path: &[u8], why: &str) {
        self.status.record(on.as_str(), "skip", path, 0, None);
        ferry_bisync::BiReporter::skip(self.inner, on, path, why)
    }

    fn note(&self, msg: &str) {
        ferry_bisync::BiReporter::note(self.inner, msg)
    }
}

impl Target for Bisync<'_> {
    fn run(&mut self, w: &Work) -> Outcome {
        // Each run keeps with a keeper of its own: versions are named by
        // that run's time.
        for k in self.opts.keep.iter_mut().flatten() {
            *k = ferry_engine::keep::Keeper::new(k.rule.clone(), crate::args::now_unix());
        }
        // The run's counters are the status's (its progress).
        let stats = self.status.run_stats();
        let mut scoped = true;
        // The status sees every error; each is said once (`QuietBi`).
        let failures = std::mem::take(&mut self.failures);
        let quiet = QuietBi {
            inner: self.rep,
            failures: &failures,
        };
        let tee = BiTee {
            inner: &quiet,
            status: self.status,
        };
        let res = match self.scoped(w, &stats, &tee) {
            Some(r) => r,
            None => {
                scoped = false;
                // What a scoped attempt counted is not this run's.
                let stats = self.status.fresh_run_stats();
                ferry_bisync::run(
                    self.a,
                    self.b,
                    self.journal.as_deref_mut(),
                    &self.opts,
                    &tee,
                    &stats,
                )
            }
        };
        let full = Work {
            full: true,
            ..Work::default()
        };
        // A run a signal stopped reached only some paths: none is healed.
        let done = !self.opts.stopping();
        let (failing, healed) = failures.end_run(if scoped { w } else { &full }, done);
        self.failures = failures;
        self.opts.resync = false;
        if let Ok(o) = &res {
            self.cli.watch_summary(o, scoped);
        }
        match res {
            Ok(out) => Outcome {
                errors: out.errors,
                failing,
                healed,
                ..Outcome::default()
            },
            // bisync's refusals include a side that failed to answer: a full
            // run follows a scoped one that ends so.
            Err(r) => Outcome {
                failed: Some(format!("{} (watching on)", r.0)),
                refused: false,
                ..Outcome::default()
            },
        }
    }
}

/// The two sides of a bisync: their roots and stores (A's, B's).
pub struct Sides<'a> {
    pub roots: (&'a Root, &'a Root),
    pub stores: (&'a AnyStore, &'a AnyStore),
}

/// Where a bisync's lines go: the reporter that tells a lost server once,
/// and the terminal's.
pub struct Out<'a> {
    pub rep: &'a Unreachable<'a>,
    pub cli: &'a CliReporter,
}

/// `bisync --watch`: both sides watched (or polled), a bisync per batch.
pub fn bisync(
    reg: &Backends,
    w: &WatchArgs,
    keep: &KeepArgs,
    Sides { roots, stores }: Sides<'_>,
    journal: Option<&mut ferry_bisync::Journal>,
    opts: ferry_bisync::Options,
    Out { rep, cli }: Out<'_>,
) -> Result<u8, String> {
    if opts.dry_run {
        return Err("--watch and --dry-run do not go together".into());
    }
    let status = status_server(w, &format!("{} <-> {}", roots.0.id(), roots.1.id()))?;
    // Each root's identity as the watch starts: every run checks it.
    let mut opts = opts;
    let guard = std::sync::Arc::new(ferry_engine::Guard::default());
    for (side, s) in [stores.0, stores.1].into_iter().enumerate() {
        if let Ok(Some((_, m))) = s.open_root() {
            guard.seen(side, &m);
        }
    }
    opts.guard = Some(guard.clone());
    let mut target = Flushed::new(
        Bisync {
            a: stores.0,
            b: stores.1,
            journal,
            opts,
            rep,
            status: &status,
            cli,
            failures: ferry_watch::retry::Failures::default(),
        },
        (reg, cli),
        keep,
        vec![roots.0, roots.1],
        vec![(roots.0, stores.0), (roots.1, stores.1)],
    );
    let (cfg, sources) = config(
        reg,
        w,
        &[("A", roots.0, stores.0), ("B", roots.1, stores.1)],
        &guard,
        &status,
    );
    let code = ferry_watch::watch_with(&cfg, sources, &mut target, &status, &say);
    status.stopped();
    Ok(code)
}
