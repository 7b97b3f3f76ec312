//! bisync counts the bytes of a copy as they move (`Stats::bytes_moved`,
//! what the progress display shows), within a file, as copy and sync do;
//! and a directory that cannot be listed is an error of the run.
//!
//! Side A is a local tree seen through [`Probe`], a store whose readers note
//! the run's `bytes_moved` each time they are asked for more bytes: while a
//! big file is copied, the count must already hold the bytes read before.

use parking_lot::Mutex;
use std::ffi::CStr;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_bisync::{BiAction, BiReporter, Journal, Options, Side};
use ferry_engine::bwlimit::Limiter;
use ferry_engine::store::{
    remove_dir_whole, unsupported, Absent, Cleanup, Features, LinkStore, Planned, Report, StoreExt,
};
use ferry_engine::store::{ListError, MetaChange, SourceFile};
use ferry_engine::{Listing, Meta, Stats, Store};
use ferry_local::LocalStore;

/// A local store whose readers hand over bytes only through `read` (no
/// descriptor: no `copy_file_range`) and note `bytes_moved` before each
/// read; `unlistable` names a directory whose listing fails.
struct Probe {
    inner: LocalStore,
    stats: Arc<Stats>,
    seen: Arc<Mutex<Vec<u64>>>,
    unlistable: Option<Vec<u8>>,
}

struct ProbeReader {
    inner: <LocalStore as Store>::Reader,
    stats: Arc<Stats>,
    seen: Arc<Mutex<Vec<u64>>>,
}

impl SourceFile for ProbeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let moved = self.stats.bytes_moved.load(Ordering::Relaxed);
        self.seen.lock().push(moved);
        self.inner.read(buf)
    }
    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

type D = <LocalStore as Store>::Dir;

impl Store for Probe {
    type Dir = D;
    type Reader = ProbeReader;
    type Writer = <LocalStore as Store>::Writer;
    type Delta = Absent;
    type Xattrs = Absent;
    type Keep = Absent;
    type Posix = Absent;
    type Hashes = Absent;
    type Links = Probe;
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
    fn links(&self) -> Option<&Probe> {
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
        _dir: &D,
        _list: &mut Listing,
        _which: &[usize],
        _errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        Ok(())
    }
    fn expect(&self, _w: &mut <LocalStore as Store>::Writer, _at: Option<&Planned>) {}
    fn remove_planned(&self, dir: &D, name: &CStr, _at: &Planned) -> io::Result<u64> {
        self.remove(dir, name, false)
    }
    fn remove_each(
        &self,
        dir: &D,
        name: &CStr,
        each: &mut dyn FnMut(&[u8], u64),
    ) -> io::Result<u64> {
        remove_dir_whole(self, dir, name, each)
    }
    fn rename(&self, _: &D, _: &CStr, _: &D, _: &CStr) -> io::Result<()> {
        Err(unsupported())
    }
    fn free_space(&self, _dir: &D) -> Option<(u64, u64)> {
        None
    }

    fn open_root(&self) -> io::Result<Option<(D, Meta)>> {
        self.inner.open_root()
    }
    fn create_root(&self) -> io::Result<D> {
        self.inner.create_root()
    }
    fn list(
        &self,
        dir: &D,
        rel: &[u8],
        out: &mut Listing,
        errors: &mut Vec<ListError>,
    ) -> io::Result<()> {
        if self.unlistable.as_deref() == Some(rel) {
            return Err(io::Error::other("cannot list"));
        }
        self.inner.list(dir, rel, out, errors)
    }
    fn stat(&self, dir: &D, name: &CStr) -> io::Result<Option<Meta>> {
        self.inner.stat(dir, name)
    }
    fn open_dir(&self, parent: &D, name: &CStr) -> io::Result<D> {
        self.inner.open_dir(parent, name)
    }
    fn make_dir(&self, parent: &D, name: &CStr) -> io::Result<D> {
        self.inner.make_dir(parent, name)
    }
    fn set_dir_meta(&self, dir: &D, meta: &Meta, what: MetaChange) -> io::Result<()> {
        self.inner.set_dir_meta(dir, meta, what)
    }
    fn open_file(&self, dir: &D, name: &CStr) -> io::Result<ProbeReader> {
        Ok(ProbeReader {
            inner: self.inner.open_file(dir, name)?,
            stats: self.stats.clone(),
            seen: self.seen.clone(),
        })
    }
    fn create_file(&self, dir: &D, name: &CStr, meta: &Meta) -> io::Result<Self::Writer> {
        self.inner.create_file(dir, name, meta)
    }
    fn write_from(
        &self,
        dir: &D,
        w: &mut Self::Writer,
        src: &mut dyn SourceFile,
        size: u64,
        limit: Option<&Limiter>,
    ) -> io::Result<u64> {
        self.inner.write_from(dir, w, src, size, limit)
    }
    fn commit(
        &self,
        dir: &D,
        w: Self::Writer,
        name: &CStr,
        meta: &Meta,
        fsync: bool,
    ) -> io::Result<()> {
        self.inner.commit(dir, w, name, meta, fsync)
    }
    fn abort(&self, dir: &D, w: Self::Writer) {
        self.inner.abort(dir, w)
    }
    fn set_meta(&self, dir: &D, name: &CStr, meta: &Meta, what: MetaChange) -> io::Result<()> {
        self.inner.set_meta(dir, name, meta, what)
    }
    fn remove(&self, dir: &D, name: &CStr, is_dir: bool) -> io::Result<u64> {
        self.inner.remove(dir, name, is_dir)
    }
    fn rmdir(&self, dir: &D, name: &CStr) -> io::Result<()> {
        self.inner.rmdir(dir, name)
    }
}

