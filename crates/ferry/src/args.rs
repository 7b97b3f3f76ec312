//! Flags as typed (clap), then resolved: what SRC and DST mean. The rules
//! are in docs/CLI.md; every refusal here is a usage error (exit 2).

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use ferry_backends::Root;
use ferry_engine::bwlimit::parse_rate;

/// Fast, safe file sync: copy and mirror directory trees.
#[derive(Parser, Debug)]
#[command(name = "ferry", version, about, arg(crate::generate::arg()))]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// S3: a request that receives (or sends) no byte for this many
    /// seconds fails and is retried [default: 30]. SSH and SFTP: a server
    /// that sends and takes no byte for this long while requests wait for
    /// it is given up [default: 300].
    #[arg(long, global = true, value_name = "SECS", value_parser = parse_secs)]
    pub timeout: Option<std::time::Duration>,
}

/// Seconds, fractions allowed, more than 0 (`--timeout`).
fn parse_secs(s: &str) -> Result<std::time::Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() && v <= 86_400.0 => {
            Ok(std::time::Duration::from_secs_f64(v))
        }
        _ => Err(format!(
            "{s:?}: expected seconds, more than 0 (e.g. 30 or 2.5)"
        )),
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Make DST contain everything in SRC; never delete anything in DST.
    Copy(SyncArgs),
    /// Make DST equal to SRC, deleting what SRC lacks (only inside DST).
    Sync(SyncArgs),
    /// List a tree recursively: SIZE MTIME_NS PATH per entry.
    Ls(LsArgs),
    /// Abort interrupted multipart uploads under s3://BUCKET/PREFIX that no
    /// run resumed (they cost storage until removed).
    Cleanup(CleanupArgs),
    /// Two-way sync: propagate creates, updates, deletes and renames both
    /// ways between A and B since the last run (kept in a journal); when
    /// both sides changed a path, keep both versions.
    Bisync(BisyncArgs),
    /// Serve this machine's files on stdin/stdout to a ferry at the other
    /// end of ssh (ferry starts it itself for host:path locations).
    #[command(hide = true)]
    Serve {
        /// The pid of the start command's guard (docs/CLI.md, "SSH"):
        /// stopped once the session has started.
        #[arg(long, hide = true)]
        start_guard: Option<u32>,
        /// The tree the client walks: its first levels are answered from
        /// the start, unasked (the client's requests come a round trip
        /// later): docs/DESIGN.md, "The walked tree from the command line".
        #[arg(long, hide = true)]
        walk_ahead: Option<std::ffi::OsString>,
    },
    /// List the versions kept of a file (--versions), or of every file
    /// below a directory; with --at TIME, each file as it was then.
    Versions(VersionsArgs),
    /// Put back a file (its newest version, or what it held at --at TIME)
    /// or a directory as it was at --at TIME; what is replaced is kept as
    /// a version first.
    Restore(RestoreArgs),
}

/// `ferry versions`.
#[derive(Args, Debug)]
pub struct VersionsArgs {
    /// A file (existing or deleted) or directory in a replica: a path,
    /// s3://bucket/key or `[user@]host:path`.
    pub path: PathBuf,
    /// Each file as it was at TIME (local time: '2026-11-25 16:33',
    /// 16:33, yesterday, 2h, an RFC 3339 time): what it held then, and
    /// whether it is current, changed or deleted since.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// Also the files a run kept in DIR (sync --backup-dir DIR: relative
    /// to the replica's root, or absolute); PATH a local path.
    #[arg(long, value_name = "DIR")]
    pub backup_dir: Option<PathBuf>,
    /// The --suffix the runs kept with (with --backup-dir).
    #[arg(long, value_name = "SUF", requires = "backup_dir")]
    pub suffix: Option<String>,
    /// One JSON object per version.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub tx: TransferArgs,
}

