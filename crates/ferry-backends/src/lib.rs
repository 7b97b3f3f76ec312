//! ferry's backend registry: a location argument parsed once
//! ([`Location`]), resolved to where a store is rooted ([`Root`]) and
//! opened as an [`AnyStore`], the one `Store` type the binary instantiates
//! the engine and bisync with.
//!
//! Everything that differs per backend is a method of the [`Backend`]
//! trait (none has a default), implemented once per backend (`local.rs`,
//! `s3.rs`, `shell.rs`); the `registry!` line below lists the
//! backends and makes [`Root`] and every dispatch over them. The binary
//! asks [`Backends`] (this run's registry, made from its [`Settings`]) and
//! matches on no backend. Adding a backend: its crate, one line in the
//! registry below (and its variant in `any.rs`'s `backends!`), its
//! `Backend` impl, docs (docs/DESIGN.md, "Backends").
#![deny(missing_docs)]

mod any;
mod backend;
mod error;
pub mod identity;
pub mod keep;
pub mod local;
pub mod location;
mod resolve;
mod s3;
pub(crate) mod shell;

use parking_lot::Mutex;
use std::path::Path;
use std::time::Duration;

use ferry_engine::encode::text_name_string;

pub use any::{AnyDir, AnyReader, AnyStore, AnyWriter};
pub use backend::{Backend, Jobs, Src, Watch};
pub use error::Error;
pub use ferry_local::LocalStore;
pub use ferry_s3::{S3Config, S3Store};
pub use ferry_sftp::SftpStore;
pub use ferry_ssh::SshStore;
pub use location::Location;
pub use resolve::Job;
pub use shell::SshRoot;

backend::registry! {
    Local(local::Local),
    S3(s3::S3),
    Shell(shell::Shell),
}

/// This run's settings for every backend (the command line's).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `--s3-endpoint` (unset: `AWS_ENDPOINT_URL`, or AWS).
    pub s3_endpoint: Option<String>,
    /// `--timeout`: S3 requests, SSH and SFTP sessions that move no byte
    /// for this long (unset: each backend's default).
    pub timeout: Option<Duration>,
    /// `--sftp`: every remote shell location is served over SFTP.
    pub sftp: bool,
    /// `-e/--rsh` (unset: `FERRY_RSH`, or `ssh`).
    pub rsh: Option<String>,
    /// `--remote-ferry` (unset: `ferry`, installed when missing).
    pub remote_ferry: Option<String>,
    /// `--connections` (unset: from the cores of both ends).
    pub connections: Option<u16>,
    /// `--no-remote-install`.
    pub no_remote_install: bool,
    /// What the command line asks for that only ferry on a remote keeps
    /// (`-H (hard links)`, ...): where ferry cannot run, the run stops
    /// rather than go over SFTP without it.
    pub only_ferry_keeps: Vec<String>,
    /// The command only reads (`ls`, `versions`, a dry run): a `ferry
    /// serve` it starts acts on no rollback record.
    pub read_only: bool,
}

/// This run's registry: its settings, and what it learnt of hosts.
pub struct Backends {
    set: Settings,
    /// Hosts (and ports) where ferry could not run, this run: reached over
    /// SFTP from then on. State learnt while running, not configuration.
    fell_back: Mutex<Vec<(String, Option<u16>)>>,
}

impl Backends {
    /// The registry of a run with the settings `set`.
    pub fn new(set: Settings) -> Backends {
        Backends {
            set,
            fell_back: Mutex::new(Vec::new()),
        }
    }

    /// This run's settings.
    pub fn settings(&self) -> &Settings {
        &self.set
    }

    /// The error of a location no backend serves: its scheme unknown.
    fn unknown(&self, loc: &Location) -> Error {
        let (scheme, text) = match loc {
            Location::Url { scheme, text } => (scheme.clone(), text.clone()),
            l => (String::new(), l.to_string()),
        };
        let known: Vec<String> = backend_schemes().map(|s| format!("{s}://")).collect();
        Error::UnknownScheme {
            text,
            scheme,
            known: known.join(", "),
        }
    }

    /// The worker threads of a run over `roots`: `--jobs` when a root is
    /// not local, else what the most demanding root wants ([`Jobs`]).
    pub fn jobs_for(&self, flag: Option<u16>, roots: &[&Root]) -> usize {
        if let Some(n) = flag.filter(|_| roots.iter().any(|r| r.local_path().is_none())) {
            return usize::from(n);
        }
        match roots.iter().map(|r| r.jobs()).max().unwrap_or(Jobs::Cores) {
            Jobs::Cores => jobs(flag),
            Jobs::Requests(n) => n,
            Jobs::RoundTrips { per_ms, min, max } => per_round_trip(per_ms, min, max),
        }
    }

