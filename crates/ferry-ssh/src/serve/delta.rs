//! The server's part of delta transfers: the signature of a file here
//! (a push: the client sends ops against it), the rebuild of a file from
//! its old copy here and the client's ops (on the disk thread, in order
//! with the file's creation and commit), and the ops of a file here
//! against the client's signature (a pull), computed by a thread of their
//! own ahead of the client's [`Req::DiffRead`]s.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;

use ferry_engine::delta::{self, Op, OpSink, Patcher, Signature};
use ferry_engine::entry::Meta;
use ferry_engine::store::{SourceFile, Store, StoreExt};
use ferry_local::delta::SeqOut;
use ferry_local::inplace::LocalPatch;
use ferry_local::local::LocalReader;
use rustix::fs::{self as rfs, Mode, OFlags};

use super::{bad_handle, cname, dir_of, on_writer, pread_full, State, Writing};
use crate::proto::{self, Resp, CHUNK};

/// Batches of ops computed ahead of the client's reads.
const AHEAD: usize = 4;

/// One batch of a diff's ops.
struct Batch {
    ops: Vec<u8>,
    end: bool,
    current: Option<(u64, i64, u32)>,
}

/// A diff under way: its batches, handed out in the order of the reads'
/// sequence numbers (the reads run on any worker).
pub(super) struct DiffJob {
    turn: Mutex<(u64, Receiver<io::Result<Batch>>)>,
    cv: Condvar,
}

/// A patch in place under way: open, or failed (the error goes back on
/// its commit).
enum Patching {
    Open(Box<LocalPatch>),
    Failed(io::Error),
}

/// The rebuilds, diffs and patches in place under way, by file
/// handle.
#[derive(Default)]
pub(super) struct Deltas {
    patches: Mutex<HashMap<u64, (Patcher, SeqOut)>>,
    diffs: Mutex<HashMap<u64, Arc<DiffJob>>>,
    inplace: Mutex<HashMap<u64, Patching>>,
}

impl Deltas {
    /// Forget what runs for handle `file` (closed, aborted).
    pub(super) fn drop_handle(&self, file: u64) {
        self.patches.lock().remove(&file);
        self.diffs.lock().remove(&file);
    }

    /// The rebuild of `file` was not finished by its commit: the commit
    /// fails (`true`).
    pub(super) fn unfinished(&self, file: u64) -> bool {
        self.patches.lock().remove(&file).is_some()
    }
}

/// [`Req::Sign`](crate::proto::Req::Sign): the encoded signature.
pub(super) fn sign(st: &State, id: u64, dir: u64, name: &[u8], min: u64) -> io::Result<Vec<u8>> {
    let sig = st
        .store
        .delta_signature(&*dir_of(st, dir)?, &cname(name)?, min)?;
    let enc = sig.map(|s| s.encode());
    Ok(proto::frame(id, &Resp::Signature(enc.as_deref())))
}

