//! `ferry`: the command line. Parses flags, resolves what SRC and DST mean,
//! wires the engine to the terminal (progress, JSON lines, exit codes).
//! All the work happens in `ferry-engine`.

mod args;
mod filter_args;
mod generate;
mod output;
mod versions;
mod watch;

use parking_lot::Mutex;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;
use std::time::Instant;

use ferry_backends::{identity, AnyStore, Backends, Job, Location, Opts};
use ferry_engine::encode::text_name_string;
use ferry_engine::ls::{list_tree, Format};
use ferry_engine::prefetch::Prefetch;
use ferry_engine::store::StoreExt as _;
use ferry_engine::xattr::XattrSel;
use ferry_engine::Store as _;
use ferry_engine::{Engine, Reporter, Stats};

use args::{BisyncArgs, Cli, Command, LsArgs, SyncArgs};
use output::{cause, CliReporter, Progress, Unreachable};

fn main() -> ExitCode {
    started();
    if let Some((guard, walk)) = serve_args(std::env::args_os().skip(1)) {
        raise_fd_limit();
        return exit(serve(guard, walk), None, started());
    }
    if let Some(code) = generate::requested() {
        return code;
    }
    let cli = match <Cli as clap::Parser>::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Usage errors exit 2; --help and --version exit 0.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    raise_fd_limit();
    let start = started();
    // (dry run, bisync) of a run whose refusal gets a JSON summary.
    let json = match &cli.command {
        Command::Copy(a) | Command::Sync(a) => a.out.json.then_some((a.dry_run, false)),
        Command::Bisync(a) => a.out.json.then_some((a.dry_run, true)),
        Command::Ls(_) | Command::Cleanup(_) | Command::Serve { .. } => None,
        Command::Versions(_) | Command::Restore(_) => None,
    };
    // Read-only commands never act on (nor remove) a rollback record a
    // killed run left: they list what is there.
    let read_only = match &cli.command {
        Command::Copy(a) | Command::Sync(a) => a.dry_run,
        Command::Bisync(a) => a.dry_run,
        Command::Restore(a) => a.dry_run,
        Command::Ls(_) | Command::Versions(_) => true,
        Command::Cleanup(_) | Command::Serve { .. } => false,
    };
    // This run's registry: every backend's settings, from the command line.
    let set = |tx: &args::TransferArgs, keeps| tx.settings(keeps, cli.timeout, read_only);
    let reg = Backends::new(match &cli.command {
        Command::Copy(a) | Command::Sync(a) => {
            set(&a.tx, args::only_ferry_keeps(a.hard_links, &a.attrs))
        }
        Command::Bisync(a) => set(&a.tx, args::only_ferry_keeps(false, &a.attrs)),
        Command::Ls(a) => set(&a.tx, Vec::new()),
        Command::Versions(a) => set(&a.tx, Vec::new()),
        Command::Restore(a) => set(&a.tx, Vec::new()),
        Command::Cleanup(a) => ferry_backends::Settings {
            s3_endpoint: a.s3_endpoint.clone(),
            timeout: cli.timeout,
            ..Default::default()
        },
        Command::Serve { .. } => Default::default(),
    });
    let res = match cli.command {
        Command::Copy(a) => run_sync(a, ferry_engine::Mode::Copy, &reg),
        Command::Sync(a) => run_sync(a, ferry_engine::Mode::Sync, &reg),
        Command::Ls(a) => run_ls(a, &reg),
        Command::Cleanup(a) => run_cleanup(a, &reg),
        Command::Bisync(a) => run_bisync(a, &reg),
        Command::Serve {
            start_guard,
            walk_ahead,
        } => serve(start_guard, walk_ahead),
        Command::Versions(a) => versions::run_versions(a, &reg),
        Command::Restore(a) => versions::run_restore(a, &reg),
    };
    exit(res, json, start)
}

