//! Delta transfer: send only what changed in a file both sides have, as
//! rsync does.
//!
//! The receiver cuts its old copy into blocks (about √size, see
//! [`block_size`]) and sends a [`Signature`]: per block a rolling weak
//! checksum and a strong hash keyed with a key drawn at random for this
//! file (blake3 keyed, truncated), so nobody can make a block that
//! collides on purpose. The sender slides a window over its new content
//! ([`diff`]), looks each position's weak checksum up and confirms hits
//! with the strong hash, and emits [`Op`]s: copy these old blocks, or these
//! literal bytes, and at the end the new content's size and blake3 hash.
//! The receiver rebuilds the file from its old copy and the ops into a new
//! temporary ([`Patcher`]), hashing what it writes; a result whose hash is
//! not the sender's is an error, and the caller sends the file whole.
//!
//! Memory is bounded: the sender holds a window of a few MiB and the
//! signature, the receiver a buffer; neither holds a file.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

pub mod append;
mod diff;
pub mod inplace;
mod patch;
mod sign;
#[cfg(test)]
mod tests;

pub use append::APPEND_MIN;
pub use diff::diff;
pub use inplace::{InPlace, Layout, PatchHashes};
pub use patch::{mismatch, PatchSink, Patcher};
pub use sign::{read_full, sign, strong, weak, Rolling};

/// Smallest block (rsync's `BLOCK_SIZE`).
pub const MIN_BLOCK: u32 = 700;
/// Largest block (rsync's `MAX_BLOCK_SIZE`).
pub const MAX_BLOCK: u32 = 128 << 10;
/// Bytes of a block's strong hash kept in a signature, at least and at
/// most ([`strong_len`] picks within).
pub const MIN_STRONG: u8 = 4;
/// See [`MIN_STRONG`].
pub const MAX_STRONG: u8 = 8;
/// Files smaller than this (on either side) are sent whole: their delta
/// saves too little to pay for the signature's round trip.
pub const MIN_SIZE: u64 = 1 << 20;
/// Literal bytes per [`Op::Literal`] at most.
pub const LITERAL_MAX: usize = 256 << 10;
/// Bytes of the new file a batch of ops on the wire makes at most (copies
/// and literals): the receiver rebuilds while the sender searches.
pub const FLUSH_SPAN: u64 = 16 << 20;

/// Bytes of the new file `op` makes, at most (a copy of the old file's
/// short last block counts whole), for `block`-byte blocks.
pub fn span(op: &Op<'_>, block: u64) -> u64 {
    match *op {
        Op::Copy { count, .. } => u64::from(count) * block,
        Op::Literal(d) => d.len() as u64,
        Op::End { .. } => 0,
    }
}

/// The block size for an old file of `size` bytes: about √size, a multiple
/// of 8, within [`MIN_BLOCK`]..=[`MAX_BLOCK`] (rsync's rule).
pub fn block_size(size: u64) -> u32 {
    let root = (size as f64).sqrt() as u64;
    let b = root & !7;
    b.clamp(u64::from(MIN_BLOCK), u64::from(MAX_BLOCK)) as u32
}

/// Bytes of strong hash per block for an old file of `size` bytes in
/// `block`s: rsync's rule (weak and strong checksum together get about
/// log2(size) + log2(blocks) + 10 bits, so a false match anywhere in the
/// file is unlikely), within [`MIN_STRONG`]..=[`MAX_STRONG`]. The hash is
/// keyed with a key secret to the sender until the signature is made, so
/// no content can be made to collide on purpose, and the whole-file hash
/// catches the rare chance match (the file is then sent whole).
pub fn strong_len(size: u64, block: u32) -> u8 {
    let log = |x: u64| 63 - x.max(1).leading_zeros();
    let bits = 10 + 2 * log(size) - log(u64::from(block)).min(10 + 2 * log(size));
    ((bits + 1).saturating_sub(32).div_ceil(8) as u8).clamp(MIN_STRONG, MAX_STRONG)
}

