//! The `Store` trait: what the engine needs from a backend (local disk today;
//! S3 and SSH later). Every operation is relative to an open directory handle
//! (`Store::Dir`) and a single name, so the local backend can use `*at()`
//! syscalls on directory fds and never resolve whole paths again.
//!
//! What only some backends can do is a capability the writer asks its source
//! for (`SourceFile::as_fd` lets the local writer use reflink or
//! `copy_file_range`), never a special case in the engine.

use std::any::Any;
use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::bwlimit::Limiter;
use crate::delta::{DiffSummary, OpSink, Signature};
use crate::entry::{Kind, Listing, Meta};
use crate::hash::{Hash, HashKind, HashSet};
use crate::keep::{KeepBase, KeepTo};
use crate::xattr::{XattrSel, Xattrs};

/// Which parts of an entry's metadata to change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaChange {
    /// Set the modification time.
    pub mtime: bool,
    /// Set the permission bits.
    pub mode: bool,
    /// Set owner and group.
    pub owner: bool,
}

impl MetaChange {
    /// Everything.
    pub const ALL: MetaChange = MetaChange {
        mtime: true,
        mode: true,
        owner: true,
    };

    /// True when nothing is to change.
    pub fn is_empty(&self) -> bool {
        !(self.mtime || self.mode || self.owner)
    }
}

/// A per-entry problem met while listing (the listing itself goes on).
#[derive(Debug)]
pub struct ListError {
    /// Name of the entry inside the listed directory.
    pub name: Vec<u8>,
    /// What went wrong.
    pub err: io::Error,
}

impl ListError {
    /// True when the error stands for entries of the listed directory that
    /// no path can name: its `name` is none an entry can have (empty, `.`,
    /// `..`, or holding a `/`), as for the S3 keys `a//z` or `x/../y`
    /// listed in `a` or `x`. Such entries exist but cannot be told apart
    /// from the other side's: nothing in the directory, or below it, is
    /// taken as gone (a sync deletes nothing there, a bisync leaves the
    /// directory alone), and they count as present (the directory is not
    /// empty).
    pub fn for_dir(&self) -> bool {
        let n = &self.name[..];
        n.is_empty() || n == b"." || n == b".." || n.contains(&b'/')
    }
}

/// An open file to read from.
pub trait SourceFile: Send {
    /// Read into `buf`; 0 at end of file.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// The file descriptor, when the source is a local file (enables
    /// reflink and `copy_file_range` in a local writer).
    fn as_fd(&self) -> Option<BorrowedFd<'_>>;
    /// Random access by several threads at once, when the source offers it
    /// (objects in S3): a writer fetches big files as parallel ranges and
    /// can resume a partial one.
    fn ranged(&self) -> Option<&dyn RangedSource> {
        None
    }
    /// The concrete reader, for a writer of the same backend that can copy
    /// without moving the data (S3 server-side copy).
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
    /// Exact metadata learned while opening or reading (S3: the GET's or
    /// HEAD's headers), for a source listed with approximate metadata.
    fn meta(&self) -> Option<Meta> {
        None
    }
    /// Size and modification time of the file now (a local file: one
    /// `fstat` of the open descriptor), to see whether it changed while it
    /// was copied; `None` when the store cannot tell cheaply.
    fn current(&self) -> Option<(u64, i64, u32)> {
        None
    }
    /// Where a writer that moves the bytes itself (`copy_file_range`,
    /// parallel ranged reads) counts them as they move, for progress.
    fn progress(&self) -> Option<&Progress<'_>> {
        None
    }
}

/// Bytes of one file's copy counted as they move, into the file's count and
/// the run's total (a progress display reads the latter).
#[derive(Debug)]
pub struct Progress<'a> {
    run: &'a AtomicU64,
    file: AtomicU64,
}

impl<'a> Progress<'a> {
    /// A count for one file, adding to `run` as well.
    pub fn new(run: &'a AtomicU64) -> Progress<'a> {
        Progress {
            run,
            file: AtomicU64::new(0),
        }
    }

    /// `n` more bytes moved.
    #[inline]
    pub fn add(&self, n: u64) {
        self.file.fetch_add(n, Ordering::Relaxed);
        self.run.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes of this file counted so far.
    pub fn file(&self) -> u64 {
        self.file.load(Ordering::Relaxed)
    }
}

/// A source file whose bytes are counted as they are read (and, through
/// [`SourceFile::progress`], by writers that move them themselves): what
/// every copy (copy, sync, bisync) reads through, so a progress display
/// moves within a big file.
pub struct Tracked<'a, R: SourceFile> {
    inner: R,
    progress: Progress<'a>,
}

impl<'a, R: SourceFile> Tracked<'a, R> {
    /// `inner`, its bytes counted into `run` as they move.
    pub fn new(inner: R, run: &'a AtomicU64) -> Self {
        Tracked {
            inner,
            progress: Progress::new(run),
        }
    }

    /// The reader counted.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// The copy is over and moved `n` bytes: count those no one counted on
    /// the way (a server-side copy moves them without reading).
    pub fn settle(&self, n: u64) {
        self.progress.add(n.saturating_sub(self.progress.file()));
    }
}

impl<R: SourceFile> SourceFile for Tracked<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.add(n as u64);
        Ok(n)
    }
    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.as_fd()
    }
    fn ranged(&self) -> Option<&dyn RangedSource> {
        self.inner.ranged()
    }
    fn as_any(&self) -> Option<&dyn Any> {
        self.inner.as_any()
    }
    fn meta(&self) -> Option<Meta> {
        self.inner.meta()
    }
    fn current(&self) -> Option<(u64, i64, u32)> {
        self.inner.current()
    }
    fn progress(&self) -> Option<&Progress<'_>> {
        Some(&self.progress)
    }
}

/// Largest piece [`RangedSource::read_range`] hands over at once.
pub const RANGE_PIECE: usize = 1 << 20;

/// A source readable at any offset, from several threads.
pub trait RangedSource: Sync {
    /// Size and an identity of the current content (an S3 ETag): a partial
    /// copy is resumed only for the same identity.
    fn identity(&self) -> io::Result<(u64, String)>;
    /// Read `[offset, offset + len)` of the content named by `identity` (an
    /// error if the content changed since), handing the bytes in order to
    /// `out` as (offset, bytes) pieces of up to [`RANGE_PIECE`], paced by
    /// `limit`. A broken connection is resumed from the last byte handed over.
    fn read_range(
        &self,
        offset: u64,
        len: u64,
        out: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
        limit: Option<&Limiter>,
    ) -> io::Result<()>;
}

/// `nsec` cut to a multiple of `step` ([`mtime_step`]): how every mtime of
/// a run is compared.
pub fn cut_nsec(nsec: u32, step: u32) -> u32 {
    nsec - nsec % step.max(1)
}

/// What the plan saw at a name that a run is about to replace or remove:
/// the act happens only while the name still holds it (the same kind,
/// inode, size and mtime, the mtime cut to `step`, and the change time
/// where both know it), so a write made there since the listing is never
/// lost, even one that put the size and mtime back (docs/CLI.md, "Checked
/// at the act").
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    /// The entry as listed.
    pub meta: Meta,
    /// The step its mtime was compared to ([`mtime_step`]).
    pub step: u32,
}

impl Planned {
    /// The entry `meta`, its mtime compared to `step`.
    pub fn new(meta: &Meta, step: u32) -> Planned {
        Planned { meta: *meta, step }
    }

