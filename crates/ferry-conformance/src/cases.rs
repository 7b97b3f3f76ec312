//! The cases of the suite, one function each; [`suite!`](crate::suite)
//! makes each a test. Every case starts from the fixture's empty root.
//! Listing, stat, reads, writes and metadata are here; renames and removals
//! in `tree.rs`, the edges (odd names, a big file, refusals, reads ahead) in
//! `edge.rs`, keeps in `keep.rs`: all re-exported here, the one list
//! [`suite!`](crate::suite) names.

use std::io::{self, ErrorKind};

use ferry_engine::entry::{Kind, Meta};
use ferry_engine::store::{is_temp_name, MetaChange, SourceFile, Store, StoreExt, RANGE_PIECE};

pub use crate::edge::{big_file, long_name, odd_names, permission_denied, read_ahead};
pub use crate::keep::{
    keep_makes_parents, keep_outside, keep_overwrites, keep_refuses_existing, keep_removed,
    keep_replaced, keep_symlink,
};
pub use crate::tree::{
    make_dir_exists, remove_each, remove_file, remove_missing, remove_tree, rename_dir,
    rename_file, rename_refuses_existing, rmdir,
};
use crate::{
    c, file_meta, list, names, put, put_from, read_all, root, show, Bytes, Fixture, Pattern, T0,
};

/// The kind of the error of `r`, `None` when it succeeded.
pub(crate) fn err_kind<T>(r: io::Result<T>) -> Option<ErrorKind> {
    r.err().map(|e| e.kind())
}

/// `r`'s value; `None` (and a line saying so) when the store answered
/// `Unsupported`, which it may for `what`.
#[track_caller]
pub(crate) fn unless_unsupported<T>(r: io::Result<T>, what: &str) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            eprintln!("{what}: unsupported by this store ({e}): not checked");
            None
        }
        Err(e) => panic!("{what}: {e} ({:?})", e.kind()),
    }
}

/// `m`'s mtime as the store keeps it (truncated to its step).
fn kept(fx: &impl Fixture, m: (i64, u32)) -> (i64, u32) {
    let step = fx.mtime_step_ns().max(1);
    (m.0, m.1 - m.1 % step)
}

#[track_caller]
pub(crate) fn assert_mtime(fx: &impl Fixture, got: &Meta, want: (i64, u32), what: &str) {
    assert_eq!(
        (got.mtime_sec, got.mtime_nsec),
        kept(fx, want),
        "{what}: mtime"
    );
}

#[track_caller]
pub(crate) fn stat_of<S: Store>(s: &S, dir: &S::Dir, name: &[u8]) -> Meta {
    s.stat(dir, &c(name))
        .expect("stat")
        .unwrap_or_else(|| panic!("{} missing", String::from_utf8_lossy(name)))
}

pub(crate) fn owned(v: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = v.iter().map(|n| n.to_vec()).collect();
    v.sort();
    v
}

// ------------------------------------------------------------------ list

/// A fresh root lists nothing.
pub fn list_empty_root<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    assert_eq!(show(&names(s, &r)), Vec::<String>::new());
}

/// A listing comes sorted by name bytes, whatever the order of creation,
/// with each entry's kind and size.
pub fn list_sorted<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let files: [&[u8]; 12] = [
        b"b",
        b"B",
        b"a",
        b"a.b",
        b"a-b",
        b"a0",
        b"aa",
        b"~",
        b"Z",
        "\u{e9}".as_bytes(),
        b"_",
        b"1",
    ];
    for (i, n) in files.iter().enumerate() {
        put(s, &r, n, &Pattern::bytes(i as u64, i as u64)).expect("put");
    }
    let d = s.make_dir(&r, c"dir").expect("make_dir");
    put(s, &d, b"f", b"in dir").expect("put dir/f");
    let got = list(s, &r, b"");
    let mut want = owned(&files);
    want.push(b"dir".to_vec());
    want.sort();
    let got_names: Vec<Vec<u8>> = got.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(show(&got_names), show(&want));
    for (n, m) in &got {
        if n == b"dir" {
            assert_eq!(m.kind, Kind::Dir, "dir");
            continue;
        }
        let i = files.iter().position(|f| f == &n.as_slice()).unwrap() as u64;
        assert_eq!(
            (m.kind, m.size),
            (Kind::File, i),
            "{:?}",
            show(std::slice::from_ref(n))
        );
    }
}

