//! `ferry`: the command line. Parses flags, resolves what SRC and DST mean,
//! wires the engine to the terminal (progress, JSON lines, exit codes).
//! All the work happens in `ferry-engine`.

mod args;
mod output;
mod remote;

use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use ferry_engine::ls::{list_tree, Format};
use ferry_engine::{Engine, LocalStore, Stats};

use args::{BisyncArgs, Cli, Command, Job, Loc, LsArgs, SyncArgs};
use ferry_engine::encode::text_name_string;
use ferry_engine::Store as _;
use ferry_s3::S3Store;
use output::{cause, CliReporter, Progress, Unreachable};

fn main() -> ExitCode {
    let cli = match <Cli as clap::Parser>::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Usage errors exit 2; --help and --version exit 0.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    raise_fd_limit();
    let start = Instant::now();
    // (dry run, bisync) of a run whose refusal gets a JSON summary.
    let json = match &cli.command {
        Command::Copy(a) | Command::Sync(a) => a.json.then_some((a.dry_run, false)),
        Command::Bisync(a) => a.json.then_some((a.dry_run, true)),
        Command::Ls(_) | Command::Cleanup(_) => None,
    };
    if let Some(t) = cli.timeout {
        ferry_s3::set_timeout(t);
    }
    let res = match cli.command {
        Command::Copy(a) => run_sync(a, ferry_engine::Mode::Copy),
        Command::Sync(a) => run_sync(a, ferry_engine::Mode::Sync),
        Command::Ls(a) => run_ls(a),
        Command::Cleanup(a) => run_cleanup(a),
        Command::Bisync(a) => run_bisync(a),
    };
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

/// Run copy or sync; `Err` is a usage or configuration error (exit 2).
fn run_sync(a: SyncArgs, mode: ferry_engine::Mode) -> Result<u8, String> {
    let remote = args::is_s3(&a.src) || args::is_s3(&a.dst);
    let job = if remote {
        Job::Remote(remote::resolve(
            &a.src,
            &a.dst,
            a.s3_endpoint.as_deref(),
            a.force,
        )?)
    } else {
        args::resolve(&a.src, &a.dst)?
    };
    let filter =
        ferry_engine::Filter::new(&a.exclude, &a.exclude_from).map_err(|e| e.to_string())?;
    // Object stores are latency-bound: many requests in flight by default.
    let jobs = if remote {
        a.jobs.map_or(32, usize::from)
    } else {
        args::jobs(a.jobs)
    };
    let opts = ferry_engine::Options {
        mode,
        dry_run: a.dry_run,
        checksum: a.checksum,
        fsync: a.fsync,
        jobs,
        filter,
        bwlimit: a.bwlimit.map(ferry_engine::bwlimit::Limiter::new),
        max_delete: a.max_delete,
        force: a.force,
    };
    let stats = std::sync::Arc::new(Stats::default());
    output::track_stats(&stats);
    let show_progress = a.progress_enabled();
    let rep = CliReporter::new(a.json, a.verbose > 0 || a.dry_run, a.dry_run);
    let start = Instant::now();
    let progress = show_progress.then(|| Progress::start(stats.clone(), &rep));
    let result = match &job {
        Job::Remote(r) => run_remote(r, jobs, &opts, &stats, &rep, a.verbose > 0),
        Job::Tree { src, dst } => {
            let s = LocalStore::new(src, jobs);
            let d = LocalStore::new(dst, jobs);
            Engine::new(&s, &d, &opts, &stats, &rep).run_tree()
        }
        Job::File {
            src_dir,
            src_name,
            dst_dir,
            dst_name,
        } => {
            let s = LocalStore::new(src_dir, 1);
            let d = LocalStore::new(dst_dir, 1);
            let sn = CString::new(src_name.as_bytes())
                .map_err(|_| "SRC: name contains NUL".to_string())?;
            let dn = CString::new(dst_name.as_bytes())
                .map_err(|_| "DST: name contains NUL".to_string())?;
            Engine::new(&s, &d, &opts, &stats, &rep).run_file(&sn, &dn)
        }
    };
    if let Some(p) = progress {
        p.finish();
    }
    let summary = match result {
        Ok(s) => s,
        Err(e) => {
            if let Some(r) = ferry_engine::Refused::of(&e) {
                return Err(r.to_string());
            }
            if let Job::Remote(_) = &job {
                return Err(cause(&e));
            }
            let (what, path) = match &job {
                Job::Tree { dst, .. } => ("DST", dst.clone()),
                Job::File { dst_dir, .. } => ("DST", dst_dir.clone()),
                Job::Remote(_) => unreachable!("handled above"),
            };
            return Err(format!("{what} {}: {}", path.display(), cause(&e)));
        }
    };
    let summary = ferry_engine::Summary {
        elapsed_s: start.elapsed().as_secs_f64(),
        ..summary
    };
    rep.summary(&summary);
    Ok(if summary.errors > 0 { 1 } else { 0 })
}

/// With -v: what an S3 store did (requests that cost, resumed work).
fn note_s3(st: &S3Store, role: &str, verbose: bool) {
    use std::sync::atomic::Ordering::Relaxed;
    if !verbose {
        return;
    }
    let c = st.counters();
    eprintln!(
        "ferry: s3 {role}: {} HEAD requests, {} parts sent, {} parts reused from {} resumed upload(s), {} server-side copies, {} stale upload(s) aborted, {} ranged GETs on the direct path, {} sent again through the HTTP client, {} listing ranges in parallel, {} batch deletes",
        c.heads.load(Relaxed),
        c.parts_sent.load(Relaxed),
        c.parts_reused.load(Relaxed),
        c.uploads_resumed.load(Relaxed),
        c.server_copies.load(Relaxed),
        c.uploads_aborted.load(Relaxed),
        c.direct_gets.load(Relaxed),
        c.direct_fallbacks.load(Relaxed),
        c.list_ranges.load(Relaxed),
        c.batch_deletes.load(Relaxed)
    );
}

/// Copy or sync with an S3 side: the same engine over other stores, for a
/// tree or one file (`job.one`). With `verbose`, what the stores did beyond
/// plain copies (resumed transfers, server-side copies) goes to stderr.
fn run_remote(
    job: &remote::RemoteJob,
    jobs: usize,
    opts: &ferry_engine::Options,
    stats: &Stats,
    rep: &CliReporter,
    verbose: bool,
) -> io::Result<ferry_engine::Summary> {
    // No HEAD per object while listing: only the objects compared are HEADed.
    let s3 = |c: &ferry_s3::S3Config| {
        S3Store::new(c, jobs)
            .map(S3Store::with_lazy_meta)
            .map_err(io::Error::other)
    };
    let local = |p: &std::path::Path| LocalStore::new(p, jobs);
    let note_local = |st: &LocalStore| {
        if verbose {
            eprintln!(
                "ferry: {} bytes of interrupted downloads reused, {} bytes of downloads written with O_DIRECT",
                st.resumed_bytes(),
                st.direct_bytes()
            );
        }
    };
    fn go<S: ferry_engine::Store, D: ferry_engine::Store>(
        e: Engine<'_, S, D>,
        one: &Option<(CString, CString)>,
    ) -> io::Result<ferry_engine::Summary> {
        match one {
            Some((sn, dn)) => e.run_file(sn, dn),
            None => e.run_tree(),
        }
    }
    let gate = Unreachable::new(rep);
    let r = match (&job.src, &job.dst) {
        (Loc::Local(s), Loc::Local(d)) => go(
            Engine::new(&local(s), &local(d), opts, stats, &gate),
            &job.one,
        ),
        (Loc::Local(s), Loc::S3(d)) => {
            let d = s3(d)?;
            let r = go(Engine::new(&local(s), &d, opts, stats, &gate), &job.one);
            note_s3(&d, "destination", verbose);
            r
        }
        (Loc::S3(s), Loc::Local(d)) => {
            let (s, d) = (s3(s)?, local(d));
            let r = go(Engine::new(&s, &d, opts, stats, &gate), &job.one);
            note_s3(&s, "source", verbose);
            note_local(&d);
            r
        }
        (Loc::S3(s), Loc::S3(d)) => {
            let (s, d) = (s3(s)?, s3(d)?);
            let r = go(Engine::new(&s, &d, opts, stats, &gate), &job.one);
            note_s3(&s, "source", verbose);
            note_s3(&d, "destination", verbose);
            r
        }
    };
    gate.finish();
    r
}

fn run_cleanup(a: args::CleanupArgs) -> Result<u8, String> {
    if !a.path.starts_with("s3://") {
        return Err(format!("{}: cleanup works on s3:// paths", a.path));
    }
    let cfg = ferry_s3::S3Config::from_url(&a.path, a.s3_endpoint.as_deref())?;
    let store = S3Store::new(&cfg, 1)?;
    store
        .open_root()
        .map_err(|e| format!("{}: {}", a.path, cause(&e)))?;
    let bucket = &cfg.bucket;
    let done = store
        .cleanup(a.max_age, a.dry_run)
        .map_err(|e| format!("{}: {}", a.path, cause(&e)))?;
    let verb = if a.dry_run { "would abort" } else { "aborted" };
    for (key, started) in &done {
        let url = text_name_string(format!("s3://{bucket}/{key}").as_bytes());
        println!("{verb}: {url} (started {started})");
    }
    eprintln!("ferry summary: {} interrupted upload(s) {verb}", done.len());
    Ok(0)
}

/// Two-way sync; `Err` is a usage or configuration error, or a refusal
/// (exit 2, nothing changed).
fn run_bisync(a: BisyncArgs) -> Result<u8, String> {
    let ra = args::resolve_replica(&a.a, "A", a.s3_endpoint.as_deref())?;
    let rb = args::resolve_replica(&a.b, "B", a.s3_endpoint.as_deref())?;
    args::check_pair(&ra, &rb)?;
    let remote = matches!(ra.0, Loc::S3(_)) || matches!(rb.0, Loc::S3(_));
    let jobs = if remote {
        a.jobs.map_or(32, usize::from)
    } else {
        args::jobs(a.jobs)
    };
    let filter =
        ferry_engine::Filter::new(&a.exclude, &a.exclude_from).map_err(|e| e.to_string())?;
    let ids = (ra.1.as_str(), rb.1.as_str());
    let jpath = match &a.journal {
        Some(p) => p.clone(),
        None => ferry_bisync::default_path(ids)?,
    };
    // A dry run creates nothing: without a journal file it plans as a
    // first run would.
    let (_lock, mut journal) = if a.dry_run && !jpath.exists() {
        (None, None)
    } else {
        let lock = ferry_bisync::Lock::take(&jpath)?;
        (Some(lock), Some(ferry_bisync::Journal::open(&jpath, ids)?))
    };
    let opts = ferry_bisync::Options {
        dry_run: a.dry_run,
        force: a.force,
        max_delete: a.max_delete,
        resync: a.resync,
        jobs,
        filter,
        fsync: a.fsync,
        bwlimit: a.bwlimit.map(ferry_engine::bwlimit::Limiter::new),
        checksum: a.checksum,
        roots: [ra.1.clone(), rb.1.clone()],
    };
    let cli = CliReporter::new(a.json, a.verbose > 0 || a.dry_run, a.dry_run);
    let stats = std::sync::Arc::new(Stats::default());
    output::track_stats(&stats);
    let progress = a
        .progress_enabled()
        .then(|| Progress::start(stats.clone(), &cli));
    // One line for an S3 endpoint found unreachable, as for copy and sync.
    let rep = Unreachable::new(&cli);
    let j = journal.as_mut();
    // Listings without a HEAD per object: the journal vouches for objects
    // whose version is the one it recorded; only the others are HEADed.
    let s3 = |c: &ferry_s3::S3Config| S3Store::new(c, jobs).map(S3Store::with_lazy_meta);
    let res = match (&ra.0, &rb.0) {
        (Loc::Local(x), Loc::Local(y)) => ferry_bisync::run(
            &LocalStore::new(x, jobs),
            &LocalStore::new(y, jobs),
            j,
            &opts,
            &rep,
            &stats,
        ),
        (Loc::Local(x), Loc::S3(y)) => {
            let sb = s3(y)?;
            let r = ferry_bisync::run(&LocalStore::new(x, jobs), &sb, j, &opts, &rep, &stats);
            note_s3(&sb, "B", a.verbose > 0);
            r
        }
        (Loc::S3(x), Loc::Local(y)) => {
            let sa = s3(x)?;
            let r = ferry_bisync::run(&sa, &LocalStore::new(y, jobs), j, &opts, &rep, &stats);
            note_s3(&sa, "A", a.verbose > 0);
            r
        }
        (Loc::S3(x), Loc::S3(y)) => {
            let (sa, sb) = (s3(x)?, s3(y)?);
            let r = ferry_bisync::run(&sa, &sb, j, &opts, &rep, &stats);
            note_s3(&sa, "A", a.verbose > 0);
            note_s3(&sb, "B", a.verbose > 0);
            r
        }
    };
    if let Some(p) = progress {
        p.finish();
    }
    rep.finish();
    let out = res.map_err(|r| r.0)?;
    cli.bisync_summary(&out);
    Ok(if out.errors > 0 { 1 } else { 0 })
}

fn run_ls(a: LsArgs) -> Result<u8, String> {
    if args::is_s3(&a.path) {
        let url = a.path.to_str().expect("s3 URLs are UTF-8");
        let cfg = ferry_s3::S3Config::from_url(url, a.s3_endpoint.as_deref())?;
        // Mostly waiting on HEADs (one per object for the stored mtime and
        // mode): more in flight than for transfers.
        let jobs = a.jobs.map_or(64, usize::from);
        let mut store = S3Store::new(&cfg, jobs)?;
        if a.server_mtime {
            store = store.with_lazy_meta();
        }
        let format = if a.json { Format::Json } else { Format::Text };
        // `s3://b/key` names the object `key` when no object is under
        // `key/` (as `ls FILE` lists the file). With neither, the listing
        // is empty: S3 cannot tell an empty tree from a missing one.
        if !url.ends_with('/') && !cfg.prefix.is_empty() {
            let err = |e: io::Error| format!("{url}: {}", cause(&e));
            if !store.root_has_objects().map_err(err)? {
                if let Some(m) = store.root_object().map_err(err)? {
                    let mut buf = Vec::new();
                    let name = url.as_bytes();
                    ferry_engine::ls::format_entry(&mut buf, format, b"", name, &m, None, true);
                    let _ = io::stdout().lock().write_all(&buf);
                    return Ok(0);
                }
            }
        }
        return ls_store(&store, jobs, format, url);
    }
    let meta = ferry_engine::local::stat_path(&a.path, true)
        .map_err(|e| format!("{}: {}", a.path.display(), cause(&e)))?;
    let stdout = io::stdout();
    let format = if a.json { Format::Json } else { Format::Text };
    if meta.kind != ferry_engine::Kind::Dir {
        let mut buf = Vec::new();
        let name = a.path.as_os_str().as_bytes();
        ferry_engine::ls::format_entry(&mut buf, format, b"", name, &meta, None, true);
        let _ = stdout.lock().write_all(&buf);
        return Ok(0);
    }
    let jobs = args::jobs(a.jobs);
    let store = LocalStore::new(&a.path, jobs);
    ls_store(&store, jobs, format, &a.path.display().to_string())
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
    let flushed = out.into_inner().unwrap_or_else(|e| e.into_inner()).flush();
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