    /// True when `now` (the entry at the name now; `None`: nothing) is
    /// still the entry planned. The change time ([`Meta::ctime`]) is
    /// compared where both have one, for a file listed with one name that
    /// still has one: a link count that is or was more moves the change
    /// time by the run's own acts (a rename over another name of a
    /// hard-linked file, an unlink, the hard link a keep makes before the
    /// file is replaced), and a file given another name keeps its bytes
    /// under that name too.
    pub fn holds(&self, now: Option<&Meta>) -> bool {
        let (Some(n), p) = (now, &self.meta) else {
            return false;
        };
        n.kind == p.kind
            && (n.ino == 0 || p.ino == 0 || n.ino == p.ino)
            && (n.kind == Kind::Dir
                || (n.size == p.size
                    && n.mtime_sec == p.mtime_sec
                    && cut_nsec(n.mtime_nsec, self.step) == cut_nsec(p.mtime_nsec, self.step)
                    && (n.ctime == 0
                        || p.ctime == 0
                        || p.nlink > 1
                        || n.nlink != p.nlink
                        || n.ctime == p.ctime)))
    }
}

/// The error of an act not done because its entry changed since it was
/// listed ([`Planned`]; a name planned free that is taken).
#[derive(Debug)]
pub struct Changed;

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("changed since it was listed; left alone (the next run sees it)")
    }
}

impl std::error::Error for Changed {}

/// A [`Changed`] error.
pub fn changed() -> io::Error {
    io::Error::other(Changed)
}

/// True when `e` says the connection to a remote store is gone (the
/// `ConnectionAborted` of the SSH and SFTP stores): not something a retry
/// another way (a whole file after a failed delta) can get past.
pub fn is_lost(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::ConnectionAborted
}

/// True when `e` says the disk is full (`ENOSPC`, or a store's own
/// `StorageFull`).
pub fn is_no_space(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull || e.raw_os_error() == Some(28)
}

/// `n` bytes as a person reads them (`1.0 GiB`, `512 B`).
pub fn bytes_text(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The error of a file of `need` bytes that did not fit on `end`'s disk
/// (`free`: bytes and inodes free there, when known), once what it had
/// written is gone: `no space left on device: needs 1.0 GiB, 50.0 MiB free`
/// (op `write`, so a line names the side).
pub fn no_space(end: End, need: u64, free: Option<(u64, u64)>) -> io::Error {
    let need = match need {
        0..1024 => format!("{need} bytes"),
        _ => format!("{} ({need} bytes)", bytes_text(need)),
    };
    let msg = match free {
        Some((_, 0)) => format!("needs an inode and {need}, no inode free"),
        Some((b, _)) => format!("needs {need}, {} free", bytes_text(b)),
        None => format!("needs {need}, free space unknown"),
    };
    let err = io::Error::new(
        io::ErrorKind::StorageFull,
        format!("no space left on device: {msg}"),
    );
    io::Error::new(
        io::ErrorKind::StorageFull,
        OpError {
            end: Some(end),
            op: "write",
            err,
        },
    )
}

/// True for a [`Changed`] error.
pub fn is_changed(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Changed>())
}

/// The end of a copy an operation was made on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Where the bytes are read.
    Src,
    /// Where they are written.
    Dst,
}

/// A system error with the operation that met it and the end of the copy
/// it was made on, for an error line that names the side
/// (`ferry: B: f4: rename: Operation not permitted`). Shown as the error
/// alone (a reporter adds what it wants of the rest); its kind is the
/// error's.
#[derive(Debug)]
pub struct OpError {
    /// The end of the copy (`None`: the caller knows it).
    pub end: Option<End>,
    /// The operation (`open`, `rename`, `unlink`...).
    pub op: &'static str,
    /// The error.
    pub err: io::Error,
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.err.fmt(f)
    }
}

impl std::error::Error for OpError {}

/// `e` tagged with the operation `op` on `end` ([`OpError`]): only a
/// system error (one that carries nothing else; already tagged or
/// carrying its own message, it is left as it is).
pub fn op_err(e: io::Error, end: Option<End>, op: &'static str) -> io::Error {
    if e.raw_os_error().is_none() {
        return e;
    }
    io::Error::new(e.kind(), OpError { end, op, err: e })
}

/// The operation and end an error was tagged with ([`op_err`]).
pub fn op_of(e: &io::Error) -> Option<(Option<End>, &'static str)> {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<OpError>())
        .map(|o| (o.end, o.op))
}

/// What a store can do, in one plain value ([`Store::features`]; as
/// rclone's `Features`): the engine reads it instead of asking one method
/// per capability. Every backend fills in every field (the struct has no
/// `Default`), so a new capability is a compile error in each backend until
/// it says what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// `list` gives exact sizes but only approximate other file metadata,
    /// because exact mtimes cost a request per entry (S3 keeps them in
    /// object metadata, which listings do not return). The engine then has
    /// [`Store::refine`] make exact only the files it compares.
    pub approximate_meta: bool,
    /// Each operation waits on a network round trip (S3): the engine then
    /// keeps many transfers in flight even within one directory.
    pub latency_bound: bool,
    /// Entries have owners that can be read and set (local, as root).
    pub preserves_owner: bool,
    /// The modes this store lists are those of this machine's own files (a
    /// local directory): trusted as they are. Modes from any other store
    /// (object metadata, another host over SSH or SFTP) reach a file
    /// without their setuid, setgid and sticky bits unless the run keeps
    /// them (`--keep-special-bits`; see [`crate::special`]).
    pub local_modes: bool,
    /// Directories have their own mtime and mode (false on object stores,
    /// where a directory is only a key prefix).
    pub dir_meta: bool,
    /// Entries have inodes ([`Meta::ino`]), which they keep when renamed
    /// (false on object stores: `ino` is 0 there, and an object's version
    /// is [`Meta::version`]).
    pub inodes: bool,
    /// A directory exists by itself, empty or not (false on object stores:
    /// a prefix exists while objects are under it, so making one creates
    /// nothing, and an empty directory cannot be kept).
    pub empty_dirs: bool,
    /// Symlinks can be stored (false on object stores: they are skipped
    /// with a note).
    pub symlinks: bool,
    /// How many workers should create entries in one directory at once
    /// (local filesystems serialize them on the directory's lock;
    /// `usize::MAX`: no limit).
    pub dir_write_lanes: usize,
    /// The finest step of the mtimes the store keeps, in nanoseconds (1:
    /// exact; SFTP keeps whole seconds). The engine compares mtimes to the
    /// coarser step of its two stores.
    pub mtime_step_ns: u32,
}

/// `io::ErrorKind::Unsupported`: what a store answers for an operation it
/// has no way to do.
pub fn unsupported() -> io::Error {
    io::Error::from(io::ErrorKind::Unsupported)
}

/// The value of no type: the extension type ([`Store::Delta`] and the
/// others) of a store that has no such extension. Its accessor returns
/// `None`, so none of its methods can ever be called.
#[derive(Debug)]
pub enum Absent {}

