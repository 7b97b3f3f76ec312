//! The remote shell backend: a path on another machine, reached with ssh
//! (`host:path`, `ssh://`), served by ferry there (`ferry serve`) or over
//! SFTP (`sftp://`, `--sftp`, or a host that cannot run ferry).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ferry_engine::class::cause;
use ferry_engine::keep::VERSIONS_DIR;
use ferry_engine::{Kind, Meta};
use ferry_sftp::SftpStore;
use ferry_ssh::SshStore;

use crate::{AnyStore, Backend, Backends, Error, Job, Jobs, Location, Opts, Root, Src, Watch};

/// The remote shell backend.
pub struct Shell;

/// Where a remote shell store is rooted: `[user@]host`, a port given in
/// an `ssh://` URL, the path there (relative: to the remote home), and
/// whether it is served over SFTP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshRoot {
    /// `[user@]host`.
    pub host: String,
    /// The port of an `ssh://host:port/` URL.
    pub port: Option<u16>,
    /// The path on the host (empty: the remote home).
    pub path: Vec<u8>,
    /// Served over SFTP (`sftp://`, `--sftp`), not by ferry there.
    pub sftp: bool,
}

impl SshRoot {
    /// The root of a `Location::Shell` (`host:path` or `ssh://...`),
    /// served over SFTP when `sftp`.
    pub fn of(text: &str, host: &str, path: &str, sftp: bool) -> Result<SshRoot, Error> {
        let url = text.starts_with("ssh://") || text.starts_with("sftp://");
        let (host, port) = match (url, host.rsplit_once(':')) {
            (true, Some((h, p))) if !p.contains(']') => (
                h,
                Some(
                    p.parse::<u16>()
                        .map_err(|_| Error::Refused(format!("{text}: bad port {p:?}")))?,
                ),
            ),
            _ => (host, None),
        };
        Ok(SshRoot {
            host: host.to_string(),
            port,
            path: path.as_bytes().to_vec(),
            sftp,
        })
    }

    /// The same host, rooted at `path`.
    pub fn at(&self, path: Vec<u8>) -> SshRoot {
        SshRoot {
            path,
            ..self.clone()
        }
    }

    /// `host:path` (`ssh://host:port/path` with a port), as a user writes it.
    pub fn text(&self) -> String {
        let path = String::from_utf8_lossy(&self.path);
        match self.port {
            Some(p) => format!("ssh://{}:{p}/{}", self.host, path.trim_start_matches('/')),
            None => format!("{}:{path}", self.host),
        }
    }
}

/// A session with a remote root's host, to ask about paths before a run.
enum Remote {
    /// `ferry serve` over ssh.
    Ssh(SshStore),
    /// SFTP.
    Sftp(SftpStore),
}

impl Remote {
    /// Metadata of `path` there (following a final symlink when
    /// `follow`), `None` when it does not exist.
    fn stat_path(&self, path: &[u8], follow: bool) -> io::Result<Option<Meta>> {
        match self {
            Remote::Ssh(s) => s.stat_path(path, follow),
            Remote::Sftp(s) => s.stat_path(path, follow),
        }
    }

    /// [`Remote::stat_path`] of a root (a final symlink followed): over
    /// ssh, a directory is opened in the same round trip, for the store
    /// rooted there to take without asking again.
    fn stat_root(&self, path: &[u8]) -> io::Result<Option<Meta>> {
        match self {
            Remote::Ssh(s) => s.stat_root(path),
            Remote::Sftp(s) => s.stat_path(path, true),
        }
    }

    /// `r` as a root of the backend this session speaks.
    fn root(&self, r: SshRoot) -> Root {
        Root::Shell(SshRoot {
            sftp: matches!(self, Remote::Sftp(_)),
            ..r
        })
    }
}

impl Backends {
    /// A session with the host of `r`, rooted at its path. A root served
    /// by ferry whose host was reached but cannot run ferry (none there
    /// and none installed: `--no-remote-install`, another OS or
    /// architecture, a shell that runs only `internal-sftp`; not a ferry
    /// named with `--remote-ferry`) is served over SFTP instead, with one
    /// note on stderr per host. When SFTP cannot start either, the SSH
    /// error is the one reported. No fallback when the command line asks
    /// for what SFTP cannot keep (`only_ferry_keeps`: `-H`, `-X`, `-A`),
    /// nor when ferry refused to run a cached file that is not itself: the
    /// run stops with one line (exit 2), as it does when ssh itself failed.
    fn remote(&self, r: &SshRoot) -> Result<Remote, Error> {
        self.remote_walking(r, false)
    }