/// The receiver's summary of its old file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Block size; the last block may be shorter.
    pub block: u32,
    /// Size of the old file.
    pub size: u64,
    /// The strong hash's key, drawn for this file.
    pub key: [u8; 32],
    /// Bytes of each strong hash ([`strong_len`]).
    pub strong_len: u8,
    /// Weak checksum of each block ([`weak`]).
    pub weak: Vec<u32>,
    /// Strong hash of each block ([`strong`]).
    pub strong: Vec<u64>,
}

/// Encoding version of [`Signature::encode`].
const SIG_FORMAT: u8 = 1;
const SIG_HEAD: usize = 1 + 4 + 8 + 32 + 1;

impl Signature {
    /// Number of blocks of a file of `size` bytes cut in `block`s.
    pub fn blocks_of(size: u64, block: u32) -> u64 {
        size.div_ceil(u64::from(block))
    }

    /// Length of block `i`.
    pub fn block_len(&self, i: u32) -> usize {
        let at = u64::from(i) * u64::from(self.block);
        (self.size - at).min(u64::from(self.block)) as usize
    }

    /// Bytes of [`Signature::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        SIG_HEAD + self.weak.len() * (4 + usize::from(self.strong_len))
    }

    /// The signature as bytes (what travels): a header, then per block
    /// the weak checksum (little-endian) and the strong hash.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.encoded_len());
        b.push(SIG_FORMAT);
        b.extend_from_slice(&self.block.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.key);
        b.push(self.strong_len);
        let sl = usize::from(self.strong_len);
        for (w, s) in self.weak.iter().zip(&self.strong) {
            b.extend_from_slice(&w.to_le_bytes());
            b.extend_from_slice(&s.to_le_bytes()[..sl]);
        }
        b
    }

    /// A signature from [`Signature::encode`]'s bytes, checked for
    /// consistency (block size in range, one entry per block).
    pub fn decode(b: &[u8]) -> io::Result<Signature> {
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("delta signature: {why}"),
            )
        };
        if b.len() < SIG_HEAD || b[0] != SIG_FORMAT {
            return Err(bad("unknown format"));
        }
        let block = u32::from_le_bytes(b[1..5].try_into().unwrap());
        let size = u64::from_le_bytes(b[5..13].try_into().unwrap());
        let key: [u8; 32] = b[13..45].try_into().unwrap();
        let strong_len = b[45];
        if !(MIN_BLOCK..=MAX_BLOCK).contains(&block) {
            return Err(bad("block size out of range"));
        }
        if !(MIN_STRONG..=MAX_STRONG).contains(&strong_len) {
            return Err(bad("strong hash length out of range"));
        }
        let n = Signature::blocks_of(size, block);
        let body = &b[SIG_HEAD..];
        let per = 4 + usize::from(strong_len);
        if n > u64::from(u32::MAX) || body.len() as u64 != n * per as u64 {
            return Err(bad("length does not match the file size"));
        }
        let mut weak = Vec::with_capacity(n as usize);
        let mut strong = Vec::with_capacity(n as usize);
        for e in body.chunks_exact(per) {
            weak.push(u32::from_le_bytes(e[..4].try_into().unwrap()));
            let mut s = [0u8; 8];
            s[..per - 4].copy_from_slice(&e[4..]);
            strong.push(u64::from_le_bytes(s));
        }
        Ok(Signature {
            block,
            size,
            key,
            strong_len,
            weak,
            strong,
        })
    }
}

/// One instruction of a delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// Copy `count` blocks of the old file from block `first` on.
    Copy {
        /// First block.
        first: u32,
        /// Blocks.
        count: u32,
    },
    /// These bytes.
    Literal(&'a [u8]),
    /// The end: the new content has `size` bytes and this blake3 hash.
    End {
        /// Size of the new content.
        size: u64,
        /// Its blake3 hash.
        hash: [u8; 32],
    },
}

