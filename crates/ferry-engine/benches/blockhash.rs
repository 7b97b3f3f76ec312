//! The block hash of a patch in place (`delta::inplace::block_hash`,
//! keyed HighwayHash-256) against keyed blake3, the hash it replaced, on
//! 64 MiB cut in the 8 KiB blocks of a 1 GiB file's patch, one thread:
//! both ends of an append or scattered patch hash their whole file, so
//! this is most of such a run's CPU.
//!
//! Run: `cargo bench -p ferry-engine --bench blockhash`; criterion prints MiB/s.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferry_engine::delta::inplace::block_hash;

const SIZE: usize = 64 << 20;
const BLOCK: usize = 8 << 10;

fn hashes(c: &mut Criterion) {
    let data: Vec<u8> = (0..SIZE as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 47) as u8)
        .collect();
    let key = [7u8; 32];
    let mut g = c.benchmark_group("block hash, 8 KiB blocks");
    g.throughput(Throughput::Bytes(SIZE as u64))
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    g.bench_function("highway-256 keyed (ferry)", |b| {
        b.iter(|| {
            data.chunks(BLOCK)
                .fold(0u8, |x, c| x ^ block_hash(&key, c)[0])
        })
    });
    g.bench_function("blake3 keyed (before)", |b| {
        b.iter(|| {
            data.chunks(BLOCK)
                .fold(0u8, |x, c| x ^ blake3::keyed_hash(&key, c).as_bytes()[0])
        })
    });
    g.finish();
}

criterion_group!(benches, hashes);
criterion_main!(benches);
