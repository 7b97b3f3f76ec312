//! bisync copies through the engine's file copy: `--bwlimit` paces its
//! bytes (the limiter grants every byte copied, in both directions), and a
//! new empty file is created without a temporary + rename.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_bisync::{BiAction, BiReporter, Journal, Options, Side};
use ferry_engine::bwlimit::Limiter;
use ferry_engine::Stats;
use ferry_local::LocalStore;

/// Counts errors; everything else is ignored.
#[derive(Default)]
struct Errors(AtomicU64);

impl BiReporter for Errors {
    fn action(&self, _: BiAction, _: Side, _: &[u8], _: Option<&[u8]>, _: u64) {}
    fn error(&self, _: &[u8], _: &io::Error) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn skip(&self, _: Side, _: &[u8], _: &str) {}
    fn note(&self, _: &str) {}
}

#[test]
fn bwlimit_paces_every_byte_bisync_copies() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(a.join("d")).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(a.join("d/x"), vec![7u8; 300_000]).unwrap();
    std::fs::write(a.join("y"), vec![8u8; 5_000]).unwrap();
    let stats = Stats::default();
    let mut j = Journal::open(&t.path().join("j.db"), ("a", "b")).unwrap();
    let rep = Errors::default();
    // A rate high enough not to slow the test: only the grants are counted.
    let opts = Options {
        jobs: 2,
        max_delete: 50,
        bwlimit: Some(Limiter::new(1 << 40)),
        ..Options::default()
    };
    let (sa, sb) = (LocalStore::new(&a, 2), LocalStore::new(&b, 2));
    let out = ferry_bisync::run(&sa, &sb, Some(&mut j), &opts, &rep, &stats)
        .unwrap_or_else(|r| panic!("refused: {}", r.0));
    assert_eq!(out.errors, 0);
    assert_eq!(out.bytes_copied, 305_000);
    let granted = opts.bwlimit.as_ref().unwrap().granted();
    assert_eq!(granted, 305_000, "every byte copied A → B is paced");
    // The other direction goes through the same limiter.
    std::fs::write(b.join("z"), vec![9u8; 70_000]).unwrap();
    let stats = Stats::default();
    let out = ferry_bisync::run(&sa, &sb, Some(&mut j), &opts, &rep, &stats)
        .unwrap_or_else(|r| panic!("refused: {}", r.0));
    assert_eq!((out.errors, out.bytes_copied), (0, 70_000));
    assert_eq!(opts.bwlimit.as_ref().unwrap().granted(), 375_000);
    assert_eq!(std::fs::read(a.join("z")).unwrap(), vec![9u8; 70_000]);
}