/// Subdirectories list their own entries, and only those.
pub fn list_nested<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let a = s.make_dir(&r, c"a").expect("make_dir a");
    let b = s.make_dir(&a, c"b").expect("make_dir a/b");
    put(s, &b, b"deep", b"deep").expect("put");
    put(s, &a, b"x", b"x").expect("put");
    put(s, &a, b"b.txt", b"sibling sharing the prefix").expect("put");
    put(s, &r, b"top", b"top").expect("put");
    assert_eq!(show(&names(s, &r)), ["a", "top"]);
    let a = s.open_dir(&r, c"a").expect("open_dir a");
    let la = list(s, &a, b"a");
    let kinds: Vec<(String, Kind)> = la
        .iter()
        .map(|(n, m)| (String::from_utf8_lossy(n).into_owned(), m.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("b".to_string(), Kind::Dir),
            ("b.txt".to_string(), Kind::File),
            ("x".to_string(), Kind::File)
        ]
    );
    let b = s.open_dir(&a, c"b").expect("open_dir a/b");
    assert_eq!(show(&names(s, &b)), ["deep"]);
    assert_eq!(read_all(s, &b, b"deep").expect("read"), b"deep");
}

/// Names that are not UTF-8: kept byte for byte where names may be any
/// bytes, else refused (`InvalidInput`) without leaving anything.
pub fn list_odd_bytes<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let name: &[u8] = b"latin1 caf\xe9 \xff\xfe\x01end";
    let res = put(s, &r, name, b"odd");
    if fx.any_byte_names() {
        res.expect("put a name of any bytes");
        assert_eq!(names(s, &r), [name.to_vec()]);
        assert_eq!(read_all(s, &r, name).expect("read"), b"odd");
        assert_eq!(stat_of(s, &r, name).size, 3);
    } else {
        assert_eq!(err_kind(res), Some(ErrorKind::InvalidInput));
        assert_eq!(show(&names(s, &r)), Vec::<String>::new());
    }
}

/// An empty directory lists nothing; it is itself listed where the store
/// keeps empty directories, and nowhere else.
pub fn list_empty_dir<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let d = s.make_dir(&r, c"empty").expect("make_dir");
    assert_eq!(show(&names(s, &d)), Vec::<String>::new());
    let got = list(s, &r, b"");
    if s.features().empty_dirs {
        assert_eq!(got.len(), 1, "{:?}", got);
        assert_eq!(
            (got[0].0.as_slice(), got[0].1.kind),
            (&b"empty"[..], Kind::Dir)
        );
    } else {
        assert!(got.is_empty(), "an empty directory listed: {got:?}");
    }
}

/// More entries than one page of an S3 listing (1,000), files and
/// directories mixed: every one listed once, in order.
pub fn list_many<F: Fixture>(fx: &F) {
    const FILES: usize = 1100;
    const DIRS: usize = 12;
    let s = fx.store();
    let r = root(s);
    let mut want: Vec<Vec<u8>> = (0..FILES)
        .map(|i| format!("f{i:05}").into_bytes())
        .collect();
    want.extend((0..DIRS).map(|i| format!("f{:05}d", i * 97).into_bytes()));
    // Written from several threads: the many requests of a network store.
    std::thread::scope(|t| {
        for k in 0..8 {
            let (s, r, want) = (s, &r, &want);
            t.spawn(move || {
                for (i, n) in want.iter().enumerate().skip(k).step_by(8) {
                    if i < FILES {
                        put(s, r, n, &[b'x'; 3][..i % 4]).expect("put");
                    } else {
                        let d = s.make_dir(r, &c(n)).expect("make_dir");
                        put(s, &d, b"inside", b"i").expect("put inside");
                    }
                }
            });
        }
    });
    want.sort();
    let got = list(s, &r, b"");
    let got_names: Vec<Vec<u8>> = got.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(got_names.len(), want.len());
    assert!(got_names == want, "listing differs from what was written");
    for (n, m) in &got {
        let i: usize = std::str::from_utf8(&n[1..6]).unwrap().parse().unwrap();
        if n.len() == 7 {
            assert_eq!(m.kind, Kind::Dir);
        } else {
            assert_eq!((m.kind, m.size), (Kind::File, (i % 4) as u64));
        }
    }
}

