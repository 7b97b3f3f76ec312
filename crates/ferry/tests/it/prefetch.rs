//! Listings of a local tree made ahead of a run (`ferry_engine::prefetch`,
//! while the other side connects): the walk takes a directory's listing
//! made ahead only when the directory is the one it was made of (path,
//! device, inode, mtime), and lists it itself otherwise.

use std::fs::{File, FileTimes};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::*;
use ferry_engine::prefetch::Prefetch;
use ferry_engine::report::Quiet;
use ferry_engine::{Engine, Options, Stats};
use ferry_local::LocalStore;

/// `src` (d/a, d/b, e/c) listed ahead, every directory of it.
fn listed_ahead(src: &Path) -> Prefetch {
    let p = Prefetch::start(LocalStore::new(src, 2));
    let end = Instant::now() + Duration::from_secs(120);
    while p.listed() < 3 {
        assert!(Instant::now() < end, "not listed ahead: {}", p.listed());
        std::thread::sleep(Duration::from_millis(10));
    }
    p
}

fn tree(root: &Path) -> std::path::PathBuf {
    let src = root.join("src");
    for (f, data) in [("d/a", "1"), ("d/b", "2"), ("e/c", "3")] {
        let p = src.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    // Directories modified just before a listing are listed again by the
    // walk (`prefetch::RACY`): these were modified an hour ago.
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    for d in ["", "d", "e"] {
        File::open(src.join(d))
            .unwrap()
            .set_times(FileTimes::new().set_modified(old))
            .unwrap();
    }
    src
}

/// Copy `src` into `dst` with the engine, SRC's listings taken from `p`.
fn copy(src: &Path, dst: &Path, p: &Prefetch) {
    let (s, d) = (LocalStore::new(src, 2), LocalStore::new(dst, 2));
    let opts = Options {
        jobs: 2,
        ..Default::default()
    };
    let stats = Stats::default();
    let r = Engine::new(&s, &d, &opts, &stats, &Quiet)
        .prefetched(0, p)
        .run_tree()
        .unwrap();
    assert_eq!(r.errors, 0);
}

/// A directory whose listing was made ahead and that is the same when
/// the walk comes to it is not listed again: a file added in between with
/// the directory's mtime put back (the same directory, as far as anything
/// tells) is not in this run. (Without the listing made ahead, it would be.)
#[test]
fn the_walk_takes_a_listing_made_ahead_of_the_same_directory() {
    let t = tmpdir();
    let src = tree(t.path());
    let p = listed_ahead(&src);
    let d = src.join("d");
    let mtime = std::fs::metadata(&d).unwrap().modified().unwrap();
    std::fs::write(d.join("new"), "4").unwrap();
    File::open(&d)
        .unwrap()
        .set_times(FileTimes::new().set_modified(mtime))
        .unwrap();
    let dst = t.path().join("dst");
    copy(&src, &dst, &p);
    assert_eq!(std::fs::read(dst.join("d/a")).unwrap(), b"1");
    assert_eq!(std::fs::read(dst.join("e/c")).unwrap(), b"3");
    assert!(!dst.join("d/new").exists(), "listed again");
}

/// A directory changed since its listing was made ahead (its mtime) is
/// listed by the walk: what was added in between is copied, what was
/// removed is not looked for.
#[test]
fn a_directory_changed_since_it_was_listed_ahead_is_listed_again() {
    let t = tmpdir();
    let src = tree(t.path());
    let p = listed_ahead(&src);
    std::fs::write(src.join("d/new"), "4").unwrap();
    std::fs::remove_file(src.join("e/c")).unwrap();
    let dst = t.path().join("dst");
    copy(&src, &dst, &p);
    assert_eq!(std::fs::read(dst.join("d/new")).unwrap(), b"4");
    assert!(!dst.join("e/c").exists());
    assert_eq!(std::fs::read(dst.join("d/b")).unwrap(), b"2");
}
