//! The cases of renaming and removing: files, directories, whole trees, and
//! `make_dir` over what exists (re-exported by [`cases`](crate::cases)).

use std::collections::BTreeMap;
use std::io::ErrorKind;

use ferry_engine::store::Store;

use crate::cases::{assert_mtime, err_kind, stat_of, unless_unsupported};
use crate::{file_meta, names, put, put_from, read_all, root, show, Bytes, Fixture, T0};

// ------------------------------------------------------------------ rename

/// A file moves with its bytes and metadata, within a directory and to
/// another; a missing one is `NotFound`. (Or the store has no rename.)
pub fn rename_file<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let meta = file_meta(4, T0, 0o640);
    put_from(s, &r, c"a", &mut Bytes(b"data"), &meta).expect("put");
    let sub = s.make_dir(&r, c"sub").expect("make_dir");
    put(s, &sub, b"other", b"o").expect("put");
    let Some(()) = unless_unsupported(s.rename(&r, c"a", &r, c"b"), "rename") else {
        return;
    };
    assert_eq!(show(&names(s, &r)), ["b", "sub"]);
    assert_eq!(read_all(s, &r, b"b").expect("read"), b"data");
    let m = stat_of(s, &r, b"b");
    assert_mtime(fx, &m, T0, "renamed");
    if fx.keeps_mode() {
        assert_eq!(m.mode, 0o640);
    }
    s.rename(&r, c"b", &sub, c"c")
        .expect("rename to a subdirectory");
    assert_eq!(show(&names(s, &r)), ["sub"]);
    assert_eq!(show(&names(s, &sub)), ["c", "other"]);
    assert_eq!(read_all(s, &sub, b"c").expect("read"), b"data");
    assert_eq!(
        err_kind(s.rename(&r, c"nope", &r, c"x")),
        Some(ErrorKind::NotFound)
    );
    assert_eq!(show(&names(s, &r)), ["sub"]);
}

/// Rename never replaces: `AlreadyExists`, both entries as they were.
pub fn rename_refuses_existing<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"a", b"aaa").expect("put");
    put(s, &r, b"b", b"bb").expect("put");
    match s.rename(&r, c"a", &r, c"b") {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            eprintln!("rename: unsupported by this store: not checked")
        }
        other => panic!("rename over an existing file: {other:?}"),
    }
    assert_eq!(read_all(s, &r, b"a").expect("read"), b"aaa");
    assert_eq!(read_all(s, &r, b"b").expect("read"), b"bb");
}

/// A directory moves with its content, or the store says `Unsupported`
/// and leaves it.
pub fn rename_dir<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let d = s.make_dir(&r, c"d").expect("make_dir");
    put(s, &d, b"f", b"inside").expect("put");
    match s.rename(&r, c"d", &r, c"e") {
        Ok(()) => {
            assert_eq!(show(&names(s, &r)), ["e"]);
            let e = s.open_dir(&r, c"e").expect("open_dir");
            assert_eq!(read_all(s, &e, b"f").expect("read"), b"inside");
        }
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            eprintln!("rename of a directory: unsupported by this store ({e})");
            assert_eq!(show(&names(s, &r)), ["d"]);
            assert_eq!(read_all(s, &d, b"f").expect("read"), b"inside");
        }
        Err(e) => panic!("rename of a directory: {e} ({:?})", e.kind()),
    }
}

// ------------------------------------------------------------------ remove

/// Removing a file removes it alone.
pub fn remove_file<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"f", b"x").expect("put");
    put(s, &r, b"f2", b"y").expect("put");
    assert_eq!(s.remove(&r, c"f", false).expect("remove"), 1);
    assert_eq!(show(&names(s, &r)), ["f2"]);
    assert!(s.stat(&r, c"f").expect("stat").is_none());
}

