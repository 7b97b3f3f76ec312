//! Flags as typed (clap), then resolved: what SRC and DST mean. The rules
//! are in docs/CLI.md; every refusal here is a usage error (exit 2).

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use ferry_engine::bwlimit::parse_rate;
use ferry_engine::local::stat_path;
use ferry_engine::Kind;

use crate::output::cause;

/// Fast, safe file sync: copy and mirror directory trees.
#[derive(Parser, Debug)]
#[command(name = "ferry", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// S3: a request that receives (or sends) no byte for this many
    /// seconds fails and is retried [default: 30].
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

/// `90`, `90s`, `30m`, `24h`, `7d`.
pub fn parse_age(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'd')) => (&s[..i], 86400),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s}: not a duration (e.g. 30m, 24h, 7d)"))?;
    Ok(std::time::Duration::from_secs(n * mult))
}

#[derive(Args, Debug)]
pub struct BisyncArgs {
    /// First replica: a directory or s3://bucket/prefix.
    pub a: PathBuf,
    /// Second replica: a directory or s3://bucket/prefix.
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
    /// Journal file [default: $XDG_STATE_HOME/ferry/bisync/<hash of A and B>.sqlite].
    #[arg(long, value_name = "PATH")]
    pub journal: Option<PathBuf>,
    /// Exclude paths matching GLOB (gitignore syntax; repeatable).
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Read exclude rules (gitignore syntax) from FILE (repeatable).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,
    /// Worker threads [default: from the machine].
    #[arg(short = 'j', long, value_parser = clap::value_parser!(u16).range(1..=1024), value_name = "N")]
    pub jobs: Option<u16>,
    /// JSON lines on stdout: one per action, the summary last.
    #[arg(long)]
    pub json: bool,
    /// Show progress on stderr [default: when stderr is a terminal].
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show progress.
    #[arg(long)]
    pub no_progress: bool,
    /// Make each file's data durable (fsync) before it is named.
    #[arg(long)]
    pub fsync: bool,
    /// Limit bandwidth over all transfers, e.g. 10M, 512K (bytes per second).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bwlimit: Option<u64>,
    /// Print each action.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// S3 endpoint URL for s3:// paths (default: AWS_ENDPOINT_URL, or AWS).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
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
    /// Exclude paths matching GLOB (gitignore syntax; repeatable).
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Read exclude rules (gitignore syntax) from FILE (repeatable).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,
    /// Worker threads [default: from the machine].
    #[arg(short = 'j', long, value_parser = clap::value_parser!(u16).range(1..=1024), value_name = "N")]
    pub jobs: Option<u16>,
    /// Show progress on stderr [default: when stderr is a terminal].
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show progress.
    #[arg(long)]
    pub no_progress: bool,
    /// JSON lines on stdout: one per action, the summary last.
    #[arg(long)]
    pub json: bool,
    /// Limit bandwidth over all transfers, e.g. 10M, 512K (bytes per second).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bwlimit: Option<u64>,
    /// Make each file's data durable (fsync) before it is renamed into place.
    #[arg(long)]
    pub fsync: bool,
    /// Refuse (exit 2, nothing changed) a run that would remove more than N
    /// entries of DST, or more than P% of them (e.g. 100, 10%).
    #[arg(long, value_name = "N|P%", value_parser = ferry_engine::MaxDelete::parse)]
    pub max_delete: Option<ferry_engine::MaxDelete>,
    /// Print each action.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// S3 endpoint URL for s3:// paths (default: AWS_ENDPOINT_URL, or AWS).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// Go ahead with an SRC that is missing (an s3:// prefix without
    /// objects is taken as an empty tree) or empty while DST is not (sync
    /// then deletes everything in DST).
    #[arg(long)]
    pub force: bool,
}

impl SyncArgs {
    pub fn progress_enabled(&self) -> bool {
        progress_enabled(self.progress, self.no_progress, self.json)
    }
}

impl BisyncArgs {
    pub fn progress_enabled(&self) -> bool {
        progress_enabled(self.progress, self.no_progress, self.json)
    }
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// Directory (or file) to list.
    pub path: PathBuf,
    /// One JSON object per entry.
    #[arg(long)]
    pub json: bool,
    /// Worker threads [default: from the machine].
    #[arg(short = 'j', long, value_parser = clap::value_parser!(u16).range(1..=1024), value_name = "N")]
    pub jobs: Option<u16>,
    /// S3 endpoint URL for s3:// paths (default: AWS_ENDPOINT_URL, or AWS).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// S3: show each object's upload time (LastModified) instead of the
    /// mtime kept in its metadata, and no mode: the listing alone, no HEAD
    /// request per object.
    #[arg(long)]
    pub server_mtime: bool,
}

