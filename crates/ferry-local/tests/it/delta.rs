//! Delta transfers between local trees (`--delta`), through the engine:
//! a changed file is rebuilt from the destination's old copy; an old copy
//! that changes after it was signed (a block the rebuild then copies is
//! not what the signature said) is caught by the whole-file hash, and the
//! file is sent whole instead. A store wrapping the local one spoils the
//! old copy right after signing it, as a disk error or a concurrent writer
//! would.

use std::ffi::CStr;
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use ferry_engine::delta::{DiffSummary, Figures, Mode as DeltaMode, OpSink, Signature};
use ferry_engine::entry::{Listing, Meta};
use ferry_engine::report::Quiet;
use ferry_engine::store::{
    remove_dir_whole, unsupported, Absent, Cleanup, DeltaStore, Features, LinkStore, Planned,
    Report,
};
use ferry_engine::store::{DeltaRole, ListError, MetaChange, SourceFile, Store};
use ferry_engine::{Engine, Mode, Options, Stats};
use ferry_local::local::{LocalDir, LocalReader, LocalWriter};
use ferry_local::LocalStore;

/// The local store; with `spoil` set, the old copy it signs gets one byte
/// changed at `at` right after.
struct Spoiling {
    inner: LocalStore,
    root: PathBuf,
    spoil: AtomicBool,
    at: u64,
}

impl Store for Spoiling {
    type Dir = LocalDir;
    type Reader = LocalReader;
    type Writer = LocalWriter;
    type Delta = Spoiling;
    type Xattrs = Absent;
    type Keep = Absent;
    type Posix = Absent;
    type Hashes = Absent;
    type Links = Spoiling;
    type Pipeline = Absent;

    fn features(&self) -> Features {
        Features {
            approximate_meta: false,
            latency_bound: false,
            preserves_owner: self.inner.features().preserves_owner,
            local_modes: false,
            dir_meta: true,
            inodes: true,
            empty_dirs: true,
            dir_write_lanes: usize::MAX,
            mtime_step_ns: 1,
        }
    }
    fn delta(&self) -> Option<&Spoiling> {
        Some(self)
    }
    fn xattrs(&self) -> Option<&Absent> {
        None
    }
    fn keeper(&self) -> Option<&Absent> {
        None
    }
    fn posix(&self) -> Option<&Absent> {
        None
    }
    fn hashes(&self) -> Option<&Absent> {
        None
    }

    fn links(&self) -> Option<&Spoiling> {
        Some(self)
    }

    fn pipeline(&self) -> Option<&Absent> {
        None
    }

