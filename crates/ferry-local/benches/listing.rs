//! Syscalls never wait on CPU work.
//!
//! Entries per second of the scanner on one wide directory of 100,000 empty
//! files (/tmp/ferry-bench-wide-100k, created once if missing and kept):
//! * `list_tree/J`: `ferry_engine::ls::list_tree` (what `ferry ls` runs, text
//!   output formatted and written to `io::sink()`) with J jobs;
//! * `store_list/J`: just `Store::list` of the directory (getdents64 + statx,
//!   sorted `Listing`) on `LocalStore::new(path, J)`, from a fresh open;
//! * `std_floor/*`: `std::fs::read_dir` plus `fs::symlink_metadata(path)`
//!   (whole-path lookups), and plus `DirEntry::metadata` (fstatat relative to
//!   the directory), single-threaded, unsorted. That is a std floor, not the
//!   syscall floor: bench/floor/floor_ls.c is what the whole-workload harness
//!   (bench/run.py) compares against.
//!
//! Warm cache: the directory is listed repeatedly. Extra figures (stderr):
//! entries per second (median iteration).
//!
//! Run: `cargo bench -p ferry-local --bench listing -- --warm-up-time 1 --measurement-time 3`

use parking_lot::Mutex;
use std::cell::RefCell;
use std::hint::black_box;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use ferry_engine::ls::{list_tree, Format};
use ferry_engine::{Listing, Store};
use ferry_local::LocalStore;

const WIDE: &str = "/tmp/ferry-bench-wide-100k";
const N: u64 = 100_000;

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// Create the 100,000 files once; an existing complete directory is kept.
fn ensure_wide() {
    let dir = Path::new(WIDE);
    std::fs::create_dir_all(dir).expect("create wide dir");
    let have = std::fs::read_dir(dir).expect("read wide dir").count() as u64;
    if have >= N {
        return;
    }
    let t = Instant::now();
    for i in 0..N {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(format!("f{i:06}")))
            .expect("create file");
    }
    eprintln!(
        "created {WIDE} ({N} files) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

fn listing_benches(c: &mut Criterion) {
    ensure_wide();
    let entries = std::fs::read_dir(WIDE).expect("read wide dir").count() as u64;
    let samples: RefCell<Vec<(String, f64)>> = RefCell::new(Vec::new());
    let timed = |key: String, iters: u64, mut f: Box<dyn FnMut() -> u64 + '_>| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let t = Instant::now();
            let n = f();
            let d = t.elapsed();
            assert_eq!(n, entries, "{key}: entries listed");
            total += d;
            samples.borrow_mut().push((key.clone(), d.as_secs_f64()));
        }
        total
    };

    let mut g = c.benchmark_group("listing");
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(entries));
    for jobs in [1usize, 2, 4] {
        g.bench_function(BenchmarkId::new("list_tree", jobs), |b| {
            b.iter_custom(|iters| {
                timed(
                    format!("list_tree, {jobs} jobs"),
                    iters,
                    Box::new(|| {
                        let store = LocalStore::new(WIDE, jobs);
                        let out = Mutex::new(io::sink());
                        list_tree(&store, jobs, None, Format::Text, &out, &|_, _| {})
                            .expect("list_tree")
                    }),
                )
            })
        });
    }
    for jobs in [1usize, 4] {
        g.bench_function(BenchmarkId::new("store_list", jobs), |b| {
            b.iter_custom(|iters| {
                let store = LocalStore::new(WIDE, jobs);
                let mut list = Listing::new();
                let mut errors = Vec::new();
                timed(
                    format!("Store::list, {jobs} stat threads"),
                    iters,
                    Box::new(|| {
                        let (dir, _) = store.open_root().expect("open").expect("root exists");
                        store.list(&dir, b"", &mut list, &mut errors).expect("list");
                        assert!(errors.is_empty());
                        list.len() as u64
                    }),
                )
            })
        });
    }
    g.bench_function("std_floor/read_dir+symlink_metadata", |b| {
        b.iter_custom(|iters| {
            timed(
                "std read_dir + symlink_metadata(path)".into(),
                iters,
                Box::new(|| {
                    let mut v = Vec::with_capacity(N as usize);
                    for e in std::fs::read_dir(WIDE).expect("read_dir") {
                        let e = e.expect("entry");
                        let m = std::fs::symlink_metadata(e.path()).expect("stat");
                        v.push((e.file_name(), m.len()));
                    }
                    black_box(&v);
                    v.len() as u64
                }),
            )
        })
    });
    g.bench_function("std_floor/read_dir+dirent_metadata", |b| {
        b.iter_custom(|iters| {
            timed(
                "std read_dir + DirEntry::metadata".into(),
                iters,
                Box::new(|| {
                    let mut v = Vec::with_capacity(N as usize);
                    for e in std::fs::read_dir(WIDE).expect("read_dir") {
                        let e = e.expect("entry");
                        let m = e.metadata().expect("stat");
                        v.push((e.file_name(), m.len()));
                    }
                    black_box(&v);
                    v.len() as u64
                }),
            )
        })
    });
    g.finish();
    if samples.borrow().is_empty() {
        return; // filtered out or --list
    }

    eprintln!("\n== listing: {entries} entries in one directory, warm cache (median iteration) ==");
    let samples = samples.into_inner();
    let mut keys: Vec<&String> = Vec::new();
    for (k, _) in &samples {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for k in keys {
        let mut v: Vec<f64> = samples
            .iter()
            .filter(|(s, _)| s == k)
            .map(|(_, d)| *d)
            .collect();
        v.sort_by(f64::total_cmp);
        let med = v[v.len() / 2];
        eprintln!(
            "{k:40} {:>7.1} ms  {:>10.0} entries/s",
            med * 1e3,
            entries as f64 / med
        );
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = listing_benches
}
criterion_main!(benches);