/// The exit code of a command's result; a usage or configuration error
/// said (`json`: in a refused summary as well).
fn exit(res: Result<u8, String>, json: Option<(bool, bool)>, start: Instant) -> ExitCode {
    ferry_backends::close_all();
    match res {
        Ok(code) => ExitCode::from(code),
        Err(msg) => {
            // The message may hold names: escaped like every other line.
            eprintln!("ferry: {}", text_name_string(msg.as_bytes()));
            if let Some((dry_run, bisync)) = json {
                output::refused_summary(dry_run, bisync, start.elapsed(), &msg);
            }
            ExitCode::from(2)
        }
    }
}

/// What `ferry serve` is given: its start command's guard, the tree the
/// client walks.
type ServeArgs = (Option<u32>, Option<std::ffi::OsString>);

/// `ferry serve [--start-guard PID] [--walk-ahead=PATH]` exactly as the
/// start command runs it (once per ssh connection, docs/CLI.md "SSH"):
/// read without building the parser of the whole command line (half a
/// millisecond of every session's start there). Any other form (another
/// flag, another order, `--walk-ahead PATH`, `--help`) goes to clap.
fn serve_args(mut args: impl Iterator<Item = std::ffi::OsString>) -> Option<ServeArgs> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    if args.next()? != "serve" {
        return None;
    }
    let mut next = args.next();
    let mut guard = None;
    if next.as_ref().is_some_and(|f| f == "--start-guard") {
        guard = Some(args.next()?.to_str()?.parse().ok()?);
        next = args.next();
    }
    let mut walk = None;
    if let Some(f) = next {
        let path = f.as_bytes().strip_prefix(b"--walk-ahead=")?.to_vec();
        walk = Some(std::ffi::OsString::from_vec(path));
        next = args.next();
    }
    next.is_none().then_some((guard, walk))
}

/// `ferry serve`: this machine's files to the ferry at the other end.
fn serve(start_guard: Option<u32>, walk: Option<std::ffi::OsString>) -> Result<u8, String> {
    use std::os::unix::ffi::OsStrExt;
    // Its watches of its own tree use ferry-watch's inotify tree.
    ferry_watch::inotify::plug();
    ferry_ssh::serve::serve_guarded(start_guard, walk.as_deref().map(|w| w.as_bytes()))
        .map(|()| 0)
        .map_err(|e| format!("serve: {}", cause(&e)))
}