/// `ferry restore`.
#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The file or directory to put back (existing or deleted): a path,
    /// s3://bucket/key or `[user@]host:path`; with --from, a path in the
    /// tree synced to DST.
    pub path: PathBuf,
    /// What the file held at TIME, in local time: '2026-11-25 16:33',
    /// 2026-11-25, 16:33, 'yesterday 17:00', an age (2h, 3d), an RFC 3339
    /// time, or a version's stamp [default: the newest version].
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// Write to PATH (a local path; for a directory, the directory that
    /// receives it) instead of the file's own place, or to standard
    /// output with `-` (one file).
    #[arg(long, value_name = "PATH|-")]
    pub to: Option<PathBuf>,
    /// The versions are in DST (sync SRC DST --versions) and PATH is in
    /// SRC: find PATH's versions in DST and restore into PATH.
    #[arg(long, value_name = "DST")]
    pub from: Option<PathBuf>,
    /// Also the files a run kept in DIR (sync --backup-dir DIR: relative
    /// to the replica's root, or absolute); what the restore replaces is
    /// kept there too. PATH a local path.
    #[arg(long, value_name = "DIR")]
    pub backup_dir: Option<PathBuf>,
    /// The --suffix the runs kept with (with --backup-dir).
    #[arg(long, value_name = "SUF", requires = "backup_dir")]
    pub suffix: Option<String>,
    /// Say what would be restored; change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub tx: TransferArgs,
}

#[derive(Args, Debug)]
pub struct CleanupArgs {
    /// s3://bucket/prefix
    pub path: String,
    /// Only uploads started at least this long ago, e.g. 30m, 24h, 7d, 0.
    #[arg(long, value_name = "AGE", default_value = "24h", value_parser = parse_age)]
    pub max_age: std::time::Duration,
    /// Print what would be aborted; abort nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// S3 endpoint URL (default: AWS_ENDPOINT_URL, or AWS).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
}

/// `90`, `90s`, `30m`, `24h`, `7d` (see [`crate::filter_args::parse_duration`]).
pub fn parse_age(s: &str) -> Result<std::time::Duration, String> {
    crate::filter_args::parse_duration(s)
}

#[derive(Args, Debug)]
pub struct BisyncArgs {
    /// First replica: a directory, s3://bucket/prefix or `[user@]host:path`.
    pub a: PathBuf,
    /// Second replica: a directory, s3://bucket/prefix or `[user@]host:path`.
    pub b: PathBuf,
    /// Print every planned action; change nothing (not even the journal).
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Propagate deletions even beyond --max-delete.
    #[arg(long)]
    pub force: bool,
    /// Refuse to delete more than PCT percent of the files of one side
    /// without --force.
    #[arg(long, value_name = "PCT", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub max_delete: u8,
    /// Forget the journal and merge both trees as on a first run.
    #[arg(long)]
    pub resync: bool,
    /// Also compare the bytes of files whose size and mtime say they are in
    /// sync; different bytes are a conflict (both versions kept).
    #[arg(short = 'c', long)]
    pub checksum: bool,
    /// Journal file [default: a file named by a hash of A and B, in
    /// $XDG_STATE_HOME/ferry/bisync/].
    #[arg(long, value_name = "PATH")]
    pub journal: Option<PathBuf>,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub tx: TransferArgs,
    #[command(flatten)]
    pub out: OutputArgs,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub attrs: AttrArgs,
    #[command(flatten)]
    pub watch: WatchArgs,
    #[command(flatten)]
    pub keep: KeepArgs,
    #[command(flatten)]
    pub keep_sides: KeepSides,
}

/// Per-replica backup directories of bisync (rclone bisync's names); each
/// takes the place of `--backup-dir` on its side.
#[derive(Args, Debug, Clone, Default)]
pub struct KeepSides {
    /// Where A's replaced and deleted files go (relative: to A's root; a
    /// full location must be on A's backend).
    #[arg(long, value_name = "DIR", conflicts_with = "versions")]
    pub backup_dir1: Option<String>,
    /// Where B's replaced and deleted files go (relative: to B's root; a
    /// full location must be on B's backend).
    #[arg(long, value_name = "DIR", conflicts_with = "versions")]
    pub backup_dir2: Option<String>,
}

/// What copy, sync and bisync keep beyond bytes, times, modes and owners.
#[derive(Args, Debug)]
pub struct AttrArgs {
    /// Keep extended attributes (user.*; as root also trusted.* and
    /// security.*), as rsync -X does.
    #[arg(short = 'X', long)]
    pub xattrs: bool,
    /// Keep POSIX ACLs (access ACLs, and default ACLs of directories), as
    /// rsync -A does.
    #[arg(short = 'A', long)]
    pub acls: bool,
}