    fn report(&self, _role: &str) -> Report {
        Report::default()
    }
    fn cleanup(&self) -> Option<&dyn Cleanup> {
        None
    }
    fn refine(
        &self,
        _dir: &LocalDir,
        _list: &mut Listing,
        _which: &[usize],
        _errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        Ok(())
    }
    fn expect(&self, _w: &mut LocalWriter, _at: Option<&Planned>) {}
    fn remove_planned(&self, dir: &LocalDir, name: &CStr, _at: &Planned) -> io::Result<u64> {
        self.remove(dir, name, false)
    }
    fn remove_each(
        &self,
        dir: &LocalDir,
        name: &CStr,
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64> {
        remove_dir_whole(self, dir, name, each)
    }
    fn rename(&self, _: &LocalDir, _: &CStr, _: &LocalDir, _: &CStr) -> io::Result<()> {
        Err(unsupported())
    }
    fn free_space(&self, _dir: &LocalDir) -> Option<(u64, u64)> {
        None
    }

    fn open_root(&self) -> io::Result<Option<(LocalDir, Meta)>> {
        self.inner.open_root()
    }
    fn create_root(&self) -> io::Result<LocalDir> {
        self.inner.create_root()
    }
    fn list(
        &self,
        dir: &LocalDir,
        rel: &[u8],
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        self.inner.list(dir, rel, out, errors)
    }
    fn stat(&self, dir: &LocalDir, name: &CStr) -> io::Result<Option<Meta>> {
        self.inner.stat(dir, name)
    }
    fn open_dir(&self, parent: &LocalDir, name: &CStr) -> io::Result<LocalDir> {
        self.inner.open_dir(parent, name)
    }
    fn make_dir(&self, parent: &LocalDir, name: &CStr) -> io::Result<LocalDir> {
        self.inner.make_dir(parent, name)
    }
    fn set_dir_meta(&self, dir: &LocalDir, meta: &Meta, what: MetaChange) -> io::Result<()> {
        self.inner.set_dir_meta(dir, meta, what)
    }
    fn open_file(&self, dir: &LocalDir, name: &CStr) -> io::Result<LocalReader> {
        self.inner.open_file(dir, name)
    }
    fn create_file(&self, dir: &LocalDir, name: &CStr, meta: &Meta) -> io::Result<LocalWriter> {
        self.inner.create_file(dir, name, meta)
    }
    fn write_from(
        &self,
        dir: &LocalDir,
        w: &mut LocalWriter,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&ferry_engine::bwlimit::Limiter>,
    ) -> io::Result<u64> {
        self.inner.write_from(dir, w, src, size, limit)
    }
    fn commit(
        &self,
        dir: &LocalDir,
        w: LocalWriter,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<()> {
        self.inner.commit(dir, w, name, meta, fsync)
    }
    fn abort(&self, dir: &LocalDir, w: LocalWriter) {
        self.inner.abort(dir, w)
    }
    fn set_meta(
        &self,
        dir: &LocalDir,
        name: &CStr,
        meta: &Meta,
        what: MetaChange,
    ) -> io::Result<()> {
        self.inner.set_meta(dir, name, meta, what)
    }
    fn remove(&self, dir: &LocalDir, name: &CStr, is_dir: bool) -> io::Result<u64> {
        self.inner.remove(dir, name, is_dir)
    }
    fn rmdir(&self, dir: &LocalDir, name: &CStr) -> io::Result<()> {
        self.inner.rmdir(dir, name)
    }
}

impl LinkStore<Spoiling> for Spoiling {
    fn read_link(&self, dir: &LocalDir, name: &CStr) -> io::Result<Vec<u8>> {
        LinkStore::<LocalStore>::read_link(&self.inner, dir, name)
    }
    fn create_symlink(
        &self,
        dir: &LocalDir,
        name: &CStr,
        target: &[u8],
        meta: &Meta,
    ) -> io::Result<()> {
        LinkStore::<LocalStore>::create_symlink(&self.inner, dir, name, target, meta)
    }
    fn sets_symlink_times(&self, _dir: &LocalDir, _name: &CStr, _now: &Meta) -> bool {
        true
    }
}

impl DeltaStore<Spoiling> for Spoiling {
    fn role(&self) -> DeltaRole {
        self.inner.role()
    }
    fn delta_signature(
        &self,
        dir: &LocalDir,
        name: &CStr,
        min: u64,
    ) -> io::Result<Option<Signature>> {
        let sig = self.inner.delta_signature(dir, name, min)?;
        if self.spoil.load(Ordering::Relaxed) {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(self.root.join(name.to_str().unwrap()))?;
            let mut b = [0u8];
            f.read_exact_at(&mut b, self.at)?;
            f.write_all_at(&[b[0] ^ 0xff], self.at)?;
        }
        Ok(sig)
    }
    fn delta_write(
        &self,
        dir: &LocalDir,
        w: &mut LocalWriter,
        old: &CStr,
        sig: &Signature,
        feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
    ) -> io::Result<DiffSummary> {
        self.inner.delta_write(dir, w, old, sig, feed)
    }
    fn delta_diff(
        &self,
        r: &mut dyn SourceFile,
        sig: &Signature,
        sink: &mut dyn OpSink,
    ) -> io::Result<DiffSummary> {
        ferry_engine::delta::diff(r, sig, sink)
    }
    fn delta_inplace<'a>(
        &'a self,
        _dir: &'a LocalDir,
        _name: &CStr,
        _old: &Meta,
        _l: &ferry_engine::delta::Layout,
        _key: &[u8; 32],
    ) -> io::Result<Option<Box<dyn ferry_engine::delta::InPlace + 'a>>> {
        Ok(None)
    }
    fn open_append<'a>(
        &'a self,
        _dir: &'a LocalDir,
        _name: &CStr,
        _old: &Meta,
    ) -> io::Result<Option<Box<dyn ferry_engine::store::AppendFile + 'a>>> {
        Ok(None)
    }
    fn inplace_hashes(
        &self,
        r: &mut dyn SourceFile,
        l: &ferry_engine::delta::Layout,
        key: &[u8; 32],
    ) -> io::Result<ferry_engine::delta::PatchHashes> {
        ferry_engine::delta::inplace::source_patch_hashes(r, l, key)
    }
    fn read_at(&self, r: &mut dyn SourceFile, at: u64, buf: &mut [u8]) -> io::Result<usize> {
        ferry_engine::delta::inplace::source_read_at(r, at, buf)
    }
}

