//! bisync's scan checks identities itself (issue 28, §3): called directly
//! (no up-front check of the command line), a replica that is a bind mount
//! of the other's subdirectory is refused during the scan, before anything
//! is copied (`bisync --resync w A` with `w` bound to `A/sub` grew A on
//! every run). Needs root (mount).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use ferry_bisync::{BiAction, BiReporter, Journal, Options, Side};
use ferry_engine::Stats;
use ferry_local::LocalStore;

struct Quiet;

impl BiReporter for Quiet {
    fn action(&self, _: BiAction, _: Side, _: &[u8], _: Option<&[u8]>, _: u64) {}
    fn error(&self, _: &[u8], _: &io::Error) {}
    fn skip(&self, _: Side, _: &[u8], _: &str) {}
    fn note(&self, _: &str) {}
}

/// `mount --bind from to`, unmounted when dropped.
struct Bind(PathBuf);

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn bind(from: &Path, to: &Path) -> Option<Bind> {
    fs::create_dir_all(to).unwrap();
    let ok = std::process::Command::new("mount")
        .arg("--bind")
        .arg(from)
        .arg(to)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: `mount --bind` is not possible here (not root?)");
    }
    ok.then(|| Bind(to.to_path_buf()))
}

fn names(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().to_path_buf());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_replica_seen_again_in_the_other_is_refused_by_the_scan() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("A");
    fs::create_dir_all(a.join("sub/deep")).unwrap();
    fs::write(a.join("top"), "t").unwrap();
    fs::write(a.join("sub/in"), "i").unwrap();
    let w = t.path().join("w");
    let before = names(&a);
    {
        let Some(_m) = bind(&a.join("sub"), &w) else {
            return;
        };
        for (x, y, says) in [
            (&w, &a, "B sub: the same directory as A"),
            (&a, &w, "A sub: the same directory as B"),
        ] {
            let (sx, sy) = (LocalStore::new(x, 2), LocalStore::new(y, 2));
            let mut j = Journal::open(&t.path().join("j.db"), ("x", "y")).unwrap();
            let opts = Options {
                jobs: 2,
                max_delete: 50,
                resync: true,
                ..Options::default()
            };
            let stats = Stats::default();
            let r = ferry_bisync::run(&sx, &sy, Some(&mut j), &opts, &Quiet, &stats);
            let e = r.expect_err("refused").0;
            assert!(e.contains(says), "{e}");
        }
    }
    assert_eq!(names(&a), before);
}
