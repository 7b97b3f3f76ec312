//! The [`Backend`] trait: everything that differs per backend, stated by
//! each backend (no method has a default: a backend that leaves one out
//! does not compile), and the registry that dispatches over them
//! ([`registry!`](crate) in lib.rs: one line per backend).

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;

use ferry_engine::Meta;

use crate::{AnyStore, Backends, Error, Job, Location, Opts, Root};

/// What SRC of a copy or sync turned out to be.
pub enum Src {
    /// A tree rooted there.
    Tree(Root),
    /// One file or object: where it is, its name there, and the name a
    /// directory DST gives it (the name typed).
    One(Root, OsString, OsString),
}

/// How many workers a run wants for a root of a backend (the flag
/// `--jobs` aside): the most demanding side of a run decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Jobs {
    /// From this machine's cores (local disks).
    Cores,
    /// A fixed number of requests in flight (an object store).
    Requests(usize),
    /// Enough workers to keep a link busy: `per_ms` per millisecond of
    /// the measured round trip, within `min..=max`.
    RoundTrips {
        /// Workers per millisecond of round trip.
        per_ms: usize,
        /// At least.
        min: usize,
        /// At most.
        max: usize,
    },
}

/// How a `--watch` learns of changes on one side.
pub enum Watch {
    /// inotify on this local directory.
    Local(std::path::PathBuf),
    /// A source of its own (the ferry at the other end of ssh).
    Source(Box<dyn ferry_watch::Source>),
    /// Listed and compared every `--poll`; why it cannot be watched.
    Polled(&'static str),
}

/// Everything that differs per backend. Implemented by a unit type per
/// backend; its roots are [`Backend::Root`], a variant of [`Root`].
///
/// Every fact is required. A backend that states them all compiles:
///
/// ```
/// # use std::{ffi::{OsStr, OsString}, io, path::Path, time::Duration};
/// # use ferry_backends::*;
/// # use ferry_engine::Meta;
/// struct New;
/// impl Backend for New {
///     type Root = String;
///     const SCHEMES: &'static [&'static str] = &["new"];
/// #   fn parse(_: &Backends, _: &Location) -> Option<Result<String, Error>> { None }
/// #   fn timeout(g: Option<Duration>) -> Option<Duration> { g }
/// #   fn id(r: &String) -> String { r.clone() }
/// #   fn local_path(_: &String) -> Option<&Path> { None }
/// #   fn location(r: &String, _: &[u8]) -> Vec<u8> { r.clone().into_bytes() }
/// #   fn open(_: &Backends, _: &String, _: &Opts) -> Result<AnyStore, Error> { todo!() }
/// #   fn pair(_: &Backends, _: (&Path, &String), _: (&Path, &String)) -> Option<Result<Job, Error>> { None }
/// #   fn src(_: &Backends, _: &Path, _: String, _: bool) -> Result<Src, Error> { todo!() }
/// #   fn dst_tree(_: &Backends, _: &Path, _: String) -> Result<Root, Error> { todo!() }
/// #   fn dst_one(_: &Backends, _: &Path, _: String, _: &OsStr) -> Result<(Root, OsString), Error> { todo!() }
/// #   fn replica(_: &Path, _: String, _: &str) -> Result<Root, Error> { todo!() }
/// #   fn same_replicas(_: &String, _: &String) -> Result<(), Error> { Ok(()) }
/// #   fn jobs(_: &String) -> Jobs { Jobs::Requests(8) }
/// #   fn ls_entry(_: &Location, _: &AnyStore) -> io::Result<Option<Meta>> { Ok(None) }
/// #   fn keeps(_: &AnyStore) -> &'static str { "nothing" }
/// #   fn watch(_: &String, _: &AnyStore, _: Duration) -> Watch { Watch::Polled("it cannot notify") }
/// #   fn refresh(_: &AnyStore) -> Result<bool, Error> { Ok(false) }
/// #   fn find_replica(_: &Backends, _: &String, _: &str) -> Result<Option<(Root, Vec<u8>)>, Error> { Ok(None) }
/// #   fn overlap(_: &Backends, _: &Job, _: &String, _: &String) -> Result<(), Error> { Ok(()) }
/// }
/// ```
///
/// One that leaves a fact out (here `overlap`: whether two of its roots
/// are one place) does not:
///
/// ```compile_fail,E0046
/// # use std::{ffi::{OsStr, OsString}, io, path::Path, time::Duration};
/// # use ferry_backends::*;
/// # use ferry_engine::Meta;
/// struct New;
/// impl Backend for New {
///     type Root = String;
///     const SCHEMES: &'static [&'static str] = &["new"];
/// #   fn parse(_: &Backends, _: &Location) -> Option<Result<String, Error>> { None }
/// #   fn timeout(g: Option<Duration>) -> Option<Duration> { g }
/// #   fn id(r: &String) -> String { r.clone() }
/// #   fn local_path(_: &String) -> Option<&Path> { None }
/// #   fn location(r: &String, _: &[u8]) -> Vec<u8> { r.clone().into_bytes() }
/// #   fn open(_: &Backends, _: &String, _: &Opts) -> Result<AnyStore, Error> { todo!() }
/// #   fn pair(_: &Backends, _: (&Path, &String), _: (&Path, &String)) -> Option<Result<Job, Error>> { None }
/// #   fn src(_: &Backends, _: &Path, _: String, _: bool) -> Result<Src, Error> { todo!() }
/// #   fn dst_tree(_: &Backends, _: &Path, _: String) -> Result<Root, Error> { todo!() }
/// #   fn dst_one(_: &Backends, _: &Path, _: String, _: &OsStr) -> Result<(Root, OsString), Error> { todo!() }
/// #   fn replica(_: &Path, _: String, _: &str) -> Result<Root, Error> { todo!() }
/// #   fn same_replicas(_: &String, _: &String) -> Result<(), Error> { Ok(()) }
/// #   fn jobs(_: &String) -> Jobs { Jobs::Requests(8) }
/// #   fn ls_entry(_: &Location, _: &AnyStore) -> io::Result<Option<Meta>> { Ok(None) }
/// #   fn keeps(_: &AnyStore) -> &'static str { "nothing" }
/// #   fn watch(_: &String, _: &AnyStore, _: Duration) -> Watch { Watch::Polled("it cannot notify") }
/// #   fn refresh(_: &AnyStore) -> Result<bool, Error> { Ok(false) }
/// #   fn find_replica(_: &Backends, _: &String, _: &str) -> Result<Option<(Root, Vec<u8>)>, Error> { Ok(None) }
/// }
/// ```
pub trait Backend {
    /// Where a store of this backend is rooted.
    type Root: Clone + std::fmt::Debug;