impl AttrArgs {
    /// The attributes asked for.
    pub fn sel(&self) -> ferry_engine::xattr::XattrSel {
        ferry_engine::xattr::XattrSel {
            xattrs: self.xattrs,
            acls: self.acls,
        }
    }
}

/// How copy, sync and bisync write: pace and durability.
#[derive(Args, Debug)]
pub struct WriteArgs {
    /// Limit bandwidth over all transfers, e.g. 10M, 512K (bytes per second).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bwlimit: Option<u64>,
    /// Make each file's data durable (fsync) before it is renamed into place.
    #[arg(long)]
    pub fsync: bool,
    /// Send changed files whole, never by delta (rsync's --whole-file).
    #[arg(short = 'W', long, conflicts_with = "delta")]
    pub whole_file: bool,
    /// Send changed files of 1 MiB and more by delta between local trees
    /// too (where DST is a slow network filesystem); over ssh it is the
    /// default.
    #[arg(long)]
    pub delta: bool,
    /// Apply setuid, setgid and sticky bits of modes that come from S3
    /// object metadata or another host (SSH, SFTP); without it they are
    /// dropped, with one note.
    #[arg(long)]
    pub keep_special_bits: bool,
}

impl WriteArgs {
    /// When changed files go by delta.
    pub fn delta_mode(&self) -> ferry_engine::delta::Mode {
        use ferry_engine::delta::Mode;
        match (self.whole_file, self.delta) {
            (true, _) => Mode::Off,
            (_, true) => Mode::On,
            _ => Mode::Auto,
        }
    }

    /// The shared pacing of all transfers, when --bwlimit is given.
    pub fn limiter(&self) -> Option<ferry_engine::bwlimit::Limiter> {
        self.bwlimit.map(ferry_engine::bwlimit::Limiter::new)
    }
}

/// Flags of copy, sync, bisync and ls: where and how many at once.
#[derive(Args, Debug)]
pub struct TransferArgs {
    /// Worker threads [default: from the machine].
    #[arg(short = 'j', long, value_parser = clap::value_parser!(u16).range(1..=1024), value_name = "N")]
    pub jobs: Option<u16>,
    /// S3 endpoint URL for s3:// paths (default: AWS_ENDPOINT_URL, or AWS).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The remote shell for host:path locations, e.g. 'ssh -p 2222 -F cfg'
    /// [default: FERRY_RSH, or ssh].
    #[arg(short = 'e', long = "rsh", value_name = "CMD")]
    pub rsh: Option<String>,
    /// The command that runs ferry on the remote host [default: ferry, or
    /// this binary installed there].
    #[arg(long, value_name = "PATH")]
    pub remote_ferry: Option<String>,
    /// Never copy this binary to a remote host that has no ferry.
    #[arg(long)]
    pub no_remote_install: bool,
    /// ssh connections per host for big files [default: the fewer cores
    /// of the two ends, at most 4]; over SFTP, the sessions files are
    /// spread over [default: 4 for small files pulled; 2 for small files
    /// pushed and for a big file's ranges].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub connections: Option<u16>,
    /// Reach host:path and ssh:// locations over SFTP (no ferry on the
    /// remote; what is kept is told in docs/CLI.md).
    #[arg(long)]
    pub sftp: bool,
}

impl TransferArgs {
    /// This run's settings for every backend: these flags, `--timeout`,
    /// whether the command only reads, and `keeps`: what the command line
    /// asks for that only ferry on a remote keeps ([`only_ferry_keeps`]).
    pub fn settings(
        &self,
        keeps: Vec<String>,
        timeout: Option<std::time::Duration>,
        read_only: bool,
    ) -> ferry_backends::Settings {
        ferry_backends::Settings {
            s3_endpoint: self.s3_endpoint.clone(),
            timeout,
            sftp: self.sftp,
            rsh: self.rsh.clone(),
            remote_ferry: self.remote_ferry.clone(),
            connections: self.connections,
            no_remote_install: self.no_remote_install,
            only_ferry_keeps: keeps,
            read_only,
        }
    }
}

