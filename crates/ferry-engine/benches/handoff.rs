//! Lesson 4 of DESIGN.md: no spinning, no lost wake-ups.
//!
//! A consumer waits on a slow producer through the engine's hand-off, the
//! worker pool (`ferry_engine::pool::Pool`): one pool task is the producer,
//! which pushes a task every 2 ms (a timed sleep in the producer), 200 tasks;
//! the other worker(s) block in the pool waiting for them. Criterion times
//! one such run (wall: 200 x 2 ms plus sleep overshoot and hand-off latency).
//!
//! Extra figures (stderr): CPU used by the whole process per second of
//! waiting (sum over all its threads of /proc/self/task/*/schedstat, in ns,
//! read by the producer at the start and end of its loop; median run), the
//! same without the producer thread (its own timer wake-ups and pushes), and the push → start latency of each task
//! (p50/p99/max, and how many took >= 2 ms: a lost wake-up is only caught
//! by the next push, so it would show there; so does a scheduling delay on a
//! loaded machine). For reference, the
//! same through `std::sync::mpsc::sync_channel` and through a consumer that
//! busy-polls (what spinning looks like: ~1000 ms/s).
//!
//! Run: `cargo bench -p ferry-engine --bench handoff -- --warm-up-time 1 --measurement-time 3`

use parking_lot::Mutex;
use std::cell::RefCell;
use std::sync::mpsc::{self, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};
use ferry_engine::pool::Pool;

const TASKS: usize = 200;
const INTERVAL: Duration = Duration::from_millis(2);

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// First field of a schedstat file: ns spent on a CPU.
fn schedstat_ns(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU ns used so far by all live threads of this process.
fn process_cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|e| e.ok())
        .map(|e| schedstat_ns(&format!("{}/schedstat", e.path().display())))
        .sum()
}

fn thread_cpu_ns() -> u64 {
    schedstat_ns("/proc/thread-self/schedstat")
}

#[derive(Default)]
struct Waiting {
    wall: Duration,
    /// CPU ns of the whole process during the producer's loop.
    cpu: u64,
    /// CPU ns of the producer thread itself.
    cpu_producer: u64,
}

/// The producer: `TASKS` pushes, `INTERVAL` apart, measured.
fn produce(push: impl Fn()) -> Waiting {
    // Let the consumers reach their wait before the clock starts.
    thread::sleep(INTERVAL);
    let t0 = Instant::now();
    let all0 = process_cpu_ns();
    let me0 = thread_cpu_ns();
    for _ in 0..TASKS {
        thread::sleep(INTERVAL);
        push();
    }
    // The last task is handed off and done well within one interval.
    thread::sleep(INTERVAL);
    let me1 = thread_cpu_ns();
    let all1 = process_cpu_ns();
    Waiting {
        wall: t0.elapsed(),
        cpu: all1.saturating_sub(all0),
        cpu_producer: me1.saturating_sub(me0),
    }
}

struct Run {
    waiting: Waiting,
    latencies: Vec<Duration>,
}

enum Job {
    Producer,
    Item(Instant),
}

/// One run through the pool with `workers` threads (one is the producer).
fn pool_run(workers: usize) -> Run {
    let pool = Pool::new();
    let lat = Mutex::new(Vec::with_capacity(TASKS));
    let waiting = Mutex::new(None);
    pool.push(Job::Producer);
    pool.run(workers, |job, p| match job {
        Job::Producer => {
            let w = produce(|| p.push(Job::Item(Instant::now())));
            *waiting.lock() = Some(w);
        }
        Job::Item(at) => lat.lock().push(at.elapsed()),
    });
    Run {
        waiting: waiting.into_inner().expect("producer ran"),
        latencies: lat.into_inner(),
    }
}

/// Reference: a bounded std channel, consumer blocking in `recv`.
fn mpsc_run() -> Run {
    let (tx, rx) = mpsc::sync_channel::<Instant>(16);
    thread::scope(|s| {
        let consumer = s.spawn(move || rx.iter().map(|at| at.elapsed()).collect::<Vec<_>>());
        let waiting = produce(|| tx.send(Instant::now()).unwrap());
        drop(tx);
        Run {
            waiting,
            latencies: consumer.join().unwrap(),
        }
    })
}