/// When this command started (the first call: the start of `main`).
fn started() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Run copy or sync; `Err` is a usage or configuration error (exit 2).
fn run_sync(a: SyncArgs, mode: ferry_engine::Mode, reg: &Backends) -> Result<u8, String> {
    // The local tree of a run with a remote side is listed while that side
    // connects (ferry_engine::prefetch): the walk takes its listings.
    let mut ahead = Vec::new();
    // (Built before: the directories a remote side opens in its first
    // flight are those the walk goes into.)
    let filter = a.filter.build()?;
    let job = reg.resolve_ahead(&a.src, &a.dst, a.force, &mut |side, root| {
        let o = Opts {
            jobs: ferry_backends::jobs(a.tx.jobs),
            lazy_meta: true,
            walk: false,
        };
        if let (false, Ok(s)) = (a.watch.watch, reg.open(root, &o)) {
            let p = Prefetch::start(s);
            // Its directories, for an ssh side's first flight, once listed.
            let (hint, filter) = (p.hint(), filter.clone());
            ferry_ssh::hint_walk(Box::new(move || {
                hint.dirs_when_done(|d| ferry_engine::walks_into(filter.as_ref(), d))
            }));
            ahead.push((side, p));
        }
    })?;
    // SRC is one file: no tree is walked, so no listing made ahead is taken;
    // stop listing the local DST now rather than at the end of the run.
    if job.one.is_some() {
        ahead.clear();
    }
    // What the run replaces or deletes is kept (docs/CLI.md, "Keeping what
    // is replaced"); a bad option is a usage error, before any change.
    let mut keep = args::keeper(&a.keep, &job.dst)?;
    // Where it keeps them, compared with SRC and DST by device and inode.
    if let (Some(k), Some(dst)) = (keep.as_mut(), job.dst.local_path()) {
        let src = job.src.local_path().filter(|_| job.one.is_none());
        let others: Vec<(&str, &std::path::Path)> = src.map(|s| ("SRC", s)).into_iter().collect();
        identity::keep_dir(k, "--backup-dir", ("DST", dst), &others)?;
        if let (Some((sn, dn)), Some(sdir)) = (&job.one, job.src.local_path()) {
            let src = sdir.join(std::ffi::OsStr::from_bytes(sn.to_bytes()));
            identity::keep_file(k, dst, dn.to_bytes(), &src)?;
        }
    }
    let keep = keep.map(std::sync::Arc::new);
    let (jobs, more_jobs) = reg.jobs_now(a.tx.jobs, &[&job.src, &job.dst]);
    let opts = ferry_engine::Options {
        mode,
        dry_run: a.dry_run,
        checksum: a.checksum,
        fsync: a.write.fsync,
        jobs,
        more_jobs,
        filter,
        bwlimit: a.write.limiter(),
        max_delete: a.max_delete,
        force: a.force,
        xattrs: a.attrs.sel(),
        hard_links: a.hard_links,
        delta: a.write.delta_mode(),
        keep,
        keep_special_bits: a.write.keep_special_bits,
    };
    let stats = std::sync::Arc::new(Stats::default());
    output::track_stats(&stats);
    let show_progress = a.out.progress_enabled();
    let rep = CliReporter::new(a.out.json, a.out.verbose > 0 || a.dry_run, a.dry_run);
    if a.watch.watch {
        return watch::sync(reg, &a.watch, &a.keep, &job, &opts, &rep);
    }
    let progress = show_progress.then(|| Progress::start(stats.clone(), &rep));
    let result = run_job(reg, &job, &opts, (&stats, &ahead), &rep, a.out.verbose > 0);
    if let Some(p) = progress {
        p.finish();
    }
    let summary = match result {
        Ok(s) => s,
        Err(e) => {
            use ferry_engine::class::{classify, Class};
            // A refusal is its own line. Between local trees any other
            // cause is DST's; other stores name the location in their
            // messages.
            return Err(
                match (classify(&e), job.src.local_path(), job.dst.local_path()) {
                    (Class::Refused, _, _) => e.to_string(),
                    (_, Some(_), Some(dst)) => format!("DST {}: {}", dst.display(), cause(&e)),
                    _ => cause(&e),
                },
            );
        }
    };
    // The time of the whole command: connecting, installing ferry on a
    // host and asking what SRC and DST are count as much as the copying.
    let summary = ferry_engine::Summary {
        elapsed_s: started().elapsed().as_secs_f64(),
        ..summary
    };
    // --versions with --keep/--keep-days: prune kept versions (never fails the run).
    versions::after_run(reg, &[&job.dst], &a.keep, a.dry_run, &rep);
    // Nothing more is asked of a remote side: its session ends while the
    // summary is written (`close_all` waits for it when a change sent
    // there is still unconfirmed).
    ferry_backends::end_all();
    rep.summary(&summary);
    Ok(if summary.errors > 0 { 1 } else { 0 })
}

/// Refuse (exit 2, before any change) a run that keeps what it replaces
/// where DST's store cannot keep entries there.
fn check_keep(
    opts: &ferry_engine::Options,
    d: &AnyStore,
    dst: &ferry_backends::Root,
) -> io::Result<()> {
    if let Some(k) = &opts.keep {
        let (base, _) = k.target(b"", 1);
        if !d.can_keep(&base) {
            return Err(io::Error::other(ferry_engine::Refused(format!(
                "DST {}: this backend cannot keep replaced or deleted files yet (--backup-dir, --suffix, -b, --versions); nothing was changed",
                dst.id()
            ))));
        }
    }
    Ok(())
}

