//! The `Store` trait: what the engine needs from a backend (local disk, S3,
//! SSH, SFTP: one implementation in each backend's crate). Every operation
//! is relative to an open directory handle (`Store::Dir`) and a single
//! name, so the local backend can use `*at()` syscalls on directory fds and
//! never resolve whole paths again.
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
    /// under that name too. For the same reason a file that had several
    /// names when listed and still has several (the same inode) holds
    /// whatever its size and mtime: the name replaced or removed is not
    /// its last, so no byte written to it is lost, and the run's own acts
    /// on its other names (`-H` keeping it for one source file and setting
    /// that file's mode and mtime) move its mtime too.
    pub fn holds(&self, now: Option<&Meta>) -> bool {
        let (Some(n), p) = (now, &self.meta) else {
            return false;
        };
        n.kind == p.kind
            && (n.ino == 0 || p.ino == 0 || n.ino == p.ino)
            && (n.kind == Kind::Dir
                || (n.ino != 0 && n.ino == p.ino && p.nlink > 1 && n.nlink > 1)
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

/// A backend: a tree of directories and files. The core every store has
/// (22 methods): open the root, list, stat, open, create/write/commit
/// (with the check at the act: `expect`, `remove_planned`), remove,
/// rename, mkdir, metadata, free space and what to tell the user. What
/// only some stores can do is either a field of [`Features`] or an
/// extension trait the store opts into through its accessor
/// ([`Store::delta`], [`Store::xattrs`], [`Store::keeper`],
/// [`Store::posix`], [`Store::hashes`], [`Store::links`],
/// [`Store::pipeline`], [`Store::cleanup`]; `None`: not here, and the
/// engine's one answer for it is in [`StoreExt`]). No method has a default
/// body: a store (and `AnyStore`, which forwards to every backend) says
/// what it does for each, or does not compile.
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
    /// Symlinks ([`LinkStore`]).
    type Links: LinkStore<Self>;
    /// Shortcuts that save round trips or operations ([`PipelineStore`]).
    type Pipeline: PipelineStore<Self>;

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
    /// Its symlinks; `None`: it cannot store symlinks (an object store:
    /// they are skipped with a note).
    fn links(&self) -> Option<&Self::Links>;
    /// Its shortcuts (opens sent ahead, commits not waited for, empty
    /// files made in one go); `None`: every file goes the plain way.
    fn pipeline(&self) -> Option<&Self::Pipeline>;
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
    /// Drop a writer and its temporary.
    fn abort(&self, dir: &Self::Dir, w: Self::Writer);

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

    /// What the store has to tell the user at the end of a run, `role`
    /// naming it ("source", "destination", "A", "B"): the
    /// [`Report::warnings`] always, the [`Report::notes`] with `-v`.
    fn report(&self, role: &str) -> Report;
}

/// What a store tells the user at the end of a run ([`Store::report`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// What the store ignored and the user should know, one line each,
    /// shown after every run (object metadata that is not an mtime or a
    /// mode).
    pub warnings: Vec<String>,
    /// Lines for `-v` about what the store did beyond plain requests
    /// (resumed transfers, requests that cost).
    pub notes: Vec<String>,
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

/// A commit started by [`PipelineStore::commit_nowait`]: its result, or how to wait
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
/// ([`DeltaStore::open_append`]). Until [`AppendFile::finish`] it keeps its old
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

mod absent;
mod ext;
mod names;
#[cfg(test)]
mod tests;

pub use ext::{
    Cleanup, DeltaStore, HashStore, KeepStore, LinkStore, PipelineStore, PosixStore, StoreExt,
    XattrStore,
};
pub use names::*;
