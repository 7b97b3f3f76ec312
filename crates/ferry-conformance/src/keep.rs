//! The cases of [`KeepStore::keep`](ferry_engine::store::KeepStore::keep) (`--backup-dir`, `--suffix`, `--versions`):
//! a file kept for removal moves to its kept path with its bytes and
//! metadata; one kept before it is replaced stays there, untouched by the
//! commit that replaces the original; parents are made; an existing kept
//! entry is refused or replaced as asked; symlinks where the store has
//! them; a base outside the root. Every backend keeps entries
//! ([`KeepStore::keeps_at`](ferry_engine::store::KeepStore::keeps_at)).

use std::io::ErrorKind;

use ferry_engine::entry::{Kind, Meta};
use ferry_engine::keep::{KeepBase, KeepTo};
use ferry_engine::store::Store;
use ferry_engine::store::StoreExt;

use crate::cases::{assert_mtime, err_kind, stat_of};
use crate::{c, file_meta, names, put, put_from, read_all, root, show, Bytes, Fixture, T0};

fn to<'a>(base: &'a KeepBase, path: &'a [u8], overwrite: bool, replacing: bool) -> KeepTo<'a> {
    KeepTo {
        base,
        path,
        overwrite,
        replacing,
        planned: None,
    }
}

/// The directory at `/`-separated `path` below `dir`.
#[track_caller]
fn open_path<S: Store>(s: &S, dir: &S::Dir, path: &[u8]) -> S::Dir {
    let mut parts = path.split(|&b| b == b'/');
    let first = parts.next().expect("a path");
    let mut d = s.open_dir(dir, &c(first)).expect("open_dir");
    for p in parts {
        d = s.open_dir(&d, &c(p)).expect("open_dir");
    }
    d
}

fn root_base(p: &[u8]) -> KeepBase {
    KeepBase::Root(p.to_vec())
}

/// A file kept before its removal moves to its kept path below the root:
/// gone from its place, there with the same bytes, mtime and mode.
pub fn keep_removed<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let d = s.make_dir(&r, c"d").expect("make_dir");
    let meta = file_meta(5, T0, 0o640);
    put_from(s, &d, c"f", &mut Bytes(b"bytes"), &meta).expect("put");
    put(s, &d, b"g", b"stays").expect("put");
    let base = root_base(b"kept");
    assert!(s.can_keep(&base), "can_keep of a base below the root");
    s.keep_entry(&d, c"f", &to(&base, b"d/f", true, false))
        .expect("keep");
    assert_eq!(show(&names(s, &d)), ["g"]);
    let k = open_path(s, &r, b"kept/d");
    assert_eq!(show(&names(s, &k)), ["f"]);
    assert_eq!(read_all(s, &k, b"f").expect("read kept"), b"bytes");
    let m = stat_of(s, &k, b"f");
    assert_eq!((m.kind, m.size), (Kind::File, 5));
    assert_mtime(fx, &m, T0, "kept");
    if fx.keeps_mode() {
        assert_eq!(m.mode, 0o640, "kept mode");
    }
}

/// A file kept before it is replaced: its old bytes at the kept path, and
/// the commit that follows replaces the original without touching them
/// (the kept copy is independent of the new file).
pub fn keep_replaced<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"f", b"old bytes").expect("put");
    let base = root_base(b"bak");
    s.keep_entry(&r, c"f", &to(&base, b"f", true, true))
        .expect("keep");
    let b = open_path(s, &r, b"bak");
    assert_eq!(read_all(s, &b, b"f").expect("read kept"), b"old bytes");
    assert_mtime(fx, &stat_of(s, &b, b"f"), T0, "kept");
    let new = file_meta(3, (1_700_000_000, 0), 0o644);
    put_from(s, &r, c"f", &mut Bytes(b"new"), &new).expect("commit over the kept file");
    assert_eq!(read_all(s, &r, b"f").expect("read"), b"new");
    assert_eq!(read_all(s, &b, b"f").expect("read kept"), b"old bytes");
    assert_mtime(fx, &stat_of(s, &b, b"f"), T0, "kept after the commit");
    assert_eq!(show(&names(s, &r)), ["bak", "f"]);
    assert_eq!(show(&names(s, &b)), ["f"]);
}

/// The kept path's missing parents are made, however deep; a kept entry
/// may also go beside the original (`--suffix`: the root itself as base).
pub fn keep_makes_parents<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"f", b"deep").expect("put");
    put(s, &r, b"g", b"beside").expect("put");
    let base = root_base(b"a/b");
    s.keep_entry(&r, c"f", &to(&base, b"c/d/e/f", true, false))
        .expect("keep deep");
    let e = open_path(s, &r, b"a/b/c/d/e");
    assert_eq!(read_all(s, &e, b"f").expect("read kept"), b"deep");
    let here = root_base(b"");
    s.keep_entry(&r, c"g", &to(&here, b"g~", true, false))
        .expect("keep beside");
    assert_eq!(show(&names(s, &r)), ["a", "g~"]);
    assert_eq!(read_all(s, &r, b"g~").expect("read kept"), b"beside");
}

