//! The receiver's side of a delta: the new content rebuilt from the old
//! file and the ops, handed on in order, hashed as it goes and checked
//! against the sender's hash at the end.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::{Op, Signature};

/// Bytes of the old file read at once for a copy.
const READ: usize = 1 << 20;

/// Rebuilds one file.
pub struct Patcher {
    old: File,
    block: u64,
    old_size: u64,
    blocks: u64,
    hasher: blake3::Hasher,
    written: u64,
    buf: Vec<u8>,
    /// The end was reached: `Some(true)` when the content matched.
    done: Option<bool>,
    /// Whether this patcher hashes what it makes (else the caller does,
    /// and hands the hash to [`Patcher::check`]).
    hashing: bool,
    /// The sender's hash, waiting for [`Patcher::check`].
    want: Option<[u8; 32]>,
}

impl Patcher {
    /// A rebuild from `old`, the file a signature of `block`-byte blocks
    /// and `old_size` bytes was made of.
    pub fn new(old: File, block: u32, old_size: u64) -> io::Result<Patcher> {
        if block == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "delta: block size 0",
            ));
        }
        Ok(Patcher {
            old,
            block: u64::from(block),
            old_size,
            blocks: Signature::blocks_of(old_size, block),
            hasher: blake3::Hasher::new(),
            written: 0,
            buf: Vec::new(),
            done: None,
            hashing: true,
            want: None,
        })
    }

    /// This patcher, leaving the hashing of what it makes to the caller
    /// (the thread that writes it): the end op is checked by
    /// [`Patcher::check`] with the hash of every byte handed out, and
    /// [`Patcher::finish`] fails until it was.
    pub fn unhashed(mut self) -> Patcher {
        self.hashing = false;
        self
    }

    /// The end of an [`Patcher::unhashed`] rebuild: `got`, the blake3 hash
    /// of the bytes it handed out, must be the sender's.
    pub fn check(&mut self, got: [u8; 32]) -> io::Result<u64> {
        if let Some(want) = self.want.take() {
            self.done = Some(want == got);
        }
        self.finish()
    }

    /// Carry out `op`, handing the bytes it makes to `out` in order.
    pub fn apply(
        &mut self,
        op: Op<'_>,
        out: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.done.is_some() || self.want.is_some() {
            return Err(bad("ops after the end"));
        }
        match op {
            Op::Copy { first, count } => {
                let (first, count) = (u64::from(first), u64::from(count));
                if count == 0 || first + count > self.blocks {
                    return Err(bad("copy of blocks the old file does not have"));
                }
                let mut at = first * self.block;
                let end = ((first + count) * self.block).min(self.old_size);
                if self.buf.len() < READ {
                    self.buf.resize(READ, 0);
                }
                while at < end {
                    let n = ((end - at) as usize).min(READ);
                    let b = &mut self.buf[..n];
                    self.old.read_exact_at(b, at).map_err(|e| {
                        if e.kind() == io::ErrorKind::UnexpectedEof {
                            bad("the old file is shorter than its signature said")
                        } else {
                            e
                        }
                    })?;
                    if self.hashing {
                        self.hasher.update(b);
                    }
                    out(b)?;
                    self.written += n as u64;
                    at += n as u64;
                }
            }
            Op::Literal(data) => {
                if self.hashing {
                    self.hasher.update(data);
                }
                out(data)?;
                self.written += data.len() as u64;
            }
            Op::End { size, hash } if !self.hashing => {
                if size != self.written {
                    self.done = Some(false);
                    return Err(mismatch());
                }
                self.want = Some(hash);
            }
            Op::End { size, hash } => {
                let ok = size == self.written && *self.hasher.finalize().as_bytes() == hash;
                self.done = Some(ok);
                if !ok {
                    return Err(mismatch());
                }
            }
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// `Ok` once the end was reached and the content matched.
    pub fn finish(&self) -> io::Result<u64> {
        match self.done {
            Some(true) => Ok(self.written),
            Some(false) => Err(mismatch()),
            None => Err(bad("the ops stopped before their end")),
        }
    }
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("delta: {why}"))
}

/// The error of a rebuilt file whose hash is not the sender's.
pub fn mismatch() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "delta: the rebuilt file's hash is not the source's (the old copy changed or a block was misread)",
    )
}

/// A [`Patcher`] as the sink of a delta's ops, its bytes going to `out`.
pub struct PatchSink<'p, F> {
    patcher: &'p mut Patcher,
    out: F,
}

impl Patcher {
    /// This patcher as an [`OpSink`](super::OpSink) writing to `out`.
    pub fn sink<F: FnMut(&[u8]) -> io::Result<()>>(&mut self, out: F) -> PatchSink<'_, F> {
        PatchSink { patcher: self, out }
    }
}

impl<F: FnMut(&[u8]) -> io::Result<()>> super::OpSink for PatchSink<'_, F> {
    fn op(&mut self, op: Op<'_>) -> io::Result<()> {
        self.patcher.apply(op, &mut self.out)
    }
}