fn opts(delta: DeltaMode) -> Options {
    Options {
        mode: Mode::Copy,
        dry_run: false,
        checksum: false,
        fsync: false,
        jobs: 2,
        more_jobs: None,
        filter: None,
        bwlimit: None,
        max_delete: None,
        force: false,
        xattrs: Default::default(),
        hard_links: false,
        delta,
        keep: None,
        keep_special_bits: false,
    }
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `src/f` (4 MiB) copied over `dst/f` (the same with small edits), the
/// destination spoiled at `spoil` after signing: the delta figures.
fn update(d: &Path, spoil: Option<u64>, delta: DeltaMode) -> Figures {
    let (src, dst) = (d.join("src"), d.join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&dst).unwrap();
    let new = bytes(4 << 20, 7);
    let mut old = new.clone();
    old[1_000_000] ^= 1;
    old.splice(3_000_000..3_000_000, b"gone".iter().copied());
    fs::write(src.join("f"), &new).unwrap();
    fs::write(dst.join("f"), &old).unwrap();
    let s = LocalStore::new(&src, 1);
    let t = Spoiling {
        inner: LocalStore::new(&dst, 1),
        root: dst.clone(),
        spoil: AtomicBool::new(spoil.is_some()),
        at: spoil.unwrap_or(0),
    };
    let stats = Stats::default();
    let o = opts(delta);
    let sum = Engine::new(&s, &t, &o, &stats, &Quiet).run_tree().unwrap();
    assert_eq!(sum.errors, 0);
    assert_eq!(sum.files_copied, 1);
    assert!(
        fs::read(dst.join("f")).unwrap() == new,
        "DST differs from SRC"
    );
    sum.delta
}

#[test]
fn a_changed_file_is_rebuilt_from_the_old_copy() {
    let d = tempfile::tempdir().unwrap();
    let f = update(d.path(), None, DeltaMode::On);
    assert_eq!((f.files, f.fallbacks), (1, 0), "{f:?}");
    // Block size 2 KiB: the two edits cost a few blocks.
    assert!(f.literal <= 4 * 2048, "{f:?}");
    assert_eq!(f.literal + f.matched, 4 << 20);
    assert!(f.wire < 64 << 10, "{f:?}");
}

#[test]
fn a_spoiled_old_copy_is_caught_and_the_file_sent_whole() {
    let d = tempfile::tempdir().unwrap();
    let f = update(d.path(), Some(2_000_000), DeltaMode::On);
    assert_eq!((f.files, f.fallbacks), (0, 1), "{f:?}");
    assert_eq!(f.wire, 4 << 20, "sent whole");
}

#[test]
fn local_trees_go_whole_unless_asked() {
    let d = tempfile::tempdir().unwrap();
    let f = update(d.path(), None, DeltaMode::Auto);
    assert_eq!((f.files, f.wire), (0, 4 << 20), "{f:?}");
    let d = tempfile::tempdir().unwrap();
    let f = update(d.path(), None, DeltaMode::Off);
    assert_eq!(f, Figures::default());
}
