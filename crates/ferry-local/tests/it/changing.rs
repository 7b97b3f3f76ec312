//! A source file that changes while it is copied, made deterministic: a store
//! wrapping the local one appends to the source file at the end of each copy
//! attempt (when the engine asks the reader for what it learned), as a writer
//! racing the copy would. Every copy path of the local store is exercised:
//! small files, `copy_file_range` in one call and in chunks, `--bwlimit`, and
//! the read/write loop (across filesystems, where `/dev/shm` is another one).
//! Also: bytes are counted for progress as they move, not when a file ends.

use std::ffi::CStr;
use std::fs;
use std::io::{self, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use ferry_engine::bwlimit::Limiter;
use ferry_engine::entry::{Listing, Meta};
use ferry_engine::report::Quiet;
use ferry_engine::store::{
    remove_dir_whole, unsupported, Absent, Cleanup, Features, LinkStore, Planned, Report, StoreExt,
};
use ferry_engine::store::{ListError, MetaChange, SourceFile, Store};
use ferry_engine::{Engine, Mode, Options, Stats};
use ferry_local::local::{LocalDir, LocalReader, LocalWriter};
use ferry_local::LocalStore;

/// The local store, whose readers grow their file `grows` more times.
struct Growing {
    inner: LocalStore,
    root: PathBuf,
    grows: Arc<AtomicU32>,
    /// When set, the run's moved-bytes counter, checked by the readers.
    watch: Option<Arc<Stats>>,
    /// Files removed from the source when its root is opened the second
    /// time (between the `--max-delete` counting pass and the run).
    shrink: Vec<PathBuf>,
    roots: AtomicU32,
}

struct GrowingReader {
    inner: LocalReader,
    path: PathBuf,
    grows: Arc<AtomicU32>,
    watch: Option<Arc<Stats>>,
    reads: u32,
}

impl SourceFile for GrowingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        if let (Some(st), 2) = (&self.watch, self.reads) {
            // The first read's bytes are counted before the file is done.
            assert!(
                st.bytes_moved.load(Ordering::Relaxed) > 0,
                "no progress mid-file"
            );
            assert_eq!(st.bytes_copied.load(Ordering::Relaxed), 0);
        }
        // Small reads, so that a file takes several.
        let n = buf.len().min(64 << 10);
        self.inner.read(&mut buf[..n])
    }
    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.as_fd()
    }
    fn meta(&self) -> Option<Meta> {
        // The copy has ended; the file grows now, before it is committed.
        if self
            .grows
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |g| g.checked_sub(1))
            .is_ok()
        {
            let mut f = fs::OpenOptions::new()
                .append(true)
                .open(&self.path)
                .unwrap();
            f.write_all(&[b'+'; 1000]).unwrap();
        }
        self.inner.meta()
    }
    fn current(&self) -> Option<(u64, i64, u32)> {
        self.inner.current()
    }
}