/// Reference: what spinning looks like (a consumer busy-polling `try_recv`).
fn spin_run() -> Run {
    let (tx, rx) = mpsc::sync_channel::<Instant>(16);
    thread::scope(|s| {
        let consumer = s.spawn(move || {
            let mut v = Vec::with_capacity(TASKS);
            loop {
                match rx.try_recv() {
                    Ok(at) => v.push(at.elapsed()),
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                    Err(TryRecvError::Disconnected) => return v,
                }
            }
        });
        let waiting = produce(|| tx.send(Instant::now()).unwrap());
        drop(tx);
        Run {
            waiting,
            latencies: consumer.join().unwrap(),
        }
    })
}

fn summarize<'a>(name: &str, runs: impl IntoIterator<Item = &'a Run>) {
    let runs: Vec<&Run> = runs.into_iter().collect();
    if runs.is_empty() {
        return;
    }
    let wall: f64 = runs.iter().map(|r| r.waiting.wall.as_secs_f64()).sum();
    // CPU ms per second of waiting, each run on its own; the median run is
    // reported (a loaded, shared machine makes some runs much worse).
    let median = |f: &dyn Fn(&Waiting) -> u64| {
        let mut v: Vec<f64> = runs
            .iter()
            .map(|r| f(&r.waiting) as f64 / 1e6 / r.waiting.wall.as_secs_f64())
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let all = median(&|w| w.cpu);
    let consumer = median(&|w| w.cpu.saturating_sub(w.cpu_producer));
    // CPU per hand-off, consumer side.
    let per = consumer * 1e3 * wall / runs.len() as f64 / TASKS as f64;
    let mut lat: Vec<Duration> = runs
        .iter()
        .flat_map(|r| r.latencies.iter().copied())
        .collect();
    for r in &runs {
        assert_eq!(r.latencies.len(), TASKS, "{name}: tasks lost");
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    let late = lat.iter().filter(|d| **d >= INTERVAL).count();
    eprintln!(
        "{name:22} {:>2} runs, {:>5.2} s waited: CPU ms/s {all:>6.1} all, {consumer:>6.1} w/o producer (~{per:.0} µs/hand-off); latency µs p50 {:>5.0} p99 {:>5.0} max {:>5.0}, {late}/{} >= {} ms",
        runs.len(),
        wall,
        pct(0.5),
        pct(0.99),
        pct(1.0),
        lat.len(),
        INTERVAL.as_millis()
    );
}

fn handoff_benches(c: &mut Criterion) {
    let runs: RefCell<Vec<(usize, Run)>> = RefCell::new(Vec::new());
    let mut g = c.benchmark_group("handoff");
    g.sampling_mode(SamplingMode::Flat);
    for workers in [2usize, 4] {
        g.bench_function(BenchmarkId::new("pool_200x2ms", workers), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    let r = pool_run(workers);
                    runs.borrow_mut().push((workers, r));
                }
                t.elapsed()
            })
        });
    }
    g.finish();
    if runs.borrow().is_empty() {
        return; // filtered out or --list
    }

    eprintln!(
        "\n== handoff: {TASKS} tasks pushed {} ms apart, consumer waiting (CPU per second of waiting; goal ~0) ==",
        INTERVAL.as_millis()
    );
    let runs = runs.into_inner();
    for workers in [2usize, 4] {
        summarize(
            &format!("pool, {workers} workers"),
            runs.iter().filter(|(w, _)| *w == workers).map(|(_, r)| r),
        );
    }
    summarize("ref: mpsc sync_channel", &[mpsc_run()]);
    summarize("ref: spinning try_recv", &[spin_run()]);
}

criterion_group! {
    name = benches;
    config = config();
    targets = handoff_benches
}
criterion_main!(benches);