// ------------------------------------------------------------------ stat

/// A file's kind, size, mtime and mode.
pub fn stat_file<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let meta = file_meta(5, T0, 0o640);
    put_from(s, &r, c"f", &mut Bytes(b"hello"), &meta).expect("put");
    let m = stat_of(s, &r, b"f");
    assert_eq!((m.kind, m.size), (Kind::File, 5));
    assert_mtime(fx, &m, T0, "stat");
    if fx.keeps_mode() {
        assert_eq!(m.mode, 0o640);
    }
}

/// A directory is never a file; it is one where the store keeps
/// directories as entries (object stores may know only its contents).
pub fn stat_dir<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let d = s.make_dir(&r, c"d").expect("make_dir");
    put(s, &d, b"f", b"x").expect("put");
    let m = s.stat(&r, c"d").expect("stat");
    if s.features().empty_dirs {
        assert_eq!(m.map(|m| m.kind), Some(Kind::Dir));
    } else {
        assert!(m.is_none_or(|m| m.kind == Kind::Dir), "{m:?}");
    }
}

/// A symlink is stat'ed and listed as itself (never followed) with its
/// target's length as size; a store without symlinks refuses to make one
/// (`Unsupported`) and lists nothing.
pub fn stat_symlink<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let target = b"no/such/target";
    let meta = Meta {
        kind: Kind::Symlink,
        size: target.len() as u64,
        ..file_meta(0, T0, 0o777)
    };
    let res = s.create_symlink(&r, c"l", target, &meta);
    if !s.has_symlinks() {
        assert_eq!(err_kind(res), Some(ErrorKind::Unsupported));
        assert_eq!(show(&names(s, &r)), Vec::<String>::new());
        return;
    }
    res.expect("create_symlink");
    let m = stat_of(s, &r, b"l");
    assert_eq!((m.kind, m.size), (Kind::Symlink, target.len() as u64));
    assert_mtime(fx, &m, T0, "symlink");
    assert_eq!(s.read_link(&r, c"l").expect("read_link"), target);
    let l = list(s, &r, b"");
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].1.kind, Kind::Symlink);
    // Replaced atomically by another.
    s.create_symlink(&r, c"l", b"other", &meta)
        .expect("replace symlink");
    assert_eq!(s.read_link(&r, c"l").expect("read_link"), b"other");
}

/// A missing name is `None`, at the root and below.
pub fn stat_missing<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    assert!(s.stat(&r, c"nope").expect("stat").is_none());
    let d = s.make_dir(&r, c"d").expect("make_dir");
    put(s, &d, b"x", b"x").expect("put");
    assert!(s.stat(&d, c"y").expect("stat").is_none());
    assert!(s.stat(&d, c"x.").expect("stat").is_none());
}

// ------------------------------------------------------------------ read

/// Files read back byte for byte: empty, one byte, several buffers.
pub fn read_whole<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    for (name, len) in [
        (&b"empty"[..], 0u64),
        (b"one", 1),
        (b"some", (300 << 10) + 3),
    ] {
        let data = Pattern::bytes(len, len);
        put(s, &r, name, &data).expect("put");
        assert!(read_all(s, &r, name).expect("read") == data, "{name:?}");
        assert_eq!(stat_of(s, &r, name).size, len);
    }
}