/// [`Req::PatchFrom`](crate::proto::Req::PatchFrom): the rebuild of
/// `file` begins (a failure is kept for its commit).
pub(super) fn patch_from(st: &State, dir: u64, file: u64, old: &[u8], block: u32, size: u64) {
    let p = dir_of(st, dir).and_then(|d| {
        let fd = rfs::openat(
            d.fd(),
            &*cname(old)?,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Patcher::new(File::from(fd), block, size).map(Patcher::unhashed)
    });
    let out = match st.writers.lock().get(&file) {
        Some(Writing::Open(_, w)) => SeqOut::hashed(w.fd()),
        _ => return,
    };
    let p = out.and_then(|out| Ok((p?, out)));
    match p {
        Ok(p) => {
            st.deltas.patches.lock().insert(file, p);
        }
        Err(e) => on_writer(st, file, |_| Err(e)),
    }
}

/// [`Req::Patch`](crate::proto::Req::Patch): ops of `file`'s rebuild
/// applied; the rebuild is over once the end op matched.
pub(super) fn patch(st: &State, file: u64, ops: &[u8]) {
    let mut ps = st.deltas.patches.lock();
    let Some((p, out)) = ps.get_mut(&file) else {
        // The rebuild failed already (its writer keeps the error).
        return;
    };
    let mut ended = false;
    on_writer(st, file, |_| {
        delta::decode_ops(ops, &mut |op| {
            if let Op::End { .. } = op {
                // The writer's thread hashed every byte it wrote.
                ended = true;
                let got = out.finish_hash()?;
                p.apply(op, &mut |_| Ok(()))?;
                return p.check(got).map(drop);
            }
            p.apply(op, &mut |b| out.write(b))
        })
    });
    let failed = !matches!(st.writers.lock().get(&file), Some(Writing::Open(..)));
    if ended || failed {
        ps.remove(&file);
    }
}

/// [`Req::Diff`](crate::proto::Req::Diff): the ops of open file `file`
/// against `sig`, computed by a thread of their own into batches.
pub(super) fn start_diff(st: &State, file: u64, sig: &[u8]) {
    let (tx, rx) = mpsc::sync_channel(AHEAD);
    let job = Arc::new(DiffJob {
        turn: Mutex::new((0, rx)),
        cv: Condvar::new(),
    });
    st.deltas.diffs.lock().insert(file, job);
    let reader = st.readers.lock().get(&file).map(|(r, _)| r.clone());
    let sig = Signature::decode(sig);
    std::thread::spawn(move || {
        let res = (|| {
            let r = reader.ok_or_else(|| bad_handle(file))?;
            let sig = sig?;
            let mut out = Batches {
                tx: &tx,
                buf: Vec::new(),
                block: u64::from(sig.block),
                covered: 0,
            };
            delta::diff(&mut At { r: &r, at: 0 }, &sig, &mut out)?;
            let ops = std::mem::take(&mut out.buf);
            send(
                &tx,
                Batch {
                    ops,
                    end: true,
                    current: r.current(),
                },
            )
        })();
        if let Err(e) = res {
            let _ = tx.send(Err(e));
        }
    });
}

/// [`Req::DiffRead`](crate::proto::Req::DiffRead): batch `seq` of
/// `file`'s ops, once the batches before it went out.
pub(super) fn diff_read(st: &State, id: u64, file: u64, seq: u64) -> io::Result<Vec<u8>> {
    let job = st
        .deltas
        .diffs
        .lock()
        .get(&file)
        .cloned()
        .ok_or_else(|| bad_handle(file))?;
    let mut turn = job.turn.lock();
    while turn.0 != seq {
        job.cv.wait(&mut turn);
    }
    let got = turn.1.recv();
    turn.0 += 1;
    drop(turn);
    job.cv.notify_all();
    let b = match got {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            st.deltas.diffs.lock().remove(&file);
            return Err(e);
        }
        Err(_) => return Err(io::Error::other("delta: no more ops")),
    };
    if b.end {
        st.deltas.diffs.lock().remove(&file);
    }
    Ok(proto::frame_sized(
        id,
        &Resp::Ops {
            ops: &b.ops,
            end: b.end,
            current: b.current,
        },
        b.ops.len(),
    ))
}

fn send(tx: &SyncSender<io::Result<Batch>>, b: Batch) -> io::Result<()> {
    tx.send(Ok(b))
        .map_err(|_| io::Error::other("delta: the client stopped reading"))
}

/// Ops encoded into batches of about a chunk, or fewer once they make
/// [`delta::FLUSH_SPAN`] bytes of the file (the client rebuilds while
/// this end searches).
struct Batches<'a> {
    tx: &'a SyncSender<io::Result<Batch>>,
    buf: Vec<u8>,
    /// The signature's block size.
    block: u64,
    /// Bytes of the file the ops in `buf` make.
    covered: u64,
}

impl OpSink for Batches<'_> {
    fn op(&mut self, op: Op<'_>) -> io::Result<()> {
        op.encode(&mut self.buf);
        self.covered += delta::span(&op, self.block);
        if self.buf.len() >= CHUNK || self.covered >= delta::FLUSH_SPAN {
            self.covered = 0;
            let ops = std::mem::take(&mut self.buf);
            send(
                self.tx,
                Batch {
                    ops,
                    end: false,
                    current: None,
                },
            )?;
        }
        Ok(())
    }
}

/// An open file read in order from `at`, by `pread`.
struct At<'a> {
    r: &'a LocalReader,
    at: u64,
}

impl SourceFile for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = pread_full(self.r, self.at, buf)?;
        self.at += n as u64;
        Ok(n)
    }
    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// [`Req::PatchHash`](crate::proto::Req::PatchHash): the old file's head
