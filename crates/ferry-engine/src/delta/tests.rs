use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};

use proptest::prelude::*;

use super::*;
use crate::store::SourceFile;

/// Bytes handed out at most `step` at a time.
struct Mem<'a> {
    data: &'a [u8],
    step: usize,
}

impl SourceFile for Mem<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// A file with its descriptor: [`sign`] reads it with `pread` on every
/// worker.
struct Fd(std::fs::File);

impl SourceFile for Fd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.0.as_fd())
    }
}

/// The signature of `old`, made from a stream and from a file read by
/// several threads at once: both the same.
fn sign_both(old: &[u8], block: u32) -> Signature {
    let key = new_key();
    let streamed = sign(
        &mut Mem {
            data: old,
            step: 4099,
        },
        old.len() as u64,
        block,
        key,
        2,
    )
    .unwrap();
    let read_at = sign(&mut Fd(old_file(old)), old.len() as u64, block, key, 3).unwrap();
    assert_eq!(streamed, read_at);
    streamed
}

/// Ops encoded as for the wire.
#[derive(Default)]
struct Encoded(Vec<u8>);

impl OpSink for Encoded {
    fn op(&mut self, op: Op<'_>) -> io::Result<()> {
        let before = self.0.len();
        op.encode(&mut self.0);
        assert_eq!(self.0.len() - before, op.encoded_len());
        Ok(())
    }
}

fn old_file(data: &[u8]) -> std::fs::File {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(data).unwrap();
    f
}

/// Sign `old`, diff `new` against it, rebuild: the rebuilt bytes (or the
/// rebuild's error) and the diff's figures. `spoil` changes the old file
/// after it was signed.
fn round_trip(
    old: &[u8],
    new: &[u8],
    block: u32,
    spoil: Option<usize>,
) -> (io::Result<Vec<u8>>, DiffSummary) {
    round_trip_with(old, new, block, spoil, false)
}

/// [`round_trip`]; `unhashed`: the rebuilt bytes hashed by the caller, as
/// a writer thread does ([`Patcher::unhashed`]).
fn round_trip_with(
    old: &[u8],
    new: &[u8],
    block: u32,
    spoil: Option<usize>,
    unhashed: bool,
) -> (io::Result<Vec<u8>>, DiffSummary) {
    let sig = sign_both(old, block);
    let sig = if block >= MIN_BLOCK {
        Signature::decode(&sig.encode()).unwrap()
    } else {
        sig
    };
    let mut ops = Encoded::default();
    let sum = diff(
        &mut Mem {
            data: new,
            step: 65_537,
        },
        &sig,
        &mut ops,
    )
    .unwrap();
    let mut old = old.to_vec();
    if let Some(at) = spoil {
        old[at] ^= 0x55;
    }
    let mut p = Patcher::new(old_file(&old), sig.block, sig.size).unwrap();
    if unhashed {
        p = p.unhashed();
    }
    let mut got = Vec::new();
    let res = decode_ops(&ops.0, &mut |op| {
        p.apply(op, &mut |b| {
            got.extend_from_slice(b);
            Ok(())
        })
    })
    .and_then(|()| {
        if unhashed {
            // Not done until the caller's hash is checked.
            assert!(p.finish().is_err());
            p.check(*blake3::hash(&got).as_bytes())
        } else {
            p.finish()
        }
    })
    .map(|n| {
        assert_eq!(n, got.len() as u64);
        got
    });
    assert_eq!(sum.ops, ops.0.len() as u64);
    (res, sum)
}

#[derive(Clone, Debug)]
enum Edit {
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Append(Vec<u8>),
    Truncate(usize),
    /// Move `len` bytes at `from` to `to` (in what is left).
    Move(usize, usize, usize),
    Overwrite(usize, Vec<u8>),
    AllNew(Vec<u8>),
}

