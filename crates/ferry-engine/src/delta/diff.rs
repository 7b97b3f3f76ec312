//! The sender's side of a delta: its new content against the receiver's
//! [`Signature`], as [`Op`]s.
//!
//! One thread reads the content in pieces and hashes it whole (the hash
//! that ends the delta); the calling thread slides the window over the
//! pieces: the weak checksum rolls one byte at a time and is looked up in
//! an open-addressing table of the signature's blocks; a hit is confirmed
//! by the keyed strong hash, after which the window jumps a whole block.

use std::io;
use std::sync::mpsc;

use super::sign::{read_full, strong, Rolling};
use super::{DiffSummary, Op, OpSink, Signature, FLUSH_SPAN, LITERAL_MAX};
use crate::store::SourceFile;

/// Bytes of one read of the content.
const PIECE: usize = 1 << 20;
/// Pieces read ahead of the search.
const AHEAD: usize = 4;
/// Candidates with one weak checksum looked at, at most (identical blocks
/// are entered once, so only a crafted old file gets near it).
const MAX_PROBE: usize = 64;

/// The signature's blocks by weak checksum: slots hold block index + 1,
/// 0 is empty; linear probing; identical blocks entered once. In front of
/// it a bit per 16 slots' worth of checksums: most positions of new data
/// miss there, in a table that stays in the first-level cache, with a
/// branch that is almost always taken the same way.
struct Table {
    slots: Vec<u32>,
    bits: u32,
    filter: Vec<u64>,
    filter_bits: u32,
}

impl Table {
    fn new(sig: &Signature) -> Table {
        let n = sig.weak.len();
        let cap = (n * 2).next_power_of_two().max(16);
        let bits = cap.trailing_zeros();
        let fcap = (n * 16).next_power_of_two().max(64);
        let mut t = Table {
            slots: vec![0; cap],
            bits,
            filter: vec![0; fcap / 64],
            filter_bits: fcap.trailing_zeros(),
        };
        let mask = cap - 1;
        'blocks: for i in 0..n {
            let w = sig.weak[i];
            let mut p = t.home(w);
            while t.slots[p] != 0 {
                let j = (t.slots[p] - 1) as usize;
                if sig.weak[j] == w
                    && sig.strong[j] == sig.strong[i]
                    && sig.block_len(j as u32) == sig.block_len(i as u32)
                {
                    continue 'blocks;
                }
                p = (p + 1) & mask;
            }
            t.slots[p] = i as u32 + 1;
            let f = t.filter_at(w);
            t.filter[f >> 6] |= 1 << (f & 63);
        }
        t
    }

    #[inline(always)]
    fn filter_at(&self, w: u32) -> usize {
        (w.wrapping_mul(0x85EB_CA77) >> (32 - self.filter_bits)) as usize
    }

    #[inline(always)]
    fn home(&self, w: u32) -> usize {
        (w.wrapping_mul(0x9E37_79B1) >> (32 - self.bits)) as usize
    }

    /// The block whose weak checksum is `w`, length `len` and strong hash
    /// that of `data` (computed only when a weak checksum matches).
    #[inline(always)]
    fn find(&self, sig: &Signature, w: u32, data: &[u8]) -> Option<u32> {
        let f = self.filter_at(w);
        if self.filter[f >> 6] & (1 << (f & 63)) == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut p = self.home(w);
        let mut s = None;
        for _ in 0..MAX_PROBE {
            let slot = self.slots[p];
            if slot == 0 {
                return None;
            }
            let j = slot - 1;
            if sig.weak[j as usize] == w && sig.block_len(j) == data.len() {
                let h = *s.get_or_insert_with(|| strong(&sig.key, data, sig.strong_len));
                if sig.strong[j as usize] == h {
                    return Some(j);
                }
            }
            p = (p + 1) & mask;
        }
        None
    }
}

/// Ops collected in order: a run of consecutive blocks becomes one copy.
struct Out<'s> {
    sink: &'s mut dyn OpSink,
    copy: Option<(u32, u32)>,
    sum: DiffSummary,
    /// Blocks one copy spans at most ([`FLUSH_SPAN`]): a long run of
    /// matches reaches the receiver as it is found.
    max_run: u32,
}

impl Out<'_> {
    fn copy(&mut self, j: u32, len: usize) -> io::Result<()> {
        self.sum.matched += len as u64;
        if let Some((first, count)) = &mut self.copy {
            // Only the old file's last block may be short, and nothing
            // follows it: a run of consecutive blocks is one copy.
            if j == *first + *count && *count < self.max_run {
                *count += 1;
                return Ok(());
            }
        }
        self.flush_copy()?;
        self.copy = Some((j, 1));
        Ok(())
    }

    fn flush_copy(&mut self) -> io::Result<()> {
        if let Some((first, count)) = self.copy.take() {
            self.emit(Op::Copy { first, count })?;
        }
        Ok(())
    }

    fn literal(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.flush_copy()?;
        for c in data.chunks(LITERAL_MAX) {
            self.sum.literal += c.len() as u64;
            self.emit(Op::Literal(c))?;
        }
        Ok(())
    }

    fn emit(&mut self, op: Op<'_>) -> io::Result<()> {
        self.sum.ops += op.encoded_len() as u64;
        self.sink.op(op)
    }
}