/// Reading a missing file fails with `NotFound` (on open or first read).
pub fn read_missing<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    assert_eq!(
        err_kind(read_all(s, &r, b"nope")),
        Some(ErrorKind::NotFound)
    );
}

/// Ranged reads, where the reader offers them: any range, handed over in
/// order in pieces of at most [`RANGE_PIECE`]; a changed file is an error.
pub fn ranged_read<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let size = 3 * RANGE_PIECE as u64 + 5;
    let data = Pattern::bytes(size, 7);
    put(s, &r, b"f", &data).expect("put");
    let reader = s.open_file(&r, c"f").expect("open_file");
    let Some(rg) = reader.ranged() else {
        eprintln!("ranged_read: this store's readers offer no ranged reads: not checked");
        return;
    };
    assert_eq!(rg.identity().expect("identity").0, size);
    let piece = RANGE_PIECE as u64;
    for (off, len) in [
        (0, 1),
        (0, size),
        (piece - 1, 3),
        (size - 7, 7),
        (123_457, piece + 17),
        (5, 0),
    ] {
        let mut next = off;
        rg.read_range(
            off,
            len,
            &mut |at, bytes| {
                assert_eq!(at, next, "pieces in order");
                assert!(!bytes.is_empty() && bytes.len() <= RANGE_PIECE);
                let want = &data[at as usize..at as usize + bytes.len()];
                assert!(bytes == want, "bytes of range at {at}");
                next += bytes.len() as u64;
                Ok(())
            },
            None,
        )
        .expect("read_range");
        assert_eq!(next, off + len, "range ({off}, {len}) complete");
    }
    // The content changes: the old reader's ranges fail, not mix versions.
    put(s, &r, b"f", &Pattern::bytes(size, 8)).expect("rewrite");
    let res = rg.read_range(0, 10, &mut |_, _| Ok(()), None);
    assert!(res.is_err(), "a range of a replaced file was read");
}

// ------------------------------------------------------------------ write

/// A new file: its bytes and metadata; `meta_after_commit`, when the store
/// tells it, is what `stat` finds.
pub fn write_new<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let meta = file_meta(10, (1_500_000_000, 987_654_321), 0o600);
    put_from(s, &r, c"new", &mut Bytes(b"0123456789"), &meta).expect("put");
    assert_eq!(show(&names(s, &r)), ["new"]);
    assert_eq!(read_all(s, &r, b"new").expect("read"), b"0123456789");
    let m = stat_of(s, &r, b"new");
    assert_eq!((m.kind, m.size), (Kind::File, 10));
    assert_mtime(fx, &m, (1_500_000_000, 987_654_321), "stat");
    if let Some(after) = s.meta_after_commit(&meta) {
        assert_eq!(
            (after.kind, after.size, after.mtime_sec, after.mtime_nsec),
            (m.kind, m.size, m.mtime_sec, m.mtime_nsec)
        );
        if fx.keeps_mode() {
            assert_eq!(after.mode, m.mode);
        }
    }
}

/// Committing over an existing file replaces it whole: until the commit the
/// old content is what a reader sees, after it the new one.
pub fn commit_replaces<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"f", b"old content, longer").expect("put");
    let meta = file_meta(3, (1_700_000_000, 5), 0o644);
    let mut w = s.create_file(&r, c"f", &meta).expect("create_file");
    assert_eq!(
        s.write_from(&r, &mut w, &mut Bytes(b"new"), 3, None)
            .expect("write_from"),
        3
    );
    assert_eq!(read_all(s, &r, b"f").expect("read"), b"old content, longer");
    s.commit(&r, w, c"f", &meta, true).expect("commit");
    assert_eq!(read_all(s, &r, b"f").expect("read"), b"new");
    let m = stat_of(s, &r, b"f");
    assert_eq!(m.size, 3);
    assert_mtime(fx, &m, (1_700_000_000, 5), "replaced");
    assert_eq!(show(&names(s, &r)), ["f"]);
}

