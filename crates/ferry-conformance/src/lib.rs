//! The conformance suite of ferry's backends: what every [`Store`] must do,
//! tested through the trait itself (not the CLI), one test per behaviour:
//! listing, stat, whole and ranged reads, write/commit/abort, metadata,
//! rename, remove and rmdir, odd names, a big file, and the errors (missing,
//! exists, not empty, permission denied). What a backend cannot store is
//! told by its capabilities ([`Features`](ferry_engine::store::Features): `dir_meta`,
//! `symlinks`, `empty_dirs`,
//! `preserves_owner`) and by its [`Fixture`]; the suite asserts the
//! rest.
//!
//! A backend enables the whole suite in its tests with a fixture that makes
//! a fresh, empty root for each test:
//!
//! ```ignore
//! struct Local { _tmp: tempfile::TempDir, store: LocalStore }
//! impl ferry_conformance::Fixture for Local {
//!     type Store = LocalStore;
//!     fn store(&self) -> &LocalStore { &self.store }
//! }
//! fn local() -> Result<Local, String> { /* a new temporary root */ }
//! ferry_conformance::suite!(local, local);
//! ```
//!
//! `suite!(NAME, MAKE)` writes a module `NAME` with one `#[test]` per case of
//! [`cases`]; `MAKE()` returns the fixture, or `Err(reason)` to skip (a
//! server that is not configured): the test then prints the reason and passes.

use std::ffi::{CStr, CString};
use std::io;

use ferry_engine::entry::{Kind, Listing, Meta};
use ferry_engine::keep::KeepBase;
use ferry_engine::store::{SourceFile, Store};

pub mod cases;
mod edge;
mod keep;
pub mod local;
mod tree;

/// A fresh, empty root of one backend, for one test. Dropping it removes
/// what the test left.
pub trait Fixture {
    /// The backend.
    type Store: Store;

    /// The store under test, rooted at a place of its own (which need not
    /// exist yet: the suite calls [`Store::create_root`]).
    fn store(&self) -> &Self::Store;

    /// True when a name may be any bytes but `/` and NUL; false when names
    /// must be UTF-8 (others are refused with `InvalidInput`).
    fn any_byte_names(&self) -> bool {
        true
    }

    /// True when permission bits are kept (and read back by `stat`).
    fn keeps_mode(&self) -> bool {
        true
    }

    /// The finest step of the mtimes kept, in nanoseconds (1: exact).
    fn mtime_step_ns(&self) -> u32 {
        1
    }

    /// True when mtimes before 1970 are kept (false for SFTP, whose times
    /// are unsigned 32-bit seconds).
    fn keeps_times_before_epoch(&self) -> bool {
        true
    }

    /// A second store over the same root that the backend refuses changes
    /// to (a read-only directory, credentials the server rejects), and a
    /// guard that lifts the refusal when dropped. `Err(reason)` when the
    /// backend cannot make one here.
    fn denied(&self) -> Result<Denied<Self::Store>, String> {
        Err("this fixture makes no store that is refused changes".into())
    }

    /// A place outside the fixture's root, empty, that its store can keep
    /// entries at ([`KeepStore::keep`](ferry_engine::store::KeepStore::keep) with a [`KeepBase::Abs`]), and a store
    /// rooted there. `Err(reason)` when the fixture cannot make one.
    fn outside(&self) -> Result<Outside<Self::Store>, String> {
        Err("this fixture makes no place outside its root".into())
    }
}

/// See [`Fixture::outside`].
pub struct Outside<S> {
    /// A base of the fixture's store outside its root
    /// ([`KeepBase::Abs`]: a sibling directory, another prefix).
    pub base: KeepBase,
    /// A store rooted there, to read back what was kept.
    pub store: S,
    /// Removes the place when dropped.
    pub guard: Box<dyn std::any::Any>,
}

/// See [`Fixture::denied`].
pub struct Denied<S> {
    /// A store over the fixture's root whose changes the backend refuses.
    pub store: S,
    /// Lifts the refusal when dropped.
    pub guard: Box<dyn std::any::Any>,
}