    /// [`Backends::remote`]; `walk`: the run walks the tree at `r`'s path,
    /// which a ferry there lists ahead from its start.
    fn remote_walking(&self, r: &SshRoot, walk: bool) -> Result<Remote, Error> {
        let set = self.settings();
        let t = ferry_ssh::Target::with(&r.host, r.port, &ssh_settings(set))
            .map_err(|e| Error::Connect(e.0))?;
        let key = (r.host.clone(), r.port);
        let fell = self.fell_back.lock().contains(&key);
        if r.sftp || fell {
            return Ok(Remote::Sftp(
                SftpStore::open(&t, &r.path).map_err(|e| Error::Connect(e.0))?,
            ));
        }
        let why = match SshStore::open_walking(&t, &r.path, walk) {
            Ok(s) => return Ok(Remote::Ssh(s)),
            // ssh failed, ferry refused, or the user named the ferry to run there.
            Err(why) if !why.ferry_cannot_run() || set.remote_ferry.is_some() => {
                return Err(Error::Connect(why.0))
            }
            Err(why) => why.0,
        };
        if let Some(refused) = no_fallback(&set.only_ferry_keeps, &r.host, &why) {
            return Err(Error::Connect(refused));
        }
        let s = SftpStore::connect(&t)
            .map_err(|_| Error::Connect(why.clone()))?
            .at(&r.path)
            .map_err(|e| Error::Connect(e.0))?;
        let mut fell = self.fell_back.lock();
        if !fell.contains(&key) {
            fell.push(key);
            // What a user would not expect to lose is said, not only the switch.
            eprintln!(
                "ferry: note: ferry cannot run on {}: using SFTP (mtimes to the second; no owners, fifos, device nodes or holes) ({why})",
                r.host
            );
        }
        Ok(Remote::Sftp(s))
    }

    /// A session with `r`'s host (`text`: the location as typed, naming
    /// it in errors; `walk`: as [`Backends::remote_walking`]).
    fn session(&self, r: &SshRoot, text: &str, walk: bool) -> Result<Remote, Error> {
        self.remote_walking(r, walk)
            .map_err(|e| Error::Connect(format!("{text}: {e}")))
    }
}

/// The settings of SSH and SFTP sessions, from this run's.
pub(crate) fn ssh_settings(set: &crate::Settings) -> ferry_ssh::Settings {
    ferry_ssh::Settings {
        rsh: set.rsh.clone(),
        remote_ferry: set.remote_ferry.clone(),
        connections: set.connections,
        no_remote_install: set.no_remote_install,
        only_ferry_keeps: set.only_ferry_keeps.clone(),
        timeout: Shell::timeout(set.timeout),
        read_only: set.read_only,
    }
}

/// The one line that stops a run whose host cannot run ferry (`why`)
/// when the command line asks for what only ferry there keeps (`asked`);
/// `None` when SFTP may serve it.
fn no_fallback(asked: &[String], host: &str, why: &str) -> Option<String> {
    if asked.is_empty() {
        return None;
    }
    let them = if asked.len() == 1 { "it" } else { "them" };
    Some(format!(
        "{host}: ferry cannot run there, and over SFTP {} would be lost; nothing was done (get ferry to run there, or go without {them}: leave {them} out, or give --sftp): {why}",
        asked.join(", "),
    ))
}

/// A remote path's parent and last component (`dir/` is `dir`; an empty
/// parent is the remote home).
fn split_remote(path: &[u8]) -> (Vec<u8>, OsString) {
    let mut p = path;
    while p.len() > 1 && p.ends_with(b"/") {
        p = &p[..p.len() - 1];
    }
    match p.iter().rposition(|b| *b == b'/') {
        Some(0) => (b"/".to_vec(), OsStr::from_bytes(&p[1..]).to_owned()),
        Some(i) => (p[..i].to_vec(), OsStr::from_bytes(&p[i + 1..]).to_owned()),
        None => (Vec::new(), OsStr::from_bytes(p).to_owned()),
    }
}

