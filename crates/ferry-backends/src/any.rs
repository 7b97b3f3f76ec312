//! [`AnyStore`]: every backend behind one `Store` type, its associated
//! types enums of the backends' own. The forwarding is generated: adding a
//! backend is one line in the `backends!` call at the bottom. `Store` and
//! its extension traits have no default method bodies, so a method this
//! file does not forward is a compile error, never a default silently
//! taken; `AnyStore` has an extension exactly where the backend inside
//! has it.

use std::any::Any;
use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::delta::{DiffSummary, InPlace, Layout, OpSink, PatchHashes, Signature};
use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::hash::{Hash, HashKind, HashSet};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::store::{
    AppendFile, Cleanup, Committing, DeltaRole, DeltaStore, Features, HashStore, KeepStore,
    LinkStore, ListError, MetaChange, PipelineStore, Planned, PosixStore, Progress, RangedSource,
    Report, SourceFile, Store, XattrStore,
};
use ferry_engine::xattr::{XattrSel, Xattrs};
use ferry_local::LocalStore;
use ferry_s3::S3Store;
use ferry_sftp::SftpStore;
use ferry_ssh::SshStore;

/// A directory, reader or writer of one backend handed to another: the
/// engine only ever passes a store what that store made.
#[cold]
fn mismatch() -> ! {
    unreachable!("a directory or writer of one backend was passed to another")
}

/// The backend's extension behind one of `AnyStore`'s: there, since
/// `AnyStore`'s accessor returned it only when the backend's did.
#[inline]
fn ext<T>(e: Option<T>) -> T {
    match e {
        Some(e) => e,
        None => gone(),
    }
}

#[cold]
fn gone() -> ! {
    unreachable!("an extension of AnyStore reached past its accessor")
}