    /// The URL schemes it serves (`s3`), for parsing and for the message
    /// of an unknown one.
    const SCHEMES: &'static [&'static str];

    /// The root `loc` names, as typed (a local path is not resolved
    /// further), or `None` when `loc` is not this backend's.
    fn parse(reg: &Backends, loc: &Location) -> Option<Result<Self::Root, Error>>;

    /// The no-progress timeout of this backend's requests and sessions
    /// with `--timeout` `given` (`None`: not given, its default); `None`:
    /// it waits on no server (local disks).
    fn timeout(given: Option<std::time::Duration>) -> Option<std::time::Duration>;

    /// The root's name for the bisync journal and overlap checks.
    fn id(r: &Self::Root) -> String;

    /// The local directory, for a local root.
    fn local_path(r: &Self::Root) -> Option<&Path>;

    /// `rel` below the root as a user writes it, raw (`host:dir/rel`).
    fn location(r: &Self::Root, rel: &[u8]) -> Vec<u8>;

    /// Open the store rooted at `r`.
    fn open(reg: &Backends, r: &Self::Root, o: &Opts) -> Result<AnyStore, Error>;

    /// SRC and DST both of this backend, when it resolves such a pair by
    /// rules of its own (local paths: docs/CLI.md, "Arguments"); `None`:
    /// the rules of each side ([`Backend::src`], [`Backend::dst_tree`],
    /// [`Backend::dst_one`]) and [`Backend::overlap`].
    fn pair(
        reg: &Backends,
        src: (&Path, &Self::Root),
        dst: (&Path, &Self::Root),
    ) -> Option<Result<Job, Error>>;

