//! Delta transfers on a local tree (`ferry_engine::delta`): the signature
//! of a file's old copy, and a new copy rebuilt from it and the sender's
//! ops into a writer's temporary.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;

use ferry_engine::delta::{self, DiffSummary, OpSink, Patcher, Signature};
use ferry_engine::entry::Kind;
use ferry_engine::store::{SourceFile, Store};
use rustix::fs::{self as rfs, Mode, OFlags};

use crate::local::{write_all, LocalDir, LocalStore};

/// Threads hashing a signature's blocks at most.
const SIGN_THREADS: usize = 4;

/// The signature of `name` in `dir`, `None` unless it is a regular file of
/// at least `min` bytes. Read once, hashed on every core.
pub(crate) fn signature(
    store: &LocalStore,
    dir: &LocalDir,
    name: &CStr,
    min: u64,
) -> io::Result<Option<Signature>> {
    match store.stat(dir, name)? {
        Some(m) if m.kind == Kind::File && m.size >= min => {}
        _ => return Ok(None),
    }
    let mut r = store.open_file(dir, name)?;
    let Some((size, ..)) = r.current() else {
        return Ok(None);
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(SIGN_THREADS));
    let block = delta::block_size(size);
    delta::sign(&mut r, size, block, delta::new_key(), threads).map(Some)
}

/// Rebuild into `out` (a writer's descriptor, written from its start) the
/// content made of `old` in `dir` (which `sig` describes) and the ops that
/// `feed` hands over; the content's hash is checked at their end.
pub(crate) fn rebuild(
    dir: &LocalDir,
    out: BorrowedFd<'_>,
    old: &CStr,
    sig: &Signature,
    feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
) -> io::Result<DiffSummary> {
    let fd = rfs::openat(
        dir.fd(),
        old,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut p = Patcher::new(File::from(fd), sig.block, sig.size)?;
    let sum = feed(&mut p.sink(|b| write_all(out, b)))?;
    let n = p.finish()?;
    if n != sum.size {
        return Err(delta::mismatch());
    }
    Ok(sum)
}