/// What each store ignored (always), and with -v what it did beyond plain
/// requests (resumed transfers, requests that cost), `role` naming it.
fn print_notes(stores: &[(&AnyStore, &str)], verbose: bool) {
    let reports: Vec<_> = stores.iter().map(|(s, role)| s.report(role)).collect();
    for n in reports.iter().flat_map(|r| &r.warnings) {
        eprintln!("ferry: {}", text_name_string(n.as_bytes()));
    }
    if verbose {
        for n in reports.iter().flat_map(|r| &r.notes) {
            eprintln!("ferry: {n}");
        }
    }
}

/// Copy or sync `job`, a tree or one file, with the engine over the two
/// stores it names, whatever their backends.
fn run_job(
    reg: &Backends,
    job: &Job,
    opts: &ferry_engine::Options,
    (stats, ahead): (&Stats, &[(usize, Prefetch)]),
    rep: &CliReporter,
    verbose: bool,
) -> io::Result<ferry_engine::Summary> {
    // No HEAD per object while listing: only the objects compared are HEADed.
    let o = Opts {
        jobs: opts.jobs,
        lazy_meta: true,
        walk: false,
    };
    let s = reg.open(&job.src, &o).map_err(io::Error::other)?;
    let d = reg.open(&job.dst, &o).map_err(io::Error::other)?;
    check_keep(opts, &d, &job.dst)?;
    attr_notes(
        opts.xattrs,
        &[
            (reg.keeps(&job.src, &s), &s, format!("SRC {}", job.src.id())),
            (reg.keeps(&job.dst, &d), &d, format!("DST {}", job.dst.id())),
        ],
        &|m| Reporter::note(rep, m),
    );
    let gate = Unreachable::new(rep);
    let e = ahead
        .iter()
        .fold(Engine::new(&s, &d, opts, stats, &gate), |e, (side, p)| {
            e.prefetched(*side, p)
        });
    let r = match &job.one {
        Some((sn, dn)) => e.run_file(sn, dn),
        None => e.run_tree(),
    };
    print_notes(&[(&s, "source"), (&d, "destination")], verbose);
    gate.finish();
    r
}

/// `-X`/`-A` with a store that keeps no such thing (S3, SFTP): said once
/// per store, before the run (the reporter adds `note: `); its files are
/// copied without them.
/// (`stores`: what each keeps, as its backend says, the store, its name.)
fn attr_notes(asked: XattrSel, stores: &[(&str, &AnyStore, String)], note: &dyn Fn(&str)) {
    for (keeps, s, name) in stores {
        let lacking = asked.lacking(s.xattr_caps());
        if lacking.any() {
            note(&format!(
                "{}: {name} keeps none ({keeps}): files are copied without them",
                lacking.describe()
            ));
        }
    }
}

fn run_cleanup(a: args::CleanupArgs, reg: &Backends) -> Result<u8, String> {
    let loc = Location::parse(std::ffi::OsStr::new(&a.path));
    let root = reg.root_of(&loc)?;
    let store = reg.open(
        &root,
        &Opts {
            jobs: 1,
            lazy_meta: false,
            walk: false,
        },
    )?;
    let done = match store.cleanup().map_or_else(
        || Err(io::Error::from(io::ErrorKind::Unsupported)),
        |c| c.cleanup(a.max_age, a.dry_run),
    ) {
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            return Err(format!("{}: cleanup works on s3:// paths", a.path))
        }
        r => r.map_err(|e| format!("{}: {}", a.path, cause(&e)))?,
    };
    let verb = if a.dry_run { "would abort" } else { "aborted" };
    for (what, started) in &done {
        let what = text_name_string(what.as_bytes());
        println!("{verb}: {what} (started {started})");
    }
    eprintln!("ferry summary: {} interrupted upload(s) {verb}", done.len());
    Ok(0)
}