const TAG_COPY: u8 = 1;
const TAG_LITERAL: u8 = 2;
const TAG_END: u8 = 3;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn get_varint(b: &[u8], at: &mut usize) -> io::Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&c) = b.get(*at) else {
            return Err(bad_ops("truncated"));
        };
        *at += 1;
        v |= u64::from(c & 0x7f) << shift;
        if c < 0x80 {
            return Ok(v);
        }
    }
    Err(bad_ops("varint too long"))
}

fn bad_ops(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("delta: bad op stream ({why})"),
    )
}

impl Op<'_> {
    /// Append the op's encoding (a tag byte, varints, bytes) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Op::Copy { first, count } => {
                out.push(TAG_COPY);
                put_varint(out, first.into());
                put_varint(out, count.into());
            }
            Op::Literal(data) => {
                out.push(TAG_LITERAL);
                put_varint(out, data.len() as u64);
                out.extend_from_slice(data);
            }
            Op::End { size, hash } => {
                out.push(TAG_END);
                put_varint(out, size);
                out.extend_from_slice(&hash);
            }
        }
    }

    /// Bytes of [`Op::encode`]'s output: what the op costs on the wire.
    pub fn encoded_len(&self) -> usize {
        1 + match *self {
            Op::Copy { first, count } => varint_len(first.into()) + varint_len(count.into()),
            Op::Literal(data) => varint_len(data.len() as u64) + data.len(),
            Op::End { size, .. } => varint_len(size) + 32,
        }
    }
}

/// The ops encoded in `b` (by [`Op::encode`]), each handed to `each`.
pub fn decode_ops(b: &[u8], each: &mut dyn FnMut(Op<'_>) -> io::Result<()>) -> io::Result<()> {
    let mut at = 0;
    while at < b.len() {
        let tag = b[at];
        at += 1;
        let op = match tag {
            TAG_COPY => {
                let first = get_varint(b, &mut at)?;
                let count = get_varint(b, &mut at)?;
                Op::Copy {
                    first: u32::try_from(first).map_err(|_| bad_ops("block"))?,
                    count: u32::try_from(count).map_err(|_| bad_ops("count"))?,
                }
            }
            TAG_LITERAL => {
                let n = get_varint(b, &mut at)? as usize;
                let data = b
                    .get(at..at.saturating_add(n))
                    .ok_or_else(|| bad_ops("literal"))?;
                at += n;
                Op::Literal(data)
            }
            TAG_END => {
                let size = get_varint(b, &mut at)?;
                let hash = b.get(at..at + 32).ok_or_else(|| bad_ops("end"))?;
                at += 32;
                Op::End {
                    size,
                    hash: hash.try_into().unwrap(),
                }
            }
            _ => return Err(bad_ops("tag")),
        };
        each(op)?;
    }
    Ok(())
}

/// Where a delta's ops go (the receiver's [`Patcher`], an encoder for the
/// wire, a counter in between).
pub trait OpSink {
    /// The next op; the last is [`Op::End`].
    fn op(&mut self, op: Op<'_>) -> io::Result<()>;
}

/// What [`diff`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffSummary {
    /// Bytes of the new content.
    pub size: u64,
    /// Of those, sent as literals.
    pub literal: u64,
    /// Of those, copied from the old file's blocks.
    pub matched: u64,
    /// Bytes of the ops as encoded ([`Op::encoded_len`]).
    pub ops: u64,
    /// The source's size and mtime after it was read, when the one that
    /// read it can tell (a remote sender), as [`crate::store::SourceFile::current`].
    pub current: Option<(u64, i64, u32)>,
}

/// A fresh key for one file's strong hashes: a process-wide secret from
/// the system's random source, hashed with a counter and the time.
pub fn new_key() -> [u8; 32] {
    use std::sync::OnceLock;
    static SECRET: OnceLock<[u8; 32]> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let secret = SECRET.get_or_init(|| {
        let mut s = [0u8; 32];
        let got = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| io::Read::read_exact(&mut f, &mut s));
        if got.is_err() {
            // No random source: the address space layout, the time and the
            // process id still make the key unknown to the sender in advance.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let mut h = blake3::Hasher::new();
            h.update(&t.to_le_bytes());
            h.update(&std::process::id().to_le_bytes());
            h.update(&(&s as *const _ as usize).to_le_bytes());
            s = *h.finalize().as_bytes();
        }
        s
    });
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = blake3::Hasher::new_keyed(secret);
    h.update(&n.to_le_bytes());
    h.update(&t.to_le_bytes());
    *h.finalize().as_bytes()
}