    /// [`Backends::jobs_for`] without waiting for a round trip still being
    /// measured (its answer comes with a connection's first round trip
    /// after the hello, while the run's first listings have come already):
    /// the fewest workers now, and the count it gives once it is known
    /// (the walk grows to it, [`ferry_engine::MoreJobs`]).
    pub fn jobs_now(
        &self,
        flag: Option<u16>,
        roots: &[&Root],
    ) -> (usize, Option<ferry_engine::MoreJobs>) {
        // `-j` with a remote root is the count; so is one known now.
        let given = flag.is_some() && roots.iter().any(|r| r.local_path().is_none());
        let kind = roots.iter().map(|r| r.jobs()).max();
        match kind {
            Some(Jobs::RoundTrips { per_ms, min, max })
                if !given && !ferry_ssh::round_trip_known() =>
            {
                let later =
                    move || ferry_ssh::round_trip_known().then(|| per_round_trip(per_ms, min, max));
                (
                    min,
                    Some(ferry_engine::MoreJobs(std::sync::Arc::new(later))),
                )
            }
            _ => (self.jobs_for(flag, roots), None),
        }
    }

    /// The replica holding `path` (the nearest directory at or above it
    /// with a `.ferry-versions` directory) and `path` below it; `Err`
    /// with the line to say when there is none.
    pub fn find_replica(&self, path: &Path) -> Result<(Root, Vec<u8>), Error> {
        let loc = Location::parse(path.as_os_str());
        let typed = loc.to_string();
        let root = self.root_of(&loc)?;
        self.find_in(&root, &typed)?.ok_or_else(|| {
            Error::Refused(format!(
                "{typed}: no .ferry-versions directory in it or above it (versions are kept with --versions; for a --backup-dir, give it)"
            ))
        })
    }
}

/// Every scheme a backend serves, in the registry's order.
fn backend_schemes() -> impl Iterator<Item = &'static str> {
    SCHEMES.iter().flat_map(|s| s.iter().copied())
}

/// Workers for stores that wait one round trip per request: `per_ms` per
/// millisecond of this run's longest round trip, from `min` to `max`.
fn per_round_trip(per_ms: usize, min: usize, max: usize) -> usize {
    let ms = ferry_ssh::round_trip().map_or(0, |d| d.as_millis() as usize);
    (ms * per_ms).clamp(min, max)
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

/// The root of a local directory (or of the directory holding one file).
pub fn local_root(p: &Path) -> Root {
    Root::Local(p.to_path_buf())
}

impl Root {
    /// The location of `rel` below the root as raw bytes (what `--json`
    /// gives: the name as it is, never escaped): one `/` between the root
    /// and `rel`, none doubled.
    pub fn location(&self, rel: &[u8]) -> Vec<u8> {
        let mut id = self.base(rel);
        if rel.is_empty() {
            return id;
        }
        while id.ends_with(b"//") && !id.ends_with(b"://") {
            id.pop();
        }
        // `host:` (a remote home) and `s3://b/` take the path as it is.
        if !id.is_empty() && !id.ends_with(b"/") && !id.ends_with(b":") {
            id.push(b'/');
        }
        id.extend_from_slice(rel.strip_prefix(b"/").unwrap_or(rel));
        id
    }

    /// [`Root::location`] as text (escaped as text output escapes names).
    pub fn location_text(&self, rel: &[u8]) -> String {
        text_name_string(&self.location(rel))
    }
}

/// How to open a store.
#[derive(Clone, Copy, Debug, Default)]
pub struct Opts {
    /// Threads the store may use for one request of the engine (parallel
    /// stats of a big directory, parallel HEADs).
    pub jobs: usize,
    /// Object stores: list without reading each object's metadata (see
    /// `Store::approximate_meta`).
    pub lazy_meta: bool,
    /// The run walks the whole tree at the root first (a bisync's
    /// replicas): a ferry at the other end of an ssh session is told so
    /// when the session starts, and lists it ahead (its first levels
    /// answered unasked, protocol 18), as for the tree of a copy or sync.
    pub walk: bool,
}

/// End this run's sessions (ssh and what it started there), so that a
/// run leaves no ssh behind it.
pub fn close_all() {
    ferry_ssh::close_all();
}

/// Begin to end this run's sessions, without waiting ([`close_all`]
/// waits): for a run that sends no more requests.
pub fn end_all() {
    ferry_ssh::end_all();
}

#[cfg(test)]
mod tests;