/// Stat a remote path, following a final symlink; `what` (SRC, DST)
/// names it in errors.
fn stat(s: &Remote, path: &[u8], what: &str, text: &str) -> Result<Option<Meta>, Error> {
    s.stat_path(path, true)
        .map_err(|e| Error::Refused(format!("{what} {text}: {}", cause(&e))))
}

/// [`stat`] of SRC or DST itself, whose tree the run opens next: opened
/// in the same request where the session can ([`Remote::stat_root`]).
fn stat_root(s: &Remote, path: &[u8], what: &str, text: &str) -> Result<Option<Meta>, Error> {
    s.stat_root(path)
        .map_err(|e| Error::Refused(format!("{what} {text}: {}", cause(&e))))
}

/// The remote parent of a DST to be created must be a directory.
fn parent_dir(s: &Remote, parent: &[u8], text: &str) -> Result<(), Error> {
    let name = if parent.is_empty() {
        "(home)".into()
    } else {
        String::from_utf8_lossy(parent)
    };
    match stat(s, parent, "DST", text)? {
        Some(m) if m.kind == Kind::Dir => Ok(()),
        Some(_) => Err(Error::Refused(format!(
            "DST {text}: parent {name}: not a directory"
        ))),
        None => Err(Error::Refused(format!(
            "DST {text}: parent directory {name}: no such directory"
        ))),
    }
}

/// (device, inode) of a remote directory and of each directory above it
/// (`p/..`, `p/../..`, ...: the server resolves symlinks on the way).
fn remote_chain(s: &Remote, p: &[u8]) -> Vec<(u64, u64)> {
    let mut at = if p.is_empty() {
        b".".to_vec()
    } else {
        p.to_vec()
    };
    let mut out: Vec<(u64, u64)> = Vec::new();
    for _ in 0..256 {
        let id = match s.stat_path(&at, true) {
            Ok(Some(m)) if m.ino != 0 => (m.dev, m.ino),
            _ => break,
        };
        if out.contains(&id) {
            break;
        }
        out.push(id);
        at.extend_from_slice(b"/..");
    }
    out
}

/// Refuse remote roots on one server (`path`, shown as `id`) that are the
/// same directory or one inside the other, by identity.
fn remote_overlap(s: &Remote, src: (&[u8], &str), dst: (&[u8], &str)) -> Result<(), Error> {
    let (cs, cd) = (remote_chain(s, src.0), remote_chain(s, dst.0));
    let why = "same device and inode: another path to it";
    Err(Error::Refused(match (cs.first(), cd.first()) {
        (Some(x), Some(y)) if x == y => format!(
            "SRC {} and DST {} are the same directory ({why})",
            src.1, dst.1
        ),
        (Some(x), _) if cd.contains(x) => format!("DST {} is inside SRC {} ({why})", dst.1, src.1),
        (_, Some(y)) if cs.contains(y) => format!("SRC {} is inside DST {} ({why})", src.1, dst.1),
        _ => return Ok(()),
    }))
}