/// A backend: a tree of directories, files and symlinks. The core every
/// store has: listing, stat, open, create/commit, remove, rename, mkdir,
/// metadata. What only some stores can do is either a field of
/// [`Features`] or an extension trait the store opts into through its
/// accessor ([`Store::delta`], [`Store::xattrs`], [`Store::keeper`],
/// [`Store::posix`], [`Store::hashes`], [`Store::cleanup`]; `None`: not
/// here). No method has a default body: a store (and `AnyStore`, which
/// forwards to every backend) says what it does for each, or does not
/// compile.
pub trait Store: Send + Sync + Sized {
    /// An open directory.
    type Dir: Send + Sync;
    /// A file open for reading.
    type Reader: SourceFile;
    /// A file being written under a temporary name.
    type Writer: Send;
    /// Delta transfers ([`DeltaStore`]); [`Absent`] where the store takes
    /// no part in them.
    type Delta: DeltaStore<Self>;
    /// Extended attributes and ACLs ([`XattrStore`]).
    type Xattrs: XattrStore<Self>;
    /// Keeping replaced entries ([`KeepStore`]).
    type Keep: KeepStore<Self>;
    /// Hard links, special files and the other things of a POSIX tree
    /// ([`PosixStore`]).
    type Posix: PosixStore<Self>;
    /// Hashes kept without reading the bytes ([`HashStore`]).
    type Hashes: HashStore<Self>;

    /// What the store can do.
    fn features(&self) -> Features;
    /// How the store takes part in delta transfers; `None`: not at all
    /// (then its source side is read here, see [`crate::delta::diff`]).
    fn delta(&self) -> Option<&Self::Delta>;
    /// Its extended attributes and ACLs; `None`: it keeps none.
    fn xattrs(&self) -> Option<&Self::Xattrs>;
    /// How it keeps what a run replaces; `None`: it cannot.
    fn keeper(&self) -> Option<&Self::Keep>;
    /// Its POSIX-only operations; `None`: not a POSIX tree.
    fn posix(&self) -> Option<&Self::Posix>;
    /// The hashes it keeps; `None`: none.
    fn hashes(&self) -> Option<&Self::Hashes>;
    /// Removal of what interrupted transfers left (`ferry cleanup`);
    /// `None`: the store keeps no such thing.
    fn cleanup(&self) -> Option<&dyn Cleanup>;

    /// Open the root directory, if it exists, with its metadata.
    fn open_root(&self) -> io::Result<Option<(Self::Dir, Meta)>>;
    /// Create the root directory (its parent must exist).
    fn create_root(&self) -> io::Result<Self::Dir>;