fn apply(data: &mut Vec<u8>, e: &Edit) {
    let at = |p: usize, d: &Vec<u8>| if d.is_empty() { 0 } else { p % (d.len() + 1) };
    match e {
        Edit::Insert(p, b) => {
            let p = at(*p, data);
            data.splice(p..p, b.iter().copied());
        }
        Edit::Delete(p, n) => {
            let p = at(*p, data);
            let e = (p + n).min(data.len());
            data.drain(p..e);
        }
        Edit::Append(b) => data.extend_from_slice(b),
        Edit::Truncate(n) => {
            let n = at(*n, data);
            data.truncate(n);
        }
        Edit::Move(from, len, to) => {
            let f = at(*from, data);
            let e = (f + len).min(data.len());
            let moved: Vec<u8> = data.drain(f..e).collect();
            let t = at(*to, data);
            data.splice(t..t, moved);
        }
        Edit::Overwrite(p, b) => {
            let p = at(*p, data);
            for (i, c) in b.iter().enumerate() {
                if let Some(x) = data.get_mut(p + i) {
                    *x = *c;
                }
            }
        }
        Edit::AllNew(b) => *data = b.clone(),
    }
}

/// Random bytes, or bytes from a tiny alphabet (long runs, many equal
/// weak checksums).
fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..max),
        prop::collection::vec(0u8..2, 0..max),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), bytes(3000)).prop_map(|(p, b)| Edit::Insert(p, b)),
        (any::<usize>(), 0usize..5000).prop_map(|(p, n)| Edit::Delete(p, n)),
        bytes(5000).prop_map(Edit::Append),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), 0usize..20_000, any::<usize>()).prop_map(|(f, n, t)| Edit::Move(f, n, t)),
        (any::<usize>(), bytes(100)).prop_map(|(p, b)| Edit::Overwrite(p, b)),
        bytes(30_000).prop_map(Edit::AllNew),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the old file and the edits, the rebuilt file is the new one,
    /// and every byte is either matched or literal.
    #[test]
    fn rebuilt_equals_new(
        old in bytes(60_000),
        edits in prop::collection::vec(edit(), 0..5),
        block in prop_oneof![Just(0u32), 1u32..64, Just(700)],
        unhashed in any::<bool>(),
    ) {
        let mut new = old.clone();
        for e in &edits {
            apply(&mut new, e);
        }
        let block = if block == 0 { block_size(old.len() as u64) } else { block };
        let (got, sum) = round_trip_with(&old, &new, block, None, unhashed);
        prop_assert!(got.unwrap() == new, "rebuilt file differs");
        prop_assert_eq!(sum.size, new.len() as u64);
        prop_assert_eq!(sum.literal + sum.matched, sum.size);
    }

    /// A byte of the old copy changed after it was signed: the rebuild
    /// fails on the whole-file hash when a copied block covers it.
    #[test]
    fn a_spoiled_old_block_is_caught(
        old in prop::collection::vec(any::<u8>(), 2000..40_000),
        at in any::<usize>(),
        tail in bytes(2000),
        unhashed in any::<bool>(),
    ) {
        let mut new = old.clone();
        new.extend_from_slice(&tail);
        let at = at % old.len();
        let (got, sum) = round_trip_with(&old, &new, 700, Some(at), unhashed);
        // Every whole block of the old file is matched, so the spoiled
        // byte is copied unless it is in the short last block.
        prop_assert!(sum.matched >= (old.len() / 700 * 700) as u64);
        if at < old.len() / 700 * 700 {
            let e = got.unwrap_err();
            prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        }
    }
}

/// A 4 MiB file with a few small changes sends little more than the
/// blocks they touch.
#[test]
fn small_edits_send_little() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let old: Vec<u8> = (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut new = old.clone();
    for k in 0..10 {
        new[k * 400_000 + 123] ^= 1;
    }
    new.splice(2_000_000..2_000_000, *b"inserted");
    let block = block_size(old.len() as u64);
    assert_eq!(block, 2048);
    let (got, sum) = round_trip(&old, &new, block, None);
    assert!(got.unwrap() == new);
    assert!(sum.literal <= 12 * u64::from(block), "{sum:?}");
    assert!(
        sum.matched >= new.len() as u64 - 12 * u64::from(block),
        "{sum:?}"
    );
}