/// Two-way sync; `Err` is a usage or configuration error, or a refusal
/// (exit 2, nothing changed).
fn run_bisync(a: BisyncArgs, reg: &Backends) -> Result<u8, String> {
    let ra = reg.resolve_replica(&a.a, "A")?;
    let rb = reg.resolve_replica(&a.b, "B")?;
    reg.check_pair(&ra, &rb)?;
    let jobs = reg.jobs_for(a.tx.jobs, &[&ra, &rb]);
    let filter = a.filter.build()?;
    let (ida, idb) = (ra.id(), rb.id());
    let ids = (ida.as_str(), idb.as_str());
    let jpath = match &a.journal {
        Some(p) => p.clone(),
        None => ferry_bisync::default_path(ids).map_err(|e| e.to_string())?,
    };
    // A dry run creates nothing: without a journal file it plans as a
    // first run would.
    let (_lock, mut journal) = if a.dry_run && !jpath.exists() {
        (None, None)
    } else {
        let lock = ferry_bisync::Lock::take(&jpath).map_err(|e| e.to_string())?;
        (
            Some(lock),
            Some(ferry_bisync::Journal::open(&jpath, ids).map_err(|e| e.to_string())?),
        )
    };
    let mut opts = ferry_bisync::Options {
        dry_run: a.dry_run,
        force: a.force,
        max_delete: a.max_delete,
        resync: a.resync,
        jobs,
        filter,
        fsync: a.write.fsync,
        bwlimit: a.write.limiter(),
        checksum: a.checksum,
        roots: [ida.clone(), idb.clone()],
        xattrs: a.attrs.sel(),
        delta: a.write.delta_mode(),
        keep: [None, None],
        keep_special_bits: a.write.keep_special_bits,
        guard: None,
        stop: None,
    };
    let cli = CliReporter::new(a.out.json, a.out.verbose > 0 || a.dry_run, a.dry_run);
    let stats = std::sync::Arc::new(Stats::default());
    output::track_stats(&stats);
    let progress =
        (a.out.progress_enabled() && !a.watch.watch).then(|| Progress::start(stats.clone(), &cli));
    // One line for an S3 endpoint found unreachable, as for copy and sync.
    let rep = Unreachable::new(&cli);
    // Listings without a HEAD per object: the journal vouches for objects
    // whose version is the one it recorded; only the others are HEADed.
    // Both trees are walked first: a remote one is listed ahead there.
    let o = Opts {
        jobs,
        lazy_meta: true,
        walk: true,
    };
    let sa = reg.open(&ra, &o)?;
    let sb = reg.open(&rb, &o)?;
    opts.keep = bisync_keepers(&a, [&ra, &rb], [&sa, &sb])?;
    attr_notes(
        opts.xattrs,
        &[
            (reg.keeps(&ra, &sa), &sa, format!("A {ida}")),
            (reg.keeps(&rb, &sb), &sb, format!("B {idb}")),
        ],
        &|m| ferry_bisync::BiReporter::note(&cli, m),
    );
    if a.watch.watch {
        let sides = watch::Sides {
            roots: (&ra, &rb),
            stores: (&sa, &sb),
        };
        let out = watch::Out {
            rep: &rep,
            cli: &cli,
        };
        return watch::bisync(reg, &a.watch, &a.keep, sides, journal.as_mut(), opts, out);
    }
    // SIGINT/SIGTERM: no further entry is begun; the journal holds what was done.
    let stop = (!a.dry_run)
        .then(|| ferry_watch::signals::Stop::install(|| eprintln!("ferry: note: stopping after the entry in flight (a second signal stops at once)")))
        .transpose()
        .map_err(|e| format!("signals: {e}"))?;
    opts.stop = stop.as_ref().map(|s| s.flag.clone());
    let res = ferry_bisync::run(&sa, &sb, journal.as_mut(), &opts, &rep, &stats);
    print_notes(&[(&sa, "A"), (&sb, "B")], a.out.verbose > 0);
    if let Some(p) = progress {
        p.finish();
    }
    rep.finish();
    let mut out = res.map_err(|r| r.0)?;
    // The whole command's time, connecting included (as copy and sync).
    out.elapsed_s = started().elapsed().as_secs_f64();
    // --versions with --keep/--keep-days: prune kept versions (never fails the run).
    versions::after_run(reg, &[&ra, &rb], &a.keep, a.dry_run, &cli);
    cli.bisync_summary(&out, stats.delta.figures());
    if let (true, Some(s)) = (out.stopped, &stop) {
        ferry_bisync::BiReporter::note(&cli, "stopped by a signal before the end of the run: what was done is in the journal, the next run does the rest");
        return Ok(s.code());
    }
    Ok(if out.errors > 0 { 1 } else { 0 })
}

