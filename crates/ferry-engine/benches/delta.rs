//! The delta search loop (`ferry_engine::delta::diff`) against Dropbox's
//! `fast_rsync` (SIMD, MD4 strong hash, no key), on the same data and block
//! size: why ferry has its own loop. fast_rsync cannot key its strong hash
//! and works on whole files in memory; this shows what the keyed, streamed
//! loop costs or saves. Three cases over 64 MiB: all new (every position
//! misses: the rolling path), unchanged (every block matches: the strong
//! hash path), and 100 scattered 4 KiB changes. Also the signature: ferry's
//! (2 threads, keyed blake3) against fast_rsync's (MD4).
//!
//! Run: `cargo bench -p ferry-engine --bench delta`; criterion prints MiB/s.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferry_engine::delta::{block_size, diff, new_key, sign, Op, OpSink, Signature};
use ferry_engine::store::SourceFile;

const SIZE: usize = 64 << 20;

struct Mem<'a>(&'a [u8]);

impl SourceFile for Mem<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// Counts the ops (as an encoder would see them) and drops them.
struct Count(u64);

impl OpSink for Count {
    fn op(&mut self, op: Op<'_>) -> io::Result<()> {
        self.0 += op.encoded_len() as u64;
        Ok(())
    }
}

fn random(n: usize, mut x: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

fn ours_sig(old: &[u8]) -> Signature {
    sign(
        &mut Mem(old),
        old.len() as u64,
        block_size(old.len() as u64),
        new_key(),
        2,
    )
    .unwrap()
}

fn theirs_sig(old: &[u8]) -> fast_rsync::Signature {
    fast_rsync::Signature::calculate(
        old,
        fast_rsync::SignatureOptions {
            block_size: block_size(old.len() as u64),
            crypto_hash_size: 4,
        },
    )
}

fn search(c: &mut Criterion) {
    let old = random(SIZE, 0x9e37_79b9_7f4a_7c15);
    let mut edited = old.clone();
    for k in 0..100 {
        let at = k * (SIZE / 100) + 777;
        edited[at..at + 4096].copy_from_slice(&random(4096, k as u64 + 1));
    }
    let cases = [
        ("all-new", random(SIZE, 42)),
        ("unchanged", old.clone()),
        ("100x4KiB", edited),
    ];
    let ours = ours_sig(&old);
    let theirs = theirs_sig(&old);
    let indexed = theirs.index();
    let mut g = c.benchmark_group("delta-search");
    g.throughput(Throughput::Bytes(SIZE as u64));
    for (name, new) in &cases {
        g.bench_with_input(BenchmarkId::new("ferry", name), new, |b, new| {
            b.iter(|| {
                let mut out = Count(0);
                diff(&mut Mem(new), &ours, &mut out).unwrap();
                out.0
            })
        });
        g.bench_with_input(BenchmarkId::new("fast_rsync", name), new, |b, new| {
            b.iter(|| {
                let mut out = Vec::new();
                fast_rsync::diff(&indexed, new, &mut out).unwrap();
                out.len()
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("delta-signature");
    g.throughput(Throughput::Bytes(SIZE as u64));
    g.bench_function("ferry", |b| b.iter(|| ours_sig(&old).weak.len()));
    g.bench_function("fast_rsync", |b| {
        b.iter(|| theirs_sig(&old).serialized().len())
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = search
}
criterion_main!(benches);