/// A tree for the remove cases: `d/{f1, sub/{f2, f3}}` beside `dx` and
/// `d2/f4`, names that share `d`'s prefix and must stay. Returns the files
/// under `d` with their sizes.
fn removal_tree<S: Store>(s: &S, r: &S::Dir) -> BTreeMap<Vec<u8>, u64> {
    let d = s.make_dir(r, c"d").expect("make_dir");
    put(s, &d, b"f1", b"1").expect("put");
    let sub = s.make_dir(&d, c"sub").expect("make_dir");
    put(s, &sub, b"f2", b"22").expect("put");
    put(s, &sub, b"f3", b"333").expect("put");
    put(s, r, b"dx", b"x").expect("put");
    let d2 = s.make_dir(r, c"d2").expect("make_dir");
    put(s, &d2, b"f4", b"4").expect("put");
    [(&b"f1"[..], 1), (b"sub/f2", 2), (b"sub/f3", 3)]
        .into_iter()
        .map(|(n, z)| (n.to_vec(), z))
        .collect()
}

/// Removing a directory removes everything below it, and nothing beside.
pub fn remove_tree<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let files = removal_tree(s, &r);
    let n = s.remove(&r, c"d", true).expect("remove");
    assert!(n > files.len() as u64, "{n} removed");
    assert_eq!(show(&names(s, &r)), ["d2", "dx"]);
    let d2 = s.open_dir(&r, c"d2").expect("open_dir");
    assert_eq!(read_all(s, &d2, b"f4").expect("read"), b"4");
}

/// `remove_each` tells every file removed (path below the directory, size)
/// once, directories (size 0) after their content, the directory itself
/// last (empty path), and returns how many it told.
pub fn remove_each<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let files = removal_tree(s, &r);
    let mut told: Vec<(Vec<u8>, u64)> = Vec::new();
    let n = s
        .remove_each(&r, c"d", &mut |p, z| told.push((p.to_vec(), z)))
        .expect("remove_each");
    assert_eq!(n, told.len() as u64);
    assert_eq!(told.last(), Some(&(Vec::new(), 0)), "the directory last");
    let mut got_files = BTreeMap::new();
    for (i, (p, z)) in told.iter().enumerate() {
        if files.contains_key(p) {
            assert!(got_files.insert(p.clone(), *z).is_none(), "told twice");
        } else {
            assert_eq!(*z, 0, "{} is no file", String::from_utf8_lossy(p));
            let below: Vec<u8> = [p.as_slice(), b"/"].concat();
            assert!(
                told[..i]
                    .iter()
                    .filter(|(q, _)| q.starts_with(&below))
                    .count()
                    == files.keys().filter(|f| f.starts_with(&below)).count(),
                "{} told before its content",
                String::from_utf8_lossy(p)
            );
        }
    }
    assert_eq!(got_files, files);
    if s.features().empty_dirs {
        assert!(told.iter().any(|(p, _)| p == b"sub"), "sub not told");
    }
    assert_eq!(show(&names(s, &r)), ["d2", "dx"]);
}

/// Removing a missing entry changes nothing; it fails, if at all, with
/// `NotFound` (object stores delete idempotently).
pub fn remove_missing<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"keep", b"k").expect("put");
    for is_dir in [false, true] {
        match s.remove(&r, c"nope", is_dir) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
        }
    }
    assert_eq!(show(&names(s, &r)), ["keep"]);
}

/// `rmdir` removes an empty directory and refuses (`DirectoryNotEmpty`)
/// one that is not, losing nothing.
pub fn rmdir<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    s.make_dir(&r, c"e").expect("make_dir");
    s.rmdir(&r, c"e").expect("rmdir empty");
    assert!(s.stat(&r, c"e").expect("stat").is_none());
    let full = s.make_dir(&r, c"full").expect("make_dir");
    put(s, &full, b"f", b"x").expect("put");
    assert_eq!(
        err_kind(s.rmdir(&r, c"full")),
        Some(ErrorKind::DirectoryNotEmpty)
    );
    assert_eq!(read_all(s, &full, b"f").expect("read"), b"x");
    assert_eq!(show(&names(s, &r)), ["full"]);
}

/// Making a directory that exists: `AlreadyExists` where directories are
/// entries of their own (a prefix on an object store is made by nothing);
/// its content stays.
pub fn make_dir_exists<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let d = s.make_dir(&r, c"d").expect("make_dir");
    put(s, &d, b"f", b"x").expect("put");
    let again = s.make_dir(&r, c"d");
    if s.features().empty_dirs {
        assert_eq!(err_kind(again), Some(ErrorKind::AlreadyExists));
    } else {
        again.expect("make_dir of an existing prefix");
    }
    assert_eq!(read_all(s, &d, b"f").expect("read"), b"x");
}
