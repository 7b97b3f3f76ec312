//! [`AnyStore`]: every backend behind one `Store` type, its associated
//! types enums of the backends' own. The forwarding is generated: adding a
//! backend is one line in the `backends!` call at the bottom.

use std::any::Any;
use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::delta::{DiffSummary, InPlace, Layout, OpSink, PatchHashes, Signature};
use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::hash::{Hash, HashKind, HashSet};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::store::{
    Committing, DeltaRole, ListError, MetaChange, Planned, Progress, RangedSource, SourceFile,
    Store,
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
            fn approximate_meta(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.approximate_meta(),)+ }
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
            fn read_link(&self, dir: &AnyDir, name: &CStr) -> io::Result<Vec<u8>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.read_link(d, name),)+
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
            fn replacing(&self, w: &mut AnyWriter) {
                match (self, w) {
                    $((AnyStore::$v(s), AnyWriter::$v(w)) => s.replacing(w),)+
                    _ => mismatch(),
                }
            }
            fn expect(&self, w: &mut AnyWriter, at: Option<&Planned>) {
                match (self, w) {
                    $((AnyStore::$v(s), AnyWriter::$v(w)) => s.expect(w, at),)+
                    _ => mismatch(),
                }
            }
            fn remove_planned(&self, dir: &AnyDir, name: &CStr, at: &Planned) -> io::Result<u64> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.remove_planned(d, name, at),)+
                    _ => mismatch(),
                }
            }
            fn create_empty(&self, dir: &AnyDir, name: &CStr, meta: &Meta, fsync: bool) -> io::Result<bool> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.create_empty(d, name, meta, fsync),)+
                    _ => mismatch(),
                }
            }
            fn abort(&self, dir: &AnyDir, w: AnyWriter) {
                match (self, dir, w) {
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => s.abort(d, w),)+
                    _ => mismatch(),
                }
            }
            fn create_symlink(&self, dir: &AnyDir, name: &CStr, target: &[u8], meta: &Meta) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.create_symlink(d, name, target, meta),)+
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
            fn hashes(&self) -> HashSet {
                match self { $(AnyStore::$v(s) => s.hashes(),)+ }
            }
            fn hash(&self, dir: &AnyDir, name: &CStr, kind: HashKind) -> io::Result<Option<Hash>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.hash(d, name, kind),)+
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
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.matches_bytes(d, name, size, open),)+
                    _ => mismatch(),
                }
            }
            fn dir_write_lanes(&self) -> usize {
                match self { $(AnyStore::$v(s) => s.dir_write_lanes(),)+ }
            }
            fn latency_bound(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.latency_bound(),)+ }
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
            fn has_hard_links(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.has_hard_links(),)+ }
            }
            fn link(
                &self,
                from_dir: &AnyDir,
                from_name: &CStr,
                dir: &AnyDir,
                name: &CStr,
            ) -> io::Result<()> {
                match (self, from_dir, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(f), AnyDir::$v(t)) => s.link(f, from_name, t, name),)+
                    _ => mismatch(),
                }
            }
            fn rmdir(&self, dir: &AnyDir, name: &CStr) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.rmdir(d, name),)+
                    _ => mismatch(),
                }
            }
            fn preserves_owner(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.preserves_owner(),)+ }
            }
            fn has_dir_meta(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.has_dir_meta(),)+ }
            }
            fn local_modes(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.local_modes(),)+ }
            }
            fn warnings(&self, role: &str) -> Vec<String> {
                match self { $(AnyStore::$v(s) => s.warnings(role),)+ }
            }
            fn has_inodes(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.has_inodes(),)+ }
            }
            fn meta_after_commit(&self, written: &Meta) -> Option<Meta> {
                match self { $(AnyStore::$v(s) => s.meta_after_commit(written),)+ }
            }
            fn supports_symlinks(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.supports_symlinks(),)+ }
            }
            fn sets_symlink_times(&self, dir: &AnyDir, name: &CStr, now: &Meta) -> bool {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.sets_symlink_times(d, name, now),)+
                    _ => mismatch(),
                }
            }
            fn keeps_empty_dirs(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.keeps_empty_dirs(),)+ }
            }
            fn supports_special(&self) -> bool {
                match self { $(AnyStore::$v(s) => s.supports_special(),)+ }
            }
            fn create_special(&self, dir: &AnyDir, name: &CStr, meta: &Meta, replace: bool) -> io::Result<()> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.create_special(d, name, meta, replace),)+
                    _ => mismatch(),
                }
            }
            fn is_own_legacy_partial(&self, dir: &AnyDir, name: &CStr) -> bool {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.is_own_legacy_partial(d, name),)+
                    _ => mismatch(),
                }
            }
            fn make_writable(&self, dir: &AnyDir) -> io::Result<bool> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.make_writable(d),)+
                    _ => mismatch(),
                }
            }
            fn xattr_caps(&self) -> XattrSel {
                match self { $(AnyStore::$v(s) => s.xattr_caps(),)+ }
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
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.get_xattrs(d, name, kind, sel, out),)+
                    _ => mismatch(),
                }
            }
            fn reader_xattrs(&self, r: &AnyReader, sel: XattrSel, out: &mut Xattrs) -> io::Result<()> {
                match (self, r) {
                    $((AnyStore::$v(s), AnyReader::$v(r)) => s.reader_xattrs(r, sel, out),)+
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
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.set_xattrs(d, name, meta, sel, want, have),)+
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
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => s.set_writer_xattrs(d, w, meta, sel, want),)+
                    _ => mismatch(),
                }
            }
            fn delta_role(&self) -> DeltaRole {
                match self { $(AnyStore::$v(s) => s.delta_role(),)+ }
            }
            fn delta_signature(&self, dir: &AnyDir, name: &CStr, min: u64) -> io::Result<Option<Signature>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.delta_signature(d, name, min),)+
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
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => s.delta_write(d, w, old, sig, feed),)+
                    _ => mismatch(),
                }
            }
            fn delta_diff(
                &self,
                r: &mut dyn SourceFile,
                sig: &Signature,
                sink: &mut dyn OpSink,
            ) -> io::Result<DiffSummary> {
                match self { $(AnyStore::$v(s) => s.delta_diff(r, sig, sink),)+ }
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
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.delta_inplace(d, name, old, l, key),)+
                    _ => mismatch(),
                }
            }
            fn open_append<'a>(
                &'a self,
                dir: &'a AnyDir,
                name: &CStr,
                old: &Meta,
            ) -> io::Result<Option<Box<dyn ferry_engine::store::AppendFile + 'a>>> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.open_append(d, name, old),)+
                    _ => mismatch(),
                }
            }
            fn inplace_hashes(
                &self,
                r: &mut dyn SourceFile,
                l: &Layout,
                key: &[u8; 32],
            ) -> io::Result<PatchHashes> {
                match self { $(AnyStore::$v(s) => s.inplace_hashes(r, l, key),)+ }
            }
            fn read_at(&self, r: &mut dyn SourceFile, at: u64, buf: &mut [u8]) -> io::Result<usize> {
                match self { $(AnyStore::$v(s) => s.read_at(r, at, buf),)+ }
            }
            fn notes(&self, role: &str) -> Vec<String> {
                match self { $(AnyStore::$v(s) => Store::notes(s, role),)+ }
            }
            fn cleanup(&self, max_age: Duration, dry_run: bool) -> io::Result<Vec<(String, String)>> {
                match self { $(AnyStore::$v(s) => Store::cleanup(s, max_age, dry_run),)+ }
            }
            fn mtime_step_ns(&self) -> u32 {
                match self { $(AnyStore::$v(s) => s.mtime_step_ns(),)+ }
            }
            fn keep(&self, dir: &AnyDir, name: &CStr, to: &KeepTo<'_>) -> io::Result<()> {
                match (self, dir) { $((AnyStore::$v(s), AnyDir::$v(d)) => s.keep(d, name, to),)+ _ => mismatch() }
            }
            fn root_ids(&self) -> Option<ferry_engine::walk::RootIds> {
                match self { $(AnyStore::$v(s) => s.root_ids(),)+ }
            }
            fn free_space(&self, dir: &AnyDir) -> Option<(u64, u64)> {
                match (self, dir) {
                    $((AnyStore::$v(s), AnyDir::$v(d)) => s.free_space(d),)+
                    _ => mismatch(),
                }
            }
            fn can_keep(&self, base: &KeepBase) -> bool {
                match self { $(AnyStore::$v(s) => s.can_keep(base),)+ }
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
                    $((AnyStore::$v(s), AnyDir::$v(d), AnyWriter::$v(w)) => s.commit_nowait(d, w, name, meta, fsync),)+
                    _ => mismatch(),
                }
            }
            fn open_ahead(&self, dir: &AnyDir, files: &[(&CStr, u64)]) {
                match (self, dir) { $((AnyStore::$v(s), AnyDir::$v(d)) => s.open_ahead(d, files),)+ _ => mismatch() }
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
