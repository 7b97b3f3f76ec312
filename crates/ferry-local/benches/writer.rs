//! Few, large syscalls.
//!
//! Two write patterns of ~100 MiB each:
//! * `svn`: the svn-import pattern, writes of 9, 5 and 86,000 bytes repeated;
//! * `4k`: a stream of 4 KiB writes,
//!
//! through `ferry_local::write::Coalescer` (256 KiB), std `BufWriter`
//! (default 8 KiB and 256 KiB) and unbuffered `write_all`. Criterion times
//! the writes into a real file in /tmp (an unnamed O_TMPFILE, truncated
//! between iterations, no fsync); a counting sink counts the write calls
//! (`write` + `write_vectored`, i.e. syscalls on a file) once per writer.
//!
//! Extra figures (stderr): write calls per ~100 MiB vs the minimum
//! ceil(bytes / 256 KiB) and throughput. Goal: the Coalescer within 1.1x of
//! the minimum.
//!
//! Run: `cargo bench -p ferry-local --bench writer -- --warm-up-time 1 --measurement-time 3`

use std::cell::RefCell;
use std::io::{self, BufWriter, IoSlice, Seek, Write};
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use ferry_local::write::{Coalescer, DEFAULT_CAPACITY};

const TARGET: u64 = 100 * 1024 * 1024;
const BIG: usize = 86_000;

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

#[derive(Clone, Copy)]
enum Pattern {
    /// 9, 5, 86,000 bytes, repeated.
    Svn,
    /// 4 KiB writes.
    Small4k,
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Svn => "svn_9_5_86000",
            Pattern::Small4k => "4k",
        }
    }

    fn bytes(self) -> u64 {
        match self {
            Pattern::Svn => TARGET / (9 + 5 + BIG as u64) * (9 + 5 + BIG as u64),
            Pattern::Small4k => TARGET / 4096 * 4096,
        }
    }

    fn feed(self, w: &mut impl Write, data: &[u8]) -> io::Result<()> {
        match self {
            Pattern::Svn => {
                for _ in 0..TARGET / (9 + 5 + BIG as u64) {
                    w.write_all(&data[..9])?;
                    w.write_all(&data[9..14])?;
                    w.write_all(&data[..BIG])?;
                }
            }
            Pattern::Small4k => {
                for _ in 0..TARGET / 4096 {
                    w.write_all(&data[..4096])?;
                }
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Writer {
    Coalescer,
    BufWriter8k,
    BufWriter256k,
    Unbuffered,
}

const WRITERS: [Writer; 4] = [
    Writer::Coalescer,
    Writer::BufWriter8k,
    Writer::BufWriter256k,
    Writer::Unbuffered,
];

impl Writer {
    fn name(self) -> &'static str {
        match self {
            Writer::Coalescer => "coalescer_256k",
            Writer::BufWriter8k => "bufwriter_8k",
            Writer::BufWriter256k => "bufwriter_256k",
            Writer::Unbuffered => "unbuffered",
        }
    }

    /// Write the pattern through this writer into `inner`, flushed.
    fn run<W: Write>(self, p: Pattern, inner: W, data: &[u8]) -> io::Result<W> {
        match self {
            Writer::Coalescer => {
                let mut w = Coalescer::new(inner);
                p.feed(&mut w, data)?;
                w.into_inner()
            }
            Writer::BufWriter8k => {
                let mut w = BufWriter::new(inner);
                p.feed(&mut w, data)?;
                w.into_inner().map_err(|e| e.into_error())
            }
            Writer::BufWriter256k => {
                let mut w = BufWriter::with_capacity(DEFAULT_CAPACITY, inner);
                p.feed(&mut w, data)?;
                w.into_inner().map_err(|e| e.into_error())
            }
            Writer::Unbuffered => {
                let mut w = inner;
                p.feed(&mut w, data)?;
                Ok(w)
            }
        }
    }
}

/// Counts write calls (each would be one syscall on a file) and bytes.
#[derive(Default)]
struct Counting {
    calls: u64,
    bytes: u64,
}

impl Write for Counting {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.calls += 1;
        self.bytes += b.len() as u64;
        Ok(b.len())
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        self.calls += 1;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn writer_benches(c: &mut Criterion) {
    let data: Vec<u8> = (0..BIG).map(|i| (i * 7 + 1) as u8).collect();
    let file = tempfile::tempfile_in("/tmp").expect("temp file in /tmp");
    let samples: RefCell<Vec<(String, f64)>> = RefCell::new(Vec::new());

    for p in [Pattern::Svn, Pattern::Small4k] {
        let mut g = c.benchmark_group(format!("writer/{}", p.name()));
        g.sampling_mode(SamplingMode::Flat);
        g.throughput(Throughput::Bytes(p.bytes()));
        for w in WRITERS {
            let key = format!("{}/{}", p.name(), w.name());
            g.bench_function(BenchmarkId::new("file", w.name()), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        file.set_len(0).expect("truncate");
                        (&file).rewind().expect("rewind");
                        let t = Instant::now();
                        w.run(p, &file, &data).expect("write");
                        let d = t.elapsed();
                        total += d;
                        samples.borrow_mut().push((key.clone(), d.as_secs_f64()));
                    }
                    total
                })
            });
        }
        g.finish();
    }
    let _ = file.set_len(0);
    if samples.borrow().is_empty() {
        return; // filtered out or --list
    }

    eprintln!("\n== writer: write calls (syscalls on a file) per pattern, counting sink ==");
    eprintln!(
        "{:14} {:15} {:>11} {:>8} {:>6} {:>9} {:>12}",
        "pattern", "writer", "bytes", "calls", "min", "x min", "file MB/s"
    );
    for p in [Pattern::Svn, Pattern::Small4k] {
        for w in WRITERS {
            let sink = w.run(p, Counting::default(), &data).expect("sink");
            assert_eq!(sink.bytes, p.bytes());
            let min = sink.bytes.div_ceil(DEFAULT_CAPACITY as u64);
            let key = format!("{}/{}", p.name(), w.name());
            let mut v: Vec<f64> = samples
                .borrow()
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, s)| *s)
                .collect();
            v.sort_by(f64::total_cmp);
            let mbs = v
                .get(v.len() / 2)
                .map(|s| format!("{:.0}", sink.bytes as f64 / s / 1e6))
                .unwrap_or_else(|| "-".into());
            eprintln!(
                "{:14} {:15} {:>11} {:>8} {:>6} {:>8.2}x {:>12}",
                p.name(),
                w.name(),
                sink.bytes,
                sink.calls,
                min,
                sink.calls as f64 / min as f64,
                mbs
            );
        }
    }
    eprintln!("(min = ceil(bytes / 256 KiB); MB/s = median of the timed iterations into the file, 1 MB = 1e6 B)");
}

criterion_group! {
    name = benches;
    config = config();
    targets = writer_benches
}
criterion_main!(benches);