impl Store for Growing {
    type Dir = LocalDir;
    type Reader = GrowingReader;
    type Writer = LocalWriter;
    type Delta = Absent;
    type Xattrs = Absent;
    type Keep = Absent;
    type Posix = Absent;
    type Hashes = Absent;
    type Links = Growing;
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
    fn delta(&self) -> Option<&Absent> {
        None
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

    fn links(&self) -> Option<&Growing> {
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
        if self.roots.fetch_add(1, Ordering::Relaxed) == 1 {
            for p in &self.shrink {
                fs::remove_file(p).unwrap();
            }
        }
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
    fn open_file(&self, dir: &LocalDir, name: &CStr) -> io::Result<GrowingReader> {
        let path = self.root.join(std::ffi::OsStr::new(name.to_str().unwrap()));
        Ok(GrowingReader {
            inner: self.inner.open_file(dir, name)?,
            path,
            grows: self.grows.clone(),
            watch: self.watch.clone(),
            reads: 0,
        })
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
        limit: Option<&Limiter>,
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

impl LinkStore<Growing> for Growing {
    fn read_link(&self, dir: &LocalDir, name: &CStr) -> io::Result<Vec<u8>> {
        StoreExt::read_link(&self.inner, dir, name)
    }
    fn create_symlink(
        &self,
        dir: &LocalDir,
        name: &CStr,
        target: &[u8],
        meta: &Meta,
    ) -> io::Result<()> {
        StoreExt::create_symlink(&self.inner, dir, name, target, meta)
    }
    fn sets_symlink_times(&self, _dir: &LocalDir, _name: &CStr, _now: &Meta) -> bool {
        true
    }
}

fn opts(bwlimit: Option<u64>) -> Options {
    Options {
        mode: Mode::Copy,
        dry_run: false,
        checksum: false,
        fsync: false,
        jobs: 2,
        more_jobs: None,
        filter: None,
        bwlimit: bwlimit.map(Limiter::new),
        max_delete: None,
        force: false,
        xattrs: Default::default(),
        hard_links: false,
        delta: Default::default(),
        keep: None,
        keep_special_bits: false,
    }
}

/// Copy `src` (one file, `f`) to `dst` while the file grows `grows` times.
fn copy_growing(src: &Path, dst: &Path, grows: u32, bwlimit: Option<u64>) -> (Stats, u32) {
    let counter = Arc::new(AtomicU32::new(grows));
    let s = Growing {
        inner: LocalStore::new(src, 1),
        root: src.to_path_buf(),
        grows: counter.clone(),
        watch: None,
        shrink: Vec::new(),
        roots: AtomicU32::new(0),
    };
    let d = LocalStore::new(dst, 1);
    let stats = Stats::default();
    let o = opts(bwlimit);
    Engine::new(&s, &d, &o, &stats, &Quiet).run_tree().unwrap();
    let left = counter.load(Ordering::Relaxed);
    (stats, grows - left)
}

fn cases() -> Vec<(&'static str, usize, Option<u64>, PathBuf)> {
    let shm = Path::new("/dev/shm");
    let mut v = vec![
        ("small", 3000, None, std::env::temp_dir()),
        ("one copy_file_range", 2 << 20, None, std::env::temp_dir()),
        (
            "copy_file_range in chunks",
            130 << 20,
            None,
            std::env::temp_dir(),
        ),
        ("--bwlimit", 1 << 20, Some(1u64 << 30), std::env::temp_dir()),
    ];
    if shm.is_dir() {
        // Another filesystem: the read/write loop.
        v.push(("streamed", 3 << 20, None, shm.to_path_buf()));
    }
    v
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn a_file_that_grows_once_while_copied_is_copied_again_whole() {
    for (what, size, bw, dst_base) in cases() {
        let t = tempfile::tempdir().unwrap();
        let d = tempfile::tempdir_in(&dst_base).unwrap();
        let (src, dst) = (t.path().join("src"), d.path().join("dst"));
        fs::create_dir(&src).unwrap();
        fs::write(src.join("f"), data(size)).unwrap();
        let (stats, grew) = copy_growing(&src, &dst, 1, bw);
        assert_eq!(grew, 1, "{what}");
        assert_eq!(stats.errors.load(Ordering::Relaxed), 0, "{what}");
        let (a, b) = (
            fs::read(src.join("f")).unwrap(),
            fs::read(dst.join("f")).unwrap(),
        );
        assert_eq!(a.len(), size + 1000, "{what}");
        assert!(
            a == b,
            "{what}: DST ({} bytes) is not the grown file",
            b.len()
        );
        let (ma, mb) = (
            fs::metadata(src.join("f")).unwrap(),
            fs::metadata(dst.join("f")).unwrap(),
        );
        assert_eq!(
            (ma.mtime(), ma.mtime_nsec()),
            (mb.mtime(), mb.mtime_nsec()),
            "{what}"
        );
    }
}

#[test]
fn a_file_that_keeps_changing_is_reported_and_not_committed() {
    for (what, size, bw, dst_base) in cases() {
        let t = tempfile::tempdir().unwrap();
        let d = tempfile::tempdir_in(&dst_base).unwrap();
        let (src, dst) = (t.path().join("src"), d.path().join("dst"));
        fs::create_dir(&src).unwrap();
        fs::write(src.join("f"), data(size)).unwrap();
        let (stats, grew) = copy_growing(&src, &dst, u32::MAX, bw);
        assert_eq!(grew, 2, "{what}: one copy, then one more, then give up");
        assert_eq!(stats.errors.load(Ordering::Relaxed), 1, "{what}");
        assert_eq!(stats.files_copied.load(Ordering::Relaxed), 0, "{what}");
        assert!(!dst.join("f").exists(), "{what}: a torn copy was committed");
        // Nothing else left behind either.
        assert_eq!(fs::read_dir(&dst).unwrap().count(), 0, "{what}");
    }
}

#[test]
fn bytes_are_counted_as_they_move() {
    for (what, size, bw, dst_base) in cases() {
        let t = tempfile::tempdir().unwrap();
        let d = tempfile::tempdir_in(&dst_base).unwrap();
        let (src, dst) = (t.path().join("src"), d.path().join("dst"));
        fs::create_dir(&src).unwrap();
        fs::write(src.join("f"), data(size)).unwrap();
        let stats = Arc::new(Stats::default());
        let s = Growing {
            inner: LocalStore::new(&src, 1),
            root: src.clone(),
            grows: Arc::new(AtomicU32::new(0)),
            watch: Some(stats.clone()),
            shrink: Vec::new(),
            roots: AtomicU32::new(0),
        };
        let dl = LocalStore::new(&dst, 1);
        let o = opts(bw);
        Engine::new(&s, &dl, &o, &stats, &Quiet).run_tree().unwrap();
        let moved = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(moved(&stats.bytes_copied), size as u64, "{what}");
        // Every path counts its bytes once (the readers above check they are
        // counted before the file ends where the bytes pass through reads).
        assert_eq!(moved(&stats.bytes_moved), size as u64, "{what}");
    }
}

/// `--max-delete`: the counting pass allows what it saw; when the source
/// shrinks before the run itself, the run still removes no more than that.
#[test]
fn max_delete_is_never_exceeded_when_the_source_shrinks_meanwhile() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(dst.join("xd")).unwrap();
    for i in 0..10 {
        fs::write(src.join(format!("f{i}")), b"f").unwrap();
        fs::copy(src.join(format!("f{i}")), dst.join(format!("f{i}"))).unwrap();
    }
    // Three to delete when counted: x0 and the directory xd with x1.
    fs::write(dst.join("x0"), b"x").unwrap();
    fs::write(dst.join("xd/x1"), b"x").unwrap();
    let s = Growing {
        inner: LocalStore::new(&src, 1),
        root: src.clone(),
        grows: Arc::new(AtomicU32::new(0)),
        watch: None,
        shrink: (0..5).map(|i| src.join(format!("f{i}"))).collect(),
        roots: AtomicU32::new(0),
    };
    let d = LocalStore::new(&dst, 1);
    let stats = Stats::default();
    let o = Options {
        mode: Mode::Sync,
        max_delete: Some(ferry_engine::MaxDelete::Count(3)),
        ..opts(None)
    };
    Engine::new(&s, &d, &o, &stats, &Quiet).run_tree().unwrap();
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(n(&stats.files_deleted), 3);
    // f0..f2 removed (name order), then f3, f4, x0 and xd each reported.
    assert_eq!(n(&stats.errors), 4, "each entry not removed is reported");
    // 10 files + x0 + xd + x1 = 13 entries, 3 removed.
    let left = walkdir(&dst);
    assert_eq!(left.len(), 10, "{left:?}");
}

fn walkdir(p: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(p).unwrap() {
        let e = e.unwrap().path();
        if e.is_dir() {
            out.extend(walkdir(&e));
        }
        out.push(e);
    }
    out
}