/// What `-H` and `attrs` ask for that SFTP cannot keep (docs/CLI.md,
/// "SFTP"): a host where ferry cannot run is then not served over SFTP in
/// its place.
pub fn only_ferry_keeps(hard_links: bool, attrs: &AttrArgs) -> Vec<String> {
    [
        (hard_links, "-H (hard links)"),
        (attrs.xattrs, "-X (extended attributes)"),
        (attrs.acls, "-A (ACLs)"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, what)| what.to_string())
    .collect()
}

/// `--watch` and its settings (copy, sync, bisync; docs/CLI.md).
#[derive(Args, Debug)]
pub struct WatchArgs {
    /// After the first run, keep running: local sides are watched (inotify),
    /// an ssh side by the ferry there, and each change is synced as it
    /// happens; other sides are polled.
    /// SIGINT/SIGTERM stop it after the run in flight (exit 0).
    #[arg(long)]
    pub watch: bool,
    /// A file written but not closed is synced once it has been quiet this
    /// long (e.g. 100ms, 1s).
    #[arg(long, value_name = "TIME", default_value = "100ms", value_parser = crate::filter_args::parse_duration, requires = "watch")]
    pub settle: std::time::Duration,
    /// How often a side that cannot be watched (S3, SFTP) is listed and
    /// compared (e.g. 30s, 5m).
    #[arg(long, value_name = "INTERVAL", default_value = "30s", value_parser = crate::filter_args::parse_duration, requires = "watch")]
    pub poll: std::time::Duration,
    /// Compare everything again this long after the last full run (e.g.
    /// 1h, 30m; 0 or off: never): corrects what no event told (edits made
    /// directly in DST, events the kernel never sent).
    #[arg(long, value_name = "INTERVAL", default_value = "1h", value_parser = parse_rescan, requires = "watch")]
    pub rescan: std::time::Duration,
    /// Serve a status page and /metrics on ADDR (PORT alone: 127.0.0.1).
    #[arg(long, value_name = "ADDR", value_parser = parse_status_addr, requires = "watch")]
    pub status: Option<std::net::SocketAddr>,
    /// The token a request must carry (Authorization: Bearer TOKEN, or
    /// ?token=TOKEN); required for an ADDR that is not loopback. Seen by
    /// every user in `ps`: prefer --status-token-file or the environment
    /// variable FERRY_STATUS_TOKEN.
    #[arg(long, value_name = "TOKEN", requires = "status")]
    pub status_token: Option<String>,
    /// The status page's token, read from the first line of FILE.
    #[arg(
        long,
        value_name = "FILE",
        requires = "status",
        conflicts_with = "status_token"
    )]
    pub status_token_file: Option<std::path::PathBuf>,
}

/// `--rescan`: an interval, or `0`/`off` for never (zero).
fn parse_rescan(s: &str) -> Result<std::time::Duration, String> {
    match s {
        "off" => Ok(std::time::Duration::ZERO),
        _ => crate::filter_args::parse_duration(s),
    }
}

/// `PORT` (on 127.0.0.1) or `IP:PORT`.
fn parse_status_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| format!("{s:?}: expected PORT or IP:PORT (e.g. 127.0.0.1:7878)"))
}