/// `--progress` / `--no-progress`: the flags, else on when stderr is a
/// terminal and stdout is not JSON.
fn progress_enabled(progress: bool, no_progress: bool, json: bool) -> bool {
    !no_progress && (progress || (std::io::stderr().is_terminal() && !json))
}

/// Worker threads: the flag, or two per core (workers block on I/O).
pub fn jobs(flag: Option<u16>) -> usize {
    flag.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            * 2
    })
}

/// One side of a copy or sync.
#[derive(Debug)]
pub enum Loc {
    /// A local directory.
    Local(PathBuf),
    /// An S3 bucket prefix.
    S3(Box<ferry_s3::S3Config>),
}

/// True for `s3://...` arguments.
pub fn is_s3(p: &Path) -> bool {
    p.to_str().is_some_and(|s| s.starts_with("s3://"))
}

/// One replica of a bisync, resolved, and the name the journal knows it by.
pub fn resolve_replica(
    p: &Path,
    what: &str,
    endpoint: Option<&str>,
) -> Result<(Loc, String), String> {
    if is_s3(p) {
        let url = p.to_str().expect("checked UTF-8");
        let cfg = ferry_s3::S3Config::from_url(url, endpoint)?;
        let id = format!("s3://{}/{}", cfg.bucket, cfg.prefix.trim_matches('/'));
        return Ok((Loc::S3(Box::new(cfg)), id));
    }
    let abs = match stat_path(p, true) {
        Ok(m) if m.kind != Kind::Dir => {
            return Err(format!("{what} {}: not a directory", p.display()))
        }
        Ok(_) => p
            .canonicalize()
            .map_err(|e| format!("{what} {}: {}", p.display(), cause(&e)))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (parent, name) = parent_and_name(what, p)?;
            parent.join(name)
        }
        Err(e) => return Err(format!("{what} {}: {}", p.display(), cause(&e))),
    };
    let id = abs.to_string_lossy().into_owned();
    Ok((Loc::Local(abs), id))
}

/// The canonical parent directory of a path that does not exist yet (the
/// parent must) and its last component; `what` names the path in errors.
pub fn parent_and_name(what: &str, p: &Path) -> Result<(PathBuf, OsString), String> {
    let name = p
        .file_name()
        .ok_or_else(|| format!("{what} {}: not a valid target name", p.display()))?;
    let parent = match p.parent() {
        Some(q) if !q.as_os_str().is_empty() => q,
        _ => Path::new("."),
    };
    let abs = parent.canonicalize().map_err(|e| {
        format!(
            "{what} {}: parent directory {}: {}",
            p.display(),
            parent.display(),
            cause(&e)
        )
    })?;
    Ok((abs, name.to_owned()))
}

/// Refuse replicas that are the same or nested.
pub fn check_pair(a: &(Loc, String), b: &(Loc, String)) -> Result<(), String> {
    let nested = |x: &str, y: &str| {
        let y = y.trim_end_matches('/');
        x == y || x.starts_with(&format!("{y}/"))
    };
    if nested(&a.1, &b.1) || nested(&b.1, &a.1) {
        return Err(format!("A {} and B {} overlap", a.1, b.1));
    }
    // Another path to the same directory (a bind mount, a symlink) is
    // caught by device and inode.
    if let (Loc::Local(x), Loc::Local(y)) = (&a.0, &b.0) {
        overlap_by_identity(x, y, ("A", "B"))?;
    }
    Ok(())
}

