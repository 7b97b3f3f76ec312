//! No artificial delay between jobs.
//!
//! * `pool/*`: 10,000 no-op jobs through the real worker pool
//!   (`ferry_engine::pool::Pool`) with 1, 2 and 4 workers, either queued at
//!   once (`batch`) or pushed by running tasks the way the engine does it
//!   (`tree`: a root pushes 100 "directories", each pushes 100 "files" one
//!   `push` at a time). Goal: < 5 µs per job.
//! * `copy_10k_empty/ferry_sync/4`: end to end, 10,000 empty files (100 dirs
//!   x 100) copied by the engine (`Engine::run_tree`, sync, 4 jobs) into a
//!   fresh destination each iteration. Each run is followed (untimed by
//!   criterion) by a single-threaded std `File::create` floor for the same
//!   tree, so the two are compared in the same filesystem conditions: ext4
//!   on this machine gets many times slower for minutes after anyone's mass
//!   deletes.
//!
//! Extra figures (stderr, after criterion's output): µs per job and µs per
//! file (median and best of the measured iterations).
//!
//! Run: `cargo bench -p ferry-local --bench scheduler -- --warm-up-time 1 --measurement-time 3`

use std::cell::RefCell;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use ferry_engine::pool::Pool;
use ferry_engine::report::Quiet;
use ferry_engine::{Engine, Mode, Options, Stats};
use ferry_local::LocalStore;

const JOBS: u32 = 10_000;
const DIRS: u32 = 100;
const FILES_PER_DIR: u32 = 100;

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// Seconds per iteration of each criterion call (warm-up included).
type Samples = RefCell<Vec<(String, f64)>>;

fn record(samples: &Samples, name: &str, iters: u64, d: Duration) -> Duration {
    samples
        .borrow_mut()
        .push((name.to_owned(), d.as_secs_f64() / iters as f64));
    d
}

/// (median, min) seconds per iteration recorded under `name`.
fn stats(samples: &Samples, name: &str) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = samples
        .borrow()
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, s)| *s)
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some((v[v.len() / 2], v[0]))
}

fn batch(workers: usize) {
    let pool = Pool::new();
    pool.push_all(0..JOBS);
    pool.run(workers, |t, _| {
        black_box(t);
    });
}

enum Job {
    Root,
    Dir,
    File(u32),
}

/// 1 + 100 + 10,000 jobs, pushed by the jobs themselves.
const TREE_JOBS: u32 = 1 + DIRS + DIRS * FILES_PER_DIR;

fn tree(workers: usize) {
    let pool = Pool::new();
    pool.push(Job::Root);
    pool.run(workers, |t, p| match t {
        Job::Root => p.push_all((0..DIRS).map(|_| Job::Dir)),
        Job::Dir => {
            for i in 0..FILES_PER_DIR {
                p.push(Job::File(i));
            }
        }
        Job::File(i) => {
            black_box(i);
        }
    });
}

fn pool_benches(c: &mut Criterion) {
    let samples: Samples = RefCell::new(Vec::new());
    let mut g = c.benchmark_group("pool");
    for (kind, run, jobs) in [
        ("batch", batch as fn(usize), JOBS),
        ("tree", tree as fn(usize), TREE_JOBS),
    ] {
        g.throughput(Throughput::Elements(jobs as u64));
        for workers in [1usize, 2, 4] {
            let name = format!("{kind}/{workers}");
            g.bench_function(BenchmarkId::new(kind, workers), |b| {
                b.iter_custom(|iters| {
                    let t = Instant::now();
                    for _ in 0..iters {
                        run(workers);
                    }
                    record(&samples, &name, iters, t.elapsed())
                })
            });
        }
    }
    g.finish();
    if samples.borrow().is_empty() {
        return; // filtered out or --list
    }
    eprintln!(
        "\n== scheduler: pool, no-op jobs (goal < 5 µs/job; includes spawning the workers) =="
    );
    for (kind, jobs) in [("batch", JOBS), ("tree", TREE_JOBS)] {
        for workers in [1usize, 2, 4] {
            if let Some((med, min)) = stats(&samples, &format!("{kind}/{workers}")) {
                eprintln!(
                    "pool {kind:5} {jobs:6} jobs, {workers} workers: {:.3} µs/job median, {:.3} best",
                    med * 1e6 / jobs as f64,
                    min * 1e6 / jobs as f64
                );
            }
        }
    }
}