/// An aborted writer leaves nothing: no new file, no temporary, the file it
/// would have replaced as it was.
pub fn abort_leaves_nothing<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let meta = file_meta(4, T0, 0o644);
    let mut w = s.create_file(&r, c"n", &meta).expect("create_file");
    s.write_from(&r, &mut w, &mut Bytes(b"data"), 4, None)
        .expect("write_from");
    s.abort(&r, w);
    assert_eq!(show(&names(s, &r)), Vec::<String>::new());
    put(s, &r, b"keep", b"kept").expect("put");
    let mut w = s.create_file(&r, c"keep", &meta).expect("create_file");
    s.write_from(&r, &mut w, &mut Bytes(b"gone"), 4, None)
        .expect("write_from");
    s.abort(&r, w);
    assert_eq!(show(&names(s, &r)), ["keep"]);
    assert_eq!(read_all(s, &r, b"keep").expect("read"), b"kept");
}

/// Files being written never show under a user's name: whatever a listing
/// shows of them is one of ferry's reserved names.
pub fn temporaries_are_reserved<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"keep", b"old").expect("put");
    let meta = file_meta(5, T0, 0o644);
    let mut open = Vec::new();
    for n in [&b"n1"[..], b"n2", b"keep"] {
        let mut w = s.create_file(&r, &c(n), &meta).expect("create_file");
        s.write_from(&r, &mut w, &mut Bytes(b"12345"), 5, None)
            .expect("write_from");
        open.push((n, w));
    }
    for n in names(s, &r) {
        assert!(
            n == b"keep" || is_temp_name(&n),
            "{:?} listed while written",
            String::from_utf8_lossy(&n)
        );
    }
    for (n, w) in open {
        s.commit(&r, w, &c(n), &meta, false).expect("commit");
    }
    assert_eq!(show(&names(s, &r)), ["keep", "n1", "n2"]);
    assert_eq!(read_all(s, &r, b"keep").expect("read"), b"12345");
}

/// `create_empty` makes an empty file with its metadata, or declines
/// (`false`) and makes nothing; it never touches an existing file.
pub fn create_empty<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let meta = file_meta(0, T0, 0o640);
    if s.create_empty(&r, c"e", &meta, false)
        .expect("create_empty")
    {
        let m = stat_of(s, &r, b"e");
        assert_eq!((m.kind, m.size), (Kind::File, 0));
        assert_mtime(fx, &m, T0, "empty");
        if fx.keeps_mode() {
            assert_eq!(m.mode, 0o640);
        }
    } else {
        eprintln!("create_empty: no shortcut in this store");
        assert_eq!(show(&names(s, &r)), Vec::<String>::new());
        put_from(s, &r, c"e", &mut Bytes(b""), &meta).expect("empty file");
        assert_eq!(stat_of(s, &r, b"e").size, 0);
    }
    put(s, &r, b"full", b"content").expect("put");
    assert!(!s
        .create_empty(&r, c"full", &meta, false)
        .expect("create_empty over a file"));
    assert_eq!(read_all(s, &r, b"full").expect("read"), b"content");
    assert!(read_all(s, &r, b"e").expect("read").is_empty());
}

// ------------------------------------------------------------------ metadata