    /// What SRC (`typed`, rooted at `r` as typed) is: a tree or one file.
    /// `force`: a missing (objectless) prefix is an empty tree.
    fn src(reg: &Backends, typed: &Path, r: Self::Root, force: bool) -> Result<Src, Error>;

    /// DST of a tree (created if missing, its parent must exist).
    fn dst_tree(reg: &Backends, typed: &Path, r: Self::Root) -> Result<Root, Error>;

    /// DST of one file `name`: a file path (key), or a directory
    /// (prefix) to put it in under `name`.
    fn dst_one(
        reg: &Backends,
        typed: &Path,
        r: Self::Root,
        name: &OsStr,
    ) -> Result<(Root, OsString), Error>;

    /// A bisync replica (`what`: A, B), resolved.
    fn replica(typed: &Path, r: Self::Root, what: &str) -> Result<Root, Error>;

    /// Refuse SRC and DST of this backend that overlap (one inside the
    /// other, the same object), by path and, where the server tells, by
    /// identity.
    fn overlap(reg: &Backends, job: &Job, src: &Self::Root, dst: &Self::Root) -> Result<(), Error>;

    /// Bisync replicas of this backend that are one, or one inside the
    /// other, by identity (paths are compared by the caller).
    fn same_replicas(a: &Self::Root, b: &Self::Root) -> Result<(), Error>;

    /// How many workers a run over this root wants.
    fn jobs(r: &Self::Root) -> Jobs;

    /// `ls`: the one entry the root names when it is not a tree (a file,
    /// an object with nothing below its key), `None` for a tree.
    fn ls_entry(loc: &Location, store: &AnyStore) -> io::Result<Option<Meta>>;

    /// What a store of this backend keeps of attributes, for the note of
    /// a run asking `-X`/`-A` of one that keeps none.
    fn keeps(store: &AnyStore) -> &'static str;

    /// How `--watch` learns of changes on this side.
    fn watch(r: &Self::Root, store: &AnyStore, poll: std::time::Duration) -> Watch;

    /// Before a watch's run: connect again if the connection was lost
    /// (`Ok(true)`: it was, and changes may have been missed).
    fn refresh(store: &AnyStore) -> Result<bool, Error>;

    /// The replica holding `r` (its nearest directory or prefix at or
    /// above it with a `.ferry-versions`) and `r`'s path below it.
    fn find_replica(
        reg: &Backends,
        r: &Self::Root,
        typed: &str,
    ) -> Result<Option<(Root, Vec<u8>)>, Error>;
}