// ---- bisync: keeping what a run replaces or deletes, on each replica (#17) ----

/// Each replica's keeper (A's, B's) from `--versions`, `--backup-dir`,
/// `--backup-dir1`/`--backup-dir2`, `--suffix` and `-b`: `--versions` keeps
/// in each replica's own `.ferry-versions`; a relative `--backup-dir` is
/// relative to each replica's root; `--backup-dirN` takes its place on
/// side N (a full location must be on that side's backend); `--suffix`
/// and `-b` apply to both. Refused (exit 2, before anything changes) when
/// a side's store cannot keep there, or a side's backup directory is
/// inside the other replica.
fn bisync_keepers(
    a: &BisyncArgs,
    roots: [&ferry_backends::Root; 2],
    stores: [&AnyStore; 2],
) -> Result<[Option<ferry_engine::keep::Keeper>; 2], String> {
    let own = [&a.keep_sides.backup_dir1, &a.keep_sides.backup_dir2];
    let mut out = [None, None];
    for i in 0..2 {
        let side = ["A", "B"][i];
        let mut k = a.keep.clone();
        let mut flag = "--backup-dir".to_string();
        if let Some(d) = own[i] {
            k.backup_dir = Some(d.clone());
            flag = format!("--backup-dir{}", i + 1);
        }
        let Some(mut keeper) = args::keeper(&k, roots[i])
            .map_err(|e| e.replacen("--backup-dir", &flag, 1).replace("DST", side))?
        else {
            continue;
        };
        // Where it keeps them, compared with both replicas by device and
        // inode (a symlink, `..` or a bind mount into the other replica).
        if let Some(own) = roots[i].local_path() {
            let other = roots[1 - i].local_path();
            let others: Vec<(&str, &std::path::Path)> =
                other.map(|o| (["A", "B"][1 - i], o)).into_iter().collect();
            identity::keep_dir(&mut keeper, &flag, (side, own), &others)?;
        }
        let base = keeper.target(b"", 1).0;
        if !stores[i].can_keep(&base) {
            return Err(format!(
                "{side} {}: cannot keep replaced or deleted files at {} on this backend: nothing done",
                roots[i].id(),
                text_name_string(&keeper.place(b"")),
            ));
        }
        out[i] = Some(keeper);
    }
    // One directory for both local replicas (`--backup-dir /x`, or `../old`
    // beside both, or one inside the other): A's and B's versions of a path
    // would overwrite each other.
    if let (Some(ka), Some(kb), Some(ra), Some(rb)) = (
        &out[0],
        &out[1],
        roots[0].local_path(),
        roots[1].local_path(),
    ) {
        identity::distinct(ka, ra, kb, rb)?;
    }
    Ok(out)
}

fn run_ls(a: LsArgs, reg: &Backends) -> Result<u8, String> {
    let loc = Location::parse(a.path.as_os_str());
    let what = loc.to_string();
    let root = reg.root_of(&loc)?;
    // Object stores: mostly waiting on HEADs (one per object for the stored
    // mtime and mode), so more in flight than for transfers.
    let jobs = match root.local_path() {
        Some(_) => ferry_backends::jobs(a.tx.jobs),
        None => a.tx.jobs.map_or(64, usize::from),
    };
    let store = reg.open(
        &root,
        &Opts {
            jobs,
            lazy_meta: a.server_mtime,
            // The whole tree is listed: a ferry there lists it ahead.
            walk: true,
        },
    )?;
    let format = if a.json { Format::Json } else { Format::Text };
    // One entry (a file, an object) is listed as itself, under its name
    // as typed.
    let one = reg
        .ls_entry(&root, &loc, &store)
        .map_err(|e| format!("{what}: {}", cause(&e)))?;
    if let Some(m) = one {
        let mut buf = Vec::new();
        let name = a.path.as_os_str().as_bytes();
        ferry_engine::ls::format_entry(&mut buf, format, b"", name, &m, None, true);
        let _ = io::stdout().lock().write_all(&buf);
        return Ok(0);
    }
    ls_store(&store, jobs, format, &what)
}