macro_rules! backends {
    ($($v:ident($s:ty)),+ $(,)?) => {
        /// A store of any backend.
        pub enum AnyStore {
            $(
                #[allow(missing_docs)]
                $v($s),
            )+
        }

        /// An open directory of any backend.
        pub enum AnyDir {
            $(
                #[allow(missing_docs)]
                $v(<$s as Store>::Dir),
            )+
        }

        /// A file open for reading, of any backend. Not boxed: one reader
        /// lives per open file and is rarely moved, and a box would cost an
        /// allocation for every small local file copied.
        #[allow(clippy::large_enum_variant)]
        pub enum AnyReader {
            $(
                #[allow(missing_docs)]
                $v(<$s as Store>::Reader),
            )+
        }

        /// A file being written, of any backend.
        pub enum AnyWriter {
            $(
                #[allow(missing_docs)]
                $v(<$s as Store>::Writer),
            )+
        }

        impl SourceFile for AnyReader {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                match self { $(AnyReader::$v(r) => r.read(buf),)+ }
            }
            fn as_fd(&self) -> Option<BorrowedFd<'_>> {
                match self { $(AnyReader::$v(r) => r.as_fd(),)+ }
            }
            fn ranged(&self) -> Option<&dyn RangedSource> {
                match self { $(AnyReader::$v(r) => r.ranged(),)+ }
            }
            fn as_any(&self) -> Option<&dyn Any> {
                match self { $(AnyReader::$v(r) => r.as_any(),)+ }
            }
            fn meta(&self) -> Option<Meta> {
                match self { $(AnyReader::$v(r) => r.meta(),)+ }
            }
            fn current(&self) -> Option<(u64, i64, u32)> {
                match self { $(AnyReader::$v(r) => r.current(),)+ }
            }
            fn progress(&self) -> Option<&Progress<'_>> {
                match self { $(AnyReader::$v(r) => r.progress(),)+ }
            }
        }

        #[allow(unreachable_patterns)]
        impl Store for AnyStore {
            type Dir = AnyDir;
            type Reader = AnyReader;
            type Writer = AnyWriter;
            type Delta = AnyStore;
            type Xattrs = AnyStore;
            type Keep = AnyStore;
            type Posix = AnyStore;
            type Hashes = AnyStore;
            type Links = AnyStore;
            type Pipeline = AnyStore;

            fn features(&self) -> Features {
                match self { $(AnyStore::$v(s) => s.features(),)+ }
            }
            fn delta(&self) -> Option<&AnyStore> {
                match self { $(AnyStore::$v(s) => s.delta().map(|_| self),)+ }
            }
            fn xattrs(&self) -> Option<&AnyStore> {
                match self { $(AnyStore::$v(s) => s.xattrs().map(|_| self),)+ }
            }
            fn keeper(&self) -> Option<&AnyStore> {
                match self { $(AnyStore::$v(s) => s.keeper().map(|_| self),)+ }
            }
            fn posix(&self) -> Option<&AnyStore> {
                match self { $(AnyStore::$v(s) => s.posix().map(|_| self),)+ }
            }
            fn hashes(&self) -> Option<&AnyStore> {
                match self { $(AnyStore::$v(s) => s.hashes().map(|_| self),)+ }
            }
            fn links(&self) -> Option<&AnyStore> {
                match self { $(AnyStore::$v(s) => s.links().map(|_| self),)+ }
            }
            fn pipeline(&self) -> Option<&AnyStore> {
                match self { $(AnyStore::$v(s) => s.pipeline().map(|_| self),)+ }
            }
            fn cleanup(&self) -> Option<&dyn Cleanup> {
                match self { $(AnyStore::$v(s) => Store::cleanup(s),)+ }
            }
            fn open_root(&self) -> io::Result<Option<(AnyDir, Meta)>> {
                match self {
                    $(AnyStore::$v(s) => Ok(s.open_root()?.map(|(d, m)| (AnyDir::$v(d), m))),)+
                }
            }
            fn create_root(&self) -> io::Result<AnyDir> {
                match self { $(AnyStore::$v(s) => s.create_root().map(AnyDir::$v),)+ }
            }
            fn list(
                &self,
                dir: &AnyDir,
                rel: &[u8],
                out: &mut Listing,
                errors: &mut Vec<ListError>,
            ) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.list(d, rel, out, errors),)+
                    _ => mismatch(),
                }
            }
            fn refine(
                &self,
                dir: &AnyDir,
                list: &mut Listing,
                which: &[usize],
                errors: &mut Vec<ListError>,
            ) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.refine(d, list, which, errors),)+
                    _ => mismatch(),
                }
            }
            fn stat(&self, dir: &AnyDir, name: &CStr) -> io::Result<Option<Meta>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.stat(d, name),)+
                    _ => mismatch(),
                }
            }
            fn open_dir(&self, parent: &AnyDir, name: &CStr) -> io::Result<AnyDir> {
                match (self, parent) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.open_dir(d, name).map(AnyDir::$v),)+
                    _ => mismatch(),
                }
            }
            fn make_dir(&self, parent: &AnyDir, name: &CStr) -> io::Result<AnyDir> {
                match (self, parent) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.make_dir(d, name).map(AnyDir::$v),)+
                    _ => mismatch(),
                }
            }
            fn set_dir_meta(&self, dir: &AnyDir, meta: &Meta, what: MetaChange) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.set_dir_meta(d, meta, what),)+
                    _ => mismatch(),
                }
            }
            fn open_file(&self, dir: &AnyDir, name: &CStr) -> io::Result<AnyReader> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.open_file(d, name).map(AnyReader::$v),)+
                    _ => mismatch(),
                }
            }
            fn create_file(&self, dir: &AnyDir, name: &CStr, meta: &Meta) -> io::Result<AnyWriter> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.create_file(d, name, meta).map(AnyWriter::$v),)+
                    _ => mismatch(),
                }
            }
            fn write_from(
                &self,
                dir: &AnyDir,
                w: &mut AnyWriter,
                src: &mut dyn SourceFile,
                size: u64,
                limit: Option<&Limiter>,
            ) -> io::Result<u64> {
                match (self, dir, w) {
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => s.write_from(d, w, src, size, limit),)+
                    _ => mismatch(),
                }
            }
            fn expect(&self, w: &mut AnyWriter, at: Option<&Planned>) {
                match (self, w) {
                    $((AnyStore::$v(s), AnyWriter::$v(w)) => s.expect(w, at),)+
                    _ => mismatch(),
                }
            }
            fn commit(
                &self,
                dir: &AnyDir,
                w: AnyWriter,
                name: &CStr,
                meta: &Meta,
                fsync: bool,
            ) -> io::Result<()> {
                match (self, dir, w) {
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => s.commit(d, w, name, meta, fsync),)+
                    _ => mismatch(),
                }
            }
            fn abort(&self, dir: &AnyDir, w: AnyWriter) {
                match (self, dir, w) {
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => s.abort(d, w),)+
                    _ => mismatch(),
                }
            }
            fn set_meta(&self, dir: &AnyDir, name: &CStr, meta: &Meta, what: MetaChange) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.set_meta(d, name, meta, what),)+
                    _ => mismatch(),
                }
            }
            fn remove(&self, dir: &AnyDir, name: &CStr, is_dir: bool) -> io::Result<u64> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.remove(d, name, is_dir),)+
                    _ => mismatch(),
                }
            }
            fn remove_planned(&self, dir: &AnyDir, name: &CStr, at: &Planned) -> io::Result<u64> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.remove_planned(d, name, at),)+
                    _ => mismatch(),
                }
            }
            fn remove_each(
                &self,
                dir: &AnyDir,
                name: &CStr,
                each: &mut dyn FnMut(&[u8], u64),
            ) -> io::Result<u64> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.remove_each(d, name, each),)+
                    _ => mismatch(),
                }
            }
            fn rmdir(&self, dir: &AnyDir, name: &CStr) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.rmdir(d, name),)+
                    _ => mismatch(),
                }
            }
            fn rename(
                &self,
                from_dir: &AnyDir,
                from_name: &CStr,
                to_dir: &AnyDir,
                to_name: &CStr,
            ) -> io::Result<()> {
                match (self, from_dir, to_dir) {
                    $((AnyStore::$v(s), AnyDir::$v(f), AnyDir::$v(t)) => s.rename(f, from_name, t, to_name),)+
                    _ => mismatch(),
                }
            }
            fn free_space(&self, dir: &AnyDir) -> Option<(u64, u64)> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.free_space(d),)+
                    _ => mismatch(),
                }
            }
            fn report(&self, role: &str) -> Report {
                match self { $(AnyStore::$v(s) => s.report(role),)+ }
            }
        }

        // Each extension of `AnyStore` is `AnyStore` itself, returned by
        // its accessor only when the backend inside has the extension: a
        // method below is reached only through that accessor, so the
        // backend's extension is there (`ext`).

        #[allow(unreachable_patterns)]
        impl DeltaStore<AnyStore> for AnyStore {
            fn role(&self) -> DeltaRole {
                match self { $(AnyStore::$v(s) => DeltaStore::<$s>::role(ext(s.delta())),)+ }
            }
            fn delta_signature(&self, dir: &AnyDir, name: &CStr, min: u64) -> io::Result<Option<Signature>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => DeltaStore::<$s>::delta_signature(ext(s.delta()), d, name, min),)+
                    _ => mismatch(),
                }
            }
            fn delta_write(
                &self,
                dir: &AnyDir,
                w: &mut AnyWriter,
                old: &CStr,
                sig: &Signature,
                feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
            ) -> io::Result<DiffSummary> {
                match (self, dir, w) {
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => DeltaStore::<$s>::delta_write(ext(s.delta()), d, w, old, sig, feed),)+
                    _ => mismatch(),
                }
            }
            fn delta_diff(
                &self,
                r: &mut dyn SourceFile,
                sig: &Signature,
                sink: &mut dyn OpSink,
            ) -> io::Result<DiffSummary> {
                match self { $(AnyStore::$v(s) => DeltaStore::<$s>::delta_diff(ext(s.delta()), r, sig, sink),)+ }
            }
            fn delta_inplace<'a>(
                &'a self,
                dir: &'a AnyDir,
                name: &CStr,
                old: &Meta,
                l: &Layout,
                key: &[u8; 32],
            ) -> io::Result<Option<Box<dyn InPlace + 'a>>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => DeltaStore::<$s>::delta_inplace(ext(s.delta()), d, name, old, l, key),)+
                    _ => mismatch(),
                }
            }
            fn open_append<'a>(
                &'a self,
                dir: &'a AnyDir,
                name: &CStr,
                old: &Meta,
            ) -> io::Result<Option<Box<dyn AppendFile + 'a>>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => DeltaStore::<$s>::open_append(ext(s.delta()), d, name, old),)+
                    _ => mismatch(),
                }
            }
            fn inplace_hashes(
                &self,
                r: &mut dyn SourceFile,
                l: &Layout,
                key: &[u8; 32],
            ) -> io::Result<PatchHashes> {
                match self { $(AnyStore::$v(s) => DeltaStore::<$s>::inplace_hashes(ext(s.delta()), r, l, key),)+ }
            }
            fn read_at(&self, r: &mut dyn SourceFile, at: u64, buf: &mut [u8]) -> io::Result<usize> {
                match self { $(AnyStore::$v(s) => DeltaStore::<$s>::read_at(ext(s.delta()), r, at, buf),)+ }
            }
        }

        #[allow(unreachable_patterns)]
        impl XattrStore<AnyStore> for AnyStore {
            fn caps(&self) -> XattrSel {
                match self { $(AnyStore::$v(s) => XattrStore::<$s>::caps(ext(s.xattrs())),)+ }
            }
            fn get_xattrs(
                &self,
                dir: &AnyDir,
                name: Option<&CStr>,
                kind: Kind,
                sel: XattrSel,
                out: &mut Xattrs,
            ) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => XattrStore::<$s>::get_xattrs(ext(s.xattrs()), d, name, kind, sel, out),)+
                    _ => mismatch(),
                }
            }
            fn reader_xattrs(&self, r: &AnyReader, sel: XattrSel, out: &mut Xattrs) -> io::Result<()> {
                match (self, r) {
                    $((AnyStore::$v(s), AnyReader::$v(r)) => XattrStore::<$s>::reader_xattrs(ext(s.xattrs()), r, sel, out),)+
                    _ => mismatch(),
                }
            }
            fn set_xattrs(
                &self,
                dir: &AnyDir,
                name: Option<&CStr>,
                meta: &Meta,
                sel: XattrSel,
                want: &Xattrs,
                have: Option<&Xattrs>,
            ) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => XattrStore::<$s>::set_xattrs(ext(s.xattrs()), d, name, meta, sel, want, have),)+
                    _ => mismatch(),
                }
            }
            fn set_writer_xattrs(
                &self,
                dir: &AnyDir,
                w: &mut AnyWriter,
                meta: &Meta,
                sel: XattrSel,
                want: &Xattrs,
            ) -> io::Result<()> {
                match (self, dir, w) {
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => XattrStore::<$s>::set_writer_xattrs(ext(s.xattrs()), d, w, meta, sel, want),)+
                    _ => mismatch(),
                }
            }
        }

        #[allow(unreachable_patterns)]
        impl KeepStore<AnyStore> for AnyStore {
            fn keeps_at(&self, base: &KeepBase) -> bool {
                match self { $(AnyStore::$v(s) => KeepStore::<$s>::keeps_at(ext(s.keeper()), base),)+ }
            }
            fn keep(&self, dir: &AnyDir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => KeepStore::<$s>::keep(ext(s.keeper()), d, name, to),)+
                    _ => mismatch(),
                }
            }
        }

        #[allow(unreachable_patterns)]
        impl PosixStore<AnyStore> for AnyStore {
            fn hard_links(&self) -> bool {
                match self { $(AnyStore::$v(s) => PosixStore::<$s>::hard_links(ext(s.posix())),)+ }
            }
            fn link(
                &self,
                from_dir: &AnyDir,
                from_name: &CStr,
                dir: &AnyDir,
                name: &CStr,
            ) -> io::Result<()> {
                match (self, from_dir, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(f), AnyDir::$v(t)) => PosixStore::<$s>::link(ext(s.posix()), f, from_name, t, name),)+
                    _ => mismatch(),
                }
            }
            fn special(&self) -> bool {
                match self { $(AnyStore::$v(s) => PosixStore::<$s>::special(ext(s.posix())),)+ }
            }
            fn create_special(&self, dir: &AnyDir, name: &CStr, meta: &Meta, replace: bool) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => PosixStore::<$s>::create_special(ext(s.posix()), d, name, meta, replace),)+
                    _ => mismatch(),
                }
            }
            fn is_own_legacy_partial(&self, dir: &AnyDir, name: &CStr) -> bool {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => PosixStore::<$s>::is_own_legacy_partial(ext(s.posix()), d, name),)+
                    _ => mismatch(),
                }
            }
            fn make_writable(&self, dir: &AnyDir) -> io::Result<bool> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => PosixStore::<$s>::make_writable(ext(s.posix()), d),)+
                    _ => mismatch(),
                }
            }
            fn root_identities(&self) -> Option<ferry_engine::walk::RootIds> {
                match self { $(AnyStore::$v(s) => PosixStore::<$s>::root_identities(ext(s.posix())),)+ }
            }
        }

        #[allow(unreachable_patterns)]
        impl HashStore<AnyStore> for AnyStore {
            fn kinds(&self) -> HashSet {
                match self { $(AnyStore::$v(s) => HashStore::<$s>::kinds(ext(s.hashes())),)+ }
            }
            fn hash(&self, dir: &AnyDir, name: &CStr, kind: HashKind) -> io::Result<Option<Hash>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => HashStore::<$s>::hash(ext(s.hashes()), d, name, kind),)+
                    _ => mismatch(),
                }
            }
            fn matches_bytes<'a>(
                &self,
                dir: &AnyDir,
                name: &CStr,
                size: u64,
                open: &mut dyn FnMut() -> io::Result<Box<dyn SourceFile + 'a>>,
            ) -> io::Result<Option<bool>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => HashStore::<$s>::matches_bytes(ext(s.hashes()), d, name, size, open),)+
                    _ => mismatch(),
                }
            }
        }
        #[allow(unreachable_patterns)]
        impl LinkStore<AnyStore> for AnyStore {
            fn read_link(&self, dir: &AnyDir, name: &CStr) -> io::Result<Vec<u8>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => LinkStore::<$s>::read_link(ext(s.links()), d, name),)+
                    _ => mismatch(),
                }
            }
            fn create_symlink(&self, dir: &AnyDir, name: &CStr, target: &[u8], meta: &Meta) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => LinkStore::<$s>::create_symlink(ext(s.links()), d, name, target, meta),)+
                    _ => mismatch(),
                }
            }
            fn sets_symlink_times(&self, dir: &AnyDir, name: &CStr, now: &Meta) -> bool {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => LinkStore::<$s>::sets_symlink_times(ext(s.links()), d, name, now),)+
                    _ => mismatch(),
                }
            }
        }

        #[allow(unreachable_patterns)]
        impl PipelineStore<AnyStore> for AnyStore {
            fn open_ahead(&self, dir: &AnyDir, files: &[(&CStr, u64)]) {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => PipelineStore::<$s>::open_ahead(ext(s.pipeline()), d, files),)+
                    _ => mismatch(),
                }
            }
            fn commit_nowait<'a>(
                &'a self,
                dir: &'a AnyDir,
                w: AnyWriter,
                name: &CStr,
                meta: &Meta,
                fsync: bool,
            ) -> Committing<'a> {
                match (self, dir, w) {
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => PipelineStore::<$s>::commit_nowait(ext(s.pipeline()), d, w, name, meta, fsync),)+
                    _ => mismatch(),
                }
            }
            fn meta_after_commit(&self, written: &Meta) -> Option<Meta> {
                match self { $(AnyStore::$v(s) => PipelineStore::<$s>::meta_after_commit(ext(s.pipeline()), written),)+ }
            }
            fn create_empty(&self, dir: &AnyDir, name: &CStr, meta: &Meta, fsync: bool) -> io::Result<bool> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => PipelineStore::<$s>::create_empty(ext(s.pipeline()), d, name, meta, fsync),)+
                    _ => mismatch(),
                }
            }
            fn open_dir_to_list(&self, parent: &AnyDir, name: &CStr) -> io::Result<AnyDir> {
                match (self, parent) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => PipelineStore::<$s>::open_dir_to_list(ext(s.pipeline()), d, name).map(AnyDir::$v),)+
                    _ => mismatch(),
                }
            }
            fn expect_dirs(&self, root: &AnyDir, dirs: &[Vec<u8>]) {
                match (self, root) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => PipelineStore::<$s>::expect_dirs(ext(s.pipeline()), d, dirs),)+
                    _ => mismatch(),
                }
            }
        }
    };
}

backends! {
    Local(LocalStore),
    S3(S3Store),
    Ssh(SshStore),
    Sftp(SftpStore),
}