/// Without `overwrite`, an entry at the kept path is an `AlreadyExists`
/// and nothing changes, for a removal as for a replacement.
pub fn keep_refuses_existing<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    put(s, &r, b"f", b"current").expect("put");
    let b = s.make_dir(&r, c"v").expect("make_dir");
    put(s, &b, b"f", b"older").expect("put");
    let base = root_base(b"v");
    for replacing in [false, true] {
        assert_eq!(
            err_kind(s.keep_entry(&r, c"f", &to(&base, b"f", false, replacing))),
            Some(ErrorKind::AlreadyExists),
            "replacing: {replacing}"
        );
        assert_eq!(read_all(s, &r, b"f").expect("read"), b"current");
        assert_eq!(read_all(s, &b, b"f").expect("read"), b"older");
        assert_eq!(show(&names(s, &r)), ["f", "v"]);
        assert_eq!(show(&names(s, &b)), ["f"]);
    }
}

/// With `overwrite`, an older kept entry is replaced, and no temporary is
/// left beside it.
pub fn keep_overwrites<F: Fixture>(fx: &F) {
    let s = fx.store();
    let r = root(s);
    let b = s.make_dir(&r, c"bak").expect("make_dir");
    put(s, &b, b"f", b"oldest").expect("put");
    put(s, &r, b"f", b"older").expect("put");
    let base = root_base(b"bak");
    s.keep_entry(&r, c"f", &to(&base, b"f", true, false))
        .expect("keep over a kept file");
    assert_eq!(read_all(s, &b, b"f").expect("read"), b"older");
    assert!(s.stat(&r, c"f").expect("stat").is_none(), "f removed");
    put(s, &r, b"f", b"newer").expect("put");
    s.keep_entry(&r, c"f", &to(&base, b"f", true, true))
        .expect("keep over a kept file, replacing");
    assert_eq!(read_all(s, &b, b"f").expect("read"), b"newer");
    put(s, &r, b"f", b"newest").expect("put");
    assert_eq!(read_all(s, &r, b"f").expect("read"), b"newest");
    assert_eq!(read_all(s, &b, b"f").expect("read"), b"newer");
    assert_eq!(show(&names(s, &b)), ["f"]);
}

/// A symlink is kept as itself (never followed), for a removal and a
/// replacement, where the store has symlinks.
pub fn keep_symlink<F: Fixture>(fx: &F) {
    let s = fx.store();
    if !s.has_symlinks() {
        eprintln!("keep_symlink: no symlinks in this store: not checked");
        return;
    }
    let r = root(s);
    let meta = |t: &[u8]| Meta {
        kind: Kind::Symlink,
        size: t.len() as u64,
        ..file_meta(0, T0, 0o777)
    };
    put(s, &r, b"target", b"the target's bytes").expect("put");
    s.create_symlink(&r, c"l", b"target", &meta(b"target"))
        .expect("symlink");
    s.create_symlink(&r, c"m", b"no/such", &meta(b"no/such"))
        .expect("symlink");
    let base = root_base(b"kept");
    s.keep_entry(&r, c"l", &to(&base, b"l", true, false))
        .expect("keep symlink");
    s.keep_entry(&r, c"m", &to(&base, b"m", false, true))
        .expect("keep symlink, replacing");
    let k = open_path(s, &r, b"kept");
    for (n, t) in [(&b"l"[..], &b"target"[..]), (b"m", b"no/such")] {
        let m = stat_of(s, &k, n);
        assert_eq!(m.kind, Kind::Symlink, "kept {}", String::from_utf8_lossy(n));
        assert_eq!(s.read_link(&k, &c(n)).expect("read_link"), t);
    }
    assert!(s.stat(&r, c"l").expect("stat").is_none(), "l removed");
    assert_eq!(
        read_all(s, &r, b"target").expect("read"),
        b"the target's bytes"
    );
}

/// A base outside the root (a sibling directory, another prefix, as
/// `--backup-dir ../old` gives): kept there, parents made.
pub fn keep_outside<F: Fixture>(fx: &F) {
    let o = match fx.outside() {
        Ok(o) => o,
        Err(why) => {
            eprintln!("keep_outside: {why}: not checked");
            return;
        }
    };
    let s = fx.store();
    let r = root(s);
    assert!(s.can_keep(&o.base), "can_keep of {:?}", o.base);
    let meta = file_meta(7, T0, 0o600);
    put_from(s, &r, c"f", &mut Bytes(b"removed"), &meta).expect("put");
    put(s, &r, b"g", b"replaced").expect("put");
    s.keep_entry(&r, c"f", &to(&o.base, b"d/f", true, false))
        .expect("keep outside");
    s.keep_entry(&r, c"g", &to(&o.base, b"d/g", true, true))
        .expect("keep outside, replacing");
    assert!(s.stat(&r, c"f").expect("stat").is_none(), "f removed");
    let os = &o.store;
    let or = root(os);
    let d = open_path(os, &or, b"d");
    assert_eq!(show(&names(os, &d)), ["f", "g"]);
    assert_eq!(read_all(os, &d, b"f").expect("read kept"), b"removed");
    assert_eq!(read_all(os, &d, b"g").expect("read kept"), b"replaced");
    let m = stat_of(os, &d, b"f");
    assert_mtime(fx, &m, T0, "kept outside");
    if fx.keeps_mode() {
        assert_eq!(m.mode, 0o600, "kept mode");
    }
    put(s, &r, b"h", b"next").expect("put");
    assert_eq!(
        err_kind(s.keep_entry(&r, c"h", &to(&o.base, b"d/f", false, true))),
        Some(ErrorKind::AlreadyExists)
    );
    assert_eq!(read_all(s, &r, b"h").expect("read"), b"next");
    assert_eq!(read_all(os, &d, b"f").expect("read kept"), b"removed");
}