/// Modification times to the precision the store keeps, before the epoch
/// and far after it too, as written and as changed by `set_meta`.
pub fn meta_mtime<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let times = [
        T0,
        (0, 0),
        (1, 999_999_999),
        (-1, 500_000_000),
        (-315_360_000, 250_000_000),
        (4_102_444_800, 1),
    ];
    let times: Vec<_> = times
        .into_iter()
        .filter(|t| t.0 >= 0 || fx.keeps_times_before_epoch())
        .collect();
    for (i, t) in times.iter().enumerate() {
        let name = format!("t{i}").into_bytes();
        let meta = file_meta(1, *t, 0o644);
        put_from(s, &r, &c(&name), &mut Bytes(b"x"), &meta).expect("put");
        assert_mtime(fx, &stat_of(s, &r, &name), *t, &format!("written {t:?}"));
    }
    if !s.features().approximate_meta {
        for (i, (_, m)) in list(s, &r, b"").iter().enumerate() {
            assert_mtime(fx, m, times[i], &format!("listed {:?}", times[i]));
        }
    }
    let later = (1_650_000_000, 42);
    let meta = file_meta(1, later, 0o644);
    let change = MetaChange {
        mtime: true,
        ..MetaChange::default()
    };
    s.set_meta(&r, c"t0", &meta, change).expect("set_meta");
    assert_mtime(fx, &stat_of(s, &r, b"t0"), later, "set_meta");
    assert_eq!(read_all(s, &r, b"t0").expect("read"), b"x");
}

/// Permission bits, where the store keeps them, as written and as changed.
pub fn meta_mode<F: Fixture>(fx: &F) {
    if !fx.keeps_mode() {
        eprintln!("meta_mode: this store keeps no modes: not checked");
        return;
    }
    let s = fx.store();
    let r = root(s);
    for mode in [0o600, 0o755, 0o640, 0o444, 0o4755] {
        let name = format!("m{mode:o}").into_bytes();
        let meta = file_meta(1, T0, mode);
        put_from(s, &r, &c(&name), &mut Bytes(b"x"), &meta).expect("put");
        assert_eq!(stat_of(s, &r, &name).mode, mode, "{mode:o}");
    }
    let change = MetaChange {
        mode: true,
        ..MetaChange::default()
    };
    s.set_meta(&r, c"m600", &file_meta(1, T0, 0o751), change)
        .expect("set_meta");
    assert_eq!(stat_of(s, &r, b"m600").mode, 0o751);
}

/// A directory's own mtime and mode, where directories have them (set once
/// its content is complete, as the engine does).
pub fn meta_dir<F: Fixture>(fx: &F) {
    let s = fx.store();
    if !s.features().dir_meta {
        eprintln!("meta_dir: directories have no metadata in this store: not checked");
        return;
    }
    let r = root(s);
    let d = s.make_dir(&r, c"d").expect("make_dir");
    put(s, &d, b"f", b"x").expect("put");
    let meta = Meta {
        kind: Kind::Dir,
        ..file_meta(0, (1_400_000_000, 777), 0o750)
    };
    let all = MetaChange {
        mtime: true,
        mode: true,
        owner: false,
    };
    s.set_dir_meta(&d, &meta, all).expect("set_dir_meta");
    let m = stat_of(s, &r, b"d");
    assert_eq!(m.kind, Kind::Dir);
    assert_mtime(fx, &m, (1_400_000_000, 777), "dir");
    assert_eq!(m.mode, 0o750);
    let (_, listed) = &list(s, &r, b"")[0];
    assert_eq!((listed.mtime_sec, listed.mode), (1_400_000_000, 0o750));
}

/// Owner and group, where the store preserves them.
pub fn meta_owner<F: Fixture>(fx: &F) {
    let s = fx.store();
    if !s.features().preserves_owner {
        eprintln!("meta_owner: this store keeps no owners (here): not checked");
        return;
    }
    let r = root(s);
    let meta = Meta {
        uid: 1234,
        gid: 5678,
        ..file_meta(1, T0, 0o644)
    };
    put_from(s, &r, c"f", &mut Bytes(b"x"), &meta).expect("put");
    let m = stat_of(s, &r, b"f");
    assert_eq!((m.uid, m.gid), (1234, 5678));
    let change = MetaChange {
        owner: true,
        ..MetaChange::default()
    };
    let other = Meta {
        uid: 4321,
        gid: 8765,
        ..meta
    };
    s.set_meta(&r, c"f", &other, change).expect("set_meta");
    let m = stat_of(s, &r, b"f");
    assert_eq!((m.uid, m.gid), (4321, 8765));
}