fn typed(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Stat `path` with `s`; `None`: not there.
fn ls_stat(
    path: &[u8],
    stat: impl Fn(&[u8]) -> io::Result<Option<Meta>>,
) -> io::Result<Option<Meta>> {
    let meta = stat(path)?.ok_or_else(|| io::Error::from_raw_os_error(2))?;
    Ok((meta.kind != Kind::Dir).then_some(meta))
}

impl Backend for Shell {
    type Root = SshRoot;

    const SCHEMES: &'static [&'static str] = &["ssh", "sftp"];

    fn parse(reg: &Backends, loc: &Location) -> Option<Result<SshRoot, Error>> {
        let Location::Shell { text, host, path } = loc else {
            return None;
        };
        let sftp = text.starts_with("sftp://") || reg.settings().sftp;
        Some(SshRoot::of(text, host, path, sftp))
    }

    fn timeout(given: Option<std::time::Duration>) -> Option<std::time::Duration> {
        Some(given.unwrap_or(ferry_ssh::quiet::DEFAULT_TIMEOUT))
    }

    fn id(r: &SshRoot) -> String {
        r.text().trim_end_matches('/').to_string()
    }

    fn local_path(_: &SshRoot) -> Option<&Path> {
        None
    }

    fn location(r: &SshRoot, _: &[u8]) -> Vec<u8> {
        let mut path = r.path.as_slice();
        while path.len() > 1 && path.ends_with(b"/") {
            path = &path[..path.len() - 1];
        }
        match r.port {
            Some(p) => [
                format!("ssh://{}:{p}/", r.host).as_bytes(),
                path.strip_prefix(b"/").unwrap_or(path),
            ]
            .concat(),
            None => [format!("{}:", r.host).as_bytes(), path].concat(),
        }
    }

    fn open(reg: &Backends, r: &SshRoot, o: &Opts) -> Result<AnyStore, Error> {
        Ok(match reg.remote_walking(r, o.walk)? {
            Remote::Ssh(s) => AnyStore::Ssh(s),
            Remote::Sftp(s) => AnyStore::Sftp(s),
        })
    }

    fn pair(
        _: &Backends,
        _: (&Path, &SshRoot),
        _: (&Path, &SshRoot),
    ) -> Option<Result<Job, Error>> {
        None
    }

    fn src(reg: &Backends, p: &Path, r: SshRoot, _: bool) -> Result<Src, Error> {
        let text = &typed(p);
        let s = reg.session(&r, text, true)?;
        match stat_root(&s, &r.path, "SRC", text)? {
            None => Err(Error::Refused(format!(
                "SRC {text}: no such file or directory"
            ))),
            Some(m) if m.kind == Kind::Dir => Ok(Src::Tree(s.root(r))),
            Some(m) if m.kind == Kind::File => {
                let (parent, name) = split_remote(&r.path);
                Ok(Src::One(s.root(r.at(parent)), name.clone(), name))
            }
            Some(_) => Err(Error::Refused(format!(
                "SRC {text}: not a regular file or directory"
            ))),
        }
    }

    fn dst_tree(reg: &Backends, p: &Path, r: SshRoot) -> Result<Root, Error> {
        let text = &typed(p);
        let s = reg.session(&r, text, true)?;
        match stat_root(&s, &r.path, "DST", text)? {
            Some(m) if m.kind == Kind::Dir => Ok(s.root(r)),
            Some(_) => Err(Error::Refused(format!(
                "DST {text}: exists and is not a directory (SRC is a directory tree)"
            ))),
            None => {
                parent_dir(&s, &split_remote(&r.path).0, text)?;
                Ok(s.root(r))
            }
        }
    }

    fn dst_one(
        reg: &Backends,
        p: &Path,
        r: SshRoot,
        name: &OsStr,
    ) -> Result<(Root, OsString), Error> {
        let text = &typed(p);
        let into = p.as_os_str().as_bytes().ends_with(b"/");
        let s = reg.session(&r, text, false)?;
        let (parent, file) = split_remote(&r.path);
        match stat_root(&s, &r.path, "DST", text)? {
            Some(m) if m.kind == Kind::Dir => Ok((s.root(r), name.to_owned())),
            Some(m) if m.kind == Kind::File => Ok((s.root(r.at(parent)), file)),
            Some(_) => Err(Error::Refused(format!(
                "DST {text}: not a regular file or directory"
            ))),
            None if into => Err(Error::Refused(format!(
                "DST {text}: no such directory (create it, or name the target file)"
            ))),
            None => {
                parent_dir(&s, &parent, text)?;
                Ok((s.root(r.at(parent)), file))
            }
        }
    }

    fn replica(_: &Path, r: SshRoot, _: &str) -> Result<Root, Error> {
        Ok(Root::Shell(r))
    }

    fn overlap(reg: &Backends, job: &Job, a: &SshRoot, b: &SshRoot) -> Result<(), Error> {
        if a.host != b.host || a.port != b.port || job.one.is_some() {
            return Ok(());
        }
        let (pa, pb) = (job.src.id(), job.dst.id());
        let inside = |x: &str, y: &str| x == y || x.starts_with(&format!("{y}/"));
        if inside(&pa, &pb) || inside(&pb, &pa) {
            return Err(Error::Refused(format!("SRC {pa} and DST {pb} overlap")));
        }
        // Another path to one directory there (a symlink, `..`): by
        // device and inode, as the server answers.
        let s = reg
            .remote(a)
            .map_err(|e| Error::Connect(format!("SRC {pa}: {e}")))?;
        remote_overlap(&s, (&a.path, &pa), (&b.path, &pb))
    }

    fn same_replicas(_: &SshRoot, _: &SshRoot) -> Result<(), Error> {
        // Not asked before a bisync today: the ids are compared.
        Ok(())
    }

    fn jobs(r: &SshRoot) -> Jobs {
        if r.sftp {
            // SFTP commits are pipelined across a worker's files (about
            // three round trips per batch, not per file): fewer workers
            // keep the link busy, and hundreds more only load the server.
            Jobs::RoundTrips {
                per_ms: 3,
                min: 32,
                max: 64,
            }
        } else {
            // Each worker waits one round trip per small file: enough of
            // them to keep the link busy (12 per ms of round trip).
            Jobs::RoundTrips {
                per_ms: 12,
                min: 32,
                max: 256,
            }
        }
    }

    fn ls_entry(loc: &Location, store: &AnyStore) -> io::Result<Option<Meta>> {
        let Location::Shell { path, .. } = loc else {
            return Ok(None);
        };
        match store {
            // (`StatRoot`: a tree is opened with it, and taken from the
            // connection's first write, which asked it.)
            AnyStore::Ssh(s) => ls_stat(path.as_bytes(), |p| s.stat_root(p)),
            AnyStore::Sftp(s) => ls_stat(path.as_bytes(), |p| s.stat_path(p, true)),
            _ => Ok(None),
        }
    }

    fn keeps(store: &AnyStore) -> &'static str {
        match store {
            AnyStore::Sftp(_) => {
                "SFTP keeps mode and mtime (to the second), no owner, extended attributes or ACLs"
            }
            _ => "this backend keeps no such attributes",
        }
    }

    fn watch(_: &SshRoot, store: &AnyStore, poll: std::time::Duration) -> Watch {
        match store {
            AnyStore::Ssh(s) => Watch::Source(Box::new(s.watcher(poll))),
            _ => Watch::Polled("SFTP: no ferry there to watch it"),
        }
    }

    fn refresh(store: &AnyStore) -> Result<bool, Error> {
        match store {
            AnyStore::Ssh(s) => s.refresh().map_err(|e| Error::Unavailable(e.0)),
            AnyStore::Sftp(s) => s.refresh().map_err(|e| Error::Unavailable(e.0)),
            _ => Ok(false),
        }
    }

    fn find_replica(
        reg: &Backends,
        r: &SshRoot,
        typed: &str,
    ) -> Result<Option<(Root, Vec<u8>)>, Error> {
        let s = reg
            .remote(r)
            .map_err(|e| Error::Connect(format!("{typed}: {e}")))?;
        let mut path = r.path.clone();
        while path.len() > 1 && path.ends_with(b"/") {
            path.pop();
        }
        let mut cut = path.len();
        loop {
            let c = &path[..cut];
            let probe = match c {
                b"" => VERSIONS_DIR.to_vec(),
                b"/" => [b"/", VERSIONS_DIR].concat(),
                _ => [c, b"/", VERSIONS_DIR].concat(),
            };
            // A file at PATH: no `.ferry-versions` below it.
            let m = match s.stat_path(&probe, true) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                    ) =>
                {
                    None
                }
                r => r.map_err(|e| Error::Refused(format!("{typed}: {}", cause(&e))))?,
            };
            if m.is_some_and(|m| m.kind == Kind::Dir) {
                let rel = path[cut..].strip_prefix(b"/").unwrap_or(&path[cut..]);
                return Ok(Some((s.root(r.at(c.to_vec())), rel.to_vec())));
            }
            match c.iter().rposition(|&b| b == b'/') {
                _ if c.is_empty() || c == b"/" => return Ok(None),
                Some(0) => cut = 1,
                Some(i) => cut = i,
                None => cut = 0,
            }
        }
    }
}