/// Write the whole suite as a module `$name` of tests, each making its
/// fixture with `$make()` (`Result<impl Fixture, String>`, `Err` = skip).
#[macro_export]
macro_rules! suite {
    ($name:ident, $make:expr) => {
        $crate::__cases!($name, $make;
            list_empty_root, list_sorted, list_nested, list_odd_bytes, list_empty_dir,
            list_many, stat_file, stat_dir, stat_symlink, stat_missing, read_whole,
            read_missing, ranged_read, write_new, commit_replaces, abort_leaves_nothing,
            temporaries_are_reserved, create_empty, meta_mtime, meta_mode, meta_dir,
            meta_owner, rename_file, rename_refuses_existing, rename_dir, remove_file,
            remove_tree, remove_each, remove_missing, rmdir, make_dir_exists, odd_names,
            long_name, big_file, permission_denied, keep_removed, keep_replaced,
            keep_makes_parents, keep_refuses_existing, keep_overwrites, keep_symlink, keep_outside,
            read_ahead
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    ($name:ident, $make:expr; $($case:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $case() {
                    match ($make)() {
                        Ok(fx) => $crate::cases::$case(&fx),
                        Err(why) => eprintln!(
                            "{}::{}: skipped: {}", stringify!($name), stringify!($case), why
                        ),
                    }
                }
            )*
        }
    };
}

/// `name` as a C string (no NUL inside, or the test is wrong).
pub fn c(name: &[u8]) -> CString {
    CString::new(name).expect("test names hold no NUL")
}

/// Metadata of a file of `size` bytes with mtime `(sec, nsec)` and `mode`,
/// owned by the current user.
pub fn file_meta(size: u64, mtime: (i64, u32), mode: u32) -> Meta {
    Meta {
        kind: Kind::File,
        size,
        mtime_sec: mtime.0,
        mtime_nsec: mtime.1,
        mode,
        uid: euid(),
        gid: egid(),
        ino: 0,
        version: 0,
        rdev: 0,
        sparse: false,
        nlink: 0,
        dev: 0,
        ctime: 0,
    }
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn egid() -> u32 {
    rustix::process::getegid().as_raw()
}

/// Bytes `len` long, the same for the same `seed`, different for another.
pub struct Pattern {
    len: u64,
    at: u64,
    seed: u64,
}

impl Pattern {
    /// `len` bytes of pattern `seed`.
    pub fn new(len: u64, seed: u64) -> Pattern {
        Pattern { len, at: 0, seed }
    }

    /// The byte at `offset` (SplitMix64 of its 8-byte word).
    pub fn byte(seed: u64, offset: u64) -> u8 {
        let mut z = (offset / 8)
            .wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_add(1);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        z.to_le_bytes()[(offset % 8) as usize]
    }

    /// Every byte of `len` bytes of pattern `seed`, in memory.
    pub fn bytes(len: u64, seed: u64) -> Vec<u8> {
        (0..len).map(|i| Pattern::byte(seed, i)).collect()
    }
}

impl SourceFile for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.len - self.at).min(buf.len() as u64) as usize;
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = Pattern::byte(self.seed, self.at + i as u64);
        }
        self.at += n as u64;
        Ok(n)
    }
    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// In-memory bytes as a source file.
pub struct Bytes<'a>(pub &'a [u8]);

impl SourceFile for Bytes<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.len().min(buf.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// Write `src` (`meta.size` bytes) as `name` in `dir`: create, write,
/// commit (aborted on a failure).
pub fn put_from<S: Store>(
    s: &S,
    dir: &S::Dir,
    name: &CStr,
    src: &mut dyn SourceFile,
    meta: &Meta,
) -> io::Result<()> {
    let mut w = s.create_file(dir, name, meta)?;
    match s.write_from(dir, &mut w, src, meta.size, None) {
        Ok(n) if n == meta.size => s.commit(dir, w, name, meta, false),
        Ok(n) => {
            s.abort(dir, w);
            Err(io::Error::other(format!(
                "wrote {n} of {} bytes",
                meta.size
            )))
        }
        Err(e) => {
            s.abort(dir, w);
            Err(e)
        }
    }
}

/// Write `data` as `name` in `dir` with mtime `T0` and mode 0644.
pub fn put<S: Store>(s: &S, dir: &S::Dir, name: &[u8], data: &[u8]) -> io::Result<()> {
    let meta = file_meta(data.len() as u64, T0, 0o644);
    put_from(s, dir, &c(name), &mut Bytes(data), &meta)
}

/// A fixed mtime with nanoseconds.
pub const T0: (i64, u32) = (1_600_000_000, 123_456_789);

/// Every byte of file `name` in `dir`, read through [`SourceFile::read`].
pub fn read_all<S: Store>(s: &S, dir: &S::Dir, name: &[u8]) -> io::Result<Vec<u8>> {
    let mut r = s.open_file(dir, &c(name))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        match r.read(&mut buf)? {
            0 => return Ok(out),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// The root, created (it may exist).
pub fn root<S: Store>(s: &S) -> S::Dir {
    s.create_root().expect("create_root");
    s.open_root()
        .expect("open_root")
        .expect("the root exists once created")
        .0
}

/// Names and metadata of `dir`'s entries, as listed; asserts the listing
/// reported no errors and is strictly sorted by name bytes.
#[track_caller]
pub fn list<S: Store>(s: &S, dir: &S::Dir, rel: &[u8]) -> Vec<(Vec<u8>, Meta)> {
    let mut out = Listing::new();
    let mut errors = Vec::new();
    s.list(dir, rel, &mut out, &mut errors).expect("list");
    assert!(errors.is_empty(), "list errors: {errors:?}");
    assert!(out.is_sorted(), "listing not sorted by name bytes");
    out.entries()
        .iter()
        .map(|e| (out.name(e).to_vec(), e.meta))
        .collect()
}

/// Just the names of [`list`].
#[track_caller]
pub fn names<S: Store>(s: &S, dir: &S::Dir) -> Vec<Vec<u8>> {
    list(s, dir, b"").into_iter().map(|(n, _)| n).collect()
}

/// Names shown readably in a failure.
pub fn show(names: &[Vec<u8>]) -> Vec<String> {
    names
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}