/// Output flags of copy, sync and bisync.
#[derive(Args, Debug)]
pub struct OutputArgs {
    /// JSON lines on stdout: one per action, the summary last.
    #[arg(long)]
    pub json: bool,
    /// Show progress on stderr [default: when stderr is a terminal].
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show progress.
    #[arg(long)]
    pub no_progress: bool,
    /// Print each action.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// What is in the run: rules on names, sizes and mtimes (copy, sync,
/// bisync). The order they are evaluated in is in docs/CLI.md.
#[derive(Args, Debug)]
pub struct FilterArgs {
    /// Exclude paths matching GLOB (gitignore syntax; repeatable).
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Read exclude rules (gitignore syntax) from FILE (repeatable).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,
    /// Take files matching GLOB (repeatable); given, every other file is
    /// left out (directories are still walked).
    #[arg(long, value_name = "GLOB")]
    pub include: Vec<String>,
    /// Read rules from FILE: `+ GLOB` takes, `- GLOB` leaves out, the first
    /// match wins; `#` starts a comment (repeatable).
    #[arg(long, value_name = "FILE")]
    pub filter_from: Vec<PathBuf>,
    /// Leave out files smaller than SIZE (bytes, or 100K, 10M, 1.5G, 2T:
    /// powers of 1024).
    #[arg(long, value_name = "SIZE", value_parser = crate::filter_args::parse_size)]
    pub min_size: Option<u64>,
    /// Leave out files larger than SIZE (bytes, or 100K, 10M, 1.5G, 2T:
    /// powers of 1024).
    #[arg(long, value_name = "SIZE", value_parser = crate::filter_args::parse_size)]
    pub max_size: Option<u64>,
    /// Leave out files modified less than AGE ago (30s, 10m, 2h, 7d, 2w) or
    /// after a date (2026-01-02, 2026-01-02T15:04:05Z).
    #[arg(long, value_name = "AGE", value_parser = crate::filter_args::parse_when)]
    pub min_age: Option<i128>,
    /// Leave out files modified more than AGE ago (30s, 10m, 2h, 7d, 2w) or
    /// before a date (2026-01-02, 2026-01-02T15:04:05Z).
    #[arg(long, value_name = "AGE", value_parser = crate::filter_args::parse_when)]
    pub max_age: Option<i128>,
}

/// What a run keeps of the files it replaces or deletes (docs/CLI.md,
/// "Keeping what is replaced").
#[derive(Args, Debug, Clone, Default)]
pub struct KeepArgs {
    /// Move each file the run replaces or deletes into DIR first, at its
    /// path below DST (rsync's --backup-dir; a relative DIR is relative to
    /// DST's root; it must be on DST's backend: a rename or a server-side
    /// copy, never a download).
    #[arg(long, value_name = "DIR", conflicts_with = "versions")]
    pub backup_dir: Option<String>,
    /// Add SUF to the names of kept files; without --backup-dir, keep them
    /// beside the file (and never delete names ending in SUF).
    #[arg(long, value_name = "SUF", conflicts_with = "versions")]
    pub suffix: Option<String>,
    /// Keep replaced and deleted files beside them with the suffix "~"
    /// (rsync's -b), unless --backup-dir or --suffix says otherwise.
    #[arg(short = 'b', long, conflicts_with = "versions")]
    pub backup: bool,
    /// Keep each replaced or deleted file as a version in .ferry-versions/
    /// at the root of the replica (never synced); see `ferry versions` and
    /// `ferry restore`.
    #[arg(long)]
    pub versions: bool,
    /// Versions to keep per file: the N newest, or `staggered` (one per
    /// hour for a day, per day for a month, per week after) [default: all].
    #[arg(long, value_name = "N|staggered", requires = "versions", value_parser = ferry_engine::keep::KeepArg::parse)]
    pub keep: Option<ferry_engine::keep::KeepArg>,
    /// Drop versions kept more than DAYS days ago.
    #[arg(long, value_name = "DAYS", requires = "versions")]
    pub keep_days: Option<u32>,
}

// retention() and any(): for the pruning of --versions and bisync (issue 17, other helpers).
#[allow(dead_code)]
impl KeepArgs {
    /// The retention policy of `--versions`.
    pub fn retention(&self) -> ferry_engine::keep::Retention {
        use ferry_engine::keep::{KeepArg, Retention};
        Retention {
            last: match self.keep {
                Some(KeepArg::Last(n)) => Some(n),
                _ => None,
            },
            staggered: self.keep == Some(KeepArg::Staggered),
            days: self.keep_days,
        }
    }

    /// Refuse a retention that cannot apply: `--keep`/`--keep-days`
    /// without `--versions` (`--backup-dir` and `--suffix` keep every
    /// file), and `--keep-days 0` (which would drop every version).
    pub fn check(&self) -> Result<(), String> {
        if !self.versions && (self.keep.is_some() || self.keep_days.is_some()) {
            let flag = if self.keep.is_some() {
                "--keep"
            } else {
                "--keep-days"
            };
            return Err(format!(
                "{flag} prunes the versions of --versions; --backup-dir, --suffix and -b keep every file (prune them yourself)"
            ));
        }
        if self.keep_days == Some(0) {
            return Err("invalid --keep-days 0 (a number of days, at least 1)".into());
        }
        Ok(())
    }

