//! The extensions a store opts into ([`Store::delta`] and the other
//! accessors), the [`Absent`] one of a store without, and the engine's
//! side of them ([`StoreExt`]).

use super::*;

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
///
/// Like every trait here and [`Store`] itself, it has no default method
/// bodies: an implementation that leaves a method out does not compile,
/// so a wrapper (`AnyStore`) cannot silently take a default for a method
/// it forgot to forward. This one says what it does for both:
///
/// ```
/// use std::{ffi::CStr, io};
/// use ferry_engine::keep::{KeepBase, KeepTo};
/// use ferry_engine::store::{unsupported, KeepStore, Store};
/// struct Never;
/// impl<S: Store> KeepStore<S> for Never {
///     fn keeps_at(&self, _: &KeepBase) -> bool {
///         false
///     }
///     fn keep(&self, _: &S::Dir, _: &CStr, _: &KeepTo<'_>) -> io::Result<()> {
///         Err(unsupported())
///     }
/// }
/// ```
///
/// and this one, which forgot `keep`, is refused:
///
/// ```compile_fail,E0046
/// use ferry_engine::keep::KeepBase;
/// use ferry_engine::store::{KeepStore, Store};
/// struct Forgot;
/// impl<S: Store> KeepStore<S> for Forgot {
///     fn keeps_at(&self, _: &KeepBase) -> bool {
///         false
///     }
/// }
/// ```
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

/// The symlinks of a store with [`Store::links`] (local, `ferry serve`,
/// SFTP). A store without them (an object store) has symlinks in SRC
/// skipped with a note.
///
/// No default bodies here either: a store that opts in says what it does
/// for each method, and one that forgets one does not compile:
///
/// ```compile_fail,E0046
/// use std::{ffi::CStr, io};
/// use ferry_engine::store::{LinkStore, Store};
/// struct Forgot;
/// impl<S: Store> LinkStore<S> for Forgot {
///     fn read_link(&self, _: &S::Dir, _: &CStr) -> io::Result<Vec<u8>> {
///         Ok(Vec::new())
///     }
/// }
/// ```
pub trait LinkStore<S: Store> {
    /// Read a symlink's target.
    fn read_link(&self, dir: &S::Dir, name: &CStr) -> io::Result<Vec<u8>>;
    /// Create (or atomically replace) a symlink with its metadata.
    fn create_symlink(
        &self,
        dir: &S::Dir,
        name: &CStr,
        target: &[u8],
        meta: &Meta,
    ) -> io::Result<()>;
    /// True when a symlink's own mtime can be set (false on an SFTP server
    /// without `lsetstat@openssh.com`, or refusing it): where it cannot, a
    /// link's time is left as made and not compared (no `meta` per link
    /// per run). `name` of `dir` is a symlink listed as `now`, whose time
    /// is about to be set: a store may try it there, to its time as listed.
    fn sets_symlink_times(&self, dir: &S::Dir, name: &CStr, now: &Meta) -> bool;
}

/// Shortcuts a store with [`Store::pipeline`] takes to save round trips
/// (a network store: opens sent ahead, commits not waited for, metadata
/// known without asking) or operations (an empty file made under its
/// name). A store without them has every file go the plain way:
/// [`Store::open_file`], [`Store::create_file`] ... [`Store::commit`],
/// waited for, then stat'ed where the engine needs what was written.
///
/// A store that opts in answers all five (no default bodies): one that
/// has only `create_empty` says so for the others too, or does not compile:
///
/// ```compile_fail,E0046
/// use std::{ffi::CStr, io};
/// use ferry_engine::entry::Meta;
/// use ferry_engine::store::{PipelineStore, Store};
/// struct OnlyEmpty;
/// impl<S: Store> PipelineStore<S> for OnlyEmpty {
///     fn create_empty(&self, _: &S::Dir, _: &CStr, _: &Meta, _: bool) -> io::Result<bool> {
///         Ok(false)
///     }
/// }
/// ```
pub trait PipelineStore<S: Store> {
    /// A hint: the files `files` of `dir` (names, listed sizes) are about
    /// to be opened with [`Store::open_file`], in this order. The store
    /// may send all those opens now, so that each [`Store::open_file`]
    /// finds its reply there (one round trip for them all, not one each).
    /// A file named here need not be opened after all: what was fetched
    /// for it is dropped with `dir`.
    fn open_ahead(&self, dir: &S::Dir, files: &[(&CStr, u64)]);
    /// Like [`Store::commit`], without waiting for the store to confirm:
    /// a store whose commit is a request over a network sends it and
    /// returns at once; the result comes from [`Committing::wait`]. Until
    /// then the file must not be reported as copied (it may still fail),
    /// and its directory's metadata must not be set (the engine waits for
    /// every commit of a directory before it finishes the directory).
    /// Commits started one after the other may complete in any order.
    fn commit_nowait<'a>(
        &'a self,
        dir: &'a S::Dir,
        w: S::Writer,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> Committing<'a>;
    /// The metadata a file committed with `written` now has, when the
    /// store knows it without asking (an object store keeps what it was
    /// given); `None` when it must be read back (a local file's inode).
    fn meta_after_commit(&self, written: &Meta) -> Option<Meta>;
    /// Create an empty file `name` that does not exist yet, with its
    /// metadata, in as few operations as the store can. `Ok(false)` when
    /// the name exists (or the store takes no shortcut for this one): the
    /// caller then goes the usual way (`create_file` ... `commit`).
    fn create_empty(&self, dir: &S::Dir, name: &CStr, meta: &Meta, fsync: bool)
        -> io::Result<bool>;
    /// [`Store::open_dir`] of a directory the caller lists next: a store
    /// may send the listing's request right behind the open, so that both
    /// cost one round trip; [`Store::list`] then takes that listing (made
    /// after the open, as one asked for then). The open's error is this
    /// call's, as [`Store::open_dir`]'s; a listing not taken is dropped
    /// with the directory.
    fn open_dir_to_list(&self, parent: &S::Dir, name: &CStr) -> io::Result<S::Dir>;
    /// A hint, before the walk of a tree whose root is `root`: directories
    /// `dirs` (paths relative to it, each after its parent) are likely
    /// there and about to be opened and listed with
    /// [`PipelineStore::open_dir_to_list`] (the other side of the run has
    /// them, [`crate::prefetch::Prefetch::dirs`]). A store over a network
    /// may send those opens and listings now, each chained to its
    /// parent's, so that the walk finds them made instead of paying a
    /// round trip per level of the tree. A directory named here need not
    /// be opened after all. A hint replaces the one before; the engine
    /// gives an empty one after its walk (what was not taken is let go).
    fn expect_dirs(&self, root: &S::Dir, dirs: &[Vec<u8>]);
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

