//! The common case takes the fast path.
//!
//! Streams of 100,000 acks of 16 KiB each into `ferry_local::range::RangeSet`
//! and into a naive `BTreeMap<u64, u64>` range set (merge on insert):
//! * `in_order`: ack i covers [i*16K, (i+1)*16K);
//! * `window8`: slightly reordered: a random permutation within each
//!   consecutive window of 8 acks;
//! * `random`: a full random permutation.
//!
//! A counting global allocator counts allocations during one pass of each
//! stream. Extra figures (stderr): ns per ack and allocations per ack.
//! In-order must show 0 allocations per ack.
//!
//! Run: `cargo bench -p ferry-local --bench ranges -- --warm-up-time 1 --measurement-time 3`

// The counting allocator needs `unsafe impl GlobalAlloc`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferry_local::range::RangeSet;

struct CountingAlloc;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const ACKS: u64 = 100_000;
const ACK: u64 = 16 * 1024;

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// The obvious range set: a BTreeMap start → end, merged on every insert.
#[derive(Default)]
struct Naive {
    map: BTreeMap<u64, u64>,
}

impl Naive {
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if end <= start {
            return;
        }
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.map.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.map.range(start..).next() {
            if s > end {
                break;
            }
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
    }

    fn prefix(&self) -> u64 {
        match self.map.first_key_value() {
            Some((&0, &e)) => e,
            _ => 0,
        }
    }

    fn ranges(&self) -> Vec<(u64, u64)> {
        self.map.iter().map(|(s, e)| (*s, *e)).collect()
    }
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

fn shuffle(v: &mut [(u64, u64)], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i + 1));
    }
}

fn streams() -> Vec<(&'static str, Vec<(u64, u64)>)> {
    let in_order: Vec<(u64, u64)> = (0..ACKS).map(|i| (i * ACK, (i + 1) * ACK)).collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut window8 = in_order.clone();
    for w in window8.chunks_mut(8) {
        shuffle(w, &mut rng);
    }
    let mut random = in_order.clone();
    shuffle(&mut random, &mut rng);
    vec![
        ("in_order", in_order),
        ("window8", window8),
        ("random", random),
    ]
}

/// Inserts a whole stream into a fresh set; returns its prefix.
type RunFn = fn(&[(u64, u64)]) -> u64;

fn run_rangeset(acks: &[(u64, u64)]) -> u64 {
    let mut r = RangeSet::new();
    for &(s, e) in acks {
        r.insert(s, e);
    }
    r.prefix()
}

fn run_naive(acks: &[(u64, u64)]) -> u64 {
    let mut r = Naive::default();
    for &(s, e) in acks {
        r.insert(s, e);
    }
    r.prefix()
}

/// Allocations during one pass (construction, inserts and drop).
fn allocs(f: impl FnOnce() -> u64) -> u64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    black_box(f());
    ALLOCS.load(Ordering::Relaxed) - before
}

fn range_benches(c: &mut Criterion) {
    let streams = streams();
    // Both sets must agree before their speed means anything.
    for (name, acks) in &streams {
        let mut a = RangeSet::new();
        let mut b = Naive::default();
        for (i, &(s, e)) in acks.iter().enumerate() {
            a.insert(s, e);
            b.insert(s, e);
            if i % 997 == 0 {
                assert_eq!(a.prefix(), b.prefix(), "{name}: prefix after {i} acks");
            }
        }
        assert_eq!(a.ranges(), b.ranges(), "{name}");
        assert_eq!(a.prefix(), ACKS * ACK, "{name}");
        assert!(a.missing(ACKS * ACK).is_empty());
        assert_eq!(a.total(), ACKS * ACK);
    }

    let samples: RefCell<Vec<(String, f64)>> = RefCell::new(Vec::new());
    let impls: [(&str, RunFn); 2] = [("rangeset", run_rangeset), ("naive_btreemap", run_naive)];
    let mut g = c.benchmark_group("ranges");
    g.throughput(Throughput::Elements(ACKS));
    for (order, acks) in &streams {
        for (imp, run) in impls {
            let key = format!("{order}/{imp}");
            g.bench_function(BenchmarkId::new(*order, imp), |b| {
                b.iter_custom(|iters| {
                    let t = Instant::now();
                    for _ in 0..iters {
                        black_box(run(black_box(acks)));
                    }
                    let d = t.elapsed();
                    samples
                        .borrow_mut()
                        .push((key.clone(), d.as_secs_f64() / iters as f64));
                    d
                })
            });
        }
    }
    g.finish();
    if samples.borrow().is_empty() {
        return; // filtered out or --list
    }

    eprintln!("\n== ranges: 100,000 acks of 16 KiB (ns/ack: median of the measured iterations) ==");
    eprintln!(
        "{:9} {:15} {:>9} {:>11} {:>10}",
        "order", "set", "ns/ack", "allocs", "allocs/ack"
    );
    for (order, acks) in &streams {
        for (imp, run) in impls {
            let n = allocs(|| run(acks));
            let key = format!("{order}/{imp}");
            let mut v: Vec<f64> = samples
                .borrow()
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, s)| *s)
                .collect();
            v.sort_by(f64::total_cmp);
            let ns = v
                .get(v.len() / 2)
                .map(|s| format!("{:.1}", s * 1e9 / ACKS as f64))
                .unwrap_or_else(|| "-".into());
            eprintln!(
                "{order:9} {imp:15} {ns:>9} {n:>11} {:>10.4}",
                n as f64 / ACKS as f64
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = range_benches
}
criterion_main!(benches);
