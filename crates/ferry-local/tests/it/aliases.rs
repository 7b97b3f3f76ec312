//! The walk's own check of identities (issue 28, §3): with the engine
//! called directly (no up-front check of the command line), a directory
//! listed in SRC or DST that is a root, or above one, seen again through a
//! bind mount stops the run (a refusal) before it acts in that directory;
//! a recursive delete never goes through a mount point. Needs root (mount).

use std::fs;
use std::path::{Path, PathBuf};

use ferry_engine::report::Quiet;
use ferry_engine::{Engine, Mode, Options, Refused, Stats};
use ferry_local::LocalStore;

/// `mount --bind from to`, unmounted when dropped.
struct Bind(PathBuf);

impl Bind {
    fn new(from: &Path, to: &Path) -> Option<Bind> {
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
            return None;
        }
        Some(Bind(to.to_path_buf()))
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn opts(mode: Mode, keep: bool) -> Options {
    Options {
        mode,
        dry_run: false,
        checksum: false,
        fsync: false,
        jobs: 2,
        more_jobs: None,
        filter: None,
        bwlimit: None,
        max_delete: None,
        force: false,
        xattrs: Default::default(),
        hard_links: false,
        delta: Default::default(),
        keep_special_bits: false,
        keep: keep.then(|| {
            std::sync::Arc::new(ferry_engine::keep::Keeper::new(
                ferry_engine::keep::KeepRule::Suffix(b".old".to_vec()),
                0,
            ))
        }),
    }
}

/// Run the engine from `src` to `dst`: the errors it counted, or the
/// refusal's text.
fn run(src: &Path, dst: &Path, mode: Mode, keep: bool) -> Result<u64, String> {
    let (s, d) = (LocalStore::new(src, 2), LocalStore::new(dst, 2));
    let o = opts(mode, keep);
    let stats = Stats::default();
    match Engine::new(&s, &d, &o, &stats, &Quiet).run_tree() {
        Ok(sum) => Ok(sum.errors),
        Err(e) => Err(Refused::of(&e)
            .map(|r| r.0.clone())
            .unwrap_or_else(|| format!("not a refusal: {e}"))),
    }
}

/// Every file below `root` with its content (mounts not in place).
fn files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

fn tree(root: &Path) {
    for (rel, data) in [("top", "t"), ("sub/in", "i"), ("sub/deep/d", "d")] {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    }
}

#[test]
fn src_seen_again_in_dst_stops_the_run() {
    let t = tempfile::tempdir().unwrap();
    let v2 = t.path().join("v2");
    tree(&v2);
    let w = t.path().join("w");
    let before = files(&v2);
    {
        let Some(_m) = Bind::new(&v2.join("sub"), &w) else {
            return;
        };
        // SRC is DST's `sub`: sync used to delete it through DST.
        let e = run(&w, &v2, Mode::Sync, false).unwrap_err();
        assert!(e.contains("DST sub: the same directory as SRC"), "{e}");
    }
    assert_eq!(files(&v2), before);
}

#[test]
fn dst_seen_again_in_src_stops_the_run() {
    let t = tempfile::tempdir().unwrap();
    let v3 = t.path().join("v3");
    tree(&v3);
    let w = t.path().join("w");
    let before = files(&v3);
    {
        let Some(_m) = Bind::new(&v3.join("sub"), &w) else {
            return;
        };
        // DST is SRC's `sub`: copied into itself until the stack overflowed.
        let e = run(&v3, &w, Mode::Copy, false).unwrap_err();
        assert!(e.contains("SRC sub: the same directory as DST"), "{e}");
    }
    assert_eq!(files(&v3), before);
}

#[test]
fn a_root_seen_again_in_a_deleted_directory_stops_the_run() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("s"), t.path().join("d"));
    tree(&src);
    tree(&dst);
    fs::create_dir_all(dst.join("gone/m")).unwrap();
    let (bs, bd) = (files(&src), files(&dst));
    {
        let Some(_m) = Bind::new(&src, &dst.join("gone/m")) else {
            return;
        };
        // Entry by entry (a keeper): the listing of `gone` meets SRC.
        let e = run(&src, &dst, Mode::Sync, true).unwrap_err();
        assert!(e.contains("DST gone/m: the same directory as SRC"), "{e}");
        // Whole: never through a mount point (an error, not a refusal).
        assert_eq!(run(&src, &dst, Mode::Sync, false), Ok(1));
    }
    assert_eq!(files(&src), bs);
    assert_eq!(files(&dst), bd);
}