    /// True when symlinks can be stored ([`Store::links`]).
    fn has_symlinks(&self) -> bool {
        self.links().is_some()
    }
    /// [`LinkStore::read_link`]; `Unsupported` without symlinks.
    fn read_link(&self, dir: &Self::Dir, name: &CStr) -> io::Result<Vec<u8>> {
        match self.links() {
            Some(l) => l.read_link(dir, name),
            None => Err(unsupported()),
        }
    }
    /// [`LinkStore::create_symlink`]; `Unsupported` without symlinks.
    fn create_symlink(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        target: &[u8],
        meta: &Meta,
    ) -> io::Result<()> {
        match self.links() {
            Some(l) => l.create_symlink(dir, name, target, meta),
            None => Err(unsupported()),
        }
    }
    /// [`LinkStore::sets_symlink_times`]; true without symlinks (there is
    /// no link whose time could be left as made).
    fn sets_symlink_times(&self, dir: &Self::Dir, name: &CStr, now: &Meta) -> bool {
        self.links()
            .is_none_or(|l| l.sets_symlink_times(dir, name, now))
    }

    /// [`PipelineStore::open_dir_to_list`]; without a pipeline,
    /// [`Store::open_dir`].
    #[inline]
    fn open_dir_to_list(&self, parent: &Self::Dir, name: &CStr) -> io::Result<Self::Dir> {
        match self.pipeline() {
            Some(p) => p.open_dir_to_list(parent, name),
            None => self.open_dir(parent, name),
        }
    }
    /// [`PipelineStore::expect_dirs`]; nothing without a pipeline.
    #[inline]
    fn expect_dirs(&self, root: &Self::Dir, dirs: &[Vec<u8>]) {
        if let Some(p) = self.pipeline() {
            p.expect_dirs(root, dirs)
        }
    }
    /// [`PipelineStore::open_ahead`]; nothing without a pipeline.
    #[inline]
    fn open_ahead(&self, dir: &Self::Dir, files: &[(&CStr, u64)]) {
        if let Some(p) = self.pipeline() {
            p.open_ahead(dir, files)
        }
    }
    /// [`PipelineStore::commit_nowait`]; without a pipeline, committed here
    /// and now ([`Committing::done`]).
    #[inline]
    fn commit_nowait<'a>(
        &'a self,
        dir: &'a Self::Dir,
        w: Self::Writer,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> Committing<'a> {
        match self.pipeline() {
            Some(p) => p.commit_nowait(dir, w, name, meta, fsync),
            None => Committing::done(self.commit(dir, w, name, meta, fsync)),
        }
    }
    /// [`PipelineStore::meta_after_commit`]; `None` (read it back) without
    /// a pipeline.
    #[inline]
    fn meta_after_commit(&self, written: &Meta) -> Option<Meta> {
        self.pipeline().and_then(|p| p.meta_after_commit(written))
    }
    /// [`PipelineStore::create_empty`]; `Ok(false)` (the usual way)
    /// without a pipeline.
    #[inline]
    fn create_empty(
        &self,
        dir: &Self::Dir,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<bool> {
        match self.pipeline() {
            Some(p) => p.create_empty(dir, name, meta, fsync),
            None => Ok(false),
        }
    }
}

impl<S: Store> StoreExt for S {}