    /// List a directory into `out` (cleared first), sorted by name.
    /// `rel` is the directory's path relative to the root. Entries that
    /// vanish while listed are left out silently; entries that
    /// cannot be read are left out and reported in `errors`.
    fn list(
        &self,
        dir: &Self::Dir,
        rel: &[u8],
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()>;

    /// Make exact the metadata of the entries of `list` at `which` (files),
    /// where [`Features::approximate_meta`] (nothing to do elsewhere).
    /// Entries that cannot be read are reported in `errors`.
    fn refine(
        &self,
        dir: &Self::Dir,
        list: &mut Listing,
        which: &[usize],
        errors: &mut Vec<ListError>,
    ) -> io::Result<()>;

    /// Metadata of one entry of `dir` (not following a symlink), `None` if
    /// it does not exist: what a single-file copy needs instead of a listing.
    fn stat(&self, dir: &Self::Dir, name: &CStr) -> io::Result<Option<Meta>>;

    /// Open a subdirectory.
    fn open_dir(&self, parent: &Self::Dir, name: &CStr) -> io::Result<Self::Dir>;
    /// Create a subdirectory, writable by us; its final metadata is set by
    /// [`Store::set_dir_meta`] once its content is complete.
    fn make_dir(&self, parent: &Self::Dir, name: &CStr) -> io::Result<Self::Dir>;
    /// Set metadata of an open directory.
    fn set_dir_meta(&self, dir: &Self::Dir, meta: &Meta, what: MetaChange) -> io::Result<()>;

    /// Open a file for reading.
    fn open_file(&self, dir: &Self::Dir, name: &CStr) -> io::Result<Self::Reader>;
    /// A hint: the files `files` of `dir` (names, listed sizes) are about
    /// to be opened with [`Store::open_file`], in this order. A store whose
    /// open waits on a network round trip may send all those opens now, so
    /// that each [`Store::open_file`] finds its reply there (one round trip
    /// for them all, not one each). A file named here need not be opened
    /// after all: what was fetched for it is dropped with `dir`. A store
    /// without such a pipeline does nothing.
    fn open_ahead(&self, dir: &Self::Dir, files: &[(&CStr, u64)]);
    /// Read a symlink's target.
    fn read_link(&self, dir: &Self::Dir, name: &CStr) -> io::Result<Vec<u8>>;

    /// Start writing `name` under a temporary name in `dir`.
    fn create_file(&self, dir: &Self::Dir, name: &CStr, meta: &Meta) -> io::Result<Self::Writer>;
    /// Copy all of `src` into the writer; returns the bytes copied. `size` is
    /// the size the source had when listed: the copy reads one byte past it
    /// at most, so growth is seen without a second pass.
    /// `limit` paces the bytes (`--bwlimit`), shared by all transfers.
    /// `dir` is where the writer was created.
    fn write_from(
        &self,
        dir: &Self::Dir,
        w: &mut Self::Writer,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64>;
    /// What the commit of `w` may replace: `Some`, the entry the plan saw
    /// at the name (a file, symlink or special file); `None`, nothing (a
    /// name the plan saw free). A store that can check it cheaply (local:
    /// one `statx` right before the rename) fails the commit with
    /// [`changed`] when the name holds anything else, and replaces
    /// nothing; others may take it as a hint (a name that exists: no
    /// first attempt that only works for a new name). Commit replaces an
    /// existing entry with or without it.
    fn expect(&self, w: &mut Self::Writer, at: Option<&Planned>);
    /// Give the written file its metadata, optionally make it durable, and
    /// rename it into place (replacing a file or symlink of that name).
    fn commit(
        &self,
        dir: &Self::Dir,
        w: Self::Writer,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<()>;
    /// Like [`Store::commit`], without waiting for the store to confirm:
    /// a store whose commit is a request over a network sends it and
    /// returns at once; the result comes from [`Committing::wait`]. Until
    /// then the file must not be reported as copied (it may still fail),
    /// and its directory's metadata must not be set (the engine waits for
    /// every commit of a directory before it finishes the directory).
    /// Commits started one after the other may complete in any order. A
    /// store without such a pipeline commits here and now
    /// ([`Committing::done`]).
    fn commit_nowait<'a>(
        &'a self,
        dir: &'a Self::Dir,
        w: Self::Writer,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> Committing<'a>;
    /// The metadata a file committed with `written` now has, when the
    /// store knows it without asking (an object store keeps what it was
    /// given); `None` when it must be read back (a local file's inode).
    fn meta_after_commit(&self, written: &Meta) -> Option<Meta>;
    /// Create an empty file `name` that does not exist yet, with its
    /// metadata, in as few operations as the store can. `Ok(false)` when the
    /// store has no such shortcut or the name exists: the caller then goes
    /// the usual way (`create_file` ... `commit`).
    fn create_empty(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<bool>;
    /// Drop a writer and its temporary.
    fn abort(&self, dir: &Self::Dir, w: Self::Writer);

    /// Create (or atomically replace) a symlink with its metadata
    /// ([`Features::symlinks`]).
    fn create_symlink(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        target: &[u8],
        meta: &Meta,
    ) -> io::Result<()>;
    /// True when a symlink's own mtime can be set (false on an SFTP server
    /// without `lsetstat@openssh.com`, or refusing it): where it cannot, a
    /// link's time is left as made and not compared (no `meta` per link
    /// per run). `name` of `dir` is a symlink listed as `now`, whose time
    /// is about to be set: a store may try it there, to its time as listed.
    fn sets_symlink_times(&self, dir: &Self::Dir, name: &CStr, now: &Meta) -> bool;
    /// Change metadata of an entry in place.
    fn set_meta(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        meta: &Meta,
        what: MetaChange,
    ) -> io::Result<()>;
    /// Remove an entry; directories recursively. Returns how many entries
    /// were removed.
    fn remove(&self, dir: &Self::Dir, name: &CStr, is_dir: bool) -> io::Result<u64>;
    /// Remove the entry `name` of `dir` (not a directory) only while it is
    /// still the one planned (`at`): otherwise fail with [`changed`] and
    /// remove nothing. A store whose stat is not exact, or costs a request,
    /// may remove without the check.
    fn remove_planned(&self, dir: &Self::Dir, name: &CStr, at: &Planned) -> io::Result<u64>;
    /// Remove a directory tree like `remove(dir, name, true)`, telling
    /// `each` about every entry removed, as it goes: its path below `name`
    /// (empty for `name` itself, which comes last) and its size (0 for
    /// directories). Returns how many entries were removed: as many as
    /// `each` was told ([`remove_dir_whole`] names the directory alone).
    fn remove_each(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64>;
    /// Remove an empty directory; fails (`DirectoryNotEmpty`) when it is
    /// not empty, so nothing below it can be lost.
    fn rmdir(&self, dir: &Self::Dir, name: &CStr) -> io::Result<()>;
    /// Move `from_name` in `from_dir` to `to_name` in `to_dir`, failing with
    /// `AlreadyExists` rather than replacing an entry there (two-way sync
    /// replays renames with it and must never overwrite a change).
    /// Backends without a cheaper way may return `Unsupported`; callers then
    /// copy and delete.
    fn rename(
        &self,
        from_dir: &Self::Dir,
        from_name: &CStr,
        to_dir: &Self::Dir,
        to_name: &CStr,
    ) -> io::Result<()>;
    /// Bytes and inodes free for this user on the filesystem of `dir`
    /// (for the message of a full disk), when the store can tell.
    fn free_space(&self, dir: &Self::Dir) -> Option<(u64, u64)>;

    /// What the store ignored and the user should know, one line each, at
    /// the end of every run, `role` naming the store (object metadata that
    /// is not an mtime or a mode); [`Store::notes`] are for `-v` only.
    fn warnings(&self, role: &str) -> Vec<String>;
    /// Lines for `-v` about what the store did beyond plain requests
    /// (resumed transfers, requests that cost), `role` naming it ("source",
    /// "destination", "A", "B").
    fn notes(&self, role: &str) -> Vec<String>;
}

/// [`Store::remove_each`] of a store that removes a tree in one operation:
/// `remove(dir, name, true)`, naming the directory alone.
pub fn remove_dir_whole<S: Store>(
    s: &S,
    dir: &S::Dir,
    name: &CStr,
    each: &mut dyn FnMut(&[u8], u64),
) -> io::Result<u64> {
    s.remove(dir, name, true)?;
    each(b"", 0);
    Ok(1)
}

/// The step mtimes are compared (and written) to between `a` and `b`: the
/// coarser of their [`Features::mtime_step_ns`], 1 at least.
pub fn mtime_step<A: Store, B: Store>(a: &A, b: &B) -> u32 {
    a.features()
        .mtime_step_ns
        .max(b.features().mtime_step_ns)
        .max(1)
}

/// How a store with [`Store::delta`] takes part in delta transfers
/// ([`crate::delta`]).
pub trait DeltaStore<S: Store> {
    /// Where it makes signatures, ops and rebuilds.
    fn role(&self) -> DeltaRole;
    /// The delta signature of file `name` in `dir` as it is now, made
    /// where the file is; `None` when it is not a regular file of at least
    /// `min` bytes.
    fn delta_signature(&self, dir: &S::Dir, name: &CStr, min: u64)
        -> io::Result<Option<Signature>>;
    /// Write into `w` (created in `dir`) the new content rebuilt from the
    /// old file `old` of `dir`, the one `sig` describes, and the ops `feed`
    /// hands to the sink it is given; the content's hash is checked
    /// against the one that ends the ops (where the rebuild happens: here,
    /// or at the latest by the commit). Returns what `feed` returned.
    fn delta_write(
        &self,
        dir: &S::Dir,
        w: &mut S::Writer,
        old: &CStr,
        sig: &Signature,
        feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
    ) -> io::Result<DiffSummary>;
    /// The ops turning the file `sig` describes into the content of `r`
    /// (one of this store's readers, not read yet), into `sink`: read here
    /// ([`crate::delta::diff`]), or computed at the far end.
    fn delta_diff(
        &self,
        r: &mut dyn SourceFile,
        sig: &Signature,
        sink: &mut dyn OpSink,
    ) -> io::Result<DiffSummary>;
    /// Start a patch in place of file `name` of `dir`, listed as `old`,
    /// to the layout `l` (a changed file no shorter than its old copy:
    /// [`crate::delta::inplace`]): the old file's block hashes under `key`
    /// start now, where the file is. `None` where the store does not
    /// patch in place or the file cannot be (not a regular file with one
    /// link, changed since listed).
    #[allow(clippy::type_complexity)]
    fn delta_inplace<'a>(
        &'a self,
        dir: &'a S::Dir,
        name: &CStr,
        old: &Meta,
        l: &crate::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<Option<Box<dyn crate::delta::InPlace + 'a>>>;
    /// Open the file `name` of `dir`, listed as `old`, to append to it in
    /// place (a watch's growing file: only its new tail is sent). `None`
    /// where the store cannot or the file is not `old` any more (another
    /// inode, size or mtime) or not a plain file of one link.
    fn open_append<'a>(
        &'a self,
        dir: &'a S::Dir,
        name: &CStr,
        old: &Meta,
    ) -> io::Result<Option<Box<dyn AppendFile + 'a>>>;
    /// The sender's hashes of `r` (one of this store's readers, not read
    /// yet, of `l.new` bytes) for a patch in place to the layout `l`:
    /// hashed here ([`crate::delta::inplace::source_patch_hashes`]), or at
    /// the far end.
    fn inplace_hashes(
        &self,
        r: &mut dyn SourceFile,
        l: &crate::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<crate::delta::PatchHashes>;
    /// Read `buf.len()` bytes at `at` of `r` (one of this store's
    /// readers), fewer only at its end: the blocks of a patch in place
    /// (a file with a descriptor: [`crate::delta::inplace::source_read_at`]).
    fn read_at(&self, r: &mut dyn SourceFile, at: u64, buf: &mut [u8]) -> io::Result<usize>;
}

/// The extended attributes and ACLs a store with [`Store::xattrs`] keeps
/// (`-X`, `-A`).
pub trait XattrStore<S: Store> {
    /// Which of them it keeps.
    fn caps(&self) -> XattrSel;
    /// The attributes `sel` selects of entry `name` of `dir` (`kind`; the
    /// directory itself when `name` is `None`), into `out` (cleared first):
    /// those this store keeps and this process may read and write.
    fn get_xattrs(
        &self,
        dir: &S::Dir,
        name: Option<&CStr>,
        kind: Kind,
        sel: XattrSel,
        out: &mut Xattrs,
    ) -> io::Result<()>;
    /// Like [`XattrStore::get_xattrs`], of a file open for reading.
    fn reader_xattrs(&self, r: &S::Reader, sel: XattrSel, out: &mut Xattrs) -> io::Result<()>;
    /// Give entry `name` of `dir` (the directory itself when `None`) the
    /// attributes `want` of those `sel` selects, where it has `have`
    /// (`None`: an entry this run just made, which has what the store gives
    /// new entries, such as an ACL inherited from the directory). `meta`:
    /// the entry's metadata, already set. `Unsupported` when the store
    /// cannot keep them here.
    fn set_xattrs(
        &self,
        dir: &S::Dir,
        name: Option<&CStr>,
        meta: &Meta,
        sel: XattrSel,
        want: &Xattrs,
        have: Option<&Xattrs>,
    ) -> io::Result<()>;
    /// Give the file being written in `dir` the attributes `want` of those
    /// `sel` selects, before it is committed with `meta` (named: it is
    /// never visible without them). `Unsupported` as for `set_xattrs`.
    fn set_writer_xattrs(
        &self,
        dir: &S::Dir,
        w: &mut S::Writer,
        meta: &Meta,
        sel: XattrSel,
        want: &Xattrs,
    ) -> io::Result<()>;
}

/// How a store with [`Store::keeper`] keeps what a run replaces
/// (`--backup-dir`, `--suffix`, `--versions`; see [`crate::keep`]).
pub trait KeepStore<S: Store> {
    /// True when [`KeepStore::keep`] works here, for the base `base`: a run
    /// asked to keep what it replaces refuses to start where it cannot.
    fn keeps_at(&self, base: &KeepBase) -> bool;
    /// Keep the entry `name` of `dir` (a file, symlink or special file,
    /// never a directory) at `to` before a run replaces or removes it: the
    /// cheapest move the store has (a hard link or rename; a server-side
    /// copy), never a download. Parents of the target are created as
    /// needed. `AlreadyExists` when `to.overwrite` is false and the target
    /// exists.
    fn keep(&self, dir: &S::Dir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()>;
}

/// What only a POSIX tree has (a store with [`Store::posix`]: local,
/// `ferry serve`): hard links, special files, modes to lift, identities.
pub trait PosixStore<S: Store> {
    /// True when a file can have several names (hard links, made by
    /// [`PosixStore::link`]): [`Meta::nlink`] counts them, and names with
    /// the same [`Meta::dev`] and [`Meta::ino`] are one file.
    fn hard_links(&self) -> bool;
    /// Make `name` in `dir` another name of the file `from_name` in
    /// `from_dir` (a hard link), replacing a file or symlink of that name
    /// atomically (`CrossesDevices` where the two names are on different
    /// filesystems).
    fn link(
        &self,
        from_dir: &S::Dir,
        from_name: &CStr,
        dir: &S::Dir,
        name: &CStr,
    ) -> io::Result<()>;
    /// True when fifos and device nodes can be stored
    /// ([`PosixStore::create_special`]).
    fn special(&self) -> bool;
    /// Create a fifo or device node `name` (kind and device number from
    /// `meta`) with its metadata; `replace`: an entry of that name exists
    /// and is replaced atomically.
    fn create_special(
        &self,
        dir: &S::Dir,
        name: &CStr,
        meta: &Meta,
        replace: bool,
    ) -> io::Result<()>;
    /// True when `name` in `dir` (a name [`is_legacy_partial_name`] accepts)
    /// is a partial download an older ferry left: it carries the resume
    /// attribute. Only then is it removed as ferry's own.
    fn is_own_legacy_partial(&self, dir: &S::Dir, name: &CStr) -> bool;
    /// Make an existing directory writable by us for the entries about to
    /// change in it (a read-only directory of a non-root user); `Ok(true)`
    /// when its mode was changed, and must be set back afterwards.
    fn make_writable(&self, dir: &S::Dir) -> io::Result<bool>;
    /// The identity (device, inode) of the root and of every directory
    /// above it, each with a path showing it, where the backend has
    /// identities on this machine (local trees); `None` elsewhere. A
    /// directory met in a walk with one of these is a root seen again
    /// through another path: see [`crate::walk::Aliases`].
    fn root_identities(&self) -> Option<crate::walk::RootIds>;
}

/// The hashes a store with [`Store::hashes`] keeps for files without
/// reading them (`--checksum` then reads only the other side).
pub trait HashStore<S: Store> {
    /// The kinds it keeps.
    fn kinds(&self) -> HashSet;
    /// The `kind` hash the store keeps for file `name`, one of
    /// [`HashStore::kinds`]; `None` when this file has none (an S3
    /// object uploaded in parts by a tool that recorded no MD5).
    fn hash(&self, dir: &S::Dir, name: &CStr, kind: HashKind) -> io::Result<Option<Hash>>;
    /// Whether the bytes `open` yields (another store's file, opened anew
    /// for each pass) are the content of `name`, told by a fingerprint the
    /// store keeps that no [`HashKind`] expresses (an S3 multipart ETag: the
    /// MD5 of the parts' MD5s). `None` when the store cannot tell.
    #[allow(clippy::type_complexity)]
    fn matches_bytes<'a>(
        &self,
        dir: &S::Dir,
        name: &CStr,
        size: u64,
        open: &mut dyn FnMut() -> io::Result<Box<dyn SourceFile + 'a>>,
    ) -> io::Result<Option<bool>>;
}

/// Removal of what interrupted transfers left on a store's side and no run
/// resumed (`ferry cleanup`), for a store with [`Store::cleanup`].
pub trait Cleanup {
    /// Remove those started at least `max_age` ago; returns each one's
    /// location and start time (with `dry_run`, those that would go).
    fn cleanup(
        &self,
        max_age: std::time::Duration,
        dry_run: bool,
    ) -> io::Result<Vec<(String, String)>>;
}

impl<S: Store> DeltaStore<S> for Absent {
    fn role(&self) -> DeltaRole {
        match *self {}
    }
    fn delta_signature(&self, _: &S::Dir, _: &CStr, _: u64) -> io::Result<Option<Signature>> {
        match *self {}
    }
    fn delta_write(
        &self,
        _: &S::Dir,
        _: &mut S::Writer,
        _: &CStr,
        _: &Signature,
        _: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
    ) -> io::Result<DiffSummary> {
        match *self {}
    }
    fn delta_diff(
        &self,
        _: &mut dyn SourceFile,
        _: &Signature,
        _: &mut dyn OpSink,
    ) -> io::Result<DiffSummary> {
        match *self {}
    }
    fn delta_inplace<'a>(
        &'a self,
        _: &'a S::Dir,
        _: &CStr,
        _: &Meta,
        _: &crate::delta::Layout,
        _: &[u8; 32],
    ) -> io::Result<Option<Box<dyn crate::delta::InPlace + 'a>>> {
        match *self {}
    }
    fn open_append<'a>(
        &'a self,
        _: &'a S::Dir,
        _: &CStr,
        _: &Meta,
    ) -> io::Result<Option<Box<dyn AppendFile + 'a>>> {
        match *self {}
    }
    fn inplace_hashes(
        &self,
        _: &mut dyn SourceFile,
        _: &crate::delta::Layout,
        _: &[u8; 32],
    ) -> io::Result<crate::delta::PatchHashes> {
        match *self {}
    }
    fn read_at(&self, _: &mut dyn SourceFile, _: u64, _: &mut [u8]) -> io::Result<usize> {
        match *self {}
    }
}

impl<S: Store> XattrStore<S> for Absent {
    fn caps(&self) -> XattrSel {
        match *self {}
    }
    fn get_xattrs(
        &self,
        _: &S::Dir,
        _: Option<&CStr>,
        _: Kind,
        _: XattrSel,
        _: &mut Xattrs,
    ) -> io::Result<()> {
        match *self {}
    }
    fn reader_xattrs(&self, _: &S::Reader, _: XattrSel, _: &mut Xattrs) -> io::Result<()> {
        match *self {}
    }
    fn set_xattrs(
        &self,
        _: &S::Dir,
        _: Option<&CStr>,
        _: &Meta,
        _: XattrSel,
        _: &Xattrs,
        _: Option<&Xattrs>,
    ) -> io::Result<()> {
        match *self {}
    }
    fn set_writer_xattrs(
        &self,
        _: &S::Dir,
        _: &mut S::Writer,
        _: &Meta,
        _: XattrSel,
        _: &Xattrs,
    ) -> io::Result<()> {
        match *self {}
    }
}

impl<S: Store> KeepStore<S> for Absent {
    fn keeps_at(&self, _: &KeepBase) -> bool {
        match *self {}
    }
    fn keep(&self, _: &S::Dir, _: &CStr, _: &KeepTo<'_>) -> io::Result<()> {
        match *self {}
    }
}

impl<S: Store> PosixStore<S> for Absent {
    fn hard_links(&self) -> bool {
        match *self {}
    }
    fn link(&self, _: &S::Dir, _: &CStr, _: &S::Dir, _: &CStr) -> io::Result<()> {
        match *self {}
    }
    fn special(&self) -> bool {
        match *self {}
    }
    fn create_special(&self, _: &S::Dir, _: &CStr, _: &Meta, _: bool) -> io::Result<()> {
        match *self {}
    }
    fn is_own_legacy_partial(&self, _: &S::Dir, _: &CStr) -> bool {
        match *self {}
    }
    fn make_writable(&self, _: &S::Dir) -> io::Result<bool> {
        match *self {}
    }
    fn root_identities(&self) -> Option<crate::walk::RootIds> {
        match *self {}
    }
}

impl<S: Store> HashStore<S> for Absent {
    fn kinds(&self) -> HashSet {
        match *self {}
    }
    fn hash(&self, _: &S::Dir, _: &CStr, _: HashKind) -> io::Result<Option<Hash>> {
        match *self {}
    }
    fn matches_bytes<'a>(
        &self,
        _: &S::Dir,
        _: &CStr,
        _: u64,
        _: &mut dyn FnMut() -> io::Result<Box<dyn SourceFile + 'a>>,
    ) -> io::Result<Option<bool>> {
        match *self {}
    }
}