/// The registry: each line one backend, `Variant(Type)`; it makes the
/// [`Root`] enum and every dispatch over backends.
macro_rules! registry {
    ($($v:ident($b:ty)),+ $(,)?) => {
        /// A location resolved to the root of a store of one backend.
        #[derive(Clone, Debug)]
        pub enum Root {
            $(
                #[allow(missing_docs)]
                $v(<$b as Backend>::Root),
            )+
        }

        /// Every scheme a backend serves.
        pub(crate) const SCHEMES: &[&[&str]] = &[$(<$b as Backend>::SCHEMES),+];

        impl Root {
            /// The root's name for the bisync journal and overlap checks:
            /// the canonical path, `s3://bucket/prefix` without a trailing
            /// `/`, `host:path`.
            pub fn id(&self) -> String {
                match self { $(Root::$v(r) => <$b>::id(r),)+ }
            }

            /// The local directory, for a local root.
            pub fn local_path(&self) -> Option<&std::path::Path> {
                match self { $(Root::$v(r) => <$b>::local_path(r),)+ }
            }

            /// The root part of [`Root::location`].
            fn base(&self, rel: &[u8]) -> Vec<u8> {
                match self { $(Root::$v(r) => <$b>::location(r, rel),)+ }
            }

            /// How many workers a run over this root wants.
            pub fn jobs(&self) -> Jobs {
                match self { $(Root::$v(r) => <$b>::jobs(r),)+ }
            }
        }

        impl Backends {
            /// The root of the store at `loc`, as typed (a local path is
            /// not resolved further: each command has its rules for that).
            pub fn root_of(&self, loc: &Location) -> Result<Root, Error> {
                $(
                    if let Some(r) = <$b>::parse(self, loc) {
                        return r.map(Root::$v);
                    }
                )+
                Err(self.unknown(loc))
            }

            /// Open the store rooted at `root`.
            pub fn open(&self, root: &Root, o: &Opts) -> Result<AnyStore, Error> {
                match root { $(Root::$v(r) => <$b>::open(self, r, o),)+ }
            }

            pub(crate) fn pair(&self, src: (&std::path::Path, &Root), dst: (&std::path::Path, &Root)) -> Option<Result<Job, Error>> {
                match (src.1, dst.1) {
                    $((Root::$v(a), Root::$v(b)) => <$b>::pair(self, (src.0, a), (dst.0, b)),)+
                    _ => None,
                }
            }

            pub(crate) fn src(&self, typed: &std::path::Path, root: Root, force: bool) -> Result<Src, Error> {
                match root { $(Root::$v(r) => <$b>::src(self, typed, r, force),)+ }
            }

            pub(crate) fn dst_tree(&self, typed: &std::path::Path, root: Root) -> Result<Root, Error> {
                match root { $(Root::$v(r) => <$b>::dst_tree(self, typed, r),)+ }
            }

            pub(crate) fn dst_one(&self, typed: &std::path::Path, root: Root, name: &std::ffi::OsStr) -> Result<(Root, std::ffi::OsString), Error> {
                match root { $(Root::$v(r) => <$b>::dst_one(self, typed, r, name),)+ }
            }

            /// Stores of two backends never overlap; each backend checks
            /// its own pairs.
            pub(crate) fn overlap(&self, job: &Job) -> Result<(), Error> {
                match (&job.src, &job.dst) {
                    $((Root::$v(a), Root::$v(b)) => <$b>::overlap(self, job, a, b),)+
                    _ => Ok(()),
                }
            }

            pub(crate) fn same_replicas(&self, a: &Root, b: &Root) -> Result<(), Error> {
                match (a, b) {
                    $((Root::$v(a), Root::$v(b)) => <$b>::same_replicas(a, b),)+
                    _ => Ok(()),
                }
            }

            pub(crate) fn replica_of(&self, typed: &std::path::Path, root: Root, what: &str) -> Result<Root, Error> {
                match root { $(Root::$v(r) => <$b>::replica(typed, r, what),)+ }
            }

            /// `ls`: the one entry `loc` (opened as `store`, rooted at
            /// `root`) names when it is not a tree, `None` for a tree.
            pub fn ls_entry(&self, root: &Root, loc: &Location, store: &AnyStore) -> std::io::Result<Option<ferry_engine::Meta>> {
                match root { $(Root::$v(_) => <$b>::ls_entry(loc, store),)+ }
            }

            /// What `store` (rooted at `root`) keeps of attributes, for the
            /// note of a run asking `-X`/`-A` of one that keeps none.
            pub fn keeps(&self, root: &Root, store: &AnyStore) -> &'static str {
                match root { $(Root::$v(_) => <$b>::keeps(store),)+ }
            }

            /// How `--watch` learns of changes on the side `root`.
            pub fn watch(&self, root: &Root, store: &AnyStore, poll: std::time::Duration) -> Watch {
                match root { $(Root::$v(r) => <$b>::watch(r, store, poll),)+ }
            }

            /// Before a watch's run: connect `store` (rooted at `root`)
            /// again if its connection was lost (`Ok(true)`: it was).
            pub fn refresh(&self, root: &Root, store: &AnyStore) -> Result<bool, Error> {
                match root { $(Root::$v(_) => <$b>::refresh(store),)+ }
            }

            pub(crate) fn find_in(&self, root: &Root, typed: &str) -> Result<Option<(Root, Vec<u8>)>, Error> {
                match root { $(Root::$v(r) => <$b>::find_replica(self, r, typed),)+ }
            }
        }
    };
}

pub(crate) use registry;