    /// True when the run keeps what it replaces or deletes.
    pub fn any(&self) -> bool {
        self.backup_dir.is_some() || self.suffix.is_some() || self.backup || self.versions
    }
}

/// The clock of kept versions (`FERRY_TEST_NOW` in tests).
pub fn now_unix() -> i64 {
    ferry_engine::keep::clock_now()
}

#[derive(Args, Debug)]
pub struct SyncArgs {
    /// Source directory (its content is copied) or file.
    pub src: PathBuf,
    /// Destination directory (created if missing) or file path.
    pub dst: PathBuf,
    /// Print what would change; change nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Compare content, not size and mtime, of same-size files.
    #[arg(short = 'c', long)]
    pub checksum: bool,
    /// Keep hard links: names of one file in SRC are names of one file in
    /// DST (copied once, linked), also across runs.
    #[arg(short = 'H', long)]
    pub hard_links: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub tx: TransferArgs,
    #[command(flatten)]
    pub out: OutputArgs,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub attrs: AttrArgs,
    #[command(flatten)]
    pub watch: WatchArgs,
    #[command(flatten)]
    pub keep: KeepArgs,
    /// Refuse (exit 2, nothing changed) a run that would remove more than N
    /// entries of DST, or more than P% of them (e.g. 100, 10%).
    #[arg(long, value_name = "N|P%", value_parser = ferry_engine::MaxDelete::parse)]
    pub max_delete: Option<ferry_engine::MaxDelete>,
    /// Go ahead with an SRC that is missing (an s3:// prefix without
    /// objects is taken as an empty tree) or empty while DST is not (sync
    /// then deletes everything in DST).
    #[arg(long)]
    pub force: bool,
}

impl FilterArgs {
    /// The compiled rules, `None` when there are none.
    pub fn build(&self) -> Result<Option<ferry_engine::Filter>, String> {
        ferry_engine::Filter::new(&ferry_engine::filter::Rules {
            include: self.include.clone(),
            exclude: self.exclude.clone(),
            exclude_from: self.exclude_from.clone(),
            filter_from: self.filter_from.clone(),
            min_size: self.min_size,
            max_size: self.max_size,
            mtime_from: self.max_age,
            mtime_to: self.min_age,
        })
        .map_err(|e| e.to_string())
    }
}

impl OutputArgs {
    /// `--progress` / `--no-progress`: the flags, else on when stderr is a
    /// terminal and stdout is not JSON.
    pub fn progress_enabled(&self) -> bool {
        !self.no_progress && (self.progress || (std::io::stderr().is_terminal() && !self.json))
    }
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// Directory (or file) to list.
    pub path: PathBuf,
    /// One JSON object per entry.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub tx: TransferArgs,
    /// S3: show each object's upload time (LastModified) instead of the
    /// mtime kept in its metadata, and no mode: the listing alone, no HEAD
    /// request per object.
    #[arg(long)]
    pub server_mtime: bool,
}

/// The keeper of a run whose destination is `dst` (`None`: nothing kept),
/// from `--backup-dir`, `--suffix`, `-b` and `--versions`; an error is a
/// usage error (exit 2).
pub fn keeper(k: &KeepArgs, dst: &Root) -> Result<Option<ferry_engine::keep::Keeper>, String> {
    use ferry_engine::keep::{KeepRule, Keeper};
    k.check()?;
    let suffix = k.suffix.as_deref().map(|s| s.as_bytes().to_vec());
    let rule = if k.versions {
        KeepRule::Versions
    } else if let Some(dir) = &k.backup_dir {
        KeepRule::BackupDir {
            base: ferry_backends::keep::keep_base(dst, std::ffi::OsStr::new(dir))?,
            suffix: suffix.unwrap_or_default(),
        }
    } else if let Some(s) = suffix {
        if s.is_empty() || s.contains(&b'/') {
            return Err(format!(
                "--suffix {:?}: must be non-empty and hold no '/' without --backup-dir",
                String::from_utf8_lossy(&s)
            ));
        }
        KeepRule::Suffix(s)
    } else if k.backup {
        KeepRule::Suffix(b"~".to_vec())
    } else {
        return Ok(None);
    };
    Ok(Some(Keeper::new(rule, now_unix())))
}