impl LinkStore<Probe> for Probe {
    fn read_link(&self, dir: &D, name: &CStr) -> io::Result<Vec<u8>> {
        StoreExt::read_link(&self.inner, dir, name)
    }
    fn create_symlink(&self, dir: &D, name: &CStr, target: &[u8], meta: &Meta) -> io::Result<()> {
        StoreExt::create_symlink(&self.inner, dir, name, target, meta)
    }
    fn sets_symlink_times(&self, _dir: &D, _name: &CStr, _now: &Meta) -> bool {
        true
    }
}

/// Counts errors; everything else is ignored.
#[derive(Default)]
struct Errors(AtomicU64);

impl BiReporter for Errors {
    fn action(&self, _: BiAction, _: Side, _: &[u8], _: Option<&[u8]>, _: u64) {}
    fn error(&self, _: &[u8], _: &io::Error) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn skip(&self, _: Side, _: &[u8], _: &str) {}
    fn note(&self, _: &str) {}
}

const BIG: usize = 16 << 20;

/// One bisync of `a` (through a [`Probe`]) and the empty `b`: what the
/// probe saw before each read, the run's stats and errors reported.
fn bisync_once(t: &tempfile::TempDir, unlistable: Option<&[u8]>) -> (Vec<u64>, Arc<Stats>, u64) {
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(&b).unwrap();
    let stats = Arc::new(Stats::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sa = Probe {
        inner: LocalStore::new(&a, 2),
        stats: stats.clone(),
        seen: seen.clone(),
        unlistable: unlistable.map(<[u8]>::to_vec),
    };
    let sb = LocalStore::new(&b, 2);
    let mut j = Journal::open(&t.path().join("j.db"), ("a", "b")).unwrap();
    let rep = Errors::default();
    let opts = Options {
        jobs: 2,
        max_delete: 50,
        ..Options::default()
    };
    let out = ferry_bisync::run(&sa, &sb, Some(&mut j), &opts, &rep, &stats)
        .unwrap_or_else(|r| panic!("refused: {}", r.0));
    assert_eq!(out.errors, rep.0.load(Ordering::Relaxed), "{out:?}");
    let seen = seen.lock().clone();
    (seen, stats, out.errors)
}

#[test]
fn bytes_are_counted_as_they_move_within_a_file() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a");
    std::fs::create_dir_all(&a).unwrap();
    let data: Vec<u8> = (0..BIG).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(a.join("big.bin"), &data).unwrap();
    let (seen, stats, errors) = bisync_once(&t, None);
    assert_eq!(errors, 0);
    assert_eq!(std::fs::read(t.path().join("b/big.bin")).unwrap(), data);
    // Read in several pieces; before a later piece, the earlier ones are
    // already counted, though the file is not done.
    assert!(seen.len() > 2, "{seen:?}");
    assert!(
        seen.iter().any(|&m| m > 0 && m < BIG as u64),
        "bytes_moved stayed at 0 until the file ended: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    // Each byte counted once when the copy is over.
    assert_eq!(stats.bytes_moved.load(Ordering::Relaxed), BIG as u64);
    assert_eq!(stats.bytes_copied.load(Ordering::Relaxed), BIG as u64);
}

#[test]
fn a_directory_that_cannot_be_listed_is_an_error_of_the_run() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("a");
    std::fs::create_dir_all(a.join("sub")).unwrap();
    std::fs::write(a.join("sub/f"), b"x").unwrap();
    std::fs::write(a.join("g"), b"y").unwrap();
    let (_, stats, errors) = bisync_once(&t, Some(b"sub"));
    assert_eq!(errors, 1, "the listing error counts");
    assert_eq!(stats.errors.load(Ordering::Relaxed), 1);
    // The rest is done; what could not be listed is left alone.
    assert_eq!(std::fs::read(t.path().join("b/g")).unwrap(), b"y");
    assert!(!t.path().join("b/sub/f").exists());
}