/// The delta turning the file `sig` describes into the content `r` yields
/// (read from where it stands to its end), into `sink`, ending with
/// [`Op::End`] (the content's size and blake3 hash).
pub fn diff(
    r: &mut dyn SourceFile,
    sig: &Signature,
    sink: &mut dyn OpSink,
) -> io::Result<DiffSummary> {
    let table = Table::new(sig);
    let b = sig.block as usize;
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(AHEAD);
    let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
    std::thread::scope(|s| {
        let reader = s.spawn(move || -> io::Result<(u64, [u8; 32])> {
            let mut h = blake3::Hasher::new();
            let mut total = 0u64;
            loop {
                let mut buf = free_rx.try_recv().unwrap_or_default();
                buf.resize(PIECE, 0);
                let n = read_full(r, &mut buf)?;
                buf.truncate(n);
                h.update(&buf);
                total += n as u64;
                if n == 0 || tx.send(buf).is_err() {
                    return Ok((total, *h.finalize().as_bytes()));
                }
                if n < PIECE {
                    return Ok((total, *h.finalize().as_bytes()));
                }
            }
        });
        let mut out = Out {
            sink,
            copy: None,
            sum: DiffSummary::default(),
            max_run: (FLUSH_SPAN / u64::from(sig.block)).max(1) as u32,
        };
        let searched = search(&table, sig, b, &rx, &free_tx, &mut out);
        drop(rx);
        let read = reader
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("delta: reader panicked")));
        searched?;
        let (size, hash) = read?;
        out.flush_copy()?;
        debug_assert_eq!(out.sum.literal + out.sum.matched, size);
        out.emit(Op::End { size, hash })?;
        out.sum.size = size;
        Ok(out.sum)
    })
}

/// The rolling search over the pieces `rx` hands over.
fn search(
    table: &Table,
    sig: &Signature,
    b: usize,
    rx: &mpsc::Receiver<Vec<u8>>,
    free: &mpsc::Sender<Vec<u8>>,
    out: &mut Out<'_>,
) -> io::Result<()> {
    let tail = if sig.weak.is_empty() {
        None
    } else {
        let last = sig.weak.len() as u32 - 1;
        Some((last, sig.block_len(last)))
    };
    let mut buf: Vec<u8> = Vec::with_capacity(PIECE * 2 + b);
    let (mut pos, mut lit) = (0usize, 0usize);
    let mut eof = false;
    let mut roll: Option<Rolling> = None;
    let nblocks = sig.weak.len() as u32;
    let mut next: Option<u32> = None;
    loop {
        // Keep more than a block ahead, so the window can roll.
        while !eof && buf.len() - pos <= b {
            out.literal(&buf[lit..pos])?;
            buf.drain(..pos);
            pos = 0;
            lit = 0;
            match rx.recv() {
                Ok(piece) => {
                    eof = piece.is_empty();
                    buf.extend_from_slice(&piece);
                    let _ = free.send(piece);
                }
                Err(_) => eof = true,
            }
        }
        let end = buf.len();
        if end - pos < b {
            // The end: what is left may be the old file's short last block.
            let rest = &buf[pos..end];
            if let Some((last, len)) = tail {
                if len == rest.len()
                    && !rest.is_empty()
                    && sig.weak[last as usize] == super::weak(rest)
                    && sig.strong[last as usize] == strong(&sig.key, rest, sig.strong_len)
                {
                    out.literal(&buf[lit..pos])?;
                    out.copy(last, len)?;
                    return Ok(());
                }
            }
            return out.literal(&buf[lit..end]);
        }
        // Right after a match the next block is the likely one: its strong
        // hash is checked first, without the weak checksum (unchanged runs
        // cost one hash per block). A chance match of the truncated hash is
        // caught by the end hash, as any other.
        if let Some(k) = next.take() {
            if roll.is_none()
                && sig.block_len(k) == b
                && sig.strong[k as usize] == strong(&sig.key, &buf[pos..pos + b], sig.strong_len)
            {
                out.copy(k, b)?;
                pos += b;
                lit = pos;
                next = (k + 1 < nblocks).then_some(k + 1);
                continue;
            }
        }
        let r = roll.get_or_insert_with(|| Rolling::new(&buf[pos..pos + b]));
        // The hot loop: roll until a block matches, the window reaches
        // the end of what was read, or the literal is long enough to send.
        let stop = (end - b).min(lit + LITERAL_MAX);
        let mut found = None;
        loop {
            if let Some(j) = table.find(sig, r.value(), &buf[pos..pos + b]) {
                found = Some(j);
                break;
            }
            if pos >= stop {
                break;
            }
            r.roll(buf[pos], buf[pos + b]);
            pos += 1;
        }
        match found {
            Some(j) => {
                out.literal(&buf[lit..pos])?;
                out.copy(j, b)?;
                pos += b;
                lit = pos;
                roll = None;
                next = (j + 1 < nblocks).then_some(j + 1);
            }
            None if pos == end - b => {
                // No byte to roll in: the window can only shrink (the end
                // of the content).
                if eof {
                    pos += 1;
                    roll = None;
                }
            }
            None => {
                out.literal(&buf[lit..pos])?;
                lit = pos;
            }
        }
    }
}