/// The engine's side of a store's extensions: each optional operation
/// through its accessor, with the one answer the engine takes where the
/// store does not have the extension (nothing read, nothing to keep,
/// `Unsupported` for a write, the bytes read here for a source's delta).
/// A blanket trait over every [`Store`]: no store overrides it, so what a
/// store has is what its accessors say.
pub trait StoreExt: Store {
    /// How the store takes part in delta transfers.
    fn delta_role(&self) -> DeltaRole {
        self.delta().map_or(DeltaRole::None, |d| d.role())
    }
    /// [`DeltaStore::delta_signature`]; `None` without deltas.
    fn delta_signature(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        min: u64,
    ) -> io::Result<Option<Signature>> {
        match self.delta() {
            Some(d) => d.delta_signature(dir, name, min),
            None => Ok(None),
        }
    }
    /// [`DeltaStore::delta_write`]; `Unsupported` without deltas.
    fn delta_write(
        &self,
        dir: &Self::Dir,
        w: &mut Self::Writer,
        old: &CStr,
        sig: &Signature,
        feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
    ) -> io::Result<DiffSummary> {
        match self.delta() {
            Some(d) => d.delta_write(dir, w, old, sig, feed),
            None => Err(unsupported()),
        }
    }
    /// [`DeltaStore::delta_diff`]; without deltas, `r` read here.
    fn delta_diff(
        &self,
        r: &mut dyn SourceFile,
        sig: &Signature,
        sink: &mut dyn OpSink,
    ) -> io::Result<DiffSummary> {
        match self.delta() {
            Some(d) => d.delta_diff(r, sig, sink),
            None => crate::delta::diff(r, sig, sink),
        }
    }
    /// [`DeltaStore::delta_inplace`]; `None` without deltas.
    #[allow(clippy::type_complexity)]
    fn delta_inplace<'a>(
        &'a self,
        dir: &'a Self::Dir,
        name: &CStr,
        old: &Meta,
        l: &crate::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<Option<Box<dyn crate::delta::InPlace + 'a>>> {
        match self.delta() {
            Some(d) => d.delta_inplace(dir, name, old, l, key),
            None => Ok(None),
        }
    }
    /// [`DeltaStore::open_append`]; `None` without deltas.
    fn open_append<'a>(
        &'a self,
        dir: &'a Self::Dir,
        name: &CStr,
        old: &Meta,
    ) -> io::Result<Option<Box<dyn AppendFile + 'a>>> {
        match self.delta() {
            Some(d) => d.open_append(dir, name, old),
            None => Ok(None),
        }
    }
    /// [`DeltaStore::inplace_hashes`]; without deltas, hashed here.
    fn inplace_hashes(
        &self,
        r: &mut dyn SourceFile,
        l: &crate::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<crate::delta::PatchHashes> {
        match self.delta() {
            Some(d) => d.inplace_hashes(r, l, key),
            None => crate::delta::inplace::source_patch_hashes(r, l, key),
        }
    }
    /// [`DeltaStore::read_at`]; without deltas, read here (`pread` on a
    /// file with a descriptor).
    fn read_at(&self, r: &mut dyn SourceFile, at: u64, buf: &mut [u8]) -> io::Result<usize> {
        match self.delta() {
            Some(d) => d.read_at(r, at, buf),
            None => crate::delta::inplace::source_read_at(r, at, buf),
        }
    }

    /// The extended attributes and ACLs it keeps.
    fn xattr_caps(&self) -> XattrSel {
        self.xattrs().map_or(XattrSel::NONE, |x| x.caps())
    }
    /// [`XattrStore::get_xattrs`]; none without the extension.
    fn get_xattrs(
        &self,
        dir: &Self::Dir,
        name: Option<&CStr>,
        kind: Kind,
        sel: XattrSel,
        out: &mut Xattrs,
    ) -> io::Result<()> {
        match self.xattrs() {
            Some(x) => x.get_xattrs(dir, name, kind, sel, out),
            None => {
                out.clear();
                Ok(())
            }
        }
    }
    /// [`XattrStore::reader_xattrs`]; none without the extension.
    fn reader_xattrs(&self, r: &Self::Reader, sel: XattrSel, out: &mut Xattrs) -> io::Result<()> {
        match self.xattrs() {
            Some(x) => x.reader_xattrs(r, sel, out),
            None => {
                out.clear();
                Ok(())
            }
        }
    }
    /// [`XattrStore::set_xattrs`]; `Unsupported` without the extension.
    fn set_xattrs(
        &self,
        dir: &Self::Dir,
        name: Option<&CStr>,
        meta: &Meta,
        sel: XattrSel,
        want: &Xattrs,
        have: Option<&Xattrs>,
    ) -> io::Result<()> {
        match self.xattrs() {
            Some(x) => x.set_xattrs(dir, name, meta, sel, want, have),
            None => Err(unsupported()),
        }
    }
    /// [`XattrStore::set_writer_xattrs`]; `Unsupported` without the
    /// extension.
    fn set_writer_xattrs(
        &self,
        dir: &Self::Dir,
        w: &mut Self::Writer,
        meta: &Meta,
        sel: XattrSel,
        want: &Xattrs,
    ) -> io::Result<()> {
        match self.xattrs() {
            Some(x) => x.set_writer_xattrs(dir, w, meta, sel, want),
            None => Err(unsupported()),
        }
    }

    /// True when it can keep what a run replaces, at `base`.
    fn can_keep(&self, base: &KeepBase) -> bool {
        self.keeper().is_some_and(|k| k.keeps_at(base))
    }
    /// [`KeepStore::keep`]; `Unsupported` where the store cannot keep.
    fn keep_entry(&self, dir: &Self::Dir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
        match self.keeper() {
            Some(k) => k.keep(dir, name, to),
            None => Err(unsupported()),
        }
    }

    /// True when a file can have several names.
    fn has_hard_links(&self) -> bool {
        self.posix().is_some_and(|p| p.hard_links())
    }
    /// [`PosixStore::link`]; `Unsupported` without hard links.
    fn link(
        &self,
        from_dir: &Self::Dir,
        from_name: &CStr,
        dir: &Self::Dir,
        name: &CStr,
    ) -> io::Result<()> {
        match self.posix() {
            Some(p) => p.link(from_dir, from_name, dir, name),
            None => Err(unsupported()),
        }
    }
    /// True when fifos and device nodes can be stored.
    fn supports_special(&self) -> bool {
        self.posix().is_some_and(|p| p.special())
    }
    /// [`PosixStore::create_special`]; `Unsupported` elsewhere.
    fn create_special(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        meta: &Meta,
        replace: bool,
    ) -> io::Result<()> {
        match self.posix() {
            Some(p) => p.create_special(dir, name, meta, replace),
            None => Err(unsupported()),
        }
    }
    /// [`PosixStore::is_own_legacy_partial`]; false elsewhere.
    fn is_own_legacy_partial(&self, dir: &Self::Dir, name: &CStr) -> bool {
        self.posix()
            .is_some_and(|p| p.is_own_legacy_partial(dir, name))
    }
    /// [`PosixStore::make_writable`]; `Ok(false)` elsewhere.
    fn make_writable(&self, dir: &Self::Dir) -> io::Result<bool> {
        match self.posix() {
            Some(p) => p.make_writable(dir),
            None => Ok(false),
        }
    }
    /// The identities of the root and the directories above it.
    fn root_ids(&self) -> Option<crate::walk::RootIds> {
        self.posix().and_then(|p| p.root_identities())
    }

    /// The hash kinds it keeps.
    fn hash_kinds(&self) -> HashSet {
        self.hashes().map_or(HashSet::NONE, |h| h.kinds())
    }
    /// [`HashStore::hash`]; `None` where the store keeps none.
    fn hash(&self, dir: &Self::Dir, name: &CStr, kind: HashKind) -> io::Result<Option<Hash>> {
        match self.hashes() {
            Some(h) => h.hash(dir, name, kind),
            None => Ok(None),
        }
    }
    /// [`HashStore::matches_bytes`]; `None` where the store cannot tell.
    #[allow(clippy::type_complexity)]
    fn matches_bytes<'a>(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        size: u64,
        open: &mut dyn FnMut() -> io::Result<Box<dyn SourceFile + 'a>>,
    ) -> io::Result<Option<bool>> {
        match self.hashes() {
            Some(h) => h.matches_bytes(dir, name, size, open),
            None => Ok(None),
        }
    }
}

