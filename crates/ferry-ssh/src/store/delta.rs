//! Delta transfers over the connection (`ferry_engine::delta`): the
//! remote end signs its old copy (a push), rebuilds a file from its old
//! copy and the ops sent to it (a push), and computes the ops of a file it
//! has against a signature sent to it (a pull). The client only passes
//! signatures and ops along.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::io;

use std::sync::mpsc::Receiver;
use std::sync::Arc;

use ferry_engine::delta::{self, DiffSummary, InPlace, Layout, Op, OpSink, PatchHashes, Signature};
use ferry_engine::entry::Meta;
use ferry_engine::store::SourceFile;

use super::{SshDir, SshReader, SshStore, SshWriter};
use crate::conn::{unexpected, Conn};
use crate::proto::{Req, Resp, CHUNK, M};

/// Batches of ops requested ahead of the one being applied.
const AHEAD: usize = 2;

impl SshStore {
    /// [`Store::delta_signature`](ferry_engine::store::Store::delta_signature).
    pub(super) fn sign(
        &self,
        dir: &SshDir,
        name: &CStr,
        min: u64,
    ) -> io::Result<Option<Signature>> {
        let body = self.conn().call(&Req::Sign {
            dir: dir.id,
            name: name.to_bytes(),
            min,
        })?;
        match body.get()? {
            Resp::Signature(Some(b)) => Signature::decode(b).map(Some),
            Resp::Signature(None) => Ok(None),
            r => Err(unexpected(&r)),
        }
    }

    /// [`Store::delta_write`](ferry_engine::store::Store::delta_write): the
    /// ops go to the remote end, which rebuilds the file; a rebuilt file
    /// whose hash is not the source's fails its commit.
    pub(super) fn patch(
        &self,
        dir: &SshDir,
        w: &mut SshWriter,
        old: &CStr,
        sig: &Signature,
        feed: &mut dyn FnMut(&mut dyn OpSink) -> io::Result<DiffSummary>,
    ) -> io::Result<DiffSummary> {
        if w.whole.is_some() {
            // A file small enough to travel with its commit.
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        if let Some((name, meta)) = w.later.take() {
            // A big file is rebuilt in a temporary there, not pushed in
            // ranges: created now.
            self.conn().send(&Req::Create {
                dir: dir.id,
                name: name.to_bytes(),
                meta: M(meta),
                file: w.file,
            })?;
        }
        self.conn().send(&Req::PatchFrom {
            dir: dir.id,
            file: w.file,
            old: old.to_bytes(),
            block: sig.block,
            size: sig.size,
        })?;
        let mut out = Frames {
            conn: &self.conn(),
            file: w.file,
            buf: Vec::new(),
            block: u64::from(sig.block),
            covered: 0,
        };
        let sum = feed(&mut out)?;
        out.flush()?;
        Ok(sum)
    }

    /// [`Store::delta_diff`](ferry_engine::store::Store::delta_diff): a big
    /// remote file not read yet has its ops computed where it is; anything
    /// else is read here.
    pub(super) fn diff(
        &self,
        r: &mut dyn SourceFile,
        sig: &Signature,
        sink: &mut dyn OpSink,
    ) -> io::Result<DiffSummary> {
        let remote = r
            .as_any()
            .and_then(|a| a.downcast_ref::<SshReader>())
            .and_then(|s| match s.file {
                Some(f) if s.next == 0 && s.span.0 == s.span.1 => Some((s.conn.clone(), f)),
                _ => None,
            });
        let Some((conn, file)) = remote else {
            return delta::diff(r, sig, sink);
        };
        conn.send(&Req::Diff {
            file,
            sig: &sig.encode(),
        })?;
        remote_ops(&conn, file, sink)
    }
}

impl SshStore {
    /// [`Store::delta_inplace`](ferry_engine::store::Store::delta_inplace):
    /// the remote end hashes its old copy's blocks while this end hashes
    /// the source (the request goes without waiting).
    pub(super) fn inplace<'a>(
        &'a self,
        dir: &'a SshDir,
        name: &CStr,
        old: &Meta,
        l: &Layout,
        key: &[u8; 32],
    ) -> io::Result<Option<Box<dyn InPlace + 'a>>> {
        let conn = self.conn();
        let file = conn.handle();
        let rx = conn.start(&Req::PatchHash {
            dir: dir.id,
            name: name.to_bytes(),
            old: M(*old),
            size: l.new,
            block: l.block,
            key: *key,
            file,
        })?;
        Ok(Some(Box::new(SshPatch {
            conn,
            file,
            rx: Some(rx),
            open: true,
        })))
    }

    /// [`Store::inplace_hashes`](ferry_engine::store::Store::inplace_hashes):
    /// a big remote file is hashed where it is; anything else here.
    pub(super) fn block_hashes(
        &self,
        r: &mut dyn SourceFile,
        l: &Layout,
        key: &[u8; 32],
    ) -> io::Result<PatchHashes> {
        let Some((conn, file)) = remote_file(r) else {
            return delta::inplace::source_patch_hashes(r, l, key);
        };
        let body = conn.call(&Req::PatchHashes {
            file,
            old: l.old,
            size: l.new,
            block: l.block,
            key: *key,
        })?;
        match body.get()? {
            Resp::BlockHashes { list, root } => Ok(PatchHashes {
                list: delta::inplace::decode_list(list)?,
                root,
            }),
            r => Err(unexpected(&r)),
        }
    }

    /// [`Store::read_at`](ferry_engine::store::Store::read_at): a big
    /// remote file read with reads at offsets, a few in flight; anything
    /// else here.
    pub(super) fn read_at_(
        &self,
        r: &mut dyn SourceFile,
        at: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let Some((conn, file)) = remote_file(r) else {
            return delta::inplace::source_read_at(r, at, buf);
        };
        let mut ahead = VecDeque::new();
        for (k, c) in buf.chunks(CHUNK).enumerate() {
            let rx = conn.start(&Req::Read {
                file,
                offset: at + (k * CHUNK) as u64,
                len: c.len() as u32,
            })?;
            ahead.push_back(rx);
        }
        let mut got = 0;
        for (k, rx) in ahead.into_iter().enumerate() {
            let body = conn.wait(&rx)?;
            let (data, zeros) = match body.get()? {
                Resp::Data { data, zeros, .. } => (data, zeros),
                r => return Err(unexpected(&r)),
            };
            let start = k * CHUNK;
            let end = (start + CHUNK).min(buf.len());
            let n = super::expand(data, &zeros, &mut buf[start..end]);
            if got == start {
                got += n;
            }
        }
        Ok(got)
    }
}