#[test]
fn block_size_follows_rsync() {
    assert_eq!(block_size(0), MIN_BLOCK);
    assert_eq!(block_size(1 << 20), 1024);
    assert_eq!(block_size(1 << 30), 32 << 10);
    assert_eq!(block_size(1 << 40), MAX_BLOCK);
}

#[test]
fn rolling_equals_fresh_sums() {
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect();
    for len in [1usize, 15, 16, 17, 700, 1000] {
        let mut r = Rolling::new(&data[..len]);
        for p in 0..data.len() - len {
            assert_eq!(r.value(), weak(&data[p..p + len]), "len {len} at {p}");
            r.roll(data[p], data[p + len]);
        }
    }
}

#[test]
fn signatures_and_ops_reject_garbage() {
    let sig = sign(
        &mut Mem {
            data: &[7; 5000],
            step: 100,
        },
        5000,
        700,
        new_key(),
        1,
    )
    .unwrap();
    let enc = sig.encode();
    assert_eq!(Signature::decode(&enc).unwrap(), sig);
    assert!(Signature::decode(&enc[..enc.len() - 1]).is_err());
    // A file longer or shorter than the size it was listed with.
    assert!(sign(
        &mut Mem {
            data: &[7; 5001],
            step: 100
        },
        5000,
        700,
        new_key(),
        1
    )
    .is_err());
    assert!(sign(
        &mut Mem {
            data: &[7; 4999],
            step: 100
        },
        5000,
        700,
        new_key(),
        1
    )
    .is_err());
    // The same, read with pread by several threads.
    for len in [4999usize, 5001, 3 << 20] {
        let f = old_file(&vec![7; len]);
        assert!(sign(&mut Fd(f), 5000, 700, new_key(), 2).is_err(), "{len}");
    }
    let f = old_file(&[7; 1 << 20]);
    assert!(sign(&mut Fd(f), 3 << 20, 1024, new_key(), 2).is_err());
    let mut p = Patcher::new(old_file(&[0; 100]), 700, 100).unwrap();
    let e = p.apply(Op::Copy { first: 1, count: 1 }, &mut |_| Ok(()));
    assert!(e.is_err());
    assert!(p.finish().is_err());
    // An unhashed patcher: the end needs the caller's hash, the right one.
    let mut p = Patcher::new(old_file(&[0; 100]), 700, 100)
        .unwrap()
        .unhashed();
    let hash = *blake3::hash(&[1, 2]).as_bytes();
    p.apply(Op::Literal(&[1, 2]), &mut |_| Ok(())).unwrap();
    p.apply(Op::End { size: 2, hash }, &mut |_| Ok(())).unwrap();
    assert!(p.apply(Op::Literal(&[3]), &mut |_| Ok(())).is_err());
    assert!(p.finish().is_err());
    assert!(p.check(*blake3::hash(&[1, 3]).as_bytes()).is_err());
    let mut p = Patcher::new(old_file(&[0; 100]), 700, 100)
        .unwrap()
        .unhashed();
    p.apply(Op::Literal(&[1, 2]), &mut |_| Ok(())).unwrap();
    p.apply(Op::End { size: 2, hash }, &mut |_| Ok(())).unwrap();
    assert_eq!(p.check(hash).unwrap(), 2);
    assert!(decode_ops(&[TAG_LITERAL, 10, 1], &mut |_| Ok(())).is_err());
    assert!(decode_ops(&[9], &mut |_| Ok(())).is_err());
}

#[test]
fn strong_hashes_grow_with_the_file_as_rsyncs() {
    assert_eq!(strong_len(0, MIN_BLOCK), MIN_STRONG);
    assert_eq!(strong_len(1 << 30, block_size(1 << 30)), 4);
    assert_eq!(strong_len(1 << 40, block_size(1 << 40)), 6);
    assert_eq!(strong_len(u64::MAX, MAX_BLOCK), MAX_STRONG);
}