impl<S: Store> StoreExt for S {}

/// A commit started by [`Store::commit_nowait`]: its result, or how to wait
/// for it.
#[must_use = "a commit's result must be waited for and reported"]
pub struct Committing<'a>(CommittingInner<'a>);

enum CommittingInner<'a> {
    Done(io::Result<()>),
    Later(Box<dyn FnOnce() -> io::Result<()> + Send + 'a>),
}

impl<'a> Committing<'a> {
    /// A commit already over, with its result.
    pub fn done(r: io::Result<()>) -> Committing<'a> {
        Committing(CommittingInner::Done(r))
    }

    /// A commit whose result `wait` blocks for.
    pub fn later(wait: impl FnOnce() -> io::Result<()> + Send + 'a) -> Committing<'a> {
        Committing(CommittingInner::Later(Box::new(wait)))
    }

    /// True when the result is known already: [`Committing::wait`] does
    /// not wait.
    pub fn is_done(&self) -> bool {
        matches!(self.0, CommittingInner::Done(_))
    }

    /// The commit's result, once the store has it.
    pub fn wait(self) -> io::Result<()> {
        match self.0 {
            CommittingInner::Done(r) => r,
            CommittingInner::Later(f) => f(),
        }
    }
}

impl std::fmt::Debug for Committing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            CommittingInner::Done(r) => f.debug_tuple("Committing::Done").field(r).finish(),
            CommittingInner::Later(_) => f.write_str("Committing::Later"),
        }
    }
}

