//! The [`Absent`] extension of every kind: the type of a store without
//! it, whose accessor returns `None`, so none of these bodies can run.

use super::*;

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

impl<S: Store> LinkStore<S> for Absent {
    fn read_link(&self, _: &S::Dir, _: &CStr) -> io::Result<Vec<u8>> {
        match *self {}
    }
    fn create_symlink(&self, _: &S::Dir, _: &CStr, _: &[u8], _: &Meta) -> io::Result<()> {
        match *self {}
    }
    fn sets_symlink_times(&self, _: &S::Dir, _: &CStr, _: &Meta) -> bool {
        match *self {}
    }
}

impl<S: Store> PipelineStore<S> for Absent {
    fn open_ahead(&self, _: &S::Dir, _: &[(&CStr, u64)]) {
        match *self {}
    }
    fn commit_nowait<'a>(
        &'a self,
        _: &'a S::Dir,
        _: S::Writer,
        _: &CStr,
        _: &Meta,
        _: bool,
    ) -> Committing<'a> {
        match *self {}
    }
    fn meta_after_commit(&self, _: &Meta) -> Option<Meta> {
        match *self {}
    }
    fn create_empty(&self, _: &S::Dir, _: &CStr, _: &Meta, _: bool) -> io::Result<bool> {
        match *self {}
    }
    fn open_dir_to_list(&self, _: &S::Dir, _: &CStr) -> io::Result<S::Dir> {
        match *self {}
    }
    fn expect_dirs(&self, _: &S::Dir, _: &[Vec<u8>]) {
        match *self {}
    }
}