/// When a run sends changed files by delta.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Never (`--whole-file`).
    Off,
    /// Where a store does its part at the far end of a network link
    /// ([`crate::store::DeltaRole::Remote`]).
    #[default]
    Auto,
    /// Also between local trees (`--delta`).
    On,
}

/// A run's delta figures, counted as files complete.
#[derive(Debug, Default)]
pub struct Counts {
    /// Files sent by delta.
    pub files: AtomicU64,
    /// Their bytes sent as literals.
    pub literal: AtomicU64,
    /// Their bytes copied from the old copies.
    pub matched: AtomicU64,
    /// Bytes that moved between the two stores: signatures and ops of the
    /// files sent by delta, the content of those sent whole.
    pub wire: AtomicU64,
    /// Deltas that failed (a rebuilt file whose hash did not match, an old
    /// copy that could not be read) and were sent whole instead.
    pub fallbacks: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Files sent by delta.
    pub files: u64,
    /// Literal bytes.
    pub literal: u64,
    /// Matched bytes.
    pub matched: u64,
    /// Bytes between the stores.
    pub wire: u64,
    /// Deltas sent whole instead.
    pub fallbacks: u64,
}

impl Counts {
    /// The figures now.
    pub fn figures(&self) -> Figures {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Figures {
            files: g(&self.files),
            literal: g(&self.literal),
            matched: g(&self.matched),
            wire: g(&self.wire),
            fallbacks: g(&self.fallbacks),
        }
    }
}

/// A copier's delta settings: whether local trees take part too, and
/// where the figures go.
#[derive(Clone, Copy, Debug)]
pub struct Use<'a> {
    /// `--delta`: between local stores too.
    pub local: bool,
    /// The run's figures.
    pub counts: &'a Counts,
}

impl<'a> Use<'a> {
    /// The settings of `mode` (`None` for [`Mode::Off`]).
    pub fn of(mode: Mode, counts: &'a Counts) -> Option<Use<'a>> {
        match mode {
            Mode::Off => None,
            Mode::Auto => Some(Use {
                local: false,
                counts,
            }),
            Mode::On => Some(Use {
                local: true,
                counts,
            }),
        }
    }
}

/// The ops on their way from the sender to the receiver's sink: counted
/// (literal, matched, encoded bytes, the size the end op gives) and their
/// literals paced by `--bwlimit`.
pub struct Tally<'a> {
    /// Where the ops go.
    pub sink: &'a mut dyn OpSink,
    /// The signature the ops refer to (block lengths).
    pub sig: &'a Signature,
    /// `--bwlimit`.
    pub limit: Option<&'a crate::bwlimit::Limiter>,
    /// What went through.
    pub sum: DiffSummary,
}

impl OpSink for Tally<'_> {
    fn op(&mut self, op: Op<'_>) -> io::Result<()> {
        self.sum.ops += op.encoded_len() as u64;
        match op {
            Op::Copy { first, count } => {
                let at = u64::from(first) * u64::from(self.sig.block);
                let end = (u64::from(first) + u64::from(count)) * u64::from(self.sig.block);
                self.sum.matched += end.min(self.sig.size).saturating_sub(at);
            }
            Op::Literal(d) => {
                self.sum.literal += d.len() as u64;
                if let Some(l) = self.limit {
                    l.acquire(d.len() as u64);
                }
            }
            Op::End { size, .. } => self.sum.size = size,
        }
        self.sink.op(op)
    }
}