/// The connection and handle of a big remote file not read yet through
/// its stream (`r` an [`SshReader`]).
fn remote_file(r: &dyn SourceFile) -> Option<(Arc<Conn>, u64)> {
    r.as_any()
        .and_then(|a| a.downcast_ref::<SshReader>())
        .and_then(|s| match s.file {
            Some(f) if s.next == 0 && s.span.0 == s.span.1 && s.ahead.is_empty() => {
                Some((s.conn.clone(), f))
            }
            _ => None,
        })
}

/// `req`, whose reply is [`Resp::Ok`] or the error.
fn call_ok(conn: &Conn, req: &Req<'_>) -> io::Result<()> {
    match conn.call(req)?.get()? {
        Resp::Ok => Ok(()),
        r => Err(unexpected(&r)),
    }
}

/// A patch in place at the remote end.
struct SshPatch {
    conn: Arc<Conn>,
    file: u64,
    /// The reply of [`Req::PatchHash`], until awaited.
    rx: Option<Receiver<io::Result<Vec<u8>>>>,
    /// The remote end may hold the patch (abort it when dropped).
    open: bool,
}

impl InPlace for SshPatch {
    fn blocks(&mut self) -> io::Result<Option<Vec<u64>>> {
        let rx = self
            .rx
            .take()
            .ok_or_else(|| io::Error::other("patch in place: hashes asked twice"))?;
        let body = self.conn.wait(&rx)?;
        match body.get()? {
            Resp::Blocks(Some(b)) => delta::inplace::decode_list(b).map(Some),
            Resp::Blocks(None) => {
                self.open = false;
                Ok(None)
            }
            r => Err(unexpected(&r)),
        }
    }

    fn begin(&mut self, changed: &[u32], new: &[u64]) -> io::Result<bool> {
        self.conn.send(&Req::PatchBegin {
            file: self.file,
            changed: changed.to_vec(),
            hashes: new.iter().map(|&h| h as u32).collect(),
        })?;
        Ok(true)
    }

    fn write(&mut self, at: u64, data: &[u8]) -> io::Result<()> {
        for (k, c) in data.chunks(CHUNK).enumerate() {
            self.conn.send(&Req::PatchWrite {
                file: self.file,
                at: at + (k * CHUNK) as u64,
                data: c,
            })?;
        }
        Ok(())
    }

    fn commit(mut self: Box<Self>, root: &[u8; 32], meta: &Meta, fsync: bool) -> io::Result<()> {
        self.open = false;
        call_ok(
            &self.conn,
            &Req::PatchCommit {
                file: self.file,
                root: *root,
                meta: M(*meta),
                fsync,
            },
        )
    }

    fn abort(self: Box<Self>) {}
}

impl Drop for SshPatch {
    fn drop(&mut self) {
        if self.open {
            let _ = self.conn.send(&Req::PatchAbort { file: self.file });
        }
    }
}

/// Fetch the remote diff of `file` batch by batch, [`AHEAD`] in flight,
/// each op handed to `sink`.
fn remote_ops(conn: &Conn, file: u64, sink: &mut dyn OpSink) -> io::Result<DiffSummary> {
    let mut ahead = VecDeque::new();
    let mut seq = 0u64;
    loop {
        while ahead.len() < AHEAD {
            ahead.push_back(conn.start(&Req::DiffRead { file, seq })?);
            seq += 1;
        }
        let rx = ahead.pop_front().expect("a read in flight");
        let body = conn.wait(&rx)?;
        match body.get()? {
            Resp::Ops { ops, end, current } => {
                delta::decode_ops(ops, &mut |op| sink.op(op))?;
                if end {
                    // Reads past the end fail on the server; their replies
                    // are dropped unread.
                    return Ok(DiffSummary {
                        current,
                        ..DiffSummary::default()
                    });
                }
            }
            r => return Err(unexpected(&r)),
        }
    }
}

/// Ops sent as [`Req::Patch`] frames of about a chunk, or sooner once
/// they make [`delta::FLUSH_SPAN`] bytes of the file: the rebuild there
/// runs beside the search here, not after it.
struct Frames<'a> {
    conn: &'a Conn,
    file: u64,
    buf: Vec<u8>,
    /// The signature's block size.
    block: u64,
    /// Bytes of the file the ops in `buf` make.
    covered: u64,
}

impl Frames<'_> {
    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.conn.send(&Req::Patch {
                file: self.file,
                ops: &self.buf,
            })?;
            self.buf.clear();
        }
        self.covered = 0;
        Ok(())
    }
}

impl OpSink for Frames<'_> {
    fn op(&mut self, op: Op<'_>) -> io::Result<()> {
        op.encode(&mut self.buf);
        self.covered += delta::span(&op, self.block);
        if self.buf.len() >= CHUNK || self.covered >= delta::FLUSH_SPAN {
            self.flush()?;
        }
        Ok(())
    }
}