/// How a store takes part in delta transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaRole {
    /// It does not (objects in S3: no old copy to read blocks of).
    None,
    /// Signature, ops and rebuild are done in this process (a local
    /// tree): worth it only where writing is dearer than reading (`--delta`).
    Local,
    /// They are done at the far end of a network link (`ferry serve`):
    /// used by default.
    Remote,
}

/// A destination file open to be appended to in place
/// ([`Store::open_append`]). Until [`AppendFile::finish`] it keeps its old
/// mtime, so a run killed half way leaves a file longer than listed, whose
/// size differs from the source's: the next run compares it again.
pub trait AppendFile: Send {
    /// Read its bytes at `at` (the check that its old part is the
    /// source's); fewer only at its end.
    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// Append `buf` at its end.
    fn append(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Appended: it gets `meta`'s mtime, mode (and owner, where the store
    /// keeps owners), synced first with `fsync`.
    fn finish(self: Box<Self>, meta: &Meta, fsync: bool) -> io::Result<()>;
}

/// ferry's reserved names, the one place they are made and recognised
/// (local copies, S3 downloads, bisync): `.ferry-tmp-<16 hex>.~ferry~` for
/// a file being written, `.ferry-part-<16 hex>.~ferry~` for a resumable
/// partial download. No user picks such a name by accident; docs/CLI.md
/// reserves them. Anything else, `.ferry-tmp.x` included, is a user's file.
const TEMP_HEAD: &[u8] = b".ferry-tmp-";
const PART_HEAD: &[u8] = b".ferry-part-";
/// The rollback record of a file being appended to in place
/// ([`crate::delta::append`]): `.ferry-undo-<16 hex>.~ferry~`.
const UNDO_HEAD: &[u8] = b".ferry-undo-";
const RESERVED_TAIL: &[u8] = b".~ferry~";
/// Length of a temporary's name.
pub const RESERVED_LEN: usize = TEMP_HEAD.len() + 16 + RESERVED_TAIL.len();

/// The temporary name with identifier `id` (NUL-terminated in a fixed
/// buffer: made on the hot path of every replaced file).
pub fn temp_name(id: u64) -> [u8; RESERVED_LEN + 1] {
    let mut b = [0u8; RESERVED_LEN + 1];
    b[..RESERVED_LEN].copy_from_slice(&reserved(TEMP_HEAD, id));
    b
}

/// The partial download name with identifier `id` (a hash of the final name).
pub fn partial_name(id: u64) -> std::ffi::CString {
    std::ffi::CString::new(reserved(PART_HEAD, id)).expect("no NUL")
}

fn reserved(head: &[u8], id: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(head.len() + 16 + RESERVED_TAIL.len());
    b.extend_from_slice(head);
    b.extend_from_slice(format!("{id:016x}").as_bytes());
    b.extend_from_slice(RESERVED_TAIL);
    b
}

fn is_reserved(name: &[u8], head: &[u8]) -> bool {
    name.len() == head.len() + 16 + RESERVED_TAIL.len()
        && name.starts_with(head)
        && name.ends_with(RESERVED_TAIL)
        && name[head.len()..head.len() + 16]
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// True for ferry's reserved names (temporaries, partial downloads and
/// rollback records): never synced, and in a destination removed as
/// leftovers of a killed run (a local store rolls back what a record
/// names and hides the record while it lists).
pub fn is_temp_name(name: &[u8]) -> bool {
    is_reserved(name, TEMP_HEAD) || is_reserved(name, PART_HEAD) || is_undo_name(name)
}

/// The rollback record's name of an append in place to file `name` (one
/// per file: its id is a hash of the name).
pub fn undo_name(name: &[u8]) -> std::ffi::CString {
    let h = blake3::hash(name);
    let id = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"));
    std::ffi::CString::new(reserved(UNDO_HEAD, id)).expect("no NUL")
}

/// True for a rollback record's name ([`undo_name`]).
pub fn is_undo_name(name: &[u8]) -> bool {
    is_reserved(name, UNDO_HEAD)
}

/// True for partial downloads kept for resuming.
pub fn is_partial_name(name: &[u8]) -> bool {
    is_reserved(name, PART_HEAD)
}

/// True for the name older versions gave partial downloads,
/// `.ferry-tmp.part.<16 hex>`: ferry's own only when the file also carries
/// the `user.ferry.partial` attribute (see [`PosixStore::is_own_legacy_partial`]).
pub fn is_legacy_partial_name(name: &[u8]) -> bool {
    const HEAD: &[u8] = b".ferry-tmp.part.";
    name.len() == HEAD.len() + 16
        && name.starts_with(HEAD)
        && name[HEAD.len()..]
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// How long an unused partial download is kept.
pub const PARTIAL_KEEP_SECS: i64 = 7 * 24 * 3600;

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The cut is the largest multiple of the step not above the
        /// mtime's nanoseconds, and cutting again changes nothing (the
        /// listings are cut, then the copy's checks cut again).
        #[test]
        fn mtimes_are_cut_to_the_step(nsec in 0u32..1_000_000_000, step in proptest::prop_oneof![
            proptest::prelude::Just(0u32), proptest::prelude::Just(1u32),
            proptest::prelude::Just(1_000u32), proptest::prelude::Just(1_000_000_000u32), 1u32..2_000_000_000
        ]) {
            let c = cut_nsec(nsec, step);
            let s = step.max(1);
            proptest::prop_assert!(c <= nsec && nsec - c < s && c.is_multiple_of(s));
            proptest::prop_assert_eq!(cut_nsec(c, step), c);
        }
    }

    #[test]
    fn a_plan_holds_while_the_change_time_is_the_same_where_both_know_it() {
        let m = Meta {
            kind: Kind::File,
            size: 3,
            mtime_sec: 10,
            mtime_nsec: 5,
            mode: 0o644,
            uid: 0,
            gid: 0,
            ino: 7,
            version: 0,
            rdev: 0,
            sparse: false,
            nlink: 1,
            dev: 1,
            ctime: 100,
        };
        let p = Planned::new(&m, 1);
        assert!(p.holds(Some(&m)));
        // Edited behind its size and mtime: the change time moved.
        assert!(!p.holds(Some(&Meta { ctime: 101, ..m })));
        // Unknown on either side: not compared.
        assert!(p.holds(Some(&Meta { ctime: 0, ..m })));
        assert!(Planned::new(&Meta { ctime: 0, ..m }, 1).holds(Some(&Meta { ctime: 101, ..m })));
        // A file with several names, listed or now (the run's acts on the
        // others, the link of a keep, move it): not compared.
        assert!(p.holds(Some(&Meta {
            ctime: 101,
            nlink: 2,
            ..m
        })));
        let h = Planned::new(&Meta { nlink: 2, ..m }, 1);
        assert!(h.holds(Some(&Meta {
            ctime: 101,
            nlink: 1,
            ..m
        })));
        // A directory: its entries move it.
        let d = Meta {
            kind: Kind::Dir,
            ..m
        };
        assert!(Planned::new(&d, 1).holds(Some(&Meta { ctime: 101, ..d })));
        // The rest as before.
        assert!(!p.holds(Some(&Meta { size: 4, ..m })));
        assert!(!p.holds(None));
    }

    #[test]
    fn reserved_names_round_trip_and_user_names_are_not_reserved() {
        for id in [0u64, 1, 0xdead_beef, u64::MAX] {
            let t = temp_name(id);
            let p = partial_name(id);
            let (t, p) = (&t[..RESERVED_LEN], p.as_bytes());
            assert!(is_temp_name(t) && !is_partial_name(t), "{t:?}");
            assert!(is_temp_name(p) && is_partial_name(p), "{p:?}");
        }
        assert_eq!(
            &temp_name(0x0123_4567_89ab_cdef)[..],
            b".ferry-tmp-0123456789abcdef.~ferry~\0"
        );
        assert_eq!(
            partial_name(0xab).as_bytes(),
            b".ferry-part-00000000000000ab.~ferry~"
        );
        for user in [
            &b".ferry-tmp.12345"[..],
            b".ferry-tmp.part.0123456789abcdef",
            b".ferry-tmp-0123456789abcdef.~ferry",
            b".ferry-tmp-0123456789ABCDEF.~ferry~",
            b".ferry-tmp-0123456789abcde.~ferry~",
            b".ferry-tmp-0123456789abcdefx.~ferry~",
            b"x.ferry-tmp-0123456789abcdef.~ferry~",
            b".ferry-tmp-",
        ] {
            assert!(!is_temp_name(user), "{:?}", String::from_utf8_lossy(user));
        }
        assert!(is_legacy_partial_name(b".ferry-tmp.part.0123456789abcdef"));
        assert!(!is_legacy_partial_name(b".ferry-tmp.part.0123456789abcde"));
        assert!(!is_legacy_partial_name(b".ferry-tmp.part.0123456789abcdeg"));
    }

    #[test]
    fn a_full_disk_says_what_is_needed_and_free() {
        let e = no_space(End::Dst, 1 << 30, Some((50 << 20, 10)));
        assert!(is_no_space(&e));
        assert_eq!(op_of(&e), Some((Some(End::Dst), "write")));
        assert_eq!(
            e.to_string(),
            "no space left on device: needs 1.0 GiB (1073741824 bytes), 50.0 MiB free"
        );
        let e = no_space(End::Dst, 2, Some((4096, 0)));
        assert_eq!(
            e.to_string(),
            "no space left on device: needs an inode and 2 bytes, no inode free"
        );
        assert!(is_no_space(&io::Error::from_raw_os_error(28)));
        assert!(!is_no_space(&io::Error::from_raw_os_error(2)));
        assert_eq!(bytes_text(1023), "1023 B");
        assert_eq!(bytes_text(1536), "1.5 KiB");
    }
}