fn make_source(root: &Path) {
    for d in 0..DIRS {
        let dir = root.join(format!("d{d:03}"));
        std::fs::create_dir(&dir).expect("mkdir source");
        for f in 0..FILES_PER_DIR {
            std::fs::File::create(dir.join(format!("f{f:03}"))).expect("create source file");
        }
    }
}

/// The floor beside each ferry run: one thread, std `create_dir` and
/// `File::create` for the same tree (no copy, metadata, temp or rename).
fn floor_create(dst: &Path) {
    std::fs::create_dir(dst).expect("mkdir");
    for d in 0..DIRS {
        let dir = dst.join(format!("d{d:03}"));
        std::fs::create_dir(&dir).expect("mkdir");
        for f in 0..FILES_PER_DIR {
            std::fs::File::create(dir.join(format!("f{f:03}"))).expect("create");
        }
    }
}

fn copy_benches(c: &mut Criterion) {
    // Made on first use, so a filtered-out run creates nothing. Destinations
    // are never reused nor deleted before the end: ext4 is slow to create
    // files right after mass deletes.
    let mut dirs: Option<(tempfile::TempDir, tempfile::TempDir)> = None;
    let mut next = 0u64;
    let files = (DIRS * FILES_PER_DIR) as u64;
    let jobs = 4;
    // Seconds per iteration: (ferry, floor run right after it).
    let mut pairs: Vec<(f64, f64)> = Vec::new();

    let mut g = c.benchmark_group("copy_10k_empty");
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(files));
    g.bench_function(BenchmarkId::new("ferry_sync", jobs), |b| {
        b.iter_custom(|iters| {
            let (src, dst_root) = dirs.get_or_insert_with(|| {
                let tmp = |prefix| {
                    tempfile::Builder::new()
                        .prefix(prefix)
                        .tempdir()
                        .expect("tempdir")
                };
                let src = tmp("ferry-bench-src-");
                make_source(src.path());
                (src, tmp("ferry-bench-dst-"))
            });
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let dst = dst_root.path().join(format!("ferry{next}"));
                let s = LocalStore::new(src.path(), jobs);
                let d = LocalStore::new(&dst, jobs);
                let opts = Options {
                    mode: Mode::Sync,
                    dry_run: false,
                    checksum: false,
                    fsync: false,
                    jobs,
                    more_jobs: None,
                    filter: None,
                    bwlimit: None,
                    max_delete: None,
                    force: false,
                    xattrs: Default::default(),
                    hard_links: false,
                    delta: Default::default(),
                    keep: None,
                    keep_special_bits: false,
                };
                let stats = Stats::default();
                let t = Instant::now();
                let r = Engine::new(&s, &d, &opts, &stats, &Quiet)
                    .run_tree()
                    .expect("run_tree");
                let ferry = t.elapsed();
                total += ferry;
                assert_eq!((r.files_copied, r.errors), (files, 0), "copy incomplete");
                // The floor in the same conditions (not part of criterion's time).
                let t = Instant::now();
                floor_create(&dst_root.path().join(format!("floor{next}")));
                pairs.push((ferry.as_secs_f64(), t.elapsed().as_secs_f64()));
                next += 1;
            }
            total
        })
    });
    g.finish();
    if pairs.is_empty() {
        return;
    }
    let us = |s: f64| s * 1e6 / files as f64;
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0])
    };
    let (f_med, f_min) = med(pairs.iter().map(|p| p.0).collect());
    let (c_med, c_min) = med(pairs.iter().map(|p| p.1).collect());
    let (r_med, _) = med(pairs.iter().map(|p| p.0 / p.1).collect());
    eprintln!(
        "\n== scheduler: end to end, 10,000 empty files in 100 dirs, fresh destination, {} runs ==",
        pairs.len()
    );
    eprintln!(
        "ferry sync, jobs {jobs}:                 {:>7.1} µs/file median, {:>6.1} best",
        us(f_med),
        us(f_min)
    );
    eprintln!(
        "floor std File::create, 1 thread: {:>7.1} µs/file median, {:>6.1} best (run right after each ferry run)",
        us(c_med),
        us(c_min)
    );
    eprintln!("ferry / floor, paired:            {r_med:>7.2}x median");
    eprintln!(
        "(removing {} destination trees in {} now)",
        2 * next,
        dirs.as_ref()
            .map_or("-".into(), |d| d.1.path().display().to_string())
    );
}

criterion_group! {
    name = benches;
    config = config();
    targets = pool_benches, copy_benches
}
criterion_main!(benches);