/// `ls` of a whole tree of any store; `what` names it in errors.
fn ls_store<S: ferry_engine::Store>(
    store: &S,
    jobs: usize,
    format: Format,
    what: &str,
) -> Result<u8, String> {
    let out = Mutex::new(io::BufWriter::with_capacity(1 << 20, io::stdout()));
    let errors = std::sync::atomic::AtomicU64::new(0);
    let on_error = |path: &[u8], e: &io::Error| {
        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        eprintln!("{}", output::error_line(path, &cause(e)));
    };
    let res = list_tree(store, jobs, None, format, &out, &on_error);
    let flushed = out.into_inner().flush();
    match (res, flushed) {
        (Err(e), _) | (_, Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(0),
        (Err(e), _) | (_, Err(e)) => Err(format!("{what}: {}", cause(&e))),
        _ => Ok(if errors.into_inner() > 0 { 1 } else { 0 }),
    }
}

fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve`'s own reading of its arguments takes exactly the forms the
    /// start command runs, as clap would read them, and leaves every other
    /// form to clap.
    #[test]
    fn serve_arguments_read_as_clap_would() {
        let forms: [&[&str]; 16] = [
            &["serve"],
            &["serve", "--start-guard", "4242"],
            &["serve", "--start-guard"],
            &["serve", "--start-guard", "x"],
            &["serve", "--start-guard", "1", "2"],
            &["serve", "--help"],
            &["serve", "--start-guard=7"],
            &["serve", "--walk-ahead=dst"],
            &["serve", "--walk-ahead=-odd name"],
            &["serve", "--walk-ahead="],
            &["serve", "--start-guard", "4242", "--walk-ahead=/a/b"],
            &["serve", "--walk-ahead=/a", "--start-guard", "1"],
            &["serve", "--walk-ahead", "/a"],
            &["serve", "--start-guard", "4242", "--walk-ahead=/a", "x"],
            &["copy", "a", "b"],
            &[],
        ];
        for f in forms {
            let own = serve_args(f.iter().map(std::ffi::OsString::from));
            let clap = <Cli as clap::Parser>::try_parse_from(
                std::iter::once("ferry").chain(f.iter().copied()),
            );
            match own {
                Some(g) => match clap {
                    Ok(Cli {
                        command:
                            Command::Serve {
                                start_guard,
                                walk_ahead,
                            },
                        ..
                    }) => assert_eq!((start_guard, walk_ahead), g, "{f:?}"),
                    _ => panic!("{f:?}: clap reads it otherwise"),
                },
                // Left to clap (which may take it or refuse it).
                None => assert!(!matches!(
                    f,
                    ["serve"]
                        | ["serve", "--start-guard", "4242"]
                        | ["serve", "--start-guard", "4242", "--walk-ahead=/a/b"]
                )),
            }
        }
        let own = |f: &[&str]| serve_args(f.iter().map(std::ffi::OsString::from));
        assert_eq!(own(&["serve"]), Some((None, None)));
        assert_eq!(
            own(&["serve", "--start-guard", "4242"]),
            Some((Some(4242), None))
        );
        assert_eq!(
            own(&["serve", "--start-guard", "4242", "--walk-ahead=-odd name"]),
            Some((Some(4242), Some("-odd name".into())))
        );
        assert_eq!(
            own(&["serve", "--walk-ahead=dst"]),
            Some((None, Some("dst".into())))
        );
    }
}