/// (device, inode) of a directory, following symlinks; `None` if it cannot
/// be stat'ed (a DST not created yet).
fn identity(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Refuse SRC and DST directories that are the same, or one inside the
/// other, by the identity of every ancestor rather than by path: a bind
/// mount (or any second path to a directory) shows the same directory
/// under another name, which path comparison cannot see.
fn overlap_by_identity(src: &Path, dst: &Path, (sn, dn): (&str, &str)) -> Result<(), String> {
    let chain = |p: &Path| -> Vec<((u64, u64), PathBuf)> {
        p.ancestors()
            .filter_map(|a| identity(a).map(|id| (id, a.to_path_buf())))
            .collect()
    };
    let (Some(sid), dst_chain) = (identity(src), chain(dst)) else {
        return Ok(());
    };
    if let Some((_, at)) = dst_chain.iter().find(|(id, _)| *id == sid) {
        return Err(if at == dst {
            format!(
                "{sn} {} and {dn} {} are the same directory (same device and inode: a bind mount or another path to it)",
                src.display(),
                dst.display()
            )
        } else {
            format!(
                "{dn} {} is inside {sn} {}: {} is the same directory as {sn} (same device and inode: a bind mount or another path to it)",
                dst.display(),
                src.display(),
                at.display()
            )
        });
    }
    if let Some(did) = identity(dst) {
        if let Some((_, at)) = chain(src).iter().find(|(id, _)| *id == did) {
            return Err(format!(
                "{sn} {} is inside {dn} {}: {} is the same directory as {dn} (same device and inode: a bind mount or another path to it)",
                src.display(),
                dst.display(),
                at.display()
            ));
        }
    }
    Ok(())
}

/// What a copy or sync will do, once SRC and DST are understood.
#[derive(Debug)]
pub enum Job {
    /// At least one side is remote (see `remote::resolve`).
    Remote(crate::remote::RemoteJob),
    /// Directory to directory.
    Tree { src: PathBuf, dst: PathBuf },
    /// One file to a file path.
    File {
        src_dir: PathBuf,
        src_name: OsString,
        dst_dir: PathBuf,
        dst_name: OsString,
    },
}

/// Decide what SRC and DST mean, or refuse (see docs/CLI.md).
pub fn resolve(src: &Path, dst: &Path) -> Result<Job, String> {
    let sm = stat_path(src, true).map_err(|e| format!("SRC {}: {}", src.display(), cause(&e)))?;
    let src_abs = src
        .canonicalize()
        .map_err(|e| format!("SRC {}: {}", src.display(), cause(&e)))?;
    let dm = match stat_path(dst, true) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("DST {}: {}", dst.display(), cause(&e))),
    };
    let dst_abs = match dm {
        Some(_) => dst
            .canonicalize()
            .map_err(|e| format!("DST {}: {}", dst.display(), cause(&e)))?,
        None => {
            let (parent, name) = parent_and_name("DST", dst)?;
            parent.join(name)
        }
    };
    if src_abs == dst_abs {
        return Err(format!("SRC and DST are the same: {}", src_abs.display()));
    }
    match sm.kind {
        Kind::Dir => {
            if dst_abs.starts_with(&src_abs) {
                return Err(format!(
                    "DST {} is inside SRC {}",
                    dst_abs.display(),
                    src_abs.display()
                ));
            }
            if src_abs.starts_with(&dst_abs) {
                return Err(format!(
                    "SRC {} is inside DST {}",
                    src_abs.display(),
                    dst_abs.display()
                ));
            }
            overlap_by_identity(&src_abs, &dst_abs, ("SRC", "DST"))?;
            if let Some(m) = dm {
                if m.kind != Kind::Dir {
                    return Err(format!(
                        "DST {}: exists and is not a directory (SRC is a directory)",
                        dst.display()
                    ));
                }
            }
            Ok(Job::Tree {
                src: src_abs,
                dst: dst_abs,
            })
        }
        Kind::File => {
            if let Some(m) = dm {
                if m.kind == Kind::Dir {
                    return Err(format!(
                        "DST {}: is a directory but SRC is a file; give the target file path (e.g. {}/{})",
                        dst.display(),
                        dst.display(),
                        src_abs.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
                    ));
                }
            }
            let split = |p: &Path| -> (PathBuf, OsString) {
                (
                    p.parent()
                        .map(Path::to_path_buf)
                        .unwrap_or_else(|| PathBuf::from("/")),
                    p.file_name().unwrap_or_default().to_owned(),
                )
            };
            let (src_dir, src_name) = split(&src_abs);
            let (dst_dir, dst_name) = split(&dst_abs);
            Ok(Job::File {
                src_dir,
                src_name,
                dst_dir,
                dst_name,
            })
        }
        _ => Err(format!(
            "SRC {}: not a regular file or directory",
            src.display()
        )),
    }
}