/// block hashes, the patch kept as handle `file` (`None`: not patched in
/// place).
pub(super) fn inplace_hash(
    st: &State,
    id: u64,
    (dir, name, old): (u64, &[u8], &Meta),
    size: u64,
    block: u64,
    key: &[u8; 32],
    file: u64,
) -> Vec<u8> {
    let got = (|| -> io::Result<Option<Vec<u8>>> {
        let l = layout(old.size, size, block)?;
        let d = dir_of(st, dir)?;
        let owner = st.store.features().preserves_owner;
        let Some(mut p) = LocalPatch::start(d.fd(), &cname(name)?, old, owner, &l, key)? else {
            return Ok(None);
        };
        let list = p.blocks_here()?;
        st.deltas
            .inplace
            .lock()
            .insert(file, Patching::Open(Box::new(p)));
        Ok(Some(delta::inplace::encode_list(&list)))
    })();
    let list = got.ok().flatten();
    proto::frame(id, &Resp::Blocks(list.as_deref()))
}

/// The layout a client asked for, checked.
fn layout(old: u64, new: u64, block: u64) -> io::Result<delta::Layout> {
    if !block.is_power_of_two() || block < delta::inplace::MIN_PATCH_BLOCK || old > new {
        return Err(io::Error::other("patch in place: bad layout"));
    }
    Ok(delta::Layout { block, old, new })
}

/// Do `f` to patch `file`; a failure is kept for its commit (and what was
/// written rolled back).
fn on_inplace(st: &State, file: u64, f: impl FnOnce(&mut LocalPatch) -> io::Result<()>) {
    let mut ps = st.deltas.inplace.lock();
    let Some(Patching::Open(p)) = ps.get_mut(&file) else {
        return;
    };
    if let Err(e) = f(p) {
        ps.insert(file, Patching::Failed(e));
    }
}

/// [`Req::PatchBegin`](crate::proto::Req::PatchBegin).
pub(super) fn inplace_begin(st: &State, file: u64, changed: &[u32], hashes: &[u32]) {
    let new: Vec<u64> = hashes.iter().map(|&h| u64::from(h)).collect();
    on_inplace(st, file, |p| match p.begin_here(changed, &new)? {
        true => Ok(()),
        false => Err(io::Error::other(
            "patch in place: another run patches the file",
        )),
    });
}

/// [`Req::PatchWrite`](crate::proto::Req::PatchWrite).
pub(super) fn inplace_write(st: &State, file: u64, at: u64, data: &[u8]) {
    on_inplace(st, file, |p| p.write_here(at, data));
}

/// [`Req::PatchCommit`](crate::proto::Req::PatchCommit): the reply.
pub(super) fn inplace_commit(
    st: &State,
    id: u64,
    file: u64,
    root: &[u8; 32],
    meta: &Meta,
    fsync: bool,
) -> Vec<u8> {
    let slot = st.deltas.inplace.lock().remove(&file);
    let r = match slot {
        Some(Patching::Open(mut p)) => p.commit_here(root, meta, fsync),
        Some(Patching::Failed(e)) => Err(e),
        None => Err(bad_handle(file)),
    };
    proto::frame(id, &proto::reply_of(r))
}

/// [`Req::PatchAbort`](crate::proto::Req::PatchAbort): rolled back
/// (dropped).
pub(super) fn inplace_abort(st: &State, file: u64) {
    let slot = st.deltas.inplace.lock().remove(&file);
    drop(slot);
}

/// [`Req::PatchHashes`](crate::proto::Req::PatchHashes).
pub(super) fn inplace_hashes(
    st: &State,
    id: u64,
    file: u64,
    old: u64,
    size: u64,
    block: u64,
    key: &[u8; 32],
) -> io::Result<Vec<u8>> {
    let l = layout(old, size, block)?;
    let r = reader(st, file)?;
    let fd = r.as_fd().ok_or_else(|| io::Error::other("no descriptor"))?;
    let h = delta::inplace::fd_patch_hashes(fd, &l, key)?;
    let list = delta::inplace::encode_list(&h.list);
    Ok(proto::frame_sized(
        id,
        &Resp::BlockHashes {
            list: &list,
            root: h.root,
        },
        list.len(),
    ))
}

/// The open file `file`.
fn reader(st: &State, file: u64) -> io::Result<Arc<LocalReader>> {
    st.readers
        .lock()
        .get(&file)
        .map(|(r, _)| r.clone())
        .ok_or_else(|| bad_handle(file))
}
